"""The benchmarks' report writer: a JSON document and PNG figures in the output folder."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from daskann import _plotting
from daskann._json import json_default
from daskann.store import temporary_sibling


def write_json(document, path, *, indent: int = 1, default=None) -> Path:
    """Write ``document`` to ``path`` whole: a reader never sees half a file (a temporary sibling, then a rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temporary_sibling(path)
    tmp.write_text(json.dumps(document, indent=indent, default=default))
    os.replace(tmp, path)
    return path


def progress(message: str) -> None:
    """A progress line on standard error, apart from the report on standard output."""
    print(message, file=sys.stderr, flush=True)


def save_figure(fig, path, *, dpi: int = 110) -> Path:
    """Write a figure of :func:`daskann._plotting.figure` as PNG to ``path``."""
    return _plotting.save(fig, path, dpi=dpi)


__all__ = ["json_default", "progress", "save_figure", "write_json"]
