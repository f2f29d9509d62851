"""Where the trajectory lives: numpy arrays in-process, or a zarr store the tasks share.

A zarr trajectory store is a directory holding one zarr group (arrays listed
in :mod:`daskann.mgrit._kernels`), chunked so that every task writes whole
chunks that no other task of its sweep touches, with a CRC32C checksum on
every chunk. The group's attributes name the run (``run_id``) and the
configuration; only the final sweep of each iteration writes to it (the
C-points a resumed run starts from; :mod:`daskann.mgrit._kernels`);
``progress.json`` (replaced atomically after each completed
iteration) says which slot holds the last committed C-values, so an
interrupted run continues from its last completed iteration, and a store
belonging to another run is refused.
"""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import zarr
from zarr.codecs import Crc32cCodec

from daskann._json import clean_json, read_json, write_json
from daskann._validation import named_error
from daskann.mgrit._kernels import PERSISTED, SLOTS
from daskann.store import DamagedStoreError, StoreError, check_free_space, register_verifier

KIND = "mgrit-trajectory"
FORMAT_VERSION = 2  # 2: five C-value slots, intermediate levels kept in memory
PROGRESS = "progress.json"


def array_specs(hierarchy, size: int, blocks, *, store_fine: bool) -> dict[str, tuple[tuple, tuple]]:
    """Name -> (shape, chunks) of every array of a run; ``blocks[l]`` intervals per task on level ``l``."""
    L = hierarchy.n_levels
    specs = {"init": ((size,), (size,)), "last": ((size,), (size,))}
    for level in range(L - 1):
        k = hierarchy.n_cpoints(level)
        specs[f"c{level}"] = ((SLOTS, k, size), (1, blocks[level], size))
    for level in range(1, L):
        n = hierarchy.n_points(level)
        specs[f"v{level}"] = ((2, n, size), (1, blocks[level - 1], size))
        specs[f"g{level}"] = ((2, n, size), (1, blocks[level - 1], size))
    for level in range(L):
        n = hierarchy.n_points(level)
        if level == 0 and L > 1 and not store_fine:
            continue
        rows = n if level == L - 1 else hierarchy.cfactors[level] * blocks[level]
        specs[f"u{level}"] = ((n, size), (rows, size))
    return specs


class MemoryTrajectory:
    """The trajectory as numpy arrays in this process (the fast in-process backend)."""

    path = None
    in_place = True  # tasks compute into the arrays themselves (they run one after another)

    def __init__(self, specs: dict, dtype):
        self.arrays = {name: np.zeros(shape, dtype=dtype) for name, (shape, _chunks) in specs.items()}

    def read(self, name: str, index) -> np.ndarray:
        """A read-only view of the rows (a task never writes what it reads)."""
        value = self.arrays[name][index]
        if isinstance(value, np.ndarray):
            value = value.view()
            value.flags.writeable = False
        return value

    def buffer(self, name: str, index, shape) -> np.ndarray:
        """The rows themselves, to compute into (:meth:`write` of them is then free)."""
        view = self.arrays[name][index]
        if view.shape != tuple(shape) or view.base is not self.arrays[name]:
            raise ValueError(f"rows {index} of {name!r} are not a view of shape {tuple(shape)}")
        return view

    def write(self, name: str, index, value) -> None:
        array = self.arrays[name]
        if getattr(value, "base", None) is array and value.__array_interface__ == array[index].__array_interface__:
            return  # the rows were computed in place (:meth:`buffer`)
        array[index] = value


_OPEN: dict = {}
_OPEN_LOCK = threading.Lock()


class ZarrTrajectory:
    """Handle to a zarr trajectory store; picklable, arrays opened once per process."""

    def __init__(self, path, run_id: str):
        self.path = str(path)
        self.run_id = run_id

    def __repr__(self) -> str:
        return f"ZarrTrajectory({self.path!r}, run_id={self.run_id!r})"

    def _array(self, name: str):
        key = (self.path, self.run_id, name)
        array = _OPEN.get(key)
        if array is None:
            with _OPEN_LOCK:
                group = zarr.open_group(self.path, mode="r+")
                array = group[name]
                _OPEN[key] = array
        return array

    def read(self, name: str, index) -> np.ndarray:
        return np.asarray(self._array(name)[index])

    def write(self, name: str, index, value) -> None:
        self._array(name)[index] = value

    def buffer(self, name: str, index, shape) -> np.ndarray:
        """A private buffer for rows a task writes later with :meth:`write` (whole chunks, once)."""
        return np.empty(shape, dtype=self._array(name).dtype)

    # -- client side -------------------------------------------------------------
    def read_progress(self) -> dict:
        return read_progress(self.path)

    def write_progress(self, progress: dict) -> None:
        write_json(clean_json(progress, finite=False), Path(self.path) / PROGRESS)

    def forget(self) -> None:
        """Drop this process's cached array handles (after the run)."""
        with _OPEN_LOCK:
            for key in [k for k in _OPEN if k[0] == self.path]:
                del _OPEN[key]


def read_meta(path) -> dict | None:
    """The store's run description, or None when ``path`` does not exist or is empty."""
    path = Path(path)
    if not path.exists():
        return None
    if not path.is_dir():
        raise named_error(StoreError, "store", f"{str(path)!r} is not valid: expected a folder, found a file")
    if not any(path.iterdir()):
        return None
    try:
        attrs = dict(zarr.open_group(str(path), mode="r").attrs)
    except Exception as exc:
        raise named_error(
            StoreError, "store", f"{str(path)!r} is not valid: the folder is not an MGRIT trajectory store ({exc})"
        ) from exc
    meta = attrs.get("daskann")
    if not isinstance(meta, dict) or meta.get("kind") != KIND:
        raise named_error(
            StoreError, "store", f"{str(path)!r} is not valid: the folder is not an MGRIT trajectory store"
        )
    if meta.get("format_version") != FORMAT_VERSION:
        raise named_error(
            StoreError,
            "store",
            f"{str(path)!r} has format_version={meta.get('format_version')!r}; "
            f"this daskann reads version {FORMAT_VERSION}",
        )
    return meta


def read_progress(path) -> dict:
    return read_json(path, PROGRESS, name="store", missing={"iteration": 0, "status": "new"})


def check_same_run(path, meta: dict, run_id: str, config: dict) -> None:
    """Refuse a store of another run, or of this run with another configuration."""
    if meta.get("run_id") != run_id:
        raise named_error(
            StoreError,
            "store",
            f"{str(path)!r} is not valid: it belongs to run {meta.get('run_id')!r}, not to run {run_id!r}; "
            "choose another path, or pass that run's run_id (and configuration) to continue it",
        )
    found = meta.get("config", {})
    diffs = [
        f"{k}: {found.get(k)!r} != {config.get(k)!r}"
        for k in sorted(set(found) | set(config))
        if found.get(k) != config.get(k)
    ]
    if diffs:
        raise named_error(
            StoreError,
            "store",
            f"{str(path)!r} is not valid: run {run_id!r} was started with another "
            "configuration (" + "; ".join(diffs) + ")",
        )


def create_store(path, *, run_id: str, config: dict, specs: dict, dtype) -> ZarrTrajectory:
    """Create an empty trajectory store (the caller writes u0 and the initial guess)."""
    path = Path(path)
    # every chunk of the arrays the final sweeps write may be written: refuse a file system that cannot
    # hold them, before any task (the other arrays stay empty: their rows pass from task to task in memory)
    needed = sum(int(np.prod(shape)) for name, (shape, _) in specs.items() if name in PERSISTED)
    needed *= np.dtype(dtype).itemsize
    check_free_space(path, needed, name="store")
    path.mkdir(parents=True, exist_ok=True)
    group = zarr.open_group(str(path), mode="w", zarr_format=3)
    for name, (shape, chunks) in specs.items():
        group.create_array(name, shape=shape, chunks=chunks, dtype=dtype, compressors=[Crc32cCodec()], fill_value=0.0)
    # the manifest: every array the run needs, so a scan can tell a missing one from an empty one
    manifest = {name: {"shape": list(shape), "chunks": list(chunks)} for name, (shape, chunks) in specs.items()}
    group.attrs.update(
        {
            "daskann": {
                "kind": KIND,
                "format_version": FORMAT_VERSION,
                "run_id": run_id,
                "config": config,
                "dtype": np.dtype(dtype).str,
                "arrays": manifest,
            }
        }
    )
    handle = ZarrTrajectory(path, run_id)
    handle.write_progress({"iteration": 0, "status": "new"})
    return handle


def verify_store(path) -> dict:
    """Check a trajectory store against its manifest; raise :class:`~daskann.store.StoreError` if damaged.

    Every array the manifest lists must exist with its shape and dtype and
    read back through its CRC32C checksums; the chunks that must have been
    written (the initial state, the last committed state and, once an
    iteration is committed, the C-values of the committed slot) must be on
    disk, since a missing chunk would otherwise read back as zeros.
    Returns the progress record.
    """
    path = Path(path)
    meta = read_meta(path)
    if meta is None:
        raise named_error(DamagedStoreError, "store", f"{str(path)!r} is empty or missing")
    progress = read_progress(path)
    manifest, dtype = meta.get("arrays"), np.dtype(meta.get("dtype", "<f8"))
    if not isinstance(manifest, dict):
        raise named_error(DamagedStoreError, "store", f"{str(path)!r} has no manifest of its arrays")
    group = zarr.open_group(str(path), mode="r")
    for name, spec in manifest.items():
        try:
            array = group[name]
        except KeyError:
            raise named_error(DamagedStoreError, "store", f"{str(path)!r}: array {name!r} is missing") from None
        if list(array.shape) != spec["shape"] or array.dtype != dtype:
            raise named_error(
                DamagedStoreError,
                "store",
                f"{str(path)!r}: array {name!r} has shape {array.shape} and dtype "
                f"{array.dtype}, the manifest says {tuple(spec['shape'])} and {dtype}",
            )
        try:
            array[...]
        except Exception as exc:  # the checksum codec raises on a flipped byte
            raise named_error(
                DamagedStoreError, "store", f"{str(path)!r}: array {name!r} cannot be read ({exc})"
            ) from exc
    required = [("init", (0,)), ("last", (0,))]
    if progress.get("iteration", 0) > 0 and "c0" in manifest and progress.get("committed") is not None:
        n_blocks = -(-manifest["c0"]["shape"][1] // manifest["c0"]["chunks"][1])
        required += [("c0", (int(progress["committed"]), j, 0)) for j in range(n_blocks)]
    for name, chunk in required:
        if not (path / name / "c" / Path(*map(str, chunk))).is_file():
            raise named_error(DamagedStoreError, "store", f"{str(path)!r}: chunk {chunk} of array {name!r} is missing")
    return progress


register_verifier(KIND, verify_store)
