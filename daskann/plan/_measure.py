"""The planner's cluster measured live: GEMM rate, messages, tasks, and short pilot runs of each method.

:func:`measure_cluster` fills a :class:`~daskann.plan._cluster.ClusterSpec`
from timed work on the cluster at hand (the GEMM, task and hop timings of
:mod:`daskann.npt.costmodel`, which NPT's cost model reads too); the
pilots' costs are what the models of :mod:`daskann.plan._model` leave out,
so this module reads those models.
"""

from __future__ import annotations

import tempfile
import time
import warnings
from dataclasses import replace

import dask
import numpy as np
import zarr

from daskann._blas import gemm_call_seconds
from daskann._validation import invalid
from daskann.cluster import worker_addresses
from daskann.mgrit import MGRITTrainer
from daskann.nn import MLP, SGD
from daskann.npt import NPTTrainer
from daskann.npt.costmodel import gemm_probes, hop_seconds, task_seconds, worker_counts
from daskann.partition import PartitionTrainer
from daskann.plan._cluster import ClusterSpec
from daskann.plan._model import (
    Network,
    mgrit_iteration_seconds,
    npt_step_seconds,
    partition_seconds,
    serial_step_seconds,
    step_elements,
)
from daskann.serial import SerialTrainer


def _small_costs(repeats: int = 300, blocks: int = 7) -> tuple[float, float]:
    """Seconds of a tiny GEMM call and of one tiny layer's non-GEMM work in a training step.

    Each is the median of ``blocks`` timed blocks of calls: a block lasts
    milliseconds, so that one time slice lost to other work on the machine
    would multiply a single one.
    """
    gemm = float(np.median([gemm_call_seconds(8, repeats) for _ in range(blocks)]))
    rng = np.random.default_rng(0)
    sizes = (8, 8, 8, 8, 8)
    model = MLP(sizes, seed=0)
    opt = SGD(0.01, 0.9)
    X, y = rng.standard_normal((8, 8)), rng.standard_normal((8, 8))
    state = opt.init_state(model.params)

    def steps() -> float:
        t0 = time.perf_counter()
        for _ in range(repeats // 3):
            _, grad_w, grad_b = model.loss_and_gradients(X, y, "mse")
            opt.step(model.params, model.interleave(grad_w, grad_b), state)
        return (time.perf_counter() - t0) / (repeats // 3)

    step = float(np.median([steps() for _ in range(blocks)]))
    n_products = 3 * (len(sizes) - 1)  # the first layer's input gradient is computed too
    return gemm, max(step - n_products * gemm, 0.0) / (len(sizes) - 1)


def _trainer_costs(
    flop_rate: float, gemm: float, layer: float, sizes=(64, 64, 64), batch_size: int = 64, *, repeats: int = 5
) -> tuple:
    """A trainer's ``step_overhead``, ``element_time`` and ``fit_overhead``, from real :class:`SerialTrainer` fits.

    Two nets of the same depth, a tiny one and ``sizes`` (the planned net
    where there is one), are fitted for 1 step and for about 0.2 s more: the tiny
    net's step beyond its GEMMs and layers is the bookkeeping, the other's
    step beyond that the work per number touched, and a one-step fit beyond
    its step the set-up.
    """
    base = ClusterSpec((1,), flop_rate, 1.0, 1.0, 0.0, gemm_overhead=gemm, layer_overhead=layer)
    rng = np.random.default_rng(0)

    def per_step(sizes, batch: int) -> tuple[float, float]:
        X, y = rng.standard_normal((4 * batch, sizes[0])), rng.standard_normal((4 * batch, sizes[-1]))
        # about 0.2 s of steps, at least 20
        steps = max(20, min(200, int(0.2 / max(serial_step_seconds(sizes, batch, base), 1e-9))))

        def fit(n: int) -> float:
            t0 = time.perf_counter()
            SerialTrainer(sizes[1:-1], lr=1e-3, batch_size=batch).fit(X, y, steps=n)
            return time.perf_counter() - t0

        fit(1)  # imports and caches
        # the median of a few, short and long in turn: the runs predicted share the machine with its other work
        walls = np.median([(fit(1), fit(1 + steps)) for _ in range(repeats)], axis=0)
        short, long = float(walls[0]), float(walls[1])
        return short, max(long - short, 0.0) / steps

    tiny_sizes = (8,) * len(sizes)
    short, tiny = per_step(tiny_sizes, 8)
    _, wide = per_step(sizes, batch_size)
    step_overhead = max(tiny - serial_step_seconds(tiny_sizes, 8, base), 0.0)
    extra = wide - serial_step_seconds(sizes, batch_size, base) - step_overhead
    element_time = max(extra, 0.0) / step_elements(sizes, batch_size)
    return step_overhead, element_time, max(short - tiny, 0.0)


def _calibration_net(net, flop_rate: float, gemm: float, layer: float, *, longest: float = 2e-3) -> tuple:
    """Sizes and batch whose steps :func:`_trainer_costs` times: the planned net's if a step is quick, else 64-wide."""
    if net is not None:
        quick = ClusterSpec((1,), flop_rate, 1.0, 1.0, 0.0, gemm_overhead=gemm, layer_overhead=layer)
        if serial_step_seconds(net.sizes, net.batch_size, quick) < longest:
            return tuple(net.sizes), net.batch_size
    return (64, 64, 64), 64


def _pilot_net(net, steps: int, cluster: ClusterSpec, *, runs: float, budget: float = 1.0):
    """The net a pilot trains, its data and its trainer settings.

    ``net``'s layers where ``runs`` times ``steps`` of its steps take at most
    ``budget`` seconds (a pilot should cost a second or two, not a training
    run: a large net's costs are its arithmetic, which is measured apart),
    else a tiny net.
    """
    if (
        net is None
        or net.n_layers < 2
        or min(net.sizes[1:-1]) < 2
        or runs * steps * serial_step_seconds(net.sizes, net.batch_size, cluster) > budget
    ):
        net = Network((8, 8, 2), 8, steps, n_samples=256, momentum=False, name="tiny")
    net = replace(net, steps=steps)
    rng = np.random.default_rng(0)
    X = rng.standard_normal((net.n_samples, net.sizes[0]))
    y = rng.standard_normal((net.n_samples, net.sizes[-1]))
    dtype = "float32" if net.itemsize == 4 else "float64"
    settings = {
        "lr": 1e-3,
        "batch_size": net.batch_size,
        "network": {"dtype": dtype},
        "sgd": {"momentum": 0.9 if net.momentum else 0.0},
    }
    return net, X.astype(dtype), y.astype(dtype), settings


def _mgrit_task_cost(
    client, cluster: ClusterSpec, net=None, *, steps: int = 64, iterations: int = 4, config: dict | None = None
) -> float:
    """Seconds of one MGRIT task beyond its steps, from a short solve on the live cluster.

    The solve trains ``net``'s layers (a tiny net without one), so its tasks
    read, write and return states of the size the user's run moves, at
    ``config`` (preset, levels, cfactor; ``solver2`` on 2 levels coarsened
    by 4 without it). The later iterations' median time is matched by the
    work model's schedule of the same graphs on the cluster's workers: the
    per-task cost at which they agree includes what no-op tasks miss (the
    trajectory store's reads and writes, the tasks' real arguments and
    results, the graph's scheduling).
    """
    net, X, y, settings = _pilot_net(net, steps, cluster, runs=3 * iterations)  # about three sweeps an iteration
    config = config or {"preset": "solver2", "levels": 2, "cfactor": 4}
    config = {k: config[k] for k in ("preset", "levels", "cfactor")}
    # every iteration, whatever it costs: the pilot's convergence does not matter, its timing does
    solver = {"max_iter": iterations, "tol": 1e-300}
    trainer = fit_mgrit(net.sizes[1:-1], X, y, settings, steps, config, solver, client=client)
    times = trainer.result_.iteration_times
    measured = float(np.median(times[1:] if len(times) > 1 else times))  # the first also warms the workers up
    p = len(worker_addresses(client))

    def later(cost: float) -> float:
        return mgrit_iteration_seconds(net, replace(cluster, mgrit_task_overhead=cost), p, config)[1]

    lo, hi = 1e-9, 1.0
    if later(lo) >= measured:
        return lo
    while later(hi) < measured:
        hi *= 4
    for _ in range(40):  # the schedule grows with the per-task cost: bisect
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if later(mid) < measured else (lo, mid)
    return 0.5 * (lo + hi)


def fit_mgrit(hidden, X, y, settings: dict, steps: int, config: dict, solver: dict, **kwargs) -> MGRITTrainer:
    """An :class:`MGRITTrainer` at ``config`` (``preset``, ``levels``, ``cfactor``) fitted for ``steps`` steps.

    ``solver`` adds to the solver options, ``kwargs`` to the trainer's. The solve runs
    whatever it costs (``daskann.mgrit.solve: study``, the solve a plan predicts), its
    warnings silenced.
    """
    solver = {"levels": config["levels"], "cfactor": config["cfactor"], **solver}
    trainer = MGRITTrainer(hidden, **settings, preset=config["preset"], solver=solver, **kwargs)
    with warnings.catch_warnings(), dask.config.set({"daskann.mgrit.solve": "study"}):
        warnings.simplefilter("ignore")
        trainer.fit(X, y, steps=steps)
    return trainer


def calibrate_mgrit(client, cluster: ClusterSpec, net, configs: list[dict], *, most_steps: int = 256) -> list[dict]:
    """``configs`` with each one's own MGRIT task cost (``task_overhead_s``), from a short solve at it.

    A preset's graphs differ (F- or FCF-relaxation, the tasks' sizes), and
    so does what a task costs beyond its steps: each configuration is timed
    on its own graphs, at the run's steps (at most ``most_steps``), rather
    than at the one ``cluster.mgrit_task_overhead`` was measured at.
    """
    steps = min(net.steps, most_steps)
    out = []
    for config in configs:
        levels, cfactor = config["levels"], config["cfactor"]
        if steps // cfactor ** (levels - 1) < 2:
            out.append(dict(config))
            continue
        cost = _mgrit_task_cost(client, cluster, net, steps=steps, config=config)
        out.append({**config, "task_overhead_s": cost})
    return out


def _partition_overhead(client, cluster: ClusterSpec, net=None, *, steps: int = 8, repeats: int = 3) -> float:
    """Seconds of a partitioned run beyond what the model counts, from short runs on the live cluster.

    Two sub-models of ``net`` (a tiny net without a hidden layer to split)
    and the fine-tuning train ``steps`` steps each on data of ``net``'s size;
    what the three phases take beyond the model's trainers, steps and
    transfers is the run's own cost: the sub-model tasks scheduled, their
    results (with their histories) collected, the fine-tuner started.
    """
    net, X, y, settings = _pilot_net(net, 2 * steps, cluster, runs=repeats)
    config = {"k": 2, "sub_steps": steps, "finetune_steps": steps}
    spent = [partition_phases(client, net.sizes[1:-1], X, y, settings, config) for _ in range(repeats)]
    p = len(worker_addresses(client))
    # the model's training and transfers alone: a negligible own cost stands in for the one measured here
    tiny = 1e-12
    work = partition_seconds(net, replace(cluster, partition_overhead=tiny), p, 2, 0.5) - tiny
    return max(float(np.median(spent)) - work, 1e-9)


def partition_phases(client, hidden, X, y, settings: dict, config: dict) -> float:
    """Seconds of the three phases (sub-models, merge, fine-tuning) of a partitioned run at ``config``."""
    trainer = PartitionTrainer(
        hidden, **settings, k=config["k"], split={"sub_steps": config["sub_steps"]}, client=client
    )
    trainer.fit(X, y, steps=config["finetune_steps"])
    return sum(trainer.timings_[phase] for phase in ("submodel", "merge", "finetune"))


def _resident_step_cost(
    client, cluster: ClusterSpec, net=None, *, steps: int = 200, repeats: int = 3, seconds: float = 0.2
) -> float:
    """Seconds of an NPT resident-mode step's bookkeeping, from short resident fits on the live cluster.

    ``net``'s layers (a tiny net where its steps are slow) train on a 1x1
    grid for ``steps`` steps, or as many as take about ``seconds`` (up to 20
    times more: a fit's set-up, which varies with other load, would swamp
    fewer), and three times as many (:func:`npt_step_walls`, the measure
    ``--validate`` compares with); what a step costs beyond the model's
    products and its work per layer and per number is the cell program's
    loop, not a :class:`SerialTrainer` step's bookkeeping.
    """
    # the planned net where ``steps`` of its steps fit in ``seconds``: a tiny net's bookkeeping leaves out what
    # the planned net's layers cost beyond the model's
    net, X, y, settings = _pilot_net(net, steps, cluster, runs=4 * repeats, budget=4 * repeats * seconds)
    tiny = 1e-12  # the model's step without bookkeeping: a negligible one stands in for the one measured here
    modelled = npt_step_seconds(net, replace(cluster, resident_step_overhead=tiny), 1, (1, 1), "resident") - tiny
    # a trainer's bookkeeping stands in for the cell program's in the estimate of a step's time
    steps = min(max(steps, int(seconds / (modelled + cluster.step_overhead))), 20 * steps)
    config = {"grid": "1x1", "mode": "resident"}
    measured = npt_step_walls(client, net.sizes[1:-1], X, y, settings, steps, config, repeats=repeats)
    return max(measured - modelled, 1e-9)


def _store_cost(repeats: int = 20) -> float:
    """Seconds of one small chunk written or read in a zarr store on local disk, the store opened each time."""
    with tempfile.TemporaryDirectory() as folder:
        zarr.open_array(f"{folder}/a.zarr", mode="w", shape=(repeats, 1024), chunks=(1, 1024), dtype="f8")
        row = np.ones(1024)
        t0 = time.perf_counter()
        for k in range(repeats):
            # a task opens the trajectory store, as MGRIT's tasks do
            zarr.open_array(f"{folder}/a.zarr", mode="r+")[k] = row
            zarr.open_array(f"{folder}/a.zarr", mode="r")[k]
        return (time.perf_counter() - t0) / (2 * repeats)


def measure_cluster(client, *, workers=None, n_tasks: int = 200, net=None) -> ClusterSpec:
    """Measure a live cluster: GEMM rate, message latency, link bandwidth, per-task costs.

    Small timed GEMMs run on every worker at once (so workers sharing cores
    show it); short :class:`SerialTrainer` fits on every worker at once give
    a training step's costs beyond its GEMMs; a chain of dependent tiny tasks alternating
    between two workers gives the per-message latency; a few MB moved between
    them the bandwidth; a batch of no-op tasks the scheduler's cost per task;
    a short MGRIT solve the cost of a real MGRIT task, short partitioned
    runs what a partitioned run costs beyond its training, and short NPT
    fits on a 1x1 grid in resident mode the cell program's cost per step.

    Parameters
    ----------
    client : distributed.Client
    workers : ignored
    n_tasks : int
        No-op tasks timed for the per-task cost.
    net : Network, optional
        The net the pilots train (so that their tasks move states and data of
        its size); a tiny net without it.
    """
    names = sorted(worker_addresses(client))
    if not names:
        raise invalid("client", "a cluster without workers", "a cluster with at least one worker")
    # the machine's rate: other load on it only ever lowers a sample
    flop_rate = max(rate for rate, _ in gemm_probes(client, names, rounds=3))
    per_step = step_costs(client, flop_rate, net)
    store = float(next(iter(client.run(_store_cost, workers=names[:1]).values())))
    task_overhead = task_seconds(client, n_tasks=n_tasks) * len(names)  # the tasks ran side by side
    hop, bandwidth = _links(client, names)
    # a dependent hop is a task's scheduling plus one message: keep the message's share
    latency = max(hop - task_overhead, 1e-2 * hop)
    count = len(names)
    counts = worker_counts(count, 11)
    cluster = ClusterSpec(
        workers=tuple(counts),
        flop_rate=flop_rate,
        latency=latency,
        bandwidth=bandwidth,
        task_overhead=task_overhead,
        **per_step,
        store_overhead=store,
        name=f"measured on {count} workers",
    )
    return replace(
        cluster,
        mgrit_task_overhead=_mgrit_task_cost(client, cluster, net),
        partition_overhead=_partition_overhead(client, cluster, net),
        resident_step_overhead=_resident_step_cost(client, cluster, net),
    )


def step_costs(client, flop_rate: float, net=None) -> dict:
    """A training step's costs beyond its GEMM flops, timed on every worker at once (the median worker's).

    Workers sharing cores share them, as in the GEMMs' rate: tiny GEMMs and
    layers (:func:`_small_costs`), then :class:`SerialTrainer` fits of a
    tiny net and of ``net`` (64 wide where its steps are slow) for a step's
    bookkeeping, its cost per number touched and a fit's set-up
    (:func:`_trainer_costs`). Returns the :class:`ClusterSpec` fields
    ``gemm_overhead``, ``layer_overhead``, ``element_time``,
    ``step_overhead`` and ``fit_overhead``.
    """
    names = sorted(worker_addresses(client))
    gemm, layer = np.median(list(client.run(_small_costs, workers=names).values()), axis=0)
    shape = _calibration_net(net, flop_rate, gemm, layer)
    trainer = client.run(_trainer_costs, flop_rate, gemm, layer, *shape, workers=names)
    step_overhead, element_time, fit_overhead = np.median(list(trainer.values()), axis=0)
    return {
        "gemm_overhead": float(gemm),
        "layer_overhead": float(layer),
        "element_time": float(element_time),
        "step_overhead": float(step_overhead),
        "fit_overhead": float(fit_overhead),
    }


def _links(client, names, nbytes: int = 16 * 2**20) -> tuple[float, float]:
    """Seconds of one dependent hop between two workers, and bytes/s of a task's result moved over one."""
    small = hop_seconds(client, names)
    if len(names) < 2:
        return small, 1e10  # nothing moves between workers on one worker
    large = hop_seconds(client, names, nbytes)
    return small, float(nbytes / max(large - small, nbytes / 1e10))


def npt_step_walls(client, hidden, X, y, settings, steps: int, config, *, repeats: int = 3) -> float:
    """Seconds of one NPT step at ``config`` (grid and mode), its fit's set-up left out.

    Half the difference of a run of ``3 * steps`` and one of ``steps``,
    divided by ``steps``: the set-up both pay (the grid placed, data and
    weights sent, the result gathered) cancels. Each is the median of a few
    runs, short and long in turn, so that a busy spell hits both alike.
    """
    runs = {steps: [], 3 * steps: []}
    for _ in range(repeats):
        for n, wall in runs.items():
            trainer = NPTTrainer(hidden, **settings, grid=config["grid"], mode=config["mode"], client=client)
            t0 = time.perf_counter()
            trainer.fit(X, y, steps=n)
            wall.append(time.perf_counter() - t0)
    walls = [float(np.median(wall)) for wall in runs.values()]
    if walls[1] <= walls[0]:  # other load swamped the difference: the longer run's share, set-up included
        return walls[1] / (3 * steps)
    return (walls[1] - walls[0]) / (2 * steps)
