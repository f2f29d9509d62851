"""MGRITTrainer: train an MLP by solving for every training step at once with MGRIT."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import inspect
import json
import math
import os
import shutil
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import get_args

import dask
import numpy as np

from daskann import store as store_module
from daskann._base import BaseTrainer, TrainingData
from daskann._dask_input import is_dask_array, remote_call
from daskann._history import HistoryRecorder
from daskann._options import OptionGroup, group_names, resolve_group
from daskann._progress import ProgressBar
from daskann._validation import Activation, Loss, MGRITScheduler, check_choice, check_int, invalid
from daskann.cluster import check_worker_memory, current_sync_client, shared_directory, worker_addresses
from daskann.data import BatchOrder
from daskann.exceptions import MGRITDidNotPay, MGRITDiverged, MGRITNotConverged
from daskann.mgrit import _adapt, _payoff, _run
from daskann.mgrit._levels import Hierarchy, check_hierarchy
from daskann.mgrit.presets import SolverConfig, resolve_preset
from daskann.mgrit.problem import StateLayout
from daskann.mgrit.propagators import SGDPropagator
from daskann.mgrit.solver import MGRIT, MGRITResult
from daskann.nn import MLP, SGD
from daskann.serial import SerialTrainer

#: fewest steps a coarsest level keeps (the solver's ``min_coarse``, XBraid's ``SetMinCoarse``)
MIN_COARSE = 2

SCHEDULERS = get_args(MGRITScheduler)


@dataclass
class _FitRun:
    """One fit's state, from the checked input to the solver's result."""

    settings: dict
    options: dict  # the solver's, preset and explicit values merged
    solver: dict  # every option of the ``solver`` group (preset options as given: None takes the preset's)
    engine: dict  # every option of the ``engine`` group
    data: TrainingData
    order: BatchOrder
    total: int  # steps the trained model will have taken
    model: MLP  # the state training starts from: model, SGD velocity, steps it already holds
    velocity: list
    done: int
    resume: object  # the checkpoint given to fit, None when the run's store continues it
    shared: Path | None = None  # the folder every node sees, where a cluster run without a store keeps its stores
    prop: SGDPropagator | None = None
    store: Path | None = None
    scratch: bool = False  # the store is the trainer's own, removed once the run converged
    scratch_dir: Path | None = None  # where the attempts without a store of their own make a temporary one
    reference: np.ndarray | None = None  # serial parameters the error is measured against
    history: HistoryRecorder = field(default_factory=lambda: HistoryRecorder("iteration"))
    bar: ProgressBar | None = None
    t0: float = 0.0
    u0: tuple | None = None  # the solve's initial state
    attempt: int = 0  # the adaptive fit's current attempt
    iter_offset: int = 0  # iterations of the attempts before it
    # without momentum the state carries no velocity: the final step's gradient, or a point to compute it from
    final_velocity: list | None = None
    before_last: tuple | None = None
    policy: str = "study"  # the setting daskann.mgrit.solve (strict fits: "study")
    forecast: _payoff.Forecast | None = None  # before the solve
    pilot: _payoff.Forecast | None = None  # from the solve's first iterations
    pilot_seconds: list = field(default_factory=list)  # the first attempt's iterations, for the pilot
    pilot_residuals: list = field(default_factory=list)
    stopped: str = ""  # why the pay check stopped the solve
    warned: bool = False  # MGRITDidNotPay said already

    @property
    def scheduler(self) -> str:
        return self.engine["scheduler"]

    @property
    def n_steps(self) -> int:
        """Steps the solve takes: the fit's, after those the start state holds."""
        return self.total - self.done

    @property
    def hierarchy(self) -> Hierarchy:
        """The time grids of the fit's own solver options."""
        return check_hierarchy(self.n_steps, self.options["levels"], self.options["cfactor"])

    @property
    def layout(self) -> StateLayout:
        """How the solve's state packs into a flat vector."""
        return StateLayout.from_state(self.u0)


@dataclass
class _Attempts:
    """What an adaptive fit's attempts gave so far: what its one result is made of."""

    started: float  # perf_counter() when the first attempt began
    hierarchy: Hierarchy | None = None  # the time grids of the last attempt
    template: MGRITResult | None = None  # the last result an attempt returned (the fields the attempts share)
    records: list = field(default_factory=list)  # every attempt's iterations
    adaptations: list = field(default_factory=list)  # one _adapt.Adaptation per attempt, and the serial finish
    kept: tuple | None = None  # the last iterate an attempt kept: its C-point rows and their residuals


class MGRITSolverOptions(OptionGroup):
    """The ``solver`` options of :class:`MGRITTrainer`: how MGRIT solves, apart from the problem.

    Given to the trainer as ``solver=MGRITSolverOptions(...)``, or as a dict of
    the same keywords (``solver={"levels": 4}``); either way
    ``trainer.set_params(solver__levels=4)`` sets one option. An option left
    at None takes the value of the trainer's ``preset``.

    Parameters
    ----------
    levels, cfactor, cf_iter, cycle_type, weight_c, weight_c_growth, tol, rtol, max_iter, nested_iteration
        Solver options (:class:`daskann.mgrit.MGRIT`).
    coarse, alpha_growth, alpha_cap, substeps, coarse_batches
        Coarse propagator (:class:`daskann.mgrit.propagators.SGDPropagator`).
        A callable ``coarse(state, start, stop, level)`` maps the state, the
        parameters in ``MLP.params`` order followed by their velocities (the
        parameters alone without momentum), to the state.
    divergence_factor : float or None
        Residual growth that counts as instability.
    require_convergence : bool
        False (default): the fit adapts. An attempt that diverges, stalls or
        runs out of iterations is followed by a safer one (a smaller coarse
        learning-rate cap, then two levels with two substeps; a user's coarse
        propagator: two levels) that starts from the last kept iterate, all
        within ``max_iter`` iterations in total; when none converges, the
        steps after the last point the iterate holds exactly are propagated
        serially. The weights are serial training's either way;
        ``result_.ended`` and ``result_.adaptations`` say how, and
        :class:`~daskann.exceptions.MGRITDidNotPay` is warned when MGRIT fell
        back or its work exceeded serial training's. True: the strict solver
        of one configuration, raising :class:`MGRITDiverged` or
        :class:`MGRITNotConverged` instead of adapting.
    compute_error : bool
        Also train serially (in this process) and record the error of the
        current final weights against it after every iteration.

    Examples
    --------
    >>> MGRITTrainer((8,), preset="solver3", solver=MGRITSolverOptions(levels=4, max_iter=20))
    MGRITTrainer(hidden_sizes=(8,), preset='solver3',
                 solver=MGRITSolverOptions(levels=4, max_iter=20))
    """

    group = "solver"

    def __init__(self, *, divergence_factor=1e4, require_convergence=False, compute_error=False, **preset_options):
        for name in preset_options:
            if name not in SolverConfig.names():
                raise TypeError(f"{type(self).__name__}.__init__() got an unexpected keyword argument {name!r}")
        options = dict.fromkeys(SolverConfig.names())  # None: the preset's value
        options.update(preset_options, divergence_factor=divergence_factor)
        self._store({**options, "require_convergence": require_convergence, "compute_error": compute_error})


def _with_preset_keywords(init) -> inspect.Signature:
    """``init``'s signature with every :class:`SolverConfig` option (default None: the preset's) before its own
    keywords: what scikit-learn's ``get_params``, ``clone`` and repr read."""
    own, *solve, _ = inspect.signature(init).parameters.values()
    preset = (inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=None) for name in SolverConfig.names())
    return inspect.Signature([own, *preset, *solve])


MGRITSolverOptions.__init__.__signature__ = _with_preset_keywords(MGRITSolverOptions.__init__)


class MGRITEngineOptions(OptionGroup):
    """The ``engine`` options of :class:`MGRITTrainer`: where and how the solver's tasks run.

    Given as ``engine=MGRITEngineOptions(...)`` or a dict of the same
    keywords (``engine={"scheduler": "inprocess"}``).

    Parameters
    ----------
    scheduler : {"distributed", "threads", "sync", "inprocess"}
        ``"distributed"`` (default) runs the tasks on the trainer's ``client``
        (or the default client, or an embedded LocalCluster); ``"threads"``
        and ``"sync"`` use dask's local schedulers; ``"inprocess"`` runs the
        same tasks on numpy arrays in this process.
    store : path, optional
        Zarr trajectory store (dask schedulers). By default, on a cluster
        with a folder every node sees (:func:`daskann.cluster.shared_directory`:
        a profile's ``shared_directory``, else the setting
        ``daskann.cluster.shared-directory``), a temporary folder in it;
        otherwise a store named after the run under
        ``<checkpoint folder>/checkpoints`` when a checkpoint folder is set
        (removed once the run converged), else a temporary folder of this
        machine. Fitting again with the same settings and data continues an
        interrupted run from its store; a store of another run is refused.
        An adapted attempt (``require_convergence=False``) is not resumable:
        it writes a temporary store of its own inside the run's store.
    intervals_per_task : int or "auto"
        Intervals one task relaxes (``"auto"``: about 32 tasks per sweep).
    timeout : float
        Seconds one iteration may take on a cluster.
    """

    group = "engine"

    def __init__(
        self,
        *,
        scheduler: MGRITScheduler = "distributed",
        store=None,
        intervals_per_task="auto",
        timeout=600.0,
    ):
        self._store(locals())


#: how the fit's errors name an option, as the user set it: solver['cfactor'], engine['timeout']
_option_name = group_names(MGRITSolverOptions, MGRITEngineOptions)


class MGRITTrainer(BaseTrainer):
    """Minibatch SGD with momentum, parallel over the training steps by MGRIT.

    Training is the evolution ``w_{i+1} = Phi_i(w_i)`` where ``Phi_i`` is one
    SGD step on minibatch ``i`` (state: weights, biases and velocity; without
    momentum weights and biases alone, the velocity, which is then the last
    gradient, taken once at the end); FAS multigrid in time solves all steps
    at once and converges to the weights
    :class:`SerialTrainer` produces with the same settings. Takes the settings
    of :class:`daskann._base.BaseTrainer` plus the solver's: a preset, the
    options that change it, and where the tasks run, as pymgrit keeps its
    solver apart from the problem.

    Parameters
    ----------
    preset : {"solver1", "solver2", "solver3", "solver4"}
        Solver configuration (see :mod:`daskann.mgrit.presets`); every
        preset option that ``solver`` leaves at None takes the preset's
        value. The default, ``"solver2"``, was chosen on the ordinary-SGD
        grid of ``daskann bench mgrit --grid`` (docs/mgrit.md): it converged
        in as many cells as any preset, with the fewest iterations and less
        work than ``"solver3"``.
    solver : dict or MGRITSolverOptions, optional
        Solver options that override the preset (``levels``, ``cfactor``,
        ``cf_iter``, ``cycle_type``, ``weight_c``, ``weight_c_growth``,
        ``tol``, ``rtol``, ``max_iter``, ``nested_iteration``), the coarse
        propagator (``coarse``, ``alpha_growth``, ``alpha_cap``,
        ``substeps``, ``coarse_batches``) and the solve
        (``divergence_factor``, ``require_convergence``, ``compute_error``);
        see :class:`MGRITSolverOptions`. None: the preset alone, an adaptive
        fit. ``set_params(solver__levels=4)`` sets one option.
    engine : dict or MGRITEngineOptions, optional
        Where the tasks run: ``scheduler`` (``"distributed"``, the default,
        on ``client``; ``"threads"``, ``"sync"``, ``"inprocess"``),
        ``store``, ``intervals_per_task``, ``timeout``; see
        :class:`MGRITEngineOptions`.
    client : distributed.Client, optional
        The cluster of ``scheduler="distributed"``.

    Attributes
    ----------
    model_ : MLP
    velocity_ : list of ndarray
    history_ : xarray.Dataset
        Over ``iteration``: ``residual``, ``time`` (cumulative wall time),
        ``error`` (relative error of the final weights against serial
        training, when asked), ``val_loss`` of the current final weights and
        ``attempt`` (0 for the configuration asked for); attributes
        ``mgrit_ended`` and ``mgrit_adaptations`` (JSON).
    result_ : MGRITResult
        The solver's record (residuals, timings, work model) over every
        attempt, with ``ended`` and ``adaptations``.
    n_iter_ : int
    n_steps_ : int
    batch_order_ : BatchOrder

    Examples
    --------
    >>> from daskann.data import make_linear
    >>> X, y = make_linear(128, 4, 1, seed=0)
    >>> t = MGRITTrainer(
    ...     (8,), lr=0.01, batch_size=16, solver={"levels": 2, "cfactor": 4}, engine={"scheduler": "inprocess"}
    ... )
    >>> t.fit(X, y, steps=32).n_iter_ <= 4
    True
    >>> t.set_params(solver__cfactor=2).solver
    {'levels': 2, 'cfactor': 2}
    """

    method = "mgrit"
    _reads_dask = True  # dask-array data is checked and read on the workers
    _option_groups = {**BaseTrainer._option_groups, "solver": MGRITSolverOptions, "engine": MGRITEngineOptions}

    def __init__(
        self,
        hidden_sizes=(64,),
        *,
        activation: Activation = "relu",
        loss: Loss = "mse",
        lr=0.01,
        batch_size=32,
        epochs=10,
        steps=None,
        seed=0,
        verbose=0,
        network=None,
        sgd=None,
        checkpoint=None,
        preset="solver2",
        solver=None,
        engine=None,
        client=None,
    ):
        self._store_params(locals())

    # -- configuration ---------------------------------------------------------------
    def _solver_options(self) -> dict:
        """The preset's solver and coarse-propagator options, overridden by every one ``solver`` sets (not None).

        Checks the preset's name and the names of ``solver``'s and ``engine``'s options (their values are
        checked where they are used, all before any task).
        """
        resolve_group(self.engine, MGRITEngineOptions)
        solver = resolve_group(self.solver, MGRITSolverOptions)
        return resolve_preset(self.preset, **{name: solver[name] for name in SolverConfig.names()})

    def _group_options(self) -> tuple[dict, dict]:
        """Every option of ``solver`` and of ``engine``; the rest of their values are checked where used."""
        solver = resolve_group(self.solver, MGRITSolverOptions)
        for name in ("require_convergence", "compute_error"):
            if not isinstance(solver[name], (bool, np.bool_)):
                raise invalid(_option_name(name), solver[name], "True or False", TypeError)
        engine = resolve_group(self.engine, MGRITEngineOptions)
        engine["scheduler"] = check_choice(_option_name("scheduler"), engine["scheduler"], SCHEDULERS)
        return solver, engine

    def fit(
        self,
        X,
        y,
        *,
        steps=None,
        epochs=None,
        validation_data=None,
        eval_every=None,
        init_model: MLP | None = None,
        resume=None,
        reference=None,
    ):
        """Train for ``steps`` (or ``epochs``) SGD steps, all at once.

        Parameters
        ----------
        X, y : array-like
        steps, epochs : int, optional
            Training length for this call, at most one of the two; by default
            the trainer's ``steps`` or ``epochs``.
        validation_data : (X_val, y_val), optional
        eval_every : int, optional
            Validation every this many steps of the result (and at the end);
            by default once per epoch.
        init_model : MLP, optional
            Start from these weights.
        resume : path, optional
            A checkpoint (or run folder) to start from; ``steps`` counts the
            steps it already holds.
        reference : SerialTrainer, MLP or "serial", optional
            Serial result to record the error against after each iteration
            (``"serial"`` trains one here; so does ``compute_error=True``).

        Returns
        -------
        self

        Raises
        ------
        TrainingDiverged
            Serial training itself becomes non-finite (the adaptive fit's serial finish).
        MGRITDiverged
            ``require_convergence=True`` only: the iteration was unstable (level
            and step named); no model is kept.
        MGRITNotConverged
            ``require_convergence=True`` only: ``max_iter`` reached without convergence.

        Warns
        -----
        MGRITDidNotPay
            The fit fell back to serial propagation, or its work exceeded serial training's.
        """
        self._forget_fit()
        run = self._prepare_fit(X, y, steps, epochs, validation_data, eval_every, init_model, resume)
        solver = self._plan_solver(run)
        solver.check()  # every solver option, before the reference run and before any task
        if not run.solver["require_convergence"]:
            run.forecast = self._forecast(run)  # recorded in result_ whatever the policy
        if run.policy == "predict" and not run.forecast.pays:
            warnings.warn(run.forecast.message(), MGRITDidNotPay, stacklevel=2)  # before any solver task
            run.warned = True
            self._run_solve(run, None, reference, X, y)
            return self
        result = self._run_solve(run, solver, reference, X, y)
        if not run.warned:
            self._warn_if_unpaid(result)
        return self

    def _run_solve(self, run: _FitRun, solver: MGRIT | None, reference, X, y) -> MGRITResult:
        """The reference run and the solve (strict or adaptive; None: serial training), which sets the fitted state."""
        # over the iteration budget: a converged run stops short of it
        run.bar = self._progress_bar(run.options["max_iter"], "mgrit", unit="iteration")
        with self._run_lock(), run.bar:  # the folder is this run's until its checkpoint is written
            run.reference = self._reference(reference, X, y, run.model, run.resume, run.total, run.solver)
            if solver is None:
                result = self._train_serially(run)
            elif run.solver["require_convergence"]:
                result = self._solve(run, solver)
            else:
                result = self._solve_adaptive(run, solver)
            self._finish_fit(run, result)
        return result

    def _forecast(self, run: _FitRun) -> _payoff.Forecast:
        """MGRIT's least time on the fit's workers against serial training's, before any task."""
        settings = run.settings
        step = _payoff.step_seconds(run.prop, run.model)
        return _payoff.forecast(
            run.options,
            run.n_steps,
            self._forecast_workers(run.scheduler),
            step,
            scheduler=run.scheduler,
            lr=settings["lr"],
            momentum=settings["momentum"],
        )

    def _forecast_workers(self, scheduler: str) -> int:
        """Workers the solve's tasks would run on: the client's (a batch cluster's jobs to come counted), else
        the embedded cluster's one per core; one in this process."""
        if scheduler in ("inprocess", "sync"):
            return 1
        cores = os.cpu_count() or 1
        if scheduler == "threads":
            return int(dask.config.get("num_workers", None) or cores)
        c = self.client if self.client is not None else current_sync_client()
        if c is None:
            return cores
        from daskann import _batch  # distributed's clients only

        connected = len(worker_addresses(c))
        if _batch.is_batch_cluster(getattr(c, "cluster", None)):
            return max(connected, len(_batch.expected(c)))  # the jobs it keeps, some perhaps still queued
        return max(connected, 1)

    def _train_serially(self, run: _FitRun) -> MGRITResult:
        """Serial training in MGRIT's stead, where it was predicted not to pay: the fit's steps from its start."""
        run.t0 = time.perf_counter()
        result = self._serial_finish(run, _Attempts(run.t0, run.hierarchy), "serial-predicted")
        # the history's one row, iteration 0: no MGRIT iteration ran; the final weights' error and validation
        run.history.append(0, **self._history_row(run, math.nan, 0, result.state))
        return result

    def _forget_fit(self) -> None:
        for name in (*self.RESULT_ATTRIBUTES, "n_iter_", "result_"):
            # a failed fit must not leave an earlier fit's model looking like its result
            if hasattr(self, name):
                delattr(self, name)

    def _prepare_fit(self, X, y, steps, epochs, validation_data, eval_every, init_model, resume) -> _FitRun:
        """Check every setting and the data, and find the state training starts from."""
        settings = self._check_settings(eval_every)
        options = self._solver_options()
        solver, engine = self._group_options()
        policy = "study" if solver["require_convergence"] else _payoff.policy()
        shared = self._shared_directory(engine)  # a bad setting fails here, before the data is read on a cluster
        data = self._check_data(X, y, validation_data, settings, model=init_model)
        order = self._batch_order(settings, data.n_samples)
        total = self._check_length(steps, epochs, order.steps_per_epoch)
        ckpt, resume = self._resume_checkpoint(resume, settings, data, order)
        if ckpt is not None:
            model, velocity, done = ckpt.model, ckpt.velocity, ckpt.step
        else:
            model = self._initial_model(settings, data.n_features, data.n_outputs, init_model)
            velocity, done = SGD.init_state(model.params), 0
        if total <= done:
            raise invalid("steps", total, f"more than the {done} steps the resumed checkpoint holds")
        options = self._levels_for(options, total - done)
        if policy == "force" and options["levels"] < 2:
            least = MIN_COARSE * _first(options["cfactor"])
            raise invalid(
                "steps",
                total - done,
                f"at least {least} steps to solve: daskann.mgrit.solve='force' asks for an MGRIT solve, which needs "
                "two levels",
            )
        self._check_checkpoint_space(settings, model.sizes, done, total, count=1)  # one, at the end
        return _FitRun(
            settings,
            options,
            solver,
            engine,
            data,
            order,
            total,
            model,
            velocity,
            done,
            resume,
            shared=shared,
            policy=policy,
        )

    def _shared_directory(self, engine: dict) -> Path | None:
        """The folder every node of the cluster sees, where a run on a cluster without a ``store`` keeps its stores.

        None for a given store or a local scheduler (whose tasks all run in this process).
        """
        if engine["store"] is not None or engine["scheduler"] != "distributed":
            return None
        folder = shared_directory(self.client if self.client is not None else current_sync_client())
        return None if folder is None else Path(folder)

    def _levels_for(self, options: dict, n_steps: int) -> dict:
        """A preset's ``levels`` is a maximum, as XBraid's ``max_levels``: a short run keeps the levels its steps allow.

        Levels set explicitly are kept, and a run too short for them is refused by the solver's check.
        """
        if resolve_group(self.solver, MGRITSolverOptions)["levels"] is not None:
            return options
        # the factors are checked as the solver checks them, before this arithmetic reads them
        name, check = _option_name("cfactor"), functools.partial(check_int, minimum=2)
        if isinstance(options["cfactor"], (list, tuple)):
            factors = [check(name.at(i), factor) for i, factor in enumerate(options["cfactor"])]
        else:
            factors = None
            check(name, options["cfactor"])
        levels = 1
        while levels < options["levels"]:
            span = math.prod(factors[:levels]) if factors else options["cfactor"] ** levels
            if n_steps // span < MIN_COARSE:
                break
            levels += 1
        if levels == options["levels"]:
            return options
        return {**options, "levels": levels, "cfactor": list(factors[: levels - 1]) if factors else options["cfactor"]}

    def _resume_checkpoint(self, resume, settings, data, order):
        """The checkpoint to start from (or None), and ``resume`` as the reference run sees it."""
        if resume is None:
            return None, None
        try:
            return self._load_resume(resume, settings, data, order), resume
        except FileNotFoundError:
            # a run folder without checkpoints: an interrupted solve, which its store continues
            if not Path(resume).is_dir():
                raise
            return None, None

    def _plan_solver(self, run: _FitRun, options: dict | None = None, *, initial=None, budget=None) -> MGRIT:
        """The propagator of the run's SGD steps, its store, and the solver over them.

        ``options`` (an adapted attempt's), ``initial`` (fine C-points to start
        from) and ``budget`` (iterations before a stall fails the attempt)
        default to the fit's own solve.
        """
        first = options is None
        options = run.options if first else options
        if budget is None and not run.solver["require_convergence"]:
            budget = options["max_iter"]
        run.prop = self._propagator(run, options)
        u0 = run.u0 = run.prop.initial_state(run.model, run.velocity)
        run_id = _run_id(run.prop.get_config(), options, u0, run.n_steps)
        if first:
            run.store, run.scratch, run.scratch_dir = self._store_path(run_id, run.engine["store"], run.shared)
        inprocess = run.scheduler == "inprocess"
        config = dataclasses.replace(
            SolverConfig(**options),
            max_iter=options["max_iter"] if budget is None else budget,
            nested_iteration=options["nested_iteration"] and initial is None,
        )
        return MGRIT.from_config(
            run.prop,
            u0,
            run.n_steps,
            config,
            initial_cpoints=initial,
            stall=None if budget is None else _adapt.stalled,  # with a budget a stalled attempt fails early
            divergence_factor=run.solver["divergence_factor"],
            callback=functools.partial(self._record_iteration, run),
            intervals_per_task=run.engine["intervals_per_task"],
            timeout=run.engine["timeout"],
            run_id=run_id if first else None,
            store=None if inprocess or not first else run.store,
            scratch_dir=None if inprocess else run.scratch_dir,
            scheduler=None if inprocess else run.scheduler,
            name_of=_option_name,
        )

    def _propagator(self, run: _FitRun, options: dict) -> SGDPropagator:
        """The run's SGD steps as the solver's propagator, coarsened as ``options`` say."""
        settings = run.settings
        X, y = run.data.X, run.data.y
        if run.scheduler != "distributed" and is_dask_array(X):  # local schedulers train in this process
            X, y = (np.asarray(a) for a in dask.compute(X, y))
        return SGDPropagator(
            run.model,
            X,
            y,
            loss=settings["loss"],
            order=run.order,
            lr=settings["lr"],
            momentum=settings["momentum"],
            **SolverConfig(**options).propagator_kwargs(),
            step_offset=run.done,
            # without momentum the velocity (the last gradient) is read by no step: a state of the parameters
            # alone halves what every step, copy and write moves; the fit's last gradient is taken at the end
            velocity=bool(settings["momentum"]),
            name_of=_option_name,
        )

    def _record_iteration(self, run: _FitRun, info) -> None:
        """The solver's callback: one history row per MGRIT iteration."""
        row = self._history_row(run, info.residual, run.attempt, info.state)
        run.history.append(run.iter_offset + info.iteration, **row)
        run.bar.update(run.iter_offset + info.iteration, residual=info.residual)
        self._check_payoff(run, info)

    def _history_row(self, run: _FitRun, residual: float, attempt: int, state) -> dict:
        """A history row: the residual, the time so far, and the error and validation loss of ``state``'s weights."""
        row = {"residual": residual, "time": time.perf_counter() - run.t0, "attempt": attempt}
        if run.reference is not None:
            params = np.concatenate([a.ravel() for a in state[: len(run.model.params)]])
            row["error"] = float(np.linalg.norm(params - run.reference) / np.linalg.norm(run.reference))
        if run.data.validation is not None:
            current, _ = run.prop.split(state)
            row["val_loss"] = self._evaluate(current, run.data.validation, run.settings["loss"])["val_loss"]
        return row

    def _check_payoff(self, run: _FitRun, info) -> None:
        """Stop the solve (:class:`StopIteration`) once it cannot pay, or its first iterations predict no gain."""
        if run.forecast is None or info.converged:
            return
        spent, serial = time.perf_counter() - run.t0, run.forecast.serial_seconds
        if run.policy != "study" and _payoff.cost_lost(spent, serial):
            run.stopped = f"its iterations took {spent:.3g} s, more than serial training's {serial:.3g} s"
            raise StopIteration
        if run.attempt > 0 or run.pilot is not None:
            return
        run.pilot_seconds.append(info.seconds)
        run.pilot_residuals.append(info.residual)
        if info.iteration != _payoff.MIN_ITERATIONS:
            return
        hierarchy = run.hierarchy
        # FCF relaxation makes two more C-points exact each iteration: no solve takes longer than that
        most = (
            math.ceil(hierarchy.n_intervals(0) / 2) if _first(run.options["cf_iter"]) > 0 else hierarchy.n_intervals(0)
        )
        run.pilot = _payoff.pilot_forecast(
            run.pilot_residuals,
            run.pilot_seconds,
            spent,
            run.options["tol"],
            serial,
            run.forecast.workers,
            run.forecast.step_seconds,
            most_iterations=most,
        )
        if run.policy == "predict" and not run.pilot.pays:
            warnings.warn(run.pilot.message(), MGRITDidNotPay, stacklevel=2)
            run.warned = True
            run.stopped = "predicted not to pay from its first iterations"
            raise StopIteration

    def _solve(self, run: _FitRun, solver: MGRIT) -> MGRITResult:
        run.t0 = run.t0 or time.perf_counter()  # the history's time runs on over every attempt
        if run.scheduler != "distributed":
            result = solver.solve()
        else:
            with self._client() as client:
                # the propagator, data included, is broadcast to every worker
                check_worker_memory(client, run.data.X.nbytes + run.data.y.nbytes, name="X")
                solver.scheduler = client
                result = solver.solve()
        run.before_last = solver.point_before_end_
        return result

    def _solve_adaptive(self, run: _FitRun, solver: MGRIT) -> MGRITResult:
        """Attempts along the adaptation ladder, then the serial finish: a result holding serial's weights."""
        budget = run.options["max_iter"]
        options, change = dict(run.options), ""
        attempts = _Attempts(time.perf_counter())
        while True:
            attempts.hierarchy = hierarchy = solver.check()["hierarchy"]
            t0 = time.perf_counter()
            try:
                result = self._solve(run, solver)
                new = _run.records(vars(result))
                outcome, reason = ("converged" if result.converged else "max_iter"), result.status
                attempts.template = result
                if result.status == "stopped":  # the pay check: no further attempt
                    outcome, reason = "stopped", run.stopped
            except MGRITDiverged as exc:
                new = list(getattr(exc, "records", []))
                stalled = getattr(exc, "stalled", False)
                outcome = "stalled" if stalled else "diverged"
                reason = exc.what if stalled else f"{exc.what} on level {exc.level} at fine step {exc.step}"
                reason += f" (iteration {exc.iteration})"
            attempts.kept = solver.last_iterate_ or attempts.kept
            attempts.records += new
            work, path = _adapt.records_cost(new)
            attempts.adaptations.append(
                _adapt.Adaptation(
                    run.attempt,
                    change,
                    # what it ran with: the levels, the resolved coarse learning-rate cap and the substeps
                    {"levels": options["levels"], "alpha_cap": run.prop.alpha_cap, "substeps": options["substeps"]},
                    outcome,
                    reason,
                    len(new),
                    work,
                    path,
                    time.perf_counter() - t0,
                )
            )
            if outcome == "converged":
                ended = "converged" if run.attempt == 0 else "adapted"
                return self._combined(run, attempts, result.state, ended)
            run.iter_offset += len(new)
            if outcome == "stopped":
                break
            left = budget - len(attempts.records)
            if left <= 0:
                break
            coarse = options["coarse"]
            alpha_max = max(
                (run.prop.alpha(lvl, hierarchy.span(lvl)) for lvl in range(1, hierarchy.n_levels)), default=1.0
            )
            step = _adapt.next_change(
                run.attempt + 1, options, alpha_max, callable_coarse=callable(coarse) or coarse == "repeat"
            )
            if step is None:
                break
            change, options = step
            run.attempt += 1
            initial = _adapt.initial_guess(attempts.kept, run.layout.pack(run.u0), hierarchy.cfactors[0])
            solver = self._plan_solver(run, options, initial=initial, budget=left)
        predicted = run.policy == "predict" and run.pilot is not None and not run.pilot.pays
        ended = "serial-predicted" if predicted else "serial-fallback"
        return self._serial_finish(run, attempts, ended)

    def _serial_finish(self, run: _FitRun, attempts: _Attempts, ended: str) -> MGRITResult:
        """Propagate serially from the last point the kept iterate holds exactly."""
        t0 = time.perf_counter()
        n_steps, cfactors = run.n_steps, attempts.hierarchy.cfactors
        # a state without velocity finishes with a step, whose gradient is the final velocity
        before = None if run.prop.velocity else n_steps
        cfactor = cfactors[0] if cfactors else 1  # one level: nothing kept
        start, vector = _adapt.trusted_start(attempts.kept, run.layout.pack(run.u0), cfactor, before=before)
        state, run.final_velocity = self._finish(run, start, vector)
        steps, reason = float(n_steps - start), f"steps {start}..{n_steps} serially"
        attempts.adaptations.append(
            _adapt.Adaptation(
                run.attempt + 1, "serial", {"start": start}, "serial", reason, 0, steps, steps, time.perf_counter() - t0
            )
        )
        return self._combined(run, attempts, state, ended)

    @staticmethod
    def _finish(run: _FitRun, start: int, vector) -> tuple:
        """:func:`_adapt.finish_serially` from fine step ``start``: the final state and velocity."""
        layout, n_steps, prop = run.layout, run.n_steps, run.prop
        if is_dask_array(prop.X):  # on a worker, where the propagator's data is read
            args = (prop.without_data(), layout, start, vector, n_steps, run.done, prop.X, prop.y)
            return remote_call(_finish_on_worker, *args)
        return _adapt.finish_serially(prop, layout, start, vector, n_steps, step_offset=run.done)

    def _combined(self, run: _FitRun, attempts: _Attempts, state, ended: str) -> MGRITResult:
        """One result over every attempt (and the serial finish)."""
        serial = sum(a.work for a in attempts.adaptations if a.outcome == "serial")
        solved = ended in ("converged", "adapted")
        fields = {
            "converged": solved,
            "status": "converged" if solved else ended,
            "ended": ended,
            "adaptations": attempts.adaptations,
            "solve_time": time.perf_counter() - attempts.started,
        }
        if attempts.template is None:  # no attempt returned a result of its own
            options = run.options
            fields.update(
                setup_time=0.0,
                n_steps=run.n_steps,
                levels=attempts.hierarchy.describe(),
                store=None,
                run_id="",
                tol=options["tol"],
                rtol=options["rtol"],
                max_iter=options["max_iter"],
                executor=run.scheduler,
            )
        result = _adapt.combined_result(attempts.template, attempts.records, state, **fields)
        result.potential_speedup = _adapt.combined_paper_speedup(result, attempts.hierarchy, serial)
        result.forecast = _forecast_record(run)
        return result

    def _warn_if_unpaid(self, result: MGRITResult) -> None:
        """Warn when the fit fell back, or its work-model time (unlimited workers) was not below serial's steps.

        MGRIT's total work is always several times serial training's (it is
        traded for parallelism); what must beat serial is its critical path.
        """
        if not result.ended:
            return
        path = sum(a.critical_path for a in result.adaptations)
        if result.ended in ("serial-fallback", "serial-predicted") or path >= result.n_steps:
            work = sum(a.work for a in result.adaptations)
            warnings.warn(
                f"MGRIT did not pay: it ended {result.ended!r} after {len(result.adaptations)} attempt(s) and "
                f"{result.iterations} iterations, with a work-model time of {path:.0f} and a total work of "
                f"{work:.0f} units against {result.n_steps} serial steps (the weights are serial training's; "
                "see result_.adaptations)",
                MGRITDidNotPay,
                stacklevel=3,
            )

    def _finish_fit(self, run: _FitRun, result: MGRITResult) -> None:
        """Keep the result, or raise when it did not converge; write the checkpoint; drop a scratch store."""
        self._keep_inputs(run.settings, run.data, run.order)
        self.result_ = result
        attrs = _result_attrs(result, {**run.options, "alpha_cap": run.prop.alpha_cap})  # "auto" resolved
        if result.ended:
            attrs["mgrit_ended"] = result.ended
            attrs["mgrit_adaptations"] = json.dumps([a.to_dict() for a in result.adaptations], default=str)
            # every attempt and the serial finish, not the iterations alone
            path = sum(a.critical_path for a in result.adaptations)
            attrs["mgrit_speedup_unlimited"] = result.n_steps / path if path else float("nan")
        if result.forecast is not None:
            attrs["mgrit_forecast"] = json.dumps(result.forecast, default=str)
        # kept also when the solve did not converge, to be looked at
        self.history_ = run.history.to_dataset({**self._history_attrs(run.settings), **attrs})
        if not result.converged and run.solver["require_convergence"]:
            raise MGRITNotConverged(result)
        model, velocity = run.prop.split(result.state)
        if not run.prop.velocity:
            velocity = self._final_velocity(run)
        self._keep_results(model, velocity, run.total, self.history_)
        self.n_iter_ = result.iterations
        if self._checkpoint_dir is not None:
            self._save_checkpoint(
                self.model_, self.velocity_, run.total, run.order, run.settings, extra={"mgrit": attrs}
            )
        if run.scratch and run.store is not None and (result.converged or result.ended):
            shutil.rmtree(run.store, ignore_errors=True)

    def _final_velocity(self, run: _FitRun) -> list[np.ndarray]:
        """The velocity serial training ends with, for a state that carries none: the last step's gradient."""
        if run.final_velocity is None:
            # the steps from the last C-point before the end again (at most one interval), taking the gradient
            start, vector = run.before_last
            run.final_velocity = self._finish(run, start, vector)[1]
        return run.final_velocity

    def _store_path(self, run_id: str, store, shared: Path | None) -> tuple[Path | None, bool, Path | None]:
        """Where the run's trajectories go.

        Returns the first attempt's store (``engine``'s ``store``; None: a
        temporary one), whether it is the trainer's own (removed once the run
        converged), and the folder an attempt without a store of its own makes
        its temporary store in (None: a temporary folder of this machine).
        """
        # an adapted attempt is not resumable (its store cannot be the run's): its temporary store goes inside the
        # run's store, the folder the workers were told to write to
        if store is not None:
            if not isinstance(store, (str, Path)):
                raise invalid(_option_name("store"), store, "a folder path or None", TypeError)
            return Path(store), False, Path(store)
        if shared is not None:
            # workers on other nodes see it: every attempt makes a fresh folder there, removed when it ends
            return None, False, shared
        if self._checkpoint_dir is not None:
            # named by the run: fitting again with the same settings continues an interrupted solve
            path = Path(self._checkpoint_dir) / store_module.CHECKPOINT_DIR / f"{run_id}.zarr"
            return path, True, path
        return None, False, None

    def _reference(self, reference, X, y, model, resume, total, solver: dict):
        if reference is None and not solver["compute_error"]:
            return None
        if reference is None or (isinstance(reference, str) and reference == "serial"):
            names = set(SerialTrainer._get_param_names()) - {"checkpoint", "verbose"}
            serial = SerialTrainer(**{k: v for k, v in self.get_params(deep=False).items() if k in names})
            if resume is not None:
                reference = serial.fit(X, y, steps=total, resume=resume)
            else:
                reference = serial.fit(X, y, steps=total, init_model=model)
        if isinstance(reference, SerialTrainer):
            reference = reference.model_
        if not isinstance(reference, MLP):
            raise invalid("reference", type(reference).__name__, "a SerialTrainer, an MLP, 'serial' or None", TypeError)
        return np.concatenate([p.ravel() for p in reference.params]).astype(np.float64)


def _forecast_record(run: _FitRun) -> dict | None:
    """The fit's forecasts for ``result_.forecast``: before the solve, and from its first iterations."""
    if run.forecast is None:
        return None
    record = {"policy": run.policy, **run.forecast.to_dict()}
    if run.pilot is not None:
        record["pilot"] = run.pilot.to_dict()
    if run.stopped:
        record["stopped"] = run.stopped
    return record


def _first(value):
    return value[0] if isinstance(value, (list, tuple)) else value


def _finish_on_worker(prop, layout, start: int, vector, n_steps: int, offset: int, X, y):
    return _adapt.finish_serially(prop.with_data(X, y), layout, start, vector, n_steps, step_offset=offset)


def _run_id(prop_config: dict, options: dict, u0, n_steps: int) -> str:
    h = hashlib.sha256()
    h.update(
        json.dumps(
            {"propagator": prop_config, "options": options, "n_steps": n_steps}, sort_keys=True, default=str
        ).encode()
    )
    for a in u0:
        h.update(np.ascontiguousarray(a).tobytes())
    return "mgrit-" + h.hexdigest()[:16]


def _result_attrs(result: MGRITResult, options: dict) -> dict:
    attrs = {f"mgrit_{k}": (list(v) if isinstance(v, tuple) else v) for k, v in options.items()}
    attrs.update(
        {
            "mgrit_converged": int(result.converged),
            "mgrit_iterations": result.iterations,
            "mgrit_executor": result.executor,
            "mgrit_setup_time": result.setup_time,
            "mgrit_solve_time": result.solve_time,
            "mgrit_speedup_unlimited": result.speedup() if result.critical_path else float("nan"),
        }
    )
    return {k: ("" if v is None else v) for k, v in attrs.items()}
