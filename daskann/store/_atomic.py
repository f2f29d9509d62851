"""Atomic, verified zarr groups: the writing and reading every daskann store builds on.

A store is written under a temporary name beside its target, flushed, and renamed into
place, so a reader sees either the old store or the complete new one. Each array's SHA-256
is kept in a manifest in the group's attributes and checked on load; chunks also carry a
CRC32C so a flipped byte fails loudly.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import itertools
import os
import shutil
import uuid
from pathlib import Path

import numpy as np
import zarr
from zarr.codecs import Crc32cCodec, ZstdCodec

from daskann._json import temporary_sibling
from daskann._validation import named_error
from daskann.exceptions import DamagedStoreError, DiskFullError, StoreError

FORMAT_VERSION = 1


#: errors of a write that ran out of room (no space, quota, file-size limit)
_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})


def reraise_if_full(exc: BaseException, target: Path) -> None:
    """Raise a write's error that ran out of room again as :class:`DiskFullError`, naming ``target``."""
    if isinstance(exc, OSError) and exc.errno in _FULL_ERRNOS and not isinstance(exc, DiskFullError):
        raise DiskFullError(
            exc.errno,
            f"path={str(target)!r} could not be written: {os.strerror(exc.errno)}; nothing was replaced "
            "and earlier checkpoints are intact (free space, then resume the run)",
        ) from exc


def array_digest(array: np.ndarray) -> str:
    """SHA-256 of an array's dtype, shape and bytes."""
    array = np.ascontiguousarray(array)
    h = hashlib.sha256()
    h.update(f"{array.dtype.str}{array.shape}".encode())
    h.update(array.tobytes())
    return h.hexdigest()


def _fsync_tree(path: Path) -> None:
    for root, _dirs, files in os.walk(path):
        for name in files:
            with open(os.path.join(root, name), "rb") as f:
                os.fsync(f.fileno())
        _fsync_dir(Path(root))


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_replace_dir(tmp: Path, target: Path) -> None:
    """Move a finished store ``tmp`` to ``target``, replacing any old one."""
    _fsync_tree(tmp)
    old = None
    if target.exists():
        old = target.with_name(f".{target.name}.old-{uuid.uuid4().hex[:8]}")
        os.rename(target, old)
    os.rename(tmp, target)
    _fsync_dir(target.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def commit_manifest(group, attrs: dict, manifest: dict, tmp, target) -> None:
    """Write the manifest into the group's attributes last, then move the store into place."""
    meta = dict(attrs.get("daskann", {}))
    meta["manifest"] = manifest
    group.attrs.update({**attrs, "daskann": meta})
    atomic_replace_dir(tmp, target)


@contextlib.contextmanager
def staged(path):
    """``(target, tmp)``: a store is written to ``tmp`` beside ``target``; removed if the write fails.

    A write that runs out of room is raised as :class:`DiskFullError`.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = temporary_sibling(target)
    try:
        yield target, tmp
    except BaseException as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        reraise_if_full(exc, target)
        raise


def write_array_group(path, arrays: dict[str, np.ndarray], attrs: dict) -> Path:
    """Write named arrays and JSON attributes as one zarr group, atomically.

    The manifest of array digests is added to ``attrs["daskann"]["manifest"]``.
    """
    with staged(path) as (target, tmp):
        group = zarr.open_group(str(tmp), mode="w-")
        manifest = {}
        for name, array in arrays.items():
            array = np.ascontiguousarray(array)
            z = group.create_array(
                name,
                shape=array.shape,
                dtype=array.dtype,
                chunks=array.shape or None,
                compressors=[ZstdCodec(level=1), Crc32cCodec()],
            )
            z[...] = array
            manifest[name] = {"shape": list(array.shape), "dtype": array.dtype.str, "sha256": array_digest(array)}
        commit_manifest(group, attrs, manifest, tmp, target)
    return target


def read_array_group(path, *, kind: str) -> tuple[dict[str, np.ndarray], dict]:
    """Read and verify a group written by :func:`write_array_group` (or :func:`write_block_group`)."""
    path = Path(path)
    group, attrs, meta = open_group(path, kind=kind)
    arrays = {}
    for name, expected in meta.get("manifest", {}).items():
        try:
            array = group[name][...]
        except Exception as exc:
            raise named_error(
                DamagedStoreError, "path", f"{str(path)!r}: array {name!r} cannot be read ({exc})"
            ) from exc
        verify_array(path, name, np.asarray(array), expected)
        arrays[name] = np.asarray(array)
    return arrays, attrs


def open_group(path: Path, *, kind: str):
    """The zarr group of a daskann store of ``kind``, its attributes and daskann metadata (no array read)."""
    if not path.exists():
        raise named_error(FileNotFoundError, "path", f"{str(path)!r}: no such store")
    try:
        group = zarr.open_group(str(path), mode="r")
        attrs = dict(group.attrs)
    except Exception as exc:
        raise named_error(DamagedStoreError, "path", f"{str(path)!r} is not a readable zarr store: {exc}") from exc
    meta = attrs.get("daskann")
    if not isinstance(meta, dict) or meta.get("kind") != kind:
        found = meta.get("kind") if isinstance(meta, dict) else None
        raise named_error(StoreError, "path", f"{str(path)!r} is not a daskann {kind} (found kind={found!r})")
    if meta.get("format_version") != FORMAT_VERSION:
        raise named_error(
            StoreError,
            "path",
            f"{str(path)!r} has format_version={meta.get('format_version')!r}; "
            f"this daskann reads version {FORMAT_VERSION}",
        )
    return group, attrs, meta


def verify_array(path: Path, name: str, array: np.ndarray, expected: dict) -> None:
    """Check a whole array against its manifest entry: one digest, or one per written block."""
    if "blocks" not in expected:
        if array_digest(array) != expected["sha256"]:
            raise named_error(DamagedStoreError, "path", f"{str(path)!r}: array {name!r} does not match its checksum")
        return
    for index, region in block_regions(expected["bounds"]):
        if array_digest(array[tuple(slice(a, b) for a, b in region)]) != expected["blocks"].get(index):
            raise named_error(
                DamagedStoreError, "path", f"{str(path)!r}: block {index} of array {name!r} does not match its checksum"
            )


# a manifest entry of an array written block by block holds one digest per block
def block_regions(bounds) -> list[tuple[str, tuple]]:
    """``("i.j", ((r0, r1), (c0, c1)))`` for every block of ``bounds`` (one axis or two)."""
    out = []
    for index in itertools.product(*(range(len(axis)) for axis in bounds)):
        region = tuple(tuple(bounds[a][k]) for a, k in enumerate(index))
        out.append((".".join(str(k) for k in index), region))
    return out
