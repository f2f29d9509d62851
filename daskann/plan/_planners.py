"""Each method as ``daskann plan`` sees it: how to predict, calibrate, validate and run it.

A method's entry in :mod:`daskann._methods` names its planner, a :class:`MethodPlanner`
subclass; :func:`plan`, ``daskann plan`` and ``--validate`` call only its hooks, so a new
method is planned by writing one class (in its own folder) and naming it in its entry.
The three planners below use the models of :mod:`daskann.plan._model` and the timings of
:mod:`daskann.plan._measure`; :func:`validate`, at the end, is ``--validate``.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass, replace

import numpy as np

from daskann._methods import BY_NAME, load
from daskann.cluster import worker_addresses
from daskann.exceptions import MGRITDiverged
from daskann.plan._cluster import OPTIONAL, REQUIRED, ClusterSpec
from daskann.plan._measure import (
    _partition_overhead,
    calibrate_mgrit,
    fit_mgrit,
    measure_cluster,
    npt_step_walls,
    partition_phases,
    step_costs,
)
from daskann.plan._model import (
    Network,
    Prediction,
    grown_iterations,
    mgrit_configs,
    npt_step_seconds,
    partition_config,
    partition_seconds,
    predict_mgrit,
    predict_npt,
    predict_partition,
)
from daskann.plan._report import FINETUNE_FRACTION, METHODS

#: the configurations an MGRIT pilot solve tries: (preset, levels, cfactor)
PILOT_CONFIGS = (("solver2", 2, 4), ("solver2", 3, 4), ("solver1", 2, 4))
PILOT_STEPS = 256


class MethodPlanner(ABC):
    """How the planner predicts, calibrates and runs one training method.

    :func:`plan` asks :meth:`predict` for each worker count; ``--validate``
    picks a configuration the same way, grows its steps (:meth:`at_steps`,
    :meth:`grown_steps`) until a run lasts long enough, then in each round
    times the method's own costs (:meth:`recalibrated`), predicts
    (:meth:`seconds`) and runs it (:meth:`run_seconds`).

    Parameters
    ----------
    finetune_fraction : float
        Share of the steps a method with a fine-tuning phase spends in it.
    prepared : object, optional
        The method's inputs found before a plan (see :meth:`prepare`).
    """

    #: the method's name in the registry and in the plan's rows
    name = ""

    def __init__(self, *, finetune_fraction: float = FINETUNE_FRACTION, prepared=None):
        self.finetune_fraction = finetune_fraction
        self.prepared = prepared

    def prepare(self, net: Network, hidden, X, y, settings: dict, *, iterations: int | None = None) -> None:
        """Find what the prediction needs beyond the net and the cluster (nothing, unless a method says)."""
        return None

    def calibrate(self, client, cluster: ClusterSpec, net: Network) -> None:
        """Time costs of the method's own on the live cluster the plan predicts for (none unless a method says)."""
        return None

    @abstractmethod
    def predict(self, net: Network, cluster: ClusterSpec, p: int) -> Prediction | None:
        """The method's best configuration on ``p`` workers and its time (None where it cannot run)."""

    @abstractmethod
    def seconds(self, net: Network, config: dict, cluster: ClusterSpec, p: int) -> float:
        """Predicted seconds of a run of ``net`` in the configuration ``config``."""

    def at_steps(self, net: Network, config: dict) -> dict:
        """``config`` for ``net`` at its steps (a configuration that counts steps splits them anew)."""
        return dict(config)

    def grown_steps(self, steps: int, predicted: float, seconds: float) -> int:
        """Steps of a run predicted to last ``seconds``, from ``steps`` predicted at ``predicted`` (linear)."""
        return math.ceil(steps * seconds / max(predicted, 1e-9))

    def untimed(self, config: dict) -> dict:
        """``config`` without the costs timed for it (a validation round times them again)."""
        return dict(config)

    def recalibrated(self, client, cluster: ClusterSpec, net: Network, config: dict) -> ClusterSpec:
        """``cluster`` with the method's own costs timed again just before its run."""
        return cluster

    def shown_config(self, config: dict, clusters: list[ClusterSpec]) -> dict:
        """``config`` as a validation row shows it, given the rounds' calibrations."""
        return dict(config)

    @abstractmethod
    def run_seconds(self, client, net: Network, config: dict, hidden, X, y, settings: dict) -> float:
        """Measured seconds of the run :meth:`seconds` predicts, set-up left out alike."""


def planners(methods=METHODS, *, finetune_fraction: float = FINETUNE_FRACTION, prepared=None) -> list[MethodPlanner]:
    """The planners of ``methods`` (names of the registry), each given its entry of ``prepared``."""
    prepared = prepared or {}
    return [
        load(BY_NAME[name].planner)(finetune_fraction=finetune_fraction, prepared=prepared.get(name))
        for name in methods
    ]


def plan(
    net: Network,
    cluster: ClusterSpec,
    *,
    methods=METHODS,
    mgrit_configs_: list[dict] | None = None,
    finetune_fraction: float = FINETUNE_FRACTION,
) -> dict:
    """Every method's prediction on every worker count of ``cluster``, and the fastest of all.

    ``mgrit_configs_`` are MGRIT's configurations, each with its ``iterations``.

    Returns
    -------
    dict
        ``{"predictions": [Prediction.to_dict(), ...], "best": {...}}``.
    """
    prepared = {"mgrit": mgrit_configs_}
    return plan_with(net, cluster, planners(methods, finetune_fraction=finetune_fraction, prepared=prepared))


def plan_with(net: Network, cluster: ClusterSpec, method_planners: list[MethodPlanner]) -> dict:
    """:func:`plan` by the given planners."""
    rows = []
    for planner in method_planners:
        for p in cluster.workers:
            row = planner.predict(net, cluster, p)
            if row is not None:
                rows.append(row.to_dict())
    best = min(rows, key=lambda r: r["seconds"]) if rows else {}
    return {"predictions": rows, "best": best}


class NPTPlanner(MethodPlanner):
    """NPT: the fastest grid and mode of the grid cost model; a run's steps timed without its set-up."""

    name = "npt"

    def predict(self, net, cluster, p):
        return predict_npt(net, cluster, p)

    def seconds(self, net, config, cluster, p):
        shape = tuple(int(n) for n in config["grid"].split("x"))
        return net.steps * npt_step_seconds(net, cluster, p, shape, config["mode"])

    def run_seconds(self, client, net, config, hidden, X, y, settings):
        return net.steps * npt_step_walls(client, hidden, X, y, settings, net.steps, config, repeats=1)


class MGRITPlanner(MethodPlanner):
    """MGRIT: configurations with their iteration counts (``prepared``), each timed on its own graphs.

    Its steps double when a validated run grows (the levels coarsen them), and
    its iterations grow from its pilot's.
    """

    name = "mgrit"

    def prepare(self, net, hidden, X, y, settings, *, iterations=None):
        if iterations is not None:
            self.prepared = [{**c, "iterations": iterations} for c in mgrit_configs(net.steps)]
        else:
            self.prepared = pilot_configs(hidden, X, y, settings, net.steps)

    def calibrate(self, client, cluster, net):
        self.prepared = calibrate_mgrit(client, cluster, net, list(self.prepared or []))

    def predict(self, net, cluster, p):
        return predict_mgrit(net, cluster, p, self.prepared or [])

    def seconds(self, net, config, cluster, p):
        return predict_mgrit(net, cluster, p, [config]).seconds

    def at_steps(self, net, config):
        if "pilot_iterations" not in config:
            return dict(config)
        return {**config, "iterations": grown_iterations(config["pilot_iterations"], config["pilot_steps"], net.steps)}

    def grown_steps(self, steps, predicted, seconds):
        return 2 * steps

    def untimed(self, config):
        return {k: v for k, v in config.items() if k != "task_overhead_s"}

    def recalibrated(self, client, cluster, net, config):
        cost = calibrate_mgrit(client, cluster, net, [config])[0].get("task_overhead_s")
        return cluster if cost is None else replace(cluster, mgrit_task_overhead=cost)

    def shown_config(self, config, clusters):
        return {**config, "task_overhead_s": float(np.median([c.mgrit_task_overhead for c in clusters]))}

    def run_seconds(self, client, net, config, hidden, X, y, settings):
        trainer = fit_mgrit(hidden, X, y, settings, net.steps, config, {"require_convergence": False}, client=client)
        # the first iteration, and the median of the others for each further one: a busy machine stalls single ones
        first, *later = trainer.result_.iteration_times
        return float(first + len(later) * (np.median(later) if later else 0.0))


class PartitionPlanner(MethodPlanner):
    """Partitioned training: the best ``k``; a run's three phases (sub-models, merge, fine-tuning)."""

    name = "partition"

    def predict(self, net, cluster, p):
        return predict_partition(net, cluster, p, finetune_fraction=self.finetune_fraction)

    def seconds(self, net, config, cluster, p):
        return partition_seconds(net, cluster, p, config["k"], self.finetune_fraction)

    def at_steps(self, net, config):
        return partition_config(net, config["k"], self.finetune_fraction)

    def recalibrated(self, client, cluster, net, config):
        # its time is mostly training steps: their costs, then the run's own, timed again
        own = replace(cluster, **step_costs(client, cluster.flop_rate, net))
        return replace(own, partition_overhead=_partition_overhead(client, own, net))

    def run_seconds(self, client, net, config, hidden, X, y, settings):
        return float(partition_phases(client, hidden, X, y, settings, config))


def pilot_configs(hidden, X, y, settings: dict, steps: int, *, pilot_steps: int = PILOT_STEPS) -> list[dict]:
    """MGRIT configurations with their iteration count at ``steps``, from short in-process solves.

    Each of :data:`PILOT_CONFIGS` solves the user's problem for ``pilot_steps``
    steps (or ``steps`` if fewer) in this process; a configuration that
    diverges or does not converge is dropped; the others' counts grow by
    :data:`daskann.plan._model.ITERATION_GROWTH_PER_DOUBLING` per doubling of
    the steps beyond the pilot's.
    """
    n = min(steps, pilot_steps)
    out = []
    for preset, levels, cfactor in PILOT_CONFIGS:
        if n // cfactor ** (levels - 1) < 2:
            continue
        config = {"preset": preset, "levels": levels, "cfactor": cfactor}
        try:
            # the solve whatever it costs (a pilot that does not pay says so: the plan reports it)
            solver = {"require_convergence": False}
            trainer = fit_mgrit(hidden, X, y, settings, n, config, solver, engine={"scheduler": "inprocess"})
        except (MGRITDiverged, FloatingPointError, ValueError):
            continue
        if not trainer.result_.converged:
            continue
        out.append(
            {
                **config,
                "iterations": grown_iterations(trainer.n_iter_, n, steps),
                "pilot_iterations": int(trainer.n_iter_),
                "pilot_steps": n,
            }
        )
    return out


# -- validation: predictions against runs on the live cluster ----------------------------
#: seconds a validated run lasts at least: a shorter one is swung by other load on a shared machine
VALIDATION_SECONDS = 1.0
#: rounds of calibration and validated runs, in turn: their medians are compared
VALIDATION_ROUNDS = 5
#: the validated steps grow at most up to this multiple of the planned ones
MOST_STEPS_FACTOR = 64


def validate(
    client,
    net: Network,
    hidden,
    X,
    y,
    settings: dict,
    method_planners: list[MethodPlanner],
    *,
    rounds: int | None = None,
    seconds: float | None = None,
) -> tuple[list[dict], ClusterSpec]:
    """Run each method at its predicted best configuration; predicted against measured seconds.

    Calibration and measurement take turns for ``rounds`` rounds
    (:data:`VALIDATION_ROUNDS`). Each round measures the cluster afresh
    (:func:`measure_cluster`, whose last pilot is NPT's resident step), and
    each method's own costs again just before its run
    (:meth:`~daskann.plan._planners.MethodPlanner.recalibrated`: MGRIT's task
    cost on its configuration's graphs; partition's training step costs and
    its cost beyond its training); each method is predicted from that
    calibration, then run.
    A busy spell of other work on the machine so hits a prediction and its
    measurement alike; the medians of the rounds' predictions and of their
    measurements are compared.

    The first round's calibration picks each method's configuration (as the
    plan would) and the steps it is validated at: the planned steps, or more
    until the predicted run lasts ``seconds`` (:data:`VALIDATION_SECONDS`; a
    shorter one is swung by other load). Prediction and measurement count
    the same steps and leave the same set-up out: NPT its steps alone (half
    the difference of a run of ``3 * steps`` and one of ``steps``), MGRIT its
    iterations (the first, and the median of the others for each further
    one: a busy machine stalls single iterations), partition its three
    phases (sub-models, merge, fine-tuning).

    Returns
    -------
    rows : list of dict
        ``method``, ``workers``, ``predicted_s``, ``measured_s``, ``steps``
        (the steps validated) and ``config``.
    cluster : ClusterSpec
        The median of the rounds' :func:`measure_cluster` calibrations.
    """
    rounds = VALIDATION_ROUNDS if rounds is None else rounds
    seconds = VALIDATION_SECONDS if seconds is None else seconds
    p = len(worker_addresses(client))
    clusters, checks, predicted, measured, calibrations = [], None, {}, {}, {}
    for _ in range(rounds):
        cluster = measure_cluster(client, net=net)
        clusters.append(cluster)
        if checks is None:
            checks = _checks(client, net, cluster, method_planners, p, seconds)
        for check in checks:
            planner = check.planner
            own = planner.recalibrated(client, cluster, check.net, check.config)
            calibrations.setdefault(check.method, []).append(own)
            predicted.setdefault(check.method, []).append(planner.seconds(check.net, check.config, own, p))
            measured.setdefault(check.method, []).append(
                planner.run_seconds(client, check.net, check.config, hidden, X, y, settings)
            )
    return [_row(check, p, predicted, measured, calibrations) for check in checks], _median_cluster(clusters)


def _row(check, p: int, predicted: dict, measured: dict, calibrations: dict) -> dict:
    """A method's validation row: the medians of its rounds' predictions and measurements."""
    return {
        "method": check.method,
        "workers": p,
        "predicted_s": float(np.median(predicted[check.method])),
        "measured_s": float(np.median(measured[check.method])),
        "steps": check.net.steps,
        "config": check.planner.shown_config(check.config, calibrations[check.method]),
    }


@dataclass(frozen=True)
class _Check:
    """One method's validated run: its planner, its configuration, and ``net`` at the steps it trains."""

    planner: MethodPlanner
    net: Network
    config: dict

    @property
    def method(self) -> str:
        return self.planner.name


def _checks(client, net, cluster, method_planners, p, seconds) -> list[_Check]:
    """Each method's best configuration on ``p`` workers, at steps whose run lasts ``seconds``."""
    out = []
    for planner in method_planners:
        planner.calibrate(client, cluster, net)
        best = planner.predict(net, cluster, p)
        if best is None:
            continue
        check = _long_enough(_Check(planner, net, best.config), cluster, p, seconds)
        # costs timed at the planned steps: each round times them again at the validated ones
        out.append(replace(check, config=planner.untimed(check.config)))
    return out


def _long_enough(check: _Check, cluster, p: int, seconds: float) -> _Check:
    """``check`` with more steps until its predicted run lasts ``seconds`` (at most ``MOST_STEPS_FACTOR`` times)."""
    most = MOST_STEPS_FACTOR * check.net.steps
    for _ in range(16):
        predicted, steps = check.planner.seconds(check.net, check.config, cluster, p), check.net.steps
        if predicted >= seconds or steps >= most:
            break
        grown = check.planner.grown_steps(steps, predicted, seconds)
        check = _at_steps(check, min(max(grown, steps + 1), most))
    return check


def _at_steps(check: _Check, steps: int) -> _Check:
    """``check`` at ``steps``, its configuration as its planner sets it for them."""
    net = replace(check.net, steps=steps)
    return replace(check, net=net, config=check.planner.at_steps(net, check.config))


def _median_cluster(clusters: list[ClusterSpec]) -> ClusterSpec:
    """Each number the median of ``clusters``' (measured in turn with the validated runs)."""
    numbers = {k: float(np.median([getattr(c, k) for c in clusters])) for k in (*REQUIRED, *OPTIONAL)}
    name = clusters[0].name if len(clusters) == 1 else f"{clusters[0].name}, median of {len(clusters)} rounds"
    return replace(clusters[0], **numbers, name=name)
