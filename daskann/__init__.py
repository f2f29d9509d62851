"""daskann: train neural networks in parallel on Dask.

Published methods over one numeric core: network-parallel training by
Cannon's algorithm (:class:`NPTTrainer`), multigrid in time over training
steps (:class:`MGRITTrainer`) and partitioned pre-training
(:class:`PartitionTrainer`), each tested against :class:`SerialTrainer`.

The names below load their modules when first used (PEP 562), so that
``import daskann`` and the ``daskann`` command line start in a fraction of a
second; ``from daskann import SerialTrainer`` works as for any package.
"""

from __future__ import annotations

import importlib
import sys
from typing import TYPE_CHECKING

from daskann._lazy import attach

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

_getattr, __dir__ = attach(
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
