"""Resident mode of Network Parallel Training: one long-lived task per worker.

Graph mode submits a task per block product, which costs milliseconds of
scheduler time per product. Resident mode submits one task per worker of the
grid for a whole stretch of training. The task keeps its cells' blocks
(weights, biases, velocities, activations) in memory across steps and moves
blocks straight to neighbour cells over distributed's worker-to-worker comm
(:mod:`daskann.npt._exchange`), so a training step makes no scheduler round
trip. Every product of forward and backward propagation runs by Cannon's
algorithm (see :mod:`daskann.npt._resident_program`); rectangular grids run
the generalised algorithm on a virtual ``lcm(rows, cols)`` square grid.

The arithmetic is SerialTrainer's, block by block: the same batch order, loss
scaling and SGD update, so float64 results agree with it to round-off and do
not depend on the grid.

A stretch starts from blocks its workers compute (the seeded initialisation),
read from a checkpoint store (any grid or mode), or hold from the stretch
before; with ``keep=True`` its final state stays in their memory
(:class:`ResidentState`), from where the workers write checkpoint stores in
graph mode's format and dask arrays read the blocks.

:func:`run_resident`, the resident run of :class:`~daskann.npt.trainer.NPTTrainer`, trains in
stretches between checkpoints: the cells write the checkpoint at the end of each stretch themselves,
and the next stretch continues from their memory. A lost grid worker restarts the stretch from its
starting state (the checkpoint before it) on the workers there are
(:class:`~daskann.npt._run.Replays`).
"""

from __future__ import annotations

import time
import uuid
from concurrent.futures import CancelledError
from dataclasses import dataclass, field
from functools import partial

import numpy as np
from distributed import futures_of

from daskann import config
from daskann._dask_input import is_dask_array
from daskann._validation import check_float, check_int, invalid
from daskann.cluster import wait_watching, worker_addresses, workers_left
from daskann.exceptions import DivergenceCause, LostWorkersError, ResidentError, WorkerLost
from daskann.nn import MLP
from daskann.npt._exchange import (
    ExchangeAborted,
    ExchangeTimeout,
    close_namespace,
    ensure_plugin,
    exchange_latency,
)
from daskann.npt._kernels import validation_scores
from daskann.npt._resident_program import (
    Layout,
    ResidentRun,
    block_of,
    owned_blocks,
    run_worker,
    save_blocks,
    summary,
)
from daskann.npt._run import (
    FinalState,
    HeldBlocks,
    Replays,
    RunRecord,
    RunSpec,
    RunStart,
    assembled_state,
    data_block,
    resident_worker_times,
)
from daskann.npt.grid import split_bounds
from daskann.npt.matrix import block_digests, blocks_to_dask

__all__ = [
    "ResidentError",
    "ResidentLostWorkers",
    "ResidentResult",
    "ResidentState",
    "RunStart",
    "current_workers",
    "exchange_latency",
    "run_resident",
    "train_resident",
]


class ResidentLostWorkers(LostWorkersError, ResidentError):
    """Resident training gave up after losing workers: a :class:`ResidentError`, as it has always been."""


@dataclass
class ResidentState(FinalState):
    """The state a resident run left in its workers' memory: one task result per worker of the grid.

    Attributes
    ----------
    layout : Layout
        Where each block lives.
    futures : dict
        Worker address -> future of that worker's task result (its cells' blocks).
    dtype : numpy.dtype
    """

    layout: Layout
    futures: dict
    dtype: np.dtype

    def _each(self, fn, *args, tag: str) -> list:
        """``fn(result, *args)`` on every worker, where its result lives; the futures in grid order."""
        name = f"{next(iter(self.futures.values())).key}-{tag}-{uuid.uuid4().hex[:6]}"
        return [
            self.client.submit(fn, future, *args, key=f"{name}-{k}", workers=[w], allow_other_workers=False, pure=False)
            for k, (w, future) in enumerate(self.futures.items())
        ]

    def gather(self, settings: dict) -> tuple[MLP, list]:
        """Model and velocity on the client (``settings``: activation, output, negative_slope)."""
        parts = _gather_on(self.client, self._each(owned_blocks, self.layout, tag="gather"), self.layout)
        return _gather_state(self.layout, settings, parts, self.dtype, velocity=True)

    def save(self, tmp) -> dict:
        """Every block written into the open checkpoint store ``tmp`` by its worker: ``{array: {"i.j": sha256}}``."""
        return block_digests(
            _gather_on(self.client, self._each(save_blocks, self.layout, str(tmp), tag="save"), self.layout)
        )

    def weights(self) -> list:
        """One dask array per layer whose chunks are the blocks, read where they live."""
        layout = self.layout
        out = []
        for k in range(layout.n_layers):
            keys = {(i, j): (k, (i, j)) for i in range(layout.q) for j in range(layout.q)}
            out.append(self._to_dask(f"W{k}", "W", keys, (layout.features[k], layout.features[k + 1])))
        return out

    def biases(self) -> list:
        """One dask array per layer, chunked as the weights' columns."""
        layout = self.layout
        return [
            self._to_dask(f"b{k}", "b", {(j,): (k, j) for j in range(layout.q)}, (layout.features[k + 1],))
            for k in range(layout.n_layers)
        ]

    def _to_dask(self, tag: str, name: str, keys: dict, bounds):
        index, reads = {w: k for k, w in enumerate(self.futures)}, {}
        for chunk, key in keys.items():
            cell = (0, chunk[0]) if len(chunk) == 1 else chunk
            reads[chunk] = (index[self.layout.cell_workers[cell]], block_of, name, key)
        array = f"{next(iter(self.futures.values())).key}-{tag}-dask-{uuid.uuid4().hex[:6]}"
        chunks = tuple(tuple(b - a for a, b in axis) for axis in bounds)
        return blocks_to_dask(array, list(self.futures.values()), reads, chunks, self.dtype)


@dataclass
class ResidentResult:
    """What a resident stretch of training gives back.

    Attributes
    ----------
    model : MLP or None
        Weights gathered from the grid after the last completed step (None when they stay there).
    velocity : list of ndarray or None
        SGD velocity in ``model.params`` order.
    rows : list of dict
        One per completed step: ``loss`` (minibatch loss before the update,
        as SerialTrainer computes it), ``compute_time`` (seconds of local
        arithmetic on the busiest worker), ``comm_time`` (the rest of the
        slowest worker's step: messaging and waiting), ``bytes_moved``
        (bytes sent between workers, all workers together), ``messages``
        (messages between workers, all workers together) and ``workers``
        (``{worker: times}``, see :mod:`daskann.npt._run`).
    diverged_step : int or None
        1-based step at which loss, gradients or weights became non-finite;
        ``model`` and ``velocity`` then hold the state before that step.
    diverged_what : str
        What became non-finite at ``diverged_step``, in SerialTrainer's words
        (:attr:`~daskann.exceptions.DivergenceCause.what`); empty without divergence.
    snapshots : dict
        ``{completed steps: MLP}`` at the steps ``eval_fn`` asked for (without ``validation``).
    evaluations : dict
        With ``validation``: ``{completed steps: {"val_loss": ..., "val_accuracy": ...}}`` at the steps
        ``eval_fn`` asked for, evaluated by the cells (``val_accuracy`` with ``"cross_entropy"`` only).
    state : ResidentState or None
        With ``keep=True``: the final state (after divergence, the last finite one), on the workers.
    """

    model: MLP | None
    velocity: list | None
    rows: list = field(default_factory=list)
    diverged_step: int | None = None
    diverged_what: str = ""
    snapshots: dict = field(default_factory=dict)
    state: ResidentState | None = None
    evaluations: dict = field(default_factory=dict)


def train_resident(
    client,
    grid,
    *,
    start: RunStart,
    X,
    y,
    order,
    settings: dict,
    stop: int,
    run_id: str,
    timeout: float = 120.0,
    eval_fn=None,
    validation=None,
    sizes=None,
    keep: bool = False,
) -> ResidentResult:
    """Train steps ``start.step .. stop - 1`` with worker-resident Cannon products.

    ``start`` is any :class:`RunStart`: its :class:`ResidentState` continues on the same grid's workers,
    a checkpoint store of any grid or mode is read (and verified) block by block by the workers, and a
    client-side model and velocity are sent (not modified). ``X``, ``y``, ``order``, ``settings``,
    ``stop``, ``run_id``, ``validation`` and ``sizes`` (needed without ``start.model``) are as the
    fields of :class:`~daskann.npt._run.RunSpec`; each worker gets the bands of its cells alone,
    and cells on one worker run in that worker's task. ``eval_fn(completed_steps) -> bool`` picks the
    steps whose model the cells evaluate on ``validation`` (no weight leaves them) or, without it,
    return as :attr:`ResidentResult.snapshots`. ``keep`` leaves the final state on the workers
    (:attr:`ResidentResult.state`) instead of gathering it.

    Raises
    ------
    ResidentError
        When a worker of the grid is not in the cluster at the start or leaves it, a block does not
        arrive within ``timeout`` seconds, or a cell fails; never hangs.
    """
    model, velocity, previous = start.model, start.velocity, start.state
    timeout, first, stop = _check_stretch(timeout, start.step, stop, run_id)
    dtype = np.dtype(settings["dtype"]) if model is None else model.dtype
    sizes = tuple(model.sizes) if model is not None else tuple(int(n) for n in sizes)
    if model is not None:
        velocity = _check_velocity(model, velocity)
    if stop == first and model is not None:
        return ResidentResult(model.copy(), [v.copy() for v in velocity])
    if stop == first:
        return ResidentResult(None, None, state=previous)
    X, y = _check_data(sizes, dtype, X, y, order, settings["loss"])
    if validation is not None:
        validation = _check_validation(sizes, dtype, validation, settings["loss"])
    layout = Layout.build(grid, sizes, order.batch_size)
    if previous is not None and previous.layout != layout:
        raise invalid("previous", "a state on another grid", "the state of a resident run on this grid")
    _check_workers(client, layout, run_id)
    ensure_plugin(client)
    run = ResidentRun.build(run_id, layout, settings, dtype, order, first, stop, timeout, eval_fn)
    source = start.block_source(sizes, dtype)
    if isinstance(source, HeldBlocks):
        source = HeldBlocks(model, velocity)  # the velocity checked
    payloads = _payloads(
        layout, source, X, y, settings["loss"], client=client, namespace=run.namespace, validation=validation
    )
    cells, results = _run_cells(client, run, payloads, previous, keep=keep)
    return _result(run, settings, dtype, results, cells, validation, keep=keep)


# -- a run: stretches between checkpoints ---------------------------------------
def run_resident(client, run: RunSpec, start: RunStart, record: RunRecord) -> None:
    """Resident mode from ``start`` on ``record.grid``: history rows, grid and the cells' state go into ``record``."""
    t0 = time.perf_counter() - run.time_offset
    replays = Replays(
        client, record.grid, run, what="resident training", budget="npt.resident-restarts", error=ResidentLostWorkers
    )
    for stop in sorted(run.checkpoint_steps | {run.stop}):
        if stop <= start.step:
            continue
        save = run.on_checkpoint if stop in run.checkpoint_steps else None
        try:
            result, path, rows = replays.run(start, partial(_stretch, client, run, t0, stop=stop, save=save))
        finally:
            record.grid, record.recoveries = replays.grid, replays.tries
        for done, (values, workers) in rows.items():
            record.history.append(done, **values)
            record.worker_times[done] = workers
            if run.progress is not None:
                run.progress(done, values["loss"])
        record.state = result.state
        if result.diverged_step is not None:
            # the cells rolled back to the last finite state
            record.diverged = (result.diverged_step, result.diverged_what)
            return
        # the next stretch continues from the cells' memory, or after a lost worker, from the store
        start = RunStart(stop, path=path, state=result.state)


def _stretch(client, run: RunSpec, t0: float, grid, start: RunStart, number: int, *, stop: int, save):
    """Try ``number`` at steps ``start.step .. stop - 1`` on ``grid``; :class:`WorkerLost` if a grid worker left.

    With ``save`` (:attr:`RunSpec.on_checkpoint`), the cells then write the checkpoint of step ``stop``,
    and the history through it beside it. Returns the result, the checkpoint's path (or None) and
    ``{step: (history values, worker times)}`` for the steps of the stretch, timed from ``t0``.
    """
    began = time.perf_counter()
    try:
        result = train_resident(
            client,
            grid,
            start=start,
            sizes=run.sizes,
            keep=True,
            X=run.X,
            y=run.y,
            order=run.order,
            settings=run.settings,
            stop=stop,
            run_id=f"{run.run_id}-r{number}",
            timeout=run.timeout,
            eval_fn=(lambda d: d in run.eval_steps) if run.eval_steps else None,
            validation=run.validation,
        )
        rows = _stretch_rows(result, start.step, began - t0, time.perf_counter() - began)
        path = None
        if save is not None and result.diverged_step is None:
            state = result.state
            path = save(stop, state.layout.store_layout(state.dtype), state.save, {d: v for d, (v, _) in rows.items()})
        return result, path, rows
    except ResidentError as exc:
        if set(grid.workers) <= set(worker_addresses(client)):
            raise
        # a worker left: restart this stretch from its starting state on the workers there are
        raise WorkerLost(str(exc), None) from exc


def _stretch_rows(result: ResidentResult, start: int, clock: float, elapsed: float) -> dict:
    """``{step: (history values, worker times)}`` of a stretch that began ``clock`` s into the run and took ``elapsed``.

    The stretch's wall time is shared out over its steps in proportion to each step's compute and comm time.
    """
    busy = sum(r["compute_time"] + r["comm_time"] for r in result.rows) or 1.0
    rows = {}
    for k, row in enumerate(result.rows):
        done = start + k + 1
        clock += (row["compute_time"] + row["comm_time"]) * elapsed / busy
        values = {
            "loss": row["loss"],
            "time": clock,
            "compute_time": row["compute_time"],
            "comm_time": row["comm_time"],
            "bytes_moved": float(row["bytes_moved"]),
        }
        # evaluated by the cells: neither the model nor the validation data came to the client
        values.update(result.evaluations.get(done, {}))
        rows[done] = (values, row["workers"])
    return rows


# -- set-up --------------------------------------------------------------------
def _check_stretch(timeout, start, stop, run_id) -> tuple[float, int, int]:
    timeout = check_float("timeout", timeout, minimum=0.0, min_inclusive=False)
    start = check_int("start", start, minimum=0)
    stop = check_int("stop", stop, minimum=start)
    if not isinstance(run_id, str) or not run_id:
        raise invalid("run_id", run_id, "a non-empty string")
    return timeout, start, stop


def _check_velocity(model: MLP, velocity) -> list:
    velocity = [np.asarray(v, dtype=model.dtype) for v in velocity]
    if [v.shape for v in velocity] != [p.shape for p in model.params]:
        raise invalid("velocity", [v.shape for v in velocity], "arrays shaped like model.params")
    return velocity


def _check_data(sizes, dtype, X, y, order, loss: str):
    if not is_dask_array(X):  # dask arrays, checked and cast by the trainer, are read on the workers
        X = np.asarray(X, dtype=dtype)
        y = np.asarray(y, dtype=np.int64) if loss == "cross_entropy" else np.asarray(y)
    if X.shape != (order.n_samples, sizes[0]):
        raise invalid("X", f"shape {X.shape}", f"shape ({order.n_samples}, {sizes[0]})")
    expected = (order.n_samples,) if loss == "cross_entropy" else (order.n_samples, sizes[-1])
    if y.shape != expected:
        raise invalid("y", f"shape {y.shape}", f"shape {expected} for loss={loss!r}")
    return X, y


def _check_validation(sizes, dtype, validation, loss: str) -> tuple:
    Xv, yv = validation
    if not is_dask_array(Xv):  # as for X: dask arrays come checked and cast by the trainer
        Xv = np.asarray(Xv, dtype=dtype)
        yv = np.asarray(yv, dtype=np.int64) if loss == "cross_entropy" else np.asarray(yv, dtype=dtype)
    if Xv.ndim != 2 or Xv.shape[1] != sizes[0]:
        raise invalid("validation_data[0]", f"shape {Xv.shape}", f"shape (n_val, {sizes[0]})")
    expected = (Xv.shape[0],) if loss == "cross_entropy" else (Xv.shape[0], sizes[-1])
    if yv.shape != expected:
        raise invalid("validation_data[1]", f"shape {yv.shape}", f"shape {expected} for loss={loss!r}")
    return Xv, yv


def current_workers(client) -> list[str]:
    """Worker addresses straight from the scheduler.

    Not ``client.scheduler_info()``: the client's periodic refresh may replace
    its cached copy with one that lists no workers at all.
    """
    return list(client.sync(client.scheduler.identity, n_workers=-1)["workers"])


def _check_workers(client, layout: Layout, run_id: str) -> None:
    # the caller chose the grid from the workers there were, so one missing now has most likely left (a
    # batch job that ended between two stretches): a lost worker, which the trainer replays, as in the run
    missing = workers_left(client, layout.workers, listed=current_workers)
    if missing:
        raise ResidentError(f"resident run {run_id} cannot start: {_described(layout, missing)} is not in the cluster")


def _payload(layout: Layout, worker: str, source, X, y, loss: str, cut) -> dict:
    """The blocks, or where to read them, and the data bands one worker's cells start from.

    ``source`` is the start's block source (:meth:`RunStart.block_source`): a model the client holds is
    cut here, the seed or a store path goes to the worker, None leaves the state the cells hold.
    ``cut(array, rows, cols, tag)`` cuts a band of the data (see :func:`_cutter`).
    """
    columns = sorted({j for _, j in layout.cells_of(worker)})
    payload = layout.blocks(worker, source) if isinstance(source, HeldBlocks) else {"source": source}
    rows = (0, X.shape[0])
    payload["X"] = {j: cut(X, rows, layout.features[0][j], f"X-{j}") for j in columns}
    if loss == "cross_entropy":
        payload["y"] = cut(y, rows, None, "y")
    else:
        payload["y"] = {j: cut(y, rows, layout.features[-1][j], f"y-{j}") for j in columns}
    return payload


def _payloads(layout: Layout, source, X, y, loss: str, *, client=None, namespace: str = "", validation=None):
    """``(worker, its payload)`` for every worker of the grid, built one at a time."""
    for k, worker in enumerate(layout.workers):
        payload = _payload(layout, worker, source, X, y, loss, _cutter(client, worker, f"{namespace}-read", k))
        if validation is not None:
            cut = _cutter(client, worker, f"{namespace}-read-val", k)
            payload |= _validation_blocks(layout, worker, validation, loss, cut)
        yield worker, payload


def _validation_blocks(layout: Layout, worker: str, validation, loss: str, cut) -> dict:
    """``Xv`` and ``yv`` of ``worker``'s cells: grid row ``i`` evaluates band ``i`` of the validation rows.

    ``cut(array, rows, cols, tag)`` reads one block (``cols`` None for labels, which every cell of a grid row
    needs whole).
    """
    Xv, yv = validation
    rows = split_bounds(Xv.shape[0], layout.q)
    cells = layout.cells_of(worker)
    blocks = {"Xv": {(i, j): cut(Xv, rows[i], layout.features[0][j], f"X-{i}-{j}") for i, j in cells}}
    if loss == "cross_entropy":
        blocks["yv"] = {i: cut(yv, rows[i], None, f"y-{i}") for i in sorted({i for i, _ in cells})}
    else:
        blocks["yv"] = {(i, j): cut(yv, rows[i], layout.features[-1][j], f"y-{i}-{j}") for i, j in cells}
    return blocks


def _cutter(client, worker: str, prefix: str, k: int):
    """``cut(array, rows, cols, tag)``: a block of the data for ``worker``'s cells (:func:`.data_block`)."""

    def cut(array, rows, cols, tag):
        return data_block(client, array, rows, cols, key=f"{prefix}-{tag}-{k}", worker=worker)

    return cut


# -- running -------------------------------------------------------------------
def _run_cells(client, run: ResidentRun, payloads, previous: ResidentState | None, *, keep: bool):
    """Scatter each worker's blocks, run one task per worker and wait for all; always clean up.

    Returns the tasks' futures and their results (without blocks when ``keep``: those stay on the
    workers, under the futures).
    """
    data: dict = {}
    futures: list = []
    kept = False
    try:
        _scatter(client, run, payloads, into=data)
        futures = [
            client.submit(
                run_worker,
                run,
                data[worker],
                None if previous is None else previous.futures[worker],
                key=f"{run.namespace}-cells-{k}",
                workers=[worker],
                allow_other_workers=False,
                pure=False,
            )
            for k, worker in enumerate(run.layout.workers)
        ]
        _wait(client, futures, run.layout, run.run_id)
        if not keep:
            return futures, client.gather(futures)
        summaries = [
            client.submit(summary, f, key=f"{run.namespace}-summary-{k}", workers=[w], pure=False)
            for k, (w, f) in enumerate(zip(run.layout.workers, futures, strict=True))
        ]
        results = _gather_on(client, summaries, run.layout)
        kept = True
        return futures, results
    finally:
        # cancelling a task cancels what depends on it: the kept results' inputs are only let go
        _clean_up(client, run, [] if kept else futures + list(data.values()))


def _scatter(client, run: ResidentRun, payloads, *, into: dict) -> None:
    """Each worker's payload onto that worker (``into``: worker -> future, filled as they go)."""
    for k, (worker, payload) in enumerate(payloads):
        key = f"{run.namespace}-data-{k}"
        try:
            if futures_of(payload):  # data cut on the worker: the blocks join it there
                into[worker] = client.submit(
                    _identity, payload, key=key, workers=[worker], allow_other_workers=False, pure=False
                )
                continue
            into[worker] = client.scatter({key: payload}, workers=[worker], hash=False)[key]
        except (OSError, KeyError) as exc:
            # the worker left between the grid's set-up and the scatter (the scheduler no longer knows it)
            if isinstance(exc, KeyError) and not (exc.args and exc.args[0] == worker):
                raise
            raise ResidentError(f"worker {worker} left while its blocks were scattered ({exc!r})") from exc


def _identity(payload):
    return payload


def _clean_up(client, run: ResidentRun, futures: list) -> None:
    """Release the run's futures and close its mailboxes on the workers still there."""
    client.cancel(futures)
    alive = set(current_workers(client))
    client.run(
        close_namespace,
        run.namespace,
        f"resident run {run.namespace} ended",
        workers=[w for w in run.layout.workers if w in alive],
        on_error="ignore",
    )


# -- waiting -------------------------------------------------------------------
def _wait(client, futures, layout: Layout, run_id: str) -> None:
    """Wait for every worker's task; fail fast and clearly, never hang."""

    def look():
        status = [f.status for f in futures]
        if all(s == "finished" for s in status):
            return True
        failed = any(s in ("error", "cancelled", "lost") for s in status)
        gone = workers_left(client, layout.workers, listed=current_workers)
        if gone:
            raise ResidentError(
                f"resident run {run_id} failed: {_described(layout, gone)} left the cluster during training"
            )
        if failed:
            raise _failure(futures, layout, run_id)
        return None

    wait_watching(futures, look)


def _gather_on(client, futures, layout: Layout) -> list:
    """The values of tasks pinned to the grid's workers; a task's own error as it is.

    Never hangs on a pinned task whose worker is gone, and never lets the scheduler's cancellation
    through: both raise :class:`ResidentError`. A worker that leaves can take a task's input with it
    (the cells' state, or data only it held); the scheduler then forgets the task and cancels it.
    """

    def look():
        if all(f.done() for f in futures) and not any(f.status in ("cancelled", "lost") for f in futures):
            try:
                return client.gather(futures)
            except CancelledError:  # a worker left while its result was fetched: said below
                pass
        gone = workers_left(client, layout.workers, listed=current_workers)
        if gone:
            raise ResidentError(f"worker(s) {', '.join(gone)} left the cluster while their blocks were read")
        cancelled = [f.key for f in futures if f.status in ("cancelled", "lost")]
        if cancelled:
            raise ResidentError(
                f"the scheduler cancelled {', '.join(map(str, cancelled))} while their blocks were read: "
                "a worker that held their input left the cluster"
            )
        return None

    return wait_watching(futures, look)


def _failure(futures, layout: Layout, run_id: str) -> ResidentError:
    """The clearest error among the tasks.

    A task that raised on its own comes first. Otherwise the culprit is a
    worker whose task never finished (stuck, not started, or dead) while its
    peers timed out or were aborted waiting for it.
    """
    deadline = time.monotonic() + config.seconds("npt.settle-time")
    last_change, done = time.monotonic(), sum(f.status != "pending" for f in futures)
    # the other cells stop within moments (they are aborted); a stuck one never does
    while time.monotonic() < deadline and done < len(futures) and time.monotonic() - last_change < 0.5:
        time.sleep(0.05)
        now = sum(f.status != "pending" for f in futures)
        if now != done:
            done, last_change = now, time.monotonic()
    errors = []
    for future in futures:
        if future.status == "error":
            errors.append(future.exception())
        elif future.status in ("cancelled", "lost"):
            errors.append(RuntimeError(f"the task {future.key} was {future.status} by the scheduler"))
    own = [e for e in errors if not isinstance(e, (ExchangeAborted, ExchangeTimeout))]
    timeouts = [e for e in errors if isinstance(e, ExchangeTimeout)]
    silent = [w for w, f in zip(layout.workers, futures, strict=True) if f.status == "pending"]
    if own:
        root = own[0]
        text = f"{type(root).__name__}: {root}"
    elif silent and (timeouts or not errors):
        root = timeouts[0] if timeouts else None
        text = f"{_described(layout, silent)} sent nothing: its task is stuck, did not start, or its worker died"
        if root is not None:
            text += f" (first to give up: {root})"
    else:
        root = min(errors, key=lambda e: isinstance(e, ExchangeAborted))
        text = f"{type(root).__name__}: {root}"
    error = ResidentError(f"resident run {run_id} failed: {text}")
    error.__cause__ = root
    return error


def _described(layout: Layout, workers) -> str:
    """``worker ... (cells ...)`` for each of ``workers``, their process cells named as the grid's."""

    def cells(worker: str) -> str:
        return ", ".join(str(c) for c in sorted({layout.process_cell(c) for c in layout.cells_of(worker)}))

    return "; ".join(f"worker {w} (cells {cells(w)})" for w in workers)


# -- results -------------------------------------------------------------------
def _result(run: ResidentRun, settings: dict, dtype, results: list[dict], cells, validation, *, keep: bool):
    """The stretch's :class:`ResidentResult` from every worker's ``results``: with ``keep``, its state on ``cells``,
    else the model and velocity gathered to the client."""
    layout, rows = run.layout, []
    for t, loss in enumerate(results[0]["losses"]):
        stats = [r["stats"][t] for r in results]  # (compute, wall, bytes, messages, waited, transfer waited)
        compute, wall = max(s[0] for s in stats), max(s[1] for s in stats)
        rows.append(
            {
                "loss": float(loss),
                "compute_time": float(compute),
                "comm_time": float(max(wall - compute, 0.0)),
                "bytes_moved": int(sum(s[2] for s in stats)),
                "messages": int(sum(s[3] for s in stats)),
                "workers": {
                    r["worker"]: resident_worker_times(*s[:2], *s[4:6]) for r, s in zip(results, stats, strict=True)
                },
            }
        )
    # every worker agreed on the same step and cause
    diverged_step, cause = results[0]["diverged"] or (None, DivergenceCause.FINITE)
    result = ResidentResult(None, None, rows, diverged_step, DivergenceCause(cause).what)
    if keep:
        result.state = ResidentState(layout, dict(zip(layout.workers, cells, strict=True)), dtype)
    else:
        states = [r["state"] for r in results]
        result.model, result.velocity = _gather_state(layout, settings, states, dtype, velocity=True)
    for done in run.eval_steps:
        if done <= run.start + len(rows) and done in results[0]["snapshots"]:  # none when the cells evaluated
            snapshots = [r["snapshots"][done] for r in results]
            result.snapshots[done] = _gather_state(layout, settings, snapshots, dtype)[0]
    if validation is not None:
        result.evaluations = _evaluations(results, settings["loss"], validation[0].shape[0], layout.sizes[-1])
    return result


def _evaluations(results: list[dict], loss: str, n_val: int, n_out: int) -> dict:
    """``{completed steps: {"val_loss": ..., "val_accuracy": ...}}`` from every worker's parts, summed in grid order."""
    out = {}
    for done in sorted(results[0]["evaluations"]):
        total = sum(r["evaluations"][done][0] for r in results)
        correct = sum(r["evaluations"][done][1] for r in results)
        out[done] = validation_scores(total, correct, loss, n_val, n_out)
    return out


def _gather_state(layout: Layout, settings: dict, states, dtype, *, velocity: bool = False):
    """The model (and ``velocity``) from every worker's cell blocks (:func:`~daskann.npt._run.assembled_state`)."""
    names = ("W", "vW", "b", "vb") if velocity else ("W", "b")
    blocks = (
        (array, region, block)
        for state in states
        for array, _, region, block in layout.named_blocks({name: state[name] for name in names})
    )
    return assembled_state(layout.sizes, dtype, blocks, settings)
