"""Partitioned pre-training: split, train sub-models as futures, merge, fine-tune.

The third method of daskann (Miranda and Von Zuben, "Reducing the Training
Time of Neural Networks by Partitioning", arXiv:1511.02954).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from daskann import _attach

# the names __getattr__ loads on first use (submodules included), for type checkers and readers
if TYPE_CHECKING:
    from daskann.exceptions import SubModelError
    from daskann.partition import diversity, merge, split, submodels, trainer  # noqa: F401
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

__getattr__, __dir__ = _attach(
    __name__,
    {
        "COMBINES": "daskann.partition.merge",
        "PHASES": "daskann.partition.trainer",
        "Partition": "daskann.partition.split",
        "PartitionMergeOptions": "daskann.partition.trainer",
        "PartitionSplitOptions": "daskann.partition.trainer",
        "PartitionTrainer": "daskann.partition.trainer",
        "SubModelError": "daskann.exceptions",
        "SubModelResult": "daskann.partition.submodels",
        "combine_logits": "daskann.partition.merge",
        "linear_cka": "daskann.partition.diversity",
        "merge_submodels": "daskann.partition.merge",
        "split_network": "daskann.partition.split",
        "submodel_diversity": "daskann.partition.diversity",
        "submodel_seeds": "daskann.partition.submodels",
    },
    submodules=(
        "diversity",
        "merge",
        "split",
        "submodels",
        "trainer",
    ),
)
