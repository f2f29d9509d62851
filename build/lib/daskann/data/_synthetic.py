"""The papers' synthetic linear data: ``y = X @ A + noise``."""

from __future__ import annotations

import numpy as np

from daskann._validation import check_float, check_float_dtype, check_int


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
