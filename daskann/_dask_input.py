"""Training data given as dask arrays: checked on the workers, read there, never gathered by the client.

The arrays are cast and persisted on the cluster; every check that needs the
values (finite values, integer labels and their range) runs as one small graph
of per-chunk summaries before any training task. Trainers then build what each
worker reads (a column band, a sub-model's rows, one shared copy) with tasks
that slice the persisted chunks on that worker.
"""

from __future__ import annotations

import math

import dask
import dask.array as da
import numpy as np
from distributed import Client, futures_of

from daskann._validation import (
    check_features_layout,
    check_label_range,
    check_targets_layout,
    invalid,
    non_finite,
    not_labels,
)
from daskann.cluster import current_sync_client

__all__ = [
    "check_dask_data",
    "check_dask_features_layout",
    "data_client",
    "integers_as_float",
    "is_dask_array",
    "materialize",
    "remote_call",
]


def is_dask_array(value) -> bool:
    """Whether ``value`` is a dask array (checked by its attributes, as dask collections are recognised)."""
    return hasattr(value, "dask") and hasattr(value, "chunks") and hasattr(value, "__dask_graph__")


def data_client(client):
    """The distributed client that dask-array data is read with: ``client``, the default one, or None."""
    if isinstance(client, Client):
        return client
    return current_sync_client()


# -- metadata checks (on the client, no values) ---------------------------------------
def _as_dask(value, name: str):
    if is_dask_array(value):
        if any(math.isnan(c) for dim in value.chunks for c in dim):
            raise invalid(
                name,
                f"dask array with unknown chunk sizes {value.shape}",
                "known chunk sizes (call .compute_chunk_sizes() first)",
            )
        return value
    try:
        return da.from_array(np.asarray(value))  # small numpy targets beside a dask X
    except Exception as exc:
        raise invalid(name, type(value).__name__, "an array-like of numbers", TypeError) from exc


def check_dask_features_layout(X, name: str, n_features: int | None):
    """Shape, dtype and known chunk sizes of dask-array features (no values are read)."""
    return check_features_layout(_as_dask(X, name), name, n_features)


def integers_as_float(X, dtype):
    """Integer or boolean dask-array features cast to ``dtype`` chunk by chunk, as ``validate_data`` casts numpy."""
    if is_dask_array(X) and (np.issubdtype(X.dtype, np.integer) or X.dtype == bool):
        return X.astype(dtype)
    return X


def _check_targets_meta(y, name: str, loss: str, n_samples: int, n_outputs: int | None):
    return check_targets_layout(_as_dask(y, name), name, loss, n_samples, n_outputs)


# -- per-chunk summaries (on the workers) ---------------------------------------------
def _chunk_summary(block, index, offset, labels: bool) -> dict:
    """Non-finite count and first position; for labels also non-integers and the range."""
    block = np.asarray(block)
    bad = ~np.isfinite(block) if np.issubdtype(block.dtype, np.floating) else np.zeros(block.shape, bool)
    out = {"index": index, "bad": int(bad.sum()), "first": None, "min": None, "max": None, "fractional": False}
    if out["bad"]:
        local = np.argwhere(bad)[0]
        out["first"] = tuple(int(i) + int(o) for i, o in zip(local, offset, strict=True))
    if labels and block.size:
        good = block[~bad] if out["bad"] else block
        out["fractional"] = bool(np.issubdtype(block.dtype, np.floating) and np.any(good != np.round(good)))
        if good.size:
            out["min"], out["max"] = int(good.min()), int(good.max())
    return out


def _combine(*summaries) -> dict:
    found = [s for s in summaries if s["bad"]]
    ranges = [s for s in summaries if s["min"] is not None]
    return {
        "bad": sum(s["bad"] for s in summaries),
        "first": (found[0]["first"], found[0]["index"]) if found else None,
        "min": min((s["min"] for s in ranges), default=None),
        "max": max((s["max"] for s in ranges), default=None),
        "fractional": any(s["fractional"] for s in summaries),
    }


def _summary(array, *, labels: bool = False):
    """A delayed summary of ``array``: one task per chunk and one that combines them."""
    blocks = array.to_delayed()
    starts = [np.cumsum((0, *c[:-1])) for c in array.chunks]
    parts = []
    for index in np.ndindex(*blocks.shape):
        offset = tuple(int(starts[d][i]) for d, i in enumerate(index))
        parts.append(dask.delayed(_chunk_summary, pure=True)(blocks[index], index, offset, labels))
    return dask.delayed(_combine, pure=True)(*parts)


def _raise_features(name: str, s: dict) -> None:
    if s["bad"]:
        first, chunk = s["first"]
        raise non_finite(name, s["bad"], first=first, chunk=chunk)


def _labels_outputs(name: str, s: dict, n_outputs: int | None) -> int:
    if s["bad"] or s["fractional"]:
        raise not_labels(name)
    return check_label_range(name, s["min"], s["max"], n_outputs)


def _raise_targets(name: str, s: dict) -> None:
    if s["bad"]:
        raise non_finite(name, s["bad"])


# -- the entry point ---------------------------------------------------------------
def check_dask_data(client, X, y, validation_data, *, loss: str, dtype, n_in=None, n_out=None) -> tuple:
    """Check dask-array training data on the workers and keep it there, cast, persisted.

    Shapes, chunk sizes and dtypes are checked from the metadata; values in
    one reduction (per-chunk summaries combined into one small record), so
    the errors equal those of numpy input and name the chunk of a non-finite
    value. Raises before any training task. Returns ``(X, y, n_outputs, validation)``,
    the arrays persisted on the cluster (their futures keep them there).
    """
    X = check_dask_features_layout(X, "X", n_in)
    y = _check_targets_meta(y, "y", loss, X.shape[0], n_out)
    names = [("X", False), ("y", loss == "cross_entropy")]
    arrays = [X, y]
    if validation_data is not None:
        Xv = check_dask_features_layout(validation_data[0], "validation_data[0]", X.shape[1])
        yv = _check_targets_meta(validation_data[1], "validation_data[1]", loss, Xv.shape[0], n_out)
        names += [("validation_data[0]", False), ("validation_data[1]", loss == "cross_entropy")]
        arrays += [Xv, yv]
    label_dtype = np.int64 if loss == "cross_entropy" else dtype
    persisted = client.persist(arrays)
    # the checks read the persisted chunks (as given: a cast would hide fractional labels), so the
    # data is read from its source once
    summaries = client.compute([_summary(a, labels=lab) for a, (_, lab) in zip(persisted, names, strict=True)])
    summaries = client.gather(summaries)
    n_outputs = n_out
    for (name, lab), s in zip(names, summaries, strict=True):
        if name.endswith("[1]") or name == "y":
            if lab:
                found = _labels_outputs(name, s, n_outputs)
                n_outputs = found if name == "y" else n_outputs
            else:
                _raise_targets(name, s)
        else:
            _raise_features(name, s)
    if loss != "cross_entropy":
        n_outputs = y.shape[1]
    # the cast runs on the workers, chunk by chunk (a no-op for data already of the trained dtype)
    persisted = client.persist([a.astype(label_dtype if i % 2 else dtype) for i, a in enumerate(persisted)])
    validation = tuple(persisted[2:]) if validation_data is not None else None
    return persisted[0], persisted[1], n_outputs, validation


# -- reading on the workers ------------------------------------------------------------
def _block_futures(array) -> dict:
    return {f.key: f for f in futures_of(array)}


def _overlap(chunks, lo: int, hi: int) -> list[tuple[int, int, int]]:
    """``(chunk, start, stop)`` within each chunk of ``chunks`` that covers ``[lo, hi)``."""
    out, start = [], 0
    for i, size in enumerate(chunks):
        stop = start + size
        if start < hi and stop > lo:
            out.append((i, max(lo, start) - start, min(hi, stop) - start))
        start = stop
    return out


def _assemble(blocks, row_cuts, col_cuts, shape, dtype):
    if 0 in shape:  # an empty slice (a band of no columns, say) meets no chunk
        return np.empty(shape, dtype=dtype)
    rows = []
    for line, (_, r0, r1) in zip(blocks, row_cuts, strict=True):
        if col_cuts is None:
            rows.append(np.asarray(line)[r0:r1])
        else:
            parts = [np.asarray(b)[r0:r1, c0:c1] for b, (_, c0, c1) in zip(line, col_cuts, strict=True)]
            rows.append(np.concatenate(parts, axis=1) if len(parts) > 1 else parts[0])
    out = np.concatenate(rows, axis=0) if len(rows) > 1 else rows[0]
    return np.ascontiguousarray(out, dtype=dtype)


def materialize(client, array, *, key: str, rows=None, cols=None, workers=None):
    """A future of ``array[rows, cols]`` as one numpy array, built on ``workers`` from the persisted chunks.

    Only the chunks that overlap the slice travel, worker to worker; the
    client sends keys and bounds, never values.
    """
    futures = _block_futures(array)
    keys = np.empty(tuple(len(c) for c in array.chunks), dtype=object)
    for index in np.ndindex(*keys.shape):
        keys[index] = (array.name, *index)
    r0, r1 = rows if rows is not None else (0, array.shape[0])
    row_cuts = _overlap(array.chunks[0], r0, r1)
    if array.ndim == 1:
        blocks = [futures[keys[i]] for i, _, _ in row_cuts]
        col_cuts = None
    else:
        c0, c1 = cols if cols is not None else (0, array.shape[1])
        col_cuts = _overlap(array.chunks[1], c0, c1)
        blocks = [[futures[keys[i, j]] for j, _, _ in col_cuts] for i, _, _ in row_cuts]
    placement = {} if workers is None else {"workers": workers, "allow_other_workers": False}
    shape = (r1 - r0,) if array.ndim == 1 else (r1 - r0, c1 - c0)
    return client.submit(_assemble, blocks, row_cuts, col_cuts, shape, array.dtype, key=key, pure=False, **placement)


def remote_call(func, *args, **kwargs):
    """``func(*args)`` computed on a worker, where dask-array arguments are read whole (small results only)."""
    client = next(iter(f.client for a in args for f in futures_of(a)), None) if args else None
    task = dask.delayed(func, pure=False)(*args, **kwargs)
    if client is None:
        return task.compute()
    return client.compute(task).result()
