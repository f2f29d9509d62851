"""Checks of user input. Every error names the parameter, the value and what would be valid."""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence

import numpy as np

FLOAT_DTYPES = ("float32", "float64")


def invalid(name: str, value, expected: str, error=ValueError) -> Exception:
    """Build the standard error for a parameter ``name`` holding ``value``."""
    return error(f"{name}={_short_repr(value)} is not valid: expected {expected}")


def _short_repr(value) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def check_choice(name: str, value, choices: Sequence[str]) -> str:
    if not isinstance(value, str) or value not in choices:
        raise invalid(name, value, "one of " + ", ".join(repr(c) for c in choices))
    return value


def check_float_dtype(dtype, name: str = "dtype") -> np.dtype:
    try:
        resolved = np.dtype(dtype)
    except TypeError:
        raise invalid(name, dtype, "'float32' or 'float64'", TypeError) from None
    if resolved.name not in FLOAT_DTYPES:
        raise invalid(name, dtype, "'float32' or 'float64'", TypeError)
    return resolved


def check_int(name: str, value, *, minimum: int | None = 1, maximum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise invalid(name, value, "an integer", TypeError)
    value = int(value)
    if minimum is not None and value < minimum:
        bound = f"an integer >= {minimum}" + (f" and <= {maximum}" if maximum is not None else "")
        raise invalid(name, value, bound)
    if maximum is not None and value > maximum:
        raise invalid(name, value, f"an integer <= {maximum}")
    return value


def check_float(
    name: str,
    value,
    *,
    minimum: float | None = None,
    maximum: float | None = None,
    min_inclusive: bool = True,
    max_inclusive: bool = True,
) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise invalid(name, value, "a real number", TypeError)
    value = float(value)
    lo = "" if minimum is None else ("[" if min_inclusive else "(") + f"{minimum:g}"
    hi = "" if maximum is None else f"{maximum:g}" + ("]" if max_inclusive else ")")
    expected = "a finite number" + (f" in {lo or '(-inf'}, {hi or 'inf)'}" if lo or hi else "")
    if not math.isfinite(value):
        raise invalid(name, value, expected)
    if minimum is not None and (value < minimum or (value == minimum and not min_inclusive)):
        raise invalid(name, value, expected)
    if maximum is not None and (value > maximum or (value == maximum and not max_inclusive)):
        raise invalid(name, value, expected)
    return value


def check_learning_rate(lr, name: str = "lr") -> float:
    return check_float(name, lr, minimum=0.0, min_inclusive=False)


def check_momentum(momentum, name: str = "momentum") -> float:
    return check_float(name, momentum, minimum=0.0, maximum=1.0, max_inclusive=False)


def check_sizes(sizes, name: str = "sizes") -> tuple[int, ...]:
    if isinstance(sizes, (str, bytes)) or not isinstance(sizes, Sequence) or len(sizes) < 2:
        raise invalid(name, sizes, "a sequence of at least two layer widths, e.g. [784, 128, 10]")
    return tuple(check_int(f"{name}[{i}]", s, minimum=1) for i, s in enumerate(sizes))


def check_hidden_sizes(hidden, name: str = "hidden_sizes") -> tuple[int, ...]:
    if isinstance(hidden, numbers.Integral) and not isinstance(hidden, bool):
        hidden = (hidden,)
    if isinstance(hidden, (str, bytes)) or not isinstance(hidden, Sequence):
        raise invalid(name, hidden, "a sequence of hidden layer widths, e.g. (128, 64)", TypeError)
    return tuple(check_int(f"{name}[{i}]", h, minimum=1) for i, h in enumerate(hidden))


def _as_numpy(array, name: str) -> np.ndarray:
    if hasattr(array, "compute") and hasattr(array, "chunks"):
        array = array.compute()
    try:
        return np.asarray(array)
    except Exception as exc:  # ragged lists and the like
        raise invalid(name, type(array).__name__, "an array-like of numbers", TypeError) from exc


def check_features(X, *, name: str = "X", dtype=np.float64, n_features: int | None = None) -> np.ndarray:
    """A finite 2-d float array; integers and other types are refused, not cast."""
    X = _as_numpy(X, name)
    if X.ndim != 2:
        raise invalid(name, f"array of shape {X.shape}", "a 2-d array of shape (n_samples, n_features)")
    if not np.issubdtype(X.dtype, np.floating):
        raise invalid(name, f"array of dtype {X.dtype}", "a float32 or float64 array", TypeError)
    if X.shape[0] == 0:
        raise invalid(name, f"array of shape {X.shape}", "at least one sample")
    if n_features is not None and X.shape[1] != n_features:
        raise invalid(name, f"array of shape {X.shape}", f"{n_features} features, as the network's input layer")
    bad = ~np.isfinite(X)
    if bad.any():
        first = tuple(int(i) for i in np.argwhere(bad)[0])
        raise invalid(name, f"array with {int(bad.sum())} NaN or Inf values (first at {first})", "finite values")
    return np.ascontiguousarray(X, dtype=dtype)


def check_targets(y, *, loss: str, n_samples: int, name: str = "y", dtype=np.float64, n_outputs: int | None = None):
    """Targets for ``loss``: integer labels for cross-entropy, floats for MSE.

    Returns ``(y, n_outputs)``.
    """
    y = _as_numpy(y, name)
    if y.shape[:1] != (n_samples,):
        raise invalid(name, f"array of shape {y.shape}", f"{n_samples} rows, as X")
    if loss == "cross_entropy":
        if y.ndim != 1 or not (np.issubdtype(y.dtype, np.integer) or np.issubdtype(y.dtype, np.floating)):
            raise invalid(name, f"array of shape {y.shape} and dtype {y.dtype}", "1-d integer class labels")
        if np.issubdtype(y.dtype, np.floating):
            if not np.all(np.isfinite(y)) or np.any(y != np.round(y)):
                raise invalid(name, "float array with non-integer values", "1-d integer class labels")
        labels = y.astype(np.int64)
        if labels.min() < 0:
            raise invalid(name, f"labels with minimum {labels.min()}", "labels >= 0")
        classes = int(labels.max()) + 1
        if n_outputs is not None and classes > n_outputs:
            raise invalid(name, f"labels up to {classes - 1}", f"labels below {n_outputs}, the network's output width")
        return labels, n_outputs or classes
    if y.ndim == 1:
        y = y[:, None]
    if y.ndim != 2 or not np.issubdtype(y.dtype, np.floating):
        raise invalid(
            name, f"array of shape {y.shape} and dtype {y.dtype}", "a 2-d float array of regression targets", TypeError
        )
    if n_outputs is not None and y.shape[1] != n_outputs:
        raise invalid(name, f"array of shape {y.shape}", f"{n_outputs} columns, as the network's output layer")
    bad = ~np.isfinite(y)
    if bad.any():
        raise invalid(name, f"array with {int(bad.sum())} NaN or Inf values", "finite values")
    return np.ascontiguousarray(y, dtype=dtype), y.shape[1]
