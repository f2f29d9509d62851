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
import warnings
from pathlib import Path

import click
import numpy as np

from daskann._validation import check_choice, check_float, check_int, invalid
from daskann.cluster import worker_addresses
from daskann.data import BatchOrder, make_linear
from daskann.exceptions import MGRITDidNotPay
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
        sgd={"momentum": problem["momentum"]},
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
    """Medians of MGRITTrainer on the cluster, in this process and SerialTrainer, run alternately.

    Besides the speedup over serial training, two efficiencies of the
    execution (medians of the solves' ``result_.solve_time``):

    ``work_model_efficiency``
        ``sum(result_.work) * serial_step / t_inprocess``: how close the
        in-process solve comes to its own work model (1 is every work unit at
        the cost of one serial step and nothing else).
    ``later_iterations_efficiency``
        The work-model efficiency of the in-process solve's iterations from
        the third on (``result_.work`` against ``result_.iteration_times``):
        the first two also write the trajectory's memory for the first time.
    ``parallel_efficiency``
        ``t_inprocess / (workers * t_cluster)``: the cluster's solve against
        the in-process one.
    """
    from daskann.mgrit.trainer import MGRITTrainer

    settings = dict(
        lr=problem["lr"],
        sgd={"momentum": problem["momentum"]},
        batch_size=problem["batch_size"],
        seed=problem["seed"],
        activation=problem["activation"],
        loss=problem["loss"],
    )
    solver = {**options, "levels": levels}
    times: dict[str, list] = {"mgrit": [], "serial": [], "inprocess_solve": [], "cluster_solve": []}
    iterations, later = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        serial = SerialTrainer(problem["hidden"], **settings).fit(problem["X"], problem["y"], steps=n_steps)
        times["serial"].append(time.perf_counter() - t0)
        local = MGRITTrainer(problem["hidden"], **settings, solver=solver, engine={"scheduler": "inprocess"})
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", MGRITDidNotPay)  # the work model is what is measured here
            local.fit(problem["X"], problem["y"], steps=n_steps)
            t0 = time.perf_counter()
            trainer = MGRITTrainer(
                problem["hidden"], **settings, solver=solver, engine={"scheduler": "distributed"}, client=client
            ).fit(problem["X"], problem["y"], steps=n_steps)
        times["mgrit"].append(time.perf_counter() - t0)
        times["inprocess_solve"].append(local.result_.solve_time)
        later.append(_later_iterations(local.result_, times["serial"][-1] / n_steps))
        times["cluster_solve"].append(trainer.result_.solve_time)
        iterations.append(trainer.n_iter_)
    ref = np.concatenate([p.ravel() for p in serial.model_.params])
    got = np.concatenate([p.ravel() for p in trainer.model_.params])
    med = {k: statistics.median(v) for k, v in times.items()}
    workers = len(worker_addresses(client))
    work = float(sum(trainer.result_.work))
    serial_step = med["serial"] / n_steps
    return {
        "n_steps": n_steps,
        "levels": levels,
        "repeats": repeats,
        "iterations": iterations[-1],
        "mgrit_seconds": med["mgrit"],
        "serial_seconds": med["serial"],
        "speedup": med["serial"] / med["mgrit"],
        "error": float(np.linalg.norm(got - ref) / np.linalg.norm(ref)),
        "workers": workers,
        "work_units": work,
        "serial_step_seconds": serial_step,
        "inprocess_solve_seconds": med["inprocess_solve"],
        "cluster_solve_seconds": med["cluster_solve"],
        "work_model_efficiency": work * serial_step / med["inprocess_solve"],
        "later_iterations_efficiency": statistics.median(later),
        "parallel_efficiency": med["inprocess_solve"] / (workers * med["cluster_solve"]),
        "bit_identical": all(
            np.array_equal(a, b) for a, b in zip(local.model_.params, trainer.model_.params, strict=True)
        ),
    }


def _later_iterations(result, serial_step: float, skip: int = 2) -> float:
    """Work-model efficiency of a solve's iterations after the first ``skip`` (NaN when there are none)."""
    n = min(len(result.work), len(result.iteration_times))
    seconds = sum(result.iteration_times[skip:n])
    return float(sum(result.work[skip:n]) * serial_step / seconds) if seconds > 0 else float("nan")


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
            f"error {w['error']:.1e}, work-model efficiency {w['work_model_efficiency']:.2f} (in-process), "
            f"parallel efficiency {w['parallel_efficiency']:.2f}"
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


# -- the paper's tables (``daskann bench mgrit --paper``) ------------------------------------------------------------

PAPER_JSON = "bench-mgrit-paper.json"


def paper_tables(
    *, max_steps: int | None = None, tables=None, double_phi=False, max_iter: int = 50, say=lambda msg: None
) -> list[dict]:
    """Run the paper's Tables 1-16 (:data:`daskann.mgrit.paper.TABLES`) in this process.

    Parameters
    ----------
    max_steps : int, optional
        Skip the entries with more steps.
    tables : sequence of int, optional
        Table numbers to run (all by default).
    double_phi : {False, "split", "repeat"}
        Coarse steps as two applications of Phi (:func:`daskann.mgrit.presets.paper_options`).
    max_iter : int
        The paper's 50.

    Returns
    -------
    list of dict
        One record per table in the layout of ``bench-mgrit-paper.json``, with
        the paper's iterations (``"paper"``, three-layer tables), the levels,
        residual histories and seconds of each entry besides.
    """
    from threadpoolctl import threadpool_limits

    # the problems are tiny: a multi-threaded BLAS only spins (5x slower measured on 2 busy cores)
    with threadpool_limits(1):
        return _paper_tables(max_steps, tables, double_phi, max_iter, say)


def _paper_tables(max_steps, tables, double_phi, max_iter, say) -> list[dict]:
    from daskann.mgrit import paper

    problems: dict = {}
    records = []
    for spec in paper.TABLES:
        if tables is not None and spec["table"] not in tables:
            continue
        steps = [n for n in spec["steps"] if max_steps is None or n <= max_steps]
        if not steps:
            continue
        prob = problems.get(spec["problem"]) or problems.setdefault(spec["problem"], paper.problem(spec["problem"]))
        rec = {k: spec[k] for k in ("table", "problem", "solver", "cycle", "alpha_b", "alpha_max")}
        rec.update(steps=steps, iterations=[], converged=[], rho=[], potential_speedup=[])
        rec.update(paper=None if spec["paper"] is None else list(spec["paper"][: len(steps)]))
        rec.update(levels=[], residuals=[], seconds=[], double_phi=double_phi)
        for n in steps:
            t0 = time.perf_counter()
            result = paper.solve_paper(
                prob,
                n,
                spec["solver"],
                cycle=spec["cycle"],
                alpha_b=spec["alpha_b"],
                alpha_max=spec["alpha_max"],
                double_phi=double_phi,
                max_iter=max_iter,
            )
            rec["iterations"].append(result.iterations)
            rec["converged"].append(bool(result.converged))
            rec["rho"].append(_finite_or_none(result.rho))
            rec["potential_speedup"].append(_finite_or_none(result.potential_speedup))
            rec["levels"].append(len(result.levels))
            rec["residuals"].append([_finite_or_none(r) for r in result.residuals])
            rec["seconds"].append(time.perf_counter() - t0)
            say(f"table {spec['table']} N={n}: {result.iterations} iterations ({rec['seconds'][-1]:.1f} s)")
        records.append(rec)
    return records


def _finite_or_none(value):
    value = float(value)
    return value if np.isfinite(value) else None


def paper_json(records: list[dict]) -> dict:
    """The ``bench-mgrit-paper.json`` document: the table fields only, in the documented layout."""
    keys = ("table", "problem", "solver", "cycle", "alpha_b", "alpha_max", "steps", "iterations", "converged", "rho")
    return {"tables": [{**{k: rec[k] for k in keys}, "potential_speedup": rec["potential_speedup"]} for rec in records]}


def format_paper_tables(records: list[dict]) -> str:
    """Each table as text: N, the paper's iterations (three-layer), ours, rho and both speedups."""
    lines = []
    for rec in records:
        lines.append(
            f"Table {rec['table']}: {rec['problem']}, {rec['solver']}, {rec['cycle']}, "
            f"alpha_b={rec['alpha_b']:g}, alpha_max={rec['alpha_max']:g}"
            + (f", double_phi={rec['double_phi']}" if rec["double_phi"] else "")
        )
        lines.append(f"  {'N':>6} {'paper':>6} {'ours':>6} {'levels':>6} {'rho':>8} {'speedup':>8}")
        paper_iters = rec["paper"] or [None] * len(rec["steps"])
        for i, n in enumerate(rec["steps"]):
            ref = paper_iters[i] if i < len(paper_iters) else None
            ref_text = "-" if rec["paper"] is None else ("50+" if ref is None else str(ref))
            ours = str(rec["iterations"][i]) if rec["converged"][i] else f"{rec['iterations'][i]}+"
            rho = rec["rho"][i]
            sp = rec["potential_speedup"][i]
            lines.append(
                f"  {n:>6} {ref_text:>6} {ours:>6} {rec['levels'][i]:>6} "
                f"{'-' if rho is None else f'{rho:.3f}':>8} {'-' if sp is None else f'{sp:.2f}':>8}"
            )
    return "\n".join(lines)


def write_paper_zarr(records: list[dict], path: Path) -> Path:
    """The tables as one zarr store, a group ``table<k>`` each (an xarray Dataset over ``steps``)."""
    import xarray as xr

    path = Path(path)
    for rec in records:
        width = max((len(r) for r in rec["residuals"]), default=0)
        residuals = np.full((len(rec["steps"]), width), np.nan)
        for i, history in enumerate(rec["residuals"]):
            residuals[i, : len(history)] = [np.nan if r is None else r for r in history]
        nan = [np.nan if v is None else v for v in rec["rho"]]
        ds = xr.Dataset(
            {
                "iterations": (
                    "steps",
                    np.asarray(rec["iterations"], dtype=np.int64),
                    {"long_name": "MGRIT iterations"},
                ),
                "converged": ("steps", np.asarray(rec["converged"], dtype=bool)),
                "rho": ("steps", np.asarray(nan, dtype=np.float64), {"long_name": "convergence factor"}),
                "potential_speedup": (
                    "steps",
                    np.asarray([np.nan if v is None else v for v in rec["potential_speedup"]], dtype=np.float64),
                    {"long_name": "potential speedup (paper's eqs. 16-17)"},
                ),
                "levels": ("steps", np.asarray(rec["levels"], dtype=np.int64)),
                "seconds": ("steps", np.asarray(rec["seconds"], dtype=np.float64), {"units": "s"}),
                "residual": (("steps", "iteration"), residuals, {"long_name": "residual norm after each iteration"}),
            },
            coords={"steps": np.asarray(rec["steps"], dtype=np.int64), "iteration": np.arange(1, width + 1)},
            attrs={k: rec[k] for k in ("table", "problem", "solver", "cycle", "alpha_b", "alpha_max")}
            | {"double_phi": str(rec["double_phi"])},
        )
        ds.to_zarr(path, group=f"table{rec['table']}", mode="w", consolidated=False)
    return path


def plot_paper_figures(records: list[dict], output: Path) -> dict:
    """Figures 6 (three-layer) and 7 (four-layer): the paper's potential speedup against N."""
    paths = {}
    for number, problem in ((6, "three-layer"), (7, "four-layer")):
        chosen = [r for r in records if r["problem"] == problem]
        if chosen:
            paths[f"figure{number}"] = str(_plot_speedup(chosen, output / f"mgrit-paper-figure{number}.png", number))
    return paths


def _plot_speedup(records: list[dict], path: Path, number: int) -> Path:
    from daskann import _plotting

    fig, (ax,) = _plotting.figure(size=(6, 4))
    steps = []
    for i, rec in enumerate(records):
        points = [
            (n, s)
            for n, s, ok in zip(rec["steps"], rec["potential_speedup"], rec["converged"], strict=True)
            if ok and s
        ]
        if not points:
            continue
        steps += [p[0] for p in points]
        label = f"Table {rec['table']}: {rec['solver']}, {rec['cycle']}, alpha_b={rec['alpha_b']:g}"
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", color=_plotting.colour(i), label=label)
    _plotting.count_axis(ax, steps)
    ax.axhline(1.0, color="grey", lw=0.8, ls=":")
    ax.set_ylim(bottom=0)
    ax.set_xlabel("training steps N")
    ax.set_ylabel("potential speedup N / sigma")
    ax.grid(True, alpha=0.3)
    if steps:
        ax.legend(fontsize=7)
    ax.set_title(f"Figure {number}: {records[0]['problem']} problem")
    return _plotting.save(fig, path, dpi=100)


def paper_main(opts: dict) -> dict:
    """``daskann bench mgrit --paper``: run the tables, print them, write JSON, zarr and the two figures."""
    max_steps = opts.get("max_steps")
    if max_steps is not None:
        max_steps = check_int("max_steps", max_steps, minimum=2)
    tables = opts.get("tables")
    if tables is not None:
        tables = [check_int("tables", t) for t in tables]
        for t in tables:
            if not 1 <= t <= 16:
                raise invalid("tables", t, "table numbers from 1 to 16")
    double_phi = opts.get("double_phi") or False
    double_phi = False if double_phi == "none" else check_choice("double_phi", double_phi, ("split", "repeat"))
    say = (lambda msg: None) if opts.get("quiet") or opts.get("as_json") else (lambda msg: click.echo(msg, err=True))
    output = Path(opts["output"])
    output.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    records = paper_tables(max_steps=max_steps, tables=tables, double_phi=double_phi, say=say)
    document = paper_json(records)
    (output / PAPER_JSON).write_text(json.dumps(document, indent=1))
    write_paper_zarr(records, output / "bench-mgrit-paper.zarr")
    figures = plot_paper_figures(records, output)
    say(f"paper tables: {time.perf_counter() - t0:.1f} s; figures {', '.join(figures.values())}")
    if opts.get("as_json"):
        click.echo(json.dumps(document, indent=1))
    else:
        click.echo(format_paper_tables(records))
    return document


#: the execution study's networks: a 256-512-512-10 ReLU net, a smaller and a larger one (the in-process
#: store holds about 800 states at 256 steps: 6.4 MB each for the first, 10.7 MB for the last)
EFFICIENCY_SIZES = "256-512-512-10,64-128-128-10,784-512-512-10"
EFFICIENCY_JSON = "mgrit-efficiency.json"


def efficiency_main(opts: dict) -> dict:
    """``daskann bench mgrit --efficiency SIZES``: how close MGRIT's execution comes to its work model.

    For each network (:func:`efficiency_problem`), ``--wall-steps`` steps with
    the ``--preset`` configuration, ``--repeats`` times: SerialTrainer, the
    in-process solve and the solve on the cluster (``--workers`` workers or
    ``--address``); reports the work-model efficiency of the in-process solve
    and the parallel efficiency of the cluster's (:func:`wall_clock`), and
    writes ``mgrit-efficiency.json``.
    """
    from daskann.cluster import client as make_client
    from daskann.cluster import close

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
    options = resolve_preset(opts["preset"], max_iter=check_int("max_iter", opts["max_iter"]))
    say = (lambda msg: None) if opts.get("quiet") or opts.get("as_json") else (lambda msg: click.echo(msg, err=True))
    output = Path(opts["output"])
    output.mkdir(parents=True, exist_ok=True)
    report = {"machine": machine_info(), "preset": opts["preset"], "lr": lr, "efficiency": []}
    c = make_client(opts.get("address"), n_workers=None if opts.get("address") else workers, quiet=True)
    try:
        for sizes in nets:
            levels = auto_levels(n_steps, options["cfactor"], coarsest)
            say(f"efficiency: {'-'.join(map(str, sizes))} N={n_steps} levels={levels} ...")
            rec = wall_clock(
                efficiency_problem(sizes, lr=lr), n_steps, options, levels=levels, repeats=repeats, client=c
            )
            report["efficiency"].append({"sizes": list(sizes), **rec})
    finally:
        close(c)
    (output / EFFICIENCY_JSON).write_text(json.dumps(report, indent=1, default=_json_default))
    if opts.get("as_json"):
        click.echo(json.dumps(report, indent=1, default=_json_default))
    else:
        click.echo(format_efficiency(report))
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
