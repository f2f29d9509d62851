"""Partitioned pre-training: split, train sub-models as futures, merge, fine-tune.

The third method of daskann (Miranda and Von Zuben, "Reducing the Training
Time of Neural Networks by Partitioning", arXiv:1511.02954).
"""

from daskann.exceptions import SubModelError
from daskann.partition.diversity import linear_cka, submodel_diversity
from daskann.partition.merge import COMBINES, combine_logits, merge_submodels
from daskann.partition.split import Partition, split_network
from daskann.partition.submodels import SubModelResult, submodel_seeds
from daskann.partition.trainer import PHASES, PartitionMergeOptions, PartitionSplitOptions, PartitionTrainer

__all__ = [
    "COMBINES",
    "PHASES",
    "Partition",
    "PartitionMergeOptions",
    "PartitionSplitOptions",
    "PartitionTrainer",
    "SubModelError",
    "SubModelResult",
    "combine_logits",
    "linear_cka",
    "merge_submodels",
    "split_network",
    "submodel_diversity",
    "submodel_seeds",
]
