"""What a network-parallel run is asked to do, and what it did: the same for graph and resident modes."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from daskann._history import HistoryRecorder
from daskann.npt.grid import ProcessGrid


@dataclass(frozen=True)
class Stretch:
    """What a run of either mode is asked to do: steps up to ``stop`` of one ``fit`` or ``partial_fit`` call.

    Fixed for the whole run, every replay included.

    Attributes
    ----------
    X, y : ndarray or dask.array.Array
        Validated training data.
    validation : (X_val, y_val) or None
        Evaluated on the grid at ``eval_steps``.
    order : daskann.data.BatchOrder
        Step ``i`` trains on rows ``order.indices(i)``.
    settings : dict
        Validated trainer settings.
    stop : int
        Steps done when training ends.
    sizes : tuple of int
        Layer widths.
    run_id : str
        Prefix of every task key of the run (each try adds its number).
    timeout : float
        Seconds without a finished step before training fails.
    eval_steps, checkpoint_steps : frozenset of int
        Step counts after which to evaluate ``validation`` and to call ``on_checkpoint``.
    on_checkpoint : callable, optional
        ``on_checkpoint(step, layout, write) -> path``: writes the checkpoint store at ``path`` whose
        arrays ``layout`` describes (:func:`daskann.store.write_block_group`), ``write(tmp)`` writing
        every block from its cell; the store saved is where replays restart.
    progress : callable, optional
        ``progress(step, loss)`` after every step.
    time_offset : float
        Seconds already on the history's clock (a resumed or continued run).
    chains : {0, 1, 2}
        Graph mode: accumulation chains per block product (see :class:`daskann.npt.graph_mode.GraphEngine`).
    lookahead : int
        Graph mode: steps submitted ahead of the one whose loss the client waits for.
    max_recoveries : int, optional
        Replays from the same state before giving up (default: ``daskann.npt.graph-replays`` in graph
        mode, ``daskann.npt.resident-restarts`` in resident mode).
    """

    X: object
    y: object
    validation: tuple | None
    order: object
    settings: dict
    sizes: tuple
    stop: int
    run_id: str
    timeout: float
    eval_steps: frozenset = frozenset()
    checkpoint_steps: frozenset = frozenset()
    on_checkpoint: Callable | None = None
    progress: Callable | None = None
    time_offset: float = 0.0
    chains: int = 0
    lookahead: int = 1
    max_recoveries: int | None = None


@dataclass
class Outcome:
    """What a run has done so far, filled in as it goes: a run that fails still tells how far it came.

    Attributes
    ----------
    grid : ProcessGrid
        The grid of the latest try (after a replay, on the workers there were).
    history : HistoryRecorder
        A row per completed step.
    state : object
        The latest state left on the cells (after divergence, the last finite one).
    recoveries : int
        Replays after lost workers.
    diverged : (int, str) or None
        The step at which training diverged and what became non-finite.
    worker_times : dict
        ``{completed step: {worker: parts of its step time}}``, see :mod:`daskann.npt._timings`.
    """

    grid: ProcessGrid
    history: HistoryRecorder
    state: object = None
    recoveries: int = 0
    diverged: tuple[int, str] | None = None
    worker_times: dict = field(default_factory=dict)
