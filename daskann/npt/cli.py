"""``daskann train npt``, ``daskann plan``, ``daskann bench npt`` and NPT's part of ``daskann demo``.

The trainer, the cost model and the benchmarks load when a command runs, not
when its options are defined.
"""

from __future__ import annotations

import json
import time
from typing import get_args

import click

from daskann._cli_common import (
    bench_output_option,
    cli_errors,
    cluster_options,
    connect,
    data_options,
    network_options,
    option_errors,
    output_options,
    run_training,
    summarize,
    training_options,
)
from daskann._json import clean_json
from daskann._validation import NPTMode, NPTPipeline


def mode_option(help: str):
    """``--mode``: graph, resident or auto (the cost model's choice)."""
    return click.option("--mode", type=click.Choice(get_args(NPTMode)), default="auto", show_default=True, help=help)


def _check_grid(ctx, param, value):
    """``--grid`` checked as the command line is read: a bad value fails before the data loads and a cluster starts."""
    from daskann.npt.grid import parse_grid

    with option_errors():
        parse_grid(value)
    return value


def npt_summary(trainer) -> dict:
    """Figures an NPT run adds to the common summary (JSON-safe): the run's grid, and medians of its steps' figures."""
    import numpy as np

    h = trainer.history_
    extra = {
        "grid": f"{trainer.grid_.rows}x{trainer.grid_.cols}",
        "mode": trainer.mode_,
        "workers": len(set(trainer.grid_.workers)),
        "recoveries": int(trainer.recoveries_),
    }
    for name in ("compute_time", "comm_time", "bytes_moved"):
        if name in h:
            finite = h[name].values[~np.isnan(h[name].values)]  # a graph-mode step the task stream missed is NaN
            median = float(np.median(finite)) if finite.size else float("nan")
            extra[f"median_{name}"] = float(f"{median:.6g}")
    return extra


@click.command("npt")
@training_options
@data_options
@output_options
@cluster_options
@click.option(
    "--grid",
    default="auto",
    show_default=True,
    callback=_check_grid,
    help="Process grid: 'auto' (cost model), 'RxC' such as 2x2 or 2x4, or Q for QxQ.",
)
@mode_option("graph: a task per block product; resident: one long-lived task per worker.")
@click.option("--share-workers", is_flag=True, help="Allow a grid with more cells than workers.")
@click.option(
    "--pipeline",
    type=click.Choice(get_args(NPTPipeline)),
    default="auto",
    show_default=True,
    help="Graph mode: tasks per output block (fused, single chain, double-buffered).",
)
@click.option(
    "--timeout", type=float, default=120.0, show_default=True, help="Seconds without progress before training fails."
)
@cli_errors
def train_command(**opts):
    """Network-parallel training: Cannon block products on a grid of workers."""
    from daskann.cluster import close
    from daskann.npt.trainer import NPTTrainer

    client = connect(opts, quiet=bool(opts.get("quiet") or opts.get("as_json")))
    try:
        run_training(
            lambda settings, data: NPTTrainer(
                **settings,
                grid=opts["grid"],
                mode=opts["mode"],
                engine={
                    "share_workers": opts["share_workers"],
                    "pipeline": opts["pipeline"],
                    "timeout": opts["timeout"],
                },
                client=client,
            ),
            opts,
            method="npt",
            extra=npt_summary,
        )
    finally:
        close(client)


@click.command("plan")
@network_options
@mode_option(
    "Mode each grid is ranked by: graph, resident, or auto (the cost model picks per grid, as "
    "NPTTrainer does); the table shows both modes' times either way."
)
@click.option("--json", "as_json", is_flag=True, help="Print the cost model and table as JSON.")
@cluster_options
@cli_errors
def plan_command(hidden, n_features, n_outputs, batch_size, dtype, mode, as_json, **opts):
    """Predict the time per step of each NPT grid on this cluster (the cost model's table)."""
    import numpy as np

    from daskann._validation import check_hidden_sizes, check_int
    from daskann.cluster import close, worker_addresses
    from daskann.npt import costmodel

    sizes = (check_int("n_features", n_features), *check_hidden_sizes(hidden), check_int("n_outputs", n_outputs))
    batch_size = check_int("batch_size", batch_size)
    client = connect(opts, quiet=True)
    try:
        model = costmodel.measure(client)
        n_workers = len(worker_addresses(client))
        table = model.plan(
            sizes,
            batch_size,
            n_workers=n_workers,
            mode=mode,
            itemsize=np.dtype(dtype).itemsize,
        )
    finally:
        close(client)
    if as_json:
        click.echo(
            json.dumps(
                clean_json(
                    {
                        "sizes": list(sizes),
                        "batch_size": batch_size,
                        "workers": n_workers,
                        "cost_model": model.to_dict(),
                        "table": table,
                    }
                ),
                indent=2,
            )
        )
        return
    click.echo(f"net {'-'.join(map(str, sizes))}, batch {batch_size}, {dtype}, on {n_workers} workers")
    click.echo(
        f"measured: {model.rate(1) / 1e9:.3g} GFLOP/s per worker alone, "
        f"{model.rate(n_workers) / 1e9:.3g} with all {n_workers} busy; "
        f"{model.task_cost * 1e3:.3g} ms per task, {model.task_latency * 1e3:.3g} ms per dependent hop; "
        f"messages {model.latency * 1e3:.3g} ms + {model.bandwidth / 2**30:.3g} GiB/s"
    )
    click.echo(costmodel.format_table(table))
    best = table[0]
    click.echo(f"grid='auto' takes {best['grid']} in {best['mode']} mode ({best['predicted_s'] * 1e3:.3g} ms per step)")


@click.command("npt")
@cluster_options
@bench_output_option("bench-npt", "Folder for bench-npt.json, bench-npt.zarr and the PNG plots.")
@click.option(
    "--nets",
    default="one-hidden,two-hidden,two-hidden-256",
    show_default=True,
    help="Paper-scale nets to sweep (comma-separated; empty skips them).",
)
@click.option(
    "--grids",
    default="1x1,1x2,2x2,2x4",
    show_default=True,
    help="Grids of the paper-scale sweep (more cells than workers share workers).",
)
@click.option("--steps", type=int, default=None, help="Timed steps of graph mode and the peer (resident: more).")
@click.option(
    "--large-width", type=int, default=4096, show_default=True, help="Width of the large net's layers (0 skips it)."
)
@click.option(
    "--large-hidden", type=int, default=0, show_default=True, help="Hidden width of the large net (0: --large-width)."
)
@click.option("--large-batch", type=int, default=4096, show_default=True)
@click.option("--large-steps", type=int, default=2, show_default=True)
@click.option(
    "--large-grids",
    default="2x2",
    show_default=True,
    help="Grids of the large net's sweep in graph and resident mode (grid='auto' runs besides; comma-separated).",
)
@click.option(
    "--widths",
    default="256,512,1024,2048",
    show_default=True,
    help="Widths of the resident-versus-serial sweep on 2x2 (empty skips it).",
)
@click.option(
    "--modes",
    default="graph,resident,dask,auto",
    show_default=True,
    help="Which runs: graph, resident, dask (the dask.array peer), auto (grid='auto'); graph-fused, "
    "graph-single and graph-double run graph mode with that pipeline instead of the one it picks.",
)
@click.option("--quick", is_flag=True, help="Small sizes and few steps (a smoke test of the benchmark).")
@click.option(
    "--breakdown",
    is_flag=True,
    help="Per step and worker of the large net's NPT rows: compute, transfer, serialisation and idle seconds "
    "(the JSON's 'breakdown' and a table), and the step's matrix products alone on every worker at once "
    "(the JSON's 'products_alone').",
)
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@cli_errors
def bench_command(output, quick, as_json, **opts):
    """Time per step, speedup and efficiency of NPT against p, against serial and dask.array's @."""
    from daskann.bench import npt, npt_breakdown, npt_checks, npt_output
    from daskann.cluster import close

    bench_keys = ("nets", "grids", "steps", "large_width", "large_hidden", "large_batch", "large_steps")
    config = npt.BenchConfig.from_options(
        **{k: opts.pop(k) for k in (*bench_keys, "large_grids", "widths", "modes", "breakdown")}, quick=quick
    )
    if opts.get("address") is None and opts.get("profile") is None and opts.get("workers") is None:
        opts["workers"] = 4  # enough for the 1x1 .. 2x2 sweep; 2x4 shares them
    client = connect(opts, quiet=True)
    try:
        result = npt.run(client, config, log=(lambda *_: None) if as_json else click.echo)
    finally:
        close(client)
    paths = npt_output.write_outputs(result, output)
    if as_json:
        click.echo(json.dumps(clean_json({**result, "outputs": {k: str(v) for k, v in paths.items()}}), indent=2))
        return
    machine = result["machine"]
    click.echo(
        f"machine: {machine.get('cpu_model')} ({machine['cpu_count']} cpus), {machine['platform']}; "
        f"load {machine.get('load_average')}"
    )
    click.echo(f"BLAS on the workers: {machine.get('blas_worker')}")
    click.echo(npt_output.format_table(result["table"]))
    click.echo(npt_checks.format_checks(result["checks"]))
    if "breakdown" in result:
        click.echo(npt_breakdown.format_breakdown(result["breakdown"]))
    if "products_alone" in result:
        click.echo(npt_breakdown.format_products_alone(result["products_alone"]))
    click.echo("wrote " + ", ".join(str(p) for p in paths.values()))


def run_demo(client) -> dict:
    """Train the 8x8 digits on a 1x2 grid of ``client``'s workers and compare with serial training.

    Resident mode (fast at this size). Returns the summary of
    :func:`daskann._cli_common.summarize` plus the grid, the mode and the
    largest relative difference of the weights from :class:`~daskann.SerialTrainer`
    trained the same way.
    """
    import numpy as np

    from daskann.cluster import worker_addresses
    from daskann.data import load_dataset
    from daskann.npt.trainer import NPTTrainer
    from daskann.serial import SerialTrainer

    data = load_dataset("digits", seed=0)
    n_workers = len(worker_addresses(client))
    grid = "1x2" if n_workers >= 2 else "1x1"
    mode, steps = "resident", 100
    settings = {"loss": "cross_entropy", "lr": 0.1, "batch_size": 32, "seed": 0, "sgd": {"momentum": 0.9}}
    start = time.perf_counter()
    trainer = NPTTrainer((64,), grid=grid, mode=mode, client=client, **settings).fit(
        data.X_train, data.y_train, steps=steps, validation_data=(data.X_val, data.y_val)
    )
    seconds = time.perf_counter() - start
    reference = SerialTrainer((64,), **settings).fit(data.X_train, data.y_train, steps=steps)
    difference = max(
        float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-300))
        for a, b in zip(trainer.model_.params, reference.model_.params, strict=True)
    )
    return summarize(
        trainer,
        data,
        method="npt",
        seconds=seconds,
        extra={
            "grid": grid,
            "mode": trainer.mode_,
            "max_relative_difference_from_serial": float(f"{difference:.3g}"),
        },
    )
