"""Options and helpers shared by every ``daskann train ...`` command.

A method's command stacks the decorators below, builds its trainer from
:func:`trainer_settings` plus its own options, and hands it to
:func:`run_training`, which loads the data, prepares the output folder, fits,
saves and prints the summary (``--json`` for machines).

Defining the options loads nothing heavy: dask, zarr, the data sets, the
store and the trainers are imported inside the functions that use them, so a
command's ``--help`` and its argument errors answer at once.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import time
from pathlib import Path
from typing import get_args

import click
import numpy as np

from daskann._json import clean_json
from daskann._validation import DatasetName, named_error
from daskann.exceptions import StoreError


def _int_list(ctx, param, value):
    if value is None:
        return None
    try:
        return tuple(int(v) for v in str(value).split(",") if v.strip())
    except ValueError:
        raise click.BadParameter(f"{value!r} is not a comma-separated list of integers, e.g. 64,64") from None


def option_group(*options):
    """A decorator that adds ``options`` to a command, listed by ``--help`` in the order given."""

    def add(func):
        for option in reversed(options):
            func = option(func)
        return func

    return add


def _hidden_option():
    return click.option(
        "--hidden", default="64", show_default=True, callback=_int_list, help="Hidden layer widths, comma-separated."
    )


def _batch_size_option():
    return click.option("--batch-size", type=int, default=64, show_default=True, help="Rows per training step.")


def _dtype_option(help: str):
    return click.option(
        "--dtype", type=click.Choice(["float64", "float32"]), default="float64", show_default=True, help=help
    )


def data_path_option():
    """``--data-path``: the folder of the MNIST or CIFAR-10 files."""
    return click.option(
        "--data-path",
        type=click.Path(file_okay=False, path_type=Path),
        default=None,
        help="Folder with MNIST IDX files or CIFAR-10 python batches.",
    )


def training_options(func):
    """Network, optimiser and schedule options (the serial trainer's settings)."""
    return option_group(
        _hidden_option(),
        click.option(
            "--activation",
            type=click.Choice(["relu", "leaky_relu"]),
            default="relu",
            show_default=True,
            help="Activation of the hidden layers.",
        ),
        click.option(
            "--output-activation",
            type=click.Choice(["linear", "softmax"]),
            default="linear",
            show_default=True,
            help="Output layer activation. The cross_entropy loss applies softmax to the outputs itself, "
            "so linear (raw logits) suits classification too.",
        ),
        click.option(
            "--loss",
            type=click.Choice(["mse", "cross_entropy"]),
            default=None,
            help="Loss; defaults to the data set's natural loss.",
        ),
        click.option("--steps", type=int, default=None, help="Training steps (default: 200 unless --epochs)."),
        click.option("--epochs", type=int, default=None, help="Training epochs instead of steps."),
        _batch_size_option(),
        click.option("--lr", type=float, default=0.05, show_default=True, help="Learning rate."),
        click.option("--momentum", type=float, default=0.0, show_default=True, help="SGD momentum in [0, 1)."),
        _dtype_option("Floating-point type of the data and the weights."),
        click.option(
            "--seed",
            type=int,
            default=0,
            show_default=True,
            help="Seed of the weights, the data split and the batch order.",
        ),
        click.option("--no-shuffle", is_flag=True, help="Walk the rows in order instead of shuffling each epoch."),
        click.option("--eval-every", type=int, default=None, help="Validate every N steps (default: every epoch)."),
    )(func)


def network_options(func):
    """Widths, batch and dtype of a network that is planned rather than trained (``daskann plan``)."""
    return option_group(
        _hidden_option(),
        click.option("--n-features", type=int, default=64, show_default=True, help="Input width."),
        click.option("--n-outputs", type=int, default=10, show_default=True, help="Output width."),
        _batch_size_option(),
        _dtype_option("Floating-point type (sets the bytes each message moves)."),
    )(func)


def data_options(func):
    """Data set options."""
    return option_group(
        click.option(
            "--dataset",
            type=click.Choice(list(get_args(DatasetName))),
            default="linear",
            show_default=True,
            help="Data set to train on.",
        ),
        click.option("--n-samples", type=int, default=None, help="Samples to generate (linear, mnist1d)."),
        click.option("--n-features", type=int, default=None, help="Input width of the linear data."),
        click.option("--n-outputs", type=int, default=None, help="Output width of the linear data."),
        click.option("--noise", type=float, default=0.1, show_default=True, help="Noise level of the linear data."),
        data_path_option(),
        click.option(
            "--data",
            "data_store",
            type=click.Path(path_type=Path),
            default=None,
            help="Zarr group with arrays X and y (optionally X_val, y_val), read by the workers; replaces --dataset.",
        ),
        click.option(
            "--val-fraction",
            type=float,
            default=0.2,
            show_default=True,
            help="Share of the rows held out for validation.",
        ),
    )(func)


def output_options(func):
    """Output folder, resume and report options."""
    return option_group(
        click.option(
            "--output",
            "-o",
            type=click.Path(path_type=Path),
            default=None,
            help="Run folder for checkpoints, history and the final model.",
        ),
        click.option("--checkpoint-every", type=int, default=None, help="Checkpoint every N steps."),
        click.option("--overwrite", is_flag=True, help="Replace an earlier run in --output."),
        click.option("--resume", is_flag=True, help="Continue the run in --output from its last good checkpoint."),
        click.option("--json", "as_json", is_flag=True, help="Print a machine-readable summary."),
        click.option("--quiet", "-q", is_flag=True, help="No progress bar."),
    )(func)


def cluster_options(func):
    """Where the Dask work runs."""
    return option_group(
        click.option("--address", default=None, help="Scheduler address (default: an embedded LocalCluster)."),
        click.option("--profile", default=None, help="dask-jobqueue profile (slurm, pbs) or a YAML path."),
        click.option(
            "--workers", type=int, default=None, help="Workers of the embedded cluster (or jobs of a profile)."
        ),
    )(func)


def bench_output_option(default: str, help: str):
    """``--output``/``-o``: the folder a benchmark writes its report and plots into."""
    return click.option(
        "--output", "-o", type=click.Path(path_type=Path), default=Path(default), show_default=True, help=help
    )


def bench_options(*, workers_help: str, output: str, output_help: str):
    """``--workers`` (default 2), ``--address`` and ``--output`` of a benchmark that starts its own cluster."""
    return option_group(
        click.option("--workers", type=int, default=2, show_default=True, help=workers_help),
        click.option("--address", default=None, help="Scheduler address instead of an embedded cluster."),
        bench_output_option(output, output_help),
    )


def report_options(func):
    """``--json`` and ``--quiet`` of a benchmark's report."""
    return option_group(
        click.option("--json", "as_json", is_flag=True, help="Print the JSON report."),
        click.option("--quiet", "-q", is_flag=True, help="No progress lines."),
    )(func)


#: Python parameters whose command-line option has another destination name
PARAMETER_OPTIONS = {"hidden_sizes": "hidden", "path": "data_path", "cf_iter": "relaxation", "data": "data_store"}
_ERRORS = (ValueError, TypeError, FileNotFoundError, ConnectionError, StoreError)


def _option_flags(aliases: dict[str, str]) -> dict[str, str]:
    """Flag of each parameter name of the running command (``lr`` -> ``--lr``)."""
    ctx = click.get_current_context(silent=True)
    params = ctx.command.params if ctx is not None else []
    flags = {p.name: max(p.opts, key=len) for p in params if isinstance(p, click.Option)}
    for name, dest in {**PARAMETER_OPTIONS, **aliases}.items():
        if dest in flags:
            flags[name] = flags[dest]
    return flags


def flag_message(exc: Exception, aliases: dict[str, str] | None = None) -> str:
    """The message of ``exc`` naming its parameter by the running command's flag.

    ``batch_size=0 is not valid: ...`` reads ``--batch-size=0 is not valid:
    ...``, as ``solver['cfactor']=1 ...`` reads ``--coarsening=1 ...``; an
    error that names no option of the command keeps its message.
    """
    name = getattr(exc, "option_name", None)
    flag = None if name is None else name.flag_form(_option_flags(aliases or {}))
    return str(exc) if flag is None else f"{flag}={exc.detail}"


@contextlib.contextmanager
def option_errors(aliases: dict[str, str] | None = None):
    """Turn daskann's input errors raised inside into one-line click errors naming the flag.

    ``aliases`` maps a parameter name to the destination of its option where
    the two differ in this command only (``{"noise": "merge_noise"}``).
    """
    try:
        yield
    except _ERRORS as exc:
        raise click.ClickException(flag_message(exc, aliases)) from exc


def cli_errors(func):
    """Turn daskann's input errors into one-line click errors that name the flag (``--lr``)."""

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        with option_errors():
            return func(*args, **kwargs)

    return wrapper


def connect(opts: dict, *, quiet: bool = False):
    """The client the cluster options ask for; its dashboard link on stderr unless ``quiet``."""
    from daskann.cluster import client as make_client

    c = make_client(address=opts.get("address"), profile=opts.get("profile"), n_workers=opts.get("workers"), quiet=True)
    if not quiet:
        echo_dashboard(c)
    return c


def echo_dashboard(c) -> None:
    """Print the dashboard link of ``c`` on stderr (stdout stays for results and ``--json``)."""
    link = getattr(c, "dashboard_link", None)
    if link:
        click.echo(f"Dask dashboard: {link}", err=True)


class _EchoHandler(logging.Handler):
    """Log records on click's stderr (resolved at each record, so it follows test runners' streams)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            click.echo(self.format(record), err=True)
        except Exception:  # pragma: no cover - as logging.StreamHandler
            self.handleError(record)


LOG_LEVELS = ("debug", "info", "warning", "error")


def setup_logging(level: str) -> None:
    """Print daskann's log records of ``level`` and above on stderr while the command runs."""
    logger = logging.getLogger("daskann")
    previous = logger.level
    handler = _EchoHandler()
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    logger.addHandler(handler)
    logger.setLevel(level.upper())

    def restore():
        logger.removeHandler(handler)
        logger.setLevel(previous)

    click.get_current_context().call_on_close(restore)


def load_data(opts: dict):
    """The data set the options name: ``--data``'s zarr arrays (as dask arrays), or a named set."""
    from daskann.data import load_dataset

    if opts.get("data_store") is not None:
        return load_zarr_data(opts["data_store"])

    return load_dataset(
        opts["dataset"],
        n_samples=opts.get("n_samples"),
        n_features=opts.get("n_features"),
        n_outputs=opts.get("n_outputs"),
        noise=opts.get("noise", 0.1),
        path=opts.get("data_path"),
        val_fraction=opts.get("val_fraction", 0.2),
        seed=opts.get("seed", 0),
        dtype=opts.get("dtype", "float64"),
    )


def load_zarr_data(path):
    """A :class:`~daskann.data.Dataset` of dask arrays read lazily from the zarr group at ``path``.

    Arrays ``X`` and ``y`` are required; ``X_val`` and ``y_val`` are optional
    (no validation without them). Nothing is read here: the task and loss come
    from the dtype of ``y`` (integers: classification).
    """
    import dask.array as da
    import zarr

    from daskann._validation import invalid
    from daskann.data import Dataset

    expected = "a zarr group holding arrays X and y (optionally X_val and y_val)"
    try:
        group = zarr.open_group(str(path), mode="r")
        names = set(group.array_keys())
    except Exception:
        raise invalid("data_store", str(path), expected) from None
    if not {"X", "y"} <= names:
        raise invalid("data_store", f"{path} (arrays: {', '.join(sorted(names)) or 'none'})", expected)
    arrays = {name: da.from_zarr(group[name]) for name in ("X", "y", "X_val", "y_val") if name in names}
    classification = np.issubdtype(arrays["y"].dtype, np.integer)
    return Dataset(
        name=Path(path).name,
        X_train=arrays["X"],
        y_train=arrays["y"],
        X_val=arrays.get("X_val"),
        y_val=arrays.get("y_val"),
        task="classification" if classification else "regression",
        loss="cross_entropy" if classification else "mse",
    )


def trainer_settings(opts: dict, dataset) -> dict:
    """Keyword arguments of :class:`daskann._base.BaseTrainer` from the options."""
    loss = opts.get("loss") or dataset.loss
    output = opts.get("output_activation") or "linear"  # cross_entropy takes logits
    return {
        "hidden_sizes": opts["hidden"],
        "activation": opts["activation"],
        "output": output,
        "loss": loss,
        "lr": opts["lr"],
        "momentum": opts["momentum"],
        "batch_size": opts["batch_size"],
        "shuffle": not opts.get("no_shuffle", False),
        "seed": opts["seed"],
        "dtype": opts["dtype"],
        "eval_every": opts.get("eval_every"),
        "checkpoint_every": opts.get("checkpoint_every"),
        "verbose": 0 if (opts.get("quiet") or opts.get("as_json")) else 1,
    }


def training_length(opts: dict) -> dict:
    if opts.get("steps") is None and opts.get("epochs") is None:
        return {"steps": 200}
    return {"steps": opts.get("steps"), "epochs": opts.get("epochs")}


def summarize(trainer, dataset, *, method: str, seconds: float, output=None, extra: dict | None = None) -> dict:
    """JSON-safe summary of a finished run."""

    model = trainer.model_
    summary = {
        "method": method,
        "dataset": dataset.name,
        "sizes": list(model.sizes),
        "parameters": int(model.n_parameters),
        "steps": int(getattr(trainer, "n_steps_", 0)),
        "seconds": round(seconds, 3),
    }
    if dataset.X_val is not None:
        summary.update(_validation_summary(model, dataset, trainer.loss))
    history = getattr(trainer, "history_", None)
    if history is not None and "loss" in history:
        losses = history["loss"].values
        finite = losses[np.isfinite(losses)]
        summary["final_train_loss"] = float(finite[-1]) if finite.size else None
    if output is not None:
        summary["output"] = str(output)
    summary.update(extra or {})
    return summary


def _validation_summary(model, dataset, loss: str) -> dict:
    """Validation loss (and accuracy) of the final model; on a worker for dask-array data."""
    from daskann._dask_input import is_dask_array, remote_call

    def measure(model, X_val, y_val):
        values = {"val_loss": float(model.loss(X_val, y_val, loss))}
        if dataset.task == "classification":
            values["val_accuracy"] = float(model.accuracy(X_val, y_val))
        return values

    if is_dask_array(dataset.X_val):
        return remote_call(measure, model, dataset.X_val, dataset.y_val)
    return measure(model, dataset.X_val, dataset.y_val)


def print_summary(summary: dict, as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps(summary, indent=2))
        return
    parts = [
        f"{summary['method']}: {summary['dataset']} net {'-'.join(map(str, summary['sizes']))}",
        f"{summary['steps']} steps in {summary['seconds']:.2f} s",
    ]
    if "val_accuracy" in summary:
        parts.append(f"validation accuracy {summary['val_accuracy']:.3f}")
    if "val_loss" in summary:
        parts.append(f"validation loss {summary['val_loss']:.4g}")
    click.echo(", ".join(parts))
    for key, value in summary.items():
        if key not in {"method", "dataset", "sizes", "steps", "seconds", "val_accuracy", "val_loss"}:
            click.echo(f"  {key}: {value}")


def run_training(make_trainer, opts: dict, *, method: str, fit_kwargs: dict | None = None, extra=None) -> dict:
    """Load data, prepare ``--output``, fit, save and print a summary.

    ``make_trainer(arguments, dataset)`` returns an unfitted trainer built
    from ``arguments`` (:func:`trainer_settings` as constructor keywords, see
    :func:`daskann._base.constructor_arguments`) plus the method's own options.
    """
    from daskann import store
    from daskann._base import constructor_arguments

    dataset = load_data(opts)
    settings = trainer_settings(opts, dataset)
    output = opts.get("output")
    resume = None
    if output is not None:
        if opts.get("resume"):
            if not (output / store.RUN_MARKER).exists():
                raise named_error(
                    ValueError, "output", f"{str(output)!r} is not valid: --resume needs an existing daskann run folder"
                )
            resume = output
        store.prepare_run_dir(
            output,
            method=method,
            config=clean_json(settings, finite=False),
            overwrite=opts.get("overwrite", False),
            resume=bool(opts.get("resume")),
        )
        settings["checkpoint_dir"] = output
    elif opts.get("resume"):
        raise ValueError("resume needs --output, the run folder to continue")
    eval_every = settings.pop("eval_every")
    trainer = make_trainer(constructor_arguments(settings), dataset)
    start = time.perf_counter()
    validation = None if dataset.X_val is None else (dataset.X_val, dataset.y_val)
    kwargs = dict(training_length(opts), validation_data=validation, eval_every=eval_every, **(fit_kwargs or {}))
    if resume is not None:
        kwargs["resume"] = resume
    trainer.fit(dataset.X_train, dataset.y_train, **kwargs)
    seconds = time.perf_counter() - start
    if output is not None:
        store.save_history(trainer.history_, output / store.HISTORY_STORE)
        trainer.save(output / store.MODEL_STORE)
    summary = summarize(
        trainer,
        dataset,
        method=method,
        seconds=seconds,
        output=output,
        extra=extra(trainer) if callable(extra) else extra,
    )
    print_summary(summary, opts.get("as_json", False))
    return summary


__all__ = [
    "bench_options",
    "bench_output_option",
    "cli_errors",
    "cluster_options",
    "connect",
    "data_options",
    "data_path_option",
    "echo_dashboard",
    "flag_message",
    "load_data",
    "network_options",
    "option_errors",
    "option_group",
    "output_options",
    "print_summary",
    "report_options",
    "run_training",
    "setup_logging",
    "summarize",
    "trainer_settings",
    "training_options",
]
