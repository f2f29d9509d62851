"""JSON-safe copies of results (numpy scalars, NaN, paths) for reports and ``--json`` output."""

from __future__ import annotations

import math

import numpy as np


def clean_json(value):
    """A JSON-safe copy: numpy scalars to Python, NaN and infinities to None, paths to str."""
    if isinstance(value, dict):
        return {str(k): clean_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [clean_json(v) for v in value]
    if isinstance(value, (np.floating, np.integer, np.bool_)):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


__all__ = ["clean_json"]
