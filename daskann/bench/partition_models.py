"""The paper's model sizes in ``daskann bench partition``: presets, equal-time accuracy gaps, the per-seed table.

Miranda & Von Zuben time partitioned training on MNIST with a 3-layer model
of about 430k parameters and a 4-layer one of about 2.1M. ``--model`` picks
either size (``paper-430k``: 784-368-368-10, 428,362 parameters;
``paper-2.1m``: 784-844-844-844-10, 2,097,350 parameters) on 784-wide data:
MNIST from its local IDX files when ``--data-path`` is given, otherwise
MNIST-1D upsampled to 784 features (:func:`daskann.data.upsample_signals`),
named in the report.

Every partitioned run also gets its accuracy gap at the end: its final
validation accuracy minus the full network's at the same wall time (the full
run's last evaluation at or before the partitioned run's total wall time).
"""

from __future__ import annotations

import numpy as np

from daskann._validation import check_choice, invalid
from daskann.data import Dataset, load_dataset, upsample_signals

#: the 784-wide stand-in for MNIST when no MNIST files are given
STAND_IN = "mnist1d-784"
DESCRIPTIONS = {
    STAND_IN: "MNIST-1D generated offline, each 40-point signal upsampled to 784 features by linear "
    "interpolation (scaled by sqrt(40/784)); a stand-in for MNIST",
    "mnist": "MNIST training IDX files",
}

# both sizes share the MNIST-sized optimiser of the existing presets
_SHARED = dict(lr=0.05, momentum=0.9, batch_size=64, ks=(2, 4), seeds=3)
#: per model: network and schedule, then per data set the samples and the target. Schedules are sized for
#: about 12 minutes of a whole preset on two cores. Targets: the full network reaches them and a width-H/2
#: network trained as long does not, in a pilot of one seed on the stand-in (validation every 250 steps).
#: 784-368-368-10 on 10,000 samples: best 0.802 in 4,000 steps, 0.788 first at step 2,750; width 184 best
#: 0.759, width 92 best 0.748. 784-844-844-844-10: on 10,000 samples width 422 matches it (0.791 vs 0.793
#: at step 1,750), so it gets 20,000: best 0.824 (step 1,750) in 2,000 steps, width 422 best 0.803, width
#: 211 (10,000 samples) 0.770. Its sub-models train 3.4 times faster per step than the full network, so
#: they get three quarters of the full network's steps. Both validate every 100 steps: at 200, a fine-tuning
#: step of the 2.1M net costing 33 ms, time to target moved in jumps of 6.6 s, a fifth of the partitioned
#: runs' own time. MNIST targets are the mnist preset's, not piloted.
MODELS = {
    "paper-430k": dict(
        _SHARED,
        hidden=(368, 368),
        steps=4000,
        sub_steps=2000,
        finetune_steps=1000,
        eval_every=100,
        data={STAND_IN: dict(n_samples=10000, target=0.78), "mnist": dict(n_samples=20000, target=0.965)},
    ),
    "paper-2.1m": dict(
        _SHARED,
        hidden=(844, 844, 844),
        steps=2000,
        sub_steps=1500,
        finetune_steps=500,
        eval_every=100,
        data={STAND_IN: dict(n_samples=20000, target=0.81), "mnist": dict(n_samples=20000, target=0.965)},
    ),
}
#: the paper's time-to-target speedups with 2 sub-models (sequential: quoted for the smaller model)
PAPER_SPEEDUPS = {"paper-430k": {"parallel-2": 2.1, "sequential-2": 1.45}, "paper-2.1m": {"parallel-2": 3.0}}


def model_settings(model: str, dataset: str | None, data_path) -> dict:
    """The preset of ``model`` on ``dataset`` (default: MNIST when ``data_path`` is given, else the stand-in)."""
    model = check_choice("model", model, tuple(MODELS))
    dataset = dataset or ("mnist" if data_path is not None else STAND_IN)
    spec = dict(MODELS[model])
    per_data = spec.pop("data")
    if dataset not in per_data:
        raise invalid("dataset", dataset, f"one of {', '.join(map(repr, per_data))}: model {model!r} is 784 wide")
    return dict(spec, **per_data[dataset], dataset=dataset, model=model)


def load_stand_in(n_samples: int | None, seed: int) -> Dataset:
    """MNIST-1D upsampled to 784 features, split as :func:`load_dataset` splits MNIST-1D."""
    data = load_dataset("mnist1d", n_samples=n_samples, seed=seed)
    return Dataset(
        data.name,
        upsample_signals(data.X_train),
        data.y_train,
        upsample_signals(data.X_val),
        data.y_val,
        data.task,
        data.loss,
    )


def parameter_count(sizes) -> int:
    """Weights and biases of a dense network with layer widths ``sizes``."""
    return int(sum((a + 1) * b for a, b in zip(sizes[:-1], sizes[1:], strict=True)))


def describe(config, data) -> dict:
    """The report's ``data`` and ``model`` entries: what was trained on, and how large the network is."""
    sizes = [data.n_features, *config.hidden, data.n_outputs]
    data_entry = {
        "dataset": config.dataset,
        "description": DESCRIPTIONS.get(config.dataset, config.dataset),
        "n_features": data.n_features,
        "n_outputs": data.n_outputs,
        "n_train": len(data.y_train),
        "n_val": len(data.y_val),
    }
    model_entry = {
        "name": config.model,
        "sizes": sizes,
        "parameters": parameter_count(sizes),
        "submodel_parameters": {
            str(k): parameter_count([sizes[0], *(-(-h // k) for h in config.hidden), sizes[-1]]) for k in config.ks
        },
    }
    return {"data": data_entry, "model": model_entry}


# -- accuracy at equal wall time ----------------------------------------------------
def accuracy_at(curve, seconds: float) -> float | None:
    """Accuracy of the last evaluation of ``curve`` (``[time, accuracy]`` rows) at or before ``seconds``."""
    reached = [a for t, a in curve if t <= seconds and np.isfinite(a)]
    return float(reached[-1]) if reached else None


def add_equal_time_gaps(runs: list[dict]) -> None:
    """Give every partitioned run the full network's accuracy at its total wall time, and its gap in points."""
    full = {r["seed"]: r for r in runs if r["variant"] == "full"}
    for run in runs:
        if not run["variant"].startswith(("parallel", "sequential")):
            continue
        base = accuracy_at(full[run["seed"]]["curve"], run["seconds"])
        run["full_accuracy_at_equal_time"] = base
        gap = None if base is None or run["final_accuracy"] is None else 100 * (run["final_accuracy"] - base)
        run["accuracy_gap_points"] = None if gap is None else round(gap, 3)


def add_gap_medians(summary: dict, runs: list[dict]) -> None:
    """``median_accuracy_gap_points`` of every partitioned variant in ``summary``."""
    for name, entry in summary.items():
        gaps = [r.get("accuracy_gap_points") for r in runs if r["variant"] == name]
        if name.startswith(("parallel", "sequential")) and gaps:
            entry["median_accuracy_gap_points"] = None if None in gaps else float(np.median(gaps))


# -- the per-seed table -------------------------------------------------------------
def _speedup(base: dict, run: dict | None) -> float | None:
    if run is None or base["time_to_target"] is None or run["time_to_target"] is None:
        return None
    return round(base["time_to_target"] / run["time_to_target"], 3)


def _median_row(rows: list[dict]) -> dict:
    row = dict(rows[0], seed="median")
    for key in ("parallel_speedup", "sequential_speedup", "parallel_gap_points", "sequential_gap_points"):
        values = [r[key] for r in rows]
        if key.endswith("speedup"):
            # a run that never reached the target counts as infinitely slow (speedup 0), as in the summary
            median = float(np.median([0.0 if v is None else v for v in values]))
            row[key] = round(median, 3) if median > 0 else None
        else:
            row[key] = None if None in values else round(float(np.median(values)), 3)
    return row


def seed_table(report: dict) -> list[dict]:
    """Model, k, parallel and sequential speedup and accuracy gap: a row per seed and ``k``, then their median."""
    runs, model = report["runs"], report["model"]
    label = model["name"] or "-".join(map(str, model["sizes"]))
    by_key = {(r["variant"], r["seed"]): r for r in runs if "submodel" not in r}
    seeds = sorted({r["seed"] for r in runs})
    table = []
    for k in report["config"]["ks"]:
        rows = []
        for seed in seeds:
            base = by_key[("full", seed)]
            par, seq = by_key.get((f"parallel-{k}", seed)), by_key.get((f"sequential-{k}", seed))
            rows.append(
                {
                    "model": label,
                    "parameters": model["parameters"],
                    "k": k,
                    "seed": seed,
                    "parallel_speedup": _speedup(base, par),
                    "sequential_speedup": _speedup(base, seq),
                    "parallel_gap_points": None if par is None else par.get("accuracy_gap_points"),
                    "sequential_gap_points": None if seq is None else seq.get("accuracy_gap_points"),
                }
            )
        table.extend(rows)
        if rows:
            table.append(_median_row(rows))
    return table


def format_seed_table(report: dict) -> list[str]:
    """The per-seed table as lines of text (speedups in time to target, gaps in accuracy points)."""

    def cell(value, unit: str) -> str:
        return "-" if value is None else (f"{value:.2f}x" if unit == "x" else f"{value:+.2f}")

    lines = [
        f"{'model':>14s} {'params':>10s} {'k':>2s} {'seed':>6s} {'parallel':>9s} {'sequential':>11s} "
        f"{'gap par (pts)':>14s} {'gap seq (pts)':>14s}"
    ]
    for row in report.get("table", []):
        lines.append(
            f"{row['model']:>14s} {row['parameters']:>10,d} {row['k']:>2d} {row['seed']!s:>6s} "
            f"{cell(row['parallel_speedup'], 'x'):>9s} {cell(row['sequential_speedup'], 'x'):>11s} "
            f"{cell(row['parallel_gap_points'], 'pts'):>14s} {cell(row['sequential_gap_points'], 'pts'):>14s}"
        )
    return lines


def paper_acceptance(summary: dict, model: str | None) -> dict | None:
    """Whether the medians reach the paper's speedups for ``model`` (``None`` without a paper model)."""
    if model is None:
        return None
    out = {}
    for variant, wanted in PAPER_SPEEDUPS[model].items():
        got = summary.get(variant, {}).get("median_speedup")
        out[variant] = {"paper_speedup": wanted, "median_speedup": got, "met": bool(got is not None and got >= wanted)}
    out["met"] = all(entry["met"] for entry in out.values())
    return out


def format_paper_acceptance(paper: dict) -> list[str]:
    """A line per paper speedup: what the paper reports, the median measured here."""
    lines = []
    for variant, entry in paper.items():
        if variant == "met":
            continue
        got = entry["median_speedup"]
        lines.append(
            f"paper {variant}: {entry['paper_speedup']:.2f}x; median here "
            f"{'-' if got is None else f'{got:.2f}x'}: {'met' if entry['met'] else 'NOT met'}"
        )
    return lines
