"""JSON-safe copies of results (numpy scalars, NaN, paths) for reports, run folders and ``--json`` output."""

from __future__ import annotations

import math

import numpy as np


def clean_json(value, *, finite: bool = True):
    """A JSON-safe copy: numpy scalars to Python, tuples to lists, paths and other objects to str.

    With ``finite``, NaN and infinities become None (JSON's null); without, they stay floats
    (``json.dumps`` writes ``NaN`` and ``Infinity``).
    """
    if isinstance(value, dict):
        return {str(k): clean_json(v, finite=finite) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [clean_json(v, finite=finite) for v in value]
    if isinstance(value, (np.floating, np.integer, np.bool_)):
        value = value.item()
    if finite and isinstance(value, float) and not math.isfinite(value):
        return None
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


def json_default(obj):
    """``json.dumps``'s ``default``: what JSON cannot hold, as :func:`clean_json` writes it (NaN kept)."""
    return clean_json(obj, finite=False)


__all__ = ["clean_json", "json_default"]
