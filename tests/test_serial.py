"""SerialTrainer: the reference every parallel trainer is tested against."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import xarray as xr
from reference_mlp import rows_of_step
from reference_mlp import train as reference_train

from daskann import MLP, SerialTrainer, TrainingDiverged, load_checkpoint
from daskann.data import BatchOrder, coarse_indices, make_linear
from daskann.store import StoreError


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
    kwargs = {"activation": activation, "loss": loss, "lr": 0.05, "batch_size": 16, "seed": 7, "sgd": {"momentum": 0.9}}
    trainer = SerialTrainer((10, 8), **kwargs).fit(X, y, steps=50)
    Ws, bs, vW, vb, losses = reference_train(
        X,
        y,
        (6, 10, 8, n_out),
        activation=activation,
        loss=loss,
        lr=0.05,
        momentum=0.9,
        batch_size=16,
        steps=50,
        seed=7,
    )
    errors = [
        _relative_error(a, b)
        for a, b in zip(trainer.model_.params, [p for wb in zip(Ws, bs, strict=True) for p in wb], strict=True)
    ]
    errors += [
        _relative_error(a, b)
        for a, b in zip(trainer.velocity_, [p for wb in zip(vW, vb, strict=True) for p in wb], strict=True)
    ]
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
    straight = SerialTrainer((8,), batch_size=16, sgd={"momentum": 0.5}).fit(X, y, steps=30)
    again = SerialTrainer((8,), batch_size=16, sgd={"momentum": 0.5}).fit(X, y, steps=30)
    split = SerialTrainer((8,), batch_size=16, sgd={"momentum": 0.5}).fit(X, y, steps=12).partial_fit(steps=18)
    for a, b, c in zip(straight.model_.params, again.model_.params, split.model_.params, strict=True):
        assert np.array_equal(a, b) and np.array_equal(a, c)
    assert split.history_.sizes["step"] == 30


def test_unshuffled_order_walks_rows(regression):
    X, y = regression
    trainer = SerialTrainer((4,), batch_size=40, sgd={"shuffle": False}).fit(X, y, steps=3)
    assert np.array_equal(trainer.batch_order_.indices(2), (80 + np.arange(40)) % 96)


def test_init_model_is_used_and_not_modified(regression):
    X, y = regression
    start = MLP([6, 8, 3], seed=11)
    before = [p.copy() for p in start.params]
    trainer = SerialTrainer((8,), batch_size=16, seed=11).fit(X, y, steps=5, init_model=start)
    assert all(np.array_equal(a, b) for a, b in zip(start.params, before, strict=True))
    reference = SerialTrainer((8,), batch_size=16, seed=11).fit(X, y, steps=5)
    assert all(np.array_equal(a, b) for a, b in zip(trainer.model_.params, reference.model_.params, strict=True))


def test_float32_training(regression):
    X, y = regression
    trainer = SerialTrainer((8,), batch_size=16, network={"dtype": "float32"}).fit(X, y, steps=10)
    assert all(p.dtype == np.float32 for p in trainer.model_.params)


def test_divergence_stops_and_keeps_last_finite_state(regression):
    X, y = regression
    trainer = SerialTrainer((16, 16), lr=1e3, batch_size=16, sgd={"momentum": 0.9})
    with pytest.raises(TrainingDiverged, match=r"diverged at step (\d+)") as info:
        trainer.fit(X, y * 1e3, steps=200)
    assert 1 < info.value.step <= 200
    assert all(np.isfinite(p).all() for p in trainer.model_.params)
    assert trainer.n_steps_ == info.value.step - 1 == trainer.history_.sizes["step"]


def test_divergence_keeps_the_exact_state_of_the_last_finite_step(regression):
    X, y = regression
    kwargs = {"lr": 1e3, "batch_size": 16, "sgd": {"momentum": 0.9}}
    diverged = SerialTrainer((16, 16), **kwargs)
    with pytest.raises(TrainingDiverged) as info:
        diverged.fit(X, y * 1e3, steps=200)
    finite = SerialTrainer((16, 16), **kwargs).fit(X, y * 1e3, steps=info.value.step - 1)
    for kept, reference in zip(
        diverged.model_.params + diverged.velocity_, finite.model_.params + finite.velocity_, strict=True
    ):
        np.testing.assert_array_equal(kept, reference)


def test_training_keeps_the_heap_while_it_runs(monkeypatch, released_heap, regression):
    """In a nanny-started worker (``MALLOC_TRIM_THRESHOLD_`` set) the steps run with the heap kept
    (:mod:`daskann._heap`), as a partition sub-model or dask-ml's Incremental trains there."""
    if released_heap._glibc() is None or not sys.platform.startswith("linux"):
        pytest.skip("glibc's malloc only")
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "65536")
    seen = []
    steps = SerialTrainer._steps

    def watched(self, *args):
        seen.append((released_heap._kept, released_heap._users))
        return steps(self, *args)

    monkeypatch.setattr(SerialTrainer, "_steps", watched)
    X, y = regression
    SerialTrainer((8,), batch_size=16).fit(X, y, steps=3)
    assert seen == [(True, 1)]


def test_scikit_learn_parameter_protocol():
    trainer = SerialTrainer((8, 4), lr=0.1)
    params = trainer.get_params()
    assert params["hidden_sizes"] == (8, 4) and params["lr"] == 0.1 and "checkpoint" in params
    assert trainer.set_params(sgd__momentum=0.5) is trainer and trainer.sgd == {"momentum": 0.5}
    assert "lr=0.1" in repr(trainer) and "sgd={'momentum': 0.5}" in repr(trainer)
    with pytest.raises(ValueError, match="Invalid parameter 'learning_rate'"):
        trainer.set_params(learning_rate=1)


def test_checkpoints_resume_bit_for_bit_in_a_new_process(tmp_path, regression):
    X, y = regression
    data = tmp_path / "data.npz"
    np.savez(data, X=X, y=y)
    kwargs = {"batch_size": 16, "lr": 0.05, "seed": 3, "sgd": {"momentum": 0.9}}
    straight = SerialTrainer((8, 8), **kwargs).fit(X, y, steps=40)
    run = tmp_path / "run"
    SerialTrainer((8, 8), **kwargs, checkpoint={"dir": run, "every": 10}).fit(X, y, steps=25)
    assert (run / "checkpoints" / "step-00000025.zarr").is_dir()
    script = f"""
import numpy as np
from daskann import SerialTrainer
d = np.load({str(data)!r})
t = SerialTrainer((8, 8), checkpoint={str(run)!r}, **{kwargs!r}).fit(d["X"], d["y"], steps=40, resume={str(run)!r})
t.save({str(tmp_path / "final.zarr")!r})
"""
    subprocess.run([sys.executable, "-c", script], check=True, timeout=120)
    resumed = load_checkpoint(tmp_path / "final.zarr")
    assert resumed.step == 40
    for a, b in zip(resumed.model.params + resumed.velocity, straight.model_.params + straight.velocity_, strict=True):
        assert np.array_equal(a, b)


def test_resume_refuses_a_checkpoint_of_another_training(tmp_path, regression):
    X, y = regression
    SerialTrainer((8,), batch_size=16, checkpoint=tmp_path / "run").fit(X, y, steps=5)
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
        # array layouts and targets in scikit-learn's words, so its checks and users recognise them
        ({}, {"X": X[:, :, None]}, ValueError, "Found array with dim 3"),
        ({}, {"X": X[0]}, ValueError, "Reshape your data"),
        ({}, {"y": y[:15]}, ValueError, r"inconsistent numbers of samples: \[20, 15\]"),
        ({}, {"init_model": MLP([5, 8, 2])}, ValueError, "X="),
        ({}, {"init_model": MLP([4, 8, 3])}, ValueError, "y="),
        ({}, {"X": X.astype(complex)}, ValueError, "Complex data not supported"),
        ({}, {"X": np.full((20, 4), "a", dtype=object)}, ValueError, "could not convert string to float"),
        ({}, {"X": nan_X}, ValueError, r"X=.*NaN or Inf.*first at \(3, 1\)"),
        ({}, {"y": inf_y}, ValueError, "Input y contains infinity"),
        ({}, {"y": None}, ValueError, "requires y to be passed, but the target y is None"),
        ({"loss": "cross_entropy"}, {"y": np.full(20, 0.5)}, ValueError, "Unknown label type: continuous"),
        ({"loss": "cross_entropy"}, {"y": np.ones((20, 2), int)}, ValueError, "y should be a 1d array"),
        ({"lr": 0}, {}, ValueError, "lr="),
        ({"lr": -1.0}, {}, ValueError, "lr="),
        ({"lr": float("nan")}, {}, ValueError, "lr="),
        ({"lr": "fast"}, {}, TypeError, "lr="),
        ({"sgd": {"momentum": 1.0}}, {}, ValueError, r"sgd\['momentum'\]="),
        ({"sgd": {"momentum": -0.5}}, {}, ValueError, r"sgd\['momentum'\]="),
        ({}, {"steps": 0}, ValueError, "steps="),
        ({}, {"steps": None, "epochs": -1}, ValueError, "epochs="),
        ({}, {"steps": 5, "epochs": 1}, ValueError, "steps/epochs"),
        ({}, {"steps": 2.5}, TypeError, "steps="),
        ({"batch_size": 0}, {}, ValueError, "batch_size="),
        ({"activation": "swish"}, {}, ValueError, "activation='swish'.*'sigmoid', 'tanh'"),
        ({"loss": "hinge"}, {}, ValueError, "loss='hinge'.*'mse', 'cross_entropy', 'sse'"),
        ({"network": {"output": "relu"}}, {}, ValueError, "network\\['output'\\]='relu'.*'softmax', 'sigmoid', 'tanh'"),
        ({"bias": "no"}, {}, TypeError, "bias='no'"),
        (
            {"sgd": {"shuffle": "serialized"}},
            {},
            ValueError,
            "batch_size=4 is not valid: expected None with shuffle='serial",
        ),
        ({"sgd": {"shuffle": "random"}}, {}, ValueError, r"sgd\['shuffle'\]='random'.*'serialized'"),
        ({"batch_size": None, "sgd": {"shuffle": "serialized"}}, {"steps": 0}, ValueError, "steps="),
        ({"network": {"dtype": "int8"}}, {}, TypeError, r"network\['dtype'\]="),
        ({"hidden_sizes": (8, 0)}, {}, ValueError, r"hidden_sizes\[1\]="),
        ({}, {"validation_data": (X[:, :3], y)}, ValueError, r"validation_data\[0\]="),
    ]


@pytest.mark.parametrize(("settings", "fit_args", "error", "pattern"), _bad_cases())
def test_bad_input_is_refused_with_the_parameter_named(settings, fit_args, error, pattern):
    X = np.random.default_rng(0).standard_normal((20, 4))
    args = {"X": X, "y": np.ones((20, 2)), "steps": 5, **fit_args}
    with pytest.raises(error, match=pattern):
        SerialTrainer(**{"hidden_sizes": (8,), "batch_size": 4, **settings}).fit(args.pop("X"), args.pop("y"), **args)


# -- sigmoid and tanh, no biases, "sse", full-batch and serialized orders ----------------------------

#: (activation, output, loss, bias, batch_size, shuffle, lr)
_CLASSIC_RUNS = [
    ("sigmoid", "sigmoid", "sse", False, None, True, 0.02),
    ("tanh", "tanh", "sse", False, None, "serialized", 0.02),
    ("sigmoid", "sigmoid", "sse", False, None, "serialized", 0.05),
    ("tanh", "linear", "sse", False, 16, True, 0.005),
    ("sigmoid", "tanh", "mse", True, None, True, 0.2),
    ("tanh", "sigmoid", "mse", True, None, "serialized", 0.2),
]


def _squashed_targets(y, output):
    return np.tanh(y) if output == "tanh" else 1 / (1 + np.exp(-y)) if output == "sigmoid" else y


@pytest.mark.parametrize(("activation", "output", "loss", "bias", "batch_size", "shuffle", "lr"), _CLASSIC_RUNS)
def test_classic_training_matches_independent_training(
    activation, output, loss, bias, batch_size, shuffle, lr, regression
):
    X, y = regression
    y = _squashed_targets(y, output)
    kwargs = {"activation": activation, "loss": loss, "lr": lr, "seed": 7}
    trainer = SerialTrainer(
        (10, 8),
        bias=bias,
        batch_size=batch_size,
        network={"output": output},
        sgd={"momentum": 0.9, "shuffle": shuffle},
        **kwargs,
    ).fit(X, y, steps=50)
    Ws, bs, vW, vb, losses = reference_train(
        X,
        y,
        (6, 10, 8, 3),
        bias=bias,
        batch_size=batch_size,
        shuffle=shuffle,
        steps=50,
        output=output,
        momentum=0.9,
        **kwargs,
    )
    assert len(trainer.model_.params) == (6 if bias else 3)
    interleave = trainer.model_.interleave
    pairs = [*zip(trainer.model_.params, interleave(Ws, bs), strict=True)]
    pairs += zip(trainer.velocity_, interleave(vW, vb), strict=True)
    errors = [_relative_error(a, b) for a, b in pairs]
    assert max(errors) < 1e-12, errors
    np.testing.assert_allclose(trainer.history_["loss"].values, losses, rtol=1e-12)
    # and it trains: the loss over all rows falls
    start = MLP((6, 10, 8, 3), activation=activation, output=output, bias=bias, seed=7)
    assert trainer.model_.loss(X, y, loss) < start.loss(X, y, loss)


def _torch_steps(n, Xt, yt, layers, optimizer, hidden, output, loss, batch_size, shuffle, seed, steps):
    import torch

    for step in range(steps):
        rows = torch.as_tensor(np.asarray(rows_of_step(step, n, batch_size, seed, shuffle)))
        a = Xt[rows]
        for i, layer in enumerate(layers):
            a = (hidden if i < len(layers) - 1 else output)(layer(a))
        diff = a - yt[rows]
        value = 0.5 * (diff * diff).sum() if loss == "sse" else (diff * diff).mean()
        optimizer.zero_grad()
        value.backward()
        optimizer.step()


def _torch_training(X, y, model, *, activation, output, loss, lr, momentum, batch_size, shuffle, seed, steps):
    """The same training in PyTorch (float64), from ``model``'s initial weights."""
    torch = pytest.importorskip("torch", reason="PyTorch is an optional cross-check")
    acts = {"sigmoid": torch.sigmoid, "tanh": torch.tanh, "linear": lambda t: t}
    layers = []
    for i, W in enumerate(model.weights):
        layer = torch.nn.Linear(*W.shape, bias=model.bias, dtype=torch.float64)
        with torch.no_grad():
            layer.weight.copy_(torch.from_numpy(W.T.copy()))
            if model.bias:
                layer.bias.copy_(torch.from_numpy(model.biases[i]))
        layers.append(layer)
    params = [p for layer in layers for p in layer.parameters()]
    optimizer = torch.optim.SGD(params, lr=lr, momentum=momentum)
    Xt, yt = torch.from_numpy(X), torch.from_numpy(y)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny products: a thread pool only adds contention on a shared machine
    try:
        _torch_steps(
            X.shape[0],
            Xt,
            yt,
            layers,
            optimizer,
            acts[activation],
            acts[output],
            loss,
            batch_size,
            shuffle,
            seed,
            steps,
        )
    finally:
        torch.set_num_threads(threads)
    weights = [layer.weight.detach().numpy().T for layer in layers]
    biases = [layer.bias.detach().numpy() for layer in layers] if model.bias else []
    # torch keeps W as (n_out, n_in): transpose weights and their momentum back to daskann's layout
    velocities = [optimizer.state[p]["momentum_buffer"].numpy() for p in params]
    velocities = [v.T if v.ndim == 2 else v for v in velocities]
    return weights, biases, velocities


@pytest.mark.parametrize(("activation", "output", "loss", "bias", "batch_size", "shuffle", "lr"), _CLASSIC_RUNS)
def test_classic_training_equals_pytorch(activation, output, loss, bias, batch_size, shuffle, lr, regression):
    pytest.importorskip("torch", reason="PyTorch is an optional cross-check; the numpy reference runs without it")
    X, y = regression
    y = _squashed_targets(y, output)
    kwargs = {
        "activation": activation,
        "loss": loss,
        "lr": lr,
        "seed": 7,
        "batch_size": batch_size,
        "network": {"output": output},
        "sgd": {"momentum": 0.9, "shuffle": shuffle},
    }
    trainer = SerialTrainer((10, 8), bias=bias, **kwargs).fit(X, y, steps=50)
    start = MLP((6, 10, 8, 3), bias=bias, seed=7)
    weights, biases, velocities = _torch_training(X, y, start, steps=50, **kwargs)
    model = trainer.model_
    worst = max(
        float(np.max(np.abs(a - b)))
        for a, b in zip(model.params + trainer.velocity_, model.interleave(weights, biases) + velocities, strict=True)
    )
    assert worst < 1e-10


def test_full_batch_and_serialized_orders(regression):
    X, y = regression
    full = SerialTrainer((4,), batch_size=None).fit(X, y, epochs=3)
    assert full.n_steps_ == 3 and full.batch_order_.full_batch
    assert np.array_equal(full.batch_order_.indices(2), np.arange(96))
    serialized = SerialTrainer((4,), batch_size=None, sgd={"shuffle": "serialized", "momentum": 0.9}).fit(
        X, y, steps=100
    )
    assert serialized.batch_order_.steps_per_epoch == 96
    assert np.array_equal(serialized.batch_order_.indices(100), [4])
    # the serialized order is the in-order walk one row at a time
    walk = SerialTrainer((4,), batch_size=1, sgd={"shuffle": False, "momentum": 0.9}).fit(X, y, steps=100)
    assert all(np.array_equal(a, b) for a, b in zip(serialized.model_.params, walk.model_.params, strict=True))


def test_batch_order_state_and_checks():
    for order in (BatchOrder(10, None), BatchOrder(10, None, shuffle="serialized"), BatchOrder(10, 3, shuffle=False)):
        assert BatchOrder.from_state(order.get_state()) == order
    assert BatchOrder(10, None, shuffle="serialized").get_state()["shuffle"] == "serialized"
    assert "shuffle='serialized'" in repr(BatchOrder(10, None, shuffle="serialized"))
    assert np.array_equal(BatchOrder(5, None, seed=3, shuffle=True).indices(4), np.arange(5))
    with pytest.raises(ValueError, match="batch_size=3 is not valid: expected None with shuffle='serialized'"):
        BatchOrder(10, 3, shuffle="serialized")
    with pytest.raises(ValueError, match="shuffle='Serialized'"):
        BatchOrder(10, None, shuffle="Serialized")


def test_coarse_points_use_their_own_index():
    order = BatchOrder(5, None, shuffle="serialized")
    # the paper's rule: point i of level l uses row i mod K, not m**l * i mod K
    assert [int(coarse_indices(order, i, level=3)[0]) for i in range(7)] == [0, 1, 2, 3, 4, 0, 1]
    assert [int(coarse_indices(order, i, level=2, cfactor=2, rule="fine")[0]) for i in range(4)] == [0, 4, 3, 2]
    minibatch = BatchOrder(12, 4, seed=1)
    assert np.array_equal(coarse_indices(minibatch, 2, level=1), minibatch.indices(2))
    assert np.array_equal(coarse_indices(minibatch, 2, level=1, cfactor=4, rule="fine"), minibatch.indices(8))
    assert np.array_equal(coarse_indices(BatchOrder(6, None), 9, level=4), np.arange(6))
    with pytest.raises(ValueError, match="rule='nearest'"):
        coarse_indices(order, 1, level=1, rule="nearest")
    with pytest.raises(ValueError, match="level=-1"):
        coarse_indices(order, 1, level=-1)


def test_bias_free_checkpoints_resume_and_refuse_biases(tmp_path, regression):
    X, y = regression
    y = _squashed_targets(y, "sigmoid")
    kwargs = {
        "activation": "sigmoid",
        "loss": "sse",
        "lr": 0.5,
        "batch_size": None,
        "bias": False,
        "network": {"output": "sigmoid"},
        "sgd": {"momentum": 0.9, "shuffle": "serialized"},
    }
    straight = SerialTrainer((8,), **kwargs).fit(X, y, steps=30)
    run = tmp_path / "run"
    SerialTrainer((8,), **kwargs, checkpoint=run).fit(X, y, steps=12)
    ckpt = load_checkpoint(run)
    assert not ckpt.model.bias and ckpt.model.biases == [] and len(ckpt.velocity) == 2
    assert not list(run.rglob("biases"))
    resumed = SerialTrainer((8,), **kwargs).fit(X, y, steps=30, resume=run)
    pairs = zip(resumed.model_.params + resumed.velocity_, straight.model_.params + straight.velocity_, strict=True)
    assert all(np.array_equal(a, b) for a, b in pairs)
    with pytest.raises(StoreError, match="does not match.*bias=True but the checkpoint's model has none"):
        SerialTrainer((8,), **{**kwargs, "bias": True}).fit(X, y, steps=30, resume=run)
    biased = tmp_path / "biased"
    SerialTrainer((8,), **{**kwargs, "bias": True}, checkpoint=biased).fit(X, y, steps=5)
    with pytest.raises(StoreError, match="bias=False but the checkpoint's model has biases"):
        SerialTrainer((8,), **kwargs).fit(X, y, steps=30, resume=biased)
    with pytest.raises(ValueError, match="init_model=.*bias=False"):
        SerialTrainer((8,), **kwargs).fit(X, y, steps=3, init_model=MLP([6, 8, 3]))
