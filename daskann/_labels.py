"""Class labels as scikit-learn's classifiers keep them: ``classes_`` and the integer codes trained on.

A classifier takes any hashable labels (strings, integers, floats that are whole
numbers) and keeps their sorted unique values in ``classes_``; the network
trains on each label's position in ``classes_`` (output column ``c`` is class
``classes_[c]``) and ``predict`` maps the winning column back.
"""

from __future__ import annotations

import dask.array as da
import numpy as np
from sklearn.utils.multiclass import check_classification_targets

from daskann._dask_input import is_dask_array
from daskann._validation import invalid

__all__ = ["check_classes", "decode", "encode", "fit_classes", "unique_labels"]


def unique_labels(y, client=None) -> np.ndarray:
    """Sorted unique labels of ``y``, with scikit-learn's check that they are classes, not a continuous target.

    A dask array is reduced where its chunks are (``client`` when given, else
    dask's default scheduler): only the unique labels reach the client.
    """
    if is_dask_array(y):
        uniques = da.unique(y)
        uniques = client.compute(uniques, sync=True) if client is not None else uniques.compute()
    else:
        uniques = np.unique(y)
    # on the unique values, scikit-learn's rule and its message ("Unknown label type: continuous ...")
    check_classification_targets(uniques)
    return uniques


def check_classes(classes, name: str = "classes") -> np.ndarray:
    """The ``classes`` of ``partial_fit``: a non-empty 1-d array-like of distinct labels, sorted."""
    values = np.asarray(classes)
    if values.ndim != 1 or values.size == 0:
        raise invalid(name, classes, "a non-empty 1-d array-like of class labels")
    uniques = np.unique(values)
    if uniques.size != values.size:
        raise invalid(name, classes, "distinct class labels")
    check_classification_targets(uniques)
    return uniques


def fit_classes(found: np.ndarray, *, classes=None, n_outputs: int | None = None) -> np.ndarray:
    """``classes_`` of a fit whose labels are ``found`` (sorted unique).

    ``classes`` (``partial_fit``'s, already checked) fixes them in advance; the
    labels must be among them. A network of ``n_outputs`` given beforehand
    (``init_model``) whose width differs from the labels found keeps integer
    labels as its output columns ``0 .. n_outputs - 1``.
    """
    if classes is not None:
        missing = np.setdiff1d(found, classes)
        if missing.size:
            raise invalid("y", f"labels {missing.tolist()[:10]}", f"labels among classes={classes.tolist()[:20]}")
        return classes
    if n_outputs is not None and found.size != n_outputs:
        if np.issubdtype(found.dtype, np.number) and np.all(found == np.round(found)):
            if found.min() >= 0 and found.max() < n_outputs:
                return np.arange(n_outputs)
        raise invalid(
            "y", f"{found.size} classes {found.tolist()[:10]}", f"{n_outputs} classes, as the network's output layer"
        )
    return found


def encode(y, classes: np.ndarray, name: str = "y"):
    """Positions of the labels ``y`` in ``classes_`` (int64), numpy or lazily per chunk of a dask array."""
    if is_dask_array(y):
        return y.map_blocks(_encode_block, classes, name, dtype=np.int64)
    return _encode_block(np.asarray(y), classes, name)


def _encode_block(block, classes: np.ndarray, name: str) -> np.ndarray:
    block = np.asarray(block).ravel() if np.ndim(block) > 1 else np.asarray(block)
    codes = np.searchsorted(classes, block)
    clipped = np.minimum(codes, classes.size - 1)
    unknown = classes[clipped] != block
    if np.any(unknown):
        labels = np.unique(block[unknown]).tolist()[:10]
        raise invalid(
            name, f"labels {labels}", f"labels among the classes seen in fit, classes_={classes.tolist()[:20]}"
        )
    return codes.astype(np.int64)


def decode(codes, classes: np.ndarray):
    """The labels of integer output columns ``codes``: ``classes_[codes]``, numpy or lazily per chunk."""
    if is_dask_array(codes):
        return codes.map_blocks(_decode_block, classes, dtype=classes.dtype)
    return _decode_block(codes, classes)


def _decode_block(codes, classes: np.ndarray) -> np.ndarray:
    return classes[codes]
