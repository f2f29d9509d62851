"""The planner apart from its models: the methods a plan covers, and the plan as text and a PNG.

``daskann plan``'s choices and defaults read the methods and the fine-tuning
share here without loading the cost models (and with them distributed); the
plan it prints is text, or JSON, and a PNG of predicted speedup against workers.
"""

from __future__ import annotations

import math
from pathlib import Path

from daskann import _plotting
from daskann._methods import planned

#: the methods a plan predicts (those whose entry in daskann._methods is planned)
METHODS = planned()
#: share of the steps the merged network is fine-tuned for (the rest trains the sub-models)
FINETUNE_FRACTION = 0.25


def _config_text(config: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in config.items())


def format_plan(plan: dict) -> str:
    """One line per method and worker count, then the fastest of all."""
    lines = [f"{'method':>9} {'workers':>7} {'seconds':>11} {'s/step':>11} {'speedup':>8}  best configuration"]
    for r in plan["predictions"]:
        lines.append(
            f"{r['method']:>9} {r['workers']:>7} {r['seconds']:>11.4g} {r['seconds_per_step']:>11.4g} "
            f"{r['speedup']:>8.3g}  {_config_text(r['config'])}"
        )
    best = plan.get("best")
    if best:
        lines.append(
            f"fastest: {best['method']} on {best['workers']} workers, {best['seconds']:.4g} s "
            f"({best['speedup']:.3g}x serial), {_config_text(best['config'])}"
        )
    return "\n".join(lines)


def format_validation(rows: list[dict]) -> str:
    """Predicted against measured seconds of the steps validated, and how far apart."""
    head = f"{'method':>9} {'workers':>7} {'steps':>6} {'predicted s':>12} {'measured s':>11} {'off':>7}"
    lines = [f"{head}  configuration"]
    for r in rows:
        off = r["predicted_s"] / r["measured_s"] - 1 if r["measured_s"] else math.nan
        lines.append(
            f"{r['method']:>9} {r['workers']:>7} {r.get('steps', ''):>6} {r['predicted_s']:>12.4g} "
            f"{r['measured_s']:>11.4g} {off:>+7.0%}  {_config_text(r.get('config', {}))}"
        )
    return "\n".join(lines)


def plot_speedup(plan: dict, path) -> Path:
    """Predicted speedup over serial training against workers, one line per method (log2 x axis)."""
    fig, (ax,) = _plotting.figure()
    methods = list(dict.fromkeys(r["method"] for r in plan["predictions"]))
    workers = sorted({r["workers"] for r in plan["predictions"]})
    speedups = []
    for i, method in enumerate(methods):
        rows = sorted((r for r in plan["predictions"] if r["method"] == method), key=lambda r: r["workers"])
        xs, ys = [r["workers"] for r in rows], [r["speedup"] for r in rows]
        speedups += ys
        ax.plot(xs, ys, marker="o", color=_plotting.colour(i), label=method)
    ax.axhline(1.0, color="grey", linewidth=0.8, linestyle=":")
    _plotting.count_axis(ax, workers)
    _plotting.log_axis(ax, speedups, include=(1.0,))
    ax.set_xlabel("workers")
    ax.set_ylabel("predicted speedup over serial training")
    nets = sorted({r["net"] for r in plan["predictions"]})
    ax.set_title(f"daskann plan: {', '.join(nets)}")
    ax.legend()
    return _plotting.save(fig, path)
