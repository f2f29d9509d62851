"""Every data set by name (``load_dataset``), and the two that need no files: synthetic linear data, the digits."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

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
from daskann.data._mnist1d import make_mnist1d
from daskann.data._split import as_dask, check_val_fraction, train_val_split

DATASETS = get_args(DatasetName)
_NEEDS_PATH = ("mnist", "cifar10")
_LINEAR_DEFAULTS = {"n_samples": 1024, "n_features": 32, "n_outputs": 4}
_MNIST1D_SAMPLES = 4000
_N_CLASSES = {"digits": 10, "mnist1d": 10, "mnist": 10, "cifar10": 10}


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
