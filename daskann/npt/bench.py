"""``daskann bench npt``: time per step, speedup and efficiency against the process count.

For each net the benchmark trains a few steps with :class:`SerialTrainer`
(one BLAS thread: ``T1``), with :class:`NPTTrainer` in graph and in resident
mode on grids of growing size, and with the dask.array peer
(:class:`daskann.npt.peer.DaskArrayPeer`, dask's own ``@`` on the same chunks),
all on the same cluster in one run. Time per step is the steady cost of one
step: the time the steps after a warm-up took, over their number (resident
mode: the median of the workers' own step times, since its history shares a
run's wall time out over its steps); ``setup_s`` is the rest of the fit's wall time
(placing data and weights, starting tasks, warm-up). Speedup is ``T1 / Tp``
and efficiency ``E = T1 / (p * Tp)`` with ``p`` the number of worker processes
the grid uses. Against the hardware, every row also gets
``hw_efficiency = flops / (Tp * cores * rate)``: the step's matrix-product
flops over what the cluster's cores could do at the single-thread GEMM
``rate`` measured on a worker in the same run (serial rows: one core): the
faster of the probes at the start and the end of the run, and for the large
net's rows the faster of the probes just before and just after the row, since
a shared machine's speed drifts over a run of several minutes.

It also asks the cost model which grid ``grid="auto"`` would take for each
net and compares that grid's measured time with the best measured one.
"""

from __future__ import annotations

import json
import math
import os
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import numpy as np

from daskann.data import make_linear

#: the paper's three nets (widths are not in the available text: these are ours)
PAPER_NETS = {
    "one-hidden": {"n_features": 64, "hidden": (128,), "n_outputs": 8},
    "two-hidden": {"n_features": 64, "hidden": (128, 128), "n_outputs": 8},
    "two-hidden-256": {"n_features": 64, "hidden": (256, 256), "n_outputs": 8},
}


@dataclass
class BenchConfig:
    """What to run; the defaults finish in a few minutes on a 2-core machine.

    Attributes
    ----------
    nets : list of str
        Which of :data:`PAPER_NETS` to sweep.
    grids : list of str
        Grids of the paper-scale sweep (``"1x1"`` is a single worker);
        grids with more cells than workers share workers.
    batch_size, n_samples : int
        Paper-scale minibatch and data set size.
    graph_steps, resident_steps, peer_steps, serial_steps : int
        Steps timed per run (after ``warmup`` more).
    width_steps : int
        Steps timed per run of the width sweep.
    large_width, large_batch, large_steps, large_warmup : int
        The large net: ``large_width`` inputs and outputs, one hidden layer of
        ``large_hidden`` (0: ``large_width``) units (``large_width`` 0 skips
        it); ``large_steps`` timed steps after ``large_warmup`` more.
    large_hidden : int
        Hidden width of the large net (0: ``large_width``).
    large_grids : list of str
        Grids of the large net's sweep.
    gemm_size : int
        Side of the square single-thread GEMM that measures the hardware's
        rate (at the start and at the end of the run; the faster counts).
    widths : list of int
        Widths of two-hidden-layer nets for the resident-versus-serial sweep
        on 2x2 (empty skips it).
    modes : list of str
        Which of ``graph``, ``resident``, ``dask`` (the peer) and ``auto``
        (``grid="auto", mode="auto"``) to run.
    pair_rounds : int
        Rounds of serial training and a 1x1 resident run timed in turn on
        each paper-scale net (the sweep's own pair is the first): their median
        ratio is the single-worker check, so a busy spell on a shared machine
        does not land on one side only.
    """

    nets: list = field(default_factory=lambda: list(PAPER_NETS))
    grids: list = field(default_factory=lambda: ["1x1", "1x2", "2x2", "2x4"])
    batch_size: int = 128
    n_samples: int = 4096
    graph_steps: int = 4
    resident_steps: int = 500
    peer_steps: int = 4
    serial_steps: int = 500
    warmup: int = 2
    large_width: int = 4096
    large_batch: int = 4096
    large_steps: int = 2
    large_warmup: int = 1
    large_hidden: int = 0
    large_grids: list = field(default_factory=lambda: ["2x2"])
    gemm_size: int = 2048
    widths: list = field(default_factory=lambda: [256, 512, 1024, 2048])
    width_batch: int = 256
    width_steps: int = 7
    modes: list = field(default_factory=lambda: ["graph", "resident", "dask", "auto"])
    pair_rounds: int = 3
    seed: int = 0
    dtype: str = "float64"


def machine_info(client=None) -> dict:
    """Machine, library versions and BLAS kernel (threadpoolctl) of the client and one worker."""
    import dask
    import distributed
    from threadpoolctl import threadpool_info

    def blas():
        return [
            {
                k: v
                for k, v in info.items()
                if k in ("internal_api", "version", "architecture", "threading_layer", "num_threads", "filepath")
            }
            for info in threadpool_info()
            if info.get("user_api") == "blas"
        ]

    info = {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "dask": dask.__version__,
        "distributed": distributed.__version__,
        "blas_client": blas(),
        "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
    }
    try:
        with open("/proc/cpuinfo") as f:
            names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
        info["cpu_model"] = names[0] if names else None
    except OSError:
        info["cpu_model"] = None
    if client is not None:
        from daskann.cluster import worker_addresses

        workers = worker_addresses(client)
        info["workers"] = len(workers)
        from daskann.cluster import worker_threads

        info["threads_per_worker"] = sorted(set(worker_threads(client).values()))
        if workers:
            info["blas_worker"] = client.run(blas, workers=workers[:1])[workers[0]]
    return info


def _steady_step(times, warmup: int) -> float:
    """Seconds per step after ``warmup`` steps: the timed window's length over its step count.

    ``times`` are the fit's cumulative times at the end of each step. Steps are
    submitted ahead of their results, so a step whose result comes late
    shortens the interval after it; the window's mean is the loop's throughput,
    where the median of such intervals leans towards the long ones.
    """
    times = np.asarray(times, dtype=float)
    n = times.size - warmup
    if n <= 0:
        return float("nan")
    start = times[warmup - 1] if warmup else 0.0
    return float((times[-1] - start) / n)


def _cells(grid: str) -> int:
    r, c = (int(x) for x in grid.split("x"))
    return r * c


@dataclass(frozen=True)
class _Net:
    """One net of the sweep: its name in the table, layer sizes, data and minibatch size."""

    name: str
    sizes: tuple
    X: np.ndarray
    y: np.ndarray
    batch: int


@dataclass
class _Sweep:
    """The state of one benchmark run: the cluster, what to run, and the rows measured so far."""

    client: object
    config: BenchConfig
    n_workers: int
    resident: bool
    log: Callable
    table: list = field(default_factory=list)
    plans: dict = field(default_factory=dict)
    #: net -> [(serial, 1x1 resident) seconds per step], timed in turn
    pairs: dict = field(default_factory=dict)
    #: single-thread GEMM rates probed between the large net's rows
    probes: list = field(default_factory=list)

    @property
    def modes(self) -> list[str]:
        return [m for m in self.config.modes if m != "resident" or self.resident]

    def record(self, net: _Net, grid: str, mode: str, seconds: float, extra=None, *, fit=None) -> dict:
        """Add a row; ``fit = (wall seconds of the fit, steps it ran)`` gives its set-up time."""
        cells = _cells(grid) if grid != "-" else 1
        fit_s, n_steps = fit if fit is not None else (float("nan"), 0)
        row = {
            "net": net.name,
            "sizes": "-".join(map(str, net.sizes)),
            "batch": net.batch,
            "grid": grid,
            "cells": cells,
            "p": min(cells, self.n_workers) if mode != "serial" else 1,
            "mode": mode,
            "time_per_step": seconds,
            "flops": step_flops(net.sizes, net.batch),
            "fit_s": fit_s,
            # what the fit spent beyond its steady steps: placing data and weights, starting tasks, warm-up
            "setup_s": max(fit_s - n_steps * seconds, 0.0) if n_steps else float("nan"),
        }
        row.update(extra or {})
        self.table.append(row)
        self.log(f"  {net.name:>15} {grid:>5} {mode:>8}: {seconds * 1e3:10.2f} ms/step, set-up {row['setup_s']:.3g} s")
        return row

    def serial(self, net: _Net, steps: int, warmup: int | None = None) -> dict:
        from threadpoolctl import threadpool_limits

        from daskann.serial import SerialTrainer

        warmup = self.config.warmup if warmup is None else warmup
        with threadpool_limits(1):
            t0 = time.perf_counter()
            t = SerialTrainer(**_kwargs(net.sizes, net.batch, self.config)).fit(net.X, net.y, steps=steps + warmup)
            fit_s = time.perf_counter() - t0
        seconds = _steady_step(t.history_["time"].values, warmup)
        return self.record(net, "-", "serial", seconds, fit=(fit_s, steps + warmup))

    def more_pairs(self, net: _Net) -> None:
        """Serial training and the 1x1 resident run in turn until ``pair_rounds`` pairs are timed
        (the sweep's own serial row and 1x1 resident row are the first)."""
        rows = {(r["grid"], r["mode"]): r for r in self.table if r["net"] == net.name}
        first = rows.get(("-", "serial")), rows.get(("1x1", "resident"))
        if None in first:
            return
        pairs = [(first[0]["time_per_step"], first[1]["time_per_step"])]
        for _ in range(self.config.pair_rounds - 1):
            serial = self.serial(net, self.config.serial_steps)
            resident = self.npt(net, "1x1", "resident", self.config.resident_steps)
            # repeats: the table keeps one row per configuration
            self.table[:] = [r for r in self.table if r is not serial and r is not resident]
            pairs.append((serial["time_per_step"], resident["time_per_step"]))
        self.pairs[net.name] = pairs

    def npt(self, net: _Net, grid: str, mode: str, steps: int, warmup: int | None = None) -> dict:
        from daskann.npt.trainer import NPTTrainer

        warmup = self.config.warmup if warmup is None else warmup
        probe_s = _probe(self.client) if grid == "auto" else 0.0
        t = NPTTrainer(
            **_kwargs(net.sizes, net.batch, self.config),
            grid=grid,
            mode=mode,
            engine={"share_workers": True, "timeout": 600.0},
            client=self.client,
        )
        t0 = time.perf_counter()
        t.fit(net.X, net.y, steps=steps + warmup)
        fit_s = time.perf_counter() - t0
        h = t.history_
        extra = {
            key: float(np.nanmedian(h[key].values[warmup:])) for key in ("compute_time", "comm_time", "bytes_moved")
        }
        extra["probe_s"] = probe_s
        seconds = _steady_step(h["time"].values, warmup)
        if t.mode_ == "resident":
            # the history shares each run's wall time (set-up included) out over its steps: take the
            # workers' own step times (arithmetic plus messages and waiting, slowest worker) instead
            busy = h["compute_time"].values[warmup:] + h["comm_time"].values[warmup:]
            seconds = float(np.nanmedian(busy)) if busy.size else seconds
        if grid == "auto":
            grid, mode = f"{t.grid_.rows}x{t.grid_.cols}", f"auto-{t.mode_}"
        return self.record(net, grid, mode, seconds, extra, fit=(fit_s, steps + warmup))

    def peer(self, net: _Net, grid: str, steps: int, warmup: int | None = None) -> dict:
        from daskann.data import BatchOrder
        from daskann.nn import MLP
        from daskann.npt.peer import DaskArrayPeer
        from daskann.serial import SerialTrainer

        warmup = self.config.warmup if warmup is None else warmup
        settings = SerialTrainer(**_kwargs(net.sizes, net.batch, self.config))._check_settings()
        model = MLP(net.sizes, dtype=self.config.dtype, seed=self.config.seed)
        order = BatchOrder(net.X.shape[0], net.batch, seed=self.config.seed, shuffle=True)
        r, c = (int(v) for v in grid.split("x"))
        t0 = time.perf_counter()
        out = DaskArrayPeer(self.client, (r, c), settings).fit(model, net.X, net.y, order, steps + warmup)
        fit_s = time.perf_counter() - t0
        return self.record(net, grid, "dask", _steady_step(out["times"], warmup), fit=(fit_s, steps + warmup))

    def plan(self, cost, net: _Net) -> dict:
        """The grid and mode ``grid="auto"`` takes for ``net``, kept for the report."""
        self.plans[net.name] = _auto_choice(
            cost, net.sizes, net.batch, self.n_workers, self.resident, self.config.dtype
        )
        return self.plans[net.name]


def run_bench(client, config: BenchConfig | None = None, *, log=print) -> dict:
    """Run the sweep on ``client``'s cluster; returns ``{"table", "checks", "machine", "config", "plans"}``."""
    from daskann.cluster import worker_addresses
    from daskann.npt import costmodel
    from daskann.npt.trainer import resident_available

    config = config or BenchConfig()
    run = _Sweep(client, config, len(worker_addresses(client)), resident_available(), log)
    rates = [gemm_rate(client, config.gemm_size, config.dtype)]
    log(f"single-thread GEMM, n={config.gemm_size}: {rates[0] / 1e9:.3g} GFLOP/s")
    t0 = time.perf_counter()
    cost = costmodel.measure(client)
    probe_s = time.perf_counter() - t0
    log(f"cost model ({probe_s:.3g} s): {json.dumps(cost.to_dict())}")
    _paper_nets(run, cost)
    _large_net(run, cost)
    _width_sweep(run)
    rates += [*run.probes, gemm_rate(client, config.gemm_size, config.dtype)]  # in the order taken
    hardware = {
        # the fastest probe: a GEMM slowed by other load on the machine would flatter every row
        "gemm_rate": max(rates),
        "gemm_rates": rates,
        "gemm_size": config.gemm_size,
        "cores": cluster_cores(client),
        "cost_model_s": probe_s,
    }
    _derive(run.table, hardware)
    return {
        "table": run.table,
        "checks": _checks(run.table, run.plans, run.pairs),
        "machine": machine_info(client),
        "config": asdict(config),
        "plans": run.plans,
        "cost_model": cost.to_dict(),
        "hardware": hardware,
    }


def step_flops(sizes, batch_size: int) -> float:
    """Flops of the matrix products of one training step (forward, weight and input gradients)."""
    from daskann.npt.costmodel import _products

    return float(sum(2.0 * m * k * n for m, k, n in _products(sizes, batch_size)))


def _gemm_seconds(n: int, dtype: str, repeats: int) -> float:
    """Best time of an ``n x n`` GEMM on one BLAS thread (runs on a worker)."""
    from threadpoolctl import threadpool_limits

    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n)).astype(dtype)
    b = rng.standard_normal((n, n)).astype(dtype)
    best = float("inf")
    with threadpool_limits(1):
        a @ b
        for _ in range(repeats):
            t0 = time.perf_counter()
            a @ b
            best = min(best, time.perf_counter() - t0)
    return best


def gemm_rate(client, n: int = 2048, dtype: str = "float64", repeats: int = 5) -> float:
    """Single-thread GEMM flop rate of one worker while the others are idle (the client's without workers)."""
    from daskann.cluster import worker_addresses

    workers = worker_addresses(client) if client is not None else []
    if workers:
        seconds = client.run(_gemm_seconds, n, dtype, repeats, workers=workers[:1])[workers[0]]
    else:
        seconds = _gemm_seconds(n, dtype, repeats)
    return 2.0 * n**3 / seconds


def _usable_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def cluster_cores(client) -> int:
    """Cores the cluster's workers can run on: per host, the fewer of its cores and its worker threads."""
    from daskann.cluster import worker_threads

    threads = worker_threads(client)
    cores = client.run(_usable_cores, workers=list(threads))
    hosts: dict = {}
    for addr, n in threads.items():
        host = addr.rsplit(":", 1)[0]
        used, avail = hosts.get(host, (0, cores[addr]))
        hosts[host] = (used + n, avail)
    return int(sum(min(used, avail) for used, avail in hosts.values()))


def _paper_nets(run: _Sweep, cost) -> None:
    """The paper-scale nets over the process count, in every mode, then the grid ``"auto"`` picks."""
    config = run.config
    for name in config.nets:
        spec = PAPER_NETS[name]
        X, y = make_linear(
            config.n_samples, spec["n_features"], spec["n_outputs"], seed=config.seed, dtype=config.dtype
        )
        net = _Net(name, (spec["n_features"], *spec["hidden"], spec["n_outputs"]), X, y, config.batch_size)
        run.log(f"{name}: sizes {net.sizes}, batch {net.batch}")
        run.serial(net, config.serial_steps)
        for grid in config.grids:
            if "resident" in run.modes:
                run.npt(net, grid, "resident", config.resident_steps)
            if "graph" in run.modes:
                run.npt(net, grid, "graph", config.graph_steps)
            if "dask" in run.modes:
                run.peer(net, grid, config.peer_steps)
        plan = run.plan(cost, net)
        if "auto" in config.modes:
            run.npt(net, "auto", "auto", config.resident_steps if plan["mode"] == "resident" else config.graph_steps)
        run.more_pairs(net)


def _large_net(run: _Sweep, cost) -> None:
    """The large net on each of ``large_grids`` (graph, resident, the dask.array peer), serial and ``grid="auto"``."""
    config = run.config
    if not config.large_width:
        return
    w, h = config.large_width, config.large_hidden or config.large_width
    X, y = make_linear(2 * config.large_batch, w, w, seed=config.seed, dtype=config.dtype)
    net = _Net(f"large-{w}" if h == w else f"large-{w}-{h}", (w, h, w), X, y, config.large_batch)
    gflop = step_flops(net.sizes, net.batch) / 1e9
    run.log(f"{net.name}: sizes {net.sizes}, batch {net.batch}, {gflop:.4g} GFLOP per step")
    steps, warm = config.large_steps, config.large_warmup
    probes = run.probes
    probes.append(gemm_rate(run.client, config.gemm_size, config.dtype))

    def side_by_side(row: dict) -> None:
        # each row against the GEMM rate probed just before and just after it
        probes.append(gemm_rate(run.client, config.gemm_size, config.dtype))
        row["gemm_rate"] = max(probes[-2:])

    side_by_side(run.serial(net, steps, warm))
    for grid in config.large_grids:
        if "graph" in run.modes:
            side_by_side(run.npt(net, grid, "graph", steps, warm))
        if "resident" in run.modes:
            side_by_side(run.npt(net, grid, "resident", steps, warm))
        if "dask" in run.modes and _cells(grid) > 1:
            side_by_side(run.peer(net, grid, steps, warm))
    run.plan(cost, net)
    if "auto" in config.modes:
        # always run it: its row is the one held against the hardware's bound
        side_by_side(run.npt(net, "auto", "auto", steps, warm))


def _width_sweep(run: _Sweep) -> None:
    """Resident mode against serial over the width of two-hidden-layer nets, on 2x2."""
    config = run.config
    if not config.widths or "resident" not in run.modes:
        return
    steps = config.width_steps
    for w in config.widths:
        X, y = make_linear(max(4 * config.width_batch, 1024), w, 16, seed=config.seed, dtype=config.dtype)
        net = _Net(f"width-{w}", (w, w, w, 16), X, y, config.width_batch)
        run.log(f"{net.name}: sizes {net.sizes}, batch {net.batch}")
        run.serial(net, steps)
        run.npt(net, "2x2", "resident", steps)


def _probe(client) -> float:
    """Seconds to fetch the cost model ``grid="auto"`` reads: 0 when cached, its probing when the workers changed.

    Done before an auto fit so that the fit's set-up time is not the cost model's.
    """
    from daskann.npt import costmodel

    t0 = time.perf_counter()
    costmodel.measure(client)
    return time.perf_counter() - t0


def _kwargs(sizes, batch, config: BenchConfig) -> dict:
    return {
        "hidden_sizes": tuple(sizes[1:-1]),
        "lr": 0.01,
        "batch_size": batch,
        "seed": config.seed,
        "loss": "mse",
        "network": {"dtype": config.dtype},
        "sgd": {"momentum": 0.9},
    }


def _auto_choice(cost, sizes, batch, n_workers, resident, dtype) -> dict:
    from daskann.npt import costmodel

    shape, mode, table = costmodel.choose_grid(
        cost, sizes, batch, n_workers=n_workers, resident_available=resident, itemsize=np.dtype(dtype).itemsize
    )
    return {"grid": f"{shape[0]}x{shape[1]}", "mode": mode, "table": table}


def _derive(table: list[dict], hardware: dict | None = None) -> None:
    """Speedup, efficiency and ratio to the peer and to serial for every row; against the hardware's bound."""
    serial = {r["net"]: r["time_per_step"] for r in table if r["mode"] == "serial"}
    peers = {(r["net"], r["grid"]): r["time_per_step"] for r in table if r["mode"] == "dask"}
    for r in table:
        if hardware is not None:
            # serial training runs on one core; everything else may use every core of the cluster
            r["cores"] = 1 if r["mode"] == "serial" else hardware["cores"]
            rate = r.get("gemm_rate", hardware["gemm_rate"])  # probed beside the row, or the run's fastest
            r["bound_s"] = r["flops"] / (r["cores"] * rate)
            r["hw_efficiency"] = r["bound_s"] / r["time_per_step"] if r["time_per_step"] else float("nan")
            r["hw_efficiency_run_peak"] = r["hw_efficiency"] * rate / hardware["gemm_rate"]
        t1 = serial.get(r["net"], float("nan"))
        r["speedup"] = t1 / r["time_per_step"] if r["time_per_step"] else float("nan")
        r["efficiency"] = r["speedup"] / r["p"]
        r["vs_serial"] = r["time_per_step"] / t1
        peer = peers.get((r["net"], r["grid"]))
        r["vs_peer"] = r["time_per_step"] / peer if peer else float("nan")


def _checks(table: list[dict], plans: dict, pairs: dict | None = None) -> dict:
    """The issue's benchmark targets, from this run's table."""
    rows = {(r["net"], r["grid"], r["mode"]): r for r in table}
    checks = {}
    large = _check_large(table, rows)
    if large:
        checks["large_graph_vs_peer"] = large
    bound = _check_bound(table)
    if bound:
        checks["large_bound"] = bound
    single = _check_single_worker(rows, pairs or {})
    if single:
        checks["resident_1x1_vs_serial"] = single
    checks.update(_check_resident(table, rows))
    widths = _check_widths(table)
    if widths:
        checks["resident_beats_serial_width"] = widths
    checks["grid_auto"] = {net: a for net, plan in plans.items() if (a := _check_auto(table, rows, net, plan))}
    return checks


def _check_large(table: list[dict], rows: dict) -> dict | None:
    """The large net's graph mode against the dask.array peer (which must be in the same run).

    Reported without a target: when both are compute-bound the limit is the
    hardware, held against :func:`_check_bound`, not the peer.
    """
    large = [
        r for r in table if r["net"].startswith("large-") and r["mode"] == "graph" and (r["net"], "2x2", "dask") in rows
    ]
    if not large:
        return None
    r = large[0]
    return {
        "value": r["vs_peer"],
        "graph_s": r["time_per_step"],
        "peer_s": rows.get((r["net"], "2x2", "dask"), {}).get("time_per_step"),
        "serial_s": r["time_per_step"] * r["speedup"],
    }


def _check_bound(table: list[dict]) -> dict | None:
    """The large net's ``grid="auto"`` run against the hardware's bound (target: at least 80% of it)."""
    auto = [r for r in table if r["net"].startswith("large-") and r["mode"].startswith("auto-") and "bound_s" in r]
    if not auto:
        return None
    r = auto[0]
    return {
        "value": r["hw_efficiency"],
        "target": ">= 0.8",
        "met": bool(r["hw_efficiency"] >= 0.8),
        "gemm_rate": r.get("gemm_rate"),
        "value_run_peak": r["hw_efficiency_run_peak"],
        "grid": r["grid"],
        "mode": r["mode"],
        "step_s": r["time_per_step"],
        "bound_s": r["bound_s"],
        "setup_s": r["setup_s"],
        "gflop": r["flops"] / 1e9,
    }


def _check_single_worker(rows: dict, pairs: dict) -> dict:
    """1x1 resident against serial training, per step (target: within 1.2x), and its set-up time.

    With ``pairs[net]`` (serial and resident timed in turn), the median of
    the rounds' ratios; else the ratio of the two rows.
    """
    out = {}
    for net in PAPER_NETS:
        res, ser = rows.get((net, "1x1", "resident")), rows.get((net, "-", "serial"))
        if res is None or ser is None:
            continue
        rounds = pairs.get(net) or [(ser["time_per_step"], res["time_per_step"])]
        ratio = statistics.median(r / s for s, r in rounds)
        out[net] = {
            "ratio": ratio,
            "target": "<= 1.2",
            "met": bool(ratio <= 1.2),
            "rounds": [r / s for s, r in rounds],
            "step_s": statistics.median(r for _, r in rounds),
            "serial_s": statistics.median(s for s, _ in rounds),
            "setup_s": res["setup_s"],
        }
    return out


def _check_resident(table: list[dict], rows: dict) -> dict:
    """Graph over resident time per step on every grid but 1x1, and resident against serial on 2x2."""
    ratios = {}
    for net in PAPER_NETS:
        for grid in {r["grid"] for r in table if r["net"] == net and r["mode"] == "resident"}:
            g, res = rows.get((net, grid, "graph")), rows.get((net, grid, "resident"))
            if g and res and grid != "1x1":
                ratios[f"{net} {grid}"] = g["time_per_step"] / res["time_per_step"]
    if not ratios:
        return {}
    worst = min(ratios.values())
    vs_serial = {}
    for net in PAPER_NETS:
        res = rows.get((net, "2x2", "resident"))
        if res is not None:
            # where a resident step goes (the slowest worker): arithmetic, and messaging plus waiting
            vs_serial[f"{net} 2x2"] = {
                "ratio": res["vs_serial"],
                "step_s": res["time_per_step"],
                "serial_s": rows[(net, "-", "serial")]["time_per_step"],
                "compute_s": res.get("compute_time"),
                "comm_s": res.get("comm_time"),
                "bytes_moved": res.get("bytes_moved"),
            }
    return {
        "resident_vs_graph": {"ratios": ratios, "min": worst, "target": ">= 10", "met": bool(worst >= 10)},
        "resident_vs_serial": vs_serial,
    }


def _check_widths(table: list[dict]) -> dict | None:
    """The smallest width at which resident 2x2 beats serial."""
    widths = sorted(
        (int(r["net"].split("-")[1]), r) for r in table if r["net"].startswith("width-") and r["mode"] == "resident"
    )
    if not widths:
        return None
    beats = [w for w, r in widths if r["vs_serial"] < 1.0]
    return {"smallest_width": beats[0] if beats else None, "ratios": {w: r["vs_serial"] for w, r in widths}}


def _check_auto(table: list[dict], rows: dict, net: str, plan: dict) -> dict | None:
    """Whether ``grid="auto"`` picked within 10% of the best measured grid and mode of ``net``."""
    measured = [r for r in table if r["net"] == net and r["mode"] in ("graph", "resident")]
    serial = [r for r in table if r["net"] == net and r["mode"] == "serial"]
    if not measured:
        return None
    best = min(measured, key=lambda r: r["time_per_step"])
    # the auto run itself when there is one, else the sweep's row for the predicted grid and mode
    pick = next((r for r in table if r["net"] == net and r["mode"].startswith("auto-")), None) or rows.get(
        (net, plan["grid"], plan["mode"])
    )
    # picking the best measured grid and mode is within 10% of it, whatever two timings of it say
    picked_best = (plan["grid"], plan["mode"]) == (best["grid"], best["mode"])
    within = pick is not None and (picked_best or pick["time_per_step"] <= 1.1 * best["time_per_step"])
    no_grid_pays = bool(serial) and all(
        r["time_per_step"] >= serial[0]["time_per_step"] for r in measured if r["cells"] > 1
    )
    return {
        "pick": f"{plan['grid']} {plan['mode']}",
        "pick_s": pick["time_per_step"] if pick else None,
        "best": f"{best['grid']} {best['mode']}",
        "best_s": best["time_per_step"],
        "picked_best": picked_best,
        "within_10pct": bool(within),
        "no_grid_pays": no_grid_pays,
        "single_worker_when_no_grid_pays": (plan["grid"] == "1x1") if no_grid_pays else None,
    }


# -- output ---------------------------------------------------------------------------
def format_table(table: list[dict]) -> str:
    """The table as text: ``ms/step`` the steady step, ``setup s`` the rest of the fit, ``E hw`` against the bound."""
    head = (
        f"{'net':>15} {'sizes':>16} {'batch':>5} {'grid':>5} {'p':>2} {'mode':>13} {'ms/step':>10} "
        f"{'setup s':>8} {'speedup':>8} {'E':>6} {'E hw':>6} {'vs peer':>8} {'vs serial':>9}"
    )
    lines = [head]
    for r in table:
        lines.append(
            f"{r['net']:>15} {r['sizes']:>16} {r['batch']:>5} {r['grid']:>5} {r['p']:>2} {r['mode']:>13} "
            f"{r['time_per_step'] * 1e3:>10.3f} {_fmt(r.get('setup_s')):>8} {r['speedup']:>8.3g} "
            f"{r['efficiency']:>6.3g} {_fmt(r.get('hw_efficiency')):>6} {r['vs_peer']:>8.3g} {r['vs_serial']:>9.3g}"
        )
    return "\n".join(lines)


def write_outputs(result: dict, out_dir) -> dict:
    """``bench-npt.json``, ``bench-npt.zarr`` and three PNG plots in ``out_dir``; their paths."""
    from pathlib import Path

    import xarray as xr

    from daskann import store

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {}
    json_path = out / "bench-npt.json"
    tmp = store.temporary_sibling(json_path)
    tmp.write_text(json.dumps(clean_json(result), indent=2))
    os.replace(tmp, json_path)
    paths["json"] = json_path
    table = result["table"]
    columns = {}
    for key in dict.fromkeys(k for r in table for k in r):  # every row's keys: serial rows lack some
        values = [r.get(key) for r in table]
        if all(isinstance(v, str) for v in values):
            # variable-width strings: zarr v3 has a specification for them (fixed-width has none)
            columns[key] = ("row", np.array(values, dtype=np.dtypes.StringDType()))
        else:
            columns[key] = ("row", np.array([np.nan if v is None else v for v in values], dtype=float))
    ds = xr.Dataset(
        columns,
        coords={"row": np.arange(len(table))},
        attrs={
            "machine": json.dumps(clean_json(result["machine"])),
            "checks": json.dumps(clean_json(result["checks"])),
        },
    )
    paths["zarr"] = store.save_history(ds, out / "bench-npt.zarr")
    paths.update(plot(table, out))
    return paths


#: the plots: metric, axis label, title
_PLOTS = (
    ("time_per_step", "time per step (s)", "NPT: time per step against p (thin dashed: serial)"),
    ("speedup", "speedup T1/Tp", "NPT: speedup T1/Tp against p (dotted: ideal, p)"),
    ("efficiency", "efficiency T1/(p Tp)", "NPT: efficiency T1/(p Tp) against p"),
)
#: line style and marker per mode; the auto runs get a star
_STYLES = {"graph": ("-", "o"), "resident": ("--", "s"), "dask": (":", "^")}


def plot(table: list[dict], out_dir) -> dict:
    """PNG plots of time per step, speedup and efficiency against ``p`` (matplotlib, imported here).

    One colour per net, one line style per mode; serial training is the
    dashed horizontal line of its net's colour on the time plot. The ``p``
    axis is log2 with a tick at each measured cell count.
    """
    from pathlib import Path

    from daskann import _plotting

    series, serial = _plot_series(table)
    colours = {net: _plotting.colour(k) for k, net in enumerate(dict.fromkeys(net for net, _ in series))}
    paths = {}
    for metric, label, title in _PLOTS:
        fig, (ax,) = _plotting.figure(size=(9.0, 4.8))
        for (net, mode), rows in sorted(series.items()):
            line, marker = _STYLES.get(mode, ("none", "*"))
            ax.plot(
                [r["cells"] for r in rows],
                [r[metric] for r in rows],
                linestyle=line,
                marker=marker,
                markersize=9 if marker == "*" else 5,
                color=colours[net],
                label=f"{net} {mode}",
            )
        _plot_references(ax, metric, series, serial, colours)
        _plotting.count_axis(ax, [r["cells"] for rows in series.values() for r in rows])
        ax.set_xlabel("grid cells (process count p)")
        ax.set_ylabel(label)
        ax.set_title(title)
        ax.grid(True, alpha=0.3)
        fig.legend(loc="outside right upper", fontsize=7)
        paths[metric] = _plotting.save(fig, Path(out_dir) / f"bench-npt-{metric}.png", dpi=110)
    return paths


def _plot_series(table: list[dict]) -> tuple[dict, dict]:
    """Rows per ``(net, mode)`` sorted by cell count, and serial time per net (width sweep left out)."""
    series, serial = {}, {}
    for r in table:
        if r["net"].startswith("width-"):
            continue
        if r["mode"] == "serial":
            serial[r["net"]] = r["time_per_step"]
        else:
            series.setdefault((r["net"], r["mode"]), []).append(r)
    return {key: sorted(rows, key=lambda r: (r["cells"], r["grid"])) for key, rows in series.items()}, serial


def _plot_references(ax, metric: str, series: dict, serial: dict, colours: dict) -> None:
    """Serial times, the ideal speedup and the line at 1; the y axis to fit them and the data."""
    from daskann import _plotting

    values = [r[metric] for rows in series.values() for r in rows]
    ideal = dict(sorted({r["cells"]: r["p"] for rows in series.values() for r in rows}.items()))
    if metric == "time_per_step":
        for net, t1 in serial.items():
            if net in colours:
                ax.axhline(t1, color=colours[net], lw=0.8, ls=(0, (6, 3)), alpha=0.7)
        _plotting.log_axis(ax, values, include=[t for net, t in serial.items() if net in colours])
        return
    ax.axhline(1.0, color="grey", lw=0.8, ls="--")
    if metric == "speedup":
        # the ideal speedup is the number of worker processes, which grids larger than the cluster share
        ax.plot(list(ideal), list(ideal.values()), color="grey", lw=0.8, ls=":")
        _plotting.log_axis(ax, values, include=[1.0, *ideal.values()])
    else:
        finite = [v for v in values if v is not None and np.isfinite(v)]
        ax.set_ylim(0.0, 1.05 * max([1.0, *finite]))


def clean_json(value):
    """A JSON-safe copy: numpy scalars to Python, NaN and infinities to None, paths to str."""
    if isinstance(value, dict):
        return {str(k): clean_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [clean_json(v) for v in value]
    if isinstance(value, (np.floating, np.integer, np.bool_)):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


def format_checks(checks: dict) -> str:
    """The benchmark targets in words."""
    lines = []
    c = checks.get("large_graph_vs_peer")
    if c:
        lines.append(
            f"large net, 2x2 graph / dask.array peer: {c['value']:.3g} (graph {c['graph_s']:.3g} s, "
            f"peer {c['peer_s']:.3g} s, serial {c['serial_s']:.3g} s per step)"
        )
    c = checks.get("large_bound")
    if c:
        lines.append(
            f"large net, grid='auto' ({c['grid']} {c['mode']}) against the hardware's bound: {c['value']:.3g} "
            f"(target {c['target']}: {'met' if c['met'] else 'NOT met'}); {c['step_s']:.3g} s per step of "
            f"{c['gflop']:.4g} GFLOP, bound {c['bound_s']:.3g} s at {_fmt(c['gemm_rate'] and c['gemm_rate'] / 1e9)} "
            f"GFLOP/s per core probed beside it ({c['value_run_peak']:.3g} at the run's fastest probe), "
            f"set-up {_fmt(c['setup_s'])} s"
        )
    for net, c in checks.get("resident_1x1_vs_serial", {}).items():
        lines.append(
            f"1x1 resident / serial, {net}: {c['ratio']:.3g} (target {c['target']}: "
            f"{'met' if c['met'] else 'NOT met'}; median of {len(c.get('rounds', [0]))} rounds timed in turn"
            + (": " + ", ".join(f"{v:.3g}" for v in c["rounds"]) if "rounds" in c else "")
            + f"); {c['step_s'] * 1e3:.3g} ms against {c['serial_s'] * 1e3:.3g} ms "
            f"per step, plus {_fmt(c['setup_s'] and c['setup_s'] * 1e3)} ms set-up per fit"
        )
    c = checks.get("resident_vs_graph")
    if c:
        lines.append(
            f"resident vs graph at paper scale: min {c['min']:.3g}x (target {c['target']}: "
            f"{'met' if c['met'] else 'NOT met'}); " + ", ".join(f"{k} {v:.3g}x" for k, v in c["ratios"].items())
        )
    c = checks.get("resident_vs_serial")
    if c:
        for k, v in c.items():
            lines.append(
                f"resident / serial at paper scale, {k}: {v['ratio']:.3g} ({v['step_s'] * 1e3:.3g} ms "
                f"against {v['serial_s'] * 1e3:.3g} ms per step; of a resident step "
                f"{_fmt(v['compute_s'] and v['compute_s'] * 1e3)} ms arithmetic, "
                f"{_fmt(v['comm_s'] and v['comm_s'] * 1e3)} ms messages and waiting, "
                f"{_fmt(v['bytes_moved'])} bytes moved)"
            )
    c = checks.get("resident_beats_serial_width")
    if c:
        lines.append(
            f"smallest width where resident 2x2 beats serial: {c['smallest_width']} "
            f"(resident/serial by width: " + ", ".join(f"{k}: {v:.3g}" for k, v in c["ratios"].items()) + ")"
        )
    for net, a in checks.get("grid_auto", {}).items():
        lines.append(
            f"grid='auto' for {net}: picked {a['pick']} ({_fmt(a['pick_s'])} s), best measured {a['best']} "
            f"({_fmt(a['best_s'])} s): within 10% {a['within_10pct']}"
            + (" (the best itself)" if a.get("picked_best") else "")
            + (
                f"; no grid pays, single worker picked: {a['single_worker_when_no_grid_pays']}"
                if a["no_grid_pays"]
                else ""
            )
        )
    return "\n".join(lines)


def _fmt(value) -> str:
    return "n/a" if value is None else f"{value:.3g}"


__all__ = [
    "BenchConfig",
    "PAPER_NETS",
    "clean_json",
    "cluster_cores",
    "format_checks",
    "format_table",
    "gemm_rate",
    "machine_info",
    "plot",
    "run_bench",
    "step_flops",
    "write_outputs",
]
