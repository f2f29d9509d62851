"""daskann.data: batch order, generated and bundled sets, local-file loaders, splits."""

from __future__ import annotations

import gzip
import os
import pickle
import socket
import struct
import subprocess
import sys

import dask.array as da
import numpy as np
import pytest

from daskann.data import (
    DATASETS,
    BatchOrder,
    Dataset,
    as_dask,
    load_cifar10,
    load_dataset,
    load_digits,
    load_mnist_idx,
    make_linear,
    make_mnist1d,
    train_val_split,
    upsample_signals,
)

# --------------------------------------------------------------------------- helpers


@pytest.fixture
def no_network(monkeypatch):
    """A connection beyond this machine fails the test.

    Loopback connections go through: the event-loop threads of the suite's clusters, which
    run beside every test, open connections to their own workers at any moment.
    """

    def check(address):
        host = address[0] if isinstance(address, tuple) else None  # None: a Unix socket's path
        if host is not None and host not in ("localhost", "::1") and not str(host).startswith("127."):
            raise AssertionError(f"network access attempted: {address!r}")

    connect, connect_ex, create_connection = socket.socket.connect, socket.socket.connect_ex, socket.create_connection

    def guarded_connect(sock, address):
        check(address)
        return connect(sock, address)

    def guarded_connect_ex(sock, address):
        check(address)
        return connect_ex(sock, address)

    def guarded_create_connection(address, *args, **kwargs):
        check(address)
        return create_connection(address, *args, **kwargs)

    monkeypatch.setattr(socket.socket, "connect", guarded_connect)
    monkeypatch.setattr(socket.socket, "connect_ex", guarded_connect_ex)
    monkeypatch.setattr(socket, "create_connection", guarded_create_connection)


def test_no_network_refuses_other_hosts_and_lets_loopback_through(no_network):
    with pytest.raises(AssertionError, match="network access attempted"):
        socket.create_connection(("192.0.2.1", 80), timeout=1)  # TEST-NET-1: refused before any packet
    with socket.socket() as sock, pytest.raises(AssertionError, match="network access attempted"):
        sock.connect(("example.org", 443))
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        socket.create_connection(server.getsockname(), timeout=5).close()


def write_idx(path, array, *, code=0x08, gz=False):
    """Write ``array`` as an IDX file (big-endian) with type ``code``."""
    dtype = {0x08: ">u1", 0x0C: ">i4", 0x0D: ">f4"}[code]
    payload = struct.pack(">HBB", 0, code, array.ndim) + struct.pack(f">{array.ndim}I", *array.shape)
    payload += np.ascontiguousarray(array, dtype=dtype).tobytes()
    if gz:
        path = path.with_name(path.name + ".gz")
        path.write_bytes(gzip.compress(payload))
    else:
        path.write_bytes(payload)
    return path


def mnist_arrays(n, seed):
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 256, size=(n, 4, 3), dtype=np.uint8)
    images[0, 0, 0] = 255  # so the maximum scales to exactly 1
    labels = rng.integers(0, 10, size=n, dtype=np.uint8)
    return images, labels


def write_mnist(folder, *, gz=False, n_train=12, n_test=5):
    folder.mkdir(parents=True, exist_ok=True)
    arrays = {}
    for prefix, n, seed in (("train", n_train, 1), ("t10k", n_test, 2)):
        images, labels = mnist_arrays(n, seed)
        write_idx(folder / f"{prefix}-images-idx3-ubyte", images, gz=gz)
        write_idx(folder / f"{prefix}-labels-idx1-ubyte", labels, gz=gz)
        arrays[prefix] = images, labels
    return arrays


def cifar_batch(n, seed):
    rng = np.random.default_rng(seed)
    data = rng.integers(0, 256, size=(n, 3072), dtype=np.uint8)
    labels = [int(v) for v in rng.integers(0, 10, size=n)]
    return {
        b"batch_label": b"batch %d" % seed,
        b"labels": labels,
        b"data": data,
        b"filenames": [b"img_%d.png" % i for i in range(n)],
    }


def write_cifar(folder, *, n=3, protocol=pickle.DEFAULT_PROTOCOL):
    folder.mkdir(parents=True, exist_ok=True)
    batches = {}
    for i, name in enumerate([f"data_batch_{k}" for k in range(1, 6)] + ["test_batch"]):
        batches[name] = cifar_batch(n, i)
        with open(folder / name, "wb") as f:
            pickle.dump(batches[name], f, protocol=protocol)
    return batches


def write_pickle(path, obj, protocol=pickle.DEFAULT_PROTOCOL):
    with open(path, "wb") as f:
        pickle.dump(obj, f, protocol=protocol)


# --------------------------------------------------------------------------- BatchOrder


@pytest.mark.parametrize("n, bs", [(10, 3), (8, 4), (7, 7)])
def test_batch_order_unshuffled_formula(n, bs):
    order = BatchOrder(n, bs, shuffle=False)
    for i in range(3 * n):
        np.testing.assert_array_equal(order.indices(i), (i * bs + np.arange(bs)) % n)


@pytest.mark.parametrize("n, bs, seed", [(12, 4, 0), (10, 3, 7)])
def test_batch_order_shuffled_permutation_per_epoch(n, bs, seed):
    order = BatchOrder(n, bs, seed=seed)
    assert order.steps_per_epoch == n // bs
    for epoch in range(3):
        perm = np.random.default_rng([seed, epoch]).permutation(n)
        rows = np.concatenate([order.indices(epoch * order.steps_per_epoch + k) for k in range(order.steps_per_epoch)])
        np.testing.assert_array_equal(rows, perm[: order.steps_per_epoch * bs])
        # every sample at most once per epoch, and all of them when bs divides n
        assert len(np.unique(rows)) == len(rows)
        if n % bs == 0:
            np.testing.assert_array_equal(np.sort(rows), np.arange(n))


def test_batch_order_deterministic_and_seeded():
    a, b, c = BatchOrder(20, 5, seed=3), BatchOrder(20, 5, seed=3), BatchOrder(20, 5, seed=4)
    steps = [0, 1, 5, 17, 3, 0]  # any order: each step is a pure function of (seed, step)
    for s in steps:
        np.testing.assert_array_equal(a.indices(s), b.indices(s))
    assert any(not np.array_equal(a.indices(s), c.indices(s)) for s in range(4))
    assert not np.array_equal(a.indices(0), a.indices(4))  # epochs differ
    assert BatchOrder.from_state(a.get_state()) == a
    assert a != c


def test_batch_order_rejects_bad_sizes():
    with pytest.raises(ValueError, match="batch_size=11"):
        BatchOrder(10, 11)
    with pytest.raises(TypeError, match="n_samples"):
        BatchOrder(10.0, 2)


# --------------------------------------------------------------------------- make_linear


def test_make_linear_shapes_dtype_and_determinism():
    X, y = make_linear(50, 6, 3, seed=1)
    assert X.shape == (50, 6) and y.shape == (50, 3) and X.dtype == y.dtype == np.float64
    X2, y2 = make_linear(50, 6, 3, seed=1)
    np.testing.assert_array_equal(X, X2)
    np.testing.assert_array_equal(y, y2)
    X3, _ = make_linear(50, 6, 3, seed=2)
    assert not np.allclose(X, X3)
    Xf, yf = make_linear(50, 6, 3, seed=1, dtype="float32")
    assert Xf.dtype == yf.dtype == np.float32


def test_make_linear_is_linear_without_noise():
    X, y = make_linear(64, 8, 2, noise=0.0, seed=0)
    A, residual, *_ = np.linalg.lstsq(X, y, rcond=None)
    assert residual.max() < 1e-20


def test_make_linear_rejects_bad_input():
    with pytest.raises(ValueError, match="noise=-1"):
        make_linear(10, 2, 1, noise=-1.0)
    with pytest.raises(TypeError, match="dtype"):
        make_linear(10, 2, 1, dtype="int32")


# --------------------------------------------------------------------------- digits


def test_load_digits(no_network):
    X, y = load_digits()
    assert X.shape == (1797, 64) and X.dtype == np.float64
    assert X.min() == 0.0 and X.max() == 1.0
    assert y.dtype == np.int64 and set(np.unique(y)) == set(range(10))
    assert load_digits(dtype="float32")[0].dtype == np.float32


# --------------------------------------------------------------------------- MNIST-1D


def test_upsample_signals_interpolates_and_keeps_inner_products():
    X, _ = make_mnist1d(30, seed=0)
    wide = upsample_signals(X, 784)
    grid, points = np.linspace(0, 1, 784), np.linspace(0, 1, 40)
    expected = np.stack([np.interp(grid, points, row) for row in X]) * np.sqrt(40 / 784)
    np.testing.assert_allclose(wide, expected, atol=1e-12)
    np.testing.assert_allclose(np.trace(wide @ wide.T) / np.trace(X @ X.T), 1.0, atol=0.1)
    assert upsample_signals(X.astype("float32"), 50).dtype == np.float32
    with pytest.raises(ValueError, match="2-d array"):
        upsample_signals(X[0])


def test_make_mnist1d_shape_labels_and_determinism(no_network, capsys):
    X, y = make_mnist1d(60, seed=1)
    assert X.shape == (60, 40) and X.dtype == np.float64
    assert y.shape == (60,) and y.dtype == np.int64 and set(np.unique(y)) == set(range(10))
    assert np.isfinite(X).all()
    assert capsys.readouterr().out == ""

    X2, y2 = make_mnist1d(60, seed=1)
    np.testing.assert_array_equal(X, X2)
    np.testing.assert_array_equal(y, y2)
    X[:] = 0  # copies, not the cached arrays
    assert make_mnist1d(60, seed=1)[0].any()
    assert not np.array_equal(make_mnist1d(60, seed=2)[0], X2)
    assert make_mnist1d(60, seed=1, dtype="float32")[0].dtype == np.float32


def test_make_mnist1d_leaves_the_global_generators_alone():
    # A fresh interpreter: in this one, a scheduler thread of another test's
    # cluster may draw from Python's global generator at any moment.
    script = """
import random
import numpy as np
from daskann.data import make_mnist1d
np.random.seed(123)
random.seed(123)
expected = np.random.random(), random.random()
np.random.seed(123)
random.seed(123)
make_mnist1d(60, seed=1)
assert (np.random.random(), random.random()) == expected
"""
    subprocess.run([sys.executable, "-c", script], check=True, timeout=120)


def test_make_mnist1d_count_not_a_multiple_of_ten():
    X, y = make_mnist1d(23, seed=0)
    assert X.shape == (23, 40) and y.shape == (23,)


def test_make_mnist1d_rejects_bad_input():
    with pytest.raises(ValueError, match="n_samples=0"):
        make_mnist1d(0)
    with pytest.raises(ValueError, match="seed=-1"):
        make_mnist1d(10, seed=-1)


# --------------------------------------------------------------------------- MNIST IDX


@pytest.mark.parametrize("gz", [False, True], ids=["plain", "gzip"])
def test_load_mnist_idx(tmp_path, gz, no_network):
    arrays = write_mnist(tmp_path, gz=gz)
    for kind, prefix in (("train", "train"), ("test", "t10k")):
        images, labels = arrays[prefix]
        X, y = load_mnist_idx(tmp_path, kind=kind)
        assert X.shape == (len(images), 12) and X.dtype == np.float64
        np.testing.assert_allclose(X, images.reshape(len(images), -1) / 255.0)
        assert X.min() >= 0 and X.max() == 1.0
        np.testing.assert_array_equal(y, labels)
        assert y.dtype == np.int64
    assert load_mnist_idx(str(tmp_path), dtype="float32")[0].dtype == np.float32


def test_load_mnist_idx_missing_files_lists_expected_names(tmp_path):
    with pytest.raises(FileNotFoundError, match="folder=") as info:
        load_mnist_idx(tmp_path)
    assert "train-images-idx3-ubyte" in str(info.value) and "train-labels-idx1-ubyte" in str(info.value)
    write_mnist(tmp_path)
    (tmp_path / "t10k-labels-idx1-ubyte").unlink()
    with pytest.raises(FileNotFoundError, match="t10k-labels-idx1-ubyte"):
        load_mnist_idx(tmp_path, kind="test")
    with pytest.raises(FileNotFoundError, match="folder="):
        load_mnist_idx(tmp_path / "nowhere")


def test_load_mnist_idx_rejects_bad_magic(tmp_path):
    write_mnist(tmp_path)
    bad = tmp_path / "train-images-idx3-ubyte"
    bad.write_bytes(b"\x1f\x8b\x08\x03" + bad.read_bytes()[4:])
    with pytest.raises(ValueError, match="train-images-idx3-ubyte.*magic number 0x1f8b0803"):
        load_mnist_idx(tmp_path)


def test_load_mnist_idx_rejects_truncated_file(tmp_path):
    write_mnist(tmp_path)
    bad = tmp_path / "train-images-idx3-ubyte"
    bad.write_bytes(bad.read_bytes()[:-5])
    with pytest.raises(ValueError, match=r"train-images-idx3-ubyte.*shape \(12, 4, 3\)"):
        load_mnist_idx(tmp_path)
    bad.write_bytes(b"\x00\x00")
    with pytest.raises(ValueError, match="too short"):
        load_mnist_idx(tmp_path)


def test_load_mnist_idx_rejects_wrong_shapes(tmp_path):
    arrays = write_mnist(tmp_path)
    images, labels = arrays["train"]
    write_idx(tmp_path / "train-labels-idx1-ubyte", labels[:-1])
    with pytest.raises(ValueError, match="12 images.*11 labels"):
        load_mnist_idx(tmp_path)
    write_idx(tmp_path / "train-labels-idx1-ubyte", images)  # an idx3 file under the labels name
    with pytest.raises(ValueError, match="train-labels-idx1-ubyte.*0x00000801"):
        load_mnist_idx(tmp_path)
    write_idx(tmp_path / "train-images-idx3-ubyte", images.astype(np.int32), code=0x0C)
    with pytest.raises(ValueError, match="train-images-idx3-ubyte.*int32.*0x00000803"):
        load_mnist_idx(tmp_path)


def test_load_mnist_idx_rejects_corrupt_gzip(tmp_path):
    write_mnist(tmp_path, gz=True)
    bad = tmp_path / "train-images-idx3-ubyte.gz"
    bad.write_bytes(bad.read_bytes()[:20])
    with pytest.raises(ValueError, match="train-images-idx3-ubyte.gz"):
        load_mnist_idx(tmp_path)


def test_load_mnist_idx_rejects_bad_parameters(tmp_path):
    write_mnist(tmp_path)
    with pytest.raises(ValueError, match="kind='validation'.*'train', 'test'"):
        load_mnist_idx(tmp_path, kind="validation")
    with pytest.raises(TypeError, match="folder=3"):
        load_mnist_idx(3)


# --------------------------------------------------------------------------- CIFAR-10


@pytest.mark.parametrize("protocol", [2, 4, 5])
def test_load_cifar10(tmp_path, protocol, no_network):
    batches = write_cifar(tmp_path, protocol=protocol)
    X, y = load_cifar10(tmp_path)
    train = [batches[f"data_batch_{k}"] for k in range(1, 6)]
    assert X.shape == (15, 3072) and X.dtype == np.float64
    np.testing.assert_allclose(X, np.concatenate([b[b"data"] for b in train]) / 255.0)
    np.testing.assert_array_equal(y, np.concatenate([b[b"labels"] for b in train]))
    assert y.dtype == np.int64
    X_test, y_test = load_cifar10(tmp_path, kind="test", dtype="float32")
    assert X_test.dtype == np.float32 and X_test.shape == (3, 3072)
    np.testing.assert_array_equal(y_test, batches["test_batch"][b"labels"])


def test_load_cifar10_from_parent_folder_and_str_keys(tmp_path):
    write_cifar(tmp_path / "cifar-10-batches-py")
    assert load_cifar10(tmp_path)[0].shape == (15, 3072)
    batch = cifar_batch(4, 9)
    write_pickle(tmp_path / "cifar-10-batches-py" / "test_batch", {"data": batch[b"data"], "labels": batch[b"labels"]})
    np.testing.assert_array_equal(load_cifar10(tmp_path, kind="test")[1], batch[b"labels"])


def test_load_cifar10_python2_style_pickle(tmp_path):
    # The real files come from Python 2 and numpy 1: str keys (bytes under
    # encoding="bytes") and numpy.core.multiarray in the global names.
    write_cifar(tmp_path)
    data = np.arange(2 * 3072, dtype=np.uint8).reshape(2, 3072)
    raw = pickle.dumps({"data": data, "labels": [3, 7]}, protocol=2)
    raw = raw.replace(b"numpy._core.multiarray", b"numpy.core.multiarray")
    raw = raw.replace(b"X\x04\x00\x00\x00data", b"U\x04data").replace(b"X\x06\x00\x00\x00labels", b"U\x06labels")
    assert b"numpy.core.multiarray" in raw and b"U\x04data" in raw
    (tmp_path / "test_batch").write_bytes(raw)
    X, y = load_cifar10(tmp_path, kind="test")
    np.testing.assert_allclose(X, data / 255.0)
    np.testing.assert_array_equal(y, [3, 7])


class _Exploit:
    """Unpickling this runs a shell command."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.parametrize("where", ["top", "nested"])
def test_load_cifar10_refuses_malicious_pickle(tmp_path, where):
    write_cifar(tmp_path)
    marker = tmp_path / "pwned"
    batch = cifar_batch(3, 0)
    payload = _Exploit(marker) if where == "top" else {**batch, b"labels": [_Exploit(marker)] * 3}
    write_pickle(tmp_path / "data_batch_3", payload)
    with pytest.raises(pickle.UnpicklingError, match=r"data_batch_3.*refused.*(posix|os|nt)\.system"):
        load_cifar10(tmp_path)
    assert not marker.exists()


def test_load_cifar10_refuses_other_globals(tmp_path):
    write_cifar(tmp_path)
    write_pickle(tmp_path / "test_batch", {b"data": np.zeros((1, 3072), np.uint8), b"labels": [0], b"f": eval})
    with pytest.raises(pickle.UnpicklingError, match="test_batch.*builtins.eval"):
        load_cifar10(tmp_path, kind="test")
    # bytes built via _codecs.encode are allowed only for latin1
    (tmp_path / "test_batch").write_bytes(b"\x80\x02c_codecs\nencode\nX\x01\x00\x00\x00aX\x05\x00\x00\x00rot13\x86R.")
    with pytest.raises(pickle.UnpicklingError, match="latin1"):
        load_cifar10(tmp_path, kind="test")


def test_load_cifar10_missing_batches_listed(tmp_path):
    write_cifar(tmp_path)
    (tmp_path / "data_batch_2").unlink()
    (tmp_path / "data_batch_5").unlink()
    with pytest.raises(FileNotFoundError, match="folder=.*missing: data_batch_2, data_batch_5"):
        load_cifar10(tmp_path)
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="test_batch"):
        load_cifar10(tmp_path / "empty", kind="test")


@pytest.mark.parametrize(
    "content, match",
    [
        ([1, 2, 3], "holds a list"),
        ({b"labels": [0]}, "no 'data' entry"),
        ({b"data": np.zeros((2, 100), np.uint8), b"labels": [0, 1]}, r"shape \(2, 100\)"),
        ({b"data": np.zeros((2, 3072), np.float32), b"labels": [0, 1]}, "float32"),
        ({b"data": np.zeros((2, 3072), np.uint8), b"labels": [0]}, "2 integer labels"),
        ({b"data": np.zeros((2, 3072), np.uint8), b"labels": [0, 10]}, r"labels in 0\.\.9"),
    ],
)
def test_load_cifar10_rejects_wrong_content(tmp_path, content, match):
    write_cifar(tmp_path)
    write_pickle(tmp_path / "test_batch", content)
    with pytest.raises(ValueError, match="test_batch.*" + match):
        load_cifar10(tmp_path, kind="test")


def test_load_cifar10_rejects_truncated_pickle(tmp_path):
    write_cifar(tmp_path)
    path = tmp_path / "data_batch_1"
    path.write_bytes(path.read_bytes()[:200])
    with pytest.raises(ValueError, match="data_batch_1.*not a readable CIFAR-10 batch"):
        load_cifar10(tmp_path)


# --------------------------------------------------------------------------- train_val_split


def test_train_val_split():
    X = np.arange(40.0).reshape(20, 2)
    y = np.arange(20)
    X_train, X_val, y_train, y_val = train_val_split(X, y, val_fraction=0.25, seed=3)
    assert X_train.shape == (15, 2) and X_val.shape == (5, 2) and y_train.shape == (15,) and y_val.shape == (5,)
    np.testing.assert_array_equal(np.sort(np.concatenate([y_train, y_val])), y)  # disjoint, complete
    np.testing.assert_array_equal(X_train[:, 0], 2 * y_train)  # rows stay paired
    np.testing.assert_array_equal(X_val[:, 0], 2 * y_val)
    again = train_val_split(X, y, val_fraction=0.25, seed=3)
    np.testing.assert_array_equal(again[3], y_val)
    assert not np.array_equal(train_val_split(X, y, val_fraction=0.25, seed=4)[3], y_val)
    assert not np.array_equal(y_train, np.arange(15))  # shuffled


@pytest.mark.parametrize(
    "fraction, error",
    [(0.0, ValueError), (1.0, ValueError), (1.5, ValueError), (float("nan"), ValueError), ("0.2", TypeError)],
)
def test_train_val_split_rejects_bad_fraction(fraction, error):
    with pytest.raises(error, match="val_fraction="):
        train_val_split(np.zeros((10, 2)), np.zeros(10), val_fraction=fraction)


def test_train_val_split_rejects_empty_parts_and_mismatch():
    with pytest.raises(ValueError, match="val_fraction=0.1.*non-empty for 3 samples"):
        train_val_split(np.zeros((3, 2)), np.zeros(3), val_fraction=0.1)
    with pytest.raises(ValueError, match="val_fraction=0.9.*non-empty for 3 samples"):
        train_val_split(np.zeros((3, 2)), np.zeros(3), val_fraction=0.9)
    with pytest.raises(ValueError, match="y=.*10 rows"):
        train_val_split(np.zeros((10, 2)), np.zeros(9))


# --------------------------------------------------------------------------- as_dask


def test_as_dask_matches_numpy():
    X, y = make_linear(50, 6, 3, seed=0)
    dX, dy = as_dask(X, y, chunks=16)
    assert isinstance(dX, da.Array) and isinstance(dy, da.Array)
    assert dX.chunks == ((16, 16, 16, 2), (6,)) and dy.chunks == ((16, 16, 16, 2), (3,))
    np.testing.assert_array_equal(dX.compute(scheduler="sync"), X)
    np.testing.assert_array_equal(dy.compute(scheduler="sync"), y)

    labels = np.arange(50)
    auto_X, auto_y = as_dask(X, labels)
    assert auto_X.chunks[1] == (6,) and auto_y.chunks[0] == auto_X.chunks[0]
    np.testing.assert_array_equal(auto_y.compute(scheduler="sync"), labels)

    only = as_dask(X, chunks=20)
    assert only.chunks == ((20, 20, 10), (6,))
    rechunked = as_dask(da.from_array(X, chunks=(5, 3)), chunks=25)
    assert rechunked.chunks == ((25, 25), (6,))
    np.testing.assert_array_equal(rechunked.compute(scheduler="sync"), X)


def test_as_dask_rejects_bad_input():
    X = np.zeros((10, 2))
    with pytest.raises(ValueError, match="chunks=0"):
        as_dask(X, chunks=0)
    with pytest.raises(ValueError, match="chunks='rows'.*'auto'"):
        as_dask(X, chunks="rows")
    with pytest.raises(TypeError, match="chunks=2.5"):
        as_dask(X, chunks=2.5)
    with pytest.raises(ValueError, match="y=.*10 rows"):
        as_dask(X, np.zeros(4))


# --------------------------------------------------------------------------- load_dataset


def test_load_dataset_linear(no_network):
    ds = load_dataset("linear", n_samples=100, n_features=5, n_outputs=2, noise=0.0, val_fraction=0.3, seed=1)
    assert isinstance(ds, Dataset) and ds.name == "linear"
    assert ds.task == "regression" and ds.loss == "mse"
    assert ds.X_train.shape == (70, 5) and ds.X_val.shape == (30, 5) and ds.y_val.shape == (30, 2)
    assert (ds.n_features, ds.n_outputs) == (5, 2)
    X, y = make_linear(100, 5, 2, noise=0.0, seed=1)
    np.testing.assert_array_equal(np.sort(np.concatenate([ds.y_train, ds.y_val]), axis=0), np.sort(y, axis=0))
    default = load_dataset("linear")
    assert default.X_train.shape[0] + default.X_val.shape[0] == 1024 and default.n_features == 32
    assert default.n_outputs == 4
    assert load_dataset("linear", dtype="float32").X_train.dtype == np.float32
    with pytest.raises(AttributeError):
        ds.name = "other"  # frozen
    assert "X_train=(70, 5)" in repr(ds)


def test_load_dataset_digits(no_network):
    ds = load_dataset("digits", val_fraction=0.1)
    assert ds.task == "classification" and ds.loss == "cross_entropy"
    assert ds.X_train.shape[0] + ds.X_val.shape[0] == 1797 and ds.X_val.shape == (180, 64)
    assert ds.y_train.dtype == np.int64 and ds.n_outputs == 10
    small = load_dataset("digits", n_samples=50)
    assert small.X_train.shape == (40, 64)


def test_load_dataset_mnist1d(no_network):
    ds = load_dataset("mnist1d", n_samples=60, seed=1)
    assert ds.X_train.shape == (48, 40) and ds.X_val.shape == (12, 40)
    assert ds.loss == "cross_entropy" and ds.n_outputs == 10 and ds.n_features == 40


def test_load_dataset_mnist_and_cifar10(tmp_path, no_network):
    write_mnist(tmp_path / "mnist", n_train=20)
    ds = load_dataset("mnist", path=tmp_path / "mnist", val_fraction=0.25)
    assert ds.X_train.shape == (15, 12) and ds.X_val.shape == (5, 12)
    assert ds.task == "classification" and ds.loss == "cross_entropy" and ds.n_outputs == 10
    write_cifar(tmp_path / "cifar", n=4)
    ds = load_dataset("cifar10", path=str(tmp_path / "cifar"), n_samples=10, dtype="float32")
    assert ds.X_train.shape == (8, 3072) and ds.X_val.shape == (2, 3072) and ds.X_train.dtype == np.float32
    assert ds.loss == "cross_entropy"
    dX, dy, dXv, dyv = ds.as_dask(chunks=3)
    np.testing.assert_array_equal(dX.compute(scheduler="sync"), ds.X_train)
    np.testing.assert_array_equal(dyv.compute(scheduler="sync"), ds.y_val)


def test_load_dataset_rejects_unknown_name():
    with pytest.raises(ValueError, match="dataset='imagenet'") as info:
        load_dataset("imagenet")
    assert all(repr(name) in str(info.value) for name in DATASETS)
    with pytest.raises(ValueError, match="dataset=None"):
        load_dataset(None)


@pytest.mark.parametrize("name", ["mnist", "cifar10"])
def test_load_dataset_needs_path(tmp_path, name):
    with pytest.raises(ValueError, match="path=None") as info:
        load_dataset(name)
    assert name in str(info.value)
    with pytest.raises(FileNotFoundError, match="path="):
        load_dataset(name, path=tmp_path / "missing")
    with pytest.raises(FileNotFoundError, match="folder="):  # folder exists, files do not
        load_dataset(name, path=tmp_path)


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"name": "digits", "path": "/data"}, ValueError, "path='/data'"),
        ({"name": "digits", "n_features": 4}, ValueError, "n_features=4.*'linear'"),
        ({"name": "mnist1d", "n_outputs": 3}, ValueError, "n_outputs=3"),
        ({"name": "digits", "n_samples": 5000}, ValueError, "n_samples=5000.*1797"),
        ({"name": "linear", "n_samples": 0}, ValueError, "n_samples=0"),
        ({"name": "linear", "n_features": 2.5}, TypeError, "n_features=2.5"),
        ({"name": "linear", "val_fraction": 1.0}, ValueError, "val_fraction=1.0"),
        ({"name": "linear", "n_samples": 3, "val_fraction": 0.1}, ValueError, "val_fraction=0.1"),
        ({"name": "linear", "seed": -2}, ValueError, "seed=-2"),
        ({"name": "linear", "noise": -0.5}, ValueError, "noise=-0.5"),
        ({"name": "digits", "dtype": "int8"}, TypeError, "dtype='int8'"),
    ],
)
def test_load_dataset_rejects_bad_input(kwargs, error, match):
    kwargs = dict(kwargs)
    with pytest.raises(error, match=match):
        load_dataset(kwargs.pop("name"), **kwargs)
