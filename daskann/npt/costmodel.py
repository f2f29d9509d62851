"""Cost model of network-parallel training: which grid and which mode pay.

The model is measured on the cluster at hand (once per cluster and worker
set, then cached in the process):

* ``flop_rate[p]``: GEMM flop rate of one worker while ``p`` workers multiply
  at once (so that workers sharing cores show it), and the fixed cost of a
  small GEMM call;
* ``task_cost``: scheduler time per task when many run (throughput) and
  ``task_latency``: the time of one dependent hop (task done -> scheduler
  -> next task started on another worker);
* ``latency`` and ``bandwidth`` of a worker-to-worker block message.

From these, :meth:`CostModel.predict` gives the time per step of each grid
in graph mode (compute per cell + the step's tasks through the scheduler +
its chain of dependent hops + transfers) and in resident mode (compute per
cell + one message per block shift). ``grid="auto"`` takes the fastest
prediction; a ``1x1`` grid (a single worker) wins when no grid pays.
``mode="auto"`` takes graph mode when a block product lasts long enough to
hide a dependent hop (:data:`GRAPH_MIN_PRODUCT_HOPS` hops), resident mode
otherwise.

The timings themselves (:func:`gemm_probes`, :func:`task_seconds`,
:func:`hop_seconds`) are the cluster measurement the planner shares:
:func:`daskann.plan.measure_cluster` builds its description of the cluster
from the same functions, and :meth:`CostModel.from_cluster` reads such a
description back as a cost model.
"""

from __future__ import annotations

import math
import time
import uuid
from dataclasses import asdict, dataclass

import numpy as np

from daskann._blas import gemm_call_seconds, gemm_rate
from daskann._validation import invalid
from daskann.cluster import worker_addresses
from daskann.npt.grid import split_sizes

#: a block product must last this many dependent-task hops for graph mode to pay
GRAPH_MIN_PRODUCT_HOPS = 10.0
#: the paper's three nets, which ``daskann plan --net`` plans and ``daskann bench npt`` sweeps
#: (widths are not in the available text: these are ours)
PAPER_NETS = {
    "one-hidden": {"n_features": 64, "hidden": (128,), "n_outputs": 8},
    "two-hidden": {"n_features": 64, "hidden": (128, 128), "n_outputs": 8},
    "two-hidden-256": {"n_features": 64, "hidden": (256, 256), "n_outputs": 8},
}

_CACHE: dict = {}


@dataclass
class CostModel:
    """Measured costs of one cluster (seconds, flop/s, bytes/s).

    Attributes
    ----------
    flop_rate : dict
        ``{p: flop/s of one worker while p workers multiply at once}``.
    gemm_overhead : float
        Fixed seconds per GEMM call (small blocks).
    task_cost : float
        Scheduler seconds per task at full throughput.
    task_latency : float
        Seconds per dependent hop between workers.
    latency : float
        One-way seconds of a small worker-to-worker message.
    bandwidth : float
        Bytes per second of a worker-to-worker transfer.
    n_workers : int
        Workers of the cluster.
    """

    flop_rate: dict
    gemm_overhead: float
    task_cost: float
    task_latency: float
    latency: float
    bandwidth: float
    n_workers: int

    @classmethod
    def from_cluster(cls, cluster, n_workers: int) -> CostModel:
        """The cost model of a described cluster (:class:`daskann.plan.ClusterSpec`) on ``n_workers`` workers.

        Every worker multiplies at ``cluster.flop_rate``; a dependent hop is a
        task's scheduling (``task_overhead``) plus one message (``latency``),
        as :func:`daskann.plan.measure_cluster` splits the hop it measures.

        Parameters
        ----------
        cluster : ClusterSpec
            Read for ``flop_rate``, ``gemm_overhead``, ``task_overhead``,
            ``latency`` and ``bandwidth``.
        n_workers : int
            Workers the grids are predicted on.
        """
        top = max(n_workers, 2)
        return cls(
            flop_rate={1: cluster.flop_rate, top: cluster.flop_rate},
            gemm_overhead=cluster.gemm_overhead,
            task_cost=cluster.task_overhead,
            task_latency=cluster.task_overhead + cluster.latency,
            latency=cluster.latency,
            bandwidth=cluster.bandwidth,
            n_workers=n_workers,
        )

    def rate(self, busy: int) -> float:
        """Flop rate of one worker while ``busy`` workers multiply.

        Interpolates the cluster's aggregate rate ``p * flop_rate[p]``, not the
        per-worker rate: with 4 workers on 2 cores, 3 busy workers share the
        2 cores' throughput (the per-worker line would promise 1.5 cores' worth more).
        """
        known = sorted(self.flop_rate)
        if busy <= known[0]:
            return self.flop_rate[known[0]]
        for lo, hi in zip(known[:-1], known[1:], strict=True):
            if lo <= busy <= hi:
                f = (busy - lo) / (hi - lo)
                total = lo * self.flop_rate[lo] * (1 - f) + hi * self.flop_rate[hi] * f
                return total / busy
        # beyond the measured range: aggregate throughput stays flat
        top = known[-1]
        return self.flop_rate[top] * top / busy

    def to_dict(self) -> dict:
        d = asdict(self)
        d["flop_rate"] = {str(k): v for k, v in self.flop_rate.items()}
        return d

    # -- predictions -----------------------------------------------------------------
    def predict(
        self,
        sizes,
        batch_size: int,
        grid_shape,
        *,
        mode: str,
        itemsize: int = 8,
        n_workers: int | None = None,
        chains: int | None = None,
    ) -> float:
        """Predicted seconds per training step of ``sizes`` on a ``rows x cols`` grid.

        ``chains`` is graph mode's pipeline (accumulation chains per block product: 0 fused, 1
        single, 2 double); ``None`` takes the one graph mode picks (:func:`pipeline_chains`).
        """
        rows, cols = grid_shape
        cells = rows * cols
        workers = min(cells, n_workers or self.n_workers)
        cells_per_worker = math.ceil(cells / workers)
        products = step_products(sizes, batch_size)
        n_layers = len(sizes) - 1
        # the busiest worker's arithmetic, all its workers multiplying at once
        compute = sum(2.0 * m * k * n for m, k, n in products) * cells_per_worker / cells / self.rate(workers)
        if mode == "resident":
            q = math.lcm(rows, cols)
            virtual = q * q // workers
            calls = len(products) * q * virtual
            if cells == 1:
                return compute + calls * self.gemm_overhead
            exchange = 0.0
            for m, k, n in products:
                # a skew, then q steps that each pass a block of both operands on (overlapping the GEMMs)
                block = max(m * k, k * n) / (q * q) * itemsize
                exchange += (q + 1) * (self.latency + virtual * block / self.bandwidth)
            # small all-gathers per step: loss and cause of divergence, bias gradients, softmax statistics
            exchange += (2 + n_layers) * self.latency * math.ceil(math.log2(workers + 1))
            return compute + calls * self.gemm_overhead + exchange
        if mode != "graph":
            raise invalid("mode", mode, "'graph' or 'resident'")
        steps = _segments(rows, cols)
        if chains is None:
            chains = pipeline_chains(sizes, batch_size, grid_shape)
        per_cell = {0: 1, 1: steps, 2: steps + (1 if steps > 1 else 0)}[chains]
        hops_per_product = {0: 1, 1: steps, 2: (steps + 1) // 2 + (1 if steps > 1 else 0)}[chains]
        tasks = len(products) * cells * per_cell + cells + n_layers * cols
        if chains:
            tasks += n_layers * cells  # weight updates (fused into the gradient's last task when chains == 0)
        # critical path: forward, loss, backward through every layer, the first layer's gradient and update
        hops = (2 * n_layers) * hops_per_product + (1 if chains else 0) + 1
        calls = len(products) * steps * cells_per_worker
        transfer = 0.0
        if cells > 1:
            for m, k, n in products:
                # each cell receives the parts of its row panel of op(A) and column panel of op(B) it lacks
                received = ((m / rows) * k * (1 - 1 / cols) + k * (n / cols) * (1 - 1 / rows)) * itemsize
                transfer += received * cells_per_worker / self.bandwidth
            if chains == 2:
                transfer *= 0.5  # half of it hides behind the products
        # the scheduler handles every task; a worker waits on its chain of dependent hops
        return compute + calls * self.gemm_overhead + transfer + tasks * self.task_cost + hops * self.task_latency

    def product_seconds(self, sizes, batch_size: int, grid_shape, *, itemsize: int = 8) -> float:
        """Seconds of the largest single block product of a step on this grid."""
        rows, cols = grid_shape
        workers = min(rows * cols, self.n_workers)
        steps = _segments(rows, cols)
        largest = max(2.0 * m * k * n for m, k, n in step_products(sizes, batch_size))
        return largest / (rows * cols * steps) / self.rate(workers) + self.gemm_overhead

    def choose_mode(self, sizes, batch_size: int, grid_shape, *, itemsize: int = 8) -> str:
        """Graph mode when a block product hides :data:`GRAPH_MIN_PRODUCT_HOPS` dependent hops."""
        t = self.product_seconds(sizes, batch_size, grid_shape, itemsize=itemsize)
        return "graph" if t >= GRAPH_MIN_PRODUCT_HOPS * self.task_latency else "resident"

    def plan(
        self,
        sizes,
        batch_size: int,
        *,
        n_workers: int | None = None,
        mode: str = "auto",
        itemsize: int = 8,
        grids=None,
    ) -> list[dict]:
        """Prediction table: one row per candidate grid, fastest first."""
        n_workers = n_workers or self.n_workers
        rows = []
        for shape in grids or candidate_grids(n_workers):
            graph = self.predict(sizes, batch_size, shape, mode="graph", itemsize=itemsize, n_workers=n_workers)
            resident = self.predict(sizes, batch_size, shape, mode="resident", itemsize=itemsize, n_workers=n_workers)
            chosen = mode if mode != "auto" else self.choose_mode(sizes, batch_size, shape, itemsize=itemsize)
            rows.append(
                {
                    "grid": f"{shape[0]}x{shape[1]}",
                    "cells": shape[0] * shape[1],
                    "mode": chosen,
                    "graph_s": graph,
                    "resident_s": resident,
                    "block_product_s": self.product_seconds(sizes, batch_size, shape, itemsize=itemsize),
                    "predicted_s": graph if chosen == "graph" else resident,
                }
            )
        serial = next((r["predicted_s"] for r in rows if r["cells"] == 1), None)
        for r in rows:
            r["speedup"] = serial / r["predicted_s"] if serial else float("nan")
        return sorted(rows, key=lambda r: r["predicted_s"])


#: graph mode: a block product of at least this many flops runs as two accumulation
#: chains (transfers overlap products) ...
DOUBLE_BUFFER_MIN_FLOPS = 2e8
#: ... of at least this many as one chain of tasks, one per block product; smaller
#: ones are fused, one task per output block (a task costs the scheduler about a
#: millisecond, far more than such a product)
TASK_PER_PRODUCT_MIN_FLOPS = 5e7


def pipeline_chains(sizes, batch_size: int, grid_shape) -> int:
    """Graph mode's tasks per output block: 2 (double-buffered), 1 (one chain) or 0 (fused)."""
    rows, cols = grid_shape
    largest = max(2.0 * m * k * n for m, k, n in step_products(sizes, batch_size))
    block = largest / (rows * cols * _segments(rows, cols))
    if block >= DOUBLE_BUFFER_MIN_FLOPS:
        return 2
    return 1 if block >= TASK_PER_PRODUCT_MIN_FLOPS else 0


def step_products(sizes, batch_size: int) -> list[tuple[int, int, int]]:
    """``(m, k, n)`` of every matrix product of one training step."""
    out = []
    for layer, (n_in, n_out) in enumerate(zip(sizes[:-1], sizes[1:], strict=True)):
        out.append((batch_size, n_in, n_out))  # forward
        out.append((n_in, batch_size, n_out))  # weight gradient
        if layer > 0:
            out.append((batch_size, n_out, n_in))  # gradient of the layer input
    return out


def step_product_flops(sizes, batch_size: int) -> float:
    """Flops of the matrix products NPT runs in one training step.

    Forward, weight gradient and input gradient per layer, but for the first
    layer's input gradient, which nothing needs (see :func:`step_products`). The
    planner's :func:`daskann.plan._model.serial_step_flops` counts that one too,
    as :class:`daskann.SerialTrainer` computes it.
    """
    return float(sum(2.0 * m * k * n for m, k, n in step_products(sizes, batch_size)))


def _segments(rows: int, cols: int) -> int:
    """Cannon steps per product: the common refinement of a rows- and a cols-way split."""
    cuts = set()
    n = rows * cols * 64
    for parts in (rows, cols):
        edge = 0
        for size in split_sizes(n, parts):
            cuts.add(edge)
            edge += size
    return len(cuts)


def candidate_grids(n_workers: int) -> list[tuple[int, int]]:
    """Every ``rows x cols`` grid with at most ``n_workers`` cells, including ``1x1``."""
    return [(r, c) for r in range(1, n_workers + 1) for c in range(1, n_workers // r + 1)]


def choose_grid(
    model: CostModel,
    sizes,
    batch_size: int,
    *,
    mode: str = "auto",
    n_workers=None,
    itemsize: int = 8,
) -> tuple[tuple[int, int], str, list[dict]]:
    """The fastest predicted grid and its mode, and the whole table."""
    table = model.plan(sizes, batch_size, n_workers=n_workers, mode=mode, itemsize=itemsize)
    best = table[0]
    r, c = (int(x) for x in best["grid"].split("x"))
    return (r, c), best["mode"], table


# -- measuring -----------------------------------------------------------------------
# One function per measured quantity: the cost model (:func:`measure`) and the planner
# (:func:`daskann.plan.measure_cluster`) both time the cluster with these.
def measure(client, *, refresh: bool = False) -> CostModel:
    """Measure (or fetch from the cache) the cost model of ``client``'s cluster."""
    workers = worker_addresses(client)
    if not workers:
        raise invalid("client", "a cluster without workers", "a cluster with at least one worker")
    cache_key = (client.scheduler.address, tuple(workers))
    if not refresh and cache_key in _CACHE:
        return _CACHE[cache_key]
    flop_rate, calls = {}, []
    for p in worker_counts(len(workers), 7):
        probes = gemm_probes(client, workers[:p])
        flop_rate[p] = float(np.median([rate for rate, _ in probes]))
        calls += [call for _, call in probes]
    task_cost = task_seconds(client, n_tasks=120)
    task_latency = hop_seconds(client, workers)
    latency, bandwidth = _message_costs(client, workers, task_latency)
    model = CostModel(flop_rate, float(np.median(calls)), task_cost, task_latency, latency, bandwidth, len(workers))
    _CACHE[cache_key] = model
    return model


def worker_counts(n_workers: int, doublings: int) -> list[int]:
    """1, the powers of two below ``n_workers`` (up to ``2**doublings``) and ``n_workers``, ascending."""
    return sorted({1, n_workers} | {2**k for k in range(1, doublings + 1) if 2**k < n_workers})


def _gemm_probe(n: int = 256, seconds: float = 0.15, small: int = 8) -> tuple[float, float]:
    """Flop rate of ``n x n`` GEMMs and the time of a tiny GEMM call (runs on a worker)."""
    return gemm_rate(n, seconds=seconds), gemm_call_seconds(small)


def gemm_probes(client, workers, *, rounds: int = 1) -> list[tuple[float, float]]:
    """``(flop/s, seconds of a tiny GEMM call)`` of each of ``workers``, all multiplying at once.

    The workers probe together, so that workers sharing cores show it;
    ``rounds`` rounds give ``rounds * len(workers)`` pairs.

    Parameters
    ----------
    client : distributed.Client
    workers : list of str
        Worker addresses that probe together.
    rounds : int
        Rounds of probes, one after the other.
    """
    return [v for _ in range(rounds) for v in client.run(_gemm_probe, workers=list(workers)).values()]


def _noop(*args):
    return None


def _payload(nbytes: int, *deps):
    return np.ones(max(nbytes // 8, 1))


def task_seconds(client, *, n_tasks: int = 120) -> float:
    """Wall seconds per task of a batch of ``n_tasks`` no-op tasks: the scheduler's throughput.

    A few tasks first warm the workers up (the function shipped, the task
    path taken once), so the batch times the scheduler alone.

    Parameters
    ----------
    client : distributed.Client
    n_tasks : int
        Tasks of the timed batch.
    """
    prefix = f"daskann-measure-{uuid.uuid4().hex[:10]}"
    client.gather(client.map(_noop, range(8), key=[f"{prefix}-warm-{k}" for k in range(8)], pure=False))
    t0 = time.perf_counter()
    futures = client.map(_noop, range(n_tasks), key=[f"{prefix}-batch-{k}" for k in range(n_tasks)], pure=False)
    client.gather(futures)
    return (time.perf_counter() - t0) / n_tasks


def hop_seconds(client, workers, nbytes: int = 8, *, hops: int = 16, repeats: int = 3) -> float:
    """Seconds of one dependent hop between two of ``workers``, each task returning ``nbytes``.

    A hop is a task done, the scheduler told, the next task started on the
    other worker and the result moved to it; the median of ``repeats``
    chains of ``hops`` hops, as a busy machine stalls single hops.

    Parameters
    ----------
    client : distributed.Client
    workers : list of str
        Worker addresses; the first two take turns (the one, on one worker).
    nbytes : int
        Bytes each task returns, moved to the next worker.
    hops : int
        Hops of one chain.
    repeats : int
        Chains timed; the median is returned.
    """
    pair = list(workers[:2]) if len(workers) > 1 else list(workers) * 2
    prefix = f"daskann-measure-{uuid.uuid4().hex[:10]}"

    def chain(tag: int) -> float:
        prev = None
        t0 = time.perf_counter()
        for k in range(hops):
            deps = [prev] if prev is not None else []
            prev = client.submit(
                _payload, nbytes, *deps, key=f"{prefix}-{tag}-{k}", workers=[pair[k % 2]], allow_other_workers=False
            )
        prev.result()
        return (time.perf_counter() - t0) / hops

    return float(np.median([chain(r) for r in range(repeats)]))


def _message_costs(client, workers, task_latency: float, nbytes: int = 8 * 2**20) -> tuple[float, float]:
    """One-way seconds and bytes/s of a direct worker-to-worker message (resident mode's exchange)."""
    if len(workers) < 2:
        return task_latency, 1e9
    # imported on first use, so that importing the cost model does not load the resident engine
    from daskann.npt.resident import exchange_latency

    times = exchange_latency(client, sizes=[8192, nbytes], repeats=5, workers=workers[:2])
    small, large = times[8192], times[nbytes]
    return float(small), float(nbytes / max(large - small, 1e-6))


def format_table(table: list[dict]) -> str:
    """The prediction table as text."""
    lines = [
        f"{'grid':>6} {'cells':>5} {'mode':>9} {'predicted s/step':>17} {'graph s':>10} {'resident s':>11} "
        f"{'block product s':>16} {'speedup':>8}"
    ]
    for r in table:
        lines.append(
            f"{r['grid']:>6} {r['cells']:>5} {r['mode']:>9} {r['predicted_s']:>17.4g} {r['graph_s']:>10.4g} "
            f"{r['resident_s']:>11.4g} {r['block_product_s']:>16.3g} {r['speedup']:>8.3g}"
        )
    return "\n".join(lines)
