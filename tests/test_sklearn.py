"""Trainers are scikit-learn estimators: clone, searches, predict, score, fitted checks."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.base import clone, is_classifier, is_regressor
from sklearn.exceptions import NotFittedError
from sklearn.metrics import accuracy_score, r2_score
from sklearn.model_selection import GridSearchCV
from sklearn.utils.validation import check_is_fitted

from daskann import MGRITTrainer, NPTTrainer, PartitionTrainer, SerialTrainer
from daskann.data import make_linear

TRAINERS = [SerialTrainer, NPTTrainer, MGRITTrainer, PartitionTrainer]


@pytest.fixture(scope="module")
def regression():
    return make_linear(128, 4, 1, seed=0)


@pytest.fixture(scope="module")
def classification():
    # three well separated blobs, so a few SGD steps learn them
    rng = np.random.default_rng(0)
    centres = np.array([[3.0, 0.0, 0.0, 0.0], [0.0, 3.0, 0.0, 0.0], [0.0, 0.0, 3.0, 0.0]])
    y = np.tile(np.arange(3), 40)
    X = centres[y] + rng.normal(scale=0.5, size=(y.size, 4))
    return X, y


@pytest.mark.parametrize("cls", TRAINERS, ids=lambda c: c.__name__)
def test_clone_keeps_every_parameter_and_shares_the_client(cls):
    client = object()  # a clone must not copy a client: it is a connection
    kwargs = {"client": client} if "client" in cls._get_param_names() else {}
    trainer = cls((8, 4), lr=0.05, seed=3, checkpoint_every=7, **kwargs)
    copy = clone(trainer)
    assert type(copy) is cls and copy is not trainer
    assert copy.get_params(deep=False) == trainer.get_params(deep=False)
    if kwargs:
        assert copy.client is client
    # every keyword is stored unchanged under its own name (the estimator contract)
    defaults = cls()
    for name, value in defaults.get_params(deep=False).items():
        assert getattr(defaults, name) is value


def test_clone_of_a_fitted_trainer_is_unfitted(regression):
    X, y = regression
    trainer = SerialTrainer((8,), lr=0.05).fit(X, y, steps=5)
    copy = clone(trainer)
    with pytest.raises(NotFittedError):
        check_is_fitted(copy)
    check_is_fitted(trainer)


@pytest.mark.parametrize("cls", TRAINERS, ids=lambda c: c.__name__)
def test_unfitted_trainers_raise_not_fitted_error(cls, regression):
    X, y = regression
    trainer = cls((8,))
    with pytest.raises(NotFittedError):
        check_is_fitted(trainer)
    for call in (lambda: trainer.predict(X), lambda: trainer.score(X, y), lambda: trainer.save("unused")):
        with pytest.raises(NotFittedError, match="not fitted"):
            call()
    assert "<div" in trainer._repr_html_()  # the notebook repr works before and after fit


def test_regression_predict_and_r2_score(regression):
    X, y = regression
    trainer = SerialTrainer((16,), lr=0.05, batch_size=16).fit(X, y, steps=60)
    predicted = trainer.predict(X)
    assert predicted.shape == (X.shape[0],)  # one output: a 1-d prediction, as y
    assert trainer.score(X, y) == pytest.approx(r2_score(y, predicted)) and trainer.score(X, y) > 0.5
    assert is_regressor(trainer) and not is_classifier(trainer)
    assert not hasattr(trainer, "predict_proba")
    with pytest.raises(AttributeError) as info:
        trainer.predict_proba(X)
    assert "loss='cross_entropy'" in str(info.value.__cause__)
    assert "<div" in trainer._repr_html_()


def test_classification_predict_proba_and_accuracy(classification):
    X, y = classification
    trainer = SerialTrainer((8,), loss="cross_entropy", lr=0.1, batch_size=16).fit(X, y, steps=60)
    proba = trainer.predict_proba(X)
    assert proba.shape == (X.shape[0], 3)
    np.testing.assert_allclose(proba.sum(axis=1), 1.0)
    np.testing.assert_array_equal(proba.argmax(axis=1), trainer.predict(X))
    np.testing.assert_array_equal(trainer.classes_, [0, 1, 2])
    assert trainer.score(X, y) == accuracy_score(y, trainer.predict(X)) > 0.9
    assert is_classifier(trainer)
    with pytest.raises(ValueError, match="features"):
        trainer.predict(X[:, :3])


def test_grid_search_over_lr_on_the_serial_trainer(regression):
    X, y = regression
    search = GridSearchCV(SerialTrainer((8,), batch_size=16), {"lr": [1e-4, 0.05]}, cv=2, error_score="raise")
    search.fit(X, y, steps=40)  # fit parameters reach every trainer's fit
    assert search.best_params_ == {"lr": 0.05}
    assert search.best_estimator_.n_steps_ == 40
    assert search.score(X, y) == search.best_estimator_.score(X, y)


def test_grid_search_over_lr_on_the_partition_trainer(client2, classification):
    X, y = classification
    trainer = PartitionTrainer((8,), loss="cross_entropy", batch_size=16, k=2, noise=0.0, client=client2)
    search = GridSearchCV(trainer, {"lr": [1e-4, 0.1]}, cv=2, error_score="raise").fit(X, y, steps=30)
    assert search.best_params_ == {"lr": 0.1}
    best = search.best_estimator_
    assert best.client is client2 and best.sub_steps_ == 30
    assert search.score(X, y) == best.score(X, y) > 0.9
    np.testing.assert_allclose(best.predict_proba(X).sum(axis=1), 1.0)
