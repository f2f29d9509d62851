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


def test_fit_trains_for_the_settings_length_and_fit_overrides_it(classification):
    X, y = classification
    trainer = SerialTrainer((8,), loss="cross_entropy", output="softmax", batch_size=20)
    assert trainer.fit(X, y).n_steps_ == 10 * (X.shape[0] // 20)  # epochs=10 by default
    assert trainer.set_params(steps=7).fit(X, y).n_steps_ == 7  # steps, where set, wins over epochs
    assert trainer.fit(X, y, epochs=2).n_steps_ == 2 * (X.shape[0] // 20)  # fit's own length for that call
    with pytest.raises(ValueError, match="steps/epochs"):
        trainer.fit(X, y, steps=3, epochs=1)
    with pytest.raises(ValueError, match="epochs=0"):
        SerialTrainer(epochs=0).fit(X, y)


def test_any_hashable_labels_round_trip_through_classes(classification):
    X, y = classification
    names = np.array(["setosa", "versicolor", "virginica"])[y]
    kwargs = dict(loss="cross_entropy", output="softmax", lr=0.1, batch_size=20, epochs=5)
    by_name = SerialTrainer((8,), **kwargs).fit(X, names)
    by_index = SerialTrainer((8,), **kwargs).fit(X, y)
    assert by_name.classes_.tolist() == ["setosa", "versicolor", "virginica"]
    assert by_name.predict(X).tolist() == names[by_index.predict(X)].tolist()
    np.testing.assert_array_equal(by_name.predict_proba(X), by_index.predict_proba(X))
    shifted = SerialTrainer((8,), **kwargs).fit(X, y * 10 - 5)  # labels -5, 5, 15: three outputs, not sixteen
    assert shifted.classes_.tolist() == [-5, 5, 15] and shifted.model_.sizes[-1] == 3
    with pytest.raises(ValueError, match=r"labels \['rose'\]"):
        by_name.partial_fit(X[:5], np.array(["rose"] * 5))


def test_partial_fit_takes_classes_on_the_first_call_and_trains_an_epoch(classification):
    X, y = classification
    trainer = SerialTrainer((8,), loss="cross_entropy", output="softmax", batch_size=20)
    trainer.partial_fit(X[:40], y[:40] * 0, classes=[0, 1, 2])  # one class in the first block
    assert trainer.classes_.tolist() == [0, 1, 2] and trainer.model_.sizes[-1] == 3
    assert trainer.n_steps_ == 2  # one epoch over the 40 rows
    trainer.partial_fit(X, y, classes=[0, 1, 2])
    assert trainer.n_steps_ == 2 + X.shape[0] // 20
    with pytest.raises(ValueError, match="classes="):
        trainer.partial_fit(X, y, classes=[0, 1])
    with pytest.raises(ValueError, match="X has 3 features, but SerialTrainer is expecting 4 features"):
        trainer.partial_fit(X[:, :3], y)


def test_batch_size_larger_than_the_data_is_clipped_with_a_warning(regression):
    from daskann.exceptions import BatchSizeClipped

    X, y = regression
    with pytest.warns(BatchSizeClipped, match=f"batch_size=500 is larger than the {X.shape[0]} samples"):
        trainer = SerialTrainer((8,), batch_size=500).fit(X, y, steps=3)
    assert trainer.batch_order_.batch_size == X.shape[0]
    assert trainer.get_params()["batch_size"] == 500  # the setting itself is left as given


def test_integer_features_and_frames_are_converted_and_named(regression):
    pd = pytest.importorskip("pandas")
    X, y = regression
    frame = pd.DataFrame(np.round(X).astype(np.int64), columns=[f"f{i}" for i in range(X.shape[1])])
    trainer = SerialTrainer((8,), steps=5).fit(frame, y)
    assert trainer.n_features_in_ == 4 and trainer.feature_names_in_.tolist() == ["f0", "f1", "f2", "f3"]
    assert trainer.predict(frame).dtype == np.float64


def test_cross_val_score_of_a_pipeline_trains_with_the_settings_length(classification):
    from sklearn.model_selection import cross_val_score
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    X, y = classification
    pipeline = make_pipeline(
        StandardScaler(), SerialTrainer((8,), loss="cross_entropy", output="softmax", lr=0.1, batch_size=16)
    )
    scores = cross_val_score(pipeline, X * 1000.0, y, cv=3)
    print(f"\ncross_val_score(StandardScaler -> SerialTrainer): {np.round(scores, 3).tolist()}")
    assert scores.min() > 0.9


def test_batch_size_is_clipped_per_partial_fit_call(regression):
    from daskann.exceptions import BatchSizeClipped

    X, y = regression
    trainer = SerialTrainer((8,), batch_size=32)
    with pytest.warns(BatchSizeClipped):
        trainer.partial_fit(X[:10], y[:10])
    assert trainer.batch_order_.batch_size == 10
    trainer.partial_fit(X, y)  # the whole set: the setting's 32 rows again
    assert trainer.batch_order_.batch_size == 32 and trainer.n_steps_ == 1 + X.shape[0] // 32
