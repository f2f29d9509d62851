"""``daskann train mgrit``, ``daskann bench mgrit`` and MGRIT's part of ``daskann demo``.

The trainer, the cluster and the benchmarks load when a command runs, not
when its options are defined.
"""

from __future__ import annotations

import json
import time
import warnings
from pathlib import Path

import click

from daskann._cli_common import (
    _int_list,
    bench_options,
    cli_errors,
    cluster_options,
    connect,
    data_options,
    option_group,
    output_options,
    report_options,
    run_training,
    summarize,
    training_options,
)
from daskann.exceptions import MGRITDidNotPay
from daskann.mgrit.presets import PRESETS

_RELAXATION = {"F": 0, "FCF": 1, "FCFCF": 2}


_solver_options = option_group(
    click.option(
        "--preset",
        type=click.Choice(sorted(PRESETS)),
        default="solver2",
        show_default=True,
        help="Solver configuration; the options below override it.",
    ),
    click.option("--levels", type=int, default=None, help="Number of MGRIT levels."),
    click.option("--coarsening", "cfactor", type=int, default=None, help="Coarsening factor (>= 2)."),
    click.option("--cycle", "cycle_type", type=click.Choice(["V", "F"]), default=None, help="Cycle type."),
    click.option(
        "--relaxation", type=click.Choice(sorted(_RELAXATION)), default=None, help="F, FCF or FCFCF relaxation."
    ),
    click.option("--weight-c", type=float, default=None, help="C-relaxation weight in (0, 2)."),
    click.option("--tol", type=float, default=None, help="Absolute residual tolerance."),
    click.option("--max-iter", type=int, default=None, help="Most MGRIT iterations."),
    click.option("--nested/--no-nested", "nested_iteration", default=None, help="Nested iteration."),
    click.option("--coarse", type=click.Choice(["scaled", "repeat"]), default=None, help="Coarse propagator."),
    click.option(
        "--alpha-cap",
        type=float,
        default=None,
        help="Cap of the coarse learning-rate factor (fine steps per coarse step).",
    ),
    click.option(
        "--alpha-growth",
        type=float,
        default=None,
        help="Coarse learning-rate factor alpha_l = growth**l (default: the span m**l).",
    ),
    click.option(
        "--scheduler",
        type=click.Choice(["distributed", "threads", "sync", "inprocess"]),
        default="distributed",
        show_default=True,
        help="Where the tasks run.",
    ),
    click.option(
        "--intervals-per-task", default="auto", show_default=True, help="Intervals one task relaxes, or 'auto'."
    ),
    click.option(
        "--store",
        type=click.Path(path_type=Path),
        default=None,
        help="Zarr trajectory store (default: inside --output, or temporary).",
    ),
    click.option("--compute-error", is_flag=True, help="Also train serially and record the error per iteration."),
)


def _trainer_kwargs(opts: dict) -> dict:
    per_task = opts["intervals_per_task"]
    if per_task != "auto":
        try:
            per_task = int(per_task)
        except ValueError:
            raise click.BadParameter(
                f"{per_task!r} is not an integer or 'auto'", param_hint="--intervals-per-task"
            ) from None
    names = ("levels", "cfactor", "cycle_type", "weight_c", "tol", "max_iter", "nested_iteration", "coarse")
    # a flag left out keeps the preset's value: only the flags given become solver options
    solver = {name: opts[name] for name in (*names, "alpha_cap", "alpha_growth") if opts[name] is not None}
    if opts["relaxation"] is not None:
        solver["cf_iter"] = _RELAXATION[opts["relaxation"]]
    if opts["compute_error"]:
        solver["compute_error"] = True
    engine = {"scheduler": opts["scheduler"], "intervals_per_task": per_task, "store": opts["store"]}
    return {"preset": opts["preset"], "solver": solver, "engine": engine}


def mgrit_summary(trainer) -> dict:
    """Figures an MGRIT run adds to the common summary (JSON-safe)."""
    result = trainer.result_
    extra = {
        "iterations": result.iterations,
        "converged": result.converged,
        "final_residual": result.residuals[-1] if result.residuals else None,
        "levels": [lvl["points"] for lvl in result.levels],
        "executor": result.executor,
        "speedup_work_model": round(result.speedup(), 3) if result.critical_path else None,
    }
    if result.ended:
        # the summary says what the MGRITDidNotPay warning would
        path = sum(a.critical_path for a in result.adaptations)
        extra["ended"] = result.ended
        extra["attempts"] = [f"{a.change or 'as configured'}: {a.outcome}" for a in result.adaptations]
        extra["paid"] = result.ended not in ("serial-fallback", "serial-predicted") and path < result.n_steps
    forecast = result.forecast
    if forecast is not None:
        pilot = forecast.get("pilot")
        decisive = pilot if pilot is not None and result.ended == "serial-predicted" else forecast
        extra["predicted_speedup"] = round(decisive["speedup"], 3)
        if result.ended == "serial-predicted":
            extra["why_serial"] = decisive["reason"]
    if "error" in trainer.history_:
        extra["error_vs_serial"] = float(trainer.history_["error"].values[-1])
    return extra


@click.command("mgrit")
@training_options
@_solver_options
@data_options
@output_options
@cluster_options
@cli_errors
def train_command(**opts):
    """MGRIT over training steps: every SGD step solved at once by multigrid in time."""
    from daskann.cluster import close
    from daskann.mgrit.trainer import MGRITTrainer

    kwargs = _trainer_kwargs(opts)
    # options that need no data are checked before the data loads and a cluster starts
    MGRITTrainer(opts["hidden"] or (64,), **kwargs)._solver_options()
    state = {"client": None}

    def make(settings, dataset):
        if kwargs["engine"]["scheduler"] == "distributed":
            state["client"] = connect(opts, quiet=bool(opts.get("quiet") or opts.get("as_json")))
        return MGRITTrainer(**settings, **kwargs, client=state["client"])

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", MGRITDidNotPay)  # reported by the summary's "ended" and "paid"
            run_training(make, opts, method="mgrit", extra=mgrit_summary)
    finally:
        if state["client"] is not None:
            close(state["client"])


@click.command("mgrit")
@click.option(
    "--steps",
    "steps",
    default="200,800,3200,12800",
    show_default=True,
    callback=_int_list,
    help="Numbers of training steps of the iteration study, comma-separated.",
)
@click.option(
    "--presets",
    default="solver1,solver2,solver3,solver4",
    show_default=True,
    help="Presets of the iteration study, comma-separated.",
)
@click.option(
    "--cycles",
    default="V,F",
    show_default=True,
    help="Cycle types run with the --preset configuration, comma-separated.",
)
@click.option(
    "--preset",
    type=click.Choice(sorted(PRESETS)),
    default="solver2",
    show_default=True,
    help="Configuration of the cycle comparison and of the wall-clock run.",
)
@click.option(
    "--momentum", "momenta", default="0.0", show_default=True, help="SGD momenta of the study, comma-separated."
)
@click.option("--lr", type=float, default=None, help="Learning rate (default: the benchmark problem's).")
@click.option(
    "--coarsest",
    type=int,
    default=12,
    show_default=True,
    help="Levels are added while the coarsest level keeps at least this many steps.",
)
@click.option("--max-iter", type=int, default=40, show_default=True)
@click.option(
    "--wall-steps",
    type=int,
    default=256,
    show_default=True,
    help="Training steps of the wall-clock comparison on the cluster (0 skips it).",
)
@click.option("--repeats", type=int, default=3, show_default=True, help="Repeats of the wall-clock runs (medians).")
@bench_options(
    workers_help="Workers of the embedded cluster and of the work model's finite-worker speedup.",
    output="bench-results/mgrit",
    output_help="Folder for the JSON report and the PNG plots.",
)
@click.option(
    "--paper",
    is_flag=True,
    help="Reproduce the paper's Tables 1-16 and Figures 6-7 on its two model problems instead "
    "(writes bench-mgrit-paper.json, a zarr store and two PNGs).",
)
@click.option("--max-steps", type=int, default=None, help="With --paper: skip the entries with more training steps.")
@click.option(
    "--tables", default=None, callback=_int_list, help="With --paper: table numbers to run, comma-separated (all)."
)
@click.option(
    "--double-phi",
    type=click.Choice(["none", "split", "repeat"]),
    default="none",
    show_default=True,
    help="With --paper: coarse steps as two applications of Phi at alpha/2 (split) or at alpha (repeat).",
)
@click.option(
    "--grid",
    is_flag=True,
    help="The ordinary-SGD grid instead: lr {1e-3, 1e-2, 5e-2} x momentum {0, 0.9} x linear, digits, MNIST-1D, "
    "adaptive fits against serial training (writes bench-mgrit-grid.json).",
)
@click.option("--grid-presets", default="solver2", show_default=True, help="With --grid: presets, comma-separated.")
@click.option("--grid-steps", type=int, default=256, show_default=True, help="With --grid: training steps.")
@click.option(
    "--efficiency",
    default=None,
    help="The execution study instead: networks as dash-separated layer sizes, comma-separated (e.g. "
    "256-512-512-10,64-128-128-10,784-512-512-10), --wall-steps steps each; reports the in-process solve's "
    "work-model efficiency and the cluster's parallel efficiency (writes mgrit-efficiency.json).",
)
@report_options
@cli_errors
def bench_command(**opts):
    """Iterations against training steps, work-model speedup and wall clock against serial training."""
    if opts["grid"]:
        from daskann.bench import mgrit_grid  # the benchmarks load on first use

        mgrit_grid.main(opts, echo=click.echo)
    elif opts["paper"]:
        from daskann.bench import mgrit_tables  # the benchmarks load on first use

        mgrit_tables.paper_main(opts, echo=click.echo)
    elif opts["efficiency"]:
        _efficiency(opts)
    else:
        _study(opts)


def _say(opts: dict):
    """Progress lines on standard error, none with ``--quiet`` or ``--json``."""
    return (lambda msg: None) if opts.get("quiet") or opts.get("as_json") else (lambda msg: click.echo(msg, err=True))


def _run_study(opts: dict, study, config, *, cluster: bool = True) -> dict:
    """``study.run`` of ``config`` on a cluster of its own (None without ``cluster``), closed afterwards."""
    from daskann.cluster import client as make_client
    from daskann.cluster import close

    Path(opts["output"]).mkdir(parents=True, exist_ok=True)
    address = opts.get("address")
    c = make_client(address, n_workers=None if address else opts["workers"], quiet=True) if cluster else None
    try:
        return study.run(c, config, say=_say(opts))
    finally:
        if c is not None:
            close(c)


def _echo_report(opts: dict, report: dict, table) -> None:
    """The report as JSON with ``--json``, else as ``table(report)``."""
    from daskann._json import json_default

    click.echo(json.dumps(report, indent=1, default=json_default) if opts.get("as_json") else table(report))


def _study(opts: dict) -> None:
    """The iteration study and the wall-clock comparison: ``mgrit-bench.json`` and two plots."""
    from daskann.bench import mgrit  # the benchmarks load on first use

    config = mgrit.StudyConfig.from_options(**opts)
    report = _run_study(opts, mgrit, config, cluster=bool(config.wall_steps))
    mgrit.write_outputs(report, opts["output"])
    _echo_report(opts, report, mgrit.format_table)


def _efficiency(opts: dict) -> None:
    """The execution study: ``mgrit-efficiency.json``."""
    from daskann._json import json_default, write_json
    from daskann.bench import mgrit_efficiency  # the benchmarks load on first use

    report = _run_study(opts, mgrit_efficiency, mgrit_efficiency.EfficiencyConfig.from_options(**opts))
    write_json(report, Path(opts["output"]) / mgrit_efficiency.EFFICIENCY_JSON, default=json_default)
    _echo_report(opts, report, mgrit_efficiency.format_efficiency)


def run_demo(client=None, *, quick: bool = False) -> dict:
    """Train an 8-16-16-1 regression MLP for 256 steps by MGRIT on the cluster.

    Solver preset ``"solver2"`` (V-cycles, FCF relaxation, 3 levels,
    coarsening 4), float64; the serial run with the same settings is trained
    too, and the summary reports the MGRIT iterations and the relative error
    of the final weights against it. About 20 s on 2 workers
    (``quick=True``: 64 steps, a few seconds).

    Parameters
    ----------
    client : distributed.Client, optional
        Default: the current client, else an embedded LocalCluster.
    quick : bool
        A smaller run for tests.

    Returns
    -------
    dict
        The run's summary (as ``daskann train mgrit --json``).
    """
    import dask

    from daskann.data import load_dataset
    from daskann.mgrit.trainer import MGRITTrainer

    steps = 64 if quick else 256
    data = load_dataset("linear", n_samples=640, n_features=8, n_outputs=1, seed=0)
    trainer = MGRITTrainer(
        (16, 16),
        loss=data.loss,
        lr=1e-3,
        batch_size=16,
        seed=0,
        preset="solver2",
        solver={"levels": 3, "cfactor": 4, "compute_error": True},
        engine={"intervals_per_task": 8},
        client=client,
    )
    start = time.perf_counter()
    # the demo shows the solver at work, whatever it costs: the summary's "ended" and "paid" say whether it paid
    with warnings.catch_warnings(), dask.config.set({"daskann.mgrit.solve": "study"}):
        warnings.simplefilter("ignore", MGRITDidNotPay)
        trainer.fit(data.X_train, data.y_train, steps=steps, validation_data=(data.X_val, data.y_val))
    return summarize(trainer, data, method="mgrit", seconds=time.perf_counter() - start, extra=mgrit_summary(trainer))
