"""Typing: the package is marked typed (its runtime choices are built from the ``Literal`` types)."""

from __future__ import annotations

from importlib.resources import files


def test_the_package_is_marked_typed():
    assert files("daskann").joinpath("py.typed").is_file()
