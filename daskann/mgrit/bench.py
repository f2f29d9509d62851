"""``daskann bench mgrit``: the paper's study of MGRIT over training steps.

Three parts, all on one benchmark problem (:func:`bench_problem`):

1. Iteration study: MGRIT iterations to convergence against the number of
   training steps ``N`` for each preset and for V- and F-cycles, run in this
   process on numpy (the same tasks as on a cluster, without the scheduler),
   with the error of the final weights against serial training.
2. Work model: one fine step costs 1; an iteration costs the critical path
   of its task graph (one task per interval), or its list-schedule makespan
   on ``--workers`` workers, plus one unit for the residual norm. The
   potential speedup is ``N`` over the sum; the paper reports about 13x over
   12,800 steps for its best solver.
3. Wall clock: MGRITTrainer on the cluster at hand against SerialTrainer for
   ``--wall-steps`` steps, medians of ``--repeats`` runs side by side.

Writes ``mgrit-bench.json`` and PNG plots (residual histories, iterations
against N) to ``--output`` and prints a table.
"""

from __future__ import annotations

import json
import platform
import statistics
import time
from pathlib import Path

import click
import numpy as np

from daskann._validation import check_choice, check_float, check_int, invalid
from daskann.data import BatchOrder, make_linear
from daskann.mgrit._errors import MGRITDiverged
from daskann.mgrit.presets import PRESETS, resolve_preset
from daskann.mgrit.propagators import SGDPropagator
from daskann.mgrit.solver import MGRIT
from daskann.nn import MLP
from daskann.serial import SerialTrainer

#: the benchmark problem: small regression MLP, SGD on minibatches of 16
PROBLEM = {
    "n_samples": 512,
    "n_features": 8,
    "n_outputs": 1,
    "noise": 0.1,
    "hidden": (16, 16),
    "activation": "relu",
    "batch_size": 16,
    "seed": 0,
    "loss": "mse",
}
#: learning rate per momentum: the same effective step lr / (1 - momentum)
DEFAULT_LR = {0.0: 1e-3, 0.9: 1e-4}
PAPER_SPEEDUP = 13.0
PAPER_STEPS = 12800


def bench_problem(momentum: float = 0.0, lr: float | None = None) -> dict:
    """Data, network and optimiser settings of the benchmark.

    ``make_linear(512, 8, 1)``, an 8-16-16-1 ReLU network, MSE, batches of
    16, float64; the learning rate keeps ``lr / (1 - momentum)`` at 1e-3
    unless given.
    """
    X, y = make_linear(
        PROBLEM["n_samples"], PROBLEM["n_features"], PROBLEM["n_outputs"], noise=PROBLEM["noise"], seed=PROBLEM["seed"]
    )
    if lr is None:
        lr = DEFAULT_LR.get(momentum, 1e-3 * (1.0 - momentum))
    return {"X": X, "y": y, "lr": float(lr), "momentum": float(momentum), **PROBLEM}


def auto_levels(n_steps: int, cfactor: int, coarsest: int) -> int:
    """Most levels whose coarsest keeps at least ``coarsest`` steps (at least 2 levels)."""
    levels = 1
    while n_steps // cfactor**levels >= coarsest:
        levels += 1
    return max(2, levels)


def _configs(presets, cycles, preset) -> list[tuple[str, str, dict]]:
    configs, seen = [], set()
    for name in presets:
        options = resolve_preset(name)
        key = json.dumps(options, sort_keys=True)
        if key not in seen:
            seen.add(key)
            configs.append((name, name, options))
    for cycle in cycles:
        options = resolve_preset(preset, cycle_type=cycle)
        key = json.dumps(options, sort_keys=True)
        if key not in seen:
            seen.add(key)
            configs.append((f"{preset}/{cycle}-cycle", preset, options))
    return configs


def run_study(problem: dict, n_steps: int, options: dict, *, levels: int, workers: int) -> dict:
    """One in-process MGRIT solve of the benchmark problem, with its work model."""
    net = MLP(
        (problem["n_features"], *problem["hidden"], problem["n_outputs"]),
        activation=problem["activation"],
        seed=problem["seed"],
    )
    order = BatchOrder(problem["n_samples"], problem["batch_size"], seed=problem["seed"])
    prop = SGDPropagator(
        net,
        problem["X"],
        problem["y"],
        loss=problem["loss"],
        order=order,
        lr=problem["lr"],
        momentum=problem["momentum"],
        coarse=options["coarse"],
        alpha_growth=options["alpha_growth"],
        alpha_cap=options["alpha_cap"],
        substeps=options["substeps"],
        coarse_batches=options["coarse_batches"],
    )
    record = {"n_steps": n_steps, "levels": levels}
    start = time.perf_counter()
    try:
        result = MGRIT(
            prop,
            prop.initial_state(net),
            n_steps,
            levels=levels,
            cfactor=options["cfactor"],
            cf_iter=options["cf_iter"],
            cycle_type=options["cycle_type"],
            weight_c=options["weight_c"],
            weight_c_growth=options["weight_c_growth"],
            tol=options["tol"],
            rtol=options["rtol"],
            max_iter=options["max_iter"],
            nested_iteration=options["nested_iteration"],
            intervals_per_task=1,
        ).solve()
    except MGRITDiverged as exc:
        record.update(
            status="diverged",
            iterations=None,
            residuals=exc.residuals,
            diverged_level=exc.level,
            diverged_step=exc.step,
            seconds=time.perf_counter() - start,
        )
        return record
    serial = SerialTrainer(
        problem["hidden"],
        lr=problem["lr"],
        momentum=problem["momentum"],
        batch_size=problem["batch_size"],
        seed=problem["seed"],
        activation=problem["activation"],
        loss=problem["loss"],
    ).fit(problem["X"], problem["y"], steps=n_steps)
    ref = np.concatenate([p.ravel() for p in serial.model_.params])
    got = np.concatenate([a.ravel() for a in result.state[: len(result.state) // 2]])
    record.update(
        status=result.status,
        iterations=result.iterations,
        residuals=result.residuals,
        error=float(np.linalg.norm(got - ref) / np.linalg.norm(ref)),
        speedup_unlimited=result.speedup(),
        speedup_workers=result.speedup(workers),
        work_ratio=float(sum(result.work) / n_steps),
        critical_path=result.critical_path,
        seconds=time.perf_counter() - start,
    )
    return record


def wall_clock(problem: dict, n_steps: int, options: dict, *, levels: int, repeats: int, client) -> dict:
    """Medians of MGRITTrainer on the cluster and SerialTrainer here, run alternately."""
    from daskann.mgrit.trainer import MGRITTrainer

    settings = dict(
        lr=problem["lr"],
        momentum=problem["momentum"],
        batch_size=problem["batch_size"],
        seed=problem["seed"],
        activation=problem["activation"],
        loss=problem["loss"],
    )
    overrides = {k: v for k, v in options.items() if k != "levels"}
    mgrit_times, serial_times, iterations = [], [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        serial = SerialTrainer(problem["hidden"], **settings).fit(problem["X"], problem["y"], steps=n_steps)
        serial_times.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        trainer = MGRITTrainer(
            problem["hidden"], **settings, **overrides, levels=levels, client=client, scheduler="distributed"
        ).fit(problem["X"], problem["y"], steps=n_steps)
        mgrit_times.append(time.perf_counter() - t0)
        iterations.append(trainer.n_iter_)
    ref = np.concatenate([p.ravel() for p in serial.model_.params])
    got = np.concatenate([p.ravel() for p in trainer.model_.params])
    return {
        "n_steps": n_steps,
        "levels": levels,
        "repeats": repeats,
        "iterations": iterations[-1],
        "mgrit_seconds": statistics.median(mgrit_times),
        "serial_seconds": statistics.median(serial_times),
        "speedup": statistics.median(serial_times) / statistics.median(mgrit_times),
        "error": float(np.linalg.norm(got - ref) / np.linalg.norm(ref)),
        "workers": len(client.scheduler_info(n_workers=-1)["workers"]),
    }


def machine_info() -> dict:
    """Machine and BLAS kernel (threadpoolctl) of this process."""
    import dask
    import distributed
    from threadpoolctl import threadpool_info

    return {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "dask": dask.__version__,
        "distributed": distributed.__version__,
        "blas": [
            {k: info.get(k) for k in ("internal_api", "version", "architecture", "num_threads")}
            for info in threadpool_info()
            if info.get("user_api") == "blas"
        ],
    }


def _check(opts: dict) -> dict:
    steps = opts["steps"] or ()
    if not steps:
        raise invalid("steps", opts["steps"], "a comma-separated list of step counts, e.g. 200,800")
    steps = [check_int("steps", n, minimum=2) for n in steps]
    presets = [p.strip() for p in str(opts["presets"]).split(",") if p.strip()]
    for name in presets:
        check_choice("presets", name, tuple(PRESETS))
    cycles = [c.strip() for c in str(opts["cycles"]).split(",") if c.strip()]
    for cycle in cycles:
        check_choice("cycles", cycle, ("V", "F"))
    try:
        momenta = [float(m) for m in str(opts["momenta"]).split(",") if m.strip()]
    except ValueError:
        raise invalid("momentum", opts["momenta"], "comma-separated numbers in [0, 1)") from None
    momenta = [check_float("momentum", m, minimum=0.0, maximum=1.0, max_inclusive=False) for m in momenta]
    if opts["lr"] is not None:
        check_float("lr", opts["lr"], minimum=0.0, min_inclusive=False)
    return {
        "steps": steps,
        "presets": presets,
        "cycles": cycles,
        "momenta": momenta,
        "preset": opts["preset"],
        "coarsest": check_int("coarsest", opts["coarsest"], minimum=1),
        "max_iter": check_int("max_iter", opts["max_iter"]),
        "wall_steps": check_int("wall_steps", opts["wall_steps"], minimum=0),
        "repeats": check_int("repeats", opts["repeats"]),
        "workers": check_int("workers", opts["workers"]),
    }


def main(opts: dict) -> dict:
    """Run the benchmark from the command's options; returns the report."""
    cfg = _check(opts)
    say = (lambda msg: None) if opts.get("quiet") or opts.get("as_json") else (lambda msg: click.echo(msg, err=True))
    output = Path(opts["output"])
    output.mkdir(parents=True, exist_ok=True)
    configs = _configs(cfg["presets"], cfg["cycles"], cfg["preset"])
    report = {
        "machine": machine_info(),
        "problem": {k: (list(v) if isinstance(v, tuple) else v) for k, v in PROBLEM.items()},
        "paper": {"speedup": PAPER_SPEEDUP, "steps": PAPER_STEPS},
        "study": [],
        "wall_clock": [],
    }
    for momentum in cfg["momenta"]:
        problem = bench_problem(momentum, opts["lr"])
        for label, preset, options in configs:
            options = {**options, "max_iter": cfg["max_iter"]}
            for n in cfg["steps"]:
                levels = auto_levels(n, options["cfactor"], cfg["coarsest"])
                say(f"study: momentum {momentum} {label} N={n} levels={levels} ...")
                rec = run_study(problem, n, options, levels=levels, workers=cfg["workers"])
                rec.update(
                    config=label,
                    preset=preset,
                    momentum=momentum,
                    lr=problem["lr"],
                    cycle_type=options["cycle_type"],
                    cf_iter=options["cf_iter"],
                )
                report["study"].append(rec)
                say(f"  -> {rec['status']} iterations={rec['iterations']}")
    if cfg["wall_steps"]:
        from daskann.cluster import client as make_client
        from daskann.cluster import close

        c = make_client(opts.get("address"), n_workers=None if opts.get("address") else cfg["workers"], quiet=True)
        try:
            options = resolve_preset(cfg["preset"], max_iter=cfg["max_iter"])
            for momentum in cfg["momenta"]:
                problem = bench_problem(momentum, opts["lr"])
                levels = auto_levels(cfg["wall_steps"], options["cfactor"], cfg["coarsest"])
                say(f"wall clock: momentum {momentum} N={cfg['wall_steps']} on the cluster ...")
                try:
                    rec = wall_clock(
                        problem, cfg["wall_steps"], options, levels=levels, repeats=cfg["repeats"], client=c
                    )
                except MGRITDiverged as exc:
                    rec = {"n_steps": cfg["wall_steps"], "status": "diverged", "message": str(exc)}
                rec.update(momentum=momentum, config=cfg["preset"])
                report["wall_clock"].append(rec)
        finally:
            close(c)
    report["best"] = best_preset(report["study"], cfg["steps"])
    (output / "mgrit-bench.json").write_text(json.dumps(report, indent=1, default=_json_default))
    report["plots"] = plot(report, output)
    (output / "mgrit-bench.json").write_text(json.dumps(report, indent=1, default=_json_default))
    if opts.get("as_json"):
        click.echo(json.dumps(report, indent=1, default=_json_default))
    else:
        click.echo(format_table(report))
    return report


def best_preset(study: list[dict], steps) -> dict | None:
    """The configuration with the fewest iterations at the largest N (converged everywhere).

    Presets with different stopping tests (``"solver4"`` also stops at a
    relative residual reduction) count iterations to different residuals;
    each record's ``error`` against serial training shows what the count bought.
    """
    by_config: dict = {}
    for rec in study:
        by_config.setdefault((rec["config"], rec["momentum"]), []).append(rec)
    best = None
    for (config, momentum), recs in by_config.items():
        if any(r["status"] != "converged" for r in recs):
            continue
        recs = sorted(recs, key=lambda r: r["n_steps"])
        key = (recs[-1]["iterations"], -recs[-1]["speedup_unlimited"])
        if best is None or key < best[0]:
            best = (key, config, momentum, recs)
    if best is None:
        return None
    _, config, momentum, recs = best
    iters = {r["n_steps"]: r["iterations"] for r in recs}
    growth = None
    if 200 in iters and 3200 in iters:
        growth = iters[3200] / iters[200]
    largest = recs[-1]
    return {
        "config": config,
        "momentum": momentum,
        "iterations": iters,
        "growth_200_3200": growth,
        "max_iterations": max(iters.values()),
        "speedup_unlimited_at_largest": largest["speedup_unlimited"],
        "speedup_workers_at_largest": largest["speedup_workers"],
        "largest_steps": largest["n_steps"],
    }


def format_table(report: dict) -> str:
    lines = [
        "MGRIT over training steps (work model: 1 unit per fine step; in-process solves)",
        f"{'momentum':>8} {'config':>16} {'N':>6} {'L':>2} {'iters':>5} {'error':>9} {'speedup':>8} "
        f"{'spd@p':>6} {'work/N':>7} {'s':>7}",
    ]
    for r in report["study"]:
        if r["status"] == "diverged":
            lines.append(
                f"{r['momentum']:>8} {r['config']:>16} {r['n_steps']:>6} {r['levels']:>2} "
                f"diverged on level {r['diverged_level']} at step {r['diverged_step']}"
            )
            continue
        it = r["iterations"] if r["status"] == "converged" else f">{r['iterations']}"
        lines.append(
            f"{r['momentum']:>8} {r['config']:>16} {r['n_steps']:>6} {r['levels']:>2} {it!s:>5} "
            f"{r['error']:>9.1e} {r['speedup_unlimited']:>8.2f} {r['speedup_workers']:>6.2f} "
            f"{r['work_ratio']:>7.1f} {r['seconds']:>7.1f}"
        )
    for w in report["wall_clock"]:
        if w.get("status") == "diverged":
            lines.append(f"wall clock N={w['n_steps']} momentum {w['momentum']}: {w['message']}")
            continue
        lines.append(
            f"wall clock N={w['n_steps']} momentum {w['momentum']} ({w['workers']} workers, "
            f"{w['iterations']} iterations): MGRIT {w['mgrit_seconds']:.2f} s, serial "
            f"{w['serial_seconds']:.3f} s, speedup {w['speedup']:.3f} (median of {w['repeats']}), "
            f"error {w['error']:.1e}"
        )
    best = report.get("best")
    if best:
        lines.append(
            f"best: {best['config']} (momentum {best['momentum']}): iterations {best['iterations']}, "
            f"growth 200->3200 {_fmt_growth(best['growth_200_3200'])}, work-model speedup "
            f"{best['speedup_unlimited_at_largest']:.2f} at N={best['largest_steps']} "
            f"(paper: about {PAPER_SPEEDUP:g}x at {PAPER_STEPS})"
        )
    lines.append(f"report: {report.get('plots', {}).get('folder', '')}")
    return "\n".join(lines)


def _fmt_growth(growth) -> str:
    return "n/a (needs 200 and 3200 in --steps)" if growth is None else f"{growth:.2f}x"


def plot(report: dict, output: Path) -> dict:
    """Residual histories and iterations against N, as PNG files."""
    return {
        "folder": str(output),
        "iterations": str(_plot_iterations(report["study"], output / "mgrit-iterations.png")),
        "residuals": str(_plot_residuals(report["study"], output / "mgrit-residuals.png")),
    }


def _plot_iterations(study: list[dict], path: Path) -> Path:
    """Iterations to convergence against N, one line per configuration and momentum (log2 N axis)."""
    from matplotlib.ticker import MaxNLocator

    from daskann import _plotting

    fig, (ax,) = _plotting.figure(size=(6, 4))
    by_config: dict = {}
    for r in study:
        if r["status"] == "converged":
            by_config.setdefault((f"{r['config']}, momentum {r['momentum']:g}", _line_style(r)), []).append(
                (r["n_steps"], r["iterations"])
            )
    for (label, style), points in by_config.items():
        points.sort()
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", ls=style, label=label)
    _plotting.count_axis(ax, [r["n_steps"] for r in study])
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylim(bottom=0)
    ax.set_xlabel("training steps N")
    ax.set_ylabel("MGRIT iterations to convergence")
    ax.grid(True, alpha=0.3)
    if by_config:
        ax.legend(fontsize=7)
    ax.set_title("iterations against N")
    return _plotting.save(fig, path, dpi=100)


def _plot_residuals(study: list[dict], path: Path) -> Path:
    """Residual norm against the iteration for every solve."""
    from matplotlib.ticker import MaxNLocator

    from daskann import _plotting

    fig, (ax,) = _plotting.figure(size=(6, 4))
    for r in study:
        if r["residuals"]:
            ax.semilogy(
                range(1, len(r["residuals"]) + 1),
                r["residuals"],
                label=f"{r['config']}, momentum {r['momentum']:g}, N={r['n_steps']}",
                lw=1,
                ls=_line_style(r),
            )
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("iteration")
    ax.set_ylabel("residual norm")
    ax.set_title("residual histories")
    ax.grid(True, alpha=0.3)
    if 0 < len(study) <= 16:
        ax.legend(fontsize=6)
    return _plotting.save(fig, path, dpi=100)


def _line_style(record: dict) -> str:
    """Dashed for F-cycles, so that they stay visible where they match the V-cycle's history."""
    return "--" if record.get("cycle_type") == "F" else "-"


def _json_default(obj):
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, Path):
        return str(obj)
    return str(obj)
