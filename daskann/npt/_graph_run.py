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
Training gives up with :class:`~daskann.exceptions.LostWorkersError` after
``max_recoveries`` replays from the same state; a replay that reaches a new
checkpoint renews the budget (see :mod:`daskann.npt._run`).
"""

from __future__ import annotations

import re
import time
from collections import defaultdict
from dataclasses import dataclass, field, replace

import numpy as np

from daskann import config
from daskann.cluster import wait_watching, workers_left
from daskann.exceptions import DivergenceCause, WorkerLost
from daskann.npt._run import Replays, RunRecord, RunSpec, RunStart, graph_worker_times
from daskann.npt.graph_mode import GraphEngine
from daskann.npt.grid import ProcessGrid


@dataclass
class GraphResult:
    """What a graph-mode run gives back (as :class:`daskann.npt.resident.ResidentResult`)."""

    model: object  # None when the final state stays on the grid (see ``state``)
    velocity: list | None
    rows: dict  # completed steps -> history row
    diverged_step: int | None = None
    diverged_what: str = ""
    grid: ProcessGrid | None = None
    recoveries: int = 0
    timings: dict = field(default_factory=dict)  # completed step -> {worker: parts of its step time}
    state: object = None  # the final GridState (after divergence, the last finite one), alive on the grid


def run_graph(client, run: RunSpec, start: RunStart, record: RunRecord) -> None:
    """Graph mode from ``start`` on ``record.grid``: its history rows, grid and final state go into ``record``."""
    result = train_graph(client, record.grid, run, start=start)
    for done in sorted(result.rows):
        record.history.append(done, **result.rows[done])
    record.grid, record.recoveries, record.state = result.grid, result.recoveries, result.state
    record.worker_times.update(result.timings)
    if result.diverged_step is not None:
        record.diverged = (result.diverged_step, result.diverged_what)


def train_graph(client, grid: ProcessGrid, run: RunSpec, *, start: RunStart) -> GraphResult:
    """Train steps ``start.step .. run.stop - 1`` from the state ``start``; see the module docstring."""
    max_recoveries = config.count("npt.graph-replays") if run.max_recoveries is None else run.max_recoveries
    held = [v.copy() for v in start.velocity] if start.velocity is not None else None
    rows: dict = {}
    t0 = time.perf_counter() - run.time_offset
    task_stream_start = time.time()
    client.get_task_stream(start=task_stream_start)  # makes the scheduler record from now on
    replays = Replays(client, grid, what="graph-mode training", budget=max_recoveries, timeout=run.timeout)

    def attempt(grid: ProcessGrid, begin: RunStart, number: int) -> GraphResult:
        for done in [d for d in rows if d > begin.step]:
            del rows[done]  # recorded by a try that did not finish: replayed from where this try begins
        return _Attempt(client, grid, run, begin, rows, prefix=f"{run.run_id}-a{number}", t0=t0).train()

    result = replays.run(replace(start, velocity=held), attempt)
    result.grid, result.recoveries = replays.grid, replays.tries
    _add_timings(client, result, run.run_id, task_stream_start, replays.grid)
    return result


class _Attempt:
    """One try at the remaining steps on one grid, under its own key prefix.

    Raises :class:`WorkerLost` carrying the latest :class:`RunStart` (the last
    checkpoint reached) when a grid worker leaves.
    """

    def __init__(self, client, grid: ProcessGrid, run: RunSpec, start: RunStart, rows: dict, *, prefix: str, t0: float):
        self.run, self.rows, self.prefix, self.t0 = run, rows, prefix, t0
        self.start = start  # the state this attempt starts from: a diverged run may replay from it
        self.restart_from = start  # the latest state a replay restarts from: the start, then each checkpoint
        self.grid = grid
        self.engine = GraphEngine(
            client, grid, sizes=run.sizes, settings=run.settings, prefix=prefix, chains=run.chains
        )
        self.watch = _Watchdog(client, grid, run.timeout)
        self.states: dict = {}  # steps done -> GridState
        self.pending: list = []  # (step, loss futures) submitted and not yet read

    def train(self) -> GraphResult:
        self._scatter()
        try:
            return self._steps()
        except WorkerLost as exc:
            raise WorkerLost(exc.args[0], self.restart_from) from exc
        finally:
            self.states.clear()
            self.pending.clear()

    def _scatter(self) -> None:
        """The data and the starting state onto the grid; a grid worker gone meanwhile means a replay."""
        run, engine, start = self.run, self.engine, self.start
        try:
            self.bands = engine.scatter_data(run.X, run.y)
            self.val_bands = (
                engine.scatter_data(run.validation[0], run.validation[1], name="val")
                if run.validation is not None
                else None
            )
            self.states[0 if start.from_seed else start.step] = engine.start_state(start)
        except OSError as exc:
            raise WorkerLost(f"scattering to the grid failed ({exc})", None) from exc
        except KeyError as exc:
            # the scheduler removed a grid worker between our look at the cluster and the scatter
            if exc.args and exc.args[0] in self.grid.workers:
                raise WorkerLost(f"grid worker {exc.args[0]} left while data was scattered to it", None) from exc
            raise

    def _steps(self) -> GraphResult:
        """Submit ahead, read each step's loss, record, checkpoint; the final state stays on the grid."""
        run = self.run
        next_step = done = self.start.step
        while done < run.stop:
            next_step = self._submit_ahead(next_step, done)
            step, loss_futures = self.pending.pop(0)
            loss = self.engine.loss_value(self._gather(loss_futures), run.order.batch_size)
            if not np.isfinite(loss):
                return self._diverged(step)
            done = step + 1
            self._record(done, loss)
            self._checkpoint(done)
            for old in [k for k in self.states if k <= done and k < next_step]:
                del self.states[old]  # saved or evaluated, and read by a submitted step
        final = self.states[run.stop]
        self.watch.wait(list(final.futures.values()), self.restart_from)  # done, nothing gathered
        return GraphResult(None, None, self.rows, state=final)

    def _submit_ahead(self, next_step: int, done: int) -> int:
        """Submit steps up to ``lookahead`` ahead of the last one read; the next step to submit.

        The client lets go of each state once the step that reads it is submitted (unless it is still
        to be saved or evaluated): each version of a cell's blocks, and the copies other cells fetched
        for their products, is freed as soon as the tasks that read it are done, however late the
        client reads the losses.
        """
        run = self.run
        keep = run.checkpoint_steps | run.eval_steps
        while next_step < run.stop and next_step - done <= run.lookahead:
            new, loss_futures = self.engine.submit_step(
                self.states[next_step], self.bands, run.order.indices(next_step)
            )
            if next_step not in keep:
                del self.states[next_step]
            self.states[next_step + 1] = new
            self.pending.append((next_step, loss_futures))
            next_step += 1
        return next_step

    def _record(self, done: int, loss: float) -> None:
        """The history row after ``done`` steps (validated at evaluation steps)."""
        engine = self.engine
        row = {
            "loss": loss,
            "time": time.perf_counter() - self.t0,
            "bytes_moved": float(engine.ledgers[done - 1]),
            "_attempt": self.prefix,
        }
        if done in self.run.eval_steps and self.val_bands is not None:
            parts = self._gather(engine.submit_eval(self.states[done], self.val_bands, "val"))
            row.update(engine.eval_values(parts, self.val_bands.n_samples))
        self.rows[done] = row
        if self.run.progress is not None:
            self.run.progress(done, loss)

    def _checkpoint(self, done: int) -> None:
        """Save the state after ``done`` steps if asked; it becomes the state replays restart from."""
        run = self.run
        if done not in run.checkpoint_steps or run.on_checkpoint is None:
            return
        # each cell writes its blocks; the client commits the store once every digest is back, waiting as for a
        # step: a grid worker lost here means a replay, not an error
        state = self.states[done]
        path = run.on_checkpoint(done, self.engine.store_layout(), lambda tmp: state.save(tmp, gather=self._gather))
        self.restart_from = RunStart(done, path=path)

    def _gather(self, futures):
        return self.watch.gather(futures, self.restart_from)

    def _diverged(self, step: int) -> GraphResult:
        """Non-finite loss at ``step``: find the last finite state, as SerialTrainer keeps it."""
        rows = self.rows
        state = self._state(step)
        params_ok, velocity_ok = state.all_finite()
        # the last finite state stays on the grid, as a finished run's does: nothing is gathered here
        if params_ok or step - 1 < self.start.step:
            # serial stops at step + 1 on the loss, keeping the weights it started that step with
            what = DivergenceCause.of(loss=False).what
            return GraphResult(None, None, rows, diverged_step=step + 1, diverged_what=what, state=state)
        # the update of the previous step already produced non-finite weights; its velocity (momentum times
        # the last one plus the gradient) stands in for the gradients, which graph mode does not keep
        rows.pop(step, None)
        what = DivergenceCause.of(gradients=velocity_ok, weights=False).what
        return GraphResult(None, None, rows, diverged_step=step, diverged_what=what, state=self._state(step - 1))

    def _state(self, step: int):
        """The state after ``step`` steps: held, or trained again from the latest saved state before it.

        The client keeps no state a submitted step has read (see :meth:`_submit_ahead`); steps are pure,
        so the replay gives the same numbers. Only a diverged run pays for it.
        """
        if step in self.states:
            return self.states[step]
        start = self.restart_from if self.restart_from.step <= step else self.start
        quiet = replace(
            self.run, stop=step, eval_steps=frozenset(), checkpoint_steps=frozenset(), on_checkpoint=None, progress=None
        )
        replay = _Attempt(self.engine.client, self.grid, quiet, start, {}, prefix=f"{self.prefix}-replay", t0=self.t0)
        return replay.train().state


class _Watchdog:
    """Bounded waits that notice a lost grid worker instead of hanging on a pinned task."""

    def __init__(self, client, grid: ProcessGrid, timeout: float):
        self.client = client
        self.workers = set(grid.workers)
        self.timeout = timeout

    def missing(self) -> list[str]:
        return workers_left(self.client, sorted(self.workers))

    def raise_if_lost(self, restart_from, cause: BaseException | None = None) -> None:
        """Raise :class:`WorkerLost` (replay from ``restart_from``) if a grid worker left the cluster."""
        lost = self.missing()
        if lost:
            why = f" ({type(cause).__name__})" if cause is not None else ""
            raise WorkerLost(f"worker(s) {', '.join(lost)} left the cluster{why}", restart_from) from cause

    def gather(self, futures, restart_from):
        """The values of ``futures`` once :meth:`wait` saw them finish."""
        self.wait(futures, restart_from)
        try:
            return self.client.gather(futures)
        except Exception as exc:
            self.raise_if_lost(restart_from, exc)
            raise

    def wait(self, futures, restart_from) -> None:
        """Wait, bounded, for ``futures``; :class:`WorkerLost` if a grid worker left meanwhile."""
        deadline = time.monotonic() + self.timeout

        def look():
            if all(f.done() for f in futures):
                return True
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"graph-mode training: no step finished within timeout={self.timeout:g} s; the cluster may be "
                    "overloaded or a worker is stuck (raise timeout for very large blocks)"
                )
            return None

        wait_watching(futures, look, watch=lambda: self.raise_if_lost(restart_from))
        if any(f.status != "finished" for f in futures):
            self.raise_if_lost(restart_from)
            # a lost worker held scattered inputs: the tasks that need them are cancelled
            failed = next((f for f in futures if f.status == "cancelled"), None)
            failed = failed or next((f for f in futures if f.status == "error"), None)
            if failed is not None:
                failed.result()  # raises the task's error (a cancelled one: CancelledError)


_STEP_KEY = re.compile(r"^(?P<prefix>.+-a\d+)-s(?P<step>\d+)-")


def _attempt_number(prefix) -> int:
    return -1 if prefix is None else int(prefix.rsplit("-a", 1)[1])


def _add_timings(client, result: GraphResult, run_id: str, since: float, grid: ProcessGrid) -> None:
    """Per-step compute and transfer seconds from the scheduler's task stream (per worker of the grid),
    and the parts of each worker's step time (``result.timings``, see :mod:`daskann.npt._run`)."""
    try:
        records = client.get_task_stream(start=since)
    except Exception:  # diagnostics only: a missing record leaves NaN in the history
        records = []
    compute: dict = defaultdict(float)
    comm: dict = defaultdict(float)
    # per worker: every interval of the attempt that finished, and when each of its steps ended there
    spans: dict = defaultdict(lambda: defaultdict(list))
    step_ends: dict = defaultdict(dict)
    final = max((row.get("_attempt") for row in result.rows.values()), default=None, key=_attempt_number)
    for rec in records:
        key = rec.get("key")
        if not isinstance(key, str) or not key.startswith(run_id):
            continue
        m = _STEP_KEY.match(key)
        if m is None:
            continue
        ident = (m.group("prefix"), int(m.group("step")))
        worker, latest = rec.get("worker"), m.group("prefix") == final
        for ss in rec.get("startstops", ()):
            span = ss["stop"] - ss["start"]
            if ss["action"] == "compute":
                compute[ident] += span
            elif ss["action"] == "transfer":
                comm[ident] += span
            if latest and worker is not None:
                spans[worker][ss["action"]].append((ss["start"], ss["stop"]))
                if ss["action"] == "compute":
                    step_ends[worker][ident[1]] = max(ss["stop"], step_ends[worker].get(ident[1], ss["stop"]))
    result.timings = graph_worker_times(spans, step_ends)
    n_workers = max(len(set(grid.workers)), 1)
    for done, row in result.rows.items():
        ident = (row.pop("_attempt", None), done - 1)
        row["compute_time"] = compute[ident] / n_workers if ident in compute else float("nan")
        row["comm_time"] = comm.get(ident, 0.0) / n_workers if ident in compute else float("nan")
