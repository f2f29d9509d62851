"""daskann: train neural networks in parallel on Dask.

Published methods over one numeric core: network-parallel training by
Cannon's algorithm (:class:`NPTTrainer`), multigrid in time over training
steps (:class:`MGRITTrainer`) and partitioned pre-training
(:class:`PartitionTrainer`), each tested against :class:`SerialTrainer`.
"""

import importlib.metadata

from daskann import config  # noqa: F401  (registers daskann's settings with dask.config)
from daskann._options import CheckpointOptions, NetworkOptions, SGDOptions
from daskann.data import BatchOrder
from daskann.exceptions import DaskannError, TrainingDiverged
from daskann.mgrit import MGRITTrainer
from daskann.nn import MLP, SGD
from daskann.npt import NPTTrainer
from daskann.partition import PartitionTrainer
from daskann.serial import SerialTrainer
from daskann.store import Checkpoint, StoreError, load_checkpoint, save_checkpoint

try:
    __version__ = importlib.metadata.version("daskann")
except importlib.metadata.PackageNotFoundError:  # pragma: no cover - a source tree that is not installed
    __version__ = "0+unknown"

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
