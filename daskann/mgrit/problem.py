"""What the solver needs from a problem: a propagator and a state made of numpy arrays.

The contract follows pymgrit's ``Application`` (``step(u_start, t_start,
t_stop)``) and XBraid's ``Step`` callback. Times are fine step indices: a step
of level ``l`` goes from ``start`` to ``stop = start + M_l`` where ``M_l`` is the
number of fine steps one step of that level spans. The state is a tuple of
numpy arrays of one floating dtype (pymgrit's ``Vector``); the solver handles
sums, differences and norms itself.
"""

from __future__ import annotations

import abc
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from daskann._validation import invalid
from daskann.exceptions import PropagatorError

State = tuple  # tuple of numpy arrays


class Propagator(abc.ABC):
    """The time stepper Phi of every level.

    Subclasses implement :meth:`step`; :meth:`cost` tells the work model what
    one step of a level costs in units of one fine step.

    ``step`` must be a deterministic function of its arguments (the solver
    calls it for the same point many times, on any worker) and must not
    modify its input arrays (they are read-only views).
    """

    @abc.abstractmethod
    def step(self, state: State, start: int, stop: int, level: int) -> State:
        """Advance ``state`` from fine step ``start`` to ``stop`` on ``level``.

        Parameters
        ----------
        state : tuple of ndarray
            Read-only arrays; return new ones.
        start, stop : int
            Fine step indices; ``stop - start`` is the span of one step of
            ``level`` (1 on level 0).
        level : int
            0 is the fine level.

        Returns
        -------
        tuple of ndarray
            Same number, shapes and dtype as ``state``.
        """

    def cost(self, level: int, span: int) -> float:
        """Work of one step of ``level`` in units of one fine step (work model)."""
        return 1.0


class FunctionPropagator(Propagator):
    """A propagator from a plain function ``phi(state, step) -> state``.

    Parameters
    ----------
    phi : callable
        One fine step: ``phi(state, i)`` advances from point ``i`` to ``i + 1``.
    coarse : callable, "repeat" or None
        Coarse levels: ``coarse(state, start, stop, level)``; ``"repeat"``
        (default) applies ``phi`` ``stop - start`` times, which makes the
        coarse propagator exact (MGRIT then converges in one iteration but
        saves no work: useful for checks).
    coarse_cost : callable, optional
        ``coarse_cost(level, span)`` for the work model; defaults to the span
        for ``"repeat"`` and 1 otherwise.
    """

    def __init__(self, phi: Callable, coarse: Callable | str | None = "repeat", coarse_cost: Callable | None = None):
        if not callable(phi):
            raise invalid("phi", phi, "a callable phi(state, step) -> state", TypeError)
        if coarse is None:
            coarse = "repeat"
        if not (callable(coarse) or coarse == "repeat"):
            raise invalid("coarse", coarse, "'repeat' or a callable coarse(state, start, stop, level)", TypeError)
        self.phi, self.coarse, self.coarse_cost = phi, coarse, coarse_cost

    def step(self, state, start, stop, level):
        if level == 0:
            return self.phi(state, start)
        if self.coarse == "repeat":
            for i in range(start, stop):
                state = self.phi(state, i)
            return state
        return self.coarse(state, start, stop, level)

    def cost(self, level, span):
        if level == 0:
            return 1.0
        if self.coarse_cost is not None:
            return float(self.coarse_cost(level, span))
        return float(span) if self.coarse == "repeat" else 1.0


@dataclass(frozen=True)
class StateLayout:
    """How a state (tuple of arrays) maps to the flat vector the solver stores.

    Attributes
    ----------
    shapes : tuple of tuple of int
    dtype : numpy.dtype
    """

    shapes: tuple
    dtype: np.dtype

    def __post_init__(self):
        sizes = tuple(int(math.prod(s)) for s in self.shapes)
        bounds = np.cumsum((0,) + sizes).tolist()
        object.__setattr__(self, "_sizes", sizes)
        object.__setattr__(self, "_slices", tuple(slice(a, b) for a, b in zip(bounds[:-1], bounds[1:], strict=True)))

    @classmethod
    def from_state(cls, state, name: str = "u0") -> StateLayout:
        arrays = _as_arrays(state, name)
        dtypes = {a.dtype for a in arrays}
        if len(dtypes) != 1:
            raise invalid(
                name, f"arrays of dtypes {sorted(str(d) for d in dtypes)}", "arrays of one floating dtype", TypeError
            )
        dtype = dtypes.pop()
        if not np.issubdtype(dtype, np.floating):
            raise invalid(name, f"arrays of dtype {dtype}", "floating-point arrays", TypeError)
        for i, a in enumerate(arrays):
            if not np.all(np.isfinite(a)):
                raise invalid(f"{name}[{i}]", "an array with NaN or Inf", "finite values")
        return cls(tuple(a.shape for a in arrays), dtype)

    @property
    def sizes(self) -> tuple[int, ...]:
        return self._sizes

    @property
    def size(self) -> int:
        return int(sum(self._sizes))

    def pack(self, state, out: np.ndarray | None = None) -> np.ndarray:
        """A flat vector holding ``state``: ``out`` when given, else a new one."""
        if out is None:
            out = np.empty(self.size, dtype=self.dtype)
        for a, sl in zip(state, self._slices, strict=True):
            out[sl] = np.ravel(a)
        return out

    def unpack(self, vector: np.ndarray) -> State:
        """Read-only views of ``vector`` shaped as the state."""
        parts = []
        for shape, sl in zip(self.shapes, self._slices, strict=True):
            view = vector[sl].reshape(shape)
            view.flags.writeable = False
            parts.append(view)
        return tuple(parts)

    def check(self, result, *, level: int, step: int) -> None:
        """Raise :class:`PropagatorError` unless ``result`` has this layout."""
        if not isinstance(result, (tuple, list)):
            raise PropagatorError(
                f"returned {type(result).__name__}, expected a tuple of {len(self.shapes)} arrays",
                level=level,
                step=step,
            )
        if len(result) != len(self.shapes):
            raise PropagatorError(f"returned {len(result)} arrays, expected {len(self.shapes)}", level=level, step=step)
        for i, (a, shape) in enumerate(zip(result, self.shapes, strict=True)):
            a_shape = getattr(a, "shape", None)
            a_dtype = getattr(a, "dtype", None)
            if a_shape != shape:
                raise PropagatorError(
                    f"returned array {i} of shape {a_shape}, expected {shape}", level=level, step=step
                )
            if a_dtype != self.dtype:
                raise PropagatorError(
                    f"returned array {i} of dtype {a_dtype}, expected {self.dtype}", level=level, step=step
                )

    def to_json(self) -> dict:
        return {"shapes": [list(s) for s in self.shapes], "dtype": self.dtype.name}


def _as_arrays(state, name: str) -> list[np.ndarray]:
    if isinstance(state, np.ndarray):
        state = (state,)
    if not isinstance(state, Sequence) or isinstance(state, (str, bytes)) or len(state) == 0:
        raise invalid(name, type(state).__name__, "a non-empty tuple or list of numpy arrays", TypeError)
    arrays = []
    for i, a in enumerate(state):
        if not isinstance(a, np.ndarray):
            raise invalid(f"{name}[{i}]", type(a).__name__, "a numpy array", TypeError)
        arrays.append(a)
    return arrays
