"""One MGRIT solve in progress: its store, its planners and one record per completed iteration.

:class:`SolveRun` does what one iteration needs (plan and run the tasks,
measure the residual, check it, commit it to the store); the loop that calls
it is :meth:`daskann.mgrit.MGRIT.solve`, in the shape of pymgrit's ``solve``.
"""

from __future__ import annotations

import math
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from daskann.exceptions import MGRITDiverged
from daskann.mgrit import _store, workmodel
from daskann.mgrit._executors import DaskExecutor, InProcessExecutor
from daskann.mgrit._kernels import Context, first_failure
from daskann.mgrit._plan import Planner, task_sizes


@dataclass(frozen=True)
class IterationRecord:
    """The figures of one completed iteration (one entry of each list of :class:`MGRITResult`).

    Attributes
    ----------
    residual : float
        Residual norm over the fine C-points.
    seconds : float
        Wall time of the iteration.
    critical_path : float
        Work-model critical path (one task per interval per sweep).
    work : float
        Work-model total work.
    n_tasks : int
        Tasks the iteration ran.
    critical_path_run : float
        Critical path of the task graph as run.
    """

    residual: float
    seconds: float
    critical_path: float
    work: float
    n_tasks: int
    critical_path_run: float


#: list name in the progress file and MGRITResult -> IterationRecord field, in the progress file's order
SERIES = {
    "residuals": "residual",
    "iteration_times": "seconds",
    "critical_path": "critical_path",
    "work": "work",
    "n_tasks": "n_tasks",
    "critical_path_run": "critical_path_run",
}


def series(records: Sequence[IterationRecord]) -> dict[str, list]:
    """The records as the progress file's lists."""
    return {key: [getattr(r, name) for r in records] for key, name in SERIES.items()}


def records(columns) -> list[IterationRecord]:
    """Records from their lists by :data:`SERIES` name (a progress record, or ``vars()`` of an MGRITResult)."""
    rows = zip(*(columns[key] for key in SERIES), strict=True)
    return [IterationRecord(**dict(zip(SERIES.values(), row, strict=True))) for row in rows]


class _LightTask:
    """What the work model keeps of a task."""

    __slots__ = ("key", "cost", "deps")

    def __init__(self, key, cost, deps):
        self.key, self.cost, self.deps = key, cost, deps


class SolveRun:
    """The state of one solve between iterations.

    Parameters
    ----------
    opt : dict
        The checked options (:meth:`MGRIT.check`).
    context : Context
        Propagator, layout, hierarchy and ``u0``.
    store : MemoryTrajectory or ZarrTrajectory
    progress : dict
        The store's progress record (``{"iteration": 0, ...}`` for a new run).
    prefix : str
        Task key prefix of the run.
    run_id : str
        The run's name in its store.
    temporary : Path, optional
        A temporary folder holding the store, removed when the run closes.
    """

    def __init__(
        self,
        opt: dict,
        context: Context,
        store,
        progress: dict,
        prefix: str,
        *,
        run_id: str,
        temporary: Path | None = None,
    ):
        self.opt, self.context, self.store = opt, context, store
        self.run_id, self.temporary = run_id, temporary
        self.hierarchy = context.hierarchy
        self.progress = progress  # the last committed record, as written to the store
        self.status = progress.get("status", "new")
        self.iteration = progress.get("iteration", 0)
        # the committed iterations (a resumed run's history)
        self.records = records({key: progress.get(key, [])[: self.iteration] for key in SERIES})
        self.first_own = len(self.records)  # records before this index are a resumed run's
        self.norms: list[float] = []  # the last committed iteration's residual at each fine C-point
        self.graphs: list = []  # work-model graphs of the iterations run by this call
        self.executor = None
        self.replans = 0  # iterations started again because C-values kept on a worker were lost
        if self.iteration == 0:
            self._write_initial_guess()
        self.planner = self._planner(opt["blocks"], prefix)
        # the work model's graph: the same cycles with one task per interval (planning only, nothing runs)
        self.model = self._planner((1,) * (self.hierarchy.n_levels - 1), prefix + "-model")
        if self.iteration > 0:
            self.planner.restart_from(progress["committed"])
            self.model.restart_from(progress["committed"])
        self.state_vec = store.read("last", slice(None))

    @property
    def zarr(self) -> bool:
        return isinstance(self.store, _store.ZarrTrajectory)

    # -- set-up ----------------------------------------------------------------------
    def _write_initial_guess(self) -> None:
        u0_vec, h = self.context.u0, self.hierarchy
        self.store.write("init", slice(None), u0_vec)
        self.store.write("last", slice(None), u0_vec)
        if h.n_levels > 1 and not self.opt["nested_iteration"]:
            guess = u0_vec if self.opt["initial_guess"] == "start" else np.zeros_like(u0_vec)
            # an adapted attempt continues from the C-points of the last iteration that was kept
            cpoints = self.opt.get("initial_cpoints")
            rows = np.broadcast_to(guess, (h.n_cpoints(0), u0_vec.size)) if cpoints is None else cpoints
            self.store.write("c0", (0, slice(None)), rows)

    def _planner(self, blocks: tuple, prefix: str, run: str | None = None) -> Planner:
        h, opt = self.hierarchy, self.opt
        cost = {lvl: float(self.context.propagator.cost(lvl, h.span(lvl))) for lvl in range(h.n_levels)}
        options = {
            "cf_iter": opt["cf_iter"],
            "weight_c": opt["weight_c"],
            "cycle_type": opt["cycle_type"],
            "store_fine": opt["store_fine"],
            "blocks": blocks,
        }
        return Planner(h, options, cost.__getitem__, prefix, run=run)

    def open_executor(self) -> None:
        if self.opt["scheduler"] is None:
            self.executor = InProcessExecutor(self.store, self.context)
            self.planner.sequential = True  # one task after another, in place: less memory to touch
            return
        self.executor = DaskExecutor(self.opt["scheduler"], self.store, self.context, timeout=self.opt["timeout"])
        # tasks pass rows in memory: the values that start the next iteration stay on their workers too
        self.planner.keep_fused = True
        if self.executor.name == "distributed" and self.opt["intervals_per_task"] == "auto":
            # tasks of whole store chunks, sized from what a step and a task cost on this cluster
            try:
                costs = self.executor.measure(self.planner.prefix)
            except Exception:  # a worker lost while measuring: one chunk per task, as the store is laid out
                return
            cost = self.planner.cost
            self.planner.task_blocks = task_sizes(self.hierarchy, self.planner.blocks, cost, **costs)

    # -- one iteration -----------------------------------------------------------------
    def iterate(self, k: int) -> tuple[IterationRecord, list[float]]:
        """Run iteration ``k``: its record and the residual norm at each fine C-point."""
        nested = self.opt["nested_iteration"] and k == 1
        tasks = self.planner.iteration(k, nested=nested)
        light: list = []

        def plan_model():  # the work model's graph (one task per interval): nothing runs, nothing waits for it
            light.extend(_LightTask(t.key, t.cost, t.deps) for t in self.model.iteration(k, nested=nested))

        # on a cluster it is planned while the tasks run; in this process, after them and outside their time
        beside = plan_model if self.executor.name == "distributed" else None
        t0 = time.perf_counter()
        results = self.executor.run(tasks, while_running=beside)
        failure = first_failure(results.values())
        if failure is not None and failure.get("stale"):
            # a worker that kept C-values for this iteration left: start it again from the committed C-points
            tasks = self._replan().iteration(k, nested=nested)
            results = self.executor.run(tasks)
            failure = first_failure(results.values())
        seconds = time.perf_counter() - t0
        if beside is None:
            plan_model()
        if failure is not None:
            self.fail(failure, k)
        finals = [results[t.key] for t in tasks if t.final]
        norms = [r for f in finals for r in f["residuals"]]
        residual = _temporal_norm(norms, self.opt["t_norm"]) if self.hierarchy.n_levels > 1 else 0.0
        self.state_vec = next(f["last"] for f in finals if f["last"] is not None)
        self.graphs.append(light)
        record = IterationRecord(
            residual,
            seconds,
            workmodel.critical_path(light),
            workmodel.total_work(light),
            len(tasks),
            workmodel.critical_path(tasks),
        )
        self.records.append(record)
        return record, norms

    def _replan(self) -> Planner:
        """A planner that continues from the committed C-points in the store, as a resumed run does."""
        self.replans += 1
        planner = self._planner(self.planner.blocks, f"{self.planner.run}-again{self.replans}", run=self.planner.run)
        planner.task_blocks, planner.keep_fused = self.planner.task_blocks, self.planner.keep_fused
        planner.sequential = self.planner.sequential
        planner.restart_from(self.progress["committed"])
        self.planner = planner
        return planner

    def check_stable(self, k: int, norms: list[float]) -> None:
        """Raise :class:`MGRITDiverged` for a non-finite residual or one grown past ``divergence_factor``."""
        residuals = self.residuals
        r, factor = residuals[-1], self.opt["divergence_factor"]
        grown = factor is not None and len(residuals) > 1 and r > factor * min(residuals[:-1])
        if math.isfinite(r) and not grown:
            stall = self.opt.get("stall")
            if stall is not None and stall(residuals[self.first_own :], self.opt["tol"]):
                self.fail({"what": f"the residual stalled at {r:.3e}", "level": 0, "step": 0, "stalled": True}, k)
            return
        worst = int(np.argmax(norms)) if norms else 0
        step = (worst + 1) * self.hierarchy.cfactors[0]
        what = (
            f"the residual grew to {r:.3e} (smallest so far {min(residuals[:-1], default=r):.3e})"
            if math.isfinite(r)
            else "the residual became NaN or Inf"
        )
        self.fail({"what": what, "level": 0, "step": step}, k)

    def converged(self) -> bool:
        residuals, opt = self.residuals, self.opt
        return residuals[-1] <= opt["tol"] or (opt["rtol"] is not None and residuals[-1] <= opt["rtol"] * residuals[0])

    def commit(self, k: int, status: str, norms: list[float]) -> None:
        """Make iteration ``k`` (its residual at each fine C-point ``norms``) the one a resumed run continues from."""
        self.iteration, self.norms = k, norms
        self.progress = {"iteration": k, "status": status, "committed": self.planner.committed, **series(self.records)}
        self.store.write("last", slice(None), self.state_vec)
        self._write_progress(self.progress)

    def finish(self, status: str) -> None:
        """Record the final status of a run that stopped without converging."""
        self.progress = {**self.progress, "status": status}
        self._write_progress(self.progress)

    def fail(self, failure: dict, k: int) -> None:
        """Record the failure of iteration ``k`` beside the last committed state, and raise it."""
        record = {
            **self.progress,
            "status": "diverged",
            "failure": {"iteration": k, "level": failure["level"], "step": failure["step"], "what": failure["what"]},
        }
        self._write_progress(record)
        error = MGRITDiverged(
            failure["what"], level=failure["level"], step=failure["step"], iteration=k, residuals=self.residuals
        )
        # what the failed solve cost, for the caller that adapts and tries again
        error.records, error.stalled = list(self.records), bool(failure.get("stalled", False))
        raise error

    def _write_progress(self, progress: dict) -> None:
        if self.zarr:
            self.store.write_progress(progress)

    # -- after the iterations --------------------------------------------------------------
    @property
    def residuals(self) -> list[float]:
        return [r.residual for r in self.records]

    def cpoints(self, slot: int) -> np.ndarray:
        """The fine C-points held in ``slot`` (the slot committed when asked; see IterationInfo)."""
        if self.hierarchy.n_levels == 1:
            return self.store.read("u0", slice(None))
        return self.store.read("c0", (slot, slice(None)))

    def point_before(self, step: int) -> tuple[int, np.ndarray]:
        """The last committed fine C-point (or point 0) before fine step ``step``: its step and flat state."""
        h = self.hierarchy
        m = h.cfactors[0] if h.n_levels > 1 else 1
        j = (step - 1) // m
        if j == 0:
            return 0, np.array(self.context.u0)
        rows = slice(j - 1, j)
        row = (
            self.store.read("u0", rows)
            if h.n_levels == 1
            else self.store.read("c0", (self.progress["committed"], rows))
        )
        return j * m, np.array(row[0])

    def fine_points(self) -> np.ndarray | None:
        if not self.opt["store_fine"]:
            return None
        return np.vstack([self.context.u0[None, :], self.store.read("u0", slice(None))])

    def close(self) -> None:
        if self.executor is not None:
            self.executor.release(self.planner.run)
            self.executor.close()
        if self.zarr:
            self.store.forget()
        if self.temporary is not None:
            shutil.rmtree(self.temporary, ignore_errors=True)


def _temporal_norm(norms: Sequence[float], t_norm) -> float:
    if not norms:
        return 0.0
    a = np.asarray(norms, dtype=np.float64)
    if t_norm == 1:
        return float(a.sum())
    if t_norm == 2:
        return float(np.sqrt(np.sum(a * a)))
    return float(a.max())
