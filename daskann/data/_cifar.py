"""CIFAR-10 "python version" batches read from a local folder.

The batches are pickles. Unpickling runs whatever callables a file names, so
they are read by an unpickler that resolves only the handful of globals a
batch needs (numpy array and dtype reconstruction) and refuses the rest.
"""

from __future__ import annotations

import io
import pickle
from pathlib import Path
from typing import Literal

import numpy as np

from daskann._validation import check_choice, check_float_dtype, check_folder, invalid
from daskann.exceptions import DaskannError

KINDS = ("train", "test")
TRAIN_BATCHES = tuple(f"data_batch_{i}" for i in range(1, 6))
TEST_BATCHES = ("test_batch",)
N_FEATURES = 3 * 32 * 32
N_CLASSES = 10
SUBFOLDER = "cifar-10-batches-py"


class _Refused(DaskannError, pickle.UnpicklingError):
    """A batch named something outside the allowed globals (told apart from corrupt data)."""


def _latin1_encode(text, encoding="utf-8"):
    # Protocol 0-2 pickles written by Python 3 rebuild bytes as
    # _codecs.encode(str, "latin1"); nothing else is needed, so nothing else is allowed.
    if not isinstance(text, str) or encoding != "latin1":
        raise _Refused(f"_codecs.encode is only allowed as encode(str, 'latin1'), not encoding={encoding!r}")
    return text.encode("latin1")


def _allowed_globals() -> dict[tuple[str, str], object]:
    # Take the functions from numpy's own reductions, so the same objects are
    # found whatever numpy calls its private modules (numpy.core before 2.0,
    # numpy._core since), without importing the deprecated alias.
    reconstruct = np.zeros(1).__reduce__()[0]
    frombuffer = np.zeros(1).__reduce_ex__(5)[0]
    allowed = {("numpy", "ndarray"): np.ndarray, ("numpy", "dtype"): np.dtype, ("_codecs", "encode"): _latin1_encode}
    for package in ("numpy.core", "numpy._core"):
        allowed[(f"{package}.multiarray", "_reconstruct")] = reconstruct
        allowed[(f"{package}.numeric", "_frombuffer")] = frombuffer
    return allowed


class _RestrictedUnpickler(pickle.Unpickler):
    """Unpickler that builds only containers, strings, numbers and numpy arrays."""

    def __init__(self, stream, file: Path):
        super().__init__(stream, encoding="bytes")
        self._file = file
        self._allowed = _allowed_globals()

    def find_class(self, module, name):
        try:
            return self._allowed[(module, name)]
        except KeyError:
            allowed = ", ".join(f"{m}.{n}" for m, n in self._allowed)
            raise _Refused(
                f"{self._file}: refused to load global {module}.{name}; a CIFAR-10 batch only needs {allowed}"
            ) from None

    def persistent_load(self, pid):
        raise _Refused(f"{self._file}: refused persistent id {pid!r}; CIFAR-10 batches use none")


def load_cifar10(folder, *, kind: Literal["train", "test"] = "train", dtype="float64"):
    """CIFAR-10 from the "python version" batches in a local folder.

    Nothing is downloaded. The batch pickles are read by a restricted
    unpickler: a file that names any global beyond numpy's array and dtype
    reconstruction is refused before that global is called.

    Parameters
    ----------
    folder : str or os.PathLike
        Folder holding ``data_batch_1`` .. ``data_batch_5`` (``kind="train"``)
        or ``test_batch`` (``kind="test"``), as extracted from
        ``cifar-10-python.tar.gz``; its parent folder (holding
        ``cifar-10-batches-py``) works too.
    kind : {"train", "test"}
    dtype : {"float64", "float32"}
        Dtype of ``X``.

    Returns
    -------
    X : ndarray of shape (n_samples, 3072)
        Pixels scaled from 0..255 to ``[0, 1]``, in the files' order: the
        1024 red values of the 32x32 image row by row, then green, then blue.
    y : ndarray of shape (n_samples,), int64
        Labels 0..9.

    Raises
    ------
    FileNotFoundError
        If ``folder`` or a batch is missing.
    pickle.UnpicklingError
        If a batch names a global outside the allowed few (a malicious or
        foreign pickle).
    ValueError
        If a batch is corrupt or does not hold CIFAR-10 data.
    """
    path = check_folder(folder)
    kind = check_choice("kind", kind, KINDS)
    dtype = check_float_dtype(dtype)
    names = TRAIN_BATCHES if kind == "train" else TEST_BATCHES
    if not (path / names[0]).is_file() and (path / SUBFOLDER).is_dir():
        path = path / SUBFOLDER
    missing = [name for name in names if not (path / name).is_file()]
    if missing:
        raise invalid(
            "folder",
            str(folder),
            f"a folder holding the CIFAR-10 {kind} batches {', '.join(names)} (python version); "
            f"missing: {', '.join(missing)}",
            FileNotFoundError,
        )
    parts = [_read_batch(path / name) for name in names]
    X = np.concatenate([p[0] for p in parts])
    y = np.concatenate([p[1] for p in parts])
    return (X.astype(np.float64) / 255.0).astype(dtype, copy=False), y


def _read_batch(file: Path):
    raw = file.read_bytes()
    try:
        batch = _RestrictedUnpickler(io.BytesIO(raw), file).load()
    except _Refused as exc:
        if str(file) not in str(exc):
            raise _Refused(f"{file}: {exc}") from None
        raise
    except Exception as exc:  # truncated or garbled pickles fail in many ways
        raise ValueError(f"{file}: not a readable CIFAR-10 batch ({type(exc).__name__}: {exc})") from exc
    if not isinstance(batch, dict):
        raise ValueError(f"{file}: holds a {type(batch).__name__}; expected a dict with 'data' and 'labels'")
    data = _get(batch, "data", file)
    labels = _get(batch, "labels", file)
    if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != N_FEATURES:
        desc = f"{data.dtype} array of shape {data.shape}" if isinstance(data, np.ndarray) else type(data).__name__
        raise ValueError(f"{file}: 'data' is a {desc}; expected a uint8 array of shape (n, {N_FEATURES})")
    try:
        y = np.asarray(labels)
    except Exception:  # ragged or odd objects
        y = np.asarray([None])
    if y.shape != (data.shape[0],) or not np.issubdtype(y.dtype, np.integer) or ((y < 0) | (y >= N_CLASSES)).any():
        raise ValueError(
            f"{file}: 'labels' do not match; expected {data.shape[0]} integer labels in 0..{N_CLASSES - 1}"
        )
    return data, y.astype(np.int64)


def _get(batch: dict, key: str, file: Path):
    for candidate in (key.encode(), key):
        if candidate in batch:
            return batch[candidate]
    keys = ", ".join(repr(k) for k in list(batch)[:10])
    raise ValueError(f"{file}: no {key!r} entry (keys: {keys}); expected a CIFAR-10 batch with b'data' and b'labels'")
