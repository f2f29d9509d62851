"""Each method as ``daskann plan`` sees it: how to predict, calibrate, validate and run it.

A method's entry in :mod:`daskann._methods` names its planner, a :class:`MethodPlanner`
subclass; :func:`plan`, ``daskann plan`` and ``--validate`` call only its hooks, so a new
method is planned by writing one class (in its own folder) and naming it in its entry.
The three planners below use the models of :mod:`daskann.plan._model` and the timings of
:mod:`daskann.plan._measure`.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import replace

import numpy as np

from daskann._methods import BY_NAME, load
from daskann.exceptions import MGRITDiverged
from daskann.plan._cluster import ClusterSpec
from daskann.plan._measure import (
    _partition_overhead,
    calibrate_mgrit,
    fit_mgrit,
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
