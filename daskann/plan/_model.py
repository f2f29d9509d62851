"""Predicted training time of every method on a described cluster.

Every prediction is built from the same few numbers (:class:`ClusterSpec`):

* a training step of a net costs its GEMM flops over ``flop_rate``, plus
  ``gemm_overhead`` per GEMM call, ``layer_overhead`` per layer,
  ``element_time`` per number touched outside the GEMMs and the trainer's
  ``step_overhead``; this is also :class:`daskann.SerialTrainer`'s time, the
  reference of every speedup;
* NPT: the grid cost model of :mod:`daskann.npt.costmodel` fed with the
  cluster's numbers, over every grid that fits ``p`` workers, in graph and
  resident mode (resident alone on an MPI-like runtime), plus the step's
  non-GEMM work and its bookkeeping (the resident program's where measured);
* MGRIT: the solver's own task graphs (:class:`daskann.mgrit._plan.Planner`)
  with each task's work in seconds plus its measured cost as a task (or its
  task overhead, one message and its store reads and writes) and the bytes of
  the states it reads, placed on ``p`` workers as dask places tasks
  (:func:`placed_makespan`; list-scheduled by
  :func:`daskann.mgrit.workmodel.makespan` on an MPI-like runtime), times the
  iteration count;
* partition: ``k`` sub-models of width ``h / k`` (hidden-to-hidden products
  shrink by ``k**2``) trained for a share ``1 - finetune_fraction`` of the
  steps in ``ceil(k / p)`` waves of tasks, the merge, the remaining steps on
  the full net, and the run's own cost (measured, or a task and two messages
  per wave).
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field, replace

from daskann.mgrit import workmodel
from daskann.mgrit._levels import check_hierarchy
from daskann.mgrit._plan import Planner, block_sizes
from daskann.mgrit.presets import resolve_preset
from daskann.npt.costmodel import CostModel, candidate_grids
from daskann.plan._cluster import ClusterSpec
from daskann.plan._report import FINETUNE_FRACTION

#: MGRIT iterations added per doubling of the steps beyond the pilot's
ITERATION_GROWTH_PER_DOUBLING = 1.0


@dataclass(frozen=True)
class Network:
    """What the models need to know about a training run.

    Attributes
    ----------
    sizes : tuple of int
        Layer widths, input to output.
    batch_size : int
    steps : int
        Training steps of the whole run.
    n_samples : int
        Rows of the training data (moved to the workers once).
    itemsize : int
        Bytes per number.
    momentum : bool
        Whether the optimiser state carries a velocity (doubles MGRIT's states).
    name : str
    """

    sizes: tuple
    batch_size: int
    steps: int
    n_samples: int = 1024
    itemsize: int = 8
    momentum: bool = True
    name: str = "net"

    @property
    def n_layers(self) -> int:
        return len(self.sizes) - 1

    @property
    def n_params(self) -> int:
        return n_params(self.sizes)

    def data_bytes(self) -> int:
        return self.n_samples * (self.sizes[0] + self.sizes[-1]) * self.itemsize


def n_params(sizes) -> int:
    """Weights and biases of a net of layer widths ``sizes``."""
    return sum((a + 1) * b for a, b in zip(sizes[:-1], sizes[1:], strict=True))


def serial_step_flops(sizes, batch_size: int) -> float:
    """GEMM flops of one :class:`SerialTrainer` step: forward, weight gradient and input gradient per layer.

    The first layer's input gradient included, as the serial trainer computes it
    (:func:`daskann.npt.costmodel.step_product_flops`, NPT's count, leaves it out).
    """
    return sum(6.0 * batch_size * a * b for a, b in zip(sizes[:-1], sizes[1:], strict=True))


def step_elements(sizes, batch_size: int) -> float:
    """Numbers a training step touches outside its GEMMs: every layer's rows of activations and every parameter."""
    return float(batch_size * sum(sizes) + n_params(sizes))


def serial_step_seconds(sizes, batch_size: int, cluster: ClusterSpec) -> float:
    """Seconds of one :class:`SerialTrainer` step on one worker."""
    n_layers = len(sizes) - 1
    return (
        serial_step_flops(sizes, batch_size) / cluster.flop_rate
        + 3 * n_layers * cluster.gemm_overhead
        + n_layers * cluster.layer_overhead
        + step_elements(sizes, batch_size) * cluster.element_time
        + cluster.step_overhead
    )


@dataclass
class Prediction:
    """One row of the plan: a method on ``workers`` workers at its best configuration."""

    method: str
    net: str
    workers: int
    seconds: float
    seconds_per_step: float
    speedup: float
    config: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {
            "method": self.method,
            "net": self.net,
            "workers": self.workers,
            "seconds": self.seconds,
            "seconds_per_step": self.seconds_per_step,
            "speedup": self.speedup,
            "config": dict(self.config),
        }


def _row(method: str, net: Network, p: int, seconds: float, cluster: ClusterSpec, config: dict) -> Prediction:
    """The prediction of ``seconds`` for ``net``, its speedup over serial training on ``cluster``."""
    serial_step = serial_step_seconds(net.sizes, net.batch_size, cluster)
    return Prediction(method, net.name, p, seconds, seconds / net.steps, net.steps * serial_step / seconds, config)


# -- NPT ------------------------------------------------------------------------------------
def npt_step_seconds(net: Network, cluster: ClusterSpec, p: int, shape, mode: str) -> float:
    """Seconds of one NPT step on a ``rows x cols`` grid over ``p`` workers in ``mode``.

    The grid cost model's products, messages and tasks, plus the step's
    non-GEMM work: its layers' and its numbers' share on the busiest worker,
    and the bookkeeping of a step (the resident cell program's where it was
    measured, else a trainer's).
    """
    model = CostModel.from_cluster(cluster, p)
    t = model.predict(net.sizes, net.batch_size, shape, mode=mode, itemsize=net.itemsize, n_workers=p)
    elements = step_elements(net.sizes, net.batch_size) * cluster.element_time / min(shape[0] * shape[1], p)
    bookkeeping = cluster.step_overhead
    if mode == "resident" and cluster.resident_step_overhead > 0:
        bookkeeping = cluster.resident_step_overhead
    return t + net.n_layers * cluster.layer_overhead + elements + bookkeeping


def predict_npt(net: Network, cluster: ClusterSpec, p: int, *, square: bool = False) -> Prediction:
    """The fastest grid and mode on ``p`` workers (grids of at most ``p`` cells).

    On an MPI-like runtime (``task_overhead`` 0) NPT is the message-passing
    program of resident mode: graph mode's task graph has no counterpart
    there (its model would count the hops of a step's dependent tasks but no
    message per block shift). ``square=True`` keeps to ``q x q`` grids, the
    shape of a plain Cannon. The time is the steps' alone: a fit's set-up
    (the grid's placement, the data's and weights' distribution) is not
    counted, as ``--validate`` measures it (the difference of a long and a
    short run).
    """
    modes = ("resident",) if cluster.task_overhead == 0 else ("graph", "resident")
    shapes = [s for s in candidate_grids(p) if s[0] == s[1] or not square]
    per_step, (rows, cols), mode = min(
        (npt_step_seconds(net, cluster, p, shape, mode), shape, mode) for shape in shapes for mode in modes
    )
    return _row("npt", net, p, per_step * net.steps, cluster, {"grid": f"{rows}x{cols}", "mode": mode})


# -- MGRIT ----------------------------------------------------------------------------------
class _Timed:
    """A work-model task with its cost in seconds."""

    __slots__ = ("key", "cost", "deps")

    def __init__(self, key, cost, deps):
        self.key, self.cost, self.deps = key, cost, deps


def mgrit_configs(steps: int, preset: str = "solver2") -> list[dict]:
    """Levels and coarsening factors worth comparing for ``steps`` steps (coarsest level at least 2 steps)."""
    out = []
    for cfactor in (2, 4, 8):
        deepest = 1
        while steps // cfactor**deepest >= 2 and deepest < 16:
            deepest += 1
        if deepest < 2:
            continue
        # two and three levels, and the deepest hierarchy (the paper's): the cheapest and the most parallel
        for levels in sorted({min(2, deepest), min(3, deepest), deepest}):
            out.append({"preset": preset, "levels": levels, "cfactor": cfactor})
    return out


def mgrit_iteration_seconds(net: Network, cluster: ClusterSpec, p: int, config: dict) -> tuple[float, float]:
    """Seconds of MGRIT's first and of every later iteration on ``p`` workers."""
    options = resolve_preset(config["preset"], levels=config["levels"], cfactor=config["cfactor"])
    hierarchy = check_hierarchy(net.steps, config["levels"], config["cfactor"])
    n = hierarchy.n_levels - 1
    if cluster.task_overhead == 0:
        # an MPI-like runtime: each worker relaxes one contiguous block of intervals per sweep
        blocks = tuple(max(1, -(-hierarchy.n_intervals(lvl) // p)) for lvl in range(n))
    else:
        blocks = block_sizes(hierarchy, "auto")  # what MGRITTrainer submits
    coarse = float(options["substeps"] * options["coarse_batches"])
    planner = Planner(
        hierarchy,
        {
            "cf_iter": (options["cf_iter"],) * n,
            "weight_c": (1.0,) * n,
            "cycle_type": options["cycle_type"],
            "store_fine": False,
            "blocks": blocks,
        },
        lambda level: 1.0 if level == 0 else coarse,
        "plan",
    )
    step = serial_step_seconds(net.sizes, net.batch_size, cluster)
    state_bytes = net.n_params * net.itemsize * (2 if net.momentum else 1)
    out = []
    for k in (1, 2):
        tasks = planner.iteration(k)
        timed = [
            _Timed(t.key, t.cost * step + _mgrit_task_seconds(cluster, len(t.deps), state_bytes), t.deps) for t in tasks
        ]
        # the residual norm is gathered to the client and the iteration committed to the store
        reduce = cluster.latency * math.ceil(math.log2(p + 1)) + 2 * cluster.task_overhead
        schedule = workmodel.makespan if cluster.task_overhead == 0 else placed_makespan
        out.append(schedule(timed, p) + reduce)
    return out[0], out[1]


def placed_makespan(tasks, workers: int) -> float:
    """Finish time of ``tasks`` on ``workers`` workers placed as dask's scheduler places them.

    A task runs, once its inputs are done, on the worker free first among
    those that hold one of its inputs (dask moves tasks to their data, not
    data to idle workers), a task without inputs on the worker free first; a
    worker that ran a task holds its inputs from then on too. Tasks that all
    read one result (MGRIT's sweep after a coarse solve) so run one after the
    other, which a plain list schedule would spread over every worker.
    """
    order = {t.key: i for i, t in enumerate(tasks)}
    children: dict = {t.key: [] for t in tasks}
    for t in tasks:
        for d in t.deps:
            children[d].append(t)
    waiting = {t.key: len(t.deps) for t in tasks}
    ready_at = {t.key: 0.0 for t in tasks}
    ready = [(0.0, order[t.key], t) for t in tasks if not t.deps]
    heapq.heapify(ready)
    free = [0.0] * workers
    holders: dict = {}
    finish = 0.0
    while ready:
        at, _, task = heapq.heappop(ready)
        candidates = {w for d in task.deps for w in holders[d]} or range(workers)
        worker = min(candidates, key=lambda w: (max(free[w], at), w))
        end = max(free[worker], at) + task.cost
        free[worker], finish = end, max(finish, end)
        holders[task.key] = {worker}
        for d in task.deps:
            holders[d].add(worker)
        for child in children[task.key]:
            ready_at[child.key] = max(ready_at[child.key], end)
            waiting[child.key] -= 1
            if waiting[child.key] == 0:
                heapq.heappush(ready, (ready_at[child.key], order[child.key], child))
    return finish


def _mgrit_task_seconds(cluster: ClusterSpec, n_deps: int, state_bytes: float) -> float:
    """Seconds of one MGRIT task beyond its steps: measured whole, or built from the cluster's parts."""
    moved = (n_deps + 1) * state_bytes / cluster.bandwidth
    if cluster.mgrit_task_overhead > 0:
        return cluster.mgrit_task_overhead + moved
    return (
        cluster.task_overhead
        + (cluster.latency if n_deps else 0.0)  # its inputs arrive as a message
        + moved
        + (n_deps + 2) * cluster.store_overhead  # its states read from and written to the store
    )


def predict_mgrit(net: Network, cluster: ClusterSpec, p: int, configs: list[dict]) -> Prediction | None:
    """The fastest of ``configs`` (each with its ``iterations``) on ``p`` workers.

    A configuration's own measured task cost (``task_overhead_s``, timed on
    its graphs) replaces the cluster's ``mgrit_task_overhead``.
    """
    best = None
    for config in configs:
        iterations = config.get("iterations")
        if iterations is None:
            continue
        own = cluster
        if "task_overhead_s" in config:
            own = replace(cluster, mgrit_task_overhead=config["task_overhead_s"])
        first, later = mgrit_iteration_seconds(net, own, p, config)
        seconds = first + (iterations - 1) * later
        if best is None or seconds < best[0]:
            best = (seconds, config)
    if best is None:
        return None
    return _row("mgrit", net, p, best[0], cluster, dict(best[1]))


def grown_iterations(pilot_iterations: int, pilot_steps: int, steps: int) -> int:
    """Iterations at ``steps`` from a pilot solve of ``pilot_steps`` (a slow growth per doubling)."""
    doublings = max(0.0, math.log2(steps / pilot_steps))
    return int(math.ceil(pilot_iterations + ITERATION_GROWTH_PER_DOUBLING * doublings))


def paper_potential_speedup(n_steps: int, iterations: int, *, cfactor: int = 2, max_coarse: int = 10) -> dict:
    """Schroder's potential speedup of a V-cycle (eqs. 16-17): ``N / (niter * (17 + 8 * (L - 2)))``."""
    levels, points = 1, n_steps
    while points > max_coarse or levels < 2:
        points //= cfactor
        levels += 1
    sigma = iterations * (17 + 8 * (levels - 2))
    return {"levels": levels, "sigma_V": sigma, "speedup": n_steps / sigma}


# -- partition ------------------------------------------------------------------------------
def partition_ks(net: Network, p: int) -> list[int]:
    """Sub-model counts worth trying on ``p`` workers: powers of two and ``p`` itself, up to the narrowest layer."""
    narrowest = min(net.sizes[1:-1]) if net.n_layers > 1 else 0
    ks = {2**e for e in range(1, 12)} | {p}
    return sorted(k for k in ks if 2 <= k <= narrowest)


def partition_seconds(net: Network, cluster: ClusterSpec, p: int, k: int, finetune_fraction: float) -> float:
    """Seconds of partitioned training with ``k`` sub-models on ``p`` workers.

    The run's own cost (scheduling the sub-model tasks, collecting their
    results, starting the fine-tuning) is ``partition_overhead`` where it was
    measured, else one task overhead and two messages per wave of tasks.
    """
    hidden = tuple(-(-h // k) for h in net.sizes[1:-1])
    sub_sizes = (net.sizes[0], *hidden, net.sizes[-1])
    steps = partition_config(net, k, finetune_fraction)
    sub_steps, finetune = steps["sub_steps"], steps["finetune_steps"]
    # each sub-model is one task: a trainer trains it, the data goes out, the trained sub-model comes back
    task = (
        cluster.fit_overhead
        + sub_steps * serial_step_seconds(sub_sizes, net.batch_size, cluster)
        + (net.data_bytes() + n_params(sub_sizes) * net.itemsize) / cluster.bandwidth
    )
    waves = math.ceil(k / p)
    merge = net.n_params * net.itemsize / cluster.bandwidth + net.n_layers * cluster.layer_overhead
    tune = cluster.fit_overhead + finetune * serial_step_seconds(net.sizes, net.batch_size, cluster)
    own = cluster.partition_overhead or waves * (cluster.task_overhead + 2 * cluster.latency)
    return waves * task + merge + tune + own


def predict_partition(
    net: Network, cluster: ClusterSpec, p: int, *, finetune_fraction: float = FINETUNE_FRACTION
) -> Prediction | None:
    """The best ``k`` on ``p`` workers (None for a net without a hidden layer to split)."""
    ks = partition_ks(net, p)
    if not ks:
        return None
    seconds, k = min((partition_seconds(net, cluster, p, k, finetune_fraction), k) for k in ks)
    return _row("partition", net, p, seconds, cluster, partition_config(net, k, finetune_fraction))


def partition_config(net: Network, k: int, finetune_fraction: float = FINETUNE_FRACTION) -> dict:
    """``k`` and the steps :func:`partition_seconds` splits ``net.steps`` into: sub-models' and fine-tuning's."""
    finetune = max(1, round(finetune_fraction * net.steps))
    return {"k": k, "sub_steps": max(net.steps - finetune, 1), "finetune_steps": finetune}
