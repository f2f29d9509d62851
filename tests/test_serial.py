"""SerialTrainer: the reference every parallel trainer is tested against."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import xarray as xr
from reference_mlp import train as reference_train

from daskann import MLP, SerialTrainer, TrainingDiverged, load_checkpoint
from daskann.data import make_linear


def _relative_error(a, b):
    return np.linalg.norm(a - b) / np.linalg.norm(b)


@pytest.fixture(scope="module")
def regression():
    return make_linear(96, 6, 3, noise=0.1, seed=1)


@pytest.fixture(scope="module")
def classification():
    rng = np.random.default_rng(2)
    X = rng.standard_normal((96, 6))
    return X, (X[:, 0] + X[:, 1] > 0).astype(np.int64) + (X[:, 2] > 1)


@pytest.mark.parametrize("activation", ["relu", "leaky_relu"])
@pytest.mark.parametrize("loss", ["mse", "cross_entropy"])
def test_matches_independent_training_to_1e12(activation, loss, regression, classification):
    X, y = regression if loss == "mse" else classification
    n_out = y.shape[1] if loss == "mse" else 3
    kwargs = {"activation": activation, "loss": loss, "lr": 0.05, "momentum": 0.9, "batch_size": 16, "seed": 7}
    trainer = SerialTrainer((10, 8), **kwargs).fit(X, y, steps=50)
    Ws, bs, vW, vb, losses = reference_train(
        X, y, (6, 10, 8, n_out), activation=activation, loss=loss, lr=0.05, momentum=0.9,
        batch_size=16, steps=50, seed=7,
    )
    errors = [_relative_error(a, b) for a, b in zip(trainer.model_.params, [p for wb in zip(Ws, bs) for p in wb])]
    errors += [_relative_error(a, b) for a, b in zip(trainer.velocity_, [p for wb in zip(vW, vb) for p in wb])]
    assert max(errors) < 1e-12, errors
    np.testing.assert_allclose(trainer.history_["loss"].values, losses, rtol=1e-12)


def test_history_is_an_xarray_dataset_over_steps(classification):
    X, y = classification
    trainer = SerialTrainer((8,), loss="cross_entropy", batch_size=16).fit(
        X, y, epochs=2, validation_data=(X[:20], y[:20])
    )
    h = trainer.history_
    assert isinstance(h, xr.Dataset) and h.sizes["step"] == 12
    assert list(h["step"].values) == list(range(1, 13))
    assert {"loss", "time", "val_loss", "val_accuracy"} <= set(h.data_vars)
    assert h["time"].attrs["units"] == "s" and np.all(np.diff(h["time"].values) >= 0)
    # validated once per epoch
    assert np.isfinite(h["val_accuracy"].values).sum() == 2
    assert trainer.n_steps_ == 12


def test_fit_is_deterministic_and_partial_fit_continues(regression):
    X, y = regression
    straight = SerialTrainer((8,), momentum=0.5, batch_size=16).fit(X, y, steps=30)
    again = SerialTrainer((8,), momentum=0.5, batch_size=16).fit(X, y, steps=30)
    split = SerialTrainer((8,), momentum=0.5, batch_size=16).fit(X, y, steps=12).partial_fit(steps=18)
    for a, b, c in zip(straight.model_.params, again.model_.params, split.model_.params):
        assert np.array_equal(a, b) and np.array_equal(a, c)
    assert split.history_.sizes["step"] == 30


def test_unshuffled_order_walks_rows(regression):
    X, y = regression
    trainer = SerialTrainer((4,), batch_size=40, shuffle=False).fit(X, y, steps=3)
    assert np.array_equal(trainer.batch_order_.indices(2), (80 + np.arange(40)) % 96)


def test_init_model_is_used_and_not_modified(regression):
    X, y = regression
    start = MLP([6, 8, 3], seed=11)
    before = [p.copy() for p in start.params]
    trainer = SerialTrainer((8,), batch_size=16, seed=11).fit(X, y, steps=5, init_model=start)
    assert all(np.array_equal(a, b) for a, b in zip(start.params, before))
    reference = SerialTrainer((8,), batch_size=16, seed=11).fit(X, y, steps=5)
    assert all(np.array_equal(a, b) for a, b in zip(trainer.model_.params, reference.model_.params))


def test_float32_training(regression):
    X, y = regression
    trainer = SerialTrainer((8,), dtype="float32", batch_size=16).fit(X, y, steps=10)
    assert all(p.dtype == np.float32 for p in trainer.model_.params)


def test_divergence_stops_and_keeps_last_finite_state(regression):
    X, y = regression
    trainer = SerialTrainer((16, 16), lr=1e3, momentum=0.9, batch_size=16)
    with pytest.raises(TrainingDiverged, match=r"diverged at step (\d+)") as info:
        trainer.fit(X, y * 1e3, steps=200)
    assert 1 < info.value.step <= 200
    assert all(np.isfinite(p).all() for p in trainer.model_.params)
    assert trainer.n_steps_ == info.value.step - 1 == trainer.history_.sizes["step"]


def test_scikit_learn_parameter_protocol():
    trainer = SerialTrainer((8, 4), lr=0.1)
    params = trainer.get_params()
    assert params["hidden_sizes"] == (8, 4) and params["lr"] == 0.1 and "checkpoint_dir" in params
    assert trainer.set_params(momentum=0.5) is trainer and trainer.momentum == 0.5
    assert "lr=0.1" in repr(trainer) and "momentum=0.5" in repr(trainer)
    with pytest.raises(ValueError, match="parameter name"):
        trainer.set_params(learning_rate=1)


def test_checkpoints_resume_bit_for_bit_in_a_new_process(tmp_path, regression):
    X, y = regression
    data = tmp_path / "data.npz"
    np.savez(data, X=X, y=y)
    kwargs = {"momentum": 0.9, "batch_size": 16, "lr": 0.05, "seed": 3}
    straight = SerialTrainer((8, 8), **kwargs).fit(X, y, steps=40)
    run = tmp_path / "run"
    SerialTrainer((8, 8), checkpoint_dir=run, checkpoint_every=10, **kwargs).fit(X, y, steps=25)
    assert (run / "checkpoints" / "step-00000025.zarr").is_dir()
    script = f"""
import numpy as np
from daskann import SerialTrainer
d = np.load({str(data)!r})
t = SerialTrainer((8, 8), checkpoint_dir={str(run)!r}, **{kwargs!r}).fit(d["X"], d["y"], steps=40, resume={str(run)!r})
t.save({str(tmp_path / "final.zarr")!r})
"""
    subprocess.run([sys.executable, "-c", script], check=True, timeout=120)
    resumed = load_checkpoint(tmp_path / "final.zarr")
    assert resumed.step == 40
    for a, b in zip(resumed.model.params + resumed.velocity, straight.model_.params + straight.velocity_):
        assert np.array_equal(a, b)


def test_resume_refuses_a_checkpoint_of_another_training(tmp_path, regression):
    X, y = regression
    SerialTrainer((8,), batch_size=16, checkpoint_dir=tmp_path / "run").fit(X, y, steps=5)
    with pytest.raises(ValueError, match="does not match.*sizes"):
        SerialTrainer((9,), batch_size=16).fit(X, y, steps=10, resume=tmp_path / "run")
    with pytest.raises(ValueError, match="does not match.*lr"):
        SerialTrainer((8,), batch_size=16, lr=0.5).fit(X, y, steps=10, resume=tmp_path / "run")
    with pytest.raises(FileNotFoundError, match="path="):
        SerialTrainer((8,), batch_size=16).fit(X, y, steps=10, resume=tmp_path / "missing.zarr")


def test_init_model_must_match_data(regression):
    X, y = regression
    trainer = SerialTrainer((8,), batch_size=16).fit(X, y, steps=1, init_model=MLP([6, 8, 3], dtype="float32"))
    assert trainer.model_.dtype == np.float64
    with pytest.raises(TypeError, match="init_model="):
        SerialTrainer((8,), batch_size=16).fit(X, y, steps=1, init_model="weights.npz")


def _bad_cases():
    X = np.random.default_rng(0).standard_normal((20, 4))
    y = np.ones((20, 2))
    nan_X = X.copy()
    nan_X[3, 1] = np.nan
    inf_y = y.copy()
    inf_y[0, 0] = np.inf
    return [
        ({}, {"X": X[:, :, None]}, ValueError, "X="),
        ({}, {"y": y[:15]}, ValueError, "y="),
        ({}, {"init_model": MLP([5, 8, 2])}, ValueError, "X="),
        ({}, {"init_model": MLP([4, 8, 3])}, ValueError, "y="),
        ({}, {"X": X.astype(np.int64)}, TypeError, "X="),
        ({}, {"X": X.astype(object)}, TypeError, "X="),
        ({}, {"y": y.astype(np.int32)}, TypeError, "y="),
        ({}, {"X": nan_X}, ValueError, r"X=.*NaN or Inf.*first at \(3, 1\)"),
        ({}, {"y": inf_y}, ValueError, "y=.*NaN or Inf"),
        ({"loss": "cross_entropy"}, {"y": np.full(20, 0.5)}, ValueError, "y="),
        ({"loss": "cross_entropy"}, {"y": -np.ones(20, int)}, ValueError, "y="),
        ({"lr": 0}, {}, ValueError, "lr="),
        ({"lr": -1.0}, {}, ValueError, "lr="),
        ({"lr": float("nan")}, {}, ValueError, "lr="),
        ({"lr": "fast"}, {}, TypeError, "lr="),
        ({"momentum": 1.0}, {}, ValueError, "momentum="),
        ({"momentum": -0.5}, {}, ValueError, "momentum="),
        ({}, {"steps": 0}, ValueError, "steps="),
        ({}, {"steps": None, "epochs": -1}, ValueError, "epochs="),
        ({}, {"steps": 5, "epochs": 1}, ValueError, "steps/epochs"),
        ({}, {"steps": 2.5}, TypeError, "steps="),
        ({"batch_size": 0}, {}, ValueError, "batch_size="),
        ({"batch_size": 21}, {}, ValueError, "batch_size=.*at most the number of samples"),
        ({"activation": "tanh"}, {}, ValueError, "activation="),
        ({"loss": "hinge"}, {}, ValueError, "loss="),
        ({"output": "sigmoid"}, {}, ValueError, "output="),
        ({"dtype": "int8"}, {}, TypeError, "dtype="),
        ({"hidden_sizes": (8, 0)}, {}, ValueError, r"hidden_sizes\[1\]="),
        ({}, {"validation_data": (X[:, :3], y)}, ValueError, r"validation_data\[0\]="),
    ]


@pytest.mark.parametrize(("settings", "fit_args", "error", "pattern"), _bad_cases())
def test_bad_input_is_refused_with_the_parameter_named(settings, fit_args, error, pattern):
    X = np.random.default_rng(0).standard_normal((20, 4))
    args = {"X": X, "y": np.ones((20, 2)), "steps": 5, **fit_args}
    with pytest.raises(error, match=pattern):
        SerialTrainer(**{"hidden_sizes": (8,), "batch_size": 4, **settings}).fit(args.pop("X"), args.pop("y"), **args)
