"""Checkpoints and histories on disk, in zarr.

Every store is written under a temporary name beside its target, flushed, and
renamed into place, so a reader sees either the old store or the complete new
one. Each array's SHA-256 is kept in a manifest in the group's attributes and
verified on load; chunks also carry a CRC32C so a flipped byte fails loudly.
Nothing is pickled: arrays are zarr, everything else is JSON.
"""

from __future__ import annotations

import contextvars
import errno
import hashlib
import itertools
import json
import math
import os
import re
import shutil
import socket
import time
import uuid
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import xarray as xr
import zarr
from zarr.codecs import Crc32cCodec, ZstdCodec

from daskann import config as settings
from daskann.exceptions import DamagedStoreError, DiskFullError, StoreError
from daskann.nn import MLP

FORMAT_VERSION = 1
RUN_MARKER = "daskann-run.json"
CHECKPOINT_DIR = "checkpoints"
_CHECKPOINT_NAME = re.compile(r"^step-(\d{8,})\.zarr$")


#: errors of a write that ran out of room (no space, quota, file-size limit)
_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})


def _reraise_if_full(exc: BaseException, target: Path) -> None:
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


def _commit_manifest(group, attrs: dict, manifest: dict, tmp, target) -> None:
    """Write the manifest into the group's attributes last, then move the store into place."""
    meta = dict(attrs.get("daskann", {}))
    meta["manifest"] = manifest
    group.attrs.update({**attrs, "daskann": meta})
    atomic_replace_dir(tmp, target)


def temporary_sibling(target: Path) -> Path:
    """Hidden temporary path next to ``target`` (same file system, so rename is atomic)."""
    return target.with_name(f".{target.name}.tmp-{uuid.uuid4().hex[:8]}")


def write_array_group(path, arrays: dict[str, np.ndarray], attrs: dict) -> Path:
    """Write named arrays and JSON attributes as one zarr group, atomically.

    The manifest of array digests is added to ``attrs["daskann"]["manifest"]``.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = temporary_sibling(target)
    try:
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
        _commit_manifest(group, attrs, manifest, tmp, target)
    except BaseException as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        _reraise_if_full(exc, target)
        raise
    return target


def read_array_group(path, *, kind: str) -> tuple[dict[str, np.ndarray], dict]:
    """Read and verify a group written by :func:`write_array_group` (or :func:`write_block_group`)."""
    path = Path(path)
    group, attrs, meta = _open_group(path, kind=kind)
    arrays = {}
    for name, expected in meta.get("manifest", {}).items():
        try:
            array = group[name][...]
        except Exception as exc:
            raise DamagedStoreError(f"path={str(path)!r}: array {name!r} cannot be read ({exc})") from exc
        _verify_array(path, name, np.asarray(array), expected)
        arrays[name] = np.asarray(array)
    return arrays, attrs


def _open_group(path: Path, *, kind: str):
    """The zarr group of a daskann store of ``kind``, its attributes and daskann metadata (no array read)."""
    if not path.exists():
        raise FileNotFoundError(f"path={str(path)!r}: no such store")
    try:
        group = zarr.open_group(str(path), mode="r")
        attrs = dict(group.attrs)
    except Exception as exc:
        raise DamagedStoreError(f"path={str(path)!r} is not a readable zarr store: {exc}") from exc
    meta = attrs.get("daskann")
    if not isinstance(meta, dict) or meta.get("kind") != kind:
        found = meta.get("kind") if isinstance(meta, dict) else None
        raise StoreError(f"path={str(path)!r} is not a daskann {kind} (found kind={found!r})")
    if meta.get("format_version") != FORMAT_VERSION:
        raise StoreError(
            f"path={str(path)!r} has format_version={meta.get('format_version')!r}; "
            f"this daskann reads version {FORMAT_VERSION}"
        )
    return group, attrs, meta


def _verify_array(path: Path, name: str, array: np.ndarray, expected: dict) -> None:
    """Check a whole array against its manifest entry: one digest, or one per written block."""
    if "blocks" not in expected:
        if array_digest(array) != expected["sha256"]:
            raise DamagedStoreError(f"path={str(path)!r}: array {name!r} does not match its checksum")
        return
    for index, region in _block_regions(expected["bounds"]):
        if array_digest(array[tuple(slice(a, b) for a, b in region)]) != expected["blocks"].get(index):
            raise DamagedStoreError(f"path={str(path)!r}: block {index} of array {name!r} does not match its checksum")


# -- stores written block by block, on the workers that hold the blocks ---------------------------
@dataclass(frozen=True)
class BlockArray:
    """An array of a block store: its shape, dtype and the ``(start, stop)`` bounds of its blocks on each axis."""

    shape: tuple
    dtype: str
    bounds: tuple  # per axis, a tuple of (start, stop)


def _block_regions(bounds) -> list[tuple[str, tuple]]:
    """``("i.j", ((r0, r1), (c0, c1)))`` for every block of ``bounds`` (one axis or two)."""
    out = []
    for index in itertools.product(*(range(len(axis)) for axis in bounds)):
        region = tuple(tuple(bounds[a][k]) for a, k in enumerate(index))
        out.append((".".join(str(k) for k in index), region))
    return out


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
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = temporary_sibling(target)
    try:
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
            blocks = {index: digests[name][index] for index, _ in _block_regions(spec.bounds)}
            manifest[name] = {
                "shape": list(spec.shape),
                "dtype": np.dtype(spec.dtype).str,
                "bounds": [[list(b) for b in axis] for axis in spec.bounds],
                "blocks": blocks,
            }
        _commit_manifest(group, attrs, manifest, tmp, target)
    except BaseException as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        _reraise_if_full(exc, target)
        raise
    return target


def _read(path: Path, name: str, z, selection) -> np.ndarray:
    try:
        return np.asarray(z[selection])
    except Exception as exc:  # a torn chunk or a failed CRC32C
        raise DamagedStoreError(f"path={str(path)!r}: array {name!r} cannot be read ({exc})") from exc


def is_block_store(path) -> bool:
    """Whether a checkpoint was written block by block (its arrays too big, maybe, for one process)."""
    _group, _attrs, meta = _open_group(Path(path), kind="checkpoint")
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
        raise DamagedStoreError(f"path={str(path)!r}: array {name!r} is missing from the manifest")
    z = group[name]
    want = tuple(slice(a, b) for a, b in region)
    if "blocks" not in expected:
        whole = _read(path, name, z, ...)
        _verify_array(path, name, whole, expected)
        return np.ascontiguousarray(whole[want])
    out = np.empty(tuple(b - a for a, b in region), dtype=np.dtype(expected["dtype"]))
    for index, block in _block_regions(expected["bounds"]):
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
    _group, _attrs, meta = _open_group(Path(path), kind="checkpoint")
    return [(name, index) for name, entry in meta["manifest"].items() for index in entry.get("blocks", {})]


def verify_block(path, name: str, index: str) -> None:
    """Read block ``index`` of array ``name`` of a block store and check it against the manifest.

    Runs on a worker; raises :class:`DamagedStoreError` naming the store, the array and the block.
    """
    path = Path(path)
    group = zarr.open_group(str(path), mode="r")
    expected = group.attrs["daskann"]["manifest"][name]
    block = dict(_block_regions(expected["bounds"]))[index]
    _verified_block(path, name, group[name], index, block, expected)


def _verified_block(path: Path, name: str, z, index: str, block, expected: dict) -> np.ndarray:
    """Block ``index`` (rows and columns ``block``) of array ``z``, checked against its manifest entry."""
    try:
        values = np.asarray(z[tuple(slice(a, b) for a, b in block)])
    except Exception as exc:  # a torn chunk or a failed CRC32C
        raise DamagedStoreError(f"path={str(path)!r}: block {index} of array {name!r} cannot be read ({exc})") from exc
    if array_digest(values) != expected["blocks"].get(index):
        raise DamagedStoreError(f"path={str(path)!r}: block {index} of array {name!r} does not match its checksum")
    return values


@dataclass
class Checkpoint:
    """Everything needed to continue a training run bit for bit.

    Attributes
    ----------
    model : MLP
    velocity : list of ndarray
        SGD velocity per parameter, in ``MLP.params`` order.
    step : int
        Number of training steps completed.
    batch_order : dict
        State of :class:`daskann.data.BatchOrder`.
    training : dict
        Loss, learning rate, momentum and method settings.
    extra : dict
        Method-specific JSON state.
    """

    model: MLP
    velocity: list
    step: int
    batch_order: dict
    training: dict
    extra: dict = field(default_factory=dict)


def save_checkpoint(path, checkpoint: Checkpoint) -> Path:
    """Write ``checkpoint`` to the zarr store ``path`` atomically."""
    model = checkpoint.model
    arrays = {}
    # a network without biases stores none (its model config says bias: false)
    for i, w in enumerate(model.weights):
        arrays[f"weights/{i}"] = w
    for i, b in enumerate(model.biases):
        arrays[f"biases/{i}"] = b
    for i, v in enumerate(checkpoint.velocity):
        arrays[f"velocity/{i}"] = v
    attrs = checkpoint_attrs(
        model.get_config(), checkpoint.step, checkpoint.batch_order, checkpoint.training, checkpoint.extra
    )
    return write_array_group(path, arrays, attrs)


def checkpoint_attrs(model_config: dict, step: int, batch_order: dict, training: dict, extra: dict) -> dict:
    """The JSON attributes of a checkpoint store (the manifest is added by the writer)."""
    return {
        "daskann": {
            "kind": "checkpoint",
            "format_version": FORMAT_VERSION,
            "step": int(step),
            "model": model_config,
            "batch_order": batch_order,
            "training": training,
            "extra": extra,
        }
    }


def checkpoint_arrays(model_config: dict) -> list[str]:
    """Names of the arrays a checkpoint of a network with ``model_config`` holds."""
    n_layers = len(model_config["sizes"]) - 1
    bias = model_config.get("bias", True)
    names = [f"weights/{i}" for i in range(n_layers)] + [f"biases/{i}" for i in range(n_layers if bias else 0)]
    return names + [f"velocity/{i}" for i in range((2 if bias else 1) * n_layers)]


@dataclass
class CheckpointInfo:
    """A checkpoint's metadata, its arrays left on disk (read, and verified, where they are needed).

    Attributes
    ----------
    path : Path
        The checkpoint store (the newest of a run folder).
    model : dict
        The network's configuration (``MLP.get_config``).
    step, batch_order, training, extra
        As :class:`Checkpoint`.
    """

    path: Path
    model: dict
    step: int
    batch_order: dict
    training: dict
    extra: dict = field(default_factory=dict)


def _check_complete(path: Path) -> dict:
    """A checkpoint's metadata, after checking that its manifest lists every array and its files exist."""
    group, _attrs, meta = _open_group(path, kind="checkpoint")
    config, manifest = meta["model"], meta.get("manifest", {})
    missing = [name for name in checkpoint_arrays(config) if name not in manifest]
    if missing:
        raise DamagedStoreError(f"path={str(path)!r}: checkpoint arrays are incomplete (missing {missing})")
    for name, expected in manifest.items():
        try:
            shape = tuple(group[name].shape)
        except Exception as exc:
            raise DamagedStoreError(f"path={str(path)!r}: array {name!r} cannot be read ({exc})") from exc
        if shape != tuple(expected["shape"]):
            raise DamagedStoreError(f"path={str(path)!r}: array {name!r} has shape {shape}, not {expected['shape']}")
    return meta


def checkpoint_info(path) -> CheckpointInfo:
    """Metadata of a checkpoint or of a run folder's newest one, checked for a complete manifest.

    No array is read: trainers that hold their state on workers read each block there
    (:func:`read_region`, which verifies it).
    """
    path = Path(path)
    if (path / RUN_MARKER).exists() or (path / CHECKPOINT_DIR).is_dir():
        # the checksums are checked where each block is read; here, that every block was written
        path = find_checkpoint(path, check=_check_complete)
    meta = _check_complete(path)
    return CheckpointInfo(
        path=path,
        model=meta["model"],
        step=int(meta["step"]),
        batch_order=meta["batch_order"],
        training=meta["training"],
        extra=meta.get("extra", {}),
    )


def load_checkpoint(path) -> Checkpoint:
    """Read and verify a checkpoint; see :func:`find_checkpoint` for run folders."""
    path = Path(path)
    if (path / RUN_MARKER).exists() or (path / CHECKPOINT_DIR).is_dir():
        path = find_checkpoint(path)
    arrays, attrs = read_array_group(path, kind="checkpoint")
    meta = attrs["daskann"]
    config = meta["model"]
    n_layers = len(config["sizes"]) - 1
    bias = config.get("bias", True)
    try:
        weights = [arrays[f"weights/{i}"] for i in range(n_layers)]
        biases = [arrays[f"biases/{i}"] for i in range(n_layers if bias else 0)]
        velocity = [arrays[f"velocity/{i}"] for i in range((2 if bias else 1) * n_layers)]
        model = MLP.from_arrays(
            weights,
            biases,
            activation=config["activation"],
            output=config["output"],
            negative_slope=config["negative_slope"],
            bias=bias,
        )
    except (KeyError, ValueError) as exc:
        raise DamagedStoreError(f"path={str(path)!r}: checkpoint arrays are incomplete ({exc})") from exc
    if list(model.sizes) != list(config["sizes"]) or model.dtype.name != config["dtype"]:
        raise DamagedStoreError(f"path={str(path)!r}: arrays do not match the recorded model {config}")
    return Checkpoint(
        model=model,
        velocity=velocity,
        step=int(meta["step"]),
        batch_order=meta["batch_order"],
        training=meta["training"],
        extra=meta.get("extra", {}),
    )


def checkpoint_path(run_dir, step: int) -> Path:
    return Path(run_dir) / CHECKPOINT_DIR / f"step-{int(step):08d}.zarr"


def list_checkpoints(run_dir) -> list[Path]:
    """Checkpoints of a run folder, newest first."""
    folder = Path(run_dir) / CHECKPOINT_DIR
    if not folder.is_dir():
        return []
    found = [p for p in folder.iterdir() if _CHECKPOINT_NAME.match(p.name)]
    return sorted(found, key=lambda p: int(_CHECKPOINT_NAME.match(p.name).group(1)), reverse=True)


def find_checkpoint(run_dir, check: Callable[[Path], object] | None = None) -> Path:
    """Newest checkpoint of ``run_dir`` that verifies; damaged ones are skipped with a warning.

    ``check(path)`` raises :class:`StoreError` for a damaged store (default: read and verify every array).
    """
    candidates = list_checkpoints(run_dir)
    if not candidates:
        raise FileNotFoundError(f"path={str(run_dir)!r}: run folder holds no checkpoint")
    for path in candidates:
        try:
            if check is None:
                read_array_group(path, kind="checkpoint")
            else:
                check(path)
        except StoreError as exc:
            warnings.warn(f"skipping damaged checkpoint: {exc}", RuntimeWarning, stacklevel=2)
            continue
        return path
    raise DamagedStoreError(f"path={str(run_dir)!r}: every checkpoint is damaged")


def prepare_run_dir(path, *, method: str, config: dict, overwrite: bool = False, resume: bool = False) -> Path:
    """Create or reuse a run output folder.

    A folder that exists and holds anything but a daskann run is refused unless
    ``overwrite``; an existing run is refused unless ``resume`` or ``overwrite``.
    """
    path = Path(path)
    marker = path / RUN_MARKER
    if path.exists() and not path.is_dir():
        raise ValueError(f"output={str(path)!r} is not valid: expected a folder, found a file")
    if path.exists() and any(path.iterdir()):
        if overwrite:
            if not marker.exists() and any(path.iterdir()):
                # refuse to wipe a folder we did not create, even when asked to overwrite
                for child in path.iterdir():
                    if child.name not in (RUN_MARKER, CHECKPOINT_DIR, "history.zarr", "model.zarr"):
                        raise ValueError(
                            f"output={str(path)!r} is not valid: it holds {child.name!r}, which is not part "
                            "of a daskann run; choose an empty or new folder"
                        )
            for child in (CHECKPOINT_DIR, "history.zarr", "model.zarr"):
                shutil.rmtree(path / child, ignore_errors=True)
        elif not marker.exists():
            raise ValueError(
                f"output={str(path)!r} is not valid: the folder exists and is not a daskann run; "
                "choose an empty or new folder"
            )
        elif not resume:
            raise ValueError(
                f"output={str(path)!r} is not valid: it already holds a daskann run; "
                "pass resume to continue it or overwrite to start again"
            )
    path.mkdir(parents=True, exist_ok=True)
    os.chmod(path, 0o750)
    tmp = temporary_sibling(marker)
    tmp.write_text(
        json.dumps(
            {"format": "daskann-run", "format_version": FORMAT_VERSION, "method": method, "config": config}, indent=2
        )
    )
    os.replace(tmp, marker)
    return path


def save_history(history: xr.Dataset, path) -> Path:
    """Write a history Dataset to a zarr store atomically, with a checksum manifest."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = temporary_sibling(target)
    ds = _encode_strings(history.copy())
    manifest = {name: array_digest(np.asarray(ds[name].values)) for name in ds.variables}
    ds.attrs = {**history.attrs, "daskann": {"kind": "history", "format_version": FORMAT_VERSION, "manifest": manifest}}
    try:
        ds.to_zarr(str(tmp), mode="w-", consolidated=False, zarr_format=3)
        atomic_replace_dir(tmp, target)
    except BaseException as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        _reraise_if_full(exc, target)
        raise
    return target


def load_history(path) -> xr.Dataset:
    """Read and verify a history written by :func:`save_history`."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"path={str(path)!r}: no such history store")
    try:
        ds = xr.open_zarr(str(path), consolidated=False).load()
    except Exception as exc:
        raise DamagedStoreError(f"path={str(path)!r} is not a readable history store: {exc}") from exc
    meta = ds.attrs.get("daskann", {})
    if meta.get("kind") != "history":
        raise StoreError(f"path={str(path)!r} is not a daskann history")
    for name, digest in meta.get("manifest", {}).items():
        if name not in ds.variables or array_digest(np.asarray(ds[name].values)) != digest:
            raise DamagedStoreError(f"path={str(path)!r}: variable {name!r} is missing or fails its checksum")
    ds.attrs = {k: v for k, v in ds.attrs.items() if k != "daskann"}
    return _decode_strings(ds)


def _encode_strings(ds: xr.Dataset) -> xr.Dataset:
    """Text variables (such as a training phase) as integer codes, CF ``flag_values`` style.

    zarr 3 has no stable text type yet; codes keep history stores portable.
    """
    for name in list(ds.data_vars):
        values = ds[name].values
        if values.dtype.kind in "UO":
            meanings = sorted({str(v) for v in values.ravel()})
            codes = np.array([meanings.index(str(v)) for v in values.ravel()], dtype=np.int16).reshape(values.shape)
            attrs = {**ds[name].attrs, "flag_values": list(range(len(meanings))), "flag_meanings": meanings}
            ds[name] = (ds[name].dims, codes, attrs)
    return ds


def _decode_strings(ds: xr.Dataset) -> xr.Dataset:
    for name in list(ds.data_vars):
        attrs = dict(ds[name].attrs)
        if "flag_meanings" in attrs:
            meanings = list(attrs.pop("flag_meanings"))
            attrs.pop("flag_values", None)
            ds[name] = (ds[name].dims, np.array(meanings)[ds[name].values.astype(int)], attrs)
    return ds


#: store kind -> ``verify(path)``, which raises StoreError, OSError or ValueError for a damaged store
VERIFIERS: dict[str, Callable[[Path], object]] = {}


def register_verifier(kind: str, verify: Callable[[Path], object]) -> None:
    """Let :func:`verify_path` check stores whose recorded kind is ``kind`` with ``verify(path)``.

    ``verify`` raises :class:`StoreError` (or ``OSError``/``ValueError``) when
    the store is damaged. A module that defines a store kind registers it when
    imported (``daskann.mgrit._store`` registers MGRIT trajectories), so this
    module depends on none of them.
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
    (:func:`register_verifier`); importing ``daskann`` registers every kind
    the package writes.

    Returns ``{"ok": bool, "items": [{"path", "kind", "status", "detail"}]}``
    where status is ``"ok"``, ``"damaged"`` or ``"orphan"``.
    """
    path = Path(path)
    kind = _store_kind(path)
    items = [_check_store(path, kind)] if kind is not None else _scan_folder(path)
    if not items:
        items.append(_item(path, None, "damaged", "no daskann store found"))
    return {"ok": all(item["status"] == "ok" for item in items), "items": items}


LOCK_NAME = ".daskann-lock"
# run folders whose lock this context holds (contextvars: not inherited by other threads)
_HELD_LOCKS: contextvars.ContextVar[frozenset] = contextvars.ContextVar("daskann_held_locks", default=frozenset())


class RunLock:
    """Exclusive claim on a run folder while a training writes to it.

    The lock file is created with ``O_EXCL`` and holds the owner's host and
    pid; a lock left by a process of this host that no longer exists is stale
    and taken over. Re-entrant within one context: a training that holds the
    lock may run an inner training on the same folder (partition's fine-tune),
    while another thread or process is refused.
    """

    def __init__(self, folder):
        self.path = Path(folder) / LOCK_NAME
        self._held = False

    def _key(self) -> str:
        return str(self.path.resolve())

    def acquire(self) -> RunLock:
        held = _HELD_LOCKS.get()
        if self._key() in held:
            return self  # the enclosing training of this context holds it
        self.path.parent.mkdir(parents=True, exist_ok=True)
        owner = {"host": socket.gethostname(), "pid": os.getpid(), "since": time.time()}
        for _ in range(2):
            if self._create(owner):
                self._held = True
                _HELD_LOCKS.set(held | {self._key()})
                return self
            holder = self._holder()
            if holder is not None and not self._is_stale(holder):
                raise StoreError(
                    f"output={str(self.path.parent)!r} is being written by another run "
                    f"(pid {holder.get('pid')} on {holder.get('host')}); wait for it or choose another folder"
                )
            self.path.unlink(missing_ok=True)
        raise StoreError(f"output={str(self.path.parent)!r}: could not take the run lock")

    def _create(self, owner: dict) -> bool:
        """Create the lock file with its content in one step; False if it exists."""
        # written aside and hard-linked into place: the lock never exists without its owner
        tmp = temporary_sibling(self.path)
        tmp.write_text(json.dumps(owner))
        try:
            os.link(tmp, self.path)
            return True
        except FileExistsError:
            return False
        except OSError:
            pass  # a file system without hard links: exclusive create, then write
        finally:
            tmp.unlink(missing_ok=True)
        try:
            fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o640)
        except FileExistsError:
            return False
        with os.fdopen(fd, "w") as f:
            json.dump(owner, f)
        return True

    def check_free(self, name: str = "output") -> None:
        """Refuse, without taking it, a lock that a live run holds (a check before any work starts)."""
        if self._key() in _HELD_LOCKS.get():
            return
        holder = self._holder() if self.path.exists() else None
        if holder is not None and not self._held and not self._is_stale(holder):
            raise StoreError(
                f"{name}={str(self.path.parent)!r} is being written by another run "
                f"(pid {holder.get('pid')} on {holder.get('host')}); wait for it or choose another folder"
            )

    def _holder(self) -> dict | None:
        """The lock's owner; a placeholder for a lock being written; None when it is gone or unreadable."""
        try:
            return json.loads(self.path.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError):
            try:
                young = time.time() - self.path.stat().st_mtime < settings.seconds("store.lock-write-grace")
            except OSError:
                return None
            # a lock created but not yet written (file systems without hard links) is held;
            # an unreadable old one is stale
            return {"host": "?", "pid": "?"} if young else None

    @staticmethod
    def _is_stale(holder: dict) -> bool:
        if holder.get("host") != socket.gethostname():
            return False
        if holder.get("pid") == os.getpid():
            return False
        try:
            os.kill(int(holder["pid"]), 0)
        except ProcessLookupError:
            return True
        except (PermissionError, KeyError, ValueError, TypeError):
            return False
        return False

    def release(self) -> None:
        if self._held:
            self.path.unlink(missing_ok=True)
            self._held = False
            _HELD_LOCKS.set(_HELD_LOCKS.get() - {self._key()})

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def check_writable_folder(folder, name: str = "checkpoint_dir") -> Path:
    """Refuse a folder that cannot be created or written, before any work starts."""
    folder = Path(folder)
    probe_parent = folder
    while not probe_parent.exists():
        probe_parent = probe_parent.parent
    if not probe_parent.is_dir():
        raise ValueError(f"{name}={str(folder)!r} is not valid: {str(probe_parent)!r} is a file, expected a folder")
    if not os.access(probe_parent, os.W_OK | os.X_OK):
        raise ValueError(f"{name}={str(folder)!r} is not valid: {str(probe_parent)!r} is not writable")
    return folder


def check_free_space(folder, needed: int, name: str = "checkpoint_dir") -> None:
    """Refuse, before any work starts, a folder whose file system cannot hold ``needed`` bytes."""
    probe = Path(folder)
    while not probe.exists():
        probe = probe.parent
    free = shutil.disk_usage(probe).free
    if free < needed:
        raise DiskFullError(
            errno.ENOSPC,
            f"{name}={str(folder)!r} has {_human(free)} free; this run's stores need about {_human(needed)} "
            "(free space, choose another folder or checkpoint less often)",
        )


def _human(n_bytes: int) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if n_bytes < 1024 or unit == "GiB":
            return f"{n_bytes:.0f} {unit}" if unit == "bytes" else f"{n_bytes:.1f} {unit}"
        n_bytes /= 1024
