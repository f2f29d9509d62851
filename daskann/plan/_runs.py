"""The planner's runs: MGRIT's pilot solve, and the validation of predictions on a live cluster."""

from __future__ import annotations

import time
import warnings

import numpy as np

from daskann.plan._cluster import ClusterSpec
from daskann.plan._model import (
    Network,
    grown_iterations,
    predict_mgrit,
    predict_npt,
    predict_partition,
)

#: the configurations a pilot solve tries: (preset, levels, cfactor)
PILOT_CONFIGS = (("solver2", 2, 4), ("solver2", 3, 4), ("solver1", 2, 4))
PILOT_STEPS = 256


def pilot_configs(hidden, X, y, settings: dict, steps: int, *, pilot_steps: int = PILOT_STEPS) -> list[dict]:
    """MGRIT configurations with their iteration count at ``steps``, from short in-process solves.

    Each of :data:`PILOT_CONFIGS` solves the user's problem for ``pilot_steps``
    steps (or ``steps`` if fewer) in this process; a configuration that
    diverges or does not converge is dropped; the others' counts grow by
    :data:`daskann.plan._model.ITERATION_GROWTH_PER_DOUBLING` per doubling of
    the steps beyond the pilot's.
    """
    from daskann.mgrit import MGRITTrainer
    from daskann.mgrit._errors import MGRITDiverged

    n = min(steps, pilot_steps)
    out = []
    for preset, levels, cfactor in PILOT_CONFIGS:
        if n // cfactor ** (levels - 1) < 2:
            continue
        trainer = MGRITTrainer(
            hidden,
            **settings,
            preset=preset,
            levels=levels,
            cfactor=cfactor,
            scheduler="inprocess",
            require_convergence=False,
        )
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # a pilot that does not pay says so: the plan reports it
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


def validate(client, net: Network, hidden, X, y, settings: dict, cluster: ClusterSpec, configs, *, methods) -> list:
    """Run each method briefly at its predicted best configuration; predicted against measured seconds.

    NPT is compared per step (half the difference of a run of ``3 * steps``
    and one of ``steps``, medians of three); MGRIT on the solve's iterations (the first, and the
    median of the others for each further one: a busy machine stalls single
    iterations); partition on its three phases (sub-models, merge,
    fine-tuning), the median of three runs.
    """
    p = len(client.scheduler_info()["workers"])
    rows = []
    for method in methods:
        if method == "npt":
            pred = predict_npt(net, cluster, p)
            measured = _run_npt(client, hidden, X, y, settings, net.steps, pred.config)
        elif method == "mgrit":
            pred = predict_mgrit(net, cluster, p, configs)
            if pred is None:
                continue
            measured = _run_mgrit(client, hidden, X, y, settings, net.steps, pred.config)
        else:
            pred = predict_partition(net, cluster, p)
            if pred is None:
                continue
            measured = _run_partition(client, hidden, X, y, settings, pred.config)
        rows.append(
            {
                "method": method,
                "workers": p,
                "predicted_s": pred.seconds,
                "measured_s": measured,
                "config": pred.config,
            }
        )
    return rows


def _run_npt(client, hidden, X, y, settings, steps, config, *, repeats: int = 3) -> float:
    return steps * npt_step_walls(client, hidden, X, y, settings, steps, config, repeats=repeats)


def npt_step_walls(client, hidden, X, y, settings, steps: int, config, *, repeats: int = 3) -> float:
    """Seconds of one NPT step at ``config`` (grid and mode), its fit's set-up left out.

    Half the difference of a run of ``3 * steps`` and one of ``steps``,
    divided by ``steps``: the set-up both pay (the grid placed, data and
    weights sent, the result gathered) cancels. Each is the median of a few
    runs, short and long in turn, so that a busy spell hits both alike.
    """
    from daskann.npt import NPTTrainer

    runs = {steps: [], 3 * steps: []}
    for _ in range(repeats):
        for n, wall in runs.items():
            trainer = NPTTrainer(hidden, **settings, grid=config["grid"], mode=config["mode"], client=client)
            t0 = time.perf_counter()
            trainer.fit(X, y, steps=n)
            wall.append(time.perf_counter() - t0)
    walls = [float(np.median(wall)) for wall in runs.values()]
    if walls[1] <= walls[0]:  # other load swamped the difference: the longer run's share, set-up included
        return walls[1] / (3 * steps)
    return (walls[1] - walls[0]) / (2 * steps)


def _run_mgrit(client, hidden, X, y, settings, steps, config) -> float:
    from daskann.mgrit import MGRITTrainer

    trainer = MGRITTrainer(
        hidden,
        **settings,
        preset=config["preset"],
        levels=config["levels"],
        cfactor=config["cfactor"],
        client=client,
        require_convergence=False,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(X, y, steps=steps)
    first, *later = trainer.result_.iteration_times
    return float(first + len(later) * (np.median(later) if later else 0.0))


def _run_partition(client, hidden, X, y, settings, config, *, repeats: int = 3) -> float:
    from daskann.partition import PartitionTrainer

    spent = []
    for _ in range(repeats):
        trainer = PartitionTrainer(hidden, **settings, k=config["k"], sub_steps=config["sub_steps"], client=client)
        t0 = time.perf_counter()
        trainer.fit(X, y, steps=config["finetune_steps"])
        timings = trainer.timings_
        phases = timings.get("submodel", 0.0) + timings.get("merge", 0.0) + timings.get("finetune", 0.0)
        spent.append(phases or time.perf_counter() - t0)
    return float(np.median(spent))
