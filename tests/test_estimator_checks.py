"""scikit-learn's own estimator suite on every trainer, classifier and regressor settings.

``parametrize_with_checks`` runs every check of ``check_estimator``; the parallel
trainers run them on the shared 2-worker process cluster, made the current
client, so each fit, prediction and failure goes through the real distributed
scheduler. The settings are small networks that learn the checks' data sets
(the classifier checks ask for accuracy above 0.83, the regressor ones for R^2
above 0.5) in a few epochs.
"""

from __future__ import annotations

import pytest
from sklearn.utils.estimator_checks import parametrize_with_checks

from daskann import NPTTrainer
from daskann._methods import METHODS
from daskann.exceptions import BatchSizeClipped

# the checks fit on 1 to 300 rows: batch_size is clipped to the smaller ones, as MLPClassifier's
pytestmark = pytest.mark.filterwarnings(f"ignore::{BatchSizeClipped.__module__}.{BatchSizeClipped.__name__}")

# two epochs (eight steps on 300 rows) reach accuracy 0.907 and 0.97 on check_classifiers_train's
# problems: graph-mode NPT runs each step as a chain of tasks, so steps are most of these checks' time
CLASSIFIER = dict(loss="cross_entropy", lr=0.3, batch_size=64, epochs=2, sgd={"momentum": 0.5})
# the regressor checks' targets are not scaled (standard deviation 42) in some checks: a small step stays stable
REGRESSOR = dict(lr=0.01, batch_size=16, epochs=10, sgd={"momentum": 0.5})

#: each method's classifier and regressor: the settings above with its own (daskann._methods)
TRAINERS = {
    method.name: [
        method.trainer_class()((8,), **own, **settings)
        for own, settings in zip(method.estimator_checks, (CLASSIFIER, REGRESSOR), strict=True)
    ]
    for method in METHODS
}
#: a method without a client parameter runs in this process; the others on the cluster
SERIAL = [t for trainers in TRAINERS.values() for t in trainers if "client" not in t.get_params()]
PARALLEL = [t for trainers in TRAINERS.values() for t in trainers if "client" in t.get_params()]


def _expected_failures(trainer) -> dict:
    """Checks a trainer cannot meet by its method, with the reason (scikit-learn's own mechanism)."""
    return {}


@parametrize_with_checks(SERIAL, expected_failed_checks=_expected_failures)
def test_serial_trainer_passes_the_estimator_checks(estimator, check):
    check(estimator)


@parametrize_with_checks(PARALLEL, expected_failed_checks=_expected_failures)
def test_parallel_trainers_pass_the_estimator_checks(estimator, check, client2):
    with client2.as_current():
        check(estimator)


BAD_INPUT_CHECKS = [
    "check_estimators_empty_data_messages",
    "check_complex_data",
    "check_requires_y_none",
    "check_classifiers_regression_target",
    "check_estimator_sparse_array",
    "check_estimator_sparse_matrix",
    "check_estimator_sparse_tag",
]


@pytest.mark.parametrize("name", BAD_INPUT_CHECKS)
def test_bad_input_checks_get_sklearns_messages_and_submit_nothing(name, client2):
    # scikit-learn's own checks of refused input, on a parallel trainer: each finds its message
    # pattern, and the scheduler sees no task (the checks run before anything is submitted)
    from conftest import no_tasks_submitted
    from sklearn.utils import estimator_checks

    check = getattr(estimator_checks, name)
    trainer = NPTTrainer((8,), grid="1x2", mode="graph", **CLASSIFIER)
    with client2.as_current(), no_tasks_submitted(client2):
        check(type(trainer).__name__, trainer)


KINDS = ("classifier", "regressor")
#: one trainer of each parallel method (its classifier), and its regressor where its own settings differ
EXPLICIT_CLIENT = {
    f"{method.name}-{kind}": (method.trainer_class(), {**own, **settings})
    for method in METHODS
    if "client" in method.trainer_class()._get_param_names()
    for kind, own, settings in zip(KINDS, method.estimator_checks, (CLASSIFIER, REGRESSOR), strict=True)
    if kind == "classifier" or own != method.estimator_checks[0]
}


@pytest.mark.parametrize("name", list(EXPLICIT_CLIENT))
def test_parallel_trainers_pass_the_estimator_checks_with_a_client_parameter(name, client2):
    # as a cluster user writes it, client=c, with no current client: the checks then pickle, deep-copy,
    # clone and hash a trainer (and its get_params()) holding a live client
    from sklearn.utils.estimator_checks import check_estimator

    cls, settings = EXPLICIT_CLIENT[name]
    results = check_estimator(cls((8,), client=client2, **settings), on_fail=None, on_skip=None)
    # check_estimators_pickle runs twice (the second time on read-only memory maps): a list keeps both
    failed = [f"{r['check_name']}: {r['exception']!r}" for r in results if r["status"] == "failed"]
    passed = sum(r["status"] == "passed" for r in results)
    assert not failed, f"{passed}/{len(results)} checks passed; failed: {failed}"
