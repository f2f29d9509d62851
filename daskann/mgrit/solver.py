"""The MGRIT solver: full approximation scheme (FAS) multigrid reduction in time.

Solves ``u_0 = given, u_i = Phi_{i-1}(u_{i-1}) (i = 1..N)`` for all ``i`` at
once, in parallel over the steps, by V- or F-cycles over a hierarchy of
coarser time grids (XBraid; pymgrit ``Mgrit``). ``Phi`` may be nonlinear: the
coarse levels solve FAS problems ``A_{l+1}(u) = A_{l+1}(v) + R r``.

Option names follow pymgrit (``cf_iter``, ``cycle_type``, ``weight_c``,
``tol``, ``max_iter``, ``nested_iteration``, ``t_norm``) and XBraid where
pymgrit has none:

=====================  ================================  ==============================
daskann                XBraid                            pymgrit 1.0.6
=====================  ================================  ==============================
``levels``             ``braid_SetMaxLevels``            number of problem levels
``cfactor``            ``braid_SetCFactor`` (per level)  ``coarsening`` (setup helper)
``cf_iter``            ``braid_SetNRelax`` (per level)   ``cf_iter``
``cycle_type``         ``braid_SetFMG`` for ``"F"``      ``cycle_type``
``weight_c``           ``braid_SetCRelaxWt`` (per level) ``weight_c``
``tol``                ``braid_SetAbsTol``               ``tol``
``rtol``               ``braid_SetRelTol``               --
``t_norm``             ``braid_SetTemporalNorm``         ``t_norm``
``max_iter``           ``braid_SetMaxIter``              ``max_iter``
``nested_iteration``   (``braid_SetSkip`` is related)    ``nested_iteration``
``min_coarse``         ``braid_SetMinCoarse``            --
``store_fine``         ``braid_SetStorage(0)``           full storage (always)
``callback``           ``access`` routine                ``output_fcn``
=====================  ================================  ==============================
"""

from __future__ import annotations

import functools
import math
import os
import shutil
import socket
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import get_args
from urllib.parse import urlparse

import numpy as np
from distributed import Client

from daskann._batch import is_batch_cluster
from daskann._dask_input import is_dask_array, remote_call
from daskann._json import clean_json
from daskann._validation import (
    CycleType,
    check_choice,
    check_float,
    check_int,
    invalid,
    named_error,
    option_name,
)
from daskann.cluster import resolve_client, worker_addresses
from daskann.exceptions import MGRITDiverged, PropagatorError
from daskann.mgrit import _store, workmodel
from daskann.mgrit._kernels import Context, StepFailed
from daskann.mgrit._levels import Hierarchy, check_hierarchy, per_level
from daskann.mgrit._plan import block_sizes
from daskann.mgrit._run import IterationRecord, SolveRun, series
from daskann.mgrit.problem import FunctionPropagator, Propagator, StateLayout


@dataclass
class IterationInfo:
    """What the callback sees after each iteration.

    Attributes
    ----------
    iteration : int
        1-based.
    residual : float
        Residual norm over the fine C-points.
    seconds : float
        Wall time of the iteration.
    converged : bool
    state : tuple of ndarray
        Current approximation of the final state ``u_N``.
    """

    iteration: int
    residual: float
    seconds: float
    converged: bool
    state: tuple
    _cpoints: Callable | None = field(default=None, repr=False)

    def cpoints(self) -> np.ndarray:
        """Current values at the fine level's C-points ``m, 2m, ...`` as rows of flat state vectors
        (XBraid's access routine sees every point; C-points are what the store keeps)."""
        if self._cpoints is None:
            return np.empty((0, 0))
        return self._cpoints()


@dataclass
class MGRITResult:
    """Plain record of a solve (pymgrit's ``solve()`` dictionary, with more in it).

    Attributes
    ----------
    converged : bool
    status : {"converged", "max_iter", "stopped"}
    iterations : int
    residuals : list of float
        Residual norm after each iteration.
    iteration_times : list of float
        Wall seconds per iteration.
    setup_time, solve_time : float
        Seconds for set-up (checks, store, scatter) and for the iterations.
    state : tuple of ndarray
        Final state ``u_N``.
    critical_path : list of float
        Work-model critical path of each iteration (fine-step units), for
        the work model's graph: one task per interval per sweep, whatever
        ``intervals_per_task`` the run used.
    work : list of float
        Work-model total work of each iteration.
    critical_path_run : list of float
        Critical path of the task graph as run (blocks of intervals per task).
    n_tasks : list of int
    n_steps : int
    levels : list of dict
        Points and span of each level.
    tol, rtol, max_iter : numbers
    executor : str
        ``"inprocess"``, ``"threads"``, ``"sync"`` or ``"distributed"``.
    store : str or None
    run_id : str
    fine_points : ndarray or None
        Rows ``u_0 .. u_N`` as flat vectors when solved with ``store_fine=True``.
    rho : float
        Convergence factor ``(||r_k|| / ||r_0||)^(1/k)`` (Schroder 2017), ``r_0``
        the first residual computed, ``k`` the iterations after it; NaN with
        fewer than two iterations.
    cycle_type : str
        ``"V"`` or ``"F"``.
    potential_speedup : float
        The paper's potential speedup ``N / sigma`` (eqs. 16-17,
        :func:`daskann.mgrit.workmodel.paper_speedup`), beside daskann's own
        work model (:meth:`speedup`).
    ended : {"", "converged", "adapted", "serial-fallback", "serial-predicted"}
        How an :class:`~daskann.mgrit.MGRITTrainer` fit ended: converged as
        configured, converged after adapting the solver, finished by serial
        propagation from the last trusted point, or trained serially because
        MGRIT was predicted not to pay (``""`` for a plain solve).
    forecast : dict or None
        The trainer's prediction of MGRIT's time against serial training's
        (:class:`daskann.mgrit._payoff.Forecast`), before the solve and, where
        the solve ran, from its first iterations (``"pilot"``).
    adaptations : list of Adaptation
        The trainer's attempts, one record each (:mod:`daskann.mgrit._adapt`):
        the change, outcome, iterations, work units and seconds of each.
    """

    converged: bool
    status: str
    iterations: int
    residuals: list
    iteration_times: list
    setup_time: float
    solve_time: float
    state: tuple
    critical_path: list
    work: list
    critical_path_run: list
    n_tasks: list
    n_steps: int
    levels: list
    tol: float
    rtol: float | None
    max_iter: int
    executor: str
    store: str | None
    run_id: str
    graphs: list = field(default_factory=list, repr=False)
    fine_points: np.ndarray | None = field(default=None, repr=False)
    layout: StateLayout | None = field(default=None, repr=False)
    rho: float = math.nan
    cycle_type: str = "V"
    potential_speedup: float = math.nan
    ended: str = ""
    adaptations: list = field(default_factory=list)
    forecast: dict | None = None

    def trajectory(self) -> list[tuple]:
        """Every fine point ``u_0 .. u_N`` as states (needs ``store_fine=True``)."""
        if self.fine_points is None:
            raise named_error(
                ValueError, "store_fine", "False is not valid for trajectory(): solve with store_fine=True"
            )
        return [tuple(np.array(a) for a in self.layout.unpack(row)) for row in self.fine_points]

    def speedup(self, workers: int | None = None) -> float:
        """Work-model speedup over ``N`` serial steps: unlimited workers, or ``workers``.

        Each iteration costs its critical path (or its list-schedule makespan
        on ``workers``) plus one unit for the residual reduction.
        """
        if workers is None:
            times = self.critical_path
        else:
            workers = check_int("workers", workers)
            # iterations done before a resume kept no graph: their critical path stands in
            earlier = self.critical_path[: len(self.critical_path) - len(self.graphs)]
            times = list(earlier) + [workmodel.makespan(g, workers) for g in self.graphs]
        return workmodel.speedup(self.n_steps, times)

    def convergence_factors(self) -> list[float]:
        """Ratios of successive residuals."""
        r = self.residuals
        return [r[i] / r[i - 1] if r[i - 1] > 0 else float("nan") for i in range(1, len(r))]

    def to_dict(self) -> dict:
        """JSON-safe summary (no state arrays)."""
        return {
            "converged": self.converged,
            "status": self.status,
            "iterations": self.iterations,
            "residuals": list(self.residuals),
            "iteration_times": list(self.iteration_times),
            "setup_time": self.setup_time,
            "solve_time": self.solve_time,
            "critical_path": list(self.critical_path),
            "work": list(self.work),
            "n_tasks": list(self.n_tasks),
            "critical_path_run": list(self.critical_path_run),
            "n_steps": self.n_steps,
            "levels": self.levels,
            "tol": self.tol,
            "rtol": self.rtol,
            "max_iter": self.max_iter,
            "executor": self.executor,
            "store": self.store,
            "run_id": self.run_id,
            "speedup_unlimited": self.speedup() if self.critical_path else None,
            "rho": None if math.isnan(self.rho) else self.rho,
            "cycle_type": self.cycle_type,
            "potential_speedup": None if math.isnan(self.potential_speedup) else self.potential_speedup,
            "ended": self.ended,
            "adaptations": [a.to_dict() for a in self.adaptations],
            "forecast": self.forecast,
        }


class MGRIT:
    """FAS multigrid reduction in time over ``n_steps`` steps of a propagator.

    Parameters
    ----------
    propagator : Propagator or callable
        The time stepper of every level (a callable ``phi(state, i)`` is
        wrapped in :class:`FunctionPropagator`, whose coarse levels repeat it).
    u0 : tuple of ndarray
        Initial state (one floating dtype).
    n_steps : int
        Fine steps ``N``.
    levels : int
        Number of levels (1 is a serial forward solve).
    cfactor : int or sequence of int
        Coarsening factor, at least 2, for all levels or per level.
    cf_iter : int or sequence of int
        CF sweeps after the first F-relaxation: 0 is F-relaxation, 1 is FCF,
        2 is FCFCF (per level if a sequence).
    cycle_type : {"V", "F"}
    weight_c : float or sequence of float
        C-relaxation weight in (0, 2) per level; 1 is plain C-relaxation.
    weight_c_growth : float
        Multiplies the weight on every coarser level: level ``l`` uses
        ``weight_c[l] * weight_c_growth ** l`` (one reading of the paper's
        relaxation factor ``alpha^(l) = 1.25^l``).
    tol : float
        Absolute tolerance on the residual norm (> 0).
    rtol : float, optional
        Relative tolerance against the first iteration's residual.
    t_norm : {1, 2, inf}
        Temporal norm over the C-points of the per-point 2-norms.
    max_iter : int
        At least 1.
    nested_iteration : bool
        Start from the coarse levels' own solutions (pymgrit's default)
        instead of ``initial_guess``.
    initial_guess : {"start", "zero"}
        Every point starts at ``u0`` (``"start"``) or at zero.
    store_fine : bool
        Keep every fine point in the store (``trajectory()``); otherwise only
        C-points (XBraid's default storage).
    min_coarse : int
        Fewest steps the coarsest level may have.
    divergence_factor : float or None
        The run is declared unstable when the residual exceeds this multiple
        of the smallest residual so far; None disables the check. Non-finite
        states are always an error.
    callback : callable, optional
        ``callback(IterationInfo)`` after each iteration. A callback that
        raises :class:`StopIteration` ends the solve after that iteration
        (as :func:`scipy.optimize.minimize`'s does), with status
        ``"stopped"`` unless the iteration converged.
    scheduler : None, "inprocess", "sync", "threads", "distributed" or distributed.Client
        Where the tasks run: in this process on numpy arrays (None), on dask's
        local schedulers, or on a cluster (tasks read and write a zarr store);
        ``"distributed"`` is the default client, or an embedded LocalCluster
        closed afterwards.
    store : path, optional
        Zarr trajectory store for the dask schedulers (a temporary folder,
        removed afterwards, when omitted). An existing store of the same
        ``run_id`` and configuration is continued; one of another run is refused.
    run_id : str, optional
        Names the run in its store; give it to continue an interrupted run.
    intervals_per_task : int or "auto"
        Intervals one task relaxes: 1 is one task per interval per sweep;
        ``"auto"`` lays the store out in about 32 chunks per sweep and, on a
        distributed cluster, gives each task as many whole chunks as make it
        last at least 20 times the scheduler's measured per-task cost (from a
        fine step's measured cost), keeping two tasks per worker in a sweep.
        Chunks of the store hold the intervals of one task (of one chunk
        with ``"auto"``).
    timeout : float
        Seconds one iteration may take on a cluster.
    initial_cpoints : ndarray, optional
        Rows of the fine C-points to start from (an earlier solve's
        :attr:`last_iterate_`, say) instead of ``initial_guess``.
    stall : callable, optional
        ``stall(residuals, tol) -> bool`` after each iteration (pymgrit's
        ``convergence_criterion`` turned around): true fails the solve with
        :class:`MGRITDiverged` (its ``stalled`` attribute set).
    scratch_dir : path, optional
        Folder, seen by every worker, for the temporary store when ``store``
        is None (created if missing; the store is removed afterwards). None:
        a temporary folder of this machine.
    name_of : callable, optional
        ``name_of(option)`` names an option in errors (a trainer's gives
        ``solver['cfactor']``); by default the option's own name.

    Attributes
    ----------
    last_iterate_ : tuple or None
        After a solve that ended without converging (stopped, ``max_iter``, or
        :class:`MGRITDiverged`): the fine C-point rows of its last completed
        iteration and their residual norms; None otherwise.
    point_before_end_ : tuple or None
        After a converged solve: the fine step of the last C-point before the
        final step (0 for ``u0``) and its flat state.

    Examples
    --------
    >>> import numpy as np
    >>> result = MGRIT(lambda u, i: (0.9 * u[0],), (np.ones(2),), 64, levels=3, cfactor=4).solve()
    >>> result.converged
    True
    """

    def __init__(
        self,
        propagator,
        u0,
        n_steps: int,
        *,
        levels: int = 3,
        cfactor=2,
        cf_iter=1,
        cycle_type: str = "V",
        weight_c=1.0,
        weight_c_growth: float = 1.0,
        tol: float = 1e-9,
        rtol: float | None = None,
        t_norm=2,
        max_iter: int = 100,
        nested_iteration: bool = False,
        initial_guess: str = "start",
        store_fine: bool = False,
        min_coarse: int = 2,
        divergence_factor: float | None = 1e4,
        callback: Callable | None = None,
        scheduler=None,
        store=None,
        run_id: str | None = None,
        intervals_per_task="auto",
        timeout: float = 600.0,
        initial_cpoints=None,
        stall: Callable | None = None,
        scratch_dir=None,
        name_of: Callable | None = None,
    ):
        self.propagator = propagator
        self.u0 = u0
        self.n_steps = n_steps
        self.levels = levels
        self.cfactor = cfactor
        self.cf_iter = cf_iter
        self.cycle_type = cycle_type
        self.weight_c = weight_c
        self.weight_c_growth = weight_c_growth
        self.tol = tol
        self.rtol = rtol
        self.t_norm = t_norm
        self.max_iter = max_iter
        self.nested_iteration = nested_iteration
        self.initial_guess = initial_guess
        self.store_fine = store_fine
        self.min_coarse = min_coarse
        self.divergence_factor = divergence_factor
        self.callback = callback
        self.scheduler = scheduler
        self.store = store
        self.run_id = run_id
        self.intervals_per_task = intervals_per_task
        self.timeout = timeout
        self.initial_cpoints = initial_cpoints
        self.stall = stall
        self.scratch_dir = scratch_dir
        if name_of is not None:
            self._name_of = name_of
        self.last_iterate_ = None
        self.point_before_end_ = None

    @classmethod
    def from_config(cls, propagator, u0, n_steps: int, config, **options):
        """A solver with the solver options of ``config`` (a :class:`daskann.mgrit.presets.SolverConfig`) and
        ``options``, the rest of the keywords (``callback``, ``scheduler``, ...)."""
        return cls(propagator, u0, n_steps, **config.solver_kwargs(), **options)

    # -- checks ------------------------------------------------------------------
    #: how errors name an option (``cfactor``); a trainer's solver names it as its user set it (``name_of``)
    _name_of = staticmethod(option_name)

    def check(self) -> dict:
        """Every option checked, in one dict: what :meth:`solve` runs with (nothing runs here).

        Raises
        ------
        ValueError, TypeError
            An option, named with its value and what would be valid.
        """
        name = self._name_of
        prop = self.propagator
        if not isinstance(prop, Propagator):
            if not callable(prop):
                raise invalid("propagator", type(prop).__name__, "a Propagator or a callable phi(state, i)", TypeError)
            prop = FunctionPropagator(prop)
        layout = StateLayout.from_state(self.u0)
        min_coarse = check_int("min_coarse", self.min_coarse)
        hierarchy = check_hierarchy(self.n_steps, self.levels, self.cfactor, min_coarse=min_coarse, name_of=name)
        opt = {"propagator": prop, "layout": layout, "hierarchy": hierarchy, **self._check_relaxation(hierarchy)}
        opt["cycle_type"] = check_choice(name("cycle_type"), self.cycle_type, get_args(CycleType))
        opt.update(self._check_stopping())
        opt.update(self._check_execution())
        opt.update(
            nested_iteration=bool(self.nested_iteration),
            store_fine=bool(self.store_fine),
            blocks=block_sizes(hierarchy, opt["intervals_per_task"]),
        )
        return opt

    def _check_relaxation(self, hierarchy: Hierarchy) -> dict:
        name, n = self._name_of, hierarchy.n_levels - 1
        cf_iter = per_level(name("cf_iter"), self.cf_iter, n, lambda k, v: check_int(k, v, minimum=0))
        weight = per_level(
            name("weight_c"),
            self.weight_c,
            n,
            lambda k, v: check_float(k, v, minimum=0.0, maximum=2.0, min_inclusive=False, max_inclusive=False),
        )
        growth = check_float(name("weight_c_growth"), self.weight_c_growth, minimum=0.0, min_inclusive=False)
        weights = tuple(w * growth**lvl for lvl, w in enumerate(weight))
        for lvl, w in enumerate(weights):
            if not 0.0 < w < 2.0:
                raise invalid(
                    name("weight_c_growth"),
                    self.weight_c_growth,
                    f"a growth that keeps every level's C-relaxation weight in (0, 2) (level {lvl} would get {w:.4g})",
                )
        return {"cf_iter": cf_iter, "weight_c": weights}

    def _check_stopping(self) -> dict:
        name = self._name_of
        tol = check_float(name("tol"), self.tol, minimum=0.0, min_inclusive=False)
        rtol = (
            None
            if self.rtol is None
            else check_float(
                name("rtol"), self.rtol, minimum=0.0, maximum=1.0, min_inclusive=False, max_inclusive=False
            )
        )
        if self.t_norm not in (1, 2, math.inf, "inf"):
            raise invalid("t_norm", self.t_norm, "1, 2 or numpy.inf")
        t_norm = math.inf if self.t_norm == "inf" else self.t_norm
        max_iter = check_int(name("max_iter"), self.max_iter)
        initial_guess = check_choice("initial_guess", self.initial_guess, ("start", "zero"))
        divergence = (
            None
            if self.divergence_factor is None
            else check_float(name("divergence_factor"), self.divergence_factor, minimum=1.0, min_inclusive=False)
        )
        return {
            "tol": tol,
            "rtol": rtol,
            "t_norm": t_norm,
            "max_iter": max_iter,
            "initial_guess": initial_guess,
            "divergence_factor": divergence,
        }

    def _check_execution(self) -> dict:
        name = self._name_of
        for option in ("callback", "stall"):
            if getattr(self, option) is not None and not callable(getattr(self, option)):
                raise invalid(option, getattr(self, option), "a callable or None", TypeError)
        block = self.intervals_per_task
        if block != "auto":
            block = check_int(name("intervals_per_task"), block)
        timeout = check_float(name("timeout"), self.timeout, minimum=0.0, min_inclusive=False)
        scheduler = None if self.scheduler == "inprocess" else self.scheduler
        if (
            scheduler is not None
            and not isinstance(scheduler, Client)
            and scheduler not in ("sync", "threads", "distributed")
        ):
            raise invalid(
                name("scheduler"),
                scheduler,
                "None, 'inprocess', 'sync', 'threads', 'distributed' or a distributed.Client",
                TypeError,
            )
        if self.store is not None and not isinstance(self.store, (str, Path)):
            raise invalid(name("store"), self.store, "a folder path or None", TypeError)
        if self.store is not None and scheduler is None:
            raise invalid(
                name("store"),
                str(self.store),
                "None with the in-process scheduler (the zarr store is shared "
                "by dask tasks: pass scheduler='threads', 'sync' or a Client)",
            )
        if self.run_id is not None and (
            not isinstance(self.run_id, str)
            or not self.run_id
            or not self.run_id.replace("-", "").replace("_", "").isalnum()
        ):
            raise invalid("run_id", self.run_id, "a non-empty string of letters, digits, '-' and '_'")
        if self.scratch_dir is not None and not isinstance(self.scratch_dir, (str, Path)):
            raise invalid("scratch_dir", self.scratch_dir, "a folder path or None", TypeError)
        return {
            "intervals_per_task": block,
            "timeout": timeout,
            "scheduler": scheduler,
            "initial_cpoints": self.initial_cpoints,
            "stall": self.stall,
        }

    @staticmethod
    def _self_test(prop, layout, hierarchy: Hierarchy, u0_vec) -> None:
        """Call every level's propagator once on ``u0`` (XBraid's wrapper tests)."""
        if is_dask_array(getattr(prop, "X", None)):  # on a worker, where the propagator's data is read
            remote_call(_self_test_read, prop.without_data(), layout, hierarchy, u0_vec, prop.X, prop.y)
            return
        ctx = Context(prop, layout, hierarchy, u0_vec)
        for level in range(hierarchy.n_levels):
            try:
                with np.errstate(all="ignore"):
                    ctx.phi(u0_vec, level, 0)
            except StepFailed as exc:
                raise MGRITDiverged(
                    exc.what + " in the propagator check", level=exc.level, step=exc.step, iteration=0
                ) from None

    def _config(self, opt: dict) -> dict:
        h = opt["hierarchy"]
        prop = opt["propagator"]
        config = {
            "n_steps": h.n_steps,
            "cfactors": list(h.cfactors),
            "layout": opt["layout"].to_json(),
            "cf_iter": list(opt["cf_iter"]),
            "weight_c": list(opt["weight_c"]),
            "cycle_type": opt["cycle_type"],
            "nested_iteration": opt["nested_iteration"],
            "initial_guess": opt["initial_guess"],
            "store_fine": opt["store_fine"],
            "blocks": list(opt["blocks"]),
        }
        if hasattr(prop, "get_config"):
            config["propagator"] = prop.get_config()
        return clean_json(config, finite=False)

    # -- solve -------------------------------------------------------------------
    def solve(self) -> MGRITResult:
        """Run MGRIT iterations until the residual meets the tolerance or ``max_iter``.

        Returns
        -------
        MGRITResult

        Raises
        ------
        MGRITDiverged
            A non-finite state or a growing residual (level and step named).
        PropagatorError
            The propagator returned another structure, shape or dtype.
        """
        opt = self.check()
        self.last_iterate_ = self.point_before_end_ = None
        if opt["scheduler"] == "distributed":
            with resolve_client(None) as client:
                opt["scheduler"] = client
                return self._solve(opt)
        return self._solve(opt)

    def _solve(self, opt: dict) -> MGRITResult:
        t_setup = time.perf_counter()
        run = self._start(opt)
        setup_time = time.perf_counter() - t_setup
        t_solve = time.perf_counter()
        try:
            if run.status != "converged":
                run.open_executor()
                run.status = self._iterate(run)
            fine = run.fine_points()
            self._finished(run)
        finally:
            run.close()
        return self._result(run, opt, setup_time=setup_time, solve_time=time.perf_counter() - t_solve, fine_points=fine)

    def _iterate(self, run: SolveRun) -> str:
        """Iterate until converged or ``max_iter`` (pymgrit's ``solve`` loop); the final status.

        A solve that ends otherwise keeps its last completed iteration in :attr:`last_iterate_`.
        """
        try:
            status = self._iterations(run)
        except MGRITDiverged:
            self._keep_last_iterate(run)
            raise
        if status != "converged":
            self._keep_last_iterate(run)
        return status

    def _iterations(self, run: SolveRun) -> str:
        for k in range(run.iteration + 1, run.opt["max_iter"] + 1):
            record, norms = run.iterate(k)
            run.check_stable(k, norms)
            converged = run.converged()
            run.commit(k, "converged" if converged else "running", norms)
            try:
                self._report(run, k, record, converged)
            except StopIteration:
                if not converged:
                    run.finish("stopped")
                    return "stopped"
            if converged:
                return "converged"
        run.finish("max_iter")
        return "max_iter"

    def _start(self, opt: dict) -> SolveRun:
        """Check the propagator, open (or continue) the store and make the run's planners."""
        prop, layout, hierarchy = opt["propagator"], opt["layout"], opt["hierarchy"]
        u0_vec = layout.pack(self.u0)
        self._self_test(prop, layout, hierarchy, u0_vec)
        config = self._config(opt)
        run_id = self.run_id or uuid.uuid4().hex
        prefix = f"daskann-mgrit-{uuid.uuid4().hex[:12]}"
        specs = _store.array_specs(hierarchy, layout.size, opt["blocks"], store_fine=opt["store_fine"])
        if opt["scheduler"] is None:
            store, temporary = _store.MemoryTrajectory(specs, layout.dtype), None
            progress = {"iteration": 0, "status": "new"}
        else:
            store_path, temporary = self._store_path(opt["scheduler"])
            try:
                store, progress = self._open_store(store_path, run_id, config, specs, layout.dtype)
            except BaseException:
                if temporary is not None:
                    shutil.rmtree(temporary, ignore_errors=True)
                raise
        context = Context(prop, layout, hierarchy, u0_vec)
        return SolveRun(opt, context, store, progress, prefix, run_id=run_id, temporary=temporary)

    def _keep_last_iterate(self, run: SolveRun) -> None:
        slot = run.progress.get("committed")
        if run.progress.get("iteration", 0) > 0 and slot is not None and run.norms:
            self.last_iterate_ = (np.array(run.cpoints(slot)), list(run.norms))

    def _finished(self, run: SolveRun) -> None:
        """Read what the run's store holds for the caller, before the store is closed."""
        if run.status == "converged":
            self.point_before_end_ = run.point_before(run.hierarchy.n_steps)

    def _store_path(self, scheduler) -> tuple[Path, Path | None]:
        """The store's path, and the temporary folder holding it when none was given."""
        if self.store is not None:
            return Path(self.store), None
        if self.scratch_dir is not None:
            # the folder was chosen because every worker sees it: no check that the workers are on this machine
            folder = Path(self.scratch_dir)
            folder.mkdir(parents=True, exist_ok=True)
            temporary = Path(tempfile.mkdtemp(prefix="daskann-mgrit-", dir=folder))
            return temporary / "trajectory.zarr", temporary
        if isinstance(scheduler, Client) and not _workers_are_local(scheduler):
            raise invalid(
                "store",
                None,
                "a folder on a file system the workers share (the cluster has "
                "workers on other machines, which cannot see a temporary folder here)",
            )
        temporary = Path(tempfile.mkdtemp(prefix="daskann-mgrit-", dir=_scratch_dir()))
        return temporary / "trajectory.zarr", temporary

    def _open_store(self, path: Path, run_id: str, config: dict, specs: dict, dtype):
        """A new store, or the store of this run to continue (checked first): the store and its progress."""
        meta = _store.read_meta(path)
        if meta is None:
            store = _store.create_store(path, run_id=run_id, config=config, specs=specs, dtype=dtype)
            return store, {"iteration": 0, "status": "new"}
        if self.run_id is None:
            raise invalid(
                "store", str(path), f"a new folder, or run_id={meta.get('run_id')!r} to continue the run it holds"
            )
        _store.check_same_run(path, meta, run_id, config)
        _store.verify_store(path)  # a damaged store is refused, not continued
        store = _store.ZarrTrajectory(path, run_id)
        return store, store.read_progress()

    def _report(self, run: SolveRun, k: int, record: IterationRecord, converged: bool) -> None:
        """Hand iteration ``k`` to the callback (pymgrit's ``output_fcn``)."""
        if self.callback is None:
            return
        state = run.context.layout.unpack(run.state_vec.copy())
        cpoints = functools.partial(run.cpoints, run.planner.committed)
        self.callback(IterationInfo(k, record.residual, record.seconds, converged, state, cpoints))

    @staticmethod
    def _result(run: SolveRun, opt: dict, **timings) -> MGRITResult:
        layout, hierarchy, scheduler = opt["layout"], opt["hierarchy"], opt["scheduler"]
        lists = series(run.records)
        executor = "inprocess" if scheduler is None else (run.executor.name if run.executor else str(scheduler))
        n_iter = len(run.records)
        return MGRITResult(
            rho=workmodel.convergence_factor(lists["residuals"]),
            cycle_type=opt["cycle_type"],
            potential_speedup=_paper_speedup(opt, n_iter),
            converged=run.status == "converged",
            status=run.status,
            iterations=n_iter,
            state=tuple(np.array(a) for a in layout.unpack(np.array(run.state_vec))),
            n_steps=hierarchy.n_steps,
            levels=hierarchy.describe(),
            tol=opt["tol"],
            rtol=opt["rtol"],
            max_iter=opt["max_iter"],
            executor=executor,
            store=None if run.temporary is not None else run.store.path,
            run_id=run.run_id,
            graphs=run.graphs,
            layout=layout,
            **lists,
            **timings,
        )


def _paper_speedup(opt: dict, n_iter: int) -> float:
    """The paper's potential speedup of a solve (eqs. 16-17) with its coarsest level's size and step cost."""
    h = opt["hierarchy"]
    last = h.n_levels - 1
    try:
        cost = float(opt["propagator"].cost(last, h.span(last))) if last > 0 else 1.0
    except Exception:  # a user's propagator without a usable cost: one application of Phi
        cost = 1.0
    return workmodel.paper_speedup(
        h.n_steps, n_iter, h.n_levels, opt["cycle_type"], coarsest=h.n_points(last), coarse_cost=cost
    )


def _workers_are_local(client: Client) -> bool:
    """Whether every worker is, and will stay, on this machine: a temporary folder here is then theirs too.

    A batch system's cluster never counts: its replacement jobs may start on any node.
    """
    if is_batch_cluster(getattr(client, "cluster", None)):
        return False
    local = {"127.0.0.1", "localhost", "::1", socket.gethostname()}
    try:
        local.add(socket.gethostbyname(socket.gethostname()))
    except OSError:
        pass
    workers = worker_addresses(client)
    # inproc:// workers are threads of this very process (LocalCluster(processes=False))
    return all(urlparse(addr).scheme == "inproc" or (urlparse(addr).hostname or "") in local for addr in workers)


def _scratch_dir() -> str | None:
    """A memory-backed folder for temporary stores when there is one (workers on this machine share it)."""
    shm = Path("/dev/shm")
    try:
        if shm.is_dir() and os.access(shm, os.W_OK) and shutil.disk_usage(shm).free > 1 << 30:
            return str(shm)
    except OSError:
        pass
    return None


def solve(propagator, u0, n_steps: int, **options) -> MGRITResult:
    """Shorthand for ``MGRIT(propagator, u0, n_steps, **options).solve()``."""
    return MGRIT(propagator, u0, n_steps, **options).solve()


def _self_test_read(prop, layout, hierarchy: Hierarchy, u0_vec, X, y) -> None:
    MGRIT._self_test(prop.with_data(X, y), layout, hierarchy, u0_vec)


__all__ = ["MGRIT", "IterationInfo", "MGRITResult", "PropagatorError", "solve"]
