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
import statistics
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import dask
import numpy as np

from daskann import _plotting
from daskann._json import json_default, write_json
from daskann._validation import check_choice, check_float, check_int, invalid
from daskann.bench._report import mgrit_machine
from daskann.cluster import worker_addresses
from daskann.data import BatchOrder, make_linear
from daskann.exceptions import MGRITDidNotPay, MGRITDiverged
from daskann.mgrit.presets import PRESETS, SolverConfig, resolve_preset
from daskann.mgrit.propagators import SGDPropagator
from daskann.mgrit.solver import MGRIT
from daskann.mgrit.trainer import MGRITTrainer
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
    """``(label, preset, options)`` of each preset, then of ``preset`` with each cycle; repeated options once."""
    candidates = [(name, name, resolve_preset(name)) for name in presets]
    candidates += [(f"{preset}/{cycle}-cycle", preset, resolve_preset(preset, cycle_type=cycle)) for cycle in cycles]
    unique: dict = {}
    for label, name, options in candidates:
        unique.setdefault(json.dumps(options, sort_keys=True), (label, name, options))
    return list(unique.values())


def _propagator(problem: dict, options: dict) -> tuple:
    """The benchmark problem's net and its :class:`SGDPropagator` at a preset's ``options``."""
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
        **SolverConfig(**options).propagator_kwargs(),
    )
    return net, prop


def _trainer_settings(problem: dict) -> dict:
    """The trainers' settings of a benchmark problem (its hidden widths apart)."""
    keys = ("lr", "batch_size", "seed", "activation", "loss")
    return {**{k: problem[k] for k in keys}, "sgd": {"momentum": problem["momentum"]}}


def relative_error(params, reference) -> float:
    """``||params - reference|| / ||reference||`` over all the arrays of both, flattened together."""
    got = np.concatenate([p.ravel() for p in params])
    ref = np.concatenate([p.ravel() for p in reference])
    return float(np.linalg.norm(got - ref) / np.linalg.norm(ref))


def run_study(problem: dict, n_steps: int, options: dict, *, levels: int, workers: int) -> dict:
    """One in-process MGRIT solve of the benchmark problem, with its work model."""
    net, prop = _propagator(problem, options)
    record = {"n_steps": n_steps, "levels": levels}
    start = time.perf_counter()
    try:
        config = SolverConfig(**{**options, "levels": levels})
        result = MGRIT.from_config(prop, prop.initial_state(net), n_steps, config, intervals_per_task=1).solve()
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
    serial = SerialTrainer(problem["hidden"], **_trainer_settings(problem))
    serial.fit(problem["X"], problem["y"], steps=n_steps)
    record.update(
        status=result.status,
        iterations=result.iterations,
        residuals=result.residuals,
        error=relative_error(result.state[: len(result.state) // 2], serial.model_.params),
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
    times, later, (serial, local, trainer) = _alternate(
        problem, n_steps, {**options, "levels": levels}, repeats, client
    )
    med = {k: statistics.median(v) for k, v in times.items()}
    workers = len(worker_addresses(client))
    work = float(sum(trainer.result_.work))
    serial_step = med["serial"] / n_steps
    return {
        "n_steps": n_steps,
        "levels": levels,
        "repeats": repeats,
        "iterations": trainer.n_iter_,
        "mgrit_seconds": med["mgrit"],
        "serial_seconds": med["serial"],
        "speedup": med["serial"] / med["mgrit"],
        "error": relative_error(trainer.model_.params, serial.model_.params),
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


def _alternate(problem: dict, n_steps: int, solver: dict, repeats: int, client) -> tuple:
    """``repeats`` rounds of serial training, the in-process solve and the cluster's, in turn.

    Returns the rounds' times (``mgrit``, ``serial``, ``inprocess_solve``,
    ``cluster_solve``), the in-process solves' later-iterations efficiencies,
    and the last round's three fitted trainers.
    """
    settings = _trainer_settings(problem)
    times: dict[str, list] = {"mgrit": [], "serial": [], "inprocess_solve": [], "cluster_solve": []}
    later = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        serial = SerialTrainer(problem["hidden"], **settings).fit(problem["X"], problem["y"], steps=n_steps)
        times["serial"].append(time.perf_counter() - t0)
        local = MGRITTrainer(problem["hidden"], **settings, solver=solver, engine={"scheduler": "inprocess"})
        # the solve whatever it costs: the work model is what is measured here
        with warnings.catch_warnings(), dask.config.set({"daskann.mgrit.solve": "study"}):
            warnings.simplefilter("ignore", MGRITDidNotPay)
            local.fit(problem["X"], problem["y"], steps=n_steps)
            t0 = time.perf_counter()
            trainer = MGRITTrainer(
                problem["hidden"], **settings, solver=solver, engine={"scheduler": "distributed"}, client=client
            ).fit(problem["X"], problem["y"], steps=n_steps)
        times["mgrit"].append(time.perf_counter() - t0)
        times["inprocess_solve"].append(local.result_.solve_time)
        later.append(_later_iterations(local.result_, times["serial"][-1] / n_steps))
        times["cluster_solve"].append(trainer.result_.solve_time)
    return times, later, (serial, local, trainer)


def _later_iterations(result, serial_step: float, skip: int = 2) -> float:
    """Work-model efficiency of a solve's iterations after the first ``skip`` (NaN when there are none)."""
    n = min(len(result.work), len(result.iteration_times))
    seconds = sum(result.iteration_times[skip:n])
    return float(sum(result.work[skip:n]) * serial_step / seconds) if seconds > 0 else float("nan")


@dataclass(frozen=True)
class StudyConfig:
    """What ``daskann bench mgrit`` runs: the iteration study and the wall-clock comparison."""

    steps: tuple
    presets: tuple
    cycles: tuple
    momenta: tuple
    preset: str
    coarsest: int
    max_iter: int
    wall_steps: int
    repeats: int
    workers: int
    lr: float | None = None

    @classmethod
    def from_options(cls, **opts) -> StudyConfig:
        """The command's options, checked before anything runs."""
        steps = opts["steps"] or ()
        if not steps:
            raise invalid("steps", opts["steps"], "a comma-separated list of step counts, e.g. 200,800")
        steps = [check_int("steps", n, minimum=2) for n in steps]
        presets = [check_choice("presets", p, tuple(PRESETS)) for p in _items(opts["presets"])]
        cycles = [check_choice("cycles", c, ("V", "F")) for c in _items(opts["cycles"])]
        try:
            momenta = [float(m) for m in _items(opts["momenta"])]
        except ValueError:
            raise invalid("momentum", opts["momenta"], "comma-separated numbers in [0, 1)") from None
        momenta = [check_float("momentum", m, minimum=0.0, maximum=1.0, max_inclusive=False) for m in momenta]
        if opts["lr"] is not None:
            check_float("lr", opts["lr"], minimum=0.0, min_inclusive=False)
        return cls(
            steps=tuple(steps),
            presets=tuple(presets),
            cycles=tuple(cycles),
            momenta=tuple(momenta),
            preset=opts["preset"],
            coarsest=check_int("coarsest", opts["coarsest"], minimum=1),
            max_iter=check_int("max_iter", opts["max_iter"]),
            wall_steps=check_int("wall_steps", opts["wall_steps"], minimum=0),
            repeats=check_int("repeats", opts["repeats"]),
            workers=check_int("workers", opts["workers"]),
            lr=opts["lr"],
        )


def _items(text) -> list[str]:
    return [v.strip() for v in str(text).split(",") if v.strip()]


def run(client, config: StudyConfig, *, say=lambda msg: None) -> dict:
    """The study in this process, then (``config.wall_steps``) the wall clock on ``client``'s cluster."""
    report = {
        "machine": mgrit_machine(),
        "problem": {k: (list(v) if isinstance(v, tuple) else v) for k, v in PROBLEM.items()},
        "paper": {"speedup": PAPER_SPEEDUP, "steps": PAPER_STEPS},
        "study": _study(config, say),
        "wall_clock": _wall_clocks(client, config, say) if config.wall_steps else [],
    }
    report["best"] = best_preset(report["study"], list(config.steps))
    return report


def _study(config: StudyConfig, say) -> list[dict]:
    records = []
    configs = _configs(list(config.presets), list(config.cycles), config.preset)
    for momentum in config.momenta:
        problem = bench_problem(momentum, config.lr)
        for label, preset, options in configs:
            options = {**options, "max_iter": config.max_iter}
            for n in config.steps:
                levels = auto_levels(n, options["cfactor"], config.coarsest)
                say(f"study: momentum {momentum} {label} N={n} levels={levels} ...")
                rec = run_study(problem, n, options, levels=levels, workers=config.workers)
                rec.update(
                    config=label,
                    preset=preset,
                    momentum=momentum,
                    lr=problem["lr"],
                    cycle_type=options["cycle_type"],
                    cf_iter=options["cf_iter"],
                )
                records.append(rec)
                say(f"  -> {rec['status']} iterations={rec['iterations']}")
    return records


def _wall_clocks(client, config: StudyConfig, say) -> list[dict]:
    records = []
    options = resolve_preset(config.preset, max_iter=config.max_iter)
    for momentum in config.momenta:
        problem = bench_problem(momentum, config.lr)
        levels = auto_levels(config.wall_steps, options["cfactor"], config.coarsest)
        say(f"wall clock: momentum {momentum} N={config.wall_steps} on the cluster ...")
        try:
            rec = wall_clock(problem, config.wall_steps, options, levels=levels, repeats=config.repeats, client=client)
        except MGRITDiverged as exc:
            rec = {"n_steps": config.wall_steps, "status": "diverged", "message": str(exc)}
        rec.update(momentum=momentum, config=config.preset)
        records.append(rec)
    return records


def write_outputs(report: dict, output) -> dict:
    """``mgrit-bench.json`` and the two plots in ``output``; the report gains their paths (``plots``)."""
    output = Path(output)
    output.mkdir(parents=True, exist_ok=True)
    write_json(report, output / "mgrit-bench.json", default=json_default)
    report["plots"] = plot(report, output)
    write_json(report, output / "mgrit-bench.json", default=json_default)
    return report["plots"]


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
    from matplotlib.ticker import MaxNLocator  # matplotlib is optional: imported when plotting

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
    from matplotlib.ticker import MaxNLocator  # matplotlib is optional: imported when plotting

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


__all__ = [
    "PROBLEM",
    "StudyConfig",
    "auto_levels",
    "bench_problem",
    "best_preset",
    "format_table",
    "plot",
    "relative_error",
    "run",
    "run_study",
    "wall_clock",
    "write_outputs",
]
