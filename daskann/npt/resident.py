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
"""

from __future__ import annotations

import threading
import time
import uuid
from dataclasses import dataclass, field

import numpy as np

from daskann import config
from daskann._dask_input import is_dask_array, materialize
from daskann._validation import check_float, check_int, invalid
from daskann.exceptions import ResidentError
from daskann.nn import MLP
from daskann.npt._exchange import (
    ExchangeAborted,
    ExchangeTimeout,
    close_namespace,
    ensure_plugin,
    exchange_latency,
)
from daskann.npt._resident_layout import Layout
from daskann.npt._resident_program import run_worker

__all__ = ["ResidentError", "ResidentResult", "current_workers", "exchange_latency", "train_resident"]


@dataclass
class ResidentResult:
    """What a resident stretch of training gives back.

    Attributes
    ----------
    model : MLP
        Weights gathered from the grid after the last completed step.
    velocity : list of ndarray
        SGD velocity in ``model.params`` order.
    rows : list of dict
        One per completed step: ``loss`` (minibatch loss before the update,
        as SerialTrainer computes it), ``compute_time`` (seconds of local
        arithmetic on the busiest worker), ``comm_time`` (the rest of the
        slowest worker's step: messaging and waiting), ``bytes_moved``
        (bytes sent between workers, all workers together) and ``messages``
        (messages between workers, all workers together).
    diverged_step : int or None
        1-based step at which loss, gradients or weights became non-finite;
        ``model`` and ``velocity`` then hold the state before that step.
    snapshots : dict
        ``{completed steps: MLP}`` at the steps ``eval_fn`` asked for.
    """

    model: MLP
    velocity: list
    rows: list = field(default_factory=list)
    diverged_step: int | None = None
    snapshots: dict = field(default_factory=dict)


@dataclass(frozen=True)
class ResidentRun:
    """One validated resident stretch: what every worker's task is told.

    Attributes
    ----------
    run_id : str
        The caller's run prefix (named in errors).
    namespace : str
        Prefix of this stretch's task keys and message namespace.
    layout : Layout
        Blocks of every layer on the grid's cells.
    settings : dict
        The arithmetic's settings (``dtype`` as a name).
    order : daskann.data.BatchOrder
    start, stop : int
        Steps to train, ``start < stop``.
    timeout : float
        Seconds any block may take to arrive.
    eval_steps : tuple of int
        Step counts after which the model is kept as a snapshot.
    """

    run_id: str
    namespace: str
    layout: Layout
    settings: dict
    order: object
    start: int
    stop: int
    timeout: float
    eval_steps: tuple = ()

    @classmethod
    def build(cls, run_id, layout, settings, dtype, order, start, stop, timeout, eval_fn) -> ResidentRun:
        """The run of :func:`train_resident`'s validated arguments, under a fresh namespace."""
        return cls(
            run_id=run_id,
            namespace=f"{run_id}-resident-{uuid.uuid4().hex[:10]}",
            layout=layout,
            settings={k: settings[k] for k in ("loss", "output", "activation", "negative_slope", "lr", "momentum")}
            | {"dtype": np.dtype(dtype).name},
            order=order,
            start=start,
            stop=stop,
            timeout=timeout,
            eval_steps=tuple(d for d in range(start + 1, stop + 1) if eval_fn is not None and eval_fn(d)),
        )

    def spec(self) -> dict:
        """The settings of every worker's task (:func:`daskann.npt._resident_program.run_worker`)."""
        return {
            "namespace": self.namespace,
            "layout": self.layout,
            "settings": self.settings,
            "order": self.order,
            "start": self.start,
            "stop": self.stop,
            "timeout": self.timeout,
            "eval_steps": list(self.eval_steps),
        }


def train_resident(
    client,
    grid,
    *,
    model: MLP,
    velocity,
    X,
    y,
    order,
    settings: dict,
    start: int,
    stop: int,
    run_id: str,
    timeout: float = 120.0,
    eval_fn=None,
    seed: int | None = None,
) -> ResidentResult:
    """Train steps ``start .. stop - 1`` with worker-resident Cannon products.

    Parameters
    ----------
    client : distributed.Client
    grid : daskann.npt.grid.ProcessGrid
        Cells may share workers; cells on one worker run in that worker's task.
    model : MLP
        Weights after ``start`` steps (not modified).
    velocity : list of ndarray
        SGD velocity in ``model.params`` order.
    X, y : ndarray
        Validated training data (``y`` float 2-d for ``"mse"``, int64 labels
        for ``"cross_entropy"``); only column bands go to each worker.
    order : daskann.data.BatchOrder
        Step ``i`` trains on rows ``order.indices(i)``.
    settings : dict
        Validated trainer settings (``loss``, ``lr``, ``momentum``,
        ``activation``, ``output``, ``negative_slope``, ``dtype``).
    start, stop : int
        Steps to train, ``start <= stop``.
    run_id : str
        Prefix of every task key and message namespace of this run.
    timeout : float
        Seconds any block may take to arrive before the run fails.
    eval_fn : callable, optional
        ``eval_fn(completed_steps) -> bool``; the model at those steps is
        returned in :attr:`ResidentResult.snapshots`.
    seed : int, optional
        ``model`` and ``velocity`` are the seeded initialisation of this seed
        (zero velocity): each worker computes its blocks itself
        (:meth:`Layout.born_blocks`) and none is sent from the client.

    Returns
    -------
    ResidentResult

    Raises
    ------
    ResidentError
        When a worker leaves the cluster, a block does not arrive within
        ``timeout`` seconds, or a cell fails; never hangs.
    """
    timeout, start, stop = _check_stretch(timeout, start, stop, run_id)
    velocity = _check_velocity(model, velocity)
    if stop == start:
        return ResidentResult(model.copy(), [v.copy() for v in velocity])
    X, y = _check_data(model, X, y, order, settings["loss"])
    layout = Layout.build(grid, model.sizes, order.batch_size)
    _check_workers(client, layout)
    ensure_plugin(client)
    run = ResidentRun.build(run_id, layout, settings, model.dtype, order, start, stop, timeout, eval_fn)
    payloads = _payloads(layout, model, velocity, X, y, settings["loss"], client=client, namespace=run.namespace)
    if seed is not None:
        payloads = _born(payloads, seed)
    results = _run_cells(client, run, payloads)
    return _assemble(layout, model, results, run.eval_steps, start)


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


def _check_data(model: MLP, X, y, order, loss: str):
    if not is_dask_array(X):  # dask arrays, checked and cast by the trainer, are read on the workers
        X = np.asarray(X, dtype=model.dtype)
        y = np.asarray(y)
    if X.shape != (order.n_samples, model.sizes[0]):
        raise invalid("X", f"shape {X.shape}", f"shape ({order.n_samples}, {model.sizes[0]})")
    expected = (order.n_samples,) if loss == "cross_entropy" else (order.n_samples, model.sizes[-1])
    if y.shape != expected:
        raise invalid("y", f"shape {y.shape}", f"shape {expected} for loss={loss!r}")
    return X, y


def current_workers(client) -> list[str]:
    """Worker addresses straight from the scheduler.

    Not ``client.scheduler_info()``: the client's periodic refresh may replace
    its cached copy with one that lists no workers at all.
    """
    return list(client.sync(client.scheduler.identity, n_workers=-1)["workers"])


def _check_workers(client, layout: Layout) -> None:
    alive = set(current_workers(client))
    missing = [w for w in layout.workers if w not in alive]
    if missing:
        raise invalid("grid", f"a grid on {', '.join(missing)}", "a grid whose workers are all in the cluster now")


def _payload(layout: Layout, worker: str, model: MLP, velocity, X, y, loss: str, read=None) -> dict:
    """The blocks and data bands one worker's cells start from (``read`` cuts dask-array data on ``worker``)."""
    cells = layout.cells_of(worker)
    columns = sorted({j for _, j in cells})
    n = layout.n_layers
    payload = {
        "W": {(k, c): layout.weight_block(k, c, model.weights[k]) for k in range(n) for c in cells},
        "vW": {(k, c): layout.weight_block(k, c, velocity[2 * k]) for k in range(n) for c in cells},
        "b": {(k, j): layout.bias_block(k, j, model.biases[k]) for k in range(n) for j in columns},
        "vb": {(k, j): layout.bias_block(k, j, velocity[2 * k + 1]) for k in range(n) for j in columns},
    }
    if read is not None:
        return {**read(worker, columns), **payload}
    payload["X"] = {j: np.ascontiguousarray(X[:, slice(*layout.features[0][j])]) for j in columns}
    if loss == "cross_entropy":
        payload["y"] = np.asarray(y, dtype=np.int64)
    else:
        payload["y"] = {j: np.ascontiguousarray(y[:, slice(*layout.features[-1][j])]) for j in columns}
    return payload


def _payloads(layout: Layout, model: MLP, velocity, X, y, loss: str, *, client=None, namespace: str = ""):
    """``(worker, its payload)`` for every worker of the grid, built one at a time."""
    read = None
    if is_dask_array(X):

        def read(worker: str, columns) -> dict:
            k = layout.workers.index(worker)

            def band(array, bounds, tag):
                key = f"{namespace}-read-{tag}-{k}"
                return materialize(client, array, key=key, cols=bounds, workers=[worker])

            features, outputs = layout.features[0], layout.features[-1]
            cut = {"X": {j: band(X, features[j], f"X-{j}") for j in columns}}
            if loss == "cross_entropy":
                cut["y"] = band(y, None, "y")
            else:
                cut["y"] = {j: band(y, outputs[j], f"y-{j}") for j in columns}
            return cut

    for worker in layout.workers:
        yield worker, _payload(layout, worker, model, velocity, X, y, loss, read)


def _born(payloads, seed: int):
    """``payloads`` without weight blocks: each worker computes the seeded initialisation of its cells."""
    for worker, payload in payloads:
        yield worker, {k: v for k, v in payload.items() if k not in ("W", "vW", "b", "vb")} | {"born": int(seed)}


# -- running -------------------------------------------------------------------
def _run_cells(client, run: ResidentRun, payloads) -> list[dict]:
    """Scatter each worker's blocks, run one task per worker and wait for all; always clean up."""
    data: dict = {}
    futures: list = []
    try:
        _scatter(client, run, payloads, into=data)
        spec = run.spec()
        futures = [
            client.submit(
                run_worker,
                spec,
                data[worker],
                key=f"{run.namespace}-cells-{k}",
                workers=[worker],
                allow_other_workers=False,
                pure=False,
            )
            for k, worker in enumerate(run.layout.workers)
        ]
        return _wait(client, futures, run.layout, run.run_id)
    finally:
        _clean_up(client, run, futures + list(data.values()))


def _scatter(client, run: ResidentRun, payloads, *, into: dict) -> None:
    """Each worker's payload onto that worker (``into``: worker -> future, filled as they go)."""
    for k, (worker, payload) in enumerate(payloads):
        key = f"{run.namespace}-data-{k}"
        try:
            if _holds_futures(payload):  # data cut on the worker: the blocks join it there
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


def _holds_futures(payload: dict) -> bool:
    from distributed import Future

    values = [payload["y"], *payload["X"].values()]
    if isinstance(payload["y"], dict):
        values += list(payload["y"].values())
    return any(isinstance(v, Future) for v in values)


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
def _wait(client, futures, layout: Layout, run_id: str) -> list[dict]:
    """Wait for every worker's task; fail fast and clearly, never hang."""
    wake = threading.Event()
    for future in futures:
        future.add_done_callback(lambda _: wake.set())
    while True:
        wake.clear()
        status = [f.status for f in futures]
        if all(s == "finished" for s in status):
            return client.gather(futures)
        failed = any(s in ("error", "cancelled", "lost") for s in status)
        alive = set(current_workers(client))
        gone = [w for w in layout.workers if w not in alive]
        if gone:
            described = "; ".join(f"worker {w} (cells {_cells(layout, w)})" for w in gone)
            raise ResidentError(f"resident run {run_id} failed: {described} left the cluster during training")
        if failed:
            raise _failure(futures, layout, run_id)
        wake.wait(config.seconds("npt.poll-interval"))


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
        cells = "; ".join(f"worker {w} (cells {_cells(layout, w)})" for w in silent)
        text = f"{cells} sent nothing: its task is stuck, did not start, or its worker died"
        if root is not None:
            text += f" (first to give up: {root})"
    else:
        root = min(errors, key=lambda e: isinstance(e, ExchangeAborted))
        text = f"{type(root).__name__}: {root}"
    error = ResidentError(f"resident run {run_id} failed: {text}")
    error.__cause__ = root
    return error


def _cells(layout: Layout, worker: str) -> str:
    return ", ".join(str(c) for c in sorted({layout.process_cell(c) for c in layout.cells_of(worker)}))


# -- results -------------------------------------------------------------------
def _assemble(layout: Layout, model: MLP, results: list[dict], eval_steps, start: int) -> ResidentResult:
    dtype = model.dtype
    n_steps = len(results[0]["losses"])
    rows = []
    for t in range(n_steps):
        compute = max(r["stats"][t][0] for r in results)
        wall = max(r["stats"][t][1] for r in results)
        rows.append(
            {
                "loss": float(results[0]["losses"][t]),
                "compute_time": float(compute),
                "comm_time": float(max(wall - compute, 0.0)),
                "bytes_moved": int(sum(r["stats"][t][2] for r in results)),
                "messages": int(sum(r["stats"][t][3] for r in results)),
            }
        )
    diverged = results[0]["diverged"]
    final = _gather_state(layout, model, [r["state"] for r in results], dtype, velocity=True)
    trained, velocity = final
    snapshots = {}
    for done in eval_steps:
        if done <= start + n_steps:
            snapshots[done] = _gather_state(layout, model, [r["snapshots"][done] for r in results], dtype)[0]
    return ResidentResult(trained, velocity, rows, diverged, snapshots)


def _gather_state(layout: Layout, model: MLP, states, dtype, *, velocity: bool = False):
    n = layout.n_layers
    parts = {name: [dict() for _ in range(n)] for name in ("W", "b", "vW", "vb")}
    for state in states:
        for name in parts if velocity else ("W", "b"):
            for (layer, where), block in state[name].items():
                parts[name][layer][where] = block
    weights = [layout.assemble_weight(k, parts["W"][k], dtype) for k in range(n)]
    biases = [layout.assemble_bias(k, parts["b"][k], dtype) for k in range(n)]
    net = MLP.from_arrays(
        weights, biases, activation=model.activation, output=model.output, negative_slope=model.negative_slope
    )
    if not velocity:
        return net, None
    v = []
    for k in range(n):
        v.append(layout.assemble_weight(k, parts["vW"][k], dtype))
        v.append(layout.assemble_bias(k, parts["vb"][k], dtype))
    return net, v
