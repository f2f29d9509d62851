"""daskann: train neural networks in parallel on Dask.

Published methods over one numeric core: network-parallel training by
Cannon's algorithm (:class:`NPTTrainer`), multigrid in time over training
steps (:class:`MGRITTrainer`) and partitioned pre-training
(:class:`PartitionTrainer`), each tested against :class:`SerialTrainer`.
"""

from daskann._base import TrainingDiverged
from daskann.data import BatchOrder
from daskann.mgrit import MGRITTrainer
from daskann.nn import MLP, SGD
from daskann.npt import NPTTrainer
from daskann.partition import PartitionTrainer
from daskann.serial import SerialTrainer
from daskann.store import Checkpoint, StoreError, load_checkpoint, save_checkpoint

__version__ = "0.1.0"

__all__ = [
    "MGRITTrainer",
    "MLP",
    "NPTTrainer",
    "PartitionTrainer",
    "SGD",
    "BatchOrder",
    "Checkpoint",
    "SerialTrainer",
    "StoreError",
    "TrainingDiverged",
    "load_checkpoint",
    "save_checkpoint",
]
