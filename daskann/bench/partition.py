"""``daskann bench partition``: time to a target validation accuracy, side by side.

For every seed the benchmark trains, on one Dask cluster and with one BLAS
thread in every process (client and workers):

* ``full``: the full network from scratch with the serial trainer;
* ``alone-k``: networks of width ``H/k`` alone, for as many steps as
  ``full`` (the target must be out of their reach, else a speedup only shows
  that a smaller net trains faster). When the sub-models train at least that
  long they are these networks (each from its own seed) and their curves up
  to ``steps`` are used; otherwise one is trained separately;
* ``parallel-k``: :class:`PartitionTrainer` with the ``k`` sub-models as
  parallel futures, then merge and fine-tuning;
* ``sequential-k``: the same sub-models trained one after another
  (:meth:`PartitionTrainer.fit_submodels` with ``mode="sequential"``). Their
  weights are checked to be bit-identical to the parallel ones, so the merge
  and the fine-tuning are the same computation: its time to target is the
  sequential sub-model wall time plus the parallel run's time from the end of
  its sub-model phase.

Every variant validates every ``eval_every`` steps; time to target is the
wall time of the first evaluation at or above the target, counting for the
partitioned variants the sub-model futures (data scatter and result transfer
included), the merge and the fine-tuning. Medians over seeds are quoted.

On a machine shared with other work, wall time also measures how the load
moved during the run, so the report adds a CPU-time estimate beside it: each
phase's wall time scaled by the CPU time its training thread received (the
sub-model phase counts the busiest worker when parallel, all sub-models when
sequential). It is the time the run would take with the cores to itself.
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np
from threadpoolctl import threadpool_limits

from daskann import _plotting
from daskann._json import write_json
from daskann._validation import check_choice, check_float, check_hidden_sizes, check_int, invalid
from daskann.bench._report import partition_machine
from daskann.bench.partition_models import (
    STAND_IN,
    add_equal_time_gaps,
    add_gap_medians,
    describe,
    format_paper_acceptance,
    format_seed_table,
    load_stand_in,
    model_settings,
    paper_acceptance,
    seed_table,
)
from daskann.cluster import client as make_client
from daskann.cluster import close
from daskann.data import load_dataset
from daskann.partition.merge import check_combine, check_noise
from daskann.partition.split import check_hidden_k
from daskann.partition.trainer import PartitionTrainer
from daskann.serial import SerialTrainer

DATASETS = ("mnist1d", "digits", "mnist", "cifar10")

#: defaults per data set: chosen so that the full network reaches the target
#: and a width-H/2 network trained as long does not (see the issue's note).
#: MNIST-1D: 10,000 samples (8,000 for training); in a first 5-seed run at
#: target 0.81 with 3,000 steps, one width-256 network reached 0.8225, so the
#: target sits above that and the full network gets 4,000 steps to reach it.
# the MNIST-sized sets share the optimiser and the sub-model, fine-tuning and validation schedule
_MNIST_SIZED = dict(lr=0.05, momentum=0.9, batch_size=64, sub_steps=2000, finetune_steps=1000, eval_every=100)
PRESETS = {
    "mnist1d": dict(_MNIST_SIZED, n_samples=10000, hidden=(512, 512, 512), steps=4000, target=0.825),
    "digits": dict(
        n_samples=None,
        hidden=(256, 256),
        lr=0.05,
        momentum=0.9,
        batch_size=32,
        steps=600,
        sub_steps=400,
        finetune_steps=300,
        eval_every=25,
        target=0.97,
    ),
    "mnist": dict(_MNIST_SIZED, n_samples=20000, hidden=(512, 512, 512), steps=3000, target=0.965),
    "cifar10": dict(_MNIST_SIZED, n_samples=20000, hidden=(512, 512, 512, 512), lr=0.01, steps=3000, target=0.45),
}


@dataclass(frozen=True)
class BenchmarkConfig:
    """Settings of one benchmark run (see :data:`PRESETS` for the defaults per data set)."""

    dataset: str = "mnist1d"
    data_path: str | None = None
    n_samples: int | None = 10000
    hidden: tuple[int, ...] = (512, 512, 512)
    ks: tuple[int, ...] = (2, 4)
    seeds: int = 5
    target: float = 0.825
    steps: int = 4000
    sub_steps: int = 2000
    finetune_steps: int = 1000
    lr: float = 0.05
    momentum: float = 0.9
    batch_size: int = 64
    eval_every: int = 100
    combine: str = "mean"
    noise: float = 0.02
    data_seed: int = 0
    extra: dict = field(default_factory=dict)
    model: str | None = None

    @classmethod
    def preset(cls, dataset: str | None = None, **overrides) -> BenchmarkConfig:
        """The data set's defaults, with ``overrides`` (``None`` values keep the default).

        With ``model`` (one of :data:`~daskann.bench.partition_models.MODELS`) the
        defaults are that paper model's on 784-wide data: ``"mnist"`` when
        ``data_path`` is given, else the ``"mnist1d-784"`` stand-in.
        """
        if overrides.get("model") is not None:
            values = model_settings(overrides["model"], dataset, overrides.get("data_path"))
        else:
            dataset = check_choice("dataset", dataset or "mnist1d", DATASETS)
            values = dict(PRESETS[dataset], dataset=dataset)
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values).validated()

    @classmethod
    def from_options(cls, **opts) -> BenchmarkConfig:
        """Build from the ``daskann bench partition`` options."""
        hidden, ks = opts.get("hidden"), opts.get("ks")
        # the options named as the configuration's fields, None where not given
        same = ("n_samples", "seeds", "target", "steps", "sub_steps", "finetune_steps", "lr", "momentum")
        same += ("batch_size", "eval_every", "combine")
        return cls.preset(
            opts.get("dataset"),
            model=opts.get("model"),
            data_path=None if opts.get("data_path") is None else str(opts["data_path"]),
            hidden=None if hidden is None else _int_tuple("hidden", hidden),
            ks=None if ks is None else _int_tuple("k", ks),
            noise=opts.get("merge_noise"),
            **{k: opts.get(k) for k in same},
        )

    def validated(self) -> BenchmarkConfig:
        """A checked copy; raises before any data loads or task runs."""
        check_choice("dataset", self.dataset, (*DATASETS, STAND_IN) if self.model else DATASETS)
        hidden = check_hidden_sizes(self.hidden, name="hidden")
        if not self.ks:
            raise invalid("k", self.ks, "at least one number of sub-models")
        ks = tuple(check_hidden_k(k, hidden) for k in self.ks)
        target = check_float("target", self.target, minimum=0.0, maximum=1.0, min_inclusive=False)
        if self.dataset in ("mnist", "cifar10") and self.data_path is None:
            raise invalid("data_path", None, f"the local folder holding the {self.dataset} files")
        return replace(
            self,
            hidden=hidden,
            ks=ks,
            target=target,
            seeds=check_int("seeds", self.seeds),
            n_samples=None if self.n_samples is None else check_int("n_samples", self.n_samples),
            steps=check_int("steps", self.steps),
            sub_steps=check_int("sub_steps", self.sub_steps),
            finetune_steps=check_int("finetune_steps", self.finetune_steps),
            lr=check_float("lr", self.lr, minimum=0.0, min_inclusive=False),
            momentum=check_float("momentum", self.momentum, minimum=0.0, maximum=1.0, max_inclusive=False),
            batch_size=check_int("batch_size", self.batch_size),
            eval_every=check_int("eval_every", self.eval_every),
            combine=check_combine(self.combine),
            noise=check_noise(self.noise),
        )


def _int_tuple(name: str, value) -> tuple[int, ...]:
    if isinstance(value, (tuple, list)):
        return tuple(value)
    try:
        return tuple(int(v) for v in str(value).split(",") if v.strip())
    except ValueError:
        raise invalid(name, value, "comma-separated integers, e.g. 2,4") from None


# -- measuring ------------------------------------------------------------------
def time_to_target(times, accuracies, target: float) -> float | None:
    """Wall time of the first evaluation at or above ``target`` (``None`` if never)."""
    for t, a in zip(times, accuracies, strict=True):
        if np.isfinite(a) and a >= target:
            return float(t)
    return None


def _curve(history, phases=None):
    """``(time, val_accuracy)`` of the evaluation rows (optionally of some phases only)."""
    rows = ~np.isnan(history["val_accuracy"].values)
    if phases is not None:
        rows &= np.isin(history["phase"].values, phases)
    return history["time"].values[rows].astype(float), history["val_accuracy"].values[rows].astype(float)


def _record(times, accs, target, **extra) -> dict:
    return {
        "time_to_target": time_to_target(times, accs, target),
        "final_accuracy": float(accs[-1]) if len(accs) else None,
        "best_accuracy": float(np.max(accs)) if len(accs) else None,
        "curve": [[round(float(t), 4), round(float(a), 5)] for t, a in zip(times, accs, strict=True)],
        **extra,
    }


def _load(config: BenchmarkConfig):
    if config.dataset == STAND_IN:
        return load_stand_in(config.n_samples, config.data_seed)
    return load_dataset(config.dataset, n_samples=config.n_samples, path=config.data_path, seed=config.data_seed)


def run_benchmark(
    config: BenchmarkConfig,
    *,
    client=None,
    address: str | None = None,
    n_workers: int = 2,
    output=None,
    progress=None,
) -> dict:
    """Run the benchmark and return its report (also written to ``output``).

    Parameters
    ----------
    config : BenchmarkConfig
    client : distributed.Client, optional
        Run on this client; otherwise one on ``address`` or an embedded
        LocalCluster of ``n_workers`` workers (closed at the end).
    output : path, optional
        Folder for ``partition-bench.json`` and ``partition-bench.png``.
    progress : callable, optional
        Called with one line of text per finished variant.

    Returns
    -------
    dict
        JSON-safe report: ``config``, ``machine``, ``runs`` (one record per
        seed and variant with its validation curve), ``summary`` (medians
        per variant), ``acceptance`` and ``files``.
    """
    config = config.validated()
    n_workers = check_int("workers", n_workers)
    if client is not None:
        return run(client, config, output=output, progress=progress)
    owned = make_client(address, n_workers=None if address else n_workers, quiet=True, dashboard=False)
    try:
        return run(owned, config, output=output, progress=progress)
    finally:
        close(owned)


def run(client, config: BenchmarkConfig, *, output=None, progress=None) -> dict:
    """Run the benchmark on ``client``'s cluster (see :func:`run_benchmark`)."""
    config = config.validated()
    data = _load(config)
    started = time.perf_counter()
    report = {
        "benchmark": "partition",
        "config": {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(config).items()},
        "runs": [],
        **describe(config, data),
    }
    _run_seeds(report, config, data, client, started=started, output=output, say=progress or (lambda line: None))
    report["machine"]["load_average_after"] = _loadavg()
    report["seconds"] = round(time.perf_counter() - started, 2)
    report["summary"] = summarize_runs(report["runs"], config)
    add_gap_medians(report["summary"], report["runs"])
    report["acceptance"] = acceptance(report["summary"], config)
    if config.model is not None:
        report["acceptance"]["paper"] = paper_acceptance(report["summary"], config.model)
    report["table"] = seed_table(report)
    if output is not None:
        report["files"] = write_report(report, output)
    return report


def _run_seeds(report: dict, config: BenchmarkConfig, data, client, *, started: float, output, say) -> None:
    """Every seed's runs into ``report``, with the machine they ran on."""
    report["machine"] = partition_machine(client)
    report["machine"]["load_average_before"] = _loadavg()
    # every process trains with one BLAS thread, as each worker does
    with threadpool_limits(limits=1, user_api="blas"):
        for seed in range(config.seeds):
            report["runs"].extend(_one_seed(config, data, client, seed, say))
            report["seconds"] = round(time.perf_counter() - started, 2)
            report["seeds_done"] = seed + 1
            if output is not None and seed + 1 < config.seeds:
                _write_json(report, output)  # a long run leaves its partial results behind


def _loadavg():
    try:
        return [round(v, 2) for v in os.getloadavg()]
    except OSError:
        return None


def _timed_fit(trainer, *args, **kwargs):
    """Fit and return ``(wall seconds, CPU seconds of this thread)``."""
    t0, c0 = time.perf_counter(), time.thread_time()
    trainer.fit(*args, **kwargs)
    return time.perf_counter() - t0, time.thread_time() - c0


def _cpu_of_submodels(results, parallel: bool) -> float:
    """CPU seconds of the sub-model phase: the busiest worker's sum (parallel) or the total."""
    if not parallel:
        return float(sum(r.cpu_seconds for r in results))
    per_worker: dict = {}
    for r in results:
        per_worker[r.worker] = per_worker.get(r.worker, 0.0) + r.cpu_seconds
    return float(max(per_worker.values()))


@dataclass(frozen=True)
class _Seed:
    """What every variant of one seed shares: settings, data, cluster and trainer keywords."""

    config: BenchmarkConfig
    data: object
    client: object
    seed: int

    @property
    def common(self) -> dict:
        c = self.config
        return dict(
            loss=self.data.loss,
            lr=c.lr,
            sgd={"momentum": c.momentum},
            batch_size=c.batch_size,
            seed=self.seed,
        )

    @property
    def evaluated(self) -> dict:
        """``fit``'s validation keywords: every variant validates every ``eval_every`` steps."""
        return {"validation_data": (self.data.X_val, self.data.y_val), "eval_every": self.config.eval_every}

    def partition(self, k: int, mode: str):
        c = self.config
        return PartitionTrainer(
            c.hidden,
            **self.common,
            k=k,
            merge={"combine": c.combine, "noise": c.noise},
            split={"sub_steps": c.sub_steps, "mode": mode},
            client=self.client,
        )


def _one_seed(config: BenchmarkConfig, data, client, seed: int, say) -> list[dict]:
    """The runs of one seed: full, then per ``k`` alone, parallel and sequential."""
    s = _Seed(config, data, client, seed)
    runs = []

    def add(*records):
        for record in records:
            runs.append(record)
            say(_line(record))

    add(_serial(s))
    for k in config.ks:
        alone = _serial(s, k) if config.sub_steps < config.steps else None
        if alone is not None:
            add(alone)
        par, record = _parallel(s, k)
        add(record)
        if alone is None:
            add(*_alone_from_submodels(s, k, par))
        add(_sequential(s, k, par, record))
    for run in runs:
        run["cpu_time_to_target"] = _cpu_time_to_target(run)
    add_equal_time_gaps(runs)
    return runs


def _serial(s: _Seed, k: int = 1) -> dict:
    """The full network from scratch, serially; with ``k``, the widest sub-model of the split alone as long."""
    c = s.config
    hidden = tuple(-(-h // k) for h in c.hidden)
    trainer = SerialTrainer(hidden, **s.common)
    wall, cpu = _timed_fit(trainer, s.data.X_train, s.data.y_train, steps=c.steps, **s.evaluated)
    t, a = _curve(trainer.history_)
    fields = {"variant": "full" if k == 1 else f"alone-{k}", "k": k, "seed": s.seed, "steps": c.steps}
    if k > 1:
        fields["hidden"] = hidden
    record = _record(t, a, c.target, **fields, seconds=wall, cpu_seconds=cpu)
    if k == 1:
        record["cpu_scale"] = cpu / wall
    return record


def _parallel(s: _Seed, k: int):
    """:class:`PartitionTrainer` with parallel sub-models; the trainer and its record."""
    c = s.config
    par = s.partition(k, "parallel")
    par.fit(s.data.X_train, s.data.y_train, steps=c.finetune_steps, **s.evaluated)
    t, a = _curve(par.history_, phases=["merge", "finetune"])
    st, sa = _curve(par.history_, phases=["submodel"])
    timings, results = par.timings_, par.submodel_results_
    record = _record(
        t,
        a,
        c.target,
        variant=f"parallel-{k}",
        k=k,
        seed=s.seed,
        sub_steps=c.sub_steps,
        steps=c.finetune_steps,
        seconds=float(timings["total"]),
        seconds_submodels=timings["submodel"],
        seconds_merge=timings["merge"],
        seconds_finetune=timings["finetune"],
        submodel_training_seconds=timings["submodel_each"],
        submodel_cpu_seconds=timings["submodel_cpu_each"],
        cpu_submodels=_cpu_of_submodels(results, parallel=True),
        finetune_cpu_scale=timings["finetune_cpu"] / timings["finetune"],
        merged_at=timings["submodel"] + timings["merge"],
        merged_accuracy=float(par.history_["val_accuracy"].values[par.history_["phase"].values == "merge"][0]),
        submodel_curve=[[round(float(x), 4), round(float(y), 5)] for x, y in zip(st, sa, strict=True)],
        submodel_accuracy=[float(r.history["val_accuracy"].dropna("step").values[-1]) for r in results],
        workers=[r.worker for r in results],
        overlap=_overlap(results),
        diversity={"representation": par.diversity_["representation"], "disagreement": par.diversity_["disagreement"]},
    )
    return par, record


def _alone_from_submodels(s: _Seed, k: int, par) -> list[dict]:
    """Each sub-model is a width-H/k network trained alone for at least the full network's steps."""
    records = []
    for r in par.submodel_results_:
        h = r.history.sel(step=slice(1, s.config.steps))
        t, a = _curve(h)
        records.append(
            _record(
                t,
                a,
                s.config.target,
                variant=f"alone-{k}",
                k=k,
                seed=s.seed,
                steps=s.config.steps,
                hidden=list(par.partition_.submodel_sizes(r.index)[1:-1]),
                submodel=r.index,
                seconds=float(h["time"].values[-1]),
            )
        )
    return records


def _sequential(s: _Seed, k: int, par, par_record: dict) -> dict:
    """The same sub-models one after another; the merge and fine-tuning are the parallel run's."""
    c = s.config
    seq = s.partition(k, "sequential")
    seq.fit_submodels(s.data.X_train, s.data.y_train, **s.evaluated)
    identical = all(
        all(np.array_equal(p, q) for p, q in zip(m1.params, m2.params, strict=True))
        for m1, m2 in zip(seq.submodels_, par.submodels_, strict=True)
    )
    if not identical:
        raise RuntimeError(
            f"seed={s.seed}, k={k}: sequential and parallel sub-models differ; "
            "the sub-model tasks are not deterministic on this cluster"
        )
    # same sub-models, same arithmetic: only the sub-model phase's duration differs
    t, a = _curve(par.history_, phases=["merge", "finetune"])
    shift = seq.timings_["submodel"] - par.timings_["submodel"]
    return _record(
        t + shift,
        a,
        c.target,
        variant=f"sequential-{k}",
        k=k,
        seed=s.seed,
        sub_steps=c.sub_steps,
        steps=c.finetune_steps,
        seconds=float(par.timings_["total"] + shift),
        seconds_submodels=seq.timings_["submodel"],
        identical_submodels=identical,
        cpu_submodels=_cpu_of_submodels(seq.submodel_results_, parallel=False),
        finetune_cpu_scale=par_record["finetune_cpu_scale"],
        merged_at=par_record["merged_at"] + shift,
        merged_accuracy=par_record["merged_accuracy"],
    )


def _cpu_time_to_target(run: dict) -> float | None:
    """Time to target counted in CPU seconds of the training threads (an estimate free of other load).

    Wall time is scaled by the run's CPU/wall ratio phase by phase: the full
    network by its own ratio, the partitioned runs' sub-model phase by the
    CPU time of the busiest worker (parallel) or of all sub-models
    (sequential), the fine-tuning by its ratio.
    """
    ttt = run["time_to_target"]
    if ttt is None:
        return None
    if run["variant"] == "full":
        return ttt * run["cpu_scale"]
    if "merged_at" not in run:
        return None
    return run["cpu_submodels"] + max(ttt - run["merged_at"], 0.0) * run["finetune_cpu_scale"]


def _overlap(results) -> float:
    """Seconds during which all sub-models ran at once (wall clock of the workers)."""
    start = max(r.started for r in results)
    stop = min(r.finished for r in results)
    return round(max(stop - start, 0.0), 4)


def _line(run: dict) -> str:
    ttt = run["time_to_target"]
    return (
        f"seed {run['seed']} {run['variant']:>13s}: time to target "
        f"{'not reached' if ttt is None else f'{ttt:7.2f} s'}, final accuracy {run['final_accuracy']:.4f}, "
        f"best {run['best_accuracy']:.4f}"
    )


# -- summary --------------------------------------------------------------------
def _median(values):
    values = [np.inf if v is None else v for v in values]
    if not values:
        return None
    m = float(np.median(values))
    return None if not np.isfinite(m) else m


def _ratio(base, own) -> float | None:
    return None if base is None or own is None else base / own


def _median_of(rows: list[dict], key: str) -> float:
    return float(np.median([r[key] for r in rows]))


def summarize_runs(runs: list[dict], config: BenchmarkConfig) -> dict:
    """Medians per variant: time to target, speedup over ``full`` (per seed), accuracies."""
    full = {r["seed"]: r for r in runs if r["variant"] == "full"}
    summary = {}
    for name in dict.fromkeys(r["variant"] for r in runs):
        rows = [r for r in runs if r["variant"] == name]
        speedups = [_ratio(full[r["seed"]]["time_to_target"], r["time_to_target"]) for r in rows]
        finite = [s for s in speedups if s is not None]
        cpu_speedups = [_ratio(full[r["seed"]].get("cpu_time_to_target"), r.get("cpu_time_to_target")) for r in rows]
        entry = summary[name] = {
            "seeds": len({r["seed"] for r in rows}),
            "runs": len(rows),
            "reached_target": sum(r["time_to_target"] is not None for r in rows),
            "median_time_to_target": _median([r["time_to_target"] for r in rows]),
            "median_speedup": float(np.median(finite)) if len(finite) == len(rows) and finite else None,
            "speedups": [None if s is None else round(s, 3) for s in speedups],
            "median_cpu_speedup": float(np.median(cpu_speedups)) if cpu_speedups and None not in cpu_speedups else None,
            "cpu_speedups": [None if c is None else round(c, 3) for c in cpu_speedups],
            "median_final_accuracy": _median_of(rows, "final_accuracy"),
            "median_best_accuracy": _median_of(rows, "best_accuracy"),
            "median_seconds": _median_of(rows, "seconds"),
        }
        if name != "full":
            diffs = [100 * (r["final_accuracy"] - full[r["seed"]]["final_accuracy"]) for r in rows]
            entry["median_final_accuracy_diff_points"] = float(np.median(diffs))
        if name.startswith(("parallel", "sequential")):
            entry["median_seconds_submodels"] = _median_of(rows, "seconds_submodels")
        if name.startswith("parallel"):
            entry["median_merged_accuracy"] = _median_of(rows, "merged_accuracy")
            for key in ("representation", "disagreement"):
                entry[f"median_diversity_{key}"] = float(np.median([r["diversity"][key] for r in rows]))
            entry["median_overlap_seconds"] = _median_of(rows, "overlap")
    return summary


def acceptance(summary: dict, config: BenchmarkConfig) -> dict:
    """The issue's figures: k=2 parallel at least 1.5x faster to target, final accuracy within 0.5 points."""
    out = {"target": config.target}
    for k in config.ks:
        alone = summary.get(f"alone-{k}")
        out[f"alone-{k}_never_reached_target"] = None if alone is None else alone["reached_target"] == 0
    par = summary.get("parallel-2")
    if par is not None:
        speedup = par["median_speedup"]
        diff = par["median_final_accuracy_diff_points"]
        out["parallel-2_median_speedup"] = speedup
        out["parallel-2_median_cpu_speedup"] = par.get("median_cpu_speedup")
        out["parallel-2_speedup_at_least_1.5"] = bool(speedup is not None and speedup >= 1.5)
        out["parallel-2_final_accuracy_diff_points"] = diff
        out["parallel-2_final_accuracy_within_0.5_points"] = bool(diff >= -0.5)
        out["met"] = bool(
            out["parallel-2_speedup_at_least_1.5"]
            and out["parallel-2_final_accuracy_within_0.5_points"]
            and out.get("alone-2_never_reached_target", True)
        )
    return out


# -- output ---------------------------------------------------------------------
def _write_json(report: dict, output) -> Path:
    return write_json(report, Path(output) / "partition-bench.json")


def write_report(report: dict, output) -> dict:
    """Write ``partition-bench.json`` and the plot; returns their paths."""
    folder = Path(output)
    folder.mkdir(parents=True, exist_ok=True)
    files = {"json": str(folder / "partition-bench.json")}
    try:
        files["png"] = str(plot_report(report, folder / "partition-bench.png"))
    except ImportError:
        files["png"] = None
    _write_json({**report, "files": files}, folder)
    return files


#: colour and label of each variant family in the plot
_COLOURS = {"full": "black", "parallel": "tab:blue", "sequential": "tab:orange", "alone": "tab:gray"}
_LABELS = {
    "full": "full network from scratch",
    "parallel": "{k} sub-models in parallel + merge + fine-tune",
    "sequential": "{k} sub-models one after another + merge + fine-tune",
    "alone": "width H/{k} network alone",
}


def plot_report(report: dict, path) -> Path:
    """Validation accuracy against wall time: full, parallel and sequential, one panel per k."""
    ks = report["config"]["ks"]
    fig, axes = _plotting.figure(len(ks), size=(6, 4.2))
    for ax, k in zip(axes, ks, strict=True):
        _plot_panel(ax, report, k)
    return _plotting.save(fig, path, dpi=120)


def _plot_panel(ax, report: dict, k: int) -> None:
    """One panel: every run of ``k`` sub-models (and the full network); seed 0 drawn bold."""
    config = report["config"]
    target = config["target"]
    for run in report["runs"]:
        family = run["variant"].split("-")[0]
        if run["variant"] != "full" and run["k"] != k:
            continue
        first = run["seed"] == 0 and run.get("submodel", 0) == 0
        colour = _COLOURS[family]
        xs, ys = zip(*run["curve"], strict=True) if run["curve"] else ((), ())
        ax.plot(
            xs,
            ys,
            color=colour,
            alpha=0.8 if first else 0.3,
            lw=1.4 if first else 0.8,
            label=_LABELS[family].format(k=k) if first else None,
            ls=":" if family == "alone" else "-",
        )
        if family in ("parallel", "sequential"):
            ax.axvline(run["seconds_submodels"], color=colour, alpha=0.15, lw=0.8)
        if family == "parallel" and run.get("submodel_curve"):
            sx, sy = zip(*run["submodel_curve"], strict=True)
            ax.plot(
                sx,
                sy,
                color=colour,
                alpha=0.35 if first else 0.15,
                lw=0.8,
                ls="--",
                label="sub-models (mean), parallel" if first else None,
            )
    ax.axhline(target, color="red", lw=0.8, ls="--", label=f"target {target:g}")
    ax.set_xlabel("wall time (s)")
    ax.set_ylabel("validation accuracy")
    ax.set_title(f"k = {k}: {config['dataset']} {'-'.join(map(str, config['hidden']))}")
    ax.set_xlim(left=0)
    ax.set_ylim(max(min(0.5, target - 0.2), 0.0), min(1.0, target + 0.1))
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")


def _times(speedup) -> str:
    return "-" if speedup is None else f"{speedup:.2f}x"


def format_report(report: dict) -> str:
    """The table of medians, with the run's settings, machine and acceptance, and the per-seed table, as text."""
    lines = []
    echo = lines.append
    c, m = report["config"], report["machine"]
    echo(
        f"partition benchmark: {c['dataset']} {'-'.join(map(str, c['hidden']))}, target accuracy {c['target']:g}, "
        f"{c['seeds']} seeds, full {c['steps']} steps, sub-models {c['sub_steps']} + fine-tune "
        f"{c['finetune_steps']} steps, lr {c['lr']:g}, momentum {c['momentum']:g}, batch {c['batch_size']}, "
        f"combine {c['combine']}, noise {c['noise']:g}"
    )
    if "data" in report:
        data, model = report["data"], report["model"]
        name = f"model {model['name']}: " if model["name"] else "network "
        echo(
            f"{name}{'-'.join(map(str, model['sizes']))}, {model['parameters']:,d} parameters; data "
            f"{data['dataset']}: {data['description']} ({data['n_train']} training, {data['n_val']} validation rows)"
        )
    blas = (m.get("client_blas") or [{}])[0]
    echo(
        f"machine: {m.get('cpu_model', m['processor'])}, {m['cpu_count']} cores, {m.get('workers')} workers x "
        f"{m.get('threads_per_worker')} thread, BLAS {blas.get('internal_api')} {blas.get('version')} "
        f"({blas.get('architecture')}), 1 BLAS thread per process; load average {m['load_average_before']} -> "
        f"{m['load_average_after']}"
    )
    header = (
        f"{'variant':>14s} {'reached':>8s} {'median ttt (s)':>15s} {'median speedup':>15s} "
        f"{'CPU-time speedup':>17s} {'final acc':>10s} {'vs full (pts)':>14s}"
    )
    echo(header)
    for name, s in report["summary"].items():
        ttt = s["median_time_to_target"]
        diff = s.get("median_final_accuracy_diff_points")
        echo(
            f"{name:>14s} {s['reached_target']:>4d}/{s['runs']:<3d} "
            f"{'-' if ttt is None else f'{ttt:.2f}':>15s} {_times(s['median_speedup']):>15s} "
            f"{_times(s.get('median_cpu_speedup')):>17s} "
            f"{s['median_final_accuracy']:>10.4f} {'' if diff is None else f'{diff:+.2f}':>14s}"
        )
    acc = report["acceptance"]
    if "met" in acc:
        echo(
            f"k=2 parallel: median speedup {_times(acc['parallel-2_median_speedup'])} (CPU time: "
            f"{_times(acc['parallel-2_median_cpu_speedup'])}), final accuracy "
            f"{acc['parallel-2_final_accuracy_diff_points']:+.2f} points vs full; acceptance "
            f"{'met' if acc['met'] else 'NOT met'}"
        )
    for k in c["ks"]:
        key = f"alone-{k}_never_reached_target"
        if acc.get(key) is not None:
            echo(f"width H/{k} alone reached the target: {'never' if acc[key] else 'YES (the target is too easy)'}")
    if report.get("table"):
        lines.extend(format_seed_table(report))
    if acc.get("paper"):
        lines.extend(format_paper_acceptance(acc["paper"]))
    if report.get("files"):
        files = report["files"]
        echo(f"report: {files['json']}" + (f", plot: {files['png']}" if files.get("png") else ""))
    return "\n".join(lines)
