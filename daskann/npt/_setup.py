"""The grid and mode of an NPT run, chosen and checked before any training task."""

from __future__ import annotations

import numpy as np

from daskann._validation import invalid
from daskann.cluster import check_worker_memory, worker_addresses, worker_threads
from daskann.npt import costmodel
from daskann.npt._engine_options import NPTEngineOptions
from daskann.npt.grid import ProcessGrid


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
