"""Train/validation split and the hand-over of numpy data to dask."""

from __future__ import annotations

import numbers

import dask.array as da
import numpy as np

from daskann._validation import check_float, check_int, invalid


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
