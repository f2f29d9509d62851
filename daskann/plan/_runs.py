"""The planner's validation of its predictions on a live cluster."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from daskann.cluster import worker_addresses
from daskann.plan._cluster import OPTIONAL, REQUIRED, ClusterSpec
from daskann.plan._measure import measure_cluster
from daskann.plan._model import Network
from daskann.plan._planners import MethodPlanner

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
