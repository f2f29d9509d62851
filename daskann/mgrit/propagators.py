"""Training as a time evolution: the SGD step as the fine propagator, and coarse propagators.

The state of a training run is ``(w0, b0, w1, b1, ..., vw0, vb0, vw1, vb1, ...)``:
the network's parameters in ``MLP.params`` order followed by the SGD velocity
of each (``(w0, w1, ..., vw0, vw1, ...)`` for a network without biases; the
parameters alone with ``velocity=False``, plain gradient descent as in
Schroder 2017). The fine propagator ``Phi_i`` is one step of SGD with momentum on
minibatch ``i``, computed by the same code and in the same order as
:class:`daskann.SerialTrainer`, so a converged MGRIT run reproduces serial
training.

Coarse propagators (level ``l`` spans ``M_l`` fine steps):

``"scaled"``
    One step that stands for ``alpha_l`` fine steps with a frozen gradient:
    ``v' = beta^a v + c_v g`` and ``w' = w - lr (beta c_v v + c_w g)`` with
    ``c_v = (1 - beta^a) / (1 - beta)`` and ``c_w = (a - beta c_v) / (1 - beta)``
    (``a = alpha_l``): exactly what ``a`` heavy-ball steps do when the gradient
    does not change, so the fine velocity is carried consistently. Without
    momentum it is one SGD step with learning rate ``alpha_l * lr``.
    ``alpha_l`` is ``M_l`` (the span) by default, ``alpha_growth ** l`` when a
    growth rate is given (the paper's ``alpha^(l)``, e.g. 1.25), and never more
    than ``alpha_cap`` (SGD's stability limit: a coarse step with
    ``lr * alpha_l`` beyond it makes MGRIT diverge). ``substeps`` splits the
    coarse step into that many such steps, each with a fresh gradient
    (two applications of Phi at ``alpha_l / 2``); ``repeats`` applies the
    whole coarse step that many times (two applications at ``alpha_l`` each);
    ``coarse_batches`` evaluates each gradient on that many of the interval's
    minibatches at once. ``coarse_data="own"`` makes point ``i`` of a coarse
    level train on the rows of step ``i`` (Schroder 2017's rule, see
    :func:`daskann.data.coarse_indices`) instead of those of its fine step.
``"repeat"``
    The fine step applied ``M_l`` times: exact, so MGRIT converges at once but
    saves nothing. For checks.
callable
    ``coarse(state, start, stop, level) -> state``, supplied by the user.
"""

from __future__ import annotations

import hashlib
import math
import threading
from typing import get_args

import numpy as np

from daskann._blas import one_blas_thread
from daskann._dask_input import is_dask_array, remote_call
from daskann._validation import CoarsePropagator, check_choice, check_float, check_int, invalid, option_name
from daskann.data import BatchOrder
from daskann.exceptions import DivergenceCause
from daskann.mgrit.problem import Propagator
from daskann.nn import LOSSES, MLP, SGD


def _data_digest(X: np.ndarray, y: np.ndarray) -> str:
    h = hashlib.sha256()
    if is_dask_array(X):  # the dask names identify the data without reading it
        h.update(f"{X.name}{X.shape}{y.name}{y.shape}".encode())
        return h.hexdigest()[:16]
    for a in (X, y):
        a = np.ascontiguousarray(a)
        h.update(f"{a.dtype.str}{a.shape}".encode())
        h.update(a.tobytes())
    return h.hexdigest()[:16]


def _check_coarse(coarse, name="coarse"):
    """A built-in coarse propagator's name or a callable ``coarse(state, start, stop, level)``."""
    if not (callable(coarse) or coarse in get_args(CoarsePropagator)):
        raise invalid(
            name,
            coarse,
            "'scaled', 'repeat' or a callable coarse(state, start, stop, level)",
            TypeError if not isinstance(coarse, str) else ValueError,
        )
    return coarse


def _check_alpha_cap(alpha_cap, name="alpha_cap") -> float | None:
    """A number cap of the coarse learning rates (at least 1), or None for none (None or ``math.inf``)."""
    if alpha_cap is not None and not (isinstance(alpha_cap, (int, float)) and alpha_cap == math.inf):
        alpha_cap = check_float(name, alpha_cap, minimum=1.0)
    return None if alpha_cap is None or alpha_cap == math.inf else float(alpha_cap)


def _param_shapes(sizes, bias: bool) -> list[tuple]:
    """Shapes of a network's parameters in ``MLP.params`` order: per layer its weights, then its biases."""
    shapes = []
    for n_in, n_out in zip(sizes[:-1], sizes[1:], strict=True):
        shapes += [(n_in, n_out), (n_out,)] if bias else [(n_in, n_out)]
    return shapes


class SGDPropagator(Propagator):
    """Minibatch SGD with momentum as an MGRIT propagator.

    Parameters
    ----------
    model : MLP
        Architecture (its weights are not used: the state carries them).
    X, y : ndarray
        Training data, already checked (as :class:`SerialTrainer` sees it).
    loss : {"mse", "cross_entropy"}
    order : BatchOrder
        Which rows step ``i`` uses.
    lr : float
    momentum : float
    coarse : {"scaled", "repeat"} or callable
        Coarse propagator (module docstring).
    alpha_growth : float, optional
        Coarse learning-rate factor ``alpha_l = alpha_growth ** l``; default:
        the span ``M_l`` of a level-``l`` step.
    alpha_cap : float, "auto" or None
        Upper bound of ``alpha_l``; None or ``math.inf`` for none; ``"auto"``
        estimates SGD's stability limit from the curvature at ``model``'s
        weights (:func:`auto_alpha_cap`; the resolved number is in
        :meth:`get_config`).
    substeps : int
        Steps (fresh gradients) per coarse step.
    coarse_batches : int
        Minibatches per coarse gradient, spread over the coarse step's span.
    step_offset : int
        Training steps done before point 0 (a run resumed from a checkpoint):
        step ``i`` of the solve trains on minibatch ``step_offset + i``.
    repeats : int
        Applications of the whole coarse step per coarse step.
    coarse_data : {"fine", "own"}
        Rows a coarse point trains on: those of the fine step it lies on, or
        those of its own index on its level (Schroder 2017).
    velocity : bool
        Carry the SGD velocity in the state; False (momentum 0 only) makes the
        state the parameters alone, so residuals measure weights only.
    name_of : callable, optional
        How errors name an option (a trainer's ``solver['substeps']``); by default by itself.

    Examples
    --------
    >>> from daskann.data import make_linear
    >>> X, y = make_linear(64, 4, 1, seed=0)
    >>> net = MLP([4, 8, 1], seed=0)
    >>> prop = SGDPropagator(net, X, y, loss="mse", order=BatchOrder(64, 16), lr=0.01, momentum=0.9)
    >>> u0 = prop.initial_state(net)
    >>> len(prop.step(u0, 0, 1, 0)) == len(u0)
    True
    """

    def __init__(
        self,
        model: MLP,
        X,
        y,
        *,
        loss: str,
        order: BatchOrder,
        lr: float,
        momentum: float = 0.0,
        coarse="scaled",
        alpha_growth: float | None = None,
        alpha_cap: float | None = None,
        substeps: int = 1,
        coarse_batches: int = 1,
        step_offset: int = 0,
        repeats: int = 1,
        coarse_data: str = "fine",
        velocity: bool = True,
        name_of=option_name,
    ):
        if not isinstance(model, MLP):
            raise invalid("model", type(model).__name__, "an MLP", TypeError)
        if not isinstance(order, BatchOrder):
            raise invalid("order", type(order).__name__, "a BatchOrder", TypeError)
        self.config = model.get_config()
        self.X, self.y = X, y
        self.loss = check_choice("loss", loss, LOSSES)
        self.order = order
        self.optimizer = SGD(lr, momentum)
        self.coarse = _check_coarse(coarse, name_of("coarse"))
        self.alpha_growth = (
            None if alpha_growth is None else check_float(name_of("alpha_growth"), alpha_growth, minimum=1.0)
        )
        auto = isinstance(alpha_cap, str) and alpha_cap == "auto"
        self.alpha_cap = None if auto else _check_alpha_cap(alpha_cap, name_of("alpha_cap"))
        self.substeps = check_int(name_of("substeps"), substeps)
        self.coarse_batches = check_int(name_of("coarse_batches"), coarse_batches)
        self.step_offset = check_int("step_offset", step_offset, minimum=0)
        self.repeats = check_int("repeats", repeats)
        self.coarse_data = check_choice("coarse_data", coarse_data, ("fine", "own"))
        if not isinstance(velocity, (bool, np.bool_)):
            raise invalid("velocity", velocity, "True or False", TypeError)
        if not velocity and momentum:
            raise invalid("velocity", velocity, "True when momentum is not 0 (the velocity is then state)")
        self.velocity = bool(velocity)
        self._bias = bool(self.config.get("bias", True))
        shapes = _param_shapes(self.config["sizes"], self._bias)
        self._n = len(shapes)
        self._shapes = shapes + shapes if self.velocity else shapes
        self._local = threading.local()
        self._rows: dict[int, np.ndarray] = {}
        self._digest = _data_digest(X, y)
        if auto:
            self.alpha_cap = self._auto_alpha_cap(model)

    def _auto_alpha_cap(self, model: MLP) -> float | None:
        """SGD's stability limit at ``model``'s weights (None for none), measured where the data is read."""
        if is_dask_array(self.X):  # measured on a worker
            return remote_call(_auto_alpha_cap_on, self.without_data(), self.initial_state(model), self.X, self.y)
        with one_blas_thread():  # the bits a worker would compute
            cap = auto_alpha_cap(self, self.initial_state(model))
        return None if cap == math.inf else cap

    # -- state ----------------------------------------------------------------------
    def initial_state(self, model: MLP, velocity=None) -> tuple:
        """``(params..., velocities...)`` of ``model`` (zero velocity by default)."""
        params = [np.array(p) for p in model.params]
        if not self.velocity:
            return tuple(params)
        vel = [np.zeros_like(p) for p in params] if velocity is None else [np.array(v) for v in velocity]
        return tuple(params + vel)

    def split(self, state) -> tuple[MLP, list]:
        """The network and the velocity a state describes."""
        params = [np.array(a) for a in state[: self._n]]
        model = self._network(params)
        velocity = [np.array(a) for a in state[self._n :]] if self.velocity else [np.zeros_like(p) for p in params]
        return model, velocity

    def _unzip(self, params) -> tuple[list, list]:
        """Weights and biases of a parameter list in ``MLP.params`` order."""
        return (list(params[0::2]), list(params[1::2])) if self._bias else (list(params), [])

    def _network(self, params) -> MLP:
        weights, biases = self._unzip(params)
        return MLP.from_arrays(
            weights,
            biases,
            activation=self.config["activation"],
            output=self.config["output"],
            negative_slope=self.config["negative_slope"],
            bias=self._bias,
        )

    def get_config(self) -> dict:
        """What identifies the training problem (stored with a run)."""
        return {
            "model": self.config,
            "loss": self.loss,
            "lr": self.optimizer.lr,
            "momentum": self.optimizer.momentum,
            "batch_order": self.order.get_state(),
            "data": self._digest,
            "coarse": self.coarse if isinstance(self.coarse, str) else getattr(self.coarse, "__qualname__", "callable"),
            "alpha_growth": self.alpha_growth,
            "alpha_cap": self.alpha_cap,
            "substeps": self.substeps,
            "coarse_batches": self.coarse_batches,
            "step_offset": self.step_offset,
            # only when not the default, so existing runs keep their identity
            **({"repeats": self.repeats} if self.repeats != 1 else {}),
            **({"coarse_data": self.coarse_data} if self.coarse_data != "fine" else {}),
            **({"velocity": False} if not self.velocity else {}),
        }

    def without_data(self) -> SGDPropagator:
        """A copy holding no training data (to ship; :meth:`with_data` gives it the data on a worker)."""
        return self.with_data(None, None)

    def with_data(self, X, y) -> SGDPropagator:
        """A copy that trains on ``X``, ``y`` (the same data, read elsewhere)."""
        state = self.__getstate__()
        state["X"], state["y"] = X, y
        new = object.__new__(type(self))
        new.__setstate__(state)
        return new

    def __getstate__(self):
        state = dict(self.__dict__)
        del state["_local"]
        state["_rows"] = {}
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._local = threading.local()

    # -- the steps --------------------------------------------------------------------
    def rows(self, step: int) -> np.ndarray:
        """Rows of training step ``step`` of the solve (memoised: sweeps revisit every step)."""
        rows = self._rows.get(step)
        if rows is None:
            rows = self._rows[step] = self.order.indices(self.step_offset + step)
        return rows

    def _gradients(self, params, rows) -> list[np.ndarray]:
        return self._loss_and_gradients(params, rows)[1]

    def _loss_and_gradients(self, params, rows) -> tuple[float, list[np.ndarray]]:
        # one network object per thread: the threaded scheduler runs tasks side by side
        net = getattr(self._local, "net", None)
        if net is None:
            net = self._local.net = self._network(params)
        net.weights, net.biases = self._unzip(params)
        value, grad_w, grad_b = net.loss_and_gradients(self.X[rows], self.y[rows], self.loss)
        return value, net.interleave(grad_w, grad_b)

    def _descend(self, params, grads, velocity) -> None:
        if self.velocity:
            self.optimizer.step(params, grads, velocity)
            return
        lr = self.optimizer.lr
        for p, g in zip(params, grads, strict=True):  # SGD.update with momentum 0, no velocity kept
            p -= p.dtype.type(lr) * g

    def _views(self, vector: np.ndarray):
        """Parameter and velocity arrays viewing a flat state vector."""
        parts, offset = [], 0
        for shape in self._shapes:
            n = math.prod(shape)
            parts.append(vector[offset : offset + n].reshape(shape))
            offset += n
        return parts[: self._n], parts[self._n :]

    def step_flat(self, vector: np.ndarray, start: int, stop: int, level: int, *, out=None) -> np.ndarray:
        """:meth:`step` on the solver's flat state vector (same arithmetic, no repacking).

        The result goes to ``out`` when given (``out`` may be ``vector``
        itself: the step is then taken in place), else to a new vector.
        """
        if out is None:
            out = np.array(vector)
        elif out is not vector:
            np.copyto(out, vector)
        params, velocity = self._views(out)
        if level == 0:
            grads = self._gradients(params, self.rows(start))
            self._descend(params, grads, velocity)
            return out
        if self.coarse == "repeat":
            for i in range(start, stop):
                grads = self._gradients(params, self.rows(i))
                self._descend(params, grads, velocity)
            return out
        if callable(self.coarse):
            return None
        for _ in range(self.repeats):
            self._scaled_inplace(params, velocity if self.velocity else [None] * len(params), start, stop, level)
        return out

    def serial_step(self, vector: np.ndarray, step: int) -> DivergenceCause:
        """Training step ``step`` on the flat state ``vector`` in place, checked as :class:`SerialTrainer` checks it.

        Returns what became NaN or Inf (:attr:`~DivergenceCause.FINITE` when nothing did). A loss
        that is not finite ends the step before the weights change, as it ends serial training.
        """
        params, velocity = self._views(vector)
        value, grads = self._loss_and_gradients(params, self.rows(step))
        if not math.isfinite(value):
            return DivergenceCause.of(loss=False)
        self._descend(params, grads, velocity)
        # a sum is finite where every entry is; one that is not may only have overflowed
        if math.isfinite(vector.sum()) or all(np.isfinite(p).all() for p in params):
            return DivergenceCause.FINITE
        return DivergenceCause.of(gradients=all(np.isfinite(g).all() for g in grads), weights=False)

    def fine_step(self, state, step: int) -> tuple:
        """One training step from point ``step``, as :class:`SerialTrainer` does it."""
        params = [np.array(a) for a in state[: self._n]]
        velocity = [np.array(a) for a in state[self._n :]]
        grads = self._gradients(params, self.rows(step))
        self._descend(params, grads, velocity)
        return tuple(params + velocity)

    def gradient(self, state, step: int) -> list[np.ndarray]:
        """The gradient training step ``step`` takes at ``state``, in ``MLP.params`` order.

        Without momentum it is the velocity SGD leaves after the step, which a
        state without velocity does not carry.
        """
        return [np.array(g) for g in self._gradients(list(state[: self._n]), self.rows(step))]

    def alpha(self, level: int, span: int) -> float:
        """Fine steps' worth of one coarse step on ``level`` (before substeps)."""
        a = float(span) if self.alpha_growth is None else self.alpha_growth**level
        return a if self.alpha_cap is None else min(a, self.alpha_cap)

    def step(self, state, start, stop, level):
        if level == 0:
            return self.fine_step(state, start)
        if self.coarse == "repeat":
            for i in range(start, stop):
                state = self.fine_step(state, i)
            return state
        if callable(self.coarse):
            return self.coarse(state, start, stop, level)
        return self._scaled_step(state, start, stop, level)

    def _scaled_step(self, state, start, stop, level):
        for _ in range(self.repeats):
            state = self._scaled_once(state, start, stop, level)
        return state

    def _coarse_rows(self, steps, start: int, span: int) -> np.ndarray:
        if self.coarse_data == "own":
            # the coarse point's own index on its level (Schroder 2017), the same for every substep
            return self.order.indices(self.step_offset + start // span)
        return self.rows(steps[0]) if len(steps) == 1 else np.concatenate([self.rows(s) for s in steps])

    def _scaled_once(self, state, start, stop, level):
        params = [np.array(x) for x in state[: self._n]]
        velocity = [np.array(x) for x in state[self._n :]] if self.velocity else [None] * len(params)
        self._scaled_inplace(params, velocity, start, stop, level)
        return tuple(params + velocity) if self.velocity else tuple(params)

    def _scaled_inplace(self, params, velocity, start, stop, level) -> None:
        """One scaled coarse step on ``params`` and ``velocity`` (None entries without velocity), in place."""
        span = stop - start
        k = self.substeps
        a = self.alpha(level, span) / k
        beta = self.optimizer.momentum
        if beta:
            decay = beta**a
            c_v = (1.0 - decay) / (1.0 - beta)
            c_w = (a - beta * c_v) / (1.0 - beta)
        else:
            decay, c_v, c_w = 0.0, 1.0, a
        dtype = np.dtype(self.config["dtype"]).type
        lr = self.optimizer.lr
        b = self.coarse_batches
        for j in range(k):
            first = start + (span * j) // k
            width = max(1, (span * (j + 1)) // k - (span * j) // k)
            steps = [first + (width * i) // b for i in range(min(b, width))]
            grads = self._gradients(params, self._coarse_rows(steps, start, span))
            for p, g, v in zip(params, grads, velocity, strict=True):
                if beta:
                    p -= dtype(lr) * (dtype(beta * c_v) * v + dtype(c_w) * g)
                    v *= dtype(decay)
                    v += dtype(c_v) * g
                else:
                    p -= dtype(lr * c_w) * g
                    if v is not None:
                        v[...] = g

    def cost(self, level, span):
        return step_cost(level, span, self.coarse, self.substeps, self.coarse_batches, self.repeats)


def step_cost(level: int, span: int, coarse, substeps: int, coarse_batches: int, repeats: int = 1) -> float:
    """Work units of one step of ``level`` spanning ``span`` fine steps: the minibatches its gradients read (a
    user's coarse propagator counts one), as the work model and the forecast count them."""
    if level == 0:
        return 1.0
    if coarse == "repeat":
        return float(span)
    if callable(coarse):
        return 1.0
    return float(repeats * substeps * min(coarse_batches, max(1, span // substeps)))


def stable_alpha_cap(lr: float, momentum: float, curvature: float, *, margin: float = 0.5) -> float:
    """Largest ``alpha`` that keeps a frozen-gradient coarse step stable on ``curvature``.

    A quadratic with Hessian eigenvalue ``h`` is stable under the scaled
    coarse step when ``lr * c_w(alpha) * h`` stays below 2; ``margin`` keeps a
    safety factor (1 is the limit).
    """
    lr = check_float("lr", lr, minimum=0.0, min_inclusive=False)
    curvature = check_float("curvature", curvature, minimum=0.0, min_inclusive=False)
    limit = 2.0 * margin / (lr * curvature)
    if not momentum:
        return max(1.0, limit)
    # c_w(a) = (a - beta c_v(a)) / (1 - beta) grows monotonically in a: bisect
    lo, hi = 1.0, 1.0
    while _c_w(hi, momentum) < limit and hi < 1e9:
        hi *= 2.0
    if _c_w(lo, momentum) >= limit:
        return 1.0
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if _c_w(mid, momentum) < limit else (lo, mid)
    return lo


def _c_w(a: float, beta: float) -> float:
    c_v = (1.0 - beta**a) / (1.0 - beta)
    return (a - beta * c_v) / (1.0 - beta)


def top_curvature(propagator: SGDPropagator, state, *, steps=(0,), iterations: int = 20, seed: int = 0) -> float:
    """Largest Hessian eigenvalue of the minibatch losses at ``state`` (power iteration on
    finite-difference Hessian-vector products); the scale of :func:`stable_alpha_cap`."""
    params = [np.array(a, dtype=np.float64) for a in state[: propagator._n]]
    rows = np.concatenate([propagator.order.indices(propagator.step_offset + s) for s in steps])
    flat = np.concatenate([p.ravel() for p in params])
    shapes = [p.shape for p in params]

    def grad(vector):
        parts, offset = [], 0
        for shape in shapes:
            n = math.prod(shape)
            parts.append(vector[offset : offset + n].reshape(shape).astype(params[0].dtype))
            offset += n
        return np.concatenate([g.ravel() for g in propagator._gradients(parts, rows)]).astype(np.float64)

    rng = np.random.default_rng(seed)
    v = rng.standard_normal(flat.size)
    v /= np.linalg.norm(v)
    g0 = grad(flat)
    eps = 1e-5 * max(1.0, np.linalg.norm(flat))
    value = 0.0
    for _ in range(iterations):
        hv = (grad(flat + eps * v) - g0) / eps
        value = float(v @ hv)
        norm = np.linalg.norm(hv)
        if norm == 0:
            break
        v = hv / norm
    return abs(value)


def _auto_alpha_cap_on(propagator: SGDPropagator, state, X, y) -> float:
    return auto_alpha_cap(propagator.with_data(X, y), state)


def auto_alpha_cap(
    propagator: SGDPropagator, state, *, batches: int = 4, growth: float = 4.0, margin: float = 0.5
) -> float:
    """The coarse learning-rate cap ``alpha_cap="auto"`` resolves to.

    The top curvature of the first ``batches`` minibatches at ``state`` (the
    initial weights), times ``growth`` because curvature rises during
    training (progressive sharpening), through :func:`stable_alpha_cap`.
    """
    steps = tuple(range(batches))
    curvature = top_curvature(propagator, state, steps=steps)
    if curvature <= 0.0:
        return math.inf
    return stable_alpha_cap(propagator.optimizer.lr, propagator.optimizer.momentum, growth * curvature, margin=margin)


__all__ = ["SGDPropagator", "auto_alpha_cap", "stable_alpha_cap", "top_curvature"]
