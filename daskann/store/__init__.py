"""Checkpoints and histories on disk, in zarr.

Every store is written under a temporary name beside its target, flushed, and
renamed into place, so a reader sees either the old store or the complete new
one. Each array's SHA-256 is kept in a manifest in the group's attributes and
verified on load; chunks also carry a CRC32C so a flipped byte fails loudly.
Nothing is pickled: arrays are zarr, everything else is JSON.
"""

from __future__ import annotations

from daskann._json import temporary_sibling
from daskann.exceptions import DamagedStoreError, DiskFullError, StoreError
from daskann.store._atomic import read_array_group
from daskann.store._blocks import (
    BlockArray,
    is_block_store,
    read_region,
    stored_blocks,
    verify_block,
    write_block,
    write_block_group,
)
from daskann.store._checkpoints import (
    CHECKPOINT_DIR,
    HISTORY_STORE,
    MODEL_STORE,
    RUN_MARKER,
    Checkpoint,
    CheckpointInfo,
    checkpoint_attrs,
    checkpoint_info,
    checkpoint_path,
    find_checkpoint,
    list_checkpoints,
    load_checkpoint,
    save_checkpoint,
)
from daskann.store._history import load_history, run_history, save_history
from daskann.store._lock import LOCK_NAME, RunLock
from daskann.store._run_dir import check_free_space, check_writable_folder, prepare_run_dir
from daskann.store._verify import register_verifier, verify_path

__all__ = [
    "CHECKPOINT_DIR",
    "HISTORY_STORE",
    "LOCK_NAME",
    "MODEL_STORE",
    "RUN_MARKER",
    "BlockArray",
    "Checkpoint",
    "CheckpointInfo",
    "DamagedStoreError",
    "DiskFullError",
    "RunLock",
    "StoreError",
    "check_free_space",
    "check_writable_folder",
    "checkpoint_attrs",
    "checkpoint_info",
    "checkpoint_path",
    "find_checkpoint",
    "is_block_store",
    "list_checkpoints",
    "load_checkpoint",
    "load_history",
    "prepare_run_dir",
    "read_array_group",
    "read_region",
    "register_verifier",
    "run_history",
    "save_checkpoint",
    "save_history",
    "stored_blocks",
    "temporary_sibling",
    "verify_block",
    "verify_path",
    "write_block",
    "write_block_group",
]
