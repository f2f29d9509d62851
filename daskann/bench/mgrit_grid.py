"""The ordinary-SGD grid: how MGRITTrainer fares where users train, against serial training.

``daskann bench mgrit --grid`` runs every preset asked for over learning rates
{1e-3, 1e-2, 5e-2} x momenta {0, 0.9} x three problems (an MLP on linear data,
digits with cross-entropy, MNIST-1D with cross-entropy), in this process, and
reports per cell how the adaptive fit ended, its iterations and attempts, the
relative error of its weights against :class:`daskann.SerialTrainer`, and two
speedup models: daskann's work model (critical path plus one unit per
iteration, the serial finish counted one unit a step) and the paper's
(Schroder 2017, eqs. 16-17, ``MGRITResult.potential_speedup``).
"""

from __future__ import annotations

import json
import math
import time
import warnings
from pathlib import Path

import dask

from daskann._json import json_default, write_json
from daskann.bench.mgrit import relative_error
from daskann.data import load_dataset, make_linear
from daskann.exceptions import MGRITDidNotPay
from daskann.mgrit.trainer import MGRITTrainer
from daskann.serial import SerialTrainer

LRS = (1e-3, 1e-2, 5e-2)
MOMENTA = (0.0, 0.9)
PROBLEMS = ("linear", "digits", "mnist1d")


def problem(name: str) -> dict:
    """Data and network of one grid problem."""
    if name == "linear":
        X, y = make_linear(256, 8, 2, seed=0)
        return {"X": X, "y": y, "hidden": (16, 16), "activation": "leaky_relu", "loss": "mse", "batch_size": 16}
    data = load_dataset(name, seed=0) if name == "digits" else load_dataset(name, n_samples=1000, seed=0)
    return {
        "X": data.X_train,
        "y": data.y_train,
        "hidden": (32,),
        "activation": "relu",
        "loss": "cross_entropy",
        "batch_size": 32,
    }


def run_cell(data: dict, preset: str, lr: float, momentum: float, steps: int, **solver) -> dict:
    """One adaptive MGRIT fit against serial training: the grid's row."""
    settings = {k: data[k] for k in ("activation", "loss", "batch_size")}
    settings.update(lr=lr, sgd={"momentum": momentum}, seed=0)
    serial = SerialTrainer(data["hidden"], **settings).fit(data["X"], data["y"], steps=steps)
    start = time.perf_counter()
    # the solve whatever it costs (the row says whether it paid)
    with warnings.catch_warnings(), dask.config.set({"daskann.mgrit.solve": "study"}):
        warnings.simplefilter("ignore", MGRITDidNotPay)
        trainer = MGRITTrainer(
            data["hidden"], preset=preset, solver=solver, engine={"scheduler": "inprocess"}, **settings
        )
        trainer.fit(data["X"], data["y"], steps=steps)
    seconds = time.perf_counter() - start
    result = trainer.result_
    path = sum(a.critical_path for a in result.adaptations)
    return {
        "preset": preset,
        "lr": lr,
        "momentum": momentum,
        "steps": steps,
        "ended": result.ended,
        "iterations": result.iterations,
        "adaptations": len(result.adaptations) - 1,
        "attempts": [f"{a.change or 'as configured'}: {a.outcome}" for a in result.adaptations],
        "error": relative_error(trainer.model_.params, serial.model_.params),
        "speedup_work_model": steps / path if path else math.nan,
        "potential_speedup": float(result.potential_speedup),
        "seconds": seconds,
    }


def run_grid(presets=("solver2",), *, steps: int = 256, problems=PROBLEMS, lrs=LRS, momenta=MOMENTA, log=print):
    """Every cell of the grid for every preset: a list of rows (:func:`run_cell`)."""
    rows = []
    for name in problems:
        data = problem(name)
        for preset in presets:
            for lr in lrs:
                for momentum in momenta:
                    row = {"problem": name, **run_cell(data, preset, lr, momentum, steps)}
                    rows.append(row)
                    if log is not None:
                        log(_line(row))
    return rows


def _line(row: dict) -> str:
    return (
        f"{row['problem']:8s} {row['preset']:8s} lr={row['lr']:<6g} momentum={row['momentum']:<4g} "
        f"{row['ended']:15s} it={row['iterations']:3d} adapt={row['adaptations']} err={row['error']:.1e} "
        f"S_work={row['speedup_work_model']:.2f} S_paper={row['potential_speedup']:.2f} {row['seconds']:.1f}s"
    )


def markdown(rows) -> str:
    """The rows as a markdown table."""
    head = (
        "| problem | preset | lr | momentum | ended | iterations | adaptations | error vs serial "
        "| speedup (work model) | speedup (paper) | seconds |\n|---|---|---|---|---|---|---|---|---|---|---|\n"
    )
    body = "".join(
        f"| {r['problem']} | {r['preset']} | {r['lr']:g} | {r['momentum']:g} | {r['ended']} | {r['iterations']} "
        f"| {r['adaptations']} | {r['error']:.1e} | {r['speedup_work_model']:.2f} | {r['potential_speedup']:.2f} "
        f"| {r['seconds']:.1f} |\n"
        for r in rows
    )
    return head + body


def main(opts: dict, *, echo=print) -> list[dict]:
    """``daskann bench mgrit --grid``: run the grid, ``echo`` the table, write ``bench-mgrit-grid.json``."""
    presets = [p.strip() for p in (opts.get("grid_presets") or "solver2").split(",") if p.strip()]
    steps = opts.get("grid_steps") or 256
    quiet = opts.get("quiet") or opts.get("as_json")
    rows = run_grid(presets, steps=steps, log=None if quiet else echo)
    write_json({"rows": rows}, Path(opts.get("output") or ".") / "bench-mgrit-grid.json", default=json_default)
    echo(json.dumps({"rows": rows}, default=json_default) if opts.get("as_json") else markdown(rows))
    return rows


__all__ = ["LRS", "MOMENTA", "PROBLEMS", "main", "markdown", "problem", "run_cell", "run_grid"]
