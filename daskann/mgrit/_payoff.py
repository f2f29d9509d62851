"""Whether MGRIT pays: its time on the fit's workers against serial training's, before and during the solve.

MGRIT trades work for parallelism: an iteration does several serial trainings'
worth of steps, spread over the workers, and a solve takes several iterations.
:class:`MGRITTrainer`'s adaptive fit therefore asks, before any task, whether
the solve can beat serial training on the workers at hand
(:func:`forecast`); during the solve, whether the iterations seen so far
predict a gain (:func:`pilot_forecast`) and whether they have already cost
more than serial training would (:func:`cost_lost`). The setting
``daskann.mgrit.solve`` (:data:`POLICIES`) decides which of these apply.

The forecast before the solve is a bound from below on MGRIT's time, built
from the solver's own task graphs (:class:`daskann.mgrit._plan.Planner`, as
``daskann plan`` models them) with each task's steps at the serial step
measured here, at least :data:`MIN_ITERATIONS` iterations and at least
:data:`TASK_SECONDS` of scheduling per task; where even that loses to serial
training, no solve can pay.
"""

from __future__ import annotations

import functools
import math
import time
from dataclasses import asdict, dataclass

import numpy as np

from daskann import config
from daskann._blas import one_blas_thread
from daskann.mgrit import workmodel
from daskann.mgrit._levels import check_hierarchy
from daskann.mgrit._plan import Planner
from daskann.mgrit.problem import StateLayout
from daskann.mgrit.propagators import step_cost

#: values of the setting ``daskann.mgrit.solve``
POLICIES = ("predict", "force", "study")
#: the fewest iterations a solve is counted at: the second residual is the first that shows a convergence rate
MIN_ITERATIONS = 2
#: seconds of scheduling a task costs at least, by scheduler (a Dask scheduler's own cost per task is
#: 1 to 2 ms on a LocalCluster, its messages between workers 10 to 25 ms more: docs/mgrit.md)
TASK_SECONDS = {"distributed": 1e-3, "threads": 1e-4, "sync": 1e-4, "inprocess": 0.0}
#: effective heavy-ball step ``lr / (1 - momentum)`` from which, with momentum, the coarse propagators stop
#: approximating the fine steps: in ``daskann bench mgrit --grid`` no such run paid (docs/mgrit.md)
MOMENTUM_STEP_LIMIT = 0.1
#: the most workers and steps (as a multiple of the fit's) the forecast looks for a gain at
MOST_WORKERS = 4096
MOST_STEPS_FACTOR = 1024


def policy() -> str:
    """The setting ``daskann.mgrit.solve``, checked.

    Raises
    ------
    ValueError
        Not one of :data:`POLICIES`.
    """
    value = config.get("mgrit.solve")
    if not isinstance(value, str) or value not in POLICIES:
        raise ValueError(
            f"daskann.mgrit.solve={value!r} is not valid: expected one of {', '.join(map(repr, POLICIES))} "
            "(check dask.config.set calls, DASK_DASKANN__ variables and Dask's YAML files)"
        )
    return value


@dataclass(frozen=True)
class Forecast:
    """MGRIT's time on the fit's workers against serial training's.

    Attributes
    ----------
    stage : {"before", "pilot"}
        ``"before"``: a bound from below, before any task; ``"pilot"``: the
        prediction from the solve's first iterations.
    serial_seconds : float
        Serial training's time: the fit's steps at the step time measured here.
    mgrit_seconds : float
        MGRIT's predicted time (at stage ``"before"``, its least).
    iterations : float
        Iterations the prediction counts (``inf`` where the residual does not fall).
    workers : int
    step_seconds : float
        One serial training step, measured in this process.
    pays : bool
    reason : str
        Why it does not pay (empty where it does).
    advice : str
        Where the same model predicts a gain: more workers or more steps.
    """

    stage: str
    serial_seconds: float
    mgrit_seconds: float
    iterations: float
    workers: int
    step_seconds: float
    pays: bool
    reason: str = ""
    advice: str = ""

    @property
    def speedup(self) -> float:
        """Serial training's time over MGRIT's."""
        return self.serial_seconds / self.mgrit_seconds if self.mgrit_seconds > 0 else math.inf

    def to_dict(self) -> dict:
        return {**asdict(self), "speedup": self.speedup}

    def message(self) -> str:
        """The text of :class:`~daskann.exceptions.MGRITDidNotPay` for a forecast without a gain."""
        what = "at best" if self.stage == "before" else "predicted from its first iterations"
        text = (
            f"MGRIT would not pay, so the fit trains serially: its predicted speedup over serial training is "
            f"{self.speedup:.2f} ({what}: {self.mgrit_seconds:.3g} s against {self.serial_seconds:.3g} s on "
            f"{self.workers} worker(s)); {self.reason}"
        )
        if self.advice:
            text += f"; {self.advice}"
        return text + " (the setting daskann.mgrit.solve='force' solves regardless; see docs/mgrit.md)"


def step_seconds(prop, model, *, budget: float = 2e-3) -> float:
    """Seconds of one serial training step, timed here on one BLAS thread.

    The propagator's own fine steps (its rows gathered, the gradient, the
    update: what the serial finish runs) where its data is in memory; else
    the network's gradient on zeros of a minibatch's shape (a dask array
    stays where it is: a step's time depends on the shapes alone).
    """
    times = []
    with one_blas_thread(), np.errstate(all="ignore"):
        if isinstance(prop.X, np.ndarray):
            vector = StateLayout.from_state(prop.initial_state(model)).pack(prop.initial_state(model))
            step = functools.partial(_fine_step, prop, vector)
        else:
            step = functools.partial(_zero_step, model.copy(), prop)
        step(0)  # the first call allocates
        while len(times) < 3 or (sum(times) < budget and len(times) < 16):
            t0 = time.perf_counter()
            step(len(times) + 1)
            times.append(time.perf_counter() - t0)
    return float(np.median(times))


def _fine_step(prop, vector, i: int) -> None:
    prop.step_flat(vector, i, i + 1, 0, out=vector)
    math.isfinite(vector.sum())  # the serial finish's check


def _zero_step(net, prop, i: int) -> None:
    batch = len(prop.order.indices(0))
    X, y = prop.X, prop.y
    xb = np.zeros((batch, X.shape[1]), dtype=X.dtype)
    yb = np.zeros((batch, *y.shape[1:]), dtype=y.dtype)
    _value, grad_w, grad_b = net.loss_and_gradients(xb, yb, prop.loss)
    for p, g in zip(net.params, net.interleave(grad_w, grad_b), strict=True):
        p -= 0.0 * g  # the update's arithmetic, leaving the weights as they are


def coarse_cost(options: dict, level: int, span: int) -> float:
    """Work units of one step of ``level``, as :meth:`daskann.mgrit.propagators.SGDPropagator.cost` counts them."""
    return step_cost(level, span, options["coarse"], options["substeps"], options["coarse_batches"])


@dataclass(frozen=True)
class IterationShape:
    """What bounds an iteration's time: its work, its critical path and its depth in tasks.

    ``work`` grows with the steps; the critical path (one task per interval)
    is the relaxations' fixed chain plus the coarsest level's serial solve,
    which grows with the steps; ``depth`` (tasks one after another, the
    residual's reduction included) does not.
    """

    n_steps: int
    work: float  # work units (fine steps) of the iteration
    fixed_path: float  # units of the critical path beside the coarsest solve
    coarsest_points: int
    coarsest_cost: float  # units of one step of the coarsest level
    depth: int

    def at(self, n_steps: int, options: dict) -> tuple[float, float]:
        """Work and critical path of the same solver over ``n_steps`` steps."""
        hierarchy = check_hierarchy(n_steps, options["levels"], options["cfactor"])
        points = hierarchy.n_points(hierarchy.n_levels - 1)
        return self.work * n_steps / self.n_steps, self.fixed_path + points * self.coarsest_cost

    def least_seconds(self, n_steps: int, options: dict, workers: float, step: float, task: float) -> float:
        """The least seconds of a solve of ``n_steps`` steps: :data:`MIN_ITERATIONS` iterations."""
        work, path = self.at(n_steps, options)
        return MIN_ITERATIONS * (max(work / workers, path) * step + self.depth * task)


def iteration_shape(options: dict, n_steps: int) -> IterationShape:
    """The shape of a later iteration of the solver ``options`` describe (the work model's tasks)."""
    hierarchy = check_hierarchy(n_steps, options["levels"], options["cfactor"])
    last = hierarchy.n_levels - 1
    work = workmodel.total_work(_iteration_tasks(options, hierarchy, whole=True))
    # the critical path on a small copy of the hierarchy, one interval per task: the coarsest solve's share of it
    # grows with the steps, the rest does not
    small = check_hierarchy(hierarchy.span(last) * 4, options["levels"], options["cfactor"]) if last else hierarchy
    tasks = _iteration_tasks(options, small, whole=False)
    cost = coarse_cost(options, last, hierarchy.span(last))
    path = workmodel.critical_path(tasks) - small.n_points(small.n_levels - 1) * cost
    for t in tasks:
        t.cost = 1.0
    depth = int(workmodel.critical_path(tasks)) + 1  # and the residual's reduction
    return IterationShape(n_steps, work, max(path, 0.0), hierarchy.n_points(last), cost, depth)


def _iteration_tasks(options: dict, hierarchy, *, whole: bool) -> list:
    """The second iteration's tasks: one per sweep (``whole``) or one per interval."""
    n = hierarchy.n_levels - 1
    cf_iter = options["cf_iter"]
    cf_iter = tuple(cf_iter) if isinstance(cf_iter, (list, tuple)) else (cf_iter,) * max(n, 1)
    blocks = tuple(hierarchy.n_intervals(lvl) if whole else 1 for lvl in range(n))
    planner = Planner(
        hierarchy,
        {
            "cf_iter": cf_iter,
            "weight_c": (1.0,) * max(n, 1),
            "cycle_type": options["cycle_type"],
            "store_fine": False,
            "blocks": blocks,
        },
        lambda level: coarse_cost(options, level, hierarchy.span(level)),
        "forecast",
    )
    planner.iteration(1)
    return planner.iteration(2)


def forecast(options: dict, n_steps: int, workers: int, step: float, *, scheduler: str, lr: float, momentum: float):
    """The bound from below on MGRIT's time before any task, against serial training's.

    Parameters
    ----------
    options : dict
        The solver's options (preset and overrides, levels resolved).
    n_steps : int
        Steps the solve computes.
    workers : int
        Workers the tasks run on (1 in this process).
    step : float
        Seconds of one serial step (:func:`step_seconds`).
    scheduler : str
        Where the tasks run (``MGRITTrainer``'s ``engine["scheduler"]``).
    lr, momentum : float
        The fit's SGD settings.

    Returns
    -------
    Forecast
    """
    task = TASK_SECONDS[scheduler]
    serial = n_steps * step
    if options["levels"] < 2:  # the solve would be serial training itself
        reason = f"too few steps: {n_steps} steps leave one level, and MGRIT needs two"
        return Forecast("before", serial, serial, 1.0, workers, step, False, reason)
    shape = iteration_shape(options, n_steps)
    least = shape.least_seconds(n_steps, options, workers, step, task)
    reasons, advice = [], ""
    if least >= serial:
        per_iteration = least / MIN_ITERATIONS / serial
        if shape.least_seconds(n_steps, options, math.inf, step, task) >= serial:
            reasons.append(
                f"too few steps: {n_steps} steps take {serial:.3g} s serially, and on any number of workers "
                f"{MIN_ITERATIONS} iterations take longer (serial chains and {shape.depth} tasks one after another)"
            )
        else:
            reasons.append(
                f"too few workers: one iteration costs at least {per_iteration:.2g} times serial training on "
                f"{workers} worker(s), and a solve takes {MIN_ITERATIONS} or more"
            )
        advice = _advice(shape, options, n_steps, workers, step, task)
    effective = lr / (1.0 - momentum) if momentum < 1 else math.inf
    if momentum > 0 and effective >= MOMENTUM_STEP_LIMIT:
        reasons.append(
            f"momentum {momentum:g} at lr {lr:g} (lr / (1 - momentum) = {effective:.3g}, at least "
            f"{MOMENTUM_STEP_LIMIT:g}) is outside what the coarse propagators handle: the coarse heavy-ball "
            "step stops approximating the fine steps, and such runs diverge or stall"
        )
    return Forecast(
        "before", serial, least, float(MIN_ITERATIONS), workers, step, not reasons, "; ".join(reasons), advice
    )


def _advice(shape: IterationShape, options, n_steps, workers, step, task) -> str:
    """From how many workers, or steps on these workers, the bound allows a gain."""
    by_workers = next(
        (
            p
            for p in _doublings(workers, MOST_WORKERS)
            if shape.least_seconds(n_steps, options, p, step, task) < n_steps * step
        ),
        None,
    )
    by_steps = next(
        (
            n
            for n in _doublings(n_steps, n_steps * MOST_STEPS_FACTOR)
            if shape.least_seconds(n, options, workers, step, task) < n * step
        ),
        None,
    )
    parts = []
    if by_workers is not None:
        parts.append(f"{by_workers} workers")
    if by_steps is not None:
        parts.append(f"{by_steps} steps on {workers} worker(s)")
    if not parts:
        return (
            f"the same bound sees no gain up to {MOST_WORKERS} workers or {n_steps * MOST_STEPS_FACTOR} steps "
            "with these solver options"
        )
    return "a gain is possible from " + " or from ".join(parts) + " (at the fewest iterations)"


def _doublings(start: int, most: int):
    value = start * 2
    while value <= most:
        yield value
        value *= 2


def pilot_forecast(
    residuals, seconds, spent: float, tol: float, serial: float, workers: int, step: float, *, most_iterations: int
) -> Forecast:
    """The prediction from a solve's first iterations: their convergence factor and the later ones' time.

    Parameters
    ----------
    residuals, seconds : sequence of float
        Residual and wall time of each iteration so far (at least two).
    spent : float
        Seconds since the solve started (its set-up included).
    tol : float
        The absolute tolerance the residual must reach.
    serial : float
        Serial training's seconds.
    most_iterations : int
        Iterations no solve needs more of (FCF relaxation: half the fine intervals).
    """
    k = len(residuals)
    rho = residuals[-1] / residuals[-2] if residuals[-2] > 0 else math.inf
    if residuals[-1] <= tol:
        more = 0
    elif 0 < rho < 1:
        more = math.ceil(math.log(tol / residuals[-1]) / math.log(rho) - 1e-9)  # not one more for round-off
    else:
        more = math.inf
    more = max(0, min(more, most_iterations - k))
    later = float(np.median(seconds[1:]))
    predicted = spent + more * later
    pays = predicted < serial
    reason = ""
    if not pays:
        trend = (
            f"fell by a factor {rho:.3g}"
            if 0 < rho < 1
            else f"did not fall ({residuals[-2]:.3g} to {residuals[-1]:.3g})"
        )
        reason = f"its residual {trend} in iteration {k}, so it needs about {k + more} iterations of {later:.3g} s each"
    return Forecast("pilot", serial, predicted, float(k + more), workers, step, pays, reason)


def cost_lost(spent: float, serial: float) -> bool:
    """Whether iterations that took ``spent`` seconds can no longer pay: they already cost serial training's time."""
    return spent >= serial


__all__ = ["POLICIES", "Forecast", "cost_lost", "forecast", "pilot_forecast", "policy", "step_seconds"]
