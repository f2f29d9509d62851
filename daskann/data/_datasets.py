"""Every data set by name (``load_dataset``), the three that need no files, and the split.

The sets that need no files: synthetic linear data, the digits and MNIST-1D.
MNIST-1D is generated offline with the ``mnist1d`` package: ``mnist1d.data.make_dataset`` builds
the set procedurally from ten templates; ``get_dataset`` would download a pickle instead, so it is
never called.

:func:`train_val_split` splits any of them, and :func:`as_dask` hands numpy data to dask.
"""

from __future__ import annotations

import contextlib
import io
import numbers
import random
import threading
from dataclasses import dataclass
from functools import lru_cache
from typing import Literal, get_args

import dask.array as da
import numpy as np

from daskann._validation import (
    DatasetName,
    check_choice,
    check_float,
    check_float_dtype,
    check_folder,
    check_int,
    invalid,
)
from daskann.data._cifar import load_cifar10
from daskann.data._idx import load_mnist_idx

DATASETS = get_args(DatasetName)
_NEEDS_PATH = ("mnist", "cifar10")
_LINEAR_DEFAULTS = {"n_samples": 1024, "n_features": 32, "n_outputs": 4}
_MNIST1D_SAMPLES = 4000
_N_CLASSES = {"digits": 10, "mnist1d": 10, "mnist": 10, "cifar10": 10}

# make_dataset reseeds the global numpy and random generators; the lock keeps
# the save/restore of that global state atomic across threads.
_GLOBAL_RNG_LOCK = threading.Lock()


@dataclass(frozen=True, repr=False)
class Dataset:
    """A data set split into training and validation parts.

    Attributes
    ----------
    name : str
        One of :data:`DATASETS`.
    X_train, y_train, X_val, y_val : ndarray
        Features are 2-d floats; targets are 2-d floats for regression and
        1-d int64 labels for classification.
    task : {"regression", "classification"}
    loss : {"mse", "cross_entropy"}
        The natural loss for ``task``.
    """

    name: str
    X_train: np.ndarray
    y_train: np.ndarray
    X_val: np.ndarray
    y_val: np.ndarray
    task: Literal["regression", "classification"]
    loss: Literal["mse", "cross_entropy"]

    @property
    def n_features(self) -> int:
        return int(self.X_train.shape[1])

    @property
    def n_outputs(self) -> int:
        """Output width of a network for this set: target columns or classes."""
        if self.task == "classification":
            seen = int(max(self.y_train.max(), self.y_val.max())) + 1
            return max(seen, _N_CLASSES.get(self.name, 0))
        return int(self.y_train.shape[1])

    def as_dask(self, chunks: int | str = "auto"):
        """``(X_train, y_train, X_val, y_val)`` as row-chunked dask arrays (see :func:`as_dask`)."""
        X_train, y_train = as_dask(self.X_train, self.y_train, chunks=chunks)
        X_val, y_val = as_dask(self.X_val, self.y_val, chunks=chunks)
        return X_train, y_train, X_val, y_val

    def __repr__(self) -> str:
        return (
            f"Dataset({self.name!r}, X_train={self.X_train.shape}, X_val={self.X_val.shape}, "
            f"task={self.task!r}, loss={self.loss!r}, dtype={self.X_train.dtype})"
        )


def make_linear(
    n_samples: int = 1024,
    n_features: int = 32,
    n_outputs: int = 4,
    *,
    noise: float = 0.1,
    seed: int = 0,
    dtype="float64",
):
    """Regression data with a known linear input-output relation.

    ``X`` is standard normal, ``A`` is normal with variance ``1 / n_features``
    (so ``y`` has unit scale whatever the width) and the noise is Gaussian with
    standard deviation ``noise``. The network's difficulty is fixed, so timings
    reflect the parallel method, not the data.

    Parameters
    ----------
    n_samples, n_features, n_outputs : int
    noise : float
        Standard deviation of the additive noise, ``>= 0``.
    seed : int
    dtype : {"float64", "float32"}

    Returns
    -------
    X : ndarray of shape (n_samples, n_features)
    y : ndarray of shape (n_samples, n_outputs)
    """
    n_samples = check_int("n_samples", n_samples)
    n_features = check_int("n_features", n_features)
    n_outputs = check_int("n_outputs", n_outputs)
    noise = check_float("noise", noise, minimum=0.0)
    dtype = check_float_dtype(dtype)
    rng = np.random.default_rng(check_int("seed", seed, minimum=0))
    X = rng.standard_normal((n_samples, n_features))
    A = rng.standard_normal((n_features, n_outputs)) / np.sqrt(n_features)
    y = X @ A + noise * rng.standard_normal((n_samples, n_outputs))
    return X.astype(dtype), y.astype(dtype)


def load_digits(dtype="float64"):
    """The 8x8 handwritten digits bundled with scikit-learn (no download).

    Parameters
    ----------
    dtype : {"float64", "float32"}
        Dtype of ``X``.

    Returns
    -------
    X : ndarray of shape (1797, 64)
        Pixel intensities scaled from 0..16 to ``[0, 1]``.
    y : ndarray of shape (1797,), int64
        Digit labels 0..9.

    Examples
    --------
    >>> X, y = load_digits()
    >>> X.shape, int(y.max())
    ((1797, 64), 9)
    """
    dtype = check_float_dtype(dtype)
    from sklearn.datasets import load_digits as _sklearn_load_digits  # heavy: imported when the set is loaded

    bunch = _sklearn_load_digits()
    X = (np.asarray(bunch.data, dtype=np.float64) / 16.0).astype(dtype)
    y = np.asarray(bunch.target, dtype=np.int64)
    return X, y


def load_dataset(
    name: DatasetName,
    *,
    n_samples: int | None = None,
    n_features: int | None = None,
    n_outputs: int | None = None,
    noise: float = 0.1,
    path=None,
    val_fraction: float = 0.2,
    seed: int = 0,
    dtype="float64",
) -> Dataset:
    """Load or generate a data set by name and split off a validation part.

    Never touches the network: ``"mnist"`` and ``"cifar10"`` read local files.

    Parameters
    ----------
    name : {"linear", "digits", "mnist1d", "mnist", "cifar10"}
        ``"linear"``: :func:`make_linear` (regression). ``"digits"``: scikit-learn's bundled 8x8 digits.
        ``"mnist1d"``: MNIST-1D generated offline. ``"mnist"``: the training IDX files in ``path``.
        ``"cifar10"``: the training batches in ``path``. The test files of MNIST and CIFAR-10 are left
        untouched (see :func:`load_mnist_idx`, :func:`load_cifar10`).
    n_samples : int, optional
        Samples before the split. ``"linear"``: 1024 by default; ``"mnist1d"``: 4000 by default; other
        sets: all by default, else the first ``n_samples`` rows.
    n_features, n_outputs : int, optional
        Only for ``"linear"`` (32 and 4 by default).
    noise : float
        Noise level of ``"linear"``; unused by the others.
    path : str or os.PathLike, optional
        Local folder of ``"mnist"`` and ``"cifar10"``; required for them only.
    val_fraction : float
        Share of samples for validation, in ``(0, 1)``.
    seed : int
        Seed of the generated sets and of the split.
    dtype : {"float64", "float32"}
        Dtype of the features (and of regression targets).

    Returns
    -------
    Dataset

    Examples
    --------
    >>> ds = load_dataset("linear", n_samples=100, n_features=8, n_outputs=2)
    >>> ds.X_train.shape, ds.y_val.shape, ds.loss
    ((80, 8), (20, 2), 'mse')
    """
    name, n_samples, noise, seed, dtype = _check_arguments(
        name, n_samples, n_features, n_outputs, noise, path, val_fraction=val_fraction, seed=seed, dtype=dtype
    )
    if name == "linear":
        X, y = _make_linear(n_samples, n_features, n_outputs, noise=noise, seed=seed, dtype=dtype)
        task, loss = "regression", "mse"
    else:
        X, y = _read_labelled(name, n_samples, path=path, seed=seed, dtype=dtype)
        task, loss = "classification", "cross_entropy"
    X_train, X_val, y_train, y_val = train_val_split(X, y, val_fraction=val_fraction, seed=seed)
    return Dataset(name, X_train, y_train, X_val, y_val, task, loss)


def _check_arguments(name, n_samples, n_features, n_outputs, noise, path, *, val_fraction, seed, dtype):
    """``(name, n_samples, noise, seed, dtype)`` checked: cheap checks, before any loading or generation."""
    name = check_choice("dataset", name, DATASETS)
    if n_samples is not None:
        n_samples = check_int("n_samples", n_samples)
    for key, value in (("n_features", n_features), ("n_outputs", n_outputs)):
        if value is not None and name != "linear":
            raise invalid(key, value, f"None: it only applies to dataset 'linear', not {name!r}")
    noise = check_float("noise", noise, minimum=0.0)
    check_val_fraction(val_fraction)
    seed = check_int("seed", seed, minimum=0)
    dtype = check_float_dtype(dtype)
    if name in _NEEDS_PATH:
        if path is None:
            expected = f"the local folder holding the {name} files (dataset {name!r} is never downloaded)"
            raise invalid("path", path, expected)
        check_folder(path, name="path")
    elif path is not None:
        raise invalid("path", path, f"None: dataset {name!r} needs no files")
    return name, n_samples, noise, seed, dtype


def _make_linear(n_samples, n_features, n_outputs, *, noise, seed, dtype):
    """``X, y`` of :func:`make_linear`, its defaults standing in for the sizes not given."""
    given = {"n_samples": n_samples, "n_features": n_features, "n_outputs": n_outputs}
    sizes = {key: _LINEAR_DEFAULTS[key] if value is None else value for key, value in given.items()}
    return make_linear(**sizes, noise=noise, seed=seed, dtype=dtype)


def _read_labelled(name: str, n_samples, *, path, seed, dtype):
    """``X, y`` of a classification set, cut to its first ``n_samples`` rows when given."""
    if name == "digits":
        X, y = load_digits(dtype=dtype)
    elif name == "mnist1d":
        X, y = make_mnist1d(n_samples or _MNIST1D_SAMPLES, seed=seed, dtype=dtype)
    elif name == "mnist":
        X, y = load_mnist_idx(path, kind="train", dtype=dtype)
    else:
        X, y = load_cifar10(path, kind="train", dtype=dtype)
    if n_samples is None:
        return X, y
    if n_samples > X.shape[0]:
        raise invalid("n_samples", n_samples, f"at most {X.shape[0]}, the samples of dataset {name!r}")
    return X[:n_samples], y[:n_samples]


# -- MNIST-1D, generated ----------------------------------------------------------------------
def make_mnist1d(n_samples: int = _MNIST1D_SAMPLES, *, seed: int = 0, dtype="float64"):
    """The MNIST-1D benchmark (Greydanus 2020), generated without network access.

    Each sample is a 40-point 1-d signal made from one of ten digit-like
    templates by padding, shear, translation, correlated and i.i.d. noise.
    The whole set is standardised (mean 0, standard deviation 1) by the
    generator. Results are cached per ``(n_samples, seed)`` in the process,
    since generation takes seconds; callers get copies.

    Parameters
    ----------
    n_samples : int
        Number of samples. The generator makes ``n_samples // 10`` per class,
        so for other counts the next multiple of 10 is generated (already
        shuffled) and the first ``n_samples`` kept.
    seed : int
        Seed of the generator, ``>= 0``. The caller's global ``numpy.random``
        and ``random`` states are left as they were.
    dtype : {"float64", "float32"}
        Dtype of ``X``.

    Returns
    -------
    X : ndarray of shape (n_samples, 40)
    y : ndarray of shape (n_samples,), int64
        Labels 0..9.

    Examples
    --------
    >>> X, y = make_mnist1d(100, seed=0)
    >>> X.shape
    (100, 40)
    """
    n_samples = check_int("n_samples", n_samples)
    seed = check_int("seed", seed, minimum=0)
    dtype = check_float_dtype(dtype)
    X, y = _generate(n_samples, seed)
    return X.astype(dtype, copy=True), y.copy()


@lru_cache(maxsize=8)
def _generate(n_samples: int, seed: int):
    from mnist1d.data import get_dataset_args, make_dataset  # heavy (about a second): imported when generating

    args = get_dataset_args()
    args.num_samples = -(-n_samples // _N_CLASSES["mnist1d"]) * _N_CLASSES["mnist1d"]
    args.seed = seed
    with _GLOBAL_RNG_LOCK:
        np_state, py_state = np.random.get_state(), random.getstate()
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                data = make_dataset(args)
        finally:
            np.random.set_state(np_state)
            random.setstate(py_state)
    X = np.concatenate([data["x"], data["x_test"]])[:n_samples].astype(np.float64)
    y = np.concatenate([data["y"], data["y_test"]])[:n_samples].astype(np.int64)
    X.flags.writeable = False
    y.flags.writeable = False
    return X, y


def upsample_signals(X, width: int = 784):
    """Signals resampled to ``width`` points by linear interpolation, e.g. MNIST-1D as wide as MNIST.

    Each row is read as a signal sampled at evenly spaced points and
    interpolated onto ``width`` evenly spaced points. The result is scaled by
    ``sqrt(n_points / width)`` so that inner products between samples stay
    about those of ``X``: a network sees as wide an input as MNIST's, with the
    geometry of the original set.

    Parameters
    ----------
    X : ndarray of shape (n_samples, n_points)
    width : int
        Points per resampled signal, ``>= 2``.

    Returns
    -------
    ndarray of shape (n_samples, width), of ``X``'s dtype

    Examples
    --------
    >>> X, _ = make_mnist1d(100, seed=0)
    >>> upsample_signals(X, 784).shape
    (100, 784)
    """
    X = np.asarray(X)
    width = check_int("width", width, minimum=2)
    if X.ndim != 2 or X.shape[1] < 2:
        raise ValueError(f"X of shape {X.shape} is not valid: expected a 2-d array of signals of 2 points or more")
    points = X.shape[1]
    # the weights of the two neighbouring source points of every target point: one matrix product for all rows
    position = np.linspace(0.0, points - 1.0, width)
    left = np.minimum(np.floor(position).astype(int), points - 2)
    frac = position - left
    resample = np.zeros((points, width))
    resample[left, np.arange(width)] = 1.0 - frac
    resample[left + 1, np.arange(width)] += frac
    return (X @ resample * np.sqrt(points / width)).astype(X.dtype, copy=False)


# -- the split, and numpy data handed to dask ------------------------------------------------
def _rows(array, name: str):
    if isinstance(array, da.Array):
        return array
    array = np.asarray(array)
    if array.ndim == 0:
        raise invalid(name, array, "an array with one row per sample", TypeError)
    return array


def check_val_fraction(val_fraction) -> float:
    return check_float("val_fraction", val_fraction, minimum=0.0, maximum=1.0, min_inclusive=False, max_inclusive=False)


def train_val_split(X, y, *, val_fraction: float = 0.2, seed: int = 0):
    """Split samples at random into a training and a validation part.

    Parameters
    ----------
    X : array-like of shape (n_samples, ...)
    y : array-like of shape (n_samples, ...)
    val_fraction : float
        Share of the samples in the validation part, in ``(0, 1)``; the count
        is ``round(n_samples * val_fraction)`` and both parts must be non-empty.
    seed : int
        Seed of the permutation (``numpy.random.default_rng(seed)``).

    Returns
    -------
    X_train, X_val, y_train, y_val : ndarray
        Rows in the permutation's order.

    Examples
    --------
    >>> import numpy as np
    >>> X_train, X_val, y_train, y_val = train_val_split(np.zeros((10, 2)), np.arange(10))
    >>> X_train.shape, X_val.shape
    ((8, 2), (2, 2))
    """
    val_fraction = check_val_fraction(val_fraction)
    seed = check_int("seed", seed, minimum=0)
    X = np.asarray(_rows(X, "X"))
    y = np.asarray(_rows(y, "y"))
    n = X.shape[0]
    if y.shape[0] != n:
        raise invalid("y", f"array of shape {y.shape}", f"{n} rows, as X")
    n_val = int(round(n * val_fraction))
    if not 0 < n_val < n:
        expected = f"a fraction leaving both parts non-empty for {n} samples (here {n_val} for validation)"
        raise invalid("val_fraction", val_fraction, expected)
    perm = np.random.default_rng(seed).permutation(n)
    val, train = perm[:n_val], perm[n_val:]
    return X[train], X[val], y[train], y[val]


def as_dask(X, y=None, *, chunks: int | str = "auto"):
    """Chunked dask arrays of the samples, split by rows only.

    Parameters
    ----------
    X : array-like of shape (n_samples, ...)
    y : array-like of shape (n_samples, ...), optional
        Chunked with the same row blocks as ``X``.
    chunks : int or "auto"
        Rows per block, or ``"auto"`` to let dask choose the row blocks.
        Columns are never split.

    Returns
    -------
    dask.array.Array, or a pair ``(X, y)`` of them when ``y`` is given.

    Examples
    --------
    >>> import numpy as np
    >>> dX, dy = as_dask(np.zeros((10, 3)), np.arange(10), chunks=4)
    >>> dX.chunks, dy.chunks
    (((4, 4, 2), (3,)), ((4, 4, 2),))
    """
    if isinstance(chunks, str):
        if chunks != "auto":
            raise invalid("chunks", chunks, "a positive number of rows per block or 'auto'")
    elif not isinstance(chunks, numbers.Integral) or isinstance(chunks, bool):
        raise invalid("chunks", chunks, "a positive number of rows per block or 'auto'", TypeError)
    else:
        chunks = check_int("chunks", chunks, minimum=1)
    X = _rows(X, "X")
    dX = _chunk_rows(X, (chunks,) + (-1,) * (X.ndim - 1))
    if y is None:
        return dX
    y = _rows(y, "y")
    if y.shape[0] != X.shape[0]:
        raise invalid("y", f"array of shape {y.shape}", f"{X.shape[0]} rows, as X")
    return dX, _chunk_rows(y, (dX.chunks[0],) + (-1,) * (y.ndim - 1))


def _chunk_rows(array, chunks):
    if isinstance(array, da.Array):
        return array.rechunk(chunks)
    return da.from_array(array, chunks=chunks)
