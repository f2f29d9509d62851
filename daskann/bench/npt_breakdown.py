"""``daskann bench npt --breakdown``: where each worker's step time went in the large net's rows.

For every NPT row of the large net (and its ``grid="auto"`` row) the bench keeps,
per timed step and per worker, the parts of :attr:`NPTTrainer.worker_times_`:
``wall`` (the worker's own step), ``compute`` (block products and the other
arithmetic: task time in graph mode, the kernels' timers in resident mode),
``serialise`` (graph mode: deserialising and spilling), ``transfer`` (incoming
blocks in transit while the worker computed nothing) and ``idle`` (the rest:
waiting for peers or the scheduler, bookkeeping); the four add up to ``wall``.
Resident rows add ``recv_wait``, the seconds spent waiting in receives (transit
and waiting for peers together).

It also times the step's matrix products alone (:func:`products_alone`): on
every worker at once, its share of each product as one plain GEMM, without
dask, transfers or the elementwise work. That is the fastest any engine could
run a step on these cores, held against the same bound as the rows.
"""

from __future__ import annotations

import time

import numpy as np
from threadpoolctl import threadpool_limits

from daskann.cluster import worker_addresses
from daskann.npt.costmodel import step_product_flops, step_products

#: the parts of a step, in the order the table shows them
PARTS = ("wall", "compute", "transfer", "serialise", "idle")


def collect(row: dict, worker_times: dict, warmup: int) -> dict:
    """The breakdown of one measured row: per worker, a list per part over the steps after ``warmup``.

    ``worker_times`` is the trainer's ``{completed step: {worker: {part: seconds}}}``.
    """
    steps = sorted(done for done in worker_times if done > warmup)
    workers = sorted({w for done in steps for w in worker_times[done]})
    per_worker = {}
    for w in workers:
        parts = dict.fromkeys(k for done in steps for k in worker_times[done].get(w, {}))
        per_worker[w] = {k: [float(worker_times[done].get(w, {}).get(k, 0.0)) for done in steps] for k in parts}
    return {
        "net": row["net"],
        "grid": row["grid"],
        "mode": row["mode"],
        "time_per_step": row["time_per_step"],
        "steps": steps,
        "workers": per_worker,
        "median": {w: {k: float(np.median(v)) for k, v in parts.items()} for w, parts in per_worker.items()},
    }


def format_breakdown(entries: list[dict]) -> str:
    """Per row and worker, the median seconds per step of each part and the share of the step computing."""
    head = (
        f"{'net':>15} {'grid':>5} {'mode':>13} {'worker':>22} {'wall ms':>9} {'compute':>9} {'transfer':>9} "
        f"{'serialise':>9} {'idle':>9} {'compute %':>9}"
    )
    lines = ["where the step time goes (median per step and worker, ms):", head]
    for entry in entries:
        for worker, median in entry["median"].items():
            ms = [median.get(k, float("nan")) * 1e3 for k in PARTS]
            share = 100.0 * median["compute"] / median["wall"] if median.get("wall") else float("nan")
            cells = " ".join(f"{v:>9.1f}" for v in ms)
            lines.append(
                f"{entry['net']:>15} {entry['grid']:>5} {entry['mode']:>13} {worker:>22} {cells} {share:>9.1f}"
            )
    return "\n".join(lines)


def products_alone(client, sizes, batch: int, dtype: str = "float64", repeats: int = 2) -> dict:
    """Seconds of one step's matrix products alone, every worker running its share at the same time.

    Each of the ``p`` workers multiplies, for every product ``(m, k, n)`` of a
    step (:func:`daskann.npt.costmodel.step_products`), an ``m x k`` by a
    ``k x n/p`` matrix on one BLAS thread; ``seconds`` is the slowest worker's
    time (the fastest of ``repeats``), as a step waits for its slowest cell.
    """
    workers = worker_addresses(client)
    parts = max(len(workers), 1)
    times = client.run(_share_of_step, list(sizes), batch, parts, dtype, repeats, workers=workers)
    flops = step_product_flops(sizes, batch)
    seconds = max(times.values())
    return {
        "workers": parts,
        "seconds": float(seconds),
        "per_worker": {w: float(t) for w, t in times.items()},
        "flops": flops,
        "rate_per_core": flops / parts / seconds,
    }


def _share_of_step(sizes, batch: int, parts: int, dtype: str, repeats: int) -> float:
    """Seconds of this worker's share of one step's products: the fastest of ``repeats`` (runs on a worker)."""
    rng = np.random.default_rng(0)
    operands = []
    for m, k, n in step_products(sizes, batch):
        share = -(-n // parts)
        operands.append((rng.standard_normal((m, k)).astype(dtype), rng.standard_normal((k, share)).astype(dtype)))
    best = float("inf")
    with threadpool_limits(1):
        for _ in range(repeats):
            t0 = time.perf_counter()
            for a, b in operands:
                a @ b
            best = min(best, time.perf_counter() - t0)
    return best


def format_products_alone(alone: dict) -> str:
    """One line: the step's products alone against the bound."""
    return (
        f"the step's matrix products alone, on {alone['workers']} workers at once (plain GEMMs: no dask, no "
        f"transfers, no elementwise work): {alone['seconds']:.3g} s per step, "
        f"{alone['rate_per_core'] / 1e9:.3g} GFLOP/s per core, {alone['hw_efficiency']:.3f} of the bound "
        f"({alone['bound_s']:.3g} s at {alone['gemm_rate'] / 1e9:.3g} GFLOP/s per core probed beside it)"
    )


__all__ = ["PARTS", "collect", "format_breakdown", "format_products_alone", "products_alone"]
