"""Scanning a store or a run folder: each store checked by the verifier of its kind, orphans reported."""

from __future__ import annotations

import importlib
import json
import os
from collections.abc import Callable
from pathlib import Path

from daskann.exceptions import DamagedStoreError, StoreError
from daskann.store._checkpoints import load_checkpoint
from daskann.store._history import load_history

#: store kind -> ``verify(path)``, which raises StoreError, OSError or ValueError for a damaged store
VERIFIERS: dict[str, Callable[[Path], object]] = {}
#: store kind -> the module that registers its verifier when imported; imported when a store of the kind is met,
#: so neither this module nor a caller of :func:`verify_path` has to load the method that writes it
VERIFIER_MODULES: dict[str, str] = {"mgrit-trajectory": "daskann.mgrit._store"}


def register_verifier(kind: str, verify: Callable[[Path], object]) -> None:
    """Let :func:`verify_path` check stores whose recorded kind is ``kind`` with ``verify(path)``.

    ``verify`` raises :class:`StoreError` (or ``OSError``/``ValueError``) when
    the store is damaged. A module that defines a store kind registers it when
    imported (``daskann.mgrit._store`` registers MGRIT trajectories), so this
    module depends on none of them; :data:`VERIFIER_MODULES` names the modules
    of the package's own kinds, imported when their first store is checked.
    """
    VERIFIERS[kind] = verify


register_verifier("checkpoint", load_checkpoint)
register_verifier("history", load_history)


def _store_kind(path: Path) -> str | None:
    meta_file = path / "zarr.json"
    if not meta_file.is_file():
        return None
    try:
        meta = json.loads(meta_file.read_text())
    except ValueError:
        return "unreadable"
    daskann_meta = meta.get("attributes", {}).get("daskann")
    return daskann_meta.get("kind") if isinstance(daskann_meta, dict) else None


def _is_temporary(name: str) -> bool:
    return ".tmp-" in name or ".old-" in name or name.endswith(".partial")


def _item(path: Path, kind: str | None, status: str, detail: str = "") -> dict:
    return {"path": str(path), "kind": kind, "status": status, "detail": detail}


def _check_store(path: Path, kind: str | None) -> dict:
    """The report item of one store, checked by the verifier of its recorded kind."""
    try:
        if kind == "unreadable":
            raise DamagedStoreError("zarr.json is not valid JSON")
        if kind not in VERIFIERS and kind in VERIFIER_MODULES:
            importlib.import_module(VERIFIER_MODULES[kind])
        if kind not in VERIFIERS:
            raise StoreError("not a daskann store")
        VERIFIERS[kind](path)
    except (StoreError, OSError, ValueError) as exc:
        return _item(path, kind, "damaged", str(exc))
    return _item(path, kind, "ok")


def _scan_folder(folder: Path) -> list[dict]:
    """Report items of every store and every orphan temporary file under ``folder``."""
    items = []
    for root, dirs, files in os.walk(folder):
        root_path = Path(root)
        items += [
            _item(root_path / name, None, "orphan", "temporary file left by an interrupted write")
            for name in dirs + files
            if _is_temporary(name)
        ]
        for name in list(dirs):
            kind = None if _is_temporary(name) else _store_kind(root_path / name)
            if _is_temporary(name) or kind is not None:
                dirs.remove(name)  # a store's own files are checked by its verifier
            if kind is not None:
                items.append(_check_store(root_path / name, kind))
    return items


def verify_path(path) -> dict:
    """Scan a store or a run folder: checksums, missing arrays, orphan temporary files.

    Each store is checked by the verifier registered for its kind
    (:func:`register_verifier`); the verifiers of every kind the package
    writes load when a store of their kind is met.

    Returns ``{"ok": bool, "items": [{"path", "kind", "status", "detail"}]}``
    where status is ``"ok"``, ``"damaged"`` or ``"orphan"``.
    """
    path = Path(path)
    kind = _store_kind(path)
    items = [_check_store(path, kind)] if kind is not None else _scan_folder(path)
    if not items:
        items.append(_item(path, None, "damaged", "no daskann store found"))
    return {"ok": all(item["status"] == "ok" for item in items), "items": items}
