"""One home for errors: every public error derives from DaskannError and keeps its built-in base."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest

import daskann
from daskann import exceptions
from daskann.exceptions import DaskannError

#: the built-in error each public error has always been, so existing ``except`` clauses keep working
BUILTIN_BASE = {
    "BatchSizeClipped": UserWarning,
    "DamagedStoreError": ValueError,
    "DiskFullError": OSError,
    "ExchangeAborted": RuntimeError,
    "ExchangeTimeout": TimeoutError,
    "LostWorkersError": RuntimeError,
    "MGRITDidNotPay": UserWarning,
    "MGRITDiverged": RuntimeError,
    "MGRITNotConverged": RuntimeError,
    "PropagatorError": ValueError,
    "ResidentError": RuntimeError,
    "StoreError": ValueError,
    "SubModelError": RuntimeError,
    "TrainingDiverged": RuntimeError,
    "WorkerLost": RuntimeError,
    "WorkerWaitTimeout": TimeoutError,
}


def test_every_public_error_derives_from_daskann_error():
    names = [n for n in exceptions.__all__ if n != "DaskannError"]
    assert sorted(names) == sorted(BUILTIN_BASE)
    for name in names:
        cls = getattr(exceptions, name)
        assert issubclass(cls, DaskannError), name
        assert issubclass(cls, BUILTIN_BASE[name]), name
    assert issubclass(DaskannError, Exception) and daskann.DaskannError is DaskannError


def test_every_error_class_in_the_package_derives_from_daskann_error():
    # error classes defined anywhere else (private control flow included) still share the base
    for info in pkgutil.walk_packages(daskann.__path__, "daskann."):
        if info.name.endswith(("__main__", ".cli")):
            continue
        try:
            module = importlib.import_module(info.name)
        except ImportError:  # a module of an optional extra that is not installed here
            continue
        for _, obj in inspect.getmembers(module, inspect.isclass):
            if issubclass(obj, BaseException) and obj.__module__.startswith("daskann"):
                assert issubclass(obj, DaskannError), f"{obj.__module__}.{obj.__name__}"


def test_errors_keep_their_messages_and_attributes():
    diverged = exceptions.TrainingDiverged(7, "the loss")
    assert diverged.step == 7 and diverged.what == "the loss" and "diverged at step 7" in str(diverged)
    full = exceptions.DiskFullError(28, "no room")
    assert full.errno == 28 and isinstance(full, OSError)
    late = exceptions.ExchangeTimeout("block w[0,1] did not arrive", "tcp://10.0.0.1:1234")
    assert str(late) == "block w[0,1] did not arrive" and late.source == "tcp://10.0.0.1:1234"
    with pytest.raises(ValueError):  # an old ``except ValueError`` still catches a store error
        raise exceptions.DamagedStoreError("checksum mismatch")


def test_one_rule_names_the_cause_of_divergence():
    cause = exceptions.DivergenceCause
    assert cause.of() is cause.FINITE and cause.FINITE.what == ""
    assert cause.of(weights=False).what == "the weights"
    # a loss or gradient that is not finite is the cause, whatever the weights
    for known in ({"loss": False}, {"gradients": False}, {"gradients": False, "weights": False}):
        assert cause.of(**known).what == "the loss or its gradients"
    # workers exchange causes as numbers: the worst of a step's parts is their maximum
    announced = [float(c) for c in (cause.WEIGHTS, cause.FINITE, cause.LOSS_OR_GRADIENTS)]
    assert max(cause(int(c)) for c in announced) is cause.LOSS_OR_GRADIENTS
