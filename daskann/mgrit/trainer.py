"""MGRITTrainer: train an MLP by solving for every training step at once with MGRIT."""

from __future__ import annotations

import functools
import hashlib
import json
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from daskann import store as store_module
from daskann._base import BaseTrainer, TrainingData
from daskann._history import HistoryRecorder
from daskann._progress import ProgressBar
from daskann._typing import Activation, CycleType, FloatDType, Loss, MGRITScheduler, Output
from daskann._validation import check_choice, invalid
from daskann.cluster import check_worker_memory, resolve_client
from daskann.data import BatchOrder
from daskann.mgrit._errors import MGRITNotConverged
from daskann.mgrit.presets import PRESETS, resolve_preset
from daskann.mgrit.propagators import SGDPropagator
from daskann.mgrit.solver import MGRIT, MGRITResult
from daskann.nn import MLP, SGD
from daskann.serial import SerialTrainer

SCHEDULERS = ("distributed", "threads", "sync", "inprocess")


@dataclass
class _FitRun:
    """One fit's state, from the checked input to the solver's result."""

    settings: dict
    options: dict  # the solver's, preset and explicit values merged
    scheduler: str
    data: TrainingData
    order: BatchOrder
    total: int  # steps the trained model will have taken
    model: MLP  # the state training starts from: model, SGD velocity, steps it already holds
    velocity: list
    done: int
    resume: object  # the checkpoint given to fit, None when the run's store continues it
    prop: SGDPropagator | None = None
    store: Path | None = None
    scratch: bool = False  # the store is the trainer's own, removed once the run converged
    reference: np.ndarray | None = None  # serial parameters the error is measured against
    history: HistoryRecorder = field(default_factory=lambda: HistoryRecorder("iteration"))
    bar: ProgressBar | None = None
    t0: float = 0.0


class MGRITTrainer(BaseTrainer):
    """Minibatch SGD with momentum, parallel over the training steps by MGRIT.

    Training is the evolution ``w_{i+1} = Phi_i(w_i)`` where ``Phi_i`` is one
    SGD step on minibatch ``i`` (state: weights, biases and velocity); FAS
    multigrid in time solves all steps at once and converges to the weights
    :class:`SerialTrainer` produces with the same settings. Takes the settings
    of :class:`daskann._base.BaseTrainer` plus the solver's.

    Parameters
    ----------
    preset : {"solver1", "solver2", "solver3", "solver4"}
        Solver configuration (see :mod:`daskann.mgrit.presets`); every option
        below left at None takes the preset's value.
    levels, cfactor, cf_iter, cycle_type, weight_c, weight_c_growth, tol, rtol, max_iter, nested_iteration
        Solver options (:class:`daskann.mgrit.MGRIT`).
    coarse, alpha_growth, alpha_cap, substeps, coarse_batches
        Coarse propagator (:class:`daskann.mgrit.propagators.SGDPropagator`).
    scheduler : {"distributed", "threads", "sync", "inprocess"}
        ``"distributed"`` (default) runs the tasks on ``client`` (or the
        default client, or an embedded LocalCluster); ``"threads"`` and
        ``"sync"`` use dask's local schedulers; ``"inprocess"`` runs the same
        tasks on numpy arrays in this process.
    store : path, optional
        Zarr trajectory store (dask schedulers). By default a store named
        after the run under ``checkpoint_dir/checkpoints`` when a checkpoint
        folder is set (removed once the run converged), else a temporary
        folder. Fitting again with the same settings and data continues an
        interrupted run from its store; a store of another run is refused.
    intervals_per_task : int or "auto"
        Intervals one task relaxes (``"auto"``: about 32 tasks per sweep).
    timeout : float
        Seconds one iteration may take on a cluster.
    divergence_factor : float or None
        Residual growth that counts as instability.
    require_convergence : bool
        Raise :class:`MGRITNotConverged` when ``max_iter`` is reached without
        convergence (default); otherwise keep the unconverged weights.
    compute_error : bool
        Also train serially (in this process) and record the error of the
        current final weights against it after every iteration.
    client : distributed.Client, optional

    Attributes
    ----------
    model_ : MLP
    velocity_ : list of ndarray
    history_ : xarray.Dataset
        Over ``iteration``: ``residual``, ``time`` (cumulative wall time),
        ``error`` (relative error of the final weights against serial
        training, when asked) and ``val_loss`` of the current final weights.
    result_ : MGRITResult
        The solver's record (residuals, timings, work model).
    n_iter_ : int
    n_steps_ : int
    batch_order_ : BatchOrder

    Examples
    --------
    >>> from daskann.data import make_linear
    >>> X, y = make_linear(128, 4, 1, seed=0)
    >>> t = MGRITTrainer((8,), lr=0.01, batch_size=16, levels=2, cfactor=4, scheduler="inprocess")
    >>> t.fit(X, y, steps=32).n_iter_ <= 4
    True
    """

    method = "mgrit"

    def __init__(
        self,
        hidden_sizes=(64,),
        *,
        activation: Activation = "relu",
        output: Output = "linear",
        loss: Loss = "mse",
        lr=0.01,
        momentum=0.0,
        batch_size=32,
        shuffle=True,
        seed=0,
        dtype: FloatDType = "float64",
        negative_slope=0.01,
        eval_every=None,
        checkpoint_dir=None,
        checkpoint_every=None,
        verbose=0,
        preset="solver2",
        levels=None,
        cfactor=None,
        cf_iter=None,
        cycle_type: CycleType | None = None,
        weight_c=None,
        weight_c_growth=None,
        tol=None,
        rtol=None,
        max_iter=None,
        nested_iteration=None,
        coarse=None,
        alpha_growth=None,
        alpha_cap=None,
        substeps=None,
        coarse_batches=None,
        scheduler: MGRITScheduler = "distributed",
        store=None,
        intervals_per_task="auto",
        timeout=600.0,
        divergence_factor=1e4,
        require_convergence=True,
        compute_error=False,
        client=None,
    ):
        super().__init__(
            hidden_sizes,
            activation=activation,
            output=output,
            loss=loss,
            lr=lr,
            momentum=momentum,
            batch_size=batch_size,
            shuffle=shuffle,
            seed=seed,
            dtype=dtype,
            negative_slope=negative_slope,
            eval_every=eval_every,
            checkpoint_dir=checkpoint_dir,
            checkpoint_every=checkpoint_every,
            verbose=verbose,
        )
        self.preset = preset
        self.levels = levels
        self.cfactor = cfactor
        self.cf_iter = cf_iter
        self.cycle_type = cycle_type
        self.weight_c = weight_c
        self.weight_c_growth = weight_c_growth
        self.tol = tol
        self.rtol = rtol
        self.max_iter = max_iter
        self.nested_iteration = nested_iteration
        self.coarse = coarse
        self.alpha_growth = alpha_growth
        self.alpha_cap = alpha_cap
        self.substeps = substeps
        self.coarse_batches = coarse_batches
        self.scheduler = scheduler
        self.store = store
        self.intervals_per_task = intervals_per_task
        self.timeout = timeout
        self.divergence_factor = divergence_factor
        self.require_convergence = require_convergence
        self.compute_error = compute_error
        self.client = client

    # -- configuration ---------------------------------------------------------------
    def _solver_options(self) -> dict:
        """Preset values overridden by every option given explicitly."""
        explicit = {name: getattr(self, name) for name in PRESETS["solver1"] if getattr(self, name) is not None}
        return resolve_preset(self.preset, **explicit)

    def fit(
        self,
        X,
        y,
        *,
        steps=None,
        epochs=None,
        validation_data=None,
        init_model: MLP | None = None,
        resume=None,
        reference=None,
    ):
        """Train for ``steps`` (or ``epochs``) SGD steps, all at once.

        Parameters
        ----------
        X, y : array-like
        steps, epochs : int
            Training length, exactly one of the two.
        validation_data : (X_val, y_val), optional
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
        MGRITDiverged
            The iteration was unstable (level and step named); no model is kept.
        MGRITNotConverged
            ``max_iter`` reached without convergence (``require_convergence``).
        """
        self._forget_fit()
        run = self._prepare_fit(X, y, steps, epochs, validation_data, init_model, resume)
        solver = self._plan_solver(run)
        solver._check()  # every solver option, before the reference run and before any task
        # over the iteration budget: a converged run stops short of it
        run.bar = self._progress_bar(run.options["max_iter"], "mgrit", unit="iteration")
        with self._run_lock(), run.bar:  # the folder is this run's until its checkpoint is written
            run.reference = self._reference(reference, X, y, run.model, run.resume, run.total)
            result = self._solve(run, solver)
            self._finish_fit(run, result)
        return self

    def _forget_fit(self) -> None:
        for name in ("model_", "velocity_", "n_steps_", "n_iter_", "result_", "history_"):
            # a failed fit must not leave an earlier fit's model looking like its result
            if hasattr(self, name):
                delattr(self, name)

    def _prepare_fit(self, X, y, steps, epochs, validation_data, init_model, resume) -> _FitRun:
        """Check every setting and the data, and find the state training starts from."""
        settings = self._check_settings()
        options = self._solver_options()
        scheduler = check_choice("scheduler", self.scheduler, SCHEDULERS)
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
        self._check_checkpoint_space(settings, model.sizes, done, total, count=1)  # one, at the end
        return _FitRun(settings, options, scheduler, data, order, total, model, velocity, done, resume)

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

    def _plan_solver(self, run: _FitRun) -> MGRIT:
        """The propagator of the run's SGD steps, its store, and the solver over them."""
        options, settings = run.options, run.settings
        run.prop = SGDPropagator(
            run.model,
            run.data.X,
            run.data.y,
            loss=settings["loss"],
            order=run.order,
            lr=settings["lr"],
            momentum=settings["momentum"],
            coarse=options["coarse"],
            alpha_growth=options["alpha_growth"],
            alpha_cap=options["alpha_cap"],
            substeps=options["substeps"],
            coarse_batches=options["coarse_batches"],
            step_offset=run.done,
        )
        u0 = run.prop.initial_state(run.model, run.velocity)
        run_id = _run_id(run.prop.get_config(), options, u0, run.total - run.done)
        run.store, run.scratch = self._store_path(run_id)
        inprocess = run.scheduler == "inprocess"
        return MGRIT(
            run.prop,
            u0,
            run.total - run.done,
            levels=options["levels"],
            cfactor=options["cfactor"],
            cf_iter=options["cf_iter"],
            cycle_type=options["cycle_type"],
            weight_c=options["weight_c"],
            weight_c_growth=options["weight_c_growth"],
            tol=options["tol"],
            rtol=options["rtol"],
            max_iter=options["max_iter"],
            nested_iteration=options["nested_iteration"],
            divergence_factor=self.divergence_factor,
            callback=functools.partial(self._record_iteration, run),
            intervals_per_task=self.intervals_per_task,
            timeout=self.timeout,
            run_id=run_id,
            store=None if inprocess else run.store,
            scheduler=None if inprocess else run.scheduler,
        )

    def _record_iteration(self, run: _FitRun, info) -> None:
        """The solver's callback: one history row per MGRIT iteration."""
        row = {"residual": info.residual, "time": time.perf_counter() - run.t0}
        if run.reference is not None:
            params = np.concatenate([a.ravel() for a in info.state[: len(info.state) // 2]])
            row["error"] = float(np.linalg.norm(params - run.reference) / np.linalg.norm(run.reference))
        if run.data.validation is not None:
            current, _ = run.prop.split(info.state)
            row["val_loss"] = current.loss(*run.data.validation, run.settings["loss"])
        run.history.append(info.iteration, **row)
        run.bar.update(info.iteration, residual=info.residual)

    def _solve(self, run: _FitRun, solver: MGRIT) -> MGRITResult:
        run.t0 = time.perf_counter()
        if run.scheduler != "distributed":
            return solver.solve()
        with resolve_client(self.client) as client:
            # the propagator, data included, is broadcast to every worker
            check_worker_memory(client, run.data.X.nbytes + run.data.y.nbytes, name="X")
            solver.scheduler = client
            return solver.solve()

    def _finish_fit(self, run: _FitRun, result: MGRITResult) -> None:
        """Keep the result, or raise when it did not converge; write the checkpoint; drop a scratch store."""
        self._settings, self._data, self.batch_order_ = run.settings, run.data, run.order
        self.result_ = result
        attrs = _result_attrs(result, {**run.options, "alpha_cap": run.prop.alpha_cap})  # "auto" resolved
        self.history_ = run.history.to_dataset({**self._history_attrs(run.settings), **attrs})
        if not result.converged and self.require_convergence:
            raise MGRITNotConverged(result)
        self.model_, self.velocity_ = run.prop.split(result.state)
        self.n_steps_ = run.total
        self.n_iter_ = result.iterations
        if self.checkpoint_dir is not None:
            self._save_checkpoint(
                self.model_, self.velocity_, run.total, run.order, run.settings, extra={"mgrit": attrs}
            )
        if run.scratch and run.store is not None and result.converged:
            shutil.rmtree(run.store, ignore_errors=True)

    def _store_path(self, run_id: str):
        """The trajectory store and whether it is the trainer's own (removed once the run converged)."""
        if self.store is not None:
            if not isinstance(self.store, (str, Path)):
                raise invalid("store", self.store, "a folder path or None", TypeError)
            return Path(self.store), False
        if self.checkpoint_dir is not None:
            # named by the run: fitting again with the same settings continues an interrupted solve
            return Path(self.checkpoint_dir) / store_module.CHECKPOINT_DIR / f"{run_id}.zarr", True
        return None, False

    def _reference(self, reference, X, y, model, resume, total):
        if reference is None and not self.compute_error:
            return None
        if reference is None or (isinstance(reference, str) and reference == "serial"):
            names = set(SerialTrainer._get_param_names()) - {"checkpoint_dir", "checkpoint_every", "verbose"}
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
