"""MNIST-1D generated offline with the ``mnist1d`` package.

``mnist1d.data.make_dataset`` builds the set procedurally from ten templates;
``get_dataset`` would download a pickle instead, so it is never called.
"""

from __future__ import annotations

import contextlib
import io
import random
import threading
from functools import lru_cache

import numpy as np

from daskann._validation import check_float_dtype, check_int

N_CLASSES = 10

# make_dataset reseeds the global numpy and random generators; the lock keeps
# the save/restore of that global state atomic across threads.
_GLOBAL_RNG_LOCK = threading.Lock()


def make_mnist1d(n_samples: int = 4000, *, seed: int = 0, dtype="float64"):
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
    args.num_samples = -(-n_samples // N_CLASSES) * N_CLASSES
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
