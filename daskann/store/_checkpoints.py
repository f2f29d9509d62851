"""Checkpoints: everything a training needs to continue bit for bit, and finding a run folder's newest."""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from daskann._validation import named_error
from daskann.exceptions import DamagedStoreError, StoreError
from daskann.nn import MLP
from daskann.store._atomic import FORMAT_VERSION, open_group, read_array_group, write_array_group

RUN_MARKER = "daskann-run.json"
CHECKPOINT_DIR = "checkpoints"
#: a run folder's training history and its final model, beside RUN_MARKER and CHECKPOINT_DIR
HISTORY_STORE = "history.zarr"
MODEL_STORE = "model.zarr"
_CHECKPOINT_NAME = re.compile(r"^step-(\d{8,})\.zarr$")


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
    group, _attrs, meta = open_group(path, kind="checkpoint")
    config, manifest = meta["model"], meta.get("manifest", {})
    missing = [name for name in checkpoint_arrays(config) if name not in manifest]
    if missing:
        raise named_error(
            DamagedStoreError, "path", f"{str(path)!r}: checkpoint arrays are incomplete (missing {missing})"
        )
    for name, expected in manifest.items():
        try:
            shape = tuple(group[name].shape)
        except Exception as exc:
            raise named_error(
                DamagedStoreError, "path", f"{str(path)!r}: array {name!r} cannot be read ({exc})"
            ) from exc
        if shape != tuple(expected["shape"]):
            raise named_error(
                DamagedStoreError, "path", f"{str(path)!r}: array {name!r} has shape {shape}, not {expected['shape']}"
            )
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
        raise named_error(
            DamagedStoreError, "path", f"{str(path)!r}: checkpoint arrays are incomplete ({exc})"
        ) from exc
    if list(model.sizes) != list(config["sizes"]) or model.dtype.name != config["dtype"]:
        raise named_error(DamagedStoreError, "path", f"{str(path)!r}: arrays do not match the recorded model {config}")
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
        raise named_error(FileNotFoundError, "path", f"{str(run_dir)!r}: run folder holds no checkpoint")
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
    raise named_error(DamagedStoreError, "path", f"{str(run_dir)!r}: every checkpoint is damaged")
