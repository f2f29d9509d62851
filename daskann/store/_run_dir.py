"""Run output folders: creating one, and refusing one that cannot be written before any work starts."""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

from daskann._json import write_json
from daskann._validation import named_error
from daskann.exceptions import DiskFullError
from daskann.store._atomic import FORMAT_VERSION
from daskann.store._checkpoints import CHECKPOINT_DIR, HISTORY_STORE, MODEL_STORE, RUN_MARKER


def prepare_run_dir(path, *, method: str, config: dict, overwrite: bool = False, resume: bool = False) -> Path:
    """Create or reuse a run output folder.

    A folder that exists and holds anything but a daskann run is refused unless
    ``overwrite``; an existing run is refused unless ``resume`` or ``overwrite``.
    """
    path = Path(path)
    marker = path / RUN_MARKER
    if path.exists() and not path.is_dir():
        raise named_error(ValueError, "output", f"{str(path)!r} is not valid: expected a folder, found a file")
    if path.exists() and any(path.iterdir()):
        if overwrite:
            if not marker.exists():
                # refuse to wipe a folder we did not create, even when asked to overwrite
                for child in path.iterdir():
                    if child.name not in (RUN_MARKER, CHECKPOINT_DIR, HISTORY_STORE, MODEL_STORE):
                        raise named_error(
                            ValueError,
                            "output",
                            f"{str(path)!r} is not valid: it holds {child.name!r}, which is not part "
                            "of a daskann run; choose an empty or new folder",
                        )
            for child in (CHECKPOINT_DIR, HISTORY_STORE, MODEL_STORE):
                shutil.rmtree(path / child, ignore_errors=True)
        elif not marker.exists():
            raise named_error(
                ValueError,
                "output",
                f"{str(path)!r} is not valid: the folder exists and is not a daskann run; "
                "choose an empty or new folder",
            )
        elif not resume:
            raise named_error(
                ValueError,
                "output",
                f"{str(path)!r} is not valid: it already holds a daskann run; "
                "pass resume to continue it or overwrite to start again",
            )
    path.mkdir(parents=True, exist_ok=True)
    os.chmod(path, 0o750)
    write_json(
        {"format": "daskann-run", "format_version": FORMAT_VERSION, "method": method, "config": config},
        marker,
        indent=2,
    )
    return path


def check_writable_folder(folder, name: str = "checkpoint_dir") -> Path:
    """Refuse a folder that cannot be created or written, before any work starts."""
    folder = Path(folder)
    probe_parent = _existing_ancestor(folder)
    if not probe_parent.is_dir():
        raise named_error(
            ValueError, name, f"{str(folder)!r} is not valid: {str(probe_parent)!r} is a file, expected a folder"
        )
    if not os.access(probe_parent, os.W_OK | os.X_OK):
        raise named_error(ValueError, name, f"{str(folder)!r} is not valid: {str(probe_parent)!r} is not writable")
    return folder


def check_free_space(folder, needed: int, name: str = "checkpoint_dir") -> None:
    """Refuse, before any work starts, a folder whose file system cannot hold ``needed`` bytes."""
    free = shutil.disk_usage(_existing_ancestor(Path(folder))).free
    if free < needed:
        raise DiskFullError(
            errno.ENOSPC,
            f"{name}={str(folder)!r} has {_human(free)} free; this run's stores need about {_human(needed)} "
            "(free space, choose another folder or checkpoint less often)",
        )


def _existing_ancestor(path: Path) -> Path:
    """``path`` itself or its nearest ancestor that exists: the folder that a new one would be made in."""
    while not path.exists():
        path = path.parent
    return path


def _human(n_bytes: int) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if n_bytes < 1024 or unit == "GiB":
            return f"{n_bytes:.0f} {unit}" if unit == "bytes" else f"{n_bytes:.1f} {unit}"
        n_bytes /= 1024
