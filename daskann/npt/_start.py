"""Where a network-parallel run begins: one type for every way training starts or restarts."""

from __future__ import annotations

from dataclasses import dataclass, replace

from daskann.nn import MLP


@dataclass(frozen=True)
class RunStart:
    """The state after ``step`` steps that a run starts, or a replay restarts, from.

    One source is used, the first of: ``seed`` at step 0 (the seeded initialisation, computed on
    the cells); ``state``, the state a run on the same grid left on its cells (a graph-mode
    ``GridState`` or a :class:`daskann.npt.resident.ResidentState`; lost with any of its workers);
    ``path``, a checkpoint store whose blocks the cells read; ``model`` and ``velocity``, held by
    the client and sent to the cells.

    Attributes
    ----------
    step : int
        Steps done in this state.
    model : MLP, optional
    velocity : list of ndarray, optional
        SGD velocity in ``model.params`` order (with ``model``).
    seed : int, optional
    path : str, optional
        Stored as a string.
    state : object, optional
    """

    step: int = 0
    model: MLP | None = None
    velocity: list | None = None
    seed: int | None = None
    path: str | None = None
    state: object = None

    def __post_init__(self) -> None:
        if self.path is not None:
            object.__setattr__(self, "path", str(self.path))

    @property
    def born(self) -> bool:
        """Whether the cells compute this state themselves from ``seed``."""
        return self.seed is not None and self.step == 0

    def without_cells(self) -> RunStart | None:
        """The same state without the cells' copy, which a lost worker took: None when nothing else holds it."""
        if self.state is None:
            return self
        if self.path is None and self.model is None:
            return None
        return replace(self, state=None)
