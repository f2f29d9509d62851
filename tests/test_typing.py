"""The ``Literal`` option types of public signatures list exactly what the runtime checks accept."""

from __future__ import annotations

import typing

import pytest

from daskann import _typing
from daskann.npt import _engine_options as npt_options


# the other runtime choices are built from their Literal with typing.get_args; these are written out
@pytest.mark.parametrize(
    ("alias", "accepted"),
    [
        (_typing.NPTMode, npt_options.MODES),
        (_typing.NPTPipeline, npt_options.PIPELINES),
    ],
)
def test_literal_types_match_the_runtime_choices(alias, accepted):
    assert typing.get_args(alias) == tuple(accepted)


def test_the_package_is_marked_typed():
    from importlib.resources import files

    assert files("daskann").joinpath("py.typed").is_file()
