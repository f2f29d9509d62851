"""JSON documents: values made JSON-safe, files written whole and read back checked.

Every JSON file daskann writes (a run folder's marker, a sub-model run's
configuration, MGRIT's progress record, the benchmarks' reports) goes through
:func:`write_json`: written under a temporary name beside its target, then
renamed into place, so a reader sees the old document or the new one, never
half of one. :func:`read_json` reads a run's own documents back, and a damaged
one fails as a :class:`~daskann.exceptions.StoreError` that names the option
which led to it. Every value that leaves daskann as JSON (the command line's
``--json`` output, a report, a solver's stored configuration) is cleaned by
:func:`clean_json`. This module loads nothing but numpy, so that the command
line can use it before anything heavy loads.
"""

from __future__ import annotations

import json
import math
import os
import uuid
from pathlib import Path

import numpy as np

from daskann._validation import named_error
from daskann.exceptions import StoreError

__all__ = ["clean_json", "json_default", "read_json", "temporary_sibling", "write_json"]


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


def temporary_sibling(target: Path) -> Path:
    """Hidden temporary path next to ``target`` (same file system, so rename is atomic)."""
    return target.with_name(f".{target.name}.tmp-{uuid.uuid4().hex[:8]}")


def write_json(document, path, *, indent: int | None = 1, default=None) -> Path:
    """Write ``document`` to ``path`` whole: a reader never sees half a file (a temporary sibling, then a rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temporary_sibling(path)
    tmp.write_text(json.dumps(document, indent=indent, default=default))
    os.replace(tmp, path)
    return path


def read_json(folder, file: str, *, name: str, missing=None):
    """The document ``folder / file``; ``missing`` when there is none.

    Raises
    ------
    StoreError
        The file is not valid JSON, named by ``name`` (the option that led to ``folder``):
        ``store='runs/a': progress.json is damaged (...)``.
    """
    try:
        return json.loads((Path(folder) / file).read_text())
    except FileNotFoundError:
        return missing
    except ValueError as exc:  # not JSON, or not UTF-8
        raise named_error(StoreError, name, f"{str(folder)!r}: {file} is damaged ({exc})") from exc
