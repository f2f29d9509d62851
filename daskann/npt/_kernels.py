"""Block kernels of network-parallel training: they run on the workers.

Pure numpy on blocks, no dask. The arithmetic of every kernel repeats that of
:mod:`daskann.nn` element by element (same operations in the same order), so
that training on a grid differs from :class:`daskann.SerialTrainer` only in
the order in which the partial sums of each matrix product are added.

Kernels never modify their inputs: a block may be read by several tasks, and a
task may run again after a worker is lost. Those that make blocks run with the
worker's heap kept (:func:`daskann._heap.keeps_heap`), so a step's blocks reuse
the memory of the step before instead of fresh mappings.

An *operand spec* is a tuple ``(value, field, window, transform)``: ``value``
is a stored block (an array, or a dict holding one under ``field``);
``window = (r0, r1, c0, c1)`` selects part of it; ``transform`` is ``None`` or
``(activation, negative_slope)`` to apply a hidden-layer activation on the
fly (activations ``A = act(Z)`` are never stored, only ``Z``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from daskann._heap import keeps_heap
from daskann.nn._functional import activate, activation_backward, softmax


def operand(spec):
    """The array an operand spec points at."""
    value, field, window, transform = spec
    if field is not None:
        value = value[field]
    if window is not None:
        r0, r1, c0, c1 = window
        value = value[r0:r1, c0:c1]
    if transform is not None:
        value = activate(value, transform[0], transform[1])
    return value


@keeps_heap
def block_product(acc, terms, shape, dtype, partner=None, epilogue=None, extras=()):
    """``acc + sum(op(a) @ op(b))`` over ``terms``, then ``+ partner``, then the epilogue.

    Parameters
    ----------
    acc : ndarray or None
        Running sum of this output block (not modified).
    terms : list of (a_spec, trans_a, b_spec, trans_b, out_window)
        Block products to add; ``out_window`` is ``None`` for the whole block.
    shape, dtype
        Of the output block.
    partner : ndarray or None
        The other accumulation chain of the same block, added last.
    epilogue : callable or None
        ``epilogue(out, fresh, extras)`` finishes the sum ``out`` (``fresh``:
        an array of the task's own, which it may overwrite):
        :func:`add_bias`, :class:`BiasMSE`, :class:`ActivationBackward`,
        :class:`Velocity` or :class:`SGDStep`.
    extras : tuple of operand specs
    """
    out, fresh = _accumulate(acc, terms, shape, dtype)
    if partner is not None:
        out, fresh = out + partner, True
    if epilogue is None:
        return out if fresh else out.copy()
    return epilogue(out, fresh, extras)


def _accumulate(acc, terms, shape, dtype):
    """``(acc + sum(op(a) @ op(b)), fresh)``: the sum, and whether it is a new array (``acc`` is never modified)."""
    out, fresh = acc, False
    untouched = set()  # windows of a fresh zero block no term has written yet
    for a_spec, trans_a, b_spec, trans_b, window in terms:
        a = operand(a_spec)
        b = operand(b_spec)
        a, b = (a.T if trans_a else a), (b.T if trans_b else b)
        if window is not None and (out is None or window in untouched):
            if out is None:
                out, fresh = np.zeros(shape, dtype=dtype), True
                untouched = _disjoint_windows(terms)
            # the product lands in its window directly: no temporary, no pass adding it to zeros
            r0, r1, c0, c1 = window
            np.matmul(a, b, out=out[r0:r1, c0:c1])
            untouched.discard(window)
            continue
        prod = a @ b
        if window is None:
            if out is None:
                out, fresh = prod, True
            else:
                prod += out  # addition commutes exactly, so this is out + prod
                out, fresh = prod, True
        else:
            if out is None:
                out, fresh = np.zeros(shape, dtype=dtype), True
            elif not fresh:
                out, fresh = out.copy(), True
            r0, r1, c0, c1 = window
            out[r0:r1, c0:c1] += prod
            untouched.discard(window)
    if out is None:
        out, fresh = np.zeros(shape, dtype=dtype), True
    return out, fresh


def _disjoint_windows(terms) -> set:
    """Output windows of ``terms`` that overlap no other term's window (each is written exactly once)."""
    windows = [t[4] for t in terms]
    if any(w is None for w in windows):
        return set()
    out = set()
    for k, (r0, r1, c0, c1) in enumerate(windows):
        if all(k == m or r1 <= q0 or q1 <= r0 or c1 <= d0 or d1 <= c0 for m, (q0, q1, d0, d1) in enumerate(windows)):
            out.add(windows[k])
    return out


def _velocity(grad, fresh, v_spec, momentum):
    """``momentum * v + grad`` as :meth:`daskann.nn.SGD.update` computes it (``grad`` when no momentum)."""
    if not momentum:
        return grad if fresh else grad.copy()
    velocity = operand(v_spec) * grad.dtype.type(momentum)
    velocity += grad
    return velocity


@keeps_heap
def weight_update(weight, velocity, lr):
    """``w - lr * v`` as :meth:`daskann.nn.SGD.update` computes it (one new array, not two)."""
    out = velocity * weight.dtype.type(lr)
    return np.subtract(weight, out, out=out)


# -- epilogues of block_product: what the last task of an output block does with its sum ------
def add_bias(out, fresh: bool, extras):
    """``out + b`` with the bias block ``b`` at ``extras[0]`` (in place when ``out`` is fresh)."""
    bias = operand(extras[0])
    if fresh:
        out += bias
        return out
    return out + bias


@dataclass(frozen=True)
class BiasMSE:
    """The output layer with MSE on a linear output: the bias added, then ``{"loss", "g"}`` right here.

    The loss partial sum and gradient are against rows ``rows`` of the target band
    ``extras[1]`` (a copy of the output columns' targets lives on every worker of
    the grid column); ``scale`` is ``2 / (batch * n_outputs)`` of the whole
    batch, as in :func:`daskann.nn._functional.mse_loss`.
    """

    scale: float
    rows: np.ndarray
    with_grad: bool

    def __call__(self, out, fresh: bool, extras):
        return _mse(add_bias(out, fresh, extras), extras[1][self.rows], self.scale, self.with_grad)


@dataclass(frozen=True)
class ActivationBackward:
    """The gradient through the activation at the pre-activations ``extras[0]``."""

    activation: str
    negative_slope: float

    def __call__(self, out, fresh: bool, extras):
        return activation_backward(out, operand(extras[0]), self.activation, self.negative_slope)


@dataclass(frozen=True)
class Velocity:
    """SGD's new velocity ``momentum * v + g`` from the velocity block ``extras[0]``."""

    momentum: float

    def __call__(self, out, fresh: bool, extras):
        return _velocity(out, fresh, extras[0], self.momentum)


@dataclass(frozen=True)
class SGDStep:
    """The whole SGD update of a weight block: ``{"w": w - lr * v, "v": v}``.

    ``v`` as :class:`Velocity` from the velocity ``extras[0]``; the weights are ``extras[1]``.
    """

    lr: float
    momentum: float

    def __call__(self, out, fresh: bool, extras):
        velocity = _velocity(out, fresh, extras[0], self.momentum)
        return {"w": weight_update(operand(extras[1]), velocity, self.lr), "v": velocity}


@keeps_heap
def bias_update(state, grad_specs, lr, momentum, collect_loss):
    """New ``{"b", "v"}`` of a bias block from the column of ``dZ`` blocks below it.

    ``db`` is the sum over the batch (rows of the grid) of ``dZ``. With
    ``collect_loss`` the loss partial sums carried by the ``dZ`` blocks are
    added up and returned under ``"loss"``, so that the client can read the
    step's loss from these small dicts alone.
    """
    grad = None
    loss = 0.0
    for spec in grad_specs:
        part = operand(spec).sum(axis=0)
        grad = part if grad is None else grad + part
        if collect_loss:
            loss += spec[0]["loss"]
    b, v = state["b"], state["v"]
    dtype = b.dtype.type
    if momentum:
        v = v * dtype(momentum)
        v += grad
    else:
        v = grad
    b = b - dtype(lr) * v
    result = {"b": b, "v": v}
    if collect_loss:
        result["loss"] = float(loss)
    return result


@keeps_heap
def take_rows(band, rows):
    """Rows ``rows`` of a stored column band of the training data."""
    return band[rows]


def _mse(output, target, scale, with_grad):
    """Loss partial sum and gradient of one output block (MSE on a linear output).

    ``output`` is a new array of the calling task, not kept: the difference and
    the gradient are taken in its memory, and the sum of squares in one pass.
    """
    diff = np.subtract(output, target, out=output)
    loss = float(np.vdot(diff, diff))
    if not with_grad:
        return {"loss": loss}
    diff *= diff.dtype.type(scale)  # as diff * scale
    return {"g": diff, "loss": loss}


@keeps_heap
def loss_panel(z_specs, target, *, loss, n_batch, size, with_grad=True):
    """Loss partial sum and ``d loss / d Z`` of a whole row panel of the output.

    The softmax needs whole rows of the output layer, so the blocks of one
    grid row are put side by side first. ``n_batch`` and ``size`` are the
    batch size and ``batch * n_outputs`` of the whole batch. Without
    ``with_grad`` (validation) the count of correct labels comes instead.
    """
    logits = np.concatenate([operand(s) for s in z_specs], axis=1) if len(z_specs) > 1 else operand(z_specs[0])
    dtype = logits.dtype.type
    if loss == "cross_entropy":
        # labels of the panel, or (all labels on this worker, rows of the panel) for data read on the workers
        labels = target[0][target[1]] if isinstance(target, tuple) else target
        n = logits.shape[0]
        shifted = logits - logits.max(axis=1, keepdims=True)
        log_norm = np.log(np.exp(shifted).sum(axis=1))
        rows = np.arange(n)
        value = float(np.sum(log_norm - shifted[rows, labels]))
        if not with_grad:
            return {"loss": value, "correct": int(np.sum(np.argmax(logits, axis=1) == labels))}
        grad = np.exp(shifted - log_norm[:, None])
        grad[rows, labels] -= 1
        grad *= dtype(1.0 / n_batch)
        return {"g": grad, "loss": value}
    # MSE on the softmax output: ``target`` is (all targets on this worker, rows of the panel)
    y = target[0][target[1]]
    probs = softmax(logits)
    diff = probs - y
    value = float(np.sum(diff * diff))
    if not with_grad:
        return {"loss": value}
    d_probs = diff * dtype(2.0 / size)
    grad = probs * (d_probs - (d_probs * probs).sum(axis=1, keepdims=True))
    return {"g": grad, "loss": value}


def all_finite(*values):
    """True when every array (or operand spec, or array in a dict) is finite."""
    for value in values:
        if isinstance(value, tuple):
            value = operand(value)
        arrays = value.values() if isinstance(value, dict) else [value]
        for a in arrays:
            if isinstance(a, np.ndarray) and not np.isfinite(a).all():
                return False
    return True


@keeps_heap
def view(spec):
    """Materialise an operand spec (for gathering or converting to dask)."""
    return np.array(operand(spec), copy=True)
