"""Checkpoints written block by block, on the workers that hold the blocks, and read back by region."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import zarr
from zarr.codecs import Crc32cCodec, ZstdCodec

from daskann._validation import named_error
from daskann.exceptions import DamagedStoreError
from daskann.store._atomic import (
    array_digest,
    block_regions,
    commit_manifest,
    open_group,
    staged,
    verify_array,
)


@dataclass(frozen=True)
class BlockArray:
    """An array of a block store: its shape, dtype and the ``(start, stop)`` bounds of its blocks on each axis."""

    shape: tuple
    dtype: str
    bounds: tuple  # per axis, a tuple of (start, stop)


def block_chunks(bounds) -> int:
    """A chunk length along one axis such that every block of ``bounds`` is made of whole chunks.

    The blocks themselves when they are regular (equal, the last one possibly shorter), else the
    greatest common divisor of their edges: two blocks never share a chunk, so no two writers do.
    """
    sizes = [b - a for a, b in bounds]
    if all(s == sizes[0] for s in sizes[:-1]) and sizes[-1] <= sizes[0]:
        return max(sizes[0], 1)
    return max(math.gcd(*(b for _, b in bounds)), 1)


def write_block(tmp, name: str, region, array: np.ndarray) -> str:
    """Write one block into the array ``name`` of an open block store ``tmp``; its digest.

    Runs on the worker that holds the block; the block covers whole chunks (:func:`block_chunks`).
    """
    array = np.ascontiguousarray(array)
    z = zarr.open_array(str(Path(tmp) / name), mode="r+")
    z[tuple(slice(a, b) for a, b in region)] = array
    return array_digest(array)


def write_block_group(path, layout: dict[str, BlockArray], write: Callable[[Path], dict], attrs: dict) -> Path:
    """Write a zarr group whose blocks are written elsewhere (on the workers), committed atomically.

    The arrays are created (metadata only) under a temporary name; ``write(tmp)`` writes every block
    and returns ``{name: {"i.j": sha256}}``; the manifest of those digests is then added to the
    attributes, last, and the group renamed into place. A store whose ``write`` fails is removed.
    """
    with staged(path) as (target, tmp):
        group = zarr.open_group(str(tmp), mode="w-")
        for name, spec in layout.items():
            group.create_array(
                name,
                shape=tuple(spec.shape),
                dtype=np.dtype(spec.dtype),
                chunks=tuple(block_chunks(axis) for axis in spec.bounds) or None,
                compressors=[ZstdCodec(level=1), Crc32cCodec()],
                config={"write_empty_chunks": True},
            )
        digests = write(tmp)
        manifest = {}
        for name, spec in layout.items():
            blocks = {index: digests[name][index] for index, _ in block_regions(spec.bounds)}
            manifest[name] = {
                "shape": list(spec.shape),
                "dtype": np.dtype(spec.dtype).str,
                "bounds": [[list(b) for b in axis] for axis in spec.bounds],
                "blocks": blocks,
            }
        commit_manifest(group, attrs, manifest, tmp, target)
    return target


def _read(path: Path, name: str, z, selection) -> np.ndarray:
    try:
        return np.asarray(z[selection])
    except Exception as exc:  # a torn chunk or a failed CRC32C
        raise named_error(DamagedStoreError, "path", f"{str(path)!r}: array {name!r} cannot be read ({exc})") from exc


def is_block_store(path) -> bool:
    """Whether a checkpoint was written block by block (its arrays too big, maybe, for one process)."""
    _group, _attrs, meta = open_group(Path(path), kind="checkpoint")
    return any("blocks" in entry for entry in meta.get("manifest", {}).values())


def read_region(path, name: str, region) -> np.ndarray:
    """Rows and columns ``region`` (a ``(start, stop)`` per axis) of array ``name``, verified.

    Reads, on the worker that calls it, only the written blocks the region overlaps (the whole
    array of a store written in one piece) and checks each against the manifest, so a block
    store written on one grid is re-cut for any other.
    """
    path = Path(path)
    group = zarr.open_group(str(path), mode="r")
    expected = group.attrs["daskann"]["manifest"].get(name)
    if expected is None:
        raise named_error(DamagedStoreError, "path", f"{str(path)!r}: array {name!r} is missing from the manifest")
    z = group[name]
    want = tuple(slice(a, b) for a, b in region)
    if "blocks" not in expected:
        whole = _read(path, name, z, ...)
        verify_array(path, name, whole, expected)
        return np.ascontiguousarray(whole[want])
    out = np.empty(tuple(b - a for a, b in region), dtype=np.dtype(expected["dtype"]))
    for index, block in block_regions(expected["bounds"]):
        overlap = [(max(a, c), min(b, d)) for (a, b), (c, d) in zip(block, region, strict=True)]
        if any(lo >= hi for lo, hi in overlap):
            continue
        values = _verified_block(path, name, z, index, block, expected)
        src = tuple(slice(lo - a, hi - a) for (lo, hi), (a, _) in zip(overlap, block, strict=True))
        dst = tuple(slice(lo - c, hi - c) for (lo, hi), (c, _) in zip(overlap, region, strict=True))
        out[dst] = values[src]
    return out


def stored_blocks(path) -> list[tuple[str, str]]:
    """``(array, "i.j")`` of every block a block store's manifest lists (read on the client: metadata only)."""
    _group, _attrs, meta = open_group(Path(path), kind="checkpoint")
    return [(name, index) for name, entry in meta["manifest"].items() for index in entry.get("blocks", {})]


def verify_block(path, name: str, index: str) -> None:
    """Read block ``index`` of array ``name`` of a block store and check it against the manifest.

    Runs on a worker; raises :class:`DamagedStoreError` naming the store, the array and the block.
    """
    path = Path(path)
    group = zarr.open_group(str(path), mode="r")
    expected = group.attrs["daskann"]["manifest"][name]
    block = dict(block_regions(expected["bounds"]))[index]
    _verified_block(path, name, group[name], index, block, expected)


def _verified_block(path: Path, name: str, z, index: str, block, expected: dict) -> np.ndarray:
    """Block ``index`` (rows and columns ``block``) of array ``z``, checked against its manifest entry."""
    try:
        values = np.asarray(z[tuple(slice(a, b) for a, b in block)])
    except Exception as exc:  # a torn chunk or a failed CRC32C
        raise named_error(
            DamagedStoreError, "path", f"{str(path)!r}: block {index} of array {name!r} cannot be read ({exc})"
        ) from exc
    if array_digest(values) != expected["blocks"].get(index):
        raise named_error(
            DamagedStoreError, "path", f"{str(path)!r}: block {index} of array {name!r} does not match its checksum"
        )
    return values
