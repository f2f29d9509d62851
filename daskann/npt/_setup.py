"""The options of an NPT run and what is checked before its first training task.

The ``engine`` options (:class:`NPTEngineOptions`) and the checks of the trainer's ``grid``,
``mode``, ``engine`` and ``client``; then, from the scheduler's view alone, the cluster's workers,
the grid and mode chosen for it (the cost model for ``"auto"``) and whether the blocks fit a
worker; last, on the grid's workers, every block of the checkpoint store a run resumes from.
"""

from __future__ import annotations

import uuid
from typing import get_args

import numpy as np
from distributed import Client

from daskann import store
from daskann._options import OptionGroup, resolve_group
from daskann._validation import NPTMode, NPTPipeline, check_choice, check_float, invalid
from daskann.cluster import check_worker_memory, worker_addresses, worker_threads
from daskann.npt import costmodel
from daskann.npt.grid import ProcessGrid, parse_grid

MODES = get_args(NPTMode)
PIPELINES = get_args(NPTPipeline)
#: accumulation chains per block product of each graph-mode pipeline
CHAINS = {"fused": 0, "single": 1, "double": 2}


class NPTEngineOptions(OptionGroup):
    """The ``engine`` options of :class:`NPTTrainer`: how the grid runs, beyond its shape and mode.

    Given as ``engine=NPTEngineOptions(...)`` or a dict of the same keywords
    (``engine={"deterministic": False}``); either way
    ``trainer.set_params(engine__deterministic=False)`` sets one option.

    Parameters
    ----------
    share_workers : bool
        Allow a grid with more cells than workers (cells dealt out
        round-robin); otherwise such a grid is an error.
    deterministic : bool
        Refuse clusters whose workers run more than one thread, whose results
        could depend on timing.
    pipeline : {"auto", "fused", "single", "double"}
        Graph mode only: how each output block's Cannon steps become tasks.
        ``"double"``: a task per block product in two accumulation chains
        (the next operands travel while the current product runs);
        ``"single"``: a task per block product in one chain; ``"fused"``: one
        task per output block running its products in Cannon order.
        ``"auto"`` picks by the size of a block product.
    timeout : float
        Seconds without progress after which training fails (never hangs).
    """

    group = "engine"

    def __init__(self, *, share_workers=False, deterministic=True, pipeline: NPTPipeline = "auto", timeout=120.0):
        self._store(locals())


def check_npt_options(grid, mode, engine, client) -> dict:
    """The trainer's ``grid``, ``mode``, ``engine`` and ``client`` checked: the options of an NPT run.

    Returns ``{"grid", "mode", "share_workers", "deterministic", "timeout", "pipeline"}``; raises
    before any task for a value that is not valid.
    """
    grid = parse_grid(grid)
    mode = check_choice("mode", mode, MODES)
    engine = resolve_group(engine, NPTEngineOptions)
    pipeline = check_choice(NPTEngineOptions.name_of("pipeline"), engine["pipeline"], PIPELINES)
    for name in ("share_workers", "deterministic"):
        if not isinstance(engine[name], (bool, np.bool_)):
            raise invalid(NPTEngineOptions.name_of(name), engine[name], "True or False", TypeError)
    timeout = check_float(NPTEngineOptions.name_of("timeout"), engine["timeout"], minimum=0.0, min_inclusive=False)
    if client is not None and not isinstance(client, Client):
        raise invalid("client", type(client).__name__, "a distributed.Client or None", TypeError)
    return {
        "grid": grid,
        "mode": mode,
        "share_workers": bool(engine["share_workers"]),
        "deterministic": bool(engine["deterministic"]),
        "timeout": timeout,
        "pipeline": pipeline,
    }


def check_cluster(client, npt: dict) -> list[str]:
    """The cluster's workers, checked against the options ``npt``: the scheduler's view only, no task submitted."""
    workers = worker_addresses(client)
    if not workers:
        raise invalid("client", "a cluster without workers", "a cluster with at least one worker")
    if npt["deterministic"]:
        threads = worker_threads(client)
        threaded = {w: threads[w] for w in workers if threads.get(w, 1) > 1}
        if threaded:
            w, n = next(iter(threaded.items()))
            raise invalid(
                NPTEngineOptions.name_of("deterministic"),
                True,
                f"a cluster whose workers run one thread each (worker {w} runs {n}; "
                f"{len(threaded)} of {len(workers)} workers are multi-threaded), "
                "or engine={'deterministic': False}",
            )
    if npt["grid"] != "auto":
        ProcessGrid.from_workers(npt["grid"], workers, share_workers=npt["share_workers"])
    return workers


def grid_and_mode(client, npt: dict, sizes, settings: dict):
    """``(grid, mode, plan, cost_model)`` for the checked options ``npt``.

    With a grid or mode ``"auto"`` the cluster is measured and the cost model picks them (``plan`` is
    its prediction table); otherwise ``plan`` and ``cost_model`` are None.
    """
    workers = worker_addresses(client)
    itemsize = np.dtype(settings["dtype"]).itemsize
    batch = settings["batch_size"]
    shape, mode, plan, model = npt["grid"], npt["mode"], None, None
    if shape == "auto" or mode == "auto":
        model = costmodel.measure(client)
        if shape == "auto":
            shape, mode, plan = costmodel.choose_grid(
                model, sizes, batch, mode=npt["mode"], n_workers=len(workers), itemsize=itemsize
            )
        else:
            if mode == "auto":
                mode = model.choose_mode(sizes, batch, shape, itemsize=itemsize)
            plan = model.plan(
                sizes, batch, n_workers=len(workers), mode=npt["mode"], grids=[tuple(shape)], itemsize=itemsize
            )
    grid = ProcessGrid.from_workers(shape, workers, share_workers=npt["share_workers"])
    return grid, mode, plan, model


def check_block_memory(client, grid: ProcessGrid, sizes, settings: dict) -> None:
    """Refuse a grid whose blocks cannot fit a worker, before any training task.

    A worker holds the weights and velocity of its cells plus, while a Cannon product runs, at most
    two blocks of each operand (the one in use and the next one travelling).
    """
    itemsize = np.dtype(settings["dtype"]).itemsize
    cells = max(grid.workers.count(w) for w in set(grid.workers))
    own = sum(-(-a // grid.rows) * -(-b // grid.cols) for a, b in zip(sizes[:-1], sizes[1:], strict=True))
    batch = -(-settings["batch_size"] // grid.rows)
    widest = max(-(-a // grid.rows) * -(-b // grid.cols) for a, b in zip(sizes[:-1], sizes[1:], strict=True))
    flight = 2 * (widest + batch * -(-max(sizes) // grid.cols))
    check_worker_memory(
        client,
        (2 * own + flight) * cells * itemsize,
        name="grid",
        what=f"{grid.rows}x{grid.cols} blocks (weights, velocity and Cannon operands in flight)",
    )


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
