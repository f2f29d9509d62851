"""A network-parallel run as graph and resident modes share it.

* :class:`RunStart`: the state a run starts, or a replay restarts, from, and where its blocks are read
  (:class:`SeededBlocks`, :class:`StoredBlocks`, :class:`HeldBlocks`);
* :class:`FinalState`: the state a run leaves on the cells (graph mode's ``GridState``, resident
  mode's :class:`~daskann.npt.resident.ResidentState`), read and written where it lives;
* :class:`RunSpec`: what the run is asked to do, fixed for the whole run, and its data cut for a worker's
  cells (:func:`data_block`);
* :class:`RunRecord`: what the run has done, with the parts of each worker's step time
  (:func:`graph_worker_times`, :func:`resident_worker_times`);
* :class:`Replays`: the tries after lost grid workers.

Replay after lost grid workers: a try that loses a grid worker raises
:class:`~daskann.exceptions.WorkerLost`, carrying the latest :class:`RunStart` it saved (or None:
the one it began from). The same grid is then laid onto the workers there are (sharing workers if
the cluster shrank) and a new try, under its own number, restarts from that state. The budget is
per saved state: ``budget`` replays from one state, renewed by a try that reached a later one, so a
long run with checkpoints survives any number of spaced-out worker losses.

Step times: both modes give, per completed step and per worker, ``wall`` (the worker's own step)
split into ``compute`` (block products and the other arithmetic), ``serialise`` (graph mode:
deserialising and spilling, as the worker reports them; resident mode: 0, its sends encode on the
event loop beside the arithmetic), ``transfer`` (incoming blocks in transit while nothing was
computed) and ``idle`` (the rest: waiting for peers and the scheduler, bookkeeping). The four add
up to ``wall``.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Protocol, TypeVar

import numpy as np

from daskann import config
from daskann._batch import wait_for_replacements
from daskann._dask_input import is_dask_array, materialize
from daskann.cluster import worker_addresses
from daskann.exceptions import LostWorkersError, WorkerLost
from daskann.nn import MLP, init_bias_block, init_weight_block
from daskann.npt.grid import ProcessGrid
from daskann.store import BlockArray, read_region

# the history's module loads xarray: only the client needs it, and workers import this module
if TYPE_CHECKING:
    from daskann._history import HistoryRecorder

T = TypeVar("T")


class FinalState(Protocol):
    """The state a run left on the grid's cells, read and written where it lives: both modes' states derive from it.

    ``client`` is the client its ``futures`` belong to; :meth:`gather` brings the model and its
    velocity to the client, :meth:`save` has the cells write a checkpoint store's blocks and returns
    their digests, :meth:`weights` and :meth:`biases` view the blocks as dask arrays.
    """

    futures: dict

    @property
    def client(self):
        return next(iter(self.futures.values())).client

    def gather(self, settings: dict) -> tuple[MLP, list]: ...

    def save(self, tmp) -> dict: ...

    def weights(self) -> list: ...

    def biases(self) -> list: ...


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
    def from_seed(self) -> bool:
        """Whether the cells compute this state themselves from ``seed``."""
        return self.seed is not None and self.step == 0

    def without_cells(self) -> RunStart | None:
        """The same state without the cells' copy, which a lost worker took: None when nothing else holds it."""
        if self.state is None:
            return self
        if self.path is None and self.model is None:
            return None
        return replace(self, state=None)

    def block_source(self, sizes, dtype) -> SeededBlocks | StoredBlocks | HeldBlocks | None:
        """Where the cells read this state's blocks from; None when ``state`` holds them already.

        ``sizes`` and ``dtype`` are the network's (a seeded state is computed in that type).
        """
        if self.from_seed:
            return SeededBlocks(int(self.seed), tuple(int(n) for n in sizes), np.dtype(dtype).name)
        if self.state is not None:
            return None
        if self.path is not None:
            return StoredBlocks(self.path)
        return HeldBlocks(self.model, self.velocity)


# Block sources: regions of a state's arrays, named as in a checkpoint store (:func:`layer_arrays`), each
# read where it is needed, so that one loop lays out a seeded, a stored or a held state in either mode.


def layer_arrays(layer: int) -> tuple[str, str, str, str]:
    """Checkpoint names of a layer's weights, their velocity, its biases and their velocity."""
    return f"weights/{layer}", f"velocity/{2 * layer}", f"biases/{layer}", f"velocity/{2 * layer + 1}"


def checkpoint_layout(sizes, dtype, weight_bounds) -> dict:
    """The arrays of a checkpoint of a net cut into blocks (:func:`daskann.store.write_block_group`).

    ``weight_bounds(layer)`` gives the row and the column bounds of a layer's weight blocks; its biases
    are cut as the columns.
    """
    layout, name = {}, np.dtype(dtype).name
    for layer in range(len(sizes) - 1):
        rows, cols = (tuple(bounds) for bounds in weight_bounds(layer))
        weights, weight_velocity, biases, bias_velocity = layer_arrays(layer)
        for array in (weights, weight_velocity):
            layout[array] = BlockArray((sizes[layer], sizes[layer + 1]), name, (rows, cols))
        for array in (biases, bias_velocity):
            layout[array] = BlockArray((sizes[layer + 1],), name, (cols,))
    return layout


def assembled_state(sizes, dtype, blocks, settings: dict) -> tuple[MLP, list | None]:
    """The model and velocity that ``blocks`` cover, on the client: the inverse of a block source.

    ``blocks`` gives ``(array, region, block)``, arrays named as in a checkpoint (:func:`layer_arrays`)
    and regions as in :meth:`SeededBlocks.read`; ``settings`` gives the net's ``activation``, ``output``
    and ``negative_slope``. The velocity is None when no block of it came.
    """
    arrays = {}
    for array, region, block in blocks:
        if array not in arrays:
            kind, index = _parse(array)
            layer = index // 2 if kind == "velocity" else index
            is_weight = kind == "weights" or (kind == "velocity" and index % 2 == 0)
            shape = (sizes[layer], sizes[layer + 1]) if is_weight else (sizes[layer + 1],)
            arrays[array] = np.empty(shape, dtype=dtype)
        arrays[array][tuple(slice(a, b) for a, b in region)] = block
    names = [layer_arrays(k) for k in range(len(sizes) - 1)]
    model = MLP.from_arrays(
        [arrays[weights] for weights, _, _, _ in names],
        [arrays[biases] for _, _, biases, _ in names],
        **{k: settings[k] for k in ("activation", "output", "negative_slope")},
    )
    if names[0][1] not in arrays:
        return model, None
    return model, [
        arrays[v] for _, weight_velocity, _, bias_velocity in names for v in (weight_velocity, bias_velocity)
    ]


def _parse(array: str) -> tuple[str, int]:
    kind, index = array.split("/")
    return kind, int(index)


@dataclass(frozen=True)
class SeededBlocks:
    """The seeded initialisation, computed block by block where it is read.

    Each block comes from :mod:`daskann.nn._init`'s tiles, so it equals the same part of
    ``MLP(sizes, seed=seed)``; velocities start at zero.
    """

    seed: int
    sizes: tuple
    dtype: str
    tag = "born"  # key prefix of the blocks it makes

    def read(self, array: str, region) -> np.ndarray:
        """Rows and columns ``region`` (a ``(start, stop)`` per axis) of ``array``."""
        kind, index = _parse(array)
        if kind == "velocity":
            return np.zeros(tuple(b - a for a, b in region), dtype=self.dtype)
        shape = (self.sizes[index], self.sizes[index + 1])
        if kind == "weights":
            return init_weight_block(self.seed, index, shape, *region, self.dtype)
        return init_bias_block(self.seed, index, shape, *region, self.dtype)


@dataclass(frozen=True)
class StoredBlocks:
    """A checkpoint store of any grid or mode, read and verified block by block where it is read."""

    path: str
    tag = "load"

    def read(self, array: str, region) -> np.ndarray:
        """As :meth:`SeededBlocks.read`, by :func:`daskann.store.read_region`."""
        return read_region(self.path, array, region)


@dataclass(frozen=True, eq=False)
class HeldBlocks:
    """A model and its velocity that the client holds: cut there, never sent whole to a task."""

    model: MLP
    velocity: list
    tag = "init"

    def read(self, array: str, region) -> np.ndarray:
        """As :meth:`SeededBlocks.read`, a copy cut from the client's arrays."""
        kind, index = _parse(array)
        arrays = {"weights": self.model.weights, "biases": self.model.biases, "velocity": self.velocity}[kind]
        return np.array(arrays[index][tuple(slice(a, b) for a, b in region)], order="C")


def data_block(client, array, rows, cols, *, key: str, worker: str):
    """Rows and columns ``(start, stop)`` (None: all of them) of training data, cut for the cells of ``worker``.

    A numpy array is cut here (a copy the caller sends); a dask array is read on ``worker`` from the chunks
    the block overlaps, a future under ``key`` (:func:`daskann._dask_input.materialize`).
    """
    if is_dask_array(array):
        return materialize(client, array, key=key, rows=rows, cols=cols, workers=[worker])
    rows = slice(None) if rows is None else slice(*rows)
    return np.ascontiguousarray(array[rows] if cols is None else array[rows, slice(*cols)])


@dataclass(frozen=True)
class RunSpec:
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
        ``on_checkpoint(step, layout, write, rows) -> path``: writes the checkpoint store at ``path``
        whose arrays ``layout`` describes (:func:`daskann.store.write_block_group`), ``write(tmp)``
        writing every block from its cell, and the history beside it: the run record's rows and
        ``rows`` (``{step: values}``, the steps through ``step`` that the record does not hold yet).
        The store saved is where replays restart.
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
class RunRecord:
    """What a run has done so far, filled in as it goes: a run that fails still tells how far it came.

    Attributes
    ----------
    grid : ProcessGrid
        The grid of the latest try (after a replay, on the workers there were).
    history : HistoryRecorder
        A row per completed step.
    state : FinalState or None
        The latest state left on the cells (after divergence, the last finite one).
    recoveries : int
        Replays after lost workers.
    diverged : (int, str) or None
        The step at which training diverged and what became non-finite.
    worker_times : dict
        ``{completed step: {worker: parts of its step time}}``, parts as in the module docstring.
    """

    grid: ProcessGrid
    history: HistoryRecorder
    state: FinalState | None = None
    recoveries: int = 0
    diverged: tuple[int, str] | None = None
    worker_times: dict = field(default_factory=dict)


class Replays:
    """The tries of one run on a grid that may lose workers.

    Parameters
    ----------
    client : distributed.Client
    grid : ProcessGrid
        The grid of the first try; :attr:`grid` is the latest try's.
    run : RunSpec
        Its ``max_recoveries`` (replays from one saved state before giving up) and ``timeout`` (seconds
        without progress, which bound the wait for replacement workers).
    what : str
        The training named in errors (``"graph-mode training"``).
    budget : str
        The setting that gives the replays from one saved state where ``run.max_recoveries`` is None.
    error : type
        Raised on giving up: :class:`~daskann.exceptions.LostWorkersError` or a subclass.
    """

    def __init__(self, client, grid: ProcessGrid, run: RunSpec, *, what: str, budget: str, error=LostWorkersError):
        self.client, self.grid, self.what, self.error = client, grid, what, error
        self.budget = config.count(budget) if run.max_recoveries is None else run.max_recoveries
        self.timeout = run.timeout
        self.tries = 0  # replays so far, over every call of run (each try has its own number)

    def run(self, start: RunStart, attempt: Callable[[ProcessGrid, RunStart, int], T]) -> T:
        """``attempt(grid, start, number)``, tried again from the state a lost worker left, until it returns."""
        since = 0  # replays since the state they restart from was saved
        while True:
            try:
                return attempt(self.grid, start, self.tries)
            except WorkerLost as exc:
                self.tries += 1
                reached = exc.args[1] if len(exc.args) > 1 and exc.args[1] is not None else start
                # the cells' state may have left with the worker: only a store or the client can restart it
                if (reached := reached.without_cells()) is None:
                    raise self.error(
                        f"{self.what} lost the grid state it continued from, which no checkpoint holds ({exc.args[0]})"
                    ) from exc
                since = 1 if reached.step > start.step else since + 1
                start = reached
                if since > self.budget:
                    raise self.error(
                        f"{self.what} lost workers {since} times since step {start.step} ({exc.args[0]}); "
                        f"giving up after {self.budget} replays"
                    ) from exc
                self.grid = self._regrid()

    def _regrid(self) -> ProcessGrid:
        """The same grid shape on the workers there are once the lost ones are replaced, or no more are coming.

        A nanny restarts a worker in place within seconds (``daskann.npt.regrid-timeout``); a batch
        system's replacement job comes from the queue, waited for while the cluster has jobs to come
        (``daskann.cluster.worker-wait``).
        """
        client, grid = self.client, self.grid
        try:
            wait_for_replacements(
                client, len(set(grid.workers)), grace=min(config.seconds("npt.regrid-timeout"), self.timeout)
            )
        except OSError:  # the scheduler itself is gone: the next try says so
            pass
        workers = worker_addresses(client)
        if not workers:
            raise self.error(f"{self.what} lost every worker of the cluster")
        return ProcessGrid.from_workers(grid.shape, workers, share_workers=True)


#: task-stream actions per part of a step, in the order a moment is counted (the first that covers it)
GRAPH_ACTIONS = (
    ("compute", ("compute",)),
    ("serialise", ("deserialize", "disk-read", "disk-write")),
    ("transfer", ("transfer",)),
)


def _merge(intervals) -> list:
    """Disjoint, sorted ``(start, stop)`` intervals covering the same moments as ``intervals``."""
    merged: list = []
    for start, stop in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], stop)
        else:
            merged.append([start, stop])
    return merged


def _covered(merged: list, start: float, stop: float) -> float:
    """Seconds of ``[start, stop]`` that the disjoint intervals ``merged`` cover."""
    return sum(max(0.0, min(b, stop) - max(a, start)) for a, b in merged)


def graph_worker_times(spans: dict, step_ends: dict) -> dict:
    """``{completed step: {worker: times}}`` from the task stream's intervals of a graph-mode run.

    Parameters
    ----------
    spans : dict
        ``{worker: {action: [(start, stop), ...]}}``, the task stream's ``startstops`` of the run's tasks
        on each worker.
    step_ends : dict
        ``{worker: {step: when its last task of that step (0-based) finished}}``.

    A worker's step runs from the end of its previous step (its first step: from its first interval)
    to the end of its last task of the step; steps overlap on the grid, so the parts are of what the
    worker did in that window, whichever step a task belonged to.
    """
    out: dict = defaultdict(dict)
    for worker, ends in step_ends.items():
        actions = spans.get(worker, {})
        layers, so_far = [], []
        for part, names in GRAPH_ACTIONS:
            so_far += [iv for name in names for iv in actions.get(name, ())]
            layers.append((part, _merge(so_far)))
        begin = min((iv[0] for iv in so_far), default=min(ends.values()))
        for step in sorted(ends):
            end = max(begin, ends[step])
            times, covered = {"wall": end - begin}, 0.0
            for part, merged in layers:
                now = _covered(merged, begin, end)
                times[part], covered = max(now - covered, 0.0), now
            times["idle"] = max(times["wall"] - covered, 0.0)
            out[step + 1][worker] = times
            begin = end
    return dict(out)


def resident_worker_times(compute: float, wall: float, waited: float, transfer_waited: float) -> dict:
    """One resident worker's step: its arithmetic, the blocks' transit it waited for, and the rest.

    ``waited`` (seconds in receives) is kept as ``recv_wait``: transit plus waiting for peers.
    """
    transfer = min(max(transfer_waited, 0.0), max(wall - compute, 0.0))
    return {
        "wall": wall,
        "compute": compute,
        "serialise": 0.0,
        "transfer": transfer,
        "idle": max(wall - compute - transfer, 0.0),
        "recv_wait": waited,
    }
