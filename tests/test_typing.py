"""The ``Literal`` option types of public signatures list exactly what the runtime checks accept."""

from __future__ import annotations

import typing

import pytest

from daskann import _typing, nn
from daskann._validation import FLOAT_DTYPES
from daskann.mgrit import trainer as mgrit_trainer
from daskann.npt import trainer as npt_trainer
from daskann.partition import merge
from daskann.partition import trainer as partition_trainer


@pytest.mark.parametrize(
    ("alias", "accepted"),
    [
        (_typing.Activation, nn.ACTIVATIONS),
        (_typing.Output, nn.OUTPUTS),
        (_typing.Loss, nn.LOSSES),
        (_typing.FloatDType, FLOAT_DTYPES),
        (_typing.NPTMode, npt_trainer.MODES),
        (_typing.NPTPipeline, npt_trainer.PIPELINES),
        (_typing.MGRITScheduler, mgrit_trainer.SCHEDULERS),
        (_typing.PartitionMode, partition_trainer.MODES),
        (_typing.SubTrainer, partition_trainer.SUB_TRAINERS),
        (_typing.Combine, merge.COMBINES),
    ],
)
def test_literal_types_match_the_runtime_choices(alias, accepted):
    assert typing.get_args(alias) == tuple(accepted)


def test_the_package_is_marked_typed():
    from importlib.resources import files

    assert files("daskann").joinpath("py.typed").is_file()
