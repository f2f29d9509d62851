"""Option strings of the public signatures, as ``Literal`` types.

The runtime checks accept exactly these: their tuples (named beside each alias)
are built with ``typing.get_args``, so a type checker and the error message agree.
"""

from __future__ import annotations

from typing import Literal

#: hidden-layer activation (``daskann.nn.ACTIVATIONS``)
Activation = Literal["relu", "leaky_relu", "sigmoid", "tanh"]
#: output activation (``daskann.nn.OUTPUTS``)
Output = Literal["linear", "softmax", "sigmoid", "tanh"]
#: loss (``daskann.nn.LOSSES``)
Loss = Literal["mse", "cross_entropy", "sse"]
#: floating-point type of weights and data
FloatDType = Literal["float32", "float64"]
#: data set of ``load_dataset`` and ``daskann train --dataset`` (``daskann.data.DATASETS``)
DatasetName = Literal["linear", "digits", "mnist1d", "mnist", "cifar10"]
#: NPT execution mode (``daskann.npt._setup.MODES``)
NPTMode = Literal["auto", "graph", "resident"]
#: NPT graph-mode pipelining (``daskann.npt._setup.PIPELINES``)
NPTPipeline = Literal["auto", "fused", "single", "double"]
#: where MGRIT's tasks run (``daskann.mgrit.trainer.SCHEDULERS``)
MGRITScheduler = Literal["distributed", "threads", "sync", "inprocess"]
#: MGRIT cycle
CycleType = Literal["V", "F"]
#: built-in MGRIT coarse propagators
CoarsePropagator = Literal["scaled", "repeat"]
#: how sub-models train (``daskann.partition.trainer.MODES``)
PartitionMode = Literal["parallel", "sequential"]
#: trainer of sub-models and of the fine-tune (``daskann.partition.trainer.SUB_TRAINERS``)
SubTrainer = Literal["serial", "npt"]
#: how overlapping sub-model weights combine (``daskann.partition.merge.COMBINES``)
Combine = Literal["mean", "sum"]
