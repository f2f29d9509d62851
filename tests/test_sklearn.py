"""Trainers are scikit-learn estimators: clone, searches, predict, score, fitted checks."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.base import clone, is_classifier, is_regressor
from sklearn.exceptions import NotFittedError
from sklearn.metrics import accuracy_score, r2_score
from sklearn.model_selection import GridSearchCV
from sklearn.utils.validation import check_is_fitted

from daskann import (
    CheckpointOptions,
    MGRITTrainer,
    NetworkOptions,
    NPTTrainer,
    PartitionTrainer,
    SerialTrainer,
    SGDOptions,
)
from daskann._base import BaseTrainer
from daskann.data import make_linear
from daskann.mgrit import PRESETS, MGRITEngineOptions, MGRITSolverOptions, resolve_preset
from daskann.npt import NPTEngineOptions
from daskann.partition import PartitionMergeOptions, PartitionSplitOptions

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
    trainer = cls((8, 4), lr=0.05, seed=3, checkpoint={"every": 7}, **kwargs)
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
    trainer = PartitionTrainer((8,), loss="cross_entropy", batch_size=16, k=2, merge={"noise": 0.0}, client=client2)
    search = GridSearchCV(trainer, {"lr": [1e-4, 0.1]}, cv=2, error_score="raise").fit(X, y, steps=30)
    assert search.best_params_ == {"lr": 0.1}
    best = search.best_estimator_
    assert best.client is client2 and best.sub_steps_ == 30
    assert search.score(X, y) == best.score(X, y) > 0.9
    np.testing.assert_allclose(best.predict_proba(X).sum(axis=1), 1.0)


def test_fit_trains_for_the_settings_length_and_fit_overrides_it(classification):
    X, y = classification
    trainer = SerialTrainer((8,), loss="cross_entropy", batch_size=20, network={"output": "softmax"})
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
    kwargs = dict(loss="cross_entropy", lr=0.1, batch_size=20, epochs=5, network={"output": "softmax"})
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
    trainer = SerialTrainer((8,), loss="cross_entropy", batch_size=20, network={"output": "softmax"})
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
        StandardScaler(),
        SerialTrainer((8,), loss="cross_entropy", lr=0.1, batch_size=16, network={"output": "softmax"}),
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


# -- option groups: a short constructor, every option still settable ---------------------------------------
SHARED_GROUPS = {"network": NetworkOptions, "sgd": SGDOptions, "checkpoint": CheckpointOptions}
METHOD_GROUPS = {
    MGRITTrainer: {"solver": MGRITSolverOptions, "engine": MGRITEngineOptions},
    PartitionTrainer: {"split": PartitionSplitOptions, "merge": PartitionMergeOptions},
    NPTTrainer: {"engine": NPTEngineOptions},
}
#: every group of every trainer: the shared ones and its method's
GROUPS = {cls: {**SHARED_GROUPS, **METHOD_GROUPS.get(cls, {})} for cls in TRAINERS}
#: the settings every trainer takes, the shared groups among them
SHARED = "hidden_sizes activation loss lr batch_size epochs steps seed verbose network sgd checkpoint".split()
#: the flat keywords each trainer took before its options were grouped, by the group that holds them now
FORMER = {
    MGRITTrainer: {
        "solver": (
            "levels cfactor cf_iter cycle_type weight_c weight_c_growth tol rtol max_iter nested_iteration coarse "
            "alpha_growth alpha_cap substeps coarse_batches divergence_factor require_convergence compute_error"
        ).split(),
        "engine": ["scheduler", "store", "intervals_per_task", "timeout"],
    },
    PartitionTrainer: {
        "split": ["sub_steps", "sub_epochs", "mode", "sub_trainer", "npt_options", "retries", "timeout"],
        "merge": ["combine", "noise", "finetune_trainer"],
    },
    NPTTrainer: {"engine": ["share_workers", "deterministic", "pipeline", "timeout"]},
}


@pytest.mark.parametrize("cls", list(METHOD_GROUPS), ids=lambda c: c.__name__)
def test_a_method_adds_at_most_four_parameters_to_the_shared_ones(cls):
    own = [name for name in cls._get_param_names() if name not in BaseTrainer._get_param_names()]
    assert len(own) <= 4 and "client" in own, own
    assert set(METHOD_GROUPS[cls]) <= set(own)


def test_no_trainer_takes_more_than_sixteen_parameters():
    assert sorted(BaseTrainer._get_param_names()) == sorted(SHARED)
    counts = {cls.__name__: len(cls._get_param_names()) for cls in TRAINERS}
    assert counts == {"SerialTrainer": 14, "NPTTrainer": 16, "MGRITTrainer": 16, "PartitionTrainer": 16}


def test_shared_groups_reach_the_settings_the_methods_consume(tmp_path):
    trainer = NPTTrainer(
        network={"output": "softmax", "negative_slope": 0.2, "dtype": "float32"},
        sgd=SGDOptions(momentum=0.5, shuffle=False),
        checkpoint=CheckpointOptions(dir=tmp_path, every=7),
    )
    settings = trainer._check_settings(eval_every=3)
    got = {
        k: settings[k] for k in ("output", "negative_slope", "momentum", "shuffle", "checkpoint_every", "eval_every")
    }
    assert got == {
        "output": "softmax",
        "negative_slope": 0.2,
        "momentum": 0.5,
        "shuffle": False,
        "checkpoint_every": 7,
        "eval_every": 3,
    }
    assert settings["dtype"] == np.float32 and trainer._checkpoint_dir == tmp_path
    # the defaults: float64, plain SGD over shuffled batches, nothing written
    settings = SerialTrainer()._check_settings()
    assert (settings["dtype"], settings["momentum"], settings["shuffle"], settings["output"]) == (
        np.float64,
        0.0,
        True,
        "linear",
    )
    assert SerialTrainer()._checkpoint_dir is None


def test_checkpoint_takes_a_folder_and_keeps_it_when_one_option_is_set(tmp_path, regression):
    X, y = regression
    trainer = SerialTrainer((8,), batch_size=16, checkpoint=tmp_path / "run")
    assert trainer.set_params(checkpoint__every=2).checkpoint == {"dir": tmp_path / "run", "every": 2}
    trainer.fit(X, y, steps=4)
    assert len(list((tmp_path / "run" / "checkpoints").iterdir())) == 2
    with pytest.raises(TypeError, match=r"checkpoint=3 is not valid: expected a path \(its 'dir'\), None"):
        SerialTrainer(checkpoint=3).fit(X, y)


def test_eval_every_is_a_fit_parameter(regression):
    X, y = regression
    trainer = SerialTrainer((8,), batch_size=16).fit(X, y, steps=6, validation_data=(X, y), eval_every=4)
    assert np.flatnonzero(~np.isnan(trainer.history_["val_loss"].values)).tolist() == [3, 5]  # steps 4 and 6
    with pytest.raises(ValueError, match="eval_every=0 is not valid"):
        SerialTrainer().fit(X, y, eval_every=0)


def test_grid_search_over_sgd_momentum(classification):
    X, y = classification
    trainer = SerialTrainer((8,), loss="cross_entropy", lr=0.1, batch_size=16, epochs=3, sgd={"shuffle": False})
    search = GridSearchCV(trainer, {"sgd__momentum": [0.0, 0.9]}, cv=2, error_score="raise").fit(X, y)
    assert search.best_estimator_.sgd == {"shuffle": False, "momentum": search.best_params_["sgd__momentum"]}
    assert trainer.sgd == {"shuffle": False}


@pytest.mark.parametrize("cls", list(METHOD_GROUPS), ids=lambda c: c.__name__)
def test_every_former_option_is_an_option_of_its_group(cls):
    for group, names in FORMER[cls].items():
        options = METHOD_GROUPS[cls][group]
        assert set(names) == set(options._get_param_names()), group
        assert not set(names) & set(cls._get_param_names())  # no longer flat


@pytest.mark.parametrize("form", ["none", "dict", "object"])
@pytest.mark.parametrize("cls", list(GROUPS), ids=lambda c: c.__name__)
def test_set_params_sets_one_option_of_a_group_in_every_form(cls, form):
    for group, options in GROUPS[cls].items():
        given = {"none": None, "dict": {}, "object": options()}[form]
        trainer = cls((8,), **{group: given})
        for name in options._get_param_names():
            value = "x" if name != "store" else "/tmp/store"
            assert trainer.set_params(**{f"{group}__{name}": value}) is trainer
            current = getattr(trainer, group)
            assert (current[name] if isinstance(current, dict) else getattr(current, name)) == value
        if form == "object":
            assert getattr(trainer, group) is given  # changed in place, as scikit-learn's nested parameters
            assert f"{group}__{name}" in trainer.get_params(deep=True)
        else:
            assert given in (None, {}) and isinstance(getattr(trainer, group), dict)  # a new dict, never the user's
        with pytest.raises(ValueError, match=rf"{group}\['nonsense'\]|Invalid parameter 'nonsense'"):
            trainer.set_params(**{f"{group}__nonsense": 1})


@pytest.mark.parametrize("cls", list(GROUPS), ids=lambda c: c.__name__)
def test_clone_and_get_params_round_trip_every_form_of_a_group(cls):
    for group, options in GROUPS[cls].items():
        name = options._get_param_names()[0]
        for given in ({name: 3}, options(**{name: 3})):
            trainer = cls((8,), **{group: given})
            assert trainer.get_params(deep=False)[group] is given  # stored unchanged
            copy = clone(trainer)
            value = copy.get_params(deep=False)[group]
            assert value is not given and type(value) is type(given)
            assert (value if isinstance(value, dict) else value.get_params()) == (
                given if isinstance(given, dict) else given.get_params()
            )
            again = cls(**trainer.get_params(deep=False))
            assert repr(again) == repr(trainer)


def test_every_preset_is_reachable_and_solver_options_override_it():
    for preset in PRESETS:
        assert MGRITTrainer(preset=preset)._solver_options() == resolve_preset(preset)
        got = MGRITTrainer(preset=preset, solver={"levels": 5, "rtol": 1e-6})._solver_options()
        assert got == resolve_preset(preset, levels=5, rtol=1e-6)
        via_object = MGRITTrainer(preset=preset, solver=MGRITSolverOptions(cycle_type="F"))._solver_options()
        assert via_object == resolve_preset(preset, cycle_type="F")


def test_former_options_reach_the_settings_the_methods_consume():
    # MGRIT: every preset option through the solver group
    for name, value in {"levels": 4, "cfactor": 2, "cf_iter": 2, "cycle_type": "F", "alpha_cap": 3.0}.items():
        assert MGRITTrainer().set_params(**{f"solver__{name}": value})._solver_options()[name] == value
    # partition: split and merge options become the checked settings
    trainer = PartitionTrainer(
        (8,),
        split=PartitionSplitOptions(sub_epochs=2, mode="sequential", retries=0, timeout=5.0),
        merge={"combine": "sum", "noise": 0.0, "finetune_trainer": "serial"},
    )
    settings = trainer._check_settings()
    expected = {"sub_epochs": 2, "mode": "sequential", "retries": 0, "timeout": 5.0, "combine": "sum", "noise": 0.0}
    assert {k: settings[k] for k in expected} == expected and settings["finetune_trainer"] == "serial"
    # NPT: the engine options
    npt = NPTTrainer(engine={"pipeline": "fused", "share_workers": True, "deterministic": False, "timeout": 9.0})
    checked = npt._check_npt()
    assert (checked["pipeline"], checked["share_workers"], checked["deterministic"], checked["timeout"]) == (
        "fused",
        True,
        False,
        9.0,
    )


@pytest.mark.parametrize(
    "cls", [*GROUPS, *dict.fromkeys(o for g in GROUPS.values() for o in g.values())], ids=lambda c: c.__name__
)
def test_scikit_learn_constructor_checks(cls):
    from sklearn.utils.estimator_checks import (
        check_do_not_raise_errors_in_init_or_set_params,
        check_get_params_invariance,
        check_no_attributes_set_in_init,
        check_parameters_default_constructible,
        check_set_params,
    )

    for check in (
        check_parameters_default_constructible,
        check_no_attributes_set_in_init,
        check_get_params_invariance,
        check_set_params,
        check_do_not_raise_errors_in_init_or_set_params,
    ):
        check(cls.__name__, cls())


def test_grid_search_over_a_solver_option(regression):
    X, y = regression
    trainer = MGRITTrainer((8,), batch_size=16, solver={"levels": 2}, engine={"scheduler": "inprocess"})
    search = GridSearchCV(trainer, {"solver__cfactor": [2, 4]}, cv=2, error_score="raise")
    search.fit(X, y, steps=16)
    assert search.best_params_["solver__cfactor"] in (2, 4)
    assert search.best_estimator_.solver == {"levels": 2, "cfactor": search.best_params_["solver__cfactor"]}
    assert trainer.solver == {"levels": 2}  # the search's clones changed their own copies
