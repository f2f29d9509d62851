"""daskann: train neural networks in parallel on Dask.

Published methods over one numeric core: network-parallel training by
Cannon's algorithm (:class:`NPTTrainer`), multigrid in time over training
steps (:class:`MGRITTrainer`) and partitioned pre-training
(:class:`PartitionTrainer`), each tested against :class:`SerialTrainer`.

The names below load their modules when first used (PEP 562), so that
``import daskann`` and the ``daskann`` command line start in a fraction of a
second; ``from daskann import SerialTrainer`` works as for any package.
The methods' packages and :mod:`daskann.plan` load their names the same
way (``_attach`` below).
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING

# the names __getattr__ loads on first use (submodules included), for type checkers and readers
if TYPE_CHECKING:
    from daskann import cluster, config, data, exceptions, mgrit, nn, npt, partition, plan, serial, store  # noqa: F401
    from daskann._options import CheckpointOptions, NetworkOptions, SGDOptions
    from daskann.data import BatchOrder
    from daskann.exceptions import DaskannError, TrainingDiverged
    from daskann.mgrit import MGRITTrainer
    from daskann.nn import MLP, SGD
    from daskann.npt import NPTTrainer
    from daskann.partition import PartitionTrainer
    from daskann.serial import SerialTrainer
    from daskann.store import Checkpoint, StoreError, load_checkpoint, save_checkpoint

    __version__: str

__all__ = [
    "MGRITTrainer",
    "MLP",
    "NPTTrainer",
    "PartitionTrainer",
    "SGD",
    "BatchOrder",
    "Checkpoint",
    "CheckpointOptions",
    "DaskannError",
    "NetworkOptions",
    "SGDOptions",
    "SerialTrainer",
    "StoreError",
    "TrainingDiverged",
    "load_checkpoint",
    "save_checkpoint",
]


def _attach(
    package: str, attributes: Mapping[str, str], submodules: Iterable[str] = ()
) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """The module ``__getattr__`` and ``__dir__`` of a package whose names load on first use.

    Parameters
    ----------
    package : str
        The package's ``__name__``.
    attributes : mapping of str to str
        Each name the package offers and the module that defines it.
    submodules : iterable of str
        Submodules offered as attributes (``daskann.config``), imported when
        first looked up as such.

    Returns
    -------
    __getattr__ : callable
        Imports the module of a name on its first look-up and keeps the value
        in the package, so later look-ups do not come back here; any other
        name raises ``AttributeError``.
    __dir__ : callable
        The names the package offers (``attributes`` and ``submodules``),
        loaded or not.
    """
    attributes = dict(attributes)
    submodules = frozenset(submodules)

    def __getattr__(name: str):
        if name in submodules:
            value = importlib.import_module(f"{package}.{name}")
        elif name in attributes:
            value = getattr(importlib.import_module(attributes[name]), name)
        else:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted(set(attributes) | submodules)

    return __getattr__, __dir__


_getattr, __dir__ = _attach(
    __name__,
    {
        "BatchOrder": "daskann.data",
        "Checkpoint": "daskann.store",
        "CheckpointOptions": "daskann._options",
        "DaskannError": "daskann.exceptions",
        "MGRITTrainer": "daskann.mgrit",
        "MLP": "daskann.nn",
        "NPTTrainer": "daskann.npt",
        "NetworkOptions": "daskann._options",
        "PartitionTrainer": "daskann.partition",
        "SGD": "daskann.nn",
        "SGDOptions": "daskann._options",
        "SerialTrainer": "daskann.serial",
        "StoreError": "daskann.store",
        "TrainingDiverged": "daskann.exceptions",
        "load_checkpoint": "daskann.store",
        "save_checkpoint": "daskann.store",
    },
    submodules=(
        "cluster",
        "config",
        "data",
        "exceptions",
        "mgrit",
        "nn",
        "npt",
        "partition",
        "plan",
        "serial",
        "store",
    ),
)


def __getattr__(name: str):
    if name == "__version__":
        from importlib import metadata

        try:
            version = metadata.version("daskann")
        except metadata.PackageNotFoundError:  # pragma: no cover - a source tree that is not installed
            version = "0+unknown"
        globals()["__version__"] = version
        return version
    value = _getattr(name)
    # using daskann registers its settings with dask.config, as the eager `import daskann` did:
    # dask.config.get("daskann....") finds them after `from daskann import MLP`
    importlib.import_module("daskann.config")
    return value


# where dask is loaded already (under `dask config get daskann`, or in a program that imported dask first),
# registering the settings now costs nothing; otherwise the first name used, or any module that reads a
# setting, registers them
if "dask.config" in sys.modules:
    importlib.import_module("daskann.config")
