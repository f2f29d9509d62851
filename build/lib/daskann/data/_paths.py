"""Shared helpers of the local-file loaders: the folder check and file lookup."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from daskann._validation import invalid


def check_folder(folder, name: str = "folder") -> Path:
    """``folder`` as an existing directory, or the standard error naming ``name``."""
    if isinstance(folder, bytes) or not isinstance(folder, (str, os.PathLike)):
        raise invalid(name, folder, "a path (str or os.PathLike) to a local folder", TypeError)
    path = Path(folder).expanduser()
    if not path.is_dir():
        raise invalid(name, folder, "an existing local folder", FileNotFoundError)
    return path


def find_file(folder: Path, names: Sequence[str]) -> Path | None:
    """The first of ``names`` present in ``folder``, else ``None``."""
    for file_name in names:
        candidate = folder / file_name
        if candidate.is_file():
            return candidate
    return None
