"""Dask-array data: every trainer reads it on the workers and trains as from numpy, bit for bit.

The client never computes ``X``: the checks run on the workers as one
reduction, each worker cuts what it reads from the persisted chunks, and no
result the size of ``X`` reaches the client (its gathers and its traced memory
are recorded).
"""

from __future__ import annotations

import re
import tracemalloc

import dask.array as da
import numpy as np
import pytest
import zarr
from click.testing import CliRunner
from conftest import scheduler_watch
from dask.sizeof import sizeof
from distributed import Client
from sklearn.base import clone

from daskann import SerialTrainer
from daskann._validation import check_features, check_targets
from daskann.cli import main
from daskann.data import make_linear
from daskann.exceptions import MGRITDidNotPay
from daskann.mgrit import MGRITTrainer
from daskann.npt import NPTTrainer
from daskann.partition import PartitionTrainer

# MGRIT fits here must run the solve, which the default policy skips for problems this small
pytestmark = pytest.mark.usefixtures("mgrit_study")

#: key names of the checks and of reading the data (no training task has one of these)
# the checks: per-chunk summaries, and for class labels their unique values and positions in classes_
CHECK_KEYS = re.compile(
    r"^\(?'?(from-zarr|original-array|array-|astype-|_chunk_summary-|_combine-|getitem-|unique|_encode_block-"
    r"|finalize-hlgfinalizecompute-)"
)


def _zarr(tmp_path, name: str, **arrays) -> str:
    path = tmp_path / f"{name}.zarr"
    group = zarr.open_group(str(path), mode="w")
    for key, (value, chunks) in arrays.items():
        group.create_array(key, data=value, chunks=chunks)
    return str(path)


@pytest.fixture(scope="module")
def problem():
    X, y = make_linear(96, 12, 4, seed=3)
    labels = np.random.default_rng(3).integers(0, 5, 96)
    return X, y, labels


def _from_zarr(tmp_path, X, y):
    # uneven chunks that cut across the grid's bands and the minibatches
    path = _zarr(
        tmp_path,
        "data",
        X=(X, (25, 5)),
        y=(y, (17,) + y.shape[1:]),
        X_val=(X[:30], (11, 12)),
        y_val=(y[:30], (7,) + y.shape[1:]),
    )
    group = zarr.open_group(path, mode="r")
    return tuple(da.from_zarr(group[name]) for name in ("X", "y", "X_val", "y_val"))


def _trainers(client2, client4):
    yield "npt-graph-2x2", NPTTrainer, {"grid": (2, 2), "mode": "graph", "client": client4}
    yield "npt-resident-2x2", NPTTrainer, {"grid": (2, 2), "mode": "resident", "client": client4}
    # five grid columns over 4 outputs, and a virtual 6x6 grid over 4 or 5: some bands of the outputs
    # (and of the targets) hold no column
    yield (
        "npt-graph-1x5",
        NPTTrainer,
        {"grid": (1, 5), "mode": "graph", "engine": {"share_workers": True}, "client": client4},
    )
    yield (
        "npt-resident-2x3",
        NPTTrainer,
        {"grid": (2, 3), "mode": "resident", "engine": {"share_workers": True}, "client": client4},
    )
    yield "mgrit", MGRITTrainer, {"solver": {"levels": 2, "cfactor": 4}, "client": client2}
    yield (
        "mgrit-auto-cap",
        MGRITTrainer,
        {"solver": {"levels": 2, "cfactor": 4, "alpha_cap": "auto"}, "client": client2},
    )
    yield "partition", PartitionTrainer, {"k": 2, "split": {"sub_steps": 4}, "client": client2}
    yield (
        "partition-npt",
        PartitionTrainer,
        {"k": 2, "split": {"sub_steps": 4, "sub_trainer": "npt"}, "client": client2},
    )


TRAINERS = [
    "npt-graph-2x2",
    "npt-resident-2x2",
    "npt-graph-1x5",
    "npt-resident-2x3",
    "mgrit",
    "mgrit-auto-cap",
    "partition",
    "partition-npt",
]


@pytest.mark.filterwarnings("ignore::daskann.exceptions.MGRITDidNotPay")  # short MGRIT runs do not pay
@pytest.mark.parametrize("loss", ["mse", "cross_entropy"])
@pytest.mark.parametrize("name", TRAINERS)
def test_dask_input_equals_numpy_input(name, loss, problem, client2, client4, tmp_path):
    X, y, labels = problem
    target = y if loss == "mse" else labels
    _, cls, options = next(t for t in _trainers(client2, client4) if t[0] == name)
    settings = {
        "hidden_sizes": (8,),
        "batch_size": 16,
        "loss": loss,
        "network": {"output": "linear" if loss == "mse" else "softmax", "dtype": "float64"},
        "sgd": {"momentum": 0.5},
        **options,
    }
    if name == "partition-npt":
        settings["split"] = {**settings["split"], "npt_options": {"grid": (1, 2)}, "mode": "sequential"}
    expected = cls(**settings).fit(X, target, steps=8, validation_data=(X[:30], target[:30]))
    dX, dy, dXv, dyv = _from_zarr(tmp_path, X, target)
    got = cls(**settings).fit(dX, dy, steps=8, validation_data=(dXv, dyv))
    for a, b in zip(expected.model_.params, got.model_.params, strict=True):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(expected.history_["val_loss"].values, got.history_["val_loss"].values)


class _GatherSpy:
    """Bytes of every result the client gathers (``Future.result`` and ``Client.gather`` both come here)."""

    def __init__(self, monkeypatch):
        self.sizes: list[int] = []
        original = Client._gather

        async def spy(client, futures, *args, **kwargs):
            out = await original(client, futures, *args, **kwargs)
            self.sizes.append(sizeof(out))
            return out

        monkeypatch.setattr(Client, "_gather", spy)


def test_no_full_x_reaches_the_client(client4, tmp_path, monkeypatch):
    # 64 MiB of X: 8 times the cap on the client's traced memory, which also holds this in-process
    # cluster's scheduler (a few MiB of graphs and messages, whatever the size of X)
    n, d = 131072, 64
    X, y = make_linear(n, d, 2, seed=0)
    path = _zarr(tmp_path, "big", X=(X, (8192, d)), y=(y, (8192, 2)))
    nbytes = X.nbytes
    del X, y
    group = zarr.open_group(path, mode="r")
    dX, dy = da.from_zarr(group["X"]), da.from_zarr(group["y"])
    trainer = NPTTrainer((16,), grid=(2, 2), mode="graph", batch_size=64, client=client4)
    # a short fit first: the modules it imports and the caches it fills on the client come once per
    # session, whatever the size of X, and are not what this measures
    clone(trainer).fit(dX[:512], dy[:512], steps=1)
    spy = _GatherSpy(monkeypatch)
    tracemalloc.start()
    try:
        with scheduler_watch(client4) as watch:
            trainer.fit(dX, dy, steps=4)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    cap = nbytes // 8
    assert peak < cap, f"the client's traced memory peaked at {peak} bytes, X is {nbytes}"
    assert max(spy.sizes) < nbytes // 64, f"the client gathered {max(spy.sizes)} bytes at once, X is {nbytes}"
    # the scheduler saw X read chunk by chunk and cut into bands; nothing computed it whole for a client
    assert not [k for k in watch.keys if k.startswith(("finalize-", "('finalize-"))]
    reads = [k for k in watch.keys if "from-zarr" in k]
    assert len(reads) >= 8  # X's and y's chunks, each a task of its own
    assert [k for k in watch.keys if "-data-X-" in k], "the bands of X were cut by tasks on their workers"


# -- bad input -----------------------------------------------------------------------------
def _bad_cases(X, y):
    nan_X = X.copy()
    nan_X[37, 3] = np.nan
    fractional = np.linspace(0, 3, X.shape[0])
    dX = da.from_array(X, chunks=(20, 5))
    unknown = dX[da.from_array(X[:, 0]) > -np.inf]
    return {
        "unknown-chunks": (unknown, y, None, ValueError, r"^X=.*unknown chunk sizes"),
        "rows-mismatch": (dX, da.from_array(y[:-1]), None, ValueError, r"^y=.*96 rows, as X"),
        "non-finite": (
            da.from_array(nan_X, chunks=(20, 5)),
            da.from_array(y),
            None,
            ValueError,
            r"^X=.*1 NaN or Inf values \(first at \(37, 3\), in chunk \(1, 0\)\)",
        ),
        "complex-X": (dX.astype(np.complex128), y, None, TypeError, r"^X=.*float32 or float64"),
        "fractional-labels": (dX, da.from_array(fractional), None, ValueError, r"^Unknown label type: continuous"),
        "val-label-range": (
            dX,
            da.from_array(np.zeros(X.shape[0], np.int64)),
            (dX[:10], da.from_array(np.full(10, 7))),
            ValueError,
            r"^validation_data\[1\]='labels \[7\]'.*classes_=\[0\]",
        ),
    }


@pytest.mark.parametrize(
    "case", ["unknown-chunks", "rows-mismatch", "non-finite", "complex-X", "fractional-labels", "val-label-range"]
)
@pytest.mark.parametrize("cls", [NPTTrainer, MGRITTrainer, PartitionTrainer])
def test_bad_dask_input_fails_before_training(cls, case, problem, client2):
    X, y, _ = problem
    bad_X, bad_y, validation, error, pattern = _bad_cases(X, y)[case]
    loss = "cross_entropy" if case in ("fractional-labels", "val-label-range") else "mse"
    options = {"grid": (1, 2)} if cls is NPTTrainer else {"k": 2} if cls is PartitionTrainer else {}
    trainer = cls((8,), batch_size=16, loss=loss, client=client2, **options)
    with scheduler_watch(client2) as watch, pytest.raises(error, match=pattern):
        trainer.fit(bad_X, bad_y, steps=2, validation_data=validation)
    training = [k for k in watch.keys if not CHECK_KEYS.match(k)]
    assert not training, f"keys other than the checks reached the scheduler: {training[:5]}"


@pytest.mark.parametrize(
    ("X", "y", "loss"),
    [
        (np.zeros(8), np.zeros(8), "mse"),  # 1-d X
        (np.zeros((8, 3), np.int64), np.zeros(8), "mse"),  # integer X
        (np.zeros((8, 4)), np.zeros(8), "mse"),  # 4 features for a 3-wide input
        (np.zeros((8, 3)), np.zeros(7), "mse"),  # rows differ
        (np.zeros((8, 3)), np.zeros((8, 2)), "mse"),  # 2 columns for 1 output
        (np.zeros((8, 3)), np.zeros((8, 2)), "cross_entropy"),  # 2-d labels
        (np.zeros((8, 3)), np.arange(8) - 1, "cross_entropy"),  # a negative label
        (np.zeros((8, 3)), np.arange(8), "cross_entropy"),  # label 7 for 1 output
        (np.zeros((8, 3)), np.linspace(0, 3, 8), "cross_entropy"),  # fractional labels
        (np.zeros((8, 3)), np.where(np.arange(8) == 5, np.inf, 0.0), "mse"),  # a non-finite target
    ],
)
def test_numpy_and_dask_input_fail_with_one_message(X, y, loss):
    """One check serves both kinds of array: the same error, whether the values are read here or on a worker."""
    from daskann._dask_input import (
        _check_targets_meta,
        _labels_outputs,
        _raise_targets,
        _summary,
        check_dask_features_layout,
    )

    def numpy_error():
        check_targets(y, loss=loss, n_samples=len(check_features(X, n_features=3)), n_outputs=1)

    def dask_error():
        dX = check_dask_features_layout(da.from_array(X, chunks=4), "X", 3)
        dy = _check_targets_meta(da.from_array(y, chunks=4), "y", loss, dX.shape[0], 1)
        summary = _summary(dy, labels=loss == "cross_entropy").compute(scheduler="sync")
        if loss == "cross_entropy":
            _labels_outputs("y", summary, 1)
        _raise_targets("y", summary)

    errors = []
    for fail in (numpy_error, dask_error):
        with pytest.raises((ValueError, TypeError)) as info:
            fail()
        errors.append((type(info.value), str(info.value)))
    assert errors[0] == errors[1]


def test_cli_data_without_x_names_the_option(tmp_path, client2):
    path = _zarr(tmp_path, "no-x", y=(np.zeros((8, 1)), (8, 1)))
    address = client2.scheduler.address
    for method in ("npt", "mgrit", "partition"):
        result = CliRunner().invoke(main, ["train", method, "--data", path, "--address", address, "-q"])
        assert result.exit_code != 0
        assert "--data=" in result.output and "arrays X and y" in result.output, result.output
        assert "Traceback" not in result.output


def test_cli_trains_from_a_zarr_group(tmp_path, client2):
    X, y = make_linear(64, 6, 2, seed=1)
    path = _zarr(tmp_path, "cli", X=(X, (16, 6)), y=(y, (16, 2)), X_val=(X[:16], (8, 6)), y_val=(y[:16], (8, 2)))
    address = client2.scheduler.address
    args = ["--data", path, "--address", address, "--steps", "4", "--hidden", "8", "--batch-size", "16", "--json"]
    result = CliRunner().invoke(main, ["train", "npt", "--grid", "1x2", *args])
    assert result.exit_code == 0, result.output
    assert '"dataset": "cli.zarr"' in result.output and '"val_loss"' in result.output


def test_mgrit_serial_fallback_reads_dask_data_on_a_worker(client2):
    # a diverging preset ends in the serial finish, which steps through the data on a worker
    X, y = make_linear(256, 8, 2, seed=0)
    settings = dict(activation="leaky_relu", loss="mse", batch_size=16, lr=0.01, seed=0, sgd={"momentum": 0.9})
    settings.update(preset="solver1", client=client2)
    with pytest.warns(MGRITDidNotPay):
        expected = MGRITTrainer((16, 16), **settings).fit(X, y, steps=256)
    with pytest.warns(MGRITDidNotPay):
        got = MGRITTrainer((16, 16), **settings).fit(da.from_array(X, chunks=(40, 8)), da.from_array(y), steps=256)
    assert got.result_.ended == expected.result_.ended == "serial-fallback"
    for a, b in zip(expected.model_.params, got.model_.params, strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.filterwarnings("ignore::daskann.exceptions.MGRITDidNotPay")
def test_mgrit_without_momentum_takes_the_last_gradient_on_a_worker(problem, client2):
    # without momentum the solve's state holds no velocity: the last step's gradient is taken where the data is
    X, y, _ = problem
    settings = dict(batch_size=16, lr=0.01, seed=0, sgd={"momentum": 0.0})
    serial = SerialTrainer((8,), **settings).fit(X, y, steps=32)
    settings.update(solver={"levels": 2, "cfactor": 4}, client=client2)
    expected = MGRITTrainer((8,), **settings).fit(X, y, steps=32)
    got = MGRITTrainer((8,), **settings).fit(da.from_array(X, chunks=(25, 5)), da.from_array(y, chunks=17), steps=32)
    assert got.result_.ended == "converged"
    pairs = zip(expected.model_.params + expected.velocity_, got.model_.params + got.velocity_, strict=True)
    for a, b in pairs:
        np.testing.assert_array_equal(a, b)
    for a, b in zip(got.velocity_, serial.velocity_, strict=True):
        assert np.linalg.norm(a - b) <= 1e-9 * np.linalg.norm(b)


# -- predictions ---------------------------------------------------------------------------
def _predictors(client2, client4):
    yield "serial", SerialTrainer, {}
    yield "npt-graph-2x2", NPTTrainer, {"grid": (2, 2), "mode": "graph", "client": client4}
    yield "npt-resident-1x2", NPTTrainer, {"grid": (1, 2), "mode": "resident", "client": client2}
    yield "mgrit", MGRITTrainer, {"solver": {"levels": 2, "cfactor": 4}, "client": client2}
    yield "partition", PartitionTrainer, {"k": 2, "split": {"sub_steps": 4}, "client": client2}


def _compute(array, options):
    client = options.get("client")
    return client.compute(array, sync=True) if client is not None else array.compute(scheduler="sync")


@pytest.mark.filterwarnings("ignore::daskann.exceptions.MGRITDidNotPay")
@pytest.mark.parametrize("loss", ["mse", "cross_entropy"])
@pytest.mark.parametrize("name", ["serial", "npt-graph-2x2", "npt-resident-1x2", "mgrit", "partition"])
def test_predict_on_dask_x_is_lazy_and_equals_numpy(name, loss, problem, client2, client4, tmp_path):
    X, y, labels = problem
    target = y if loss == "mse" else labels
    _, cls, options = next(t for t in _predictors(client2, client4) if t[0] == name)
    output = "linear" if loss == "mse" else "softmax"
    trainer = cls((8,), batch_size=16, loss=loss, network={"output": output}, **options).fit(X, target, steps=8)
    dX, dy, _, _ = _from_zarr(tmp_path, X, target)
    predicted = trainer.predict(dX)
    # lazy, chunked along X's rows, and equal to the numpy path: labels exactly, values to round-off (BLAS
    # blocks a chunk's rows differently from the whole array's, which moves the last bit of a few rows)
    assert isinstance(predicted, da.Array) and predicted.chunks[0] == dX.chunks[0]
    if loss == "cross_entropy":
        np.testing.assert_array_equal(_compute(predicted, options), trainer.predict(X))
        proba = trainer.predict_proba(dX)
        assert isinstance(proba, da.Array)
        np.testing.assert_allclose(_compute(proba, options), trainer.predict_proba(X), rtol=1e-13, atol=1e-15)
        assert trainer.score(dX, dy) == trainer.score(X, target)
    else:
        np.testing.assert_allclose(_compute(predicted, options), trainer.predict(X), rtol=1e-13, atol=1e-15)
        assert trainer.score(dX, dy) == pytest.approx(trainer.score(X, target), rel=1e-13)
    if cls is NPTTrainer:  # computed on the grid: the client never loaded the model
        assert trainer.__dict__.get("_model") is None


def test_predict_reads_no_full_x_on_the_client(client4, tmp_path, monkeypatch):
    # 64 MiB of X in zarr, predicted on a 2x2 grid: the client holds the labels, never X
    n, d = 65536, 128
    X, y = make_linear(n, d, 3, seed=1)
    trainer = NPTTrainer((16,), grid=(2, 2), mode="graph", batch_size=64, loss="cross_entropy", client=client4)
    trainer.fit(X[:512], np.argmax(y[:512], axis=1), steps=4)
    expected = trainer.predict(X[:4096])
    path = _zarr(tmp_path, "predict", X=(X, (4096, d)))
    nbytes = X.nbytes
    del X, y
    dX = da.from_zarr(zarr.open_group(path, mode="r")["X"])
    # the first lazy prediction imports and caches what every later one reuses: not what this measures
    np.testing.assert_array_equal(client4.compute(trainer.predict(dX[:4096]), sync=True), expected)
    spy = _GatherSpy(monkeypatch)
    tracemalloc.start()
    try:
        labels = client4.compute(trainer.predict(dX), sync=True)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    np.testing.assert_array_equal(labels[:4096], expected)
    assert peak < nbytes // 8, f"the client's traced memory peaked at {peak} bytes, X is {nbytes}"
    assert max(spy.sizes) < nbytes // 64, f"the client gathered {max(spy.sizes)} bytes at once, X is {nbytes}"
    assert trainer.__dict__.get("_model") is None


@pytest.mark.parametrize("cls", [SerialTrainer, NPTTrainer])
def test_bad_dask_x_for_predict(cls, problem, client2):
    X, y, _ = problem
    options = {"grid": (1, 2), "client": client2} if cls is NPTTrainer else {}
    trainer = cls((8,), batch_size=16, **options).fit(X, y, steps=2)
    dX = da.from_array(X, chunks=(20, 5))
    cases = [
        (dX[dX[:, 0] > -np.inf], ValueError, r"^X=.*unknown chunk sizes"),
        (dX[:, :5], ValueError, r"^X has 5 features, but \w+ is expecting 12 features as input"),
        (dX.astype(np.complex128), TypeError, r"^X=.*float32 or float64"),
    ]
    for bad, error, pattern in cases:
        with scheduler_watch(client2) as watch, pytest.raises(error, match=pattern):
            trainer.predict(bad)
        assert not watch.keys, "refused before any task"
    nan_X = X.copy()
    nan_X[37, 3] = np.nan
    lazy = trainer.predict(da.from_array(nan_X, chunks=(20, 5)))  # values are read when computed
    with pytest.raises(ValueError, match=r"^X=.*1 NaN or Inf values in chunk \(1, 0\) \(first at \(37, 3\)\)"):
        client2.compute(lazy, sync=True)


def test_integer_dask_x_is_converted_as_numpy_x_is(client4):
    # as scikit-learn's validate_data converts integer numpy X, chunk by chunk where the data lives
    rng = np.random.default_rng(0)
    X = rng.integers(-3, 4, size=(96, 6))
    y = (X[:, 0] > 0).astype(np.int64)
    dX, dy = da.from_array(X, chunks=(24, 6)), da.from_array(y, chunks=24)
    settings = dict(loss="cross_entropy", lr=0.1, batch_size=16, steps=6, network={"output": "softmax"})
    on_dask = NPTTrainer((8,), grid="1x2", mode="graph", client=client4, **settings).fit(dX, dy)
    on_numpy = SerialTrainer((8,), **settings).fit(X, y)
    for a, b in zip(on_dask.model_.params, on_numpy.model_.params, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)
    np.testing.assert_array_equal(on_dask.predict(dX).compute(), on_numpy.predict(X))
