"""Data sets that ship with a dependency: scikit-learn's 8x8 digits."""

from __future__ import annotations

import numpy as np

from daskann._validation import check_float_dtype


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
