"""One home for errors: every public error derives from DaskannError and keeps its built-in base."""

from __future__ import annotations

import copy
import copyreg
import importlib
import inspect
import pickle
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


#: one instance of every public error, built as daskann builds it
EXAMPLES = [
    exceptions.TrainingDiverged(7, "the loss or its gradients"),
    exceptions.MGRITDiverged("a non-finite state", level=1, step=8, iteration=2, residuals=[1.0, 0.5]),
    exceptions.PropagatorError("returned 1 arrays, expected 2", level=1, step=4),
    exceptions.SubModelError({1: exceptions.TrainingDiverged(3, "the weights")}, [object, None], 3),
    exceptions.ExchangeTimeout("block w[0,1] did not arrive", "tcp://127.0.0.1:1234"),
    exceptions.DiskFullError(28, "no room"),
    exceptions.DamagedStoreError("checksum mismatch"),
    exceptions.WorkerLost("worker left", None),
    exceptions.LostWorkersError("gave up"),
]


def _same_error(got, error):
    assert type(got) is type(error) and str(got) == str(error) and got.args == error.args
    assert {k: v for k, v in vars(got).items() if k != "failed"} == {
        k: v for k, v in vars(error).items() if k != "failed"
    }
    if isinstance(error, exceptions.SubModelError):
        assert type(got.failed[1]) is exceptions.TrainingDiverged and got.failed[1].step == 3
    if isinstance(error, OSError):
        assert (got.errno, got.strerror) == (error.errno, error.strerror)


@pytest.mark.parametrize("error", EXAMPLES, ids=lambda e: type(e).__name__)
def test_every_error_pickles_and_copies_whole(error, monkeypatch):
    # as Python's own errors do, whatever arguments its constructor takes. Importing distributed
    # installs tblib's reducers for the error classes that exist by then, so without this test's
    # removal of them, whether an error pickles would depend on the order of imports.
    for cls in {type(error), exceptions.TrainingDiverged}:
        monkeypatch.delitem(copyreg.dispatch_table, cls, raising=False)
    _same_error(pickle.loads(pickle.dumps(error)), error)
    _same_error(copy.copy(error), error)


def _raise(error):
    raise error


@pytest.mark.parametrize("error", EXAMPLES, ids=lambda e: type(e).__name__)
def test_an_error_sent_to_a_task_and_raised_there_reaches_the_client_whole(client2, error):
    future = client2.submit(_raise, error, pure=False)
    with pytest.raises(type(error)) as info:
        future.result(timeout=60)
    _same_error(info.value, error)
