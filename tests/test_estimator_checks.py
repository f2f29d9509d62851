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

from daskann import MGRITTrainer, NPTTrainer, PartitionTrainer, SerialTrainer
from daskann.exceptions import BatchSizeClipped

# the checks fit on 1 to 300 rows: batch_size is clipped to the smaller ones, as MLPClassifier's
pytestmark = pytest.mark.filterwarnings(f"ignore::{BatchSizeClipped.__module__}.{BatchSizeClipped.__name__}")

CLASSIFIER = dict(loss="cross_entropy", lr=0.1, batch_size=64, epochs=5, sgd={"momentum": 0.5})
# the regressor checks' targets are not scaled (standard deviation 42) in some checks: a small step stays stable
REGRESSOR = dict(lr=0.01, batch_size=16, epochs=10, sgd={"momentum": 0.5})

SERIAL = [SerialTrainer((8,), **CLASSIFIER), SerialTrainer((8,), **REGRESSOR)]
PARALLEL = [
    # graph mode costs a scheduler round trip per block product: it runs the classifier's shorter fits
    NPTTrainer((8,), grid="1x2", mode="graph", **CLASSIFIER),
    NPTTrainer((8,), grid="1x2", mode="resident", **REGRESSOR),
    MGRITTrainer((8,), **CLASSIFIER),
    MGRITTrainer((8,), **REGRESSOR),
    PartitionTrainer((8,), **CLASSIFIER),
    PartitionTrainer((8,), **REGRESSOR),
]


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


#: one trainer of each parallel method, with the settings above that learn the checks' data fast
EXPLICIT_CLIENT = {
    "npt-graph": lambda c: NPTTrainer((8,), grid="1x2", mode="graph", client=c, **CLASSIFIER),
    "npt-resident": lambda c: NPTTrainer((8,), grid="1x2", mode="resident", client=c, **REGRESSOR),
    "mgrit": lambda c: MGRITTrainer((8,), client=c, **CLASSIFIER),
    "partition": lambda c: PartitionTrainer((8,), client=c, **CLASSIFIER),
}


@pytest.mark.parametrize("name", list(EXPLICIT_CLIENT))
def test_parallel_trainers_pass_the_estimator_checks_with_a_client_parameter(name, client2):
    # as a cluster user writes it, client=c, with no current client: the checks then pickle, deep-copy,
    # clone and hash a trainer (and its get_params()) holding a live client
    from sklearn.utils.estimator_checks import check_estimator

    results = check_estimator(EXPLICIT_CLIENT[name](client2), on_fail=None, on_skip=None)
    # check_estimators_pickle runs twice (the second time on read-only memory maps): a list keeps both
    failed = [f"{r['check_name']}: {r['exception']!r}" for r in results if r["status"] == "failed"]
    passed = sum(r["status"] == "passed" for r in results)
    assert not failed, f"{passed}/{len(results)} checks passed; failed: {failed}"
