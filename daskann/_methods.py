"""Every training method in one list: its trainer, commands, benchmark, demo and planner entry.

The command line (``daskann train``, ``daskann bench``, ``daskann demo``, the help text), the
planner's choice of methods and the tests read this list, so a new method adds its entry here and
its own folder. Everything is named by a string, ``"module:attribute"``, loaded on first use:
reading the list loads no method, no click and no dask.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Method:
    """One training method as the package's shared places see it.

    Parameters
    ----------
    name : str
        The method's name: its ``daskann train`` and ``daskann bench`` command, its ``method``
        attribute and its key in ``daskann plan``.
    summary : str
        A few words that describe it in ``daskann --help``.
    trainer : str
        ``"module:Class"`` of its :class:`~daskann._base.BaseTrainer` subclass.
    package : str or None
        Its folder's package, whose names load on first use (``None``: a module of the top level).
    train_command : str or None
        ``"module:command"`` of its ``daskann train`` command (``None``: defined in ``daskann.cli``).
    bench_command : str or None
        ``"module:command"`` of its ``daskann bench`` command, which imports its benchmark when it
        runs (``None``: no benchmark).
    demo : str
        ``"module:function"`` that ``daskann demo`` calls with a client; it returns a summary dict.
    planner : str or None
        ``"module:Class"`` of its :class:`~daskann.plan._planners.MethodPlanner`, through which
        ``daskann plan`` predicts, calibrates and validates it (``None``: not planned).
    estimator_checks : tuple of two dicts
        Keywords that, added to the tests' small classifier and regressor settings, make the
        trainers that scikit-learn's ``check_estimator`` runs on.
    """

    name: str
    summary: str
    trainer: str
    package: str | None = None
    train_command: str | None = None
    bench_command: str | None = None
    demo: str = ""
    planner: str | None = None
    estimator_checks: tuple[dict, dict] = field(default=({}, {}))

    @property
    def planned(self) -> bool:
        """Whether ``daskann plan`` predicts it."""
        return self.planner is not None

    def trainer_class(self) -> type:
        """The trainer class, imported now."""
        return load(self.trainer)

    @property
    def command_modules(self) -> set[str]:
        """The modules that define its commands (they may import click and its benchmark)."""
        return {spec.partition(":")[0] for spec in (self.train_command, self.bench_command) if spec}


#: the methods, in the order of the help text and of ``daskann demo``
METHODS = (
    Method(
        "serial",
        "the reference",
        "daskann.serial:SerialTrainer",
        demo="daskann.cli:serial_demo",
    ),
    Method(
        "npt",
        "Cannon network-parallel training",
        "daskann.npt:NPTTrainer",
        package="daskann.npt",
        train_command="daskann.npt.cli:train_command",
        bench_command="daskann.npt.cli:bench_command",
        demo="daskann.npt.cli:run_demo",
        planner="daskann.plan._planners:NPTPlanner",
        # graph mode costs a scheduler round trip per block product: it runs the classifier's shorter fits
        estimator_checks=({"grid": "1x2", "mode": "graph"}, {"grid": "1x2", "mode": "resident"}),
    ),
    Method(
        "mgrit",
        "multigrid over training steps",
        "daskann.mgrit:MGRITTrainer",
        package="daskann.mgrit",
        train_command="daskann.mgrit.cli:train_command",
        bench_command="daskann.mgrit.cli:bench_command",
        demo="daskann.mgrit.cli:run_demo",
        planner="daskann.plan._planners:MGRITPlanner",
    ),
    Method(
        "partition",
        "partitioned pre-training",
        "daskann.partition:PartitionTrainer",
        package="daskann.partition",
        train_command="daskann.partition.cli:train_command",
        bench_command="daskann.partition.cli:bench_command",
        demo="daskann.partition.cli:run_demo",
        planner="daskann.plan._planners:PartitionPlanner",
    ),
)
#: the methods by name
BY_NAME = {method.name: method for method in METHODS}


def load(spec: str):
    """The attribute a ``"module:attribute"`` string names, its module imported now."""
    module, _, attribute = spec.partition(":")
    return getattr(importlib.import_module(module), attribute)


def train_commands() -> dict[str, str]:
    """``daskann train``'s commands defined outside ``daskann.cli``, by name."""
    return {m.name: m.train_command for m in METHODS if m.train_command}


def bench_commands() -> dict[str, str]:
    """``daskann bench``'s commands, by name."""
    return {m.name: m.bench_command for m in METHODS if m.bench_command}


def demos() -> list[tuple[str, str]]:
    """``daskann demo``'s runs, in order: ``(name, "module:function")``."""
    return [(m.name, m.demo) for m in METHODS if m.demo]


def planned() -> tuple[str, ...]:
    """The methods ``daskann plan`` predicts."""
    return tuple(m.name for m in METHODS if m.planned)


def methods_help() -> str:
    """The methods as ``daskann --help`` lists them: ``name (summary)``, comma-separated."""
    return ", ".join(f"{m.name} ({m.summary})" for m in METHODS)
