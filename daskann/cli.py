"""The ``daskann`` command (also ``python -m daskann``).

Its commands load what they run when they run: ``daskann --help``, any
command's ``--help`` and argument errors load neither the trainers nor
dask, scikit-learn or zarr (seconds, more on a login node's shared file
system).
"""

from __future__ import annotations

import importlib
import json
import sys
import time
from pathlib import Path

import click

from daskann import _methods as methods
from daskann._cli_common import (
    LOG_LEVELS,
    cli_errors,
    data_options,
    echo_dashboard,
    output_options,
    print_summary,
    run_training,
    setup_logging,
    summarize,
    training_options,
)

if "dask.config" in sys.modules:
    # loaded by dask's command line (the dask_cli entry point), whose `dask config get daskann` lists the settings;
    # dask is loaded already, so registering them costs nothing here
    importlib.import_module("daskann.config")

# method commands live with their method and load on first use (each method's entry in daskann._methods)
TRAIN_COMMANDS = methods.train_commands()
BENCH_COMMANDS = methods.bench_commands()
TOP_COMMANDS = {"plan": "daskann.plan.cli:plan_command"}
# run in order by `daskann demo`; each takes a client and returns a summary dict
DEMOS = methods.demos()


class LazyGroup(click.Group):
    """A click group whose sub-commands are imported when used."""

    def __init__(self, *args, lazy: dict[str, str] | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.lazy = lazy if lazy is not None else {}

    def list_commands(self, ctx):
        return sorted(set(super().list_commands(ctx)) | set(self.lazy))

    def get_command(self, ctx, name):
        if name in self.lazy:
            return methods.load(self.lazy[name])
        return super().get_command(ctx, name)


MAIN_HELP = f"""Train neural networks in parallel on Dask.

Methods: {methods.methods_help()}.
Settings such as timeouts live in Dask's configuration under 'daskann'
('dask config get daskann', DASK_DASKANN__... environment variables).
"""


@click.group(
    "daskann",
    cls=LazyGroup,
    lazy=TOP_COMMANDS,
    help=MAIN_HELP,
    context_settings={"help_option_names": ["-h", "--help"]},
)
@click.version_option(package_name="daskann")
@click.option(
    "--log-level",
    type=click.Choice(LOG_LEVELS, case_sensitive=False),
    default="warning",
    show_default=True,
    help="Print daskann's log messages of this level and above on stderr.",
)
def main(log_level):
    setup_logging(log_level)


@main.group(cls=LazyGroup, lazy=TRAIN_COMMANDS)
def train():
    """Train a network with one method and save the run."""


@train.command("serial")
@training_options
@data_options
@output_options
@cli_errors
def train_serial(**opts):
    """Reference training: minibatch SGD with momentum in one process."""
    from daskann.serial import SerialTrainer

    run_training(lambda settings, data: SerialTrainer(**settings), opts, method="serial")


@main.group(cls=LazyGroup, lazy=BENCH_COMMANDS)
def bench():
    """Benchmarks that print tables and write plots."""


def serial_demo(client=None) -> dict:
    """The serial part of ``daskann demo``: the reference trainer on scikit-learn's 8x8 digits."""
    from daskann.data import load_dataset
    from daskann.serial import SerialTrainer

    data = load_dataset("digits", seed=0)
    start = time.perf_counter()
    trainer = SerialTrainer((64,), loss="cross_entropy", lr=0.1, batch_size=32, seed=0, sgd={"momentum": 0.9}).fit(
        data.X_train, data.y_train, epochs=10, validation_data=(data.X_val, data.y_val)
    )
    return summarize(trainer, data, method="serial", seconds=time.perf_counter() - start)


@main.command()
@click.option("--workers", type=int, default=2, show_default=True, help="Worker processes of the embedded cluster.")
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable summaries.")
@cli_errors
def demo(workers, as_json):
    """Train with every method on an embedded LocalCluster and report how well."""
    from daskann.cluster import client as make_client
    from daskann.cluster import close

    start = time.perf_counter()
    c = make_client(n_workers=workers, quiet=True)
    try:
        if not as_json:
            echo_dashboard(c)
            click.echo(f"daskann demo on an embedded LocalCluster: {workers} workers")
        for _name, spec in DEMOS:
            summary = methods.load(spec)(c)
            print_summary(summary, as_json)
    finally:
        close(c)
    if not as_json:
        click.echo(f"demo finished in {time.perf_counter() - start:.1f} s")


@main.command()
@click.argument("path", type=click.Path(exists=True))
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print the report as JSON: ok, and the status (and any detail) of each item.",
)
@cli_errors
def verify(path, as_json):
    """Check a checkpoint, history or run folder against its checksums.

    PATH is a checkpoint or history store, or a run folder written by
    'daskann train ... --output'. Prints one line per store (ok, damaged
    or orphan) and exits with status 1 if any is not ok.
    """
    from daskann.store import verify_path

    report = verify_path(Path(path))
    if as_json:
        click.echo(json.dumps(report, indent=2))
    else:
        for item in report["items"]:
            click.echo(f"{item['status']:8s} {item['path']}" + (f"  ({item['detail']})" if item.get("detail") else ""))
    if not report["ok"]:
        raise SystemExit(1)


if __name__ == "__main__":  # pragma: no cover
    main()
