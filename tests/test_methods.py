"""The method registry (daskann._methods) against what it names: trainers, commands, demos."""

from __future__ import annotations

import inspect

import pytest

from daskann._base import BaseTrainer
from daskann._methods import BY_NAME, METHODS, load
from daskann.plan import METHODS as PLANNED


@pytest.mark.parametrize("method", METHODS, ids=lambda m: m.name)
def test_an_entry_names_a_concrete_trainer_of_its_method(method):
    cls = method.trainer_class()
    assert issubclass(cls, BaseTrainer) and not inspect.isabstract(cls)
    assert cls.method == method.name
    if method.package is not None:
        assert cls.__module__.startswith(method.package + ".")


@pytest.mark.parametrize("method", METHODS, ids=lambda m: m.name)
def test_an_entry_names_its_commands_and_demo(method):
    for spec in (method.train_command, method.bench_command):
        if spec is not None:
            assert load(spec).name == method.name
    assert not method.demo or callable(load(method.demo))


@pytest.mark.parametrize("method", [m for m in METHODS if m.planned], ids=lambda m: m.name)
def test_a_planned_entry_names_a_concrete_planner_of_its_method(method):
    from daskann.plan._planners import MethodPlanner

    cls = load(method.planner)
    assert issubclass(cls, MethodPlanner) and not inspect.isabstract(cls)
    assert cls.name == method.name


def test_every_method_is_listed_once_and_the_planner_reads_the_list():
    assert list(BY_NAME) == [m.name for m in METHODS]
    assert PLANNED == tuple(m.name for m in METHODS if m.planned)
    trainers = [cls for cls in BaseTrainer.__subclasses__() if cls.__module__.startswith("daskann.")]
    assert not [cls.__name__ for cls in trainers if cls.method not in BY_NAME]


def test_a_trainer_must_name_its_method_and_implement_fit():
    with pytest.raises(TypeError, match="must name its method"):
        type("Unnamed", (BaseTrainer,), {"fit": lambda self, X, y: self})
    with pytest.raises(TypeError, match="abstract method fit"):
        type("NoFit", (BaseTrainer,), {"method": "nofit"})()
