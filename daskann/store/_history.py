"""Training histories (xarray Datasets) in zarr, with a checksum manifest."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import xarray as xr

from daskann._validation import named_error
from daskann.exceptions import DamagedStoreError, StoreError
from daskann.store._atomic import FORMAT_VERSION, array_digest, atomic_replace_dir, staged
from daskann.store._checkpoints import HISTORY_STORE


def save_history(history: xr.Dataset, path) -> Path:
    """Write a history Dataset to a zarr store atomically, with a checksum manifest."""
    with staged(path) as (target, tmp):
        ds = _encode_strings(history.copy())
        manifest = {name: array_digest(np.asarray(ds[name].values)) for name in ds.variables}
        meta = {"kind": "history", "format_version": FORMAT_VERSION, "manifest": manifest}
        ds.attrs = {**history.attrs, "daskann": meta}
        ds.to_zarr(str(tmp), mode="w-", consolidated=False, zarr_format=3)
        atomic_replace_dir(tmp, target)
    return target


def run_history(run_dir, upto: int) -> xr.Dataset | None:
    """The history saved in a run folder, up to step ``upto`` (a resumed checkpoint's), or None if it has none."""
    path = Path(run_dir) / HISTORY_STORE
    if not path.exists():
        return None
    history = load_history(path)
    return history.sel(step=history["step"] <= upto)


def load_history(path) -> xr.Dataset:
    """Read and verify a history written by :func:`save_history`."""
    path = Path(path)
    if not path.exists():
        raise named_error(FileNotFoundError, "path", f"{str(path)!r}: no such history store")
    try:
        # read as numpy, not dask: inside a task, a dask compute would secede from the worker's thread
        ds = xr.open_zarr(str(path), consolidated=False, chunks=None).load()
    except Exception as exc:
        raise named_error(DamagedStoreError, "path", f"{str(path)!r} is not a readable history store: {exc}") from exc
    meta = ds.attrs.get("daskann", {})
    if meta.get("kind") != "history":
        raise named_error(StoreError, "path", f"{str(path)!r} is not a daskann history")
    for name, digest in meta.get("manifest", {}).items():
        if name not in ds.variables or array_digest(np.asarray(ds[name].values)) != digest:
            raise named_error(
                DamagedStoreError, "path", f"{str(path)!r}: variable {name!r} is missing or fails its checksum"
            )
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
