"""The planner's runs: MGRIT's pilot solve, and the validation of predictions on a live cluster."""

from __future__ import annotations

import math
import time
import warnings
from dataclasses import dataclass, replace

import dask
import numpy as np

from daskann.cluster import worker_addresses
from daskann.exceptions import MGRITDiverged
from daskann.mgrit import MGRITTrainer
from daskann.partition import PartitionTrainer
from daskann.plan._cluster import OPTIONAL, REQUIRED, ClusterSpec
from daskann.plan._measure import _partition_overhead, calibrate_mgrit, measure_cluster, npt_step_walls, step_costs
from daskann.plan._model import (
    FINETUNE_FRACTION,
    Network,
    grown_iterations,
    npt_step_seconds,
    partition_config,
    partition_seconds,
    predict_mgrit,
    predict_npt,
    predict_partition,
)

#: the configurations a pilot solve tries: (preset, levels, cfactor)
PILOT_CONFIGS = (("solver2", 2, 4), ("solver2", 3, 4), ("solver1", 2, 4))
PILOT_STEPS = 256
#: seconds a validated run lasts at least: a shorter one is swung by other load on a shared machine
VALIDATION_SECONDS = 1.0
#: rounds of calibration and validated runs, in turn: their medians are compared
VALIDATION_ROUNDS = 5
#: the validated steps grow at most up to this multiple of the planned ones
MOST_STEPS_FACTOR = 64


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
        trainer = MGRITTrainer(
            hidden,
            **settings,
            preset=preset,
            solver={"levels": levels, "cfactor": cfactor, "require_convergence": False},
            engine={"scheduler": "inprocess"},
        )
        try:
            # the solve whatever it costs (a pilot that does not pay says so: the plan reports it)
            with warnings.catch_warnings(), dask.config.set({"daskann.mgrit.solve": "study"}):
                warnings.simplefilter("ignore")
                trainer.fit(X, y, steps=n)
        except (MGRITDiverged, FloatingPointError, ValueError):
            continue
        if not trainer.result_.converged:
            continue
        config = {"preset": preset, "levels": levels, "cfactor": cfactor}
        out.append(
            {
                **config,
                "iterations": grown_iterations(trainer.n_iter_, n, steps),
                "pilot_iterations": int(trainer.n_iter_),
                "pilot_steps": n,
            }
        )
    return out


def validate(
    client,
    net: Network,
    hidden,
    X,
    y,
    settings: dict,
    configs,
    *,
    methods,
    finetune_fraction: float = FINETUNE_FRACTION,
    rounds: int | None = None,
    seconds: float | None = None,
) -> tuple[list[dict], ClusterSpec]:
    """Run each method at its predicted best configuration; predicted against measured seconds.

    Calibration and measurement take turns for ``rounds`` rounds
    (:data:`VALIDATION_ROUNDS`). Each round measures the cluster afresh
    (:func:`measure_cluster`, whose last pilot is NPT's resident step), and
    each method's own costs again just before its run (MGRIT's task cost on
    its configuration's graphs; partition's training step costs and its
    cost beyond its training); each method is predicted from that
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
            checks = _checks(client, net, cluster, configs, p, methods, finetune_fraction, seconds)
        for check in checks:
            own = _recalibrated(client, cluster, check)
            calibrations.setdefault(check.method, []).append(own)
            predicted.setdefault(check.method, []).append(_predict(check, own, p, finetune_fraction))
            measured.setdefault(check.method, []).append(_measure(client, check, hidden, X, y, settings))
    return [_row(check, p, predicted, measured, calibrations) for check in checks], _median_cluster(clusters)


def _row(check, p: int, predicted: dict, measured: dict, calibrations: dict) -> dict:
    """A method's validation row: the medians of its rounds' predictions and measurements."""
    return {
        "method": check.method,
        "workers": p,
        "predicted_s": float(np.median(predicted[check.method])),
        "measured_s": float(np.median(measured[check.method])),
        "steps": check.net.steps,
        "config": _config_of(check, calibrations[check.method]),
    }


@dataclass(frozen=True)
class _Check:
    """One method's validated run: its configuration, and ``net`` at the steps it trains."""

    method: str
    net: Network
    config: dict


def _checks(client, net, cluster, configs, p, methods, finetune_fraction, seconds) -> list[_Check]:
    """Each method's best configuration on ``p`` workers, at steps whose run lasts ``seconds``."""
    out = []
    for method in methods:
        own = cluster
        if method == "npt":
            best = predict_npt(net, cluster, p)
        elif method == "mgrit":
            best = predict_mgrit(net, cluster, p, calibrate_mgrit(client, cluster, net, configs))
            if best is not None and "task_overhead_s" in best.config:
                own = replace(cluster, mgrit_task_overhead=best.config["task_overhead_s"])
        else:
            best = predict_partition(net, cluster, p, finetune_fraction=finetune_fraction)
        if best is None:
            continue
        # a task cost timed at the planned steps: each round times it again at the validated ones
        config = {k: v for k, v in best.config.items() if k != "task_overhead_s"}
        out.append(_long_enough(_Check(method, net, config), own, p, finetune_fraction, seconds))
    return out


def _long_enough(check: _Check, cluster, p: int, finetune_fraction: float, seconds: float) -> _Check:
    """``check`` with more steps until its predicted run lasts ``seconds`` (at most ``MOST_STEPS_FACTOR`` times)."""
    most = MOST_STEPS_FACTOR * check.net.steps
    for _ in range(16):
        predicted, steps = _predict(check, cluster, p, finetune_fraction), check.net.steps
        if predicted >= seconds or steps >= most:
            break
        # MGRIT's levels coarsen the steps: doubled; the others' time grows with them about linearly
        grown = 2 * steps if check.method == "mgrit" else math.ceil(steps * seconds / max(predicted, 1e-9))
        check = _at_steps(check, min(max(grown, steps + 1), most), finetune_fraction)
    return check


def _at_steps(check: _Check, steps: int, finetune_fraction: float) -> _Check:
    """``check`` at ``steps``: partition's phases split them anew, MGRIT's iterations grow from its pilot's."""
    net, config = replace(check.net, steps=steps), dict(check.config)
    if check.method == "partition":
        config = partition_config(net, config["k"], finetune_fraction)
    elif check.method == "mgrit" and "pilot_iterations" in config:
        config["iterations"] = grown_iterations(config["pilot_iterations"], config["pilot_steps"], steps)
    return replace(check, net=net, config=config)


def _recalibrated(client, cluster: ClusterSpec, check: _Check) -> ClusterSpec:
    """``cluster`` with ``check``'s own costs timed again just before its run (NPT's are ``cluster``'s last pilot)."""
    if check.method == "mgrit":
        cost = calibrate_mgrit(client, cluster, check.net, [check.config])[0].get("task_overhead_s")
        return cluster if cost is None else replace(cluster, mgrit_task_overhead=cost)
    if check.method == "partition":
        # its time is mostly training steps: their costs, then the run's own, timed again
        own = replace(cluster, **step_costs(client, cluster.flop_rate, check.net))
        return replace(own, partition_overhead=_partition_overhead(client, own, check.net))
    return cluster


def _config_of(check: _Check, clusters: list[ClusterSpec]) -> dict:
    """``check``'s configuration, with MGRIT's median task cost as the plan shows it."""
    if check.method != "mgrit":
        return dict(check.config)
    return {**check.config, "task_overhead_s": float(np.median([c.mgrit_task_overhead for c in clusters]))}


def _predict(check: _Check, cluster: ClusterSpec, p: int, finetune_fraction: float) -> float:
    """Predicted seconds of ``check``'s run from the calibration ``cluster``."""
    net, config = check.net, check.config
    if check.method == "npt":
        shape = tuple(int(n) for n in config["grid"].split("x"))
        return net.steps * npt_step_seconds(net, cluster, p, shape, config["mode"])
    if check.method == "mgrit":
        return predict_mgrit(net, cluster, p, [config]).seconds
    return partition_seconds(net, cluster, p, config["k"], finetune_fraction)


def _measure(client, check: _Check, hidden, X, y, settings) -> float:
    """Measured seconds of ``check``'s run: what :func:`_predict` predicts, set-up left out alike."""
    steps, config = check.net.steps, check.config
    if check.method == "npt":
        return steps * npt_step_walls(client, hidden, X, y, settings, steps, config, repeats=1)
    if check.method == "mgrit":
        return _run_mgrit(client, hidden, X, y, settings, steps, config)
    return _run_partition(client, hidden, X, y, settings, config, repeats=1)


def _median_cluster(clusters: list[ClusterSpec]) -> ClusterSpec:
    """Each number the median of ``clusters``' (measured in turn with the validated runs)."""
    numbers = {k: float(np.median([getattr(c, k) for c in clusters])) for k in (*REQUIRED, *OPTIONAL)}
    name = clusters[0].name if len(clusters) == 1 else f"{clusters[0].name}, median of {len(clusters)} rounds"
    return replace(clusters[0], **numbers, name=name)


def _run_mgrit(client, hidden, X, y, settings, steps, config) -> float:
    trainer = MGRITTrainer(
        hidden,
        **settings,
        preset=config["preset"],
        solver={"levels": config["levels"], "cfactor": config["cfactor"], "require_convergence": False},
        client=client,
    )
    with warnings.catch_warnings(), dask.config.set({"daskann.mgrit.solve": "study"}):  # the solve it predicted
        warnings.simplefilter("ignore")
        trainer.fit(X, y, steps=steps)
    first, *later = trainer.result_.iteration_times
    return float(first + len(later) * (np.median(later) if later else 0.0))


def _run_partition(client, hidden, X, y, settings, config, *, repeats: int = 3) -> float:
    spent = []
    for _ in range(repeats):
        trainer = PartitionTrainer(
            hidden, **settings, k=config["k"], split={"sub_steps": config["sub_steps"]}, client=client
        )
        t0 = time.perf_counter()
        trainer.fit(X, y, steps=config["finetune_steps"])
        timings = trainer.timings_
        phases = timings.get("submodel", 0.0) + timings.get("merge", 0.0) + timings.get("finetune", 0.0)
        spent.append(phases or time.perf_counter() - t0)
    return float(np.median(spent))
