"""MNIST in its original IDX format, read from a local folder.

An IDX file is two zero bytes, a type code, the number of dimensions, one
big-endian uint32 per dimension, then the values in C order, big-endian.
"""

from __future__ import annotations

import gzip
import struct
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

import numpy as np

from daskann._validation import check_choice, check_float_dtype, check_folder, invalid

KINDS = ("train", "test")
_PREFIX = {"train": "train", "test": "t10k"}

# type code -> big-endian dtype
_IDX_DTYPES = {
    0x08: np.dtype(">u1"),
    0x09: np.dtype(">i1"),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}


def load_mnist_idx(folder, *, kind: Literal["train", "test"] = "train", dtype="float64"):
    """MNIST (or any set in MNIST's IDX layout, e.g. Fashion-MNIST) from local files.

    Nothing is downloaded: the files must already be in ``folder``.

    Parameters
    ----------
    folder : str or os.PathLike
        Folder holding ``train-images-idx3-ubyte`` and ``train-labels-idx1-ubyte``
        (``kind="train"``) or ``t10k-images-idx3-ubyte`` and
        ``t10k-labels-idx1-ubyte`` (``kind="test"``), each optionally gzipped
        (``.gz``). The variant spelling ``train-images.idx3-ubyte`` is accepted.
    kind : {"train", "test"}
    dtype : {"float64", "float32"}
        Dtype of ``X``.

    Returns
    -------
    X : ndarray of shape (n_samples, rows * cols)
        Images flattened row by row and scaled from 0..255 to ``[0, 1]``.
    y : ndarray of shape (n_samples,), int64

    Raises
    ------
    FileNotFoundError
        If ``folder`` or one of the files is missing.
    ValueError
        If a file is not a well-formed IDX file of the expected shape.
    """
    path = check_folder(folder)
    kind = check_choice("kind", kind, KINDS)
    dtype = check_float_dtype(dtype)
    images_file = _locate(path, folder, kind, "images", 3)
    labels_file = _locate(path, folder, kind, "labels", 1)

    images = read_idx(images_file)
    if images.ndim != 3 or images.dtype != np.uint8:
        raise ValueError(
            f"{images_file}: holds a {images.ndim}-d {images.dtype} array of shape {images.shape}; "
            "expected MNIST images, a 3-d unsigned-byte array (magic number 0x00000803)"
        )
    labels = read_idx(labels_file)
    if labels.ndim != 1 or labels.dtype != np.uint8:
        raise ValueError(
            f"{labels_file}: holds a {labels.ndim}-d {labels.dtype} array of shape {labels.shape}; "
            "expected MNIST labels, a 1-d unsigned-byte array (magic number 0x00000801)"
        )
    if labels.shape[0] != images.shape[0]:
        raise ValueError(
            f"{images_file} holds {images.shape[0]} images but {labels_file} holds {labels.shape[0]} labels; "
            "expected one label per image"
        )
    X = (images.reshape(images.shape[0], -1).astype(np.float64) / 255.0).astype(dtype, copy=False)
    return X, labels.astype(np.int64)


def _file_names(kind: str, what: str, ndim: int) -> list[str]:
    prefix = _PREFIX[kind]
    stems = [f"{prefix}-{what}-idx{ndim}-ubyte", f"{prefix}-{what}.idx{ndim}-ubyte"]
    return [stem + ext for stem in stems for ext in ("", ".gz")]


def find_file(folder: Path, names: Sequence[str]) -> Path | None:
    """The first of ``names`` present in ``folder``, else ``None``."""
    for file_name in names:
        candidate = folder / file_name
        if candidate.is_file():
            return candidate
    return None


def _locate(path: Path, folder, kind: str, what: str, ndim: int) -> Path:
    names = _file_names(kind, what, ndim)
    found = find_file(path, names)
    if found is None:
        prefix = _PREFIX[kind]
        raise invalid(
            "folder",
            str(folder),
            f"a folder holding the MNIST {kind} files {prefix}-images-idx3-ubyte and "
            f"{prefix}-labels-idx1-ubyte (optionally .gz); no {names[0]} or {names[1]} there",
            FileNotFoundError,
        )
    return found


def read_idx(file) -> np.ndarray:
    """Parse one IDX file (plain or gzipped) into a native-endian numpy array."""
    file = Path(file)
    try:
        if file.suffix == ".gz":
            with gzip.open(file, "rb") as stream:
                raw = stream.read()
        else:
            raw = file.read_bytes()
    except (OSError, EOFError, zlib.error) as exc:  # truncated or not gzip at all
        raise ValueError(f"{file}: cannot be read ({exc})") from exc
    if len(raw) < 4:
        raise ValueError(f"{file}: {len(raw)} bytes, too short for an IDX header (expected at least 4)")
    zero, code, ndim = struct.unpack(">HBB", raw[:4])
    if zero != 0 or code not in _IDX_DTYPES or ndim == 0:
        raise ValueError(
            f"{file}: magic number 0x{raw[:4].hex()} is not an IDX header; expected 0x0000TTDD with "
            f"type code TT in {{{', '.join(f'0x{c:02x}' for c in _IDX_DTYPES)}}} and DD >= 1 dimensions"
        )
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise ValueError(f"{file}: header announces {ndim} dimensions but the file ends after {len(raw)} bytes")
    shape = struct.unpack(f">{ndim}I", raw[4:header])
    item = _IDX_DTYPES[code]
    expected = int(np.prod(shape, dtype=np.int64)) * item.itemsize
    if len(raw) - header != expected:
        raise ValueError(
            f"{file}: header announces shape {shape} of {item.name} ({expected} data bytes) "
            f"but the file holds {len(raw) - header} data bytes"
        )
    data = np.frombuffer(raw, dtype=item, offset=header).reshape(shape)
    return data.astype(item.newbyteorder("="))
