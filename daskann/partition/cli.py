"""``daskann train partition``, ``daskann bench partition`` and partitioned pre-training's part of ``daskann demo``.

The trainer, the cluster and the benchmark load when a command runs, not when
its options are defined.
"""

from __future__ import annotations

import json
import time

import click

from daskann._cli_common import (
    bench_options,
    cli_errors,
    cluster_options,
    connect,
    data_options,
    data_path_option,
    option_errors,
    option_group,
    output_options,
    report_options,
    run_training,
    summarize,
    training_options,
)

_partition_options = option_group(
    click.option("-k", "--k", "k", type=int, default=2, show_default=True, help="Number of sub-models."),
    click.option(
        "--combine",
        type=click.Choice(["mean", "sum"]),
        default="mean",
        show_default=True,
        help="Output layer of the merge: mean or sum of the sub-models' logits.",
    ),
    click.option(
        "--merge-noise",
        type=float,
        default=0.02,
        show_default=True,
        help="Uniform merge noise relative to each parameter array's largest |value| "
        "(--noise is the linear data's noise).",
    ),
    click.option("--sub-steps", type=int, default=None, help="Steps of each sub-model (default: as fine-tuning)."),
    click.option("--sub-epochs", type=int, default=None, help="Epochs of each sub-model instead of steps."),
    click.option("--sequential", is_flag=True, help="Train the sub-models one after another, not in parallel."),
    click.option(
        "--sub-trainer",
        type=click.Choice(["serial", "npt"]),
        default="serial",
        show_default=True,
        help="Trainer of the sub-models.",
    ),
    click.option(
        "--finetune-trainer",
        type=click.Choice(["serial", "npt"]),
        default=None,
        help="Trainer of the merged network (default: as --sub-trainer).",
    ),
    click.option(
        "--retries", type=int, default=2, show_default=True, help="Extra attempts of a sub-model task that raises."
    ),
)


def partition_summary(trainer) -> dict:
    """Figures a partitioned run adds to the common summary (JSON-safe)."""
    counts = trainer.partition_.parameter_counts()
    merged = trainer.history_.where(trainer.history_["phase"] == "merge", drop=True)
    settings = trainer._settings  # the split and merge options the fit ran with, checked
    extra = {
        "k": trainer.partition_.k,
        "combine": settings["combine"],
        "merge_noise": float(settings["noise"]),
        "mode": settings["mode"],
        "submodel_sizes": [list(s) for s in trainer.partition_.submodels],
        "parameters_submodel": counts["largest_submodel"],
        "submodel_steps": int(trainer.sub_steps_),
        "seconds_submodels": round(trainer.timings_["submodel"], 3),
        "seconds_merge": round(trainer.timings_["merge"], 4),
        "seconds_finetune": round(trainer.timings_["finetune"], 3),
        "workers": sorted({r.worker for r in trainer.submodel_results_ if r is not None}),
    }
    if "val_accuracy" in merged:
        extra["merged_val_accuracy"] = float(merged["val_accuracy"].values[0])
    sub_acc = [
        float(r.history["val_accuracy"].dropna("step").values[-1])
        for r in trainer.submodel_results_
        if r is not None and "val_accuracy" in r.history
    ]
    if sub_acc:
        extra["submodel_val_accuracy"] = sub_acc
    if trainer.diversity_ is not None:
        extra["diversity_representation"] = round(trainer.diversity_["representation"], 4)
        extra["diversity_disagreement"] = round(trainer.diversity_["disagreement"], 4)
    return {k: v for k, v in extra.items() if v is not None}


@click.command("partition")
@training_options
@_partition_options
@data_options
@output_options
@cluster_options
@cli_errors
def train_command(**opts):
    """Partitioned pre-training: k sub-models as futures, merged on the client, fine-tuned."""
    from daskann.cluster import close
    from daskann.partition import PartitionTrainer

    # every check that needs no data runs before the data loads and a cluster starts;
    # the trainer's noise is --merge-noise here (--noise is the linear data's)
    with option_errors({"noise": "merge_noise"}):
        make_probe(opts)._check_settings()
    state = {"client": None}

    def make(settings, dataset):
        state["client"] = connect(opts, quiet=bool(opts.get("quiet") or opts.get("as_json")))
        return PartitionTrainer(
            **settings,
            k=opts["k"],
            split={**_split_options(opts), "mode": "sequential" if opts["sequential"] else "parallel"},
            merge=_merge_options(opts),
            client=state["client"],
        )

    try:
        run_training(make, opts, method="partition", extra=partition_summary)
    finally:
        if state["client"] is not None:
            close(state["client"])


def make_probe(opts: dict):
    """An unfitted trainer from the options, to validate them before anything starts."""
    from daskann.partition import PartitionTrainer

    hidden = opts.get("hidden") or (64,)
    return PartitionTrainer(
        hidden,
        lr=opts["lr"],
        batch_size=opts["batch_size"],
        k=opts["k"],
        split=_split_options(opts),
        merge=_merge_options(opts),
        seed=opts["seed"],
        network={"dtype": opts["dtype"]},
        sgd={"momentum": opts["momentum"]},
    )


def _split_options(opts: dict) -> dict:
    """The trainer's ``split`` options from the command's flags."""
    names = ("sub_steps", "sub_epochs", "sub_trainer", "retries")
    return {name: opts[name] for name in names}


def _merge_options(opts: dict) -> dict:
    """The trainer's ``merge`` options from the command's flags (``--merge-noise`` is ``noise``)."""
    return {"combine": opts["combine"], "noise": opts["merge_noise"], "finetune_trainer": opts["finetune_trainer"]}


@click.command("partition")
@click.option(
    "--dataset",
    type=click.Choice(["mnist1d", "digits", "mnist", "cifar10"]),
    default=None,
    help="Data set and its defaults.  [default: mnist1d; with --model: mnist with --data-path, else MNIST-1D "
    "upsampled to 784 features]",
)
@click.option(
    "--model",
    type=click.Choice(["paper-430k", "paper-2.1m"]),
    default=None,
    help="A model size of the paper on 784-wide data, with its schedule, target, k=2,4 and 3 seeds: "
    "784-368-368-10 (428,362 parameters) or 784-844-844-844-10 (2,097,350); other options override.",
)
@data_path_option()
@click.option("--n-samples", type=int, default=None, help="Samples before the split (default: the benchmark's).")
@click.option(
    "--hidden", default=None, help="Hidden widths of the full network (default: 512,512,512; digits 256,256)."
)
@click.option("-k", "--k", "ks", default=None, help="Numbers of sub-models, comma-separated.  [default: 2,4]")
@click.option(
    "--seeds", type=int, default=None, help="Seeds per variant (medians are quoted).  [default: 5; 3 with --model]"
)
@click.option("--target", type=float, default=None, help="Target validation accuracy in (0, 1].")
@click.option("--steps", type=int, default=None, help="Training steps of the full network from scratch.")
@click.option("--sub-steps", type=int, default=None, help="Steps of each sub-model.")
@click.option("--finetune-steps", type=int, default=None, help="Fine-tuning steps of the merged network.")
@click.option("--lr", type=float, default=None, help="Learning rate.")
@click.option("--momentum", type=float, default=None, help="SGD momentum.")
@click.option("--batch-size", type=int, default=None)
@click.option("--eval-every", type=int, default=None, help="Validate every N steps, in every variant.")
@click.option("--combine", type=click.Choice(["mean", "sum"]), default="mean", show_default=True)
@click.option("--merge-noise", type=float, default=0.02, show_default=True)
@bench_options(
    workers_help="Workers of the embedded LocalCluster.",
    output="bench-results/partition",
    output_help="Folder for the JSON report and the PNG plot.",
)
@report_options
@cli_errors
def bench_command(**opts):
    """Time to a target validation accuracy: full training vs. k sub-models (parallel, sequential)."""
    from daskann.bench.partition import BenchmarkConfig, format_report, run_benchmark  # loads on first use

    config = BenchmarkConfig.from_options(**opts)
    report = run_benchmark(
        config,
        address=opts["address"],
        n_workers=opts["workers"],
        output=opts["output"],
        progress=None if (opts["quiet"] or opts["as_json"]) else click.echo,
    )
    click.echo(json.dumps(report, indent=1) if opts["as_json"] else format_report(report))


def run_demo(client=None, *, quick: bool = False) -> dict:
    """Train 2 sub-models of an MNIST-1D network as futures, merge them, fine-tune.

    About 20 s on 2 workers (``quick=True``: the 8x8 digits, a few seconds).

    Parameters
    ----------
    client : distributed.Client, optional
        Default: the current client, else an embedded LocalCluster.
    quick : bool
        A smaller run for tests.

    Returns
    -------
    dict
        The run's summary (as ``daskann train partition --json``), with the
        merged network's accuracy before fine-tuning, the diversity of the
        sub-models and the time of each phase.
    """
    from daskann.data import load_dataset
    from daskann.partition.trainer import PartitionTrainer

    if quick:
        data = load_dataset("digits", seed=0)
        hidden, sub_steps, steps, eval_every = (64, 64), 100, 60, 20
    else:
        data = load_dataset("mnist1d", n_samples=4000, seed=0)
        hidden, sub_steps, steps, eval_every = (128, 128, 128), 600, 400, 100
    trainer = PartitionTrainer(
        hidden,
        loss=data.loss,
        lr=0.05,
        batch_size=64,
        seed=0,
        sgd={"momentum": 0.9},
        k=2,
        merge={"combine": "mean", "noise": 0.02},
        split={"sub_steps": sub_steps},
        client=client,
    )
    start = time.perf_counter()
    trainer.fit(
        data.X_train, data.y_train, steps=steps, validation_data=(data.X_val, data.y_val), eval_every=eval_every
    )
    return summarize(
        trainer, data, method="partition", seconds=time.perf_counter() - start, extra=partition_summary(trainer)
    )
