"""``daskann bench npt``: time per step, speedup and efficiency against the process count.

For each net the benchmark trains a few steps with :class:`SerialTrainer`
(one BLAS thread: ``T1``), with :class:`NPTTrainer` in graph and in resident
mode on grids of growing size, and with the dask.array peer
(:class:`daskann.bench.npt_peer.DaskArrayPeer`, dask's own ``@`` on the same chunks),
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
net and compares that grid's measured time with the best measured one. Every
NPT row carries the cost model's step for the grid, mode and pipeline it ran
(``predicted_s``; the table's ``model`` column is predicted over measured), so
that rows such as ``graph-fused``, ``graph-single`` and ``graph-double`` show
whether the model ranks the pipelines as the cluster does.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace

import numpy as np
from threadpoolctl import threadpool_limits

from daskann._blas import gemm_rate as _gemm_rate
from daskann._validation import check_int, invalid
from daskann.bench import npt_breakdown
from daskann.bench._report import npt_machine
from daskann.bench.npt_checks import checks
from daskann.bench.npt_peer import DaskArrayPeer
from daskann.cluster import worker_addresses, worker_threads
from daskann.data import BatchOrder, make_linear
from daskann.nn import MLP
from daskann.npt import costmodel
from daskann.npt.costmodel import PAPER_NETS
from daskann.npt.grid import parse_grid
from daskann.npt.trainer import CHAINS, NPTTrainer
from daskann.serial import SerialTrainer


@dataclass(frozen=True)
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
        (``grid="auto", mode="auto"``) to run; ``graph-fused``,
        ``graph-single`` and ``graph-double`` run graph mode with that
        ``engine__pipeline`` instead of the one it picks (``graph``).
    breakdown : bool
        Keep, for the large net's NPT rows, where each worker's step time went
        (:mod:`daskann.bench.npt_breakdown`): the result's ``"breakdown"``.
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
    breakdown: bool = False
    seed: int = 0
    dtype: str = "float64"

    @classmethod
    def from_options(cls, **opts) -> BenchConfig:
        """The configuration ``daskann bench npt`` runs: its options checked, ``--steps`` and ``--quick`` applied."""
        grids, large_grids = _grids("grids", opts["grids"]), _grids("large_grids", opts["large_grids"])
        nets, modes = _subset("nets", opts["nets"], PAPER_NETS), _subset("modes", opts["modes"], MODES)
        widths = [check_int("widths", int(w)) for w in opts["widths"].split(",") if w.strip()] if opts["widths"] else []
        config = cls(
            nets=nets,
            grids=grids,
            modes=modes,
            widths=widths,
            large_width=check_int("large_width", opts["large_width"], minimum=0),
            large_batch=check_int("large_batch", opts["large_batch"]),
            large_steps=check_int("large_steps", opts["large_steps"]),
            large_hidden=check_int("large_hidden", opts["large_hidden"], minimum=0),
            large_grids=["x".join(map(str, parse_grid(g))) for g in large_grids],
            breakdown=bool(opts.get("breakdown", False)),
        )
        if opts.get("steps") is not None:
            steps = check_int("steps", opts["steps"])
            config = replace(
                config, graph_steps=steps, peer_steps=steps, resident_steps=max(config.resident_steps, steps)
            )
        return config.quick() if opts.get("quick") else config

    def quick(self) -> BenchConfig:
        """Small sizes and few steps: a smoke test of the benchmark."""
        return replace(
            self,
            n_samples=512,
            batch_size=64,
            graph_steps=min(self.graph_steps, 3),
            peer_steps=min(self.graph_steps, 3),
            resident_steps=5,
            serial_steps=10,
            warmup=1,
            large_width=min(self.large_width, 256),
            large_batch=min(self.large_batch, 256),
            large_hidden=min(self.large_hidden, 512),
            large_steps=2,
            large_warmup=1,
            widths=self.widths[:2] if self.widths else [],
            width_batch=64,
        )


def _names(text: str) -> list[str]:
    return [v.strip() for v in text.split(",") if v.strip()]


def _grids(flag: str, text: str) -> list[str]:
    grids = _names(text)
    for g in grids:
        if parse_grid(g) == "auto":
            raise invalid(flag, g, "explicit grids such as 1x2,2x2")
    return grids


def _subset(flag: str, text: str, allowed) -> list[str]:
    """The comma-separated names of ``text``, each one of ``allowed``."""
    names = _names(text)
    for name in names:
        if name not in allowed:
            raise invalid(flag, name, "a comma-separated subset of " + ", ".join(allowed))
    return names


#: graph mode with each pipeline it can be told to use, beside the one it picks
PIPELINE_MODES = tuple(f"graph-{p}" for p in CHAINS)
MODES = ("graph", *PIPELINE_MODES, "resident", "dask", "auto")


def _graph_modes(config: BenchConfig) -> list[str]:
    """The graph-mode runs of the sweep, in the order of :data:`MODES`."""
    return [m for m in MODES if m.startswith("graph") and m in config.modes]


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
    log: Callable
    #: the cluster's cost model, measured at the start: each NPT row carries its prediction
    cost: costmodel.CostModel | None = None
    table: list = field(default_factory=list)
    plans: dict = field(default_factory=dict)
    #: net -> [(serial, 1x1 resident) seconds per step], timed in turn
    pairs: dict = field(default_factory=dict)
    #: single-thread GEMM rates probed between the large net's rows
    probes: list = field(default_factory=list)
    #: per measured row, where each worker's step time went (with ``config.breakdown``)
    breakdowns: list = field(default_factory=list)
    #: the large net's step products alone on every worker at once (with ``config.breakdown``)
    products_alone: dict | None = None

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
            "flops": costmodel.step_product_flops(net.sizes, net.batch),
            "fit_s": fit_s,
            # what the fit spent beyond its steady steps: placing data and weights, starting tasks, warm-up
            "setup_s": max(fit_s - n_steps * seconds, 0.0) if n_steps else float("nan"),
        }
        row.update(extra or {})
        self.table.append(row)
        self.log(f"  {net.name:>15} {grid:>5} {mode:>8}: {seconds * 1e3:10.2f} ms/step, set-up {row['setup_s']:.3g} s")
        return row

    def serial(self, net: _Net, steps: int, warmup: int | None = None) -> dict:

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

    def npt(self, net: _Net, grid: str, mode: str, steps: int, warmup: int | None = None, *, breakdown=False) -> dict:

        warmup = self.config.warmup if warmup is None else warmup
        probe_s = _probe(self.client) if grid == "auto" else 0.0
        # "graph-double": graph mode told to use that pipeline, and the row's label
        engine_mode, _, pipeline = mode.partition("-")
        t = NPTTrainer(
            **_kwargs(net.sizes, net.batch, self.config),
            grid=grid,
            mode=engine_mode,
            engine={"share_workers": True, "timeout": 600.0, "pipeline": pipeline or "auto"},
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
        extra["predicted_s"] = self.predicted(net, t)
        if grid == "auto":
            grid, mode = f"{t.grid_.rows}x{t.grid_.cols}", f"auto-{t.mode_}"
        row = self.record(net, grid, mode, seconds, extra, fit=(fit_s, steps + warmup))
        if breakdown:
            self.breakdowns.append(npt_breakdown.collect(row, t.worker_times_, warmup))
        return row

    def predicted(self, net: _Net, trainer: NPTTrainer) -> float:
        """The cost model's seconds per step for the grid, mode and pipeline ``trainer`` ran (NaN without a model)."""
        if self.cost is None:
            return float("nan")
        pipeline = trainer.history_.attrs.get("pipeline")
        return self.cost.predict(
            net.sizes,
            net.batch,
            (trainer.grid_.rows, trainer.grid_.cols),
            mode=trainer.mode_,
            itemsize=np.dtype(self.config.dtype).itemsize,
            n_workers=self.n_workers,
            chains=None if pipeline is None else CHAINS[pipeline],
        )

    def peer(self, net: _Net, grid: str, steps: int, warmup: int | None = None) -> dict:

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
        shape, mode, table = costmodel.choose_grid(
            cost, net.sizes, net.batch, n_workers=self.n_workers, itemsize=np.dtype(self.config.dtype).itemsize
        )
        self.plans[net.name] = {"grid": f"{shape[0]}x{shape[1]}", "mode": mode, "table": table}
        return self.plans[net.name]


def run(client, config: BenchConfig | None = None, *, log=print) -> dict:
    """Run the sweep on ``client``'s cluster; returns ``{"table", "checks", "machine", "config", "plans"}``
    (with ``config.breakdown`` also ``"breakdown"`` and, with the large net, ``"products_alone"``; see
    :mod:`daskann.bench.npt_breakdown`)."""
    config = config or BenchConfig()
    sweep = _Sweep(client, config, len(worker_addresses(client)), log)
    rates = [gemm_rate(client, config.gemm_size, config.dtype)]
    log(f"single-thread GEMM, n={config.gemm_size}: {rates[0] / 1e9:.3g} GFLOP/s")
    t0 = time.perf_counter()
    cost = sweep.cost = costmodel.measure(client)
    probe_s = time.perf_counter() - t0
    log(f"cost model ({probe_s:.3g} s): {json.dumps(cost.to_dict())}")
    _paper_nets(sweep, cost)
    _large_net(sweep, cost)
    _width_sweep(sweep)
    rates += [*sweep.probes, gemm_rate(client, config.gemm_size, config.dtype)]  # in the order taken
    hardware = {
        # the fastest probe: a GEMM slowed by other load on the machine would flatter every row
        "gemm_rate": max(rates),
        "gemm_rates": rates,
        "gemm_size": config.gemm_size,
        "cores": cluster_cores(client),
        "cost_model_s": probe_s,
    }
    _derive(sweep.table, hardware)
    result = {
        "table": sweep.table,
        "checks": checks(sweep.table, sweep.plans, sweep.pairs),
        "machine": npt_machine(client),
        "config": asdict(config),
        "plans": sweep.plans,
        "cost_model": cost.to_dict(),
        "hardware": hardware,
    }
    if config.breakdown:
        result["breakdown"] = sweep.breakdowns
        alone = sweep.products_alone
        if alone is not None:
            alone["bound_s"] = alone["flops"] / (hardware["cores"] * alone["gemm_rate"])
            alone["hw_efficiency"] = alone["bound_s"] / alone["seconds"]
            result["products_alone"] = alone
    return result


def _single_thread_gemm_rate(n: int, dtype: str, repeats: int) -> float:
    """Peak rate of an ``n x n`` GEMM on one BLAS thread: the fastest of ``repeats`` (runs on a worker)."""
    with threadpool_limits(1):
        return _gemm_rate(n, repeats=repeats, dtype=dtype)


def gemm_rate(client, n: int = 2048, dtype: str = "float64", repeats: int = 5) -> float:
    """Single-thread GEMM flop rate of one worker while the others are idle (the client's without workers)."""
    workers = worker_addresses(client) if client is not None else []
    if workers:
        return client.run(_single_thread_gemm_rate, n, dtype, repeats, workers=workers[:1])[workers[0]]
    return _single_thread_gemm_rate(n, dtype, repeats)


def _usable_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def cluster_cores(client) -> int:
    """Cores the cluster's workers can run on: per host, the fewer of its cores and its worker threads."""

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
            if "resident" in config.modes:
                run.npt(net, grid, "resident", config.resident_steps)
            for mode in _graph_modes(config):
                run.npt(net, grid, mode, config.graph_steps)
            if "dask" in config.modes:
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
    gflop = costmodel.step_product_flops(net.sizes, net.batch) / 1e9
    run.log(f"{net.name}: sizes {net.sizes}, batch {net.batch}, {gflop:.4g} GFLOP per step")
    steps, warm, breakdown = config.large_steps, config.large_warmup, config.breakdown
    probes = run.probes
    probes.append(gemm_rate(run.client, config.gemm_size, config.dtype))

    def side_by_side(row: dict) -> None:
        # each row against the GEMM rate probed just before and just after it
        probes.append(gemm_rate(run.client, config.gemm_size, config.dtype))
        row["gemm_rate"] = max(probes[-2:])

    side_by_side(run.serial(net, steps, warm))
    for grid in config.large_grids:
        for mode in _graph_modes(config):
            side_by_side(run.npt(net, grid, mode, steps, warm, breakdown=breakdown))
        if "resident" in config.modes:
            side_by_side(run.npt(net, grid, "resident", steps, warm, breakdown=breakdown))
        if "dask" in config.modes and _cells(grid) > 1:
            side_by_side(run.peer(net, grid, steps, warm))
    run.plan(cost, net)
    if "auto" in config.modes:
        # always run it: its row is the one held against the hardware's bound
        side_by_side(run.npt(net, "auto", "auto", steps, warm, breakdown=breakdown))
    if breakdown:
        # what no engine can beat on these cores, probed as the rows are
        run.products_alone = npt_breakdown.products_alone(run.client, net.sizes, net.batch, config.dtype)
        side_by_side(run.products_alone)


def _width_sweep(run: _Sweep) -> None:
    """Resident mode against serial over the width of two-hidden-layer nets, on 2x2."""
    config = run.config
    if not config.widths or "resident" not in config.modes:
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


__all__ = ["PAPER_NETS", "BenchConfig", "cluster_cores", "gemm_rate", "run"]
