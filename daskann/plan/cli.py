"""``daskann plan``: which method pays for a network, and on how many workers.

The models, the cluster and the data load when the command runs, not when
its options are defined (``daskann --help`` lists this command).
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

import click

from daskann._cli_common import cli_errors, cluster_options, connect, load_data, network_options
from daskann._json import clean_json
from daskann.npt.cli import mode_option
from daskann.npt.cli import plan_command as npt_plan
from daskann.plan._report import FINETUNE_FRACTION, METHODS, format_plan, format_validation, plot_speedup

NETS = ("one-hidden", "two-hidden", "two-hidden-256")


@click.command("plan")
@click.option(
    "--method",
    type=click.Choice([*METHODS, "all"]),
    default=None,
    help="Predict this method (or all three) on every worker count; without it, the NPT grid table of the live "
    "cluster.",
)
@click.option("--net", type=click.Choice(NETS), default=None, help="A paper net (as in 'daskann bench npt').")
@network_options
@mode_option("NPT grid table only: the mode each grid is ranked by.")
@click.option("--dataset", default=None, help="Data set whose size and widths to plan for (see 'daskann train').")
@click.option("--n-samples", type=int, default=1024, show_default=True, help="Training rows (without --dataset).")
@click.option("--steps", type=int, default=None, help="Training steps (default 200).")
@click.option("--epochs", type=int, default=None, help="Training epochs (instead of --steps).")
@click.option("--lr", type=float, default=0.01, show_default=True, help="Learning rate of the pilot and validation.")
@click.option("--momentum", type=float, default=0.0, show_default=True, help="SGD momentum.")
@click.option(
    "--cluster",
    "cluster_file",
    type=click.Path(path_type=Path),
    default=None,
    help="YAML description of a cluster: workers, flop_rate, latency, bandwidth, task_overhead.",
)
@click.option("--measure", is_flag=True, help="Measure the live cluster and write its description to --output.")
@click.option("--output", "-o", type=click.Path(path_type=Path), default=None, help="File --measure writes (YAML).")
@click.option("--validate", is_flag=True, help="Run each method briefly on the live cluster: predicted vs measured.")
@click.option("--iterations", type=int, default=None, help="MGRIT iterations (default: from a pilot solve).")
@click.option(
    "--finetune-fraction",
    type=float,
    default=FINETUNE_FRACTION,
    show_default=True,
    help="Partition: share of the steps spent fine-tuning the merged net.",
)
@click.option("--plot", type=click.Path(path_type=Path), default=None, help="PNG of predicted speedup vs workers.")
@click.option("--json", "as_json", is_flag=True, help="Print the predictions as JSON.")
@cluster_options
@cli_errors
@click.pass_context
def plan_command(ctx, **opts):
    """Predict training time and speedup of NPT, MGRIT and partitioning per worker count.

    Clusters come measured (the live one), described (--cluster FILE.yaml) or
    from a profile's typical values (--profile slurm); a profile without them
    (no 'plan:' mapping) starts its worker jobs and measures them.
    """
    from daskann.plan._planners import plan_with, planners

    settings = _check(opts)
    if opts["method"] is None and not (opts["measure"] or opts["validate"] or opts["cluster_file"]):
        return _npt_table(ctx, opts)
    methods = METHODS if opts["method"] in (None, "all") else (opts["method"],)
    if opts["measure"]:
        _measure(opts)
        if opts["method"] is None:
            return None
    net, hidden, X, y, train = _problem(opts, settings)
    method_planners = planners(methods, finetune_fraction=settings["finetune"])
    for planner in method_planners:  # MGRIT's pilot solves (or its configurations at --iterations)
        planner.prepare(net, hidden, X, y, train, iterations=opts["iterations"])
    if opts["validate"]:
        return _validate(opts, net, hidden, X, y, train, method_planners)
    cluster = _cluster(opts, net, method_planners)

    result = plan_with(net, cluster, method_planners)
    if opts["plot"] is not None and result["predictions"]:
        plot_speedup(result, opts["plot"])
    if opts["as_json"]:
        click.echo(json.dumps(clean_json(result), indent=2))
        return None

    click.echo(
        f"net {net.name} ({'-'.join(map(str, net.sizes))}), batch {net.batch_size}, {net.steps} steps, "
        f"{net.n_samples} rows; cluster {cluster.name}: {cluster.flop_rate / 1e9:.3g} GFLOP/s per worker, "
        f"latency {cluster.latency:.3g} s, {cluster.bandwidth / 1e9:.3g} GB/s, {cluster.task_overhead:.3g} s per task"
    )
    click.echo(format_plan(result))
    return None


def _check(opts: dict) -> dict:
    """Every flag checked before anything runs."""
    from daskann._validation import OptionName, check_float, check_int, invalid
    from daskann.data import DATASETS
    from daskann.plan._cluster import load_cluster

    if opts["iterations"] is not None:
        check_int("iterations", opts["iterations"])
    if opts["workers"] is not None:
        check_int("workers", opts["workers"])
    for name in ("batch_size", "n_samples", "n_features", "n_outputs"):
        check_int(name, opts[name])
    if opts["steps"] is not None:
        check_int("steps", opts["steps"])
    if opts["epochs"] is not None:
        check_int("epochs", opts["epochs"])
        if opts["steps"] is not None:
            raise invalid(OptionName(("steps", "epochs")), (opts["steps"], opts["epochs"]), "at most one of the two")
    finetune = check_float("finetune_fraction", opts["finetune_fraction"], minimum=0.0, maximum=1.0)
    if opts["measure"] and opts["output"] is None:
        raise invalid("output", None, "a file for --measure to write, e.g. -o mycluster.yaml")
    if opts["dataset"] is not None:
        if opts["dataset"] not in DATASETS:
            raise invalid("dataset", opts["dataset"], "one of " + ", ".join(DATASETS))
    if opts["cluster_file"] is not None:
        load_cluster(opts["cluster_file"])  # a bad file fails here, before any run
    return {"finetune": finetune}


def _npt_table(ctx, opts: dict):
    """The NPT grid table of the live cluster (the command before it covered every method)."""
    keep = ("hidden", "n_features", "n_outputs", "batch_size", "dtype", "mode", "as_json", "address", "profile")
    return ctx.invoke(npt_plan, **{k: opts[k] for k in keep}, workers=opts["workers"])


def _problem(opts: dict, settings: dict):
    """The network, its data (arrays, made or loaded) and the trainer settings of the pilot and validation."""
    import numpy as np

    from daskann.data import make_linear
    from daskann.npt.costmodel import PAPER_NETS
    from daskann.plan._model import Network

    hidden, n_features, n_outputs, name = tuple(opts["hidden"]), opts["n_features"], opts["n_outputs"], None
    if opts["net"] is not None:
        spec = PAPER_NETS[opts["net"]]
        hidden, n_features, n_outputs, name = tuple(spec["hidden"]), spec["n_features"], spec["n_outputs"], opts["net"]
    loss = "mse"
    if opts["dataset"] is not None:
        data = load_data({**opts, "n_features": None, "n_outputs": None, "seed": 0, "noise": 0.1})
        X, y, loss = data.X_train, data.y_train, data.loss
        n_features, n_outputs = data.n_features, data.n_outputs
        name = name or opts["dataset"]
    else:
        X, y = make_linear(opts["n_samples"], n_features, n_outputs, seed=0)
    batch = opts["batch_size"]
    if opts["epochs"] is not None:
        steps = opts["epochs"] * -(-len(X) // batch)
    else:
        steps = opts["steps"] if opts["steps"] is not None else 200
    net = Network(
        sizes=(n_features, *hidden, n_outputs),
        batch_size=batch,
        steps=steps,
        n_samples=len(X),
        itemsize=np.dtype(opts["dtype"]).itemsize,
        momentum=bool(opts["momentum"]),
        name=name or "-".join(map(str, hidden)),
    )
    train = {
        "lr": opts["lr"],
        "batch_size": batch,
        "loss": loss,
        "network": {"dtype": opts["dtype"]},
        "sgd": {"momentum": opts["momentum"]},
    }
    return net, hidden, X, y, train


def _cluster(opts: dict, net=None, method_planners=()):
    """The cluster to predict for; where it is the live one, each method's own costs are timed on it too."""
    from daskann.plan._cluster import load_cluster, profile_cluster
    from daskann.plan._measure import measure_cluster

    if opts["cluster_file"] is not None:
        return load_cluster(opts["cluster_file"])
    if opts["profile"] is not None and opts["address"] is None and not opts["measure"]:
        typical = profile_cluster(opts["profile"], missing_ok=True)
        if typical is not None:
            return typical
        # a site profile without typical values: start its cluster and measure it

    with _connected(opts) as client:
        cluster = measure_cluster(client, net=net)  # pilots of the net planned for
        for planner in method_planners:
            planner.calibrate(client, cluster, net)  # MGRIT's task cost on each configuration's graphs
        return cluster


@contextlib.contextmanager
def _connected(opts: dict):
    """A client of the live cluster the options name, closed on exit."""
    from daskann.cluster import close

    client = connect(opts, quiet=True)
    try:
        yield client
    finally:
        close(client)


def _measure(opts: dict) -> None:
    from daskann.plan._cluster import write_cluster
    from daskann.plan._measure import measure_cluster

    with _connected(opts) as client:
        cluster = measure_cluster(client)
    path = write_cluster(cluster, opts["output"])
    if not opts["as_json"]:
        click.echo(f"wrote {path}: " + ", ".join(f"{k}={v}" for k, v in cluster.to_dict().items()))


def _validate(opts: dict, net, hidden, X, y, train, method_planners) -> None:
    from daskann.plan._planners import validate

    with _connected(opts) as client:
        rows, cluster = validate(client, net, hidden, X, y, train, method_planners)
    if opts["as_json"]:
        keys = ("method", "workers", "predicted_s", "measured_s")
        click.echo(json.dumps(clean_json({"validation": [{k: r[k] for k in keys} for r in rows]}), indent=2))
        return
    click.echo(f"load average {os.getloadavg()[0]:.2f}; cluster measured: {cluster.to_dict()}")
    click.echo(format_validation(rows))
