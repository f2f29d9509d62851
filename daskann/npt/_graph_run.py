"""The graph-mode training loop: pipelined steps, a watchdog, replay after a lost worker.

Steps are submitted ``lookahead`` ahead of the one whose loss the client
waits for. Every wait is bounded: the loop polls, checks that the grid's
workers are still there, and gives up with :class:`TimeoutError` when no step
finished for ``timeout`` seconds.

Block tasks are pinned to their cells without fallback, so a task whose
worker died would wait forever; instead the watchdog notices the missing
worker, lays the same grid onto the workers there are now (sharing workers
if the cluster shrank) and replays the steps since the last state it holds
(the start, or the last checkpoint). Tasks are pure and every attempt has
its own key prefix, so the replayed steps give exactly the same numbers.
Training gives up after ``max_recoveries`` replays from the same state; a
replay that reaches a new checkpoint renews the budget, so a long run with
checkpoints survives any number of spaced-out worker losses.
"""

from __future__ import annotations

import re
import time
from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np
from distributed import wait

from daskann.cluster import current_client
from daskann.npt.graph_mode import GraphEngine
from daskann.npt.grid import ProcessGrid, live_workers

#: seconds between the watchdog's checks while a step runs
POLL_SECONDS = 0.5


class WorkerLost(RuntimeError):
    """A worker of the grid left the cluster during training."""


@dataclass
class GraphResult:
    """What a graph-mode run gives back (as :class:`daskann.npt.resident.ResidentResult`)."""

    model: object
    velocity: list
    rows: dict  # completed steps -> history row
    diverged_step: int | None = None
    diverged_what: str = ""
    grid: ProcessGrid | None = None
    recoveries: int = 0
    timings: dict = field(default_factory=dict)


def train_graph(
    client,
    grid: ProcessGrid,
    *,
    model,
    velocity,
    X,
    y,
    validation,
    order,
    settings: dict,
    start: int,
    stop: int,
    run_id: str,
    chains: int,
    timeout: float,
    eval_steps=frozenset(),
    checkpoint_steps=frozenset(),
    on_checkpoint=None,
    progress=None,
    time_offset: float = 0.0,
    lookahead: int = 1,
    max_recoveries: int = 2,
) -> GraphResult:
    """Train steps ``start .. stop - 1`` in graph mode; see the module docstring."""
    anchor = (start, model, [v.copy() for v in velocity])
    rows: dict = {}
    t0 = time.perf_counter() - time_offset
    task_stream_start = time.time()
    client.get_task_stream(start=task_stream_start)  # makes the scheduler record from now on
    attempt = 0  # replays so far (each has its own key prefix)
    since_anchor = 0  # replays since the state they restart from was saved
    while True:
        prefix = f"{run_id}-a{attempt}"
        try:
            result = _attempt(
                client, grid, prefix=prefix, anchor=anchor, rows=rows, X=X, y=y, validation=validation,
                order=order, settings=settings, stop=stop, chains=chains, timeout=timeout, eval_steps=eval_steps,
                checkpoint_steps=checkpoint_steps, on_checkpoint=on_checkpoint, progress=progress, t0=t0,
                lookahead=lookahead,
            )
            result.grid, result.recoveries = grid, attempt
            _add_timings(client, result, run_id, task_stream_start, grid)
            return result
        except WorkerLost as exc:
            attempt += 1
            new_anchor = exc.args[1] if len(exc.args) > 1 and exc.args[1] is not None else anchor
            # the budget is per checkpoint: a replay that reached a new checkpoint made progress
            since_anchor = 1 if new_anchor[0] > anchor[0] else since_anchor + 1
            anchor = new_anchor
            if since_anchor > max_recoveries:
                raise RuntimeError(
                    f"graph-mode training lost workers {since_anchor} times since step {anchor[0]} ({exc.args[0]}); "
                    f"giving up after {max_recoveries} replays"
                ) from exc
            for done in [d for d in rows if d > anchor[0]]:
                del rows[done]
            grid = _regrid(client, grid, timeout)


def _regrid(client, grid: ProcessGrid, timeout: float) -> ProcessGrid:
    """The same grid shape on the workers there are now (the nanny usually restarts a lost one)."""
    wanted = len(set(grid.workers))
    try:
        client.wait_for_workers(wanted, timeout=min(30.0, timeout))
    except (TimeoutError, OSError):
        pass
    workers = live_workers(client)
    if not workers:
        raise RuntimeError("graph-mode training lost every worker of the cluster")
    return ProcessGrid.from_workers(grid.shape, workers, share_workers=True)


def _attempt(client, grid, *, prefix, anchor, rows, X, y, validation, order, settings, stop, chains, timeout,
             eval_steps, checkpoint_steps, on_checkpoint, progress, t0, lookahead) -> GraphResult:
    start, model, velocity = anchor
    engine = GraphEngine(client, grid, sizes=model.sizes, settings=settings, prefix=prefix, chains=chains)
    watch = _Watchdog(client, grid, timeout)
    try:
        bands = engine.scatter_data(X, y)
        val_bands = engine.scatter_data(validation[0], validation[1], name="val") if validation is not None else None
        states = {start: engine.scatter_state(model, velocity, start)}
    except OSError as exc:
        raise WorkerLost(f"scattering to the grid failed ({exc})", None) from exc
    except KeyError as exc:
        # the scheduler removed a grid worker between our look at the cluster and the scatter
        if exc.args and exc.args[0] in grid.workers:
            raise WorkerLost(f"grid worker {exc.args[0]} left while data was scattered to it", None) from exc
        raise
    pending = []
    next_step, done = start, start
    batch = order.batch_size
    try:
        while done < stop:
            while next_step < stop and next_step - done <= lookahead:
                new, loss_futures = engine.submit_step(states[next_step], bands, order.indices(next_step))
                states[next_step + 1] = new
                pending.append((next_step, loss_futures))
                next_step += 1
            step, loss_futures = pending.pop(0)
            parts = watch.gather(loss_futures, anchor)
            loss = engine.loss_value(parts, batch)
            if not np.isfinite(loss):
                return _diverged(engine, states, rows, step, model, start)
            done = step + 1
            row = {"loss": loss, "time": time.perf_counter() - t0, "bytes_moved": float(engine.ledgers[step]),
                   "_attempt": prefix}
            if done in eval_steps and val_bands is not None:
                parts = watch.gather(engine.submit_eval(states[done], val_bands, "val"), anchor)
                row.update(engine.eval_values(parts, val_bands.n_samples))
            rows[done] = row
            if progress is not None:
                progress(done, loss)
            if done in checkpoint_steps and on_checkpoint is not None:
                # bounded and watched like a step: a grid worker lost here means a replay, not an error
                ckpt_model, ckpt_velocity = engine.gather_state(
                    states[done], model, gather=lambda futures, anchor=anchor: watch.gather(futures, anchor))
                on_checkpoint(done, ckpt_model, ckpt_velocity)
                anchor = (done, ckpt_model, ckpt_velocity)
            for old in [k for k in states if k < done - 1]:
                del states[old]
        final_model, final_velocity = engine.gather_state(
            states[stop], model, gather=lambda futures: watch.gather(futures, anchor))
        return GraphResult(final_model, final_velocity, rows)
    except WorkerLost as exc:
        raise WorkerLost(exc.args[0], anchor) from exc
    finally:
        states.clear()
        pending.clear()


def _diverged(engine: GraphEngine, states: dict, rows: dict, step: int, like, start: int) -> GraphResult:
    """Non-finite loss at ``step``: find the last finite state, as SerialTrainer keeps it."""
    params_ok, velocity_ok = engine.check_finite(states[step])
    if params_ok or step - 1 not in states:
        # serial stops at step + 1 on the loss, keeping the weights it started that step with
        model, velocity = engine.gather_state(states[step], like)
        return GraphResult(model, velocity, rows, diverged_step=step + 1, diverged_what="the loss or its gradients")
    # the update of the previous step already produced non-finite weights
    rows.pop(step, None)
    model, velocity = engine.gather_state(states[step - 1], like)
    what = "the weights" if velocity_ok else "the loss or its gradients"
    return GraphResult(model, velocity, rows, diverged_step=step, diverged_what=what)


class _Watchdog:
    """Bounded waits that notice a lost grid worker instead of hanging on a pinned task."""

    def __init__(self, client, grid: ProcessGrid, timeout: float):
        self.client = client
        self.workers = set(grid.workers)
        self.timeout = timeout

    def missing(self) -> list[str]:
        alive = set(live_workers(self.client))
        return sorted(self.workers - alive)

    def raise_if_lost(self, anchor, cause: BaseException | None = None) -> None:
        """Raise :class:`WorkerLost` (replay from ``anchor``) if a grid worker left the cluster."""
        lost = self.missing()
        if lost:
            why = f" ({type(cause).__name__})" if cause is not None else ""
            raise WorkerLost(f"worker(s) {', '.join(lost)} left the cluster{why}", anchor) from cause

    def gather(self, futures, anchor):
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                with current_client(self.client):
                    wait(futures, timeout=POLL_SECONDS)
                break
            except TimeoutError:
                pass
            except Exception as exc:
                # a lost worker held scattered inputs: the tasks that need them are cancelled
                self.raise_if_lost(anchor, exc)
                raise
            self.raise_if_lost(anchor)
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"graph-mode training: no step finished within timeout={self.timeout:g} s; the cluster may be "
                    "overloaded or a worker is stuck (raise timeout for very large blocks)"
                )
        if any(f.status != "finished" for f in futures):
            self.raise_if_lost(anchor)
        try:
            return self.client.gather(futures)
        except Exception as exc:
            self.raise_if_lost(anchor, exc)
            raise


_STEP_KEY = re.compile(r"^(?P<prefix>.+-a\d+)-s(?P<step>\d+)-")


def _add_timings(client, result: GraphResult, run_id: str, since: float, grid: ProcessGrid) -> None:
    """Per-step compute and transfer seconds from the scheduler's task stream (per worker of the grid)."""
    try:
        records = client.get_task_stream(start=since)
    except Exception:  # diagnostics only: a missing record leaves NaN in the history
        records = []
    compute: dict = defaultdict(float)
    comm: dict = defaultdict(float)
    for rec in records:
        key = rec.get("key")
        if not isinstance(key, str) or not key.startswith(run_id):
            continue
        m = _STEP_KEY.match(key)
        if m is None:
            continue
        ident = (m.group("prefix"), int(m.group("step")))
        for ss in rec.get("startstops", ()):
            span = ss["stop"] - ss["start"]
            if ss["action"] == "compute":
                compute[ident] += span
            elif ss["action"] == "transfer":
                comm[ident] += span
    n_workers = max(len(set(grid.workers)), 1)
    for done, row in result.rows.items():
        ident = (row.pop("_attempt", None), done - 1)
        row["compute_time"] = compute[ident] / n_workers if ident in compute else float("nan")
        row["comm_time"] = comm.get(ident, 0.0) / n_workers if ident in compute else float("nan")
