"""Checkpoints of an NPT run: the block stores the grid's cells write, verify and resume from.

One format for both modes (graph mode cuts it on the grid, resident mode on its virtual Cannon
grid): either resumes the other's checkpoints, on any grid.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable

import numpy as np

from daskann import store


def block_checkpoint_writer(
    directory, sizes, settings: dict, order, training: dict, extra: dict, stop: int, on_final: Callable
) -> Callable:
    """``save(step, layout, write) -> path``: a store in ``directory`` whose blocks the cells write, committed here.

    ``training`` and ``extra`` go into its attributes; ``on_final(path)`` is told the store of step ``stop``.
    """
    config = {
        "sizes": list(sizes),
        "activation": settings["activation"],
        "output": settings["output"],
        "dtype": np.dtype(settings["dtype"]).name,
        "negative_slope": settings["negative_slope"],
    }

    def save(step, layout, write):
        attrs = store.checkpoint_attrs(config, step, order.get_state(), training, extra)
        path = store.write_block_group(store.checkpoint_path(directory, step), layout, write, attrs)
        if step == stop:
            on_final(path)
        return path

    return save


def verify_store(client, grid, path) -> None:
    """Check every block of the cell-written store ``path`` on the grid's workers, before any training task.

    One task per worker reads its share of the blocks, one at a time; a damaged block raises
    :class:`~daskann.exceptions.DamagedStoreError` naming the store, the array and the block.
    """
    workers = list(dict.fromkeys(grid.workers))
    blocks = store.stored_blocks(path)
    prefix = f"daskann-npt-{uuid.uuid4().hex[:12]}-verify"
    # spread over the grid's workers; any other may take over a share whose worker left
    futures = [
        client.submit(
            _verify_blocks,
            str(path),
            blocks[k :: len(workers)],
            key=f"{prefix}-{k}",
            workers=[w],
            allow_other_workers=True,
            pure=False,
        )
        for k, w in enumerate(workers)
    ]
    try:
        client.gather(futures)
    finally:
        client.cancel(futures)


def _verify_blocks(path: str, blocks) -> None:
    """Task body of :func:`verify_store`: check ``blocks`` (``(array, "i.j")``) of one store."""
    for name, index in blocks:
        store.verify_block(path, name, index)


def block_digests(parts) -> dict:
    """``{array: {"i.j": sha256}}`` from the ``[(array, "i.j", sha256), ...]`` the cells' save tasks return."""
    digests: dict = {}
    for part in parts:
        for array, index, digest in part:
            digests.setdefault(array, {})[index] = digest
    return digests
