"""Predictions from the network's last pre-activation, numpy or dask alike.

As for scikit-learn estimators wrapped by dask-ml's ``ParallelPostFit``: numpy in,
numpy out; a dask array in, a dask array out, chunked along the rows of ``X``,
and nothing read until it is computed. The layout of a dask-array ``X`` is
checked at once; its values by each block's own task, so a NaN raises when that
block is computed, naming its chunk and position.
"""

from __future__ import annotations

import dask
import numpy as np

from daskann._dask_input import check_dask_features_layout, is_dask_array
from daskann._validation import invalid
from daskann.nn import output_activation, softmax

__all__ = ["checked_features", "model_logits", "predicted_labels", "predicted_outputs", "predicted_proba"]


def _checked_block(block, name: str, dtype, block_info=None):
    bad = ~np.isfinite(block)
    if bad.any():
        location = block_info[0]
        local = np.argwhere(bad)[0]
        first = tuple(int(i) + int(start) for i, (start, _) in zip(local, location["array-location"], strict=True))
        chunk = tuple(location["chunk-location"])
        raise invalid(
            name, f"array with {int(bad.sum())} NaN or Inf values in chunk {chunk} (first at {first})", "finite values"
        )
    return np.ascontiguousarray(block, dtype=dtype)


def checked_features(X, *, name: str = "X", dtype, n_features: int):
    """``X`` cast to ``dtype`` with its values checked lazily; its layout is checked now.

    Raises
    ------
    ValueError or TypeError
        For unknown chunk sizes, a shape or dtype the network cannot take (as
        for numpy input).
    """
    X = check_dask_features_layout(X, name, n_features)
    return X.map_blocks(_checked_block, name, np.dtype(dtype), dtype=dtype)


def _forward(block, model):
    return model.forward(block)


def model_logits(model, X):
    """The network's last pre-activation for the rows of checked dask-array ``X``.

    The model enters the graph once, as one key every block reads (its
    weights are never repeated per task).
    """
    X = X.rechunk({1: -1})
    shared = dask.delayed(model, pure=True)
    n_out = model.sizes[-1]
    meta = np.empty((0, n_out), dtype=model.dtype)  # given: dask cannot call the model on a Delayed to infer it
    return X.map_blocks(_forward, shared, chunks=(X.chunks[0], (n_out,)), meta=meta)


def _labels(logits):
    return np.argmax(logits, axis=1)


def _outputs(logits, output: str):
    out = output_activation(logits, output)
    return out[:, 0] if out.shape[1] == 1 else out


def predicted_labels(logits):
    """Class labels; for dask ``logits`` (columns in one chunk), one chunk per row chunk."""
    if not is_dask_array(logits):
        return _labels(logits)
    return logits.map_blocks(_labels, drop_axis=1, dtype=np.intp)


def predicted_outputs(logits, output: str):
    """Network outputs; a single output drops its column."""
    if not is_dask_array(logits):
        return _outputs(logits, output)
    single = logits.shape[1] == 1
    return logits.map_blocks(_outputs, output, drop_axis=1 if single else None, dtype=logits.dtype)


def predicted_proba(logits):
    """Row-wise softmax of ``logits``."""
    return logits.map_blocks(softmax, dtype=logits.dtype) if is_dask_array(logits) else softmax(logits)
