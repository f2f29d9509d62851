"""``daskann bench mgrit --efficiency``: how close MGRIT's execution comes to its work model.

For each network (:func:`efficiency_problem`), ``--wall-steps`` steps with
the ``--preset`` configuration, ``--repeats`` times: SerialTrainer, the
in-process solve and the solve on the cluster (``--workers`` workers or
``--address``); reports the work-model efficiency of the in-process solve
and the parallel efficiency of the cluster's
(:func:`daskann.bench.mgrit.wall_clock`), in ``mgrit-efficiency.json``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from daskann._validation import check_float, check_int, invalid
from daskann.bench._report import mgrit_machine
from daskann.bench.mgrit import auto_levels, wall_clock
from daskann.mgrit.presets import resolve_preset

#: the execution study's networks: a 256-512-512-10 ReLU net, a smaller and a larger one (the in-process
#: store holds about 800 states at 256 steps: 6.4 MB each for the first, 10.7 MB for the last)
EFFICIENCY_SIZES = "256-512-512-10,64-128-128-10,784-512-512-10"
EFFICIENCY_JSON = "mgrit-efficiency.json"


def efficiency_problem(sizes, *, n_samples: int = 4096, lr: float = 1e-3) -> dict:
    """A classification problem for the execution study: an MLP of layer ``sizes`` (ReLU, cross-entropy).

    ``X`` is standard normal, ``y`` uniform over the ``sizes[-1]`` classes
    (seed 0), batches of 64, SGD without momentum at ``lr``.
    """
    rng = np.random.default_rng(0)
    X = rng.standard_normal((n_samples, sizes[0]))
    y = rng.integers(0, sizes[-1], n_samples)
    return {
        "X": X,
        "y": y,
        "hidden": tuple(sizes[1:-1]),
        "lr": float(lr),
        "momentum": 0.0,
        "batch_size": 64,
        "seed": 0,
        "activation": "relu",
        "loss": "cross_entropy",
    }


def parse_sizes(text: str) -> list[tuple[int, ...]]:
    """``"256-512-512-10,64-128-128-10"`` as layer-size tuples (at least an input and an output each)."""
    nets = []
    for item in str(text).split(","):
        if not item.strip():
            continue
        try:
            sizes = tuple(int(v) for v in item.strip().split("-"))
        except ValueError:
            raise invalid("efficiency", text, "networks as dash-separated layer sizes, e.g. 256-512-512-10") from None
        if len(sizes) < 2 or min(sizes) < 1:
            raise invalid("efficiency", text, "networks of at least two positive layer sizes, e.g. 256-512-512-10")
        nets.append(sizes)
    return nets


@dataclass(frozen=True)
class EfficiencyConfig:
    """The execution study's networks and settings."""

    nets: tuple
    n_steps: int
    repeats: int
    workers: int
    coarsest: int
    lr: float
    preset: str
    max_iter: int

    @classmethod
    def from_options(cls, **opts) -> EfficiencyConfig:
        """The ``daskann bench mgrit --efficiency`` options, checked before anything runs."""
        nets = parse_sizes(opts["efficiency"])
        if not nets:
            raise invalid(
                "efficiency", opts["efficiency"], f"networks as dash-separated layer sizes, e.g. {EFFICIENCY_SIZES}"
            )
        n_steps = check_int("wall_steps", opts["wall_steps"], minimum=2)
        repeats = check_int("repeats", opts["repeats"])
        workers = check_int("workers", opts["workers"])
        coarsest = check_int("coarsest", opts["coarsest"], minimum=1)
        lr = 1e-3 if opts.get("lr") is None else check_float("lr", opts["lr"], minimum=0.0, min_inclusive=False)
        max_iter = check_int("max_iter", opts["max_iter"])
        return cls(tuple(nets), n_steps, repeats, workers, coarsest, lr, opts["preset"], max_iter)


def run(client, config: EfficiencyConfig, *, say=lambda msg: None) -> dict:
    """Every network's wall-clock record on ``client``'s cluster: the ``mgrit-efficiency.json`` document."""
    options = resolve_preset(config.preset, max_iter=config.max_iter)
    report = {"machine": mgrit_machine(), "preset": config.preset, "lr": config.lr, "efficiency": []}
    for sizes in config.nets:
        levels = auto_levels(config.n_steps, options["cfactor"], config.coarsest)
        say(f"efficiency: {'-'.join(map(str, sizes))} N={config.n_steps} levels={levels} ...")
        problem = efficiency_problem(sizes, lr=config.lr)
        rec = wall_clock(problem, config.n_steps, options, levels=levels, repeats=config.repeats, client=client)
        report["efficiency"].append({"sizes": list(sizes), **rec})
    return report


def format_efficiency(report: dict) -> str:
    """The execution study as a table."""
    lines = [
        "MGRIT execution against its work model (medians; solve times)",
        f"{'network':>18} {'N':>5} {'iters':>5} {'work':>7} {'step ms':>8} {'inproc s':>9} {'cluster s':>9} "
        f"{'work-model eff':>14} {'iter 3+':>10} {'parallel eff':>12} {'identical':>9}",
    ]
    for r in report["efficiency"]:
        lines.append(
            f"{'-'.join(map(str, r['sizes'])):>18} {r['n_steps']:>5} {r['iterations']:>5} {r['work_units']:>7.0f} "
            f"{r['serial_step_seconds'] * 1e3:>8.2f} {r['inprocess_solve_seconds']:>9.2f} "
            f"{r['cluster_solve_seconds']:>9.2f} {r['work_model_efficiency']:>14.2f} "
            f"{r.get('later_iterations_efficiency', float('nan')):>10.2f} "
            f"{r['parallel_efficiency']:>12.2f} {r['bit_identical']!s:>9}"
        )
    return "\n".join(lines)


__all__ = [
    "EFFICIENCY_JSON",
    "EFFICIENCY_SIZES",
    "EfficiencyConfig",
    "efficiency_problem",
    "format_efficiency",
    "parse_sizes",
    "run",
]
