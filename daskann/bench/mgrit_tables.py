"""``daskann bench mgrit --paper``: the paper's Tables 1-16 and Figures 6-7 (Schroder 2017) reproduced.

The model problems and solver settings are :mod:`daskann.bench.mgrit_paper`'s;
this module runs them, prints each table beside the paper's iterations, and
writes ``bench-mgrit-paper.json``, a zarr store and the two figures.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np
import xarray as xr
from threadpoolctl import threadpool_limits

from daskann import _plotting
from daskann._json import write_json
from daskann._validation import check_choice, check_int, invalid
from daskann.bench import mgrit_paper as paper

PAPER_JSON = "bench-mgrit-paper.json"


def paper_tables(
    *, max_steps: int | None = None, tables=None, double_phi=False, max_iter: int = 50, say=lambda msg: None
) -> list[dict]:
    """Run the paper's Tables 1-16 (:data:`daskann.bench.mgrit_paper.TABLES`) in this process.

    Parameters
    ----------
    max_steps : int, optional
        Skip the entries with more steps.
    tables : sequence of int, optional
        Table numbers to run (all by default).
    double_phi : {False, "split", "repeat"}
        Coarse steps as two applications of Phi (:func:`daskann.mgrit.presets.paper_options`).
    max_iter : int
        The paper's 50.

    Returns
    -------
    list of dict
        One record per table in the layout of ``bench-mgrit-paper.json``, with
        the paper's iterations (``"paper"``, three-layer tables), the levels,
        residual histories and seconds of each entry besides.
    """
    problems: dict = {}
    records = []
    # the problems are tiny: a multi-threaded BLAS only spins (5x slower measured on 2 busy cores)
    with threadpool_limits(1):
        for spec in paper.TABLES:
            if tables is not None and spec["table"] not in tables:
                continue
            steps = [n for n in spec["steps"] if max_steps is None or n <= max_steps]
            if not steps:
                continue
            if spec["problem"] not in problems:
                problems[spec["problem"]] = paper.problem(spec["problem"])
            rec = {k: spec[k] for k in ("table", "problem", "solver", "cycle", "alpha_b", "alpha_max")}
            rec.update(steps=steps, iterations=[], converged=[], rho=[], potential_speedup=[])
            rec.update(paper=None if spec["paper"] is None else list(spec["paper"][: len(steps)]))
            rec.update(levels=[], residuals=[], seconds=[], double_phi=double_phi)
            for n in steps:
                t0 = time.perf_counter()
                result = paper.solve_paper(
                    problems[spec["problem"]],
                    n,
                    spec["solver"],
                    cycle=spec["cycle"],
                    alpha_b=spec["alpha_b"],
                    alpha_max=spec["alpha_max"],
                    double_phi=double_phi,
                    max_iter=max_iter,
                )
                rec["iterations"].append(result.iterations)
                rec["converged"].append(bool(result.converged))
                rec["rho"].append(_finite_or_none(result.rho))
                rec["potential_speedup"].append(_finite_or_none(result.potential_speedup))
                rec["levels"].append(len(result.levels))
                rec["residuals"].append([_finite_or_none(r) for r in result.residuals])
                rec["seconds"].append(time.perf_counter() - t0)
                say(f"table {spec['table']} N={n}: {result.iterations} iterations ({rec['seconds'][-1]:.1f} s)")
            records.append(rec)
    return records


def _finite_or_none(value):
    value = float(value)
    return value if np.isfinite(value) else None


def paper_json(records: list[dict]) -> dict:
    """The ``bench-mgrit-paper.json`` document: the table fields only, in the documented layout."""
    keys = ("table", "problem", "solver", "cycle", "alpha_b", "alpha_max", "steps", "iterations", "converged", "rho")
    return {"tables": [{**{k: rec[k] for k in keys}, "potential_speedup": rec["potential_speedup"]} for rec in records]}


def format_paper_tables(records: list[dict]) -> str:
    """Each table as text: N, the paper's iterations (three-layer), ours, rho and both speedups."""
    lines = []
    for rec in records:
        lines.append(
            f"Table {rec['table']}: {rec['problem']}, {rec['solver']}, {rec['cycle']}, "
            f"alpha_b={rec['alpha_b']:g}, alpha_max={rec['alpha_max']:g}"
            + (f", double_phi={rec['double_phi']}" if rec["double_phi"] else "")
        )
        lines.append(f"  {'N':>6} {'paper':>6} {'ours':>6} {'levels':>6} {'rho':>8} {'speedup':>8}")
        paper_iters = rec["paper"] or [None] * len(rec["steps"])
        for i, n in enumerate(rec["steps"]):
            ref = paper_iters[i] if i < len(paper_iters) else None
            ref_text = "-" if rec["paper"] is None else ("50+" if ref is None else str(ref))
            ours = str(rec["iterations"][i]) if rec["converged"][i] else f"{rec['iterations'][i]}+"
            rho = rec["rho"][i]
            sp = rec["potential_speedup"][i]
            lines.append(
                f"  {n:>6} {ref_text:>6} {ours:>6} {rec['levels'][i]:>6} "
                f"{'-' if rho is None else f'{rho:.3f}':>8} {'-' if sp is None else f'{sp:.2f}':>8}"
            )
    return "\n".join(lines)


def _floats(values) -> np.ndarray:
    """The record's numbers with ``None`` (not finite) as NaN."""
    return np.asarray([np.nan if v is None else v for v in values], dtype=np.float64)


def write_paper_zarr(records: list[dict], path: Path) -> Path:
    """The tables as one zarr store, a group ``table<k>`` each (an xarray Dataset over ``steps``)."""
    path = Path(path)
    for rec in records:
        width = max((len(r) for r in rec["residuals"]), default=0)
        residuals = np.full((len(rec["steps"]), width), np.nan)
        for i, history in enumerate(rec["residuals"]):
            residuals[i, : len(history)] = _floats(history)
        ds = xr.Dataset(
            {
                "iterations": (
                    "steps",
                    np.asarray(rec["iterations"], dtype=np.int64),
                    {"long_name": "MGRIT iterations"},
                ),
                "converged": ("steps", np.asarray(rec["converged"], dtype=bool)),
                "rho": ("steps", _floats(rec["rho"]), {"long_name": "convergence factor"}),
                "potential_speedup": (
                    "steps",
                    _floats(rec["potential_speedup"]),
                    {"long_name": "potential speedup (paper's eqs. 16-17)"},
                ),
                "levels": ("steps", np.asarray(rec["levels"], dtype=np.int64)),
                "seconds": ("steps", np.asarray(rec["seconds"], dtype=np.float64), {"units": "s"}),
                "residual": (("steps", "iteration"), residuals, {"long_name": "residual norm after each iteration"}),
            },
            coords={"steps": np.asarray(rec["steps"], dtype=np.int64), "iteration": np.arange(1, width + 1)},
            attrs={k: rec[k] for k in ("table", "problem", "solver", "cycle", "alpha_b", "alpha_max")}
            | {"double_phi": str(rec["double_phi"])},
        )
        ds.to_zarr(path, group=f"table{rec['table']}", mode="w", consolidated=False)
    return path


def plot_paper_figures(records: list[dict], output: Path) -> dict:
    """Figures 6 (three-layer) and 7 (four-layer): the paper's potential speedup against N."""
    paths = {}
    for number, problem in ((6, "three-layer"), (7, "four-layer")):
        chosen = [r for r in records if r["problem"] == problem]
        if chosen:
            paths[f"figure{number}"] = str(_plot_speedup(chosen, output / f"mgrit-paper-figure{number}.png", number))
    return paths


def _plot_speedup(records: list[dict], path: Path, number: int) -> Path:
    fig, (ax,) = _plotting.figure(size=(6, 4))
    steps = []
    for i, rec in enumerate(records):
        points = [
            (n, s)
            for n, s, ok in zip(rec["steps"], rec["potential_speedup"], rec["converged"], strict=True)
            if ok and s
        ]
        if not points:
            continue
        steps += [p[0] for p in points]
        label = f"Table {rec['table']}: {rec['solver']}, {rec['cycle']}, alpha_b={rec['alpha_b']:g}"
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", color=_plotting.colour(i), label=label)
    _plotting.count_axis(ax, steps)
    ax.axhline(1.0, color="grey", lw=0.8, ls=":")
    ax.set_ylim(bottom=0)
    ax.set_xlabel("training steps N")
    ax.set_ylabel("potential speedup N / sigma")
    ax.grid(True, alpha=0.3)
    if steps:
        ax.legend(fontsize=7)
    ax.set_title(f"Figure {number}: {records[0]['problem']} problem")
    return _plotting.save(fig, path, dpi=100)


@dataclass(frozen=True)
class PaperConfig:
    """Which of the paper's tables to run: up to ``max_steps`` steps, ``tables`` (all), coarse steps doubled or not."""

    max_steps: int | None = None
    tables: tuple | None = None
    double_phi: bool | str = False

    @classmethod
    def from_options(cls, **opts) -> PaperConfig:
        """The ``--max-steps``, ``--tables`` and ``--double-phi`` options, checked."""
        max_steps = opts.get("max_steps")
        if max_steps is not None:
            max_steps = check_int("max_steps", max_steps, minimum=2)
        tables = opts.get("tables")
        if tables is not None:
            tables = tuple(check_int("tables", t) for t in tables)
            for t in tables:
                if not 1 <= t <= 16:
                    raise invalid("tables", t, "table numbers from 1 to 16")
        double_phi = opts.get("double_phi") or False
        double_phi = False if double_phi == "none" else check_choice("double_phi", double_phi, ("split", "repeat"))
        return cls(max_steps, tables, double_phi)


def paper_main(opts: dict, *, echo=print) -> dict:
    """``daskann bench mgrit --paper``: run the tables, ``echo`` them, write JSON, zarr and the two figures."""
    config = PaperConfig.from_options(**opts)
    # progress lines on standard error, apart from the tables on standard output
    say = (
        (lambda msg: None) if opts.get("quiet") or opts.get("as_json") else partial(print, file=sys.stderr, flush=True)
    )
    output = Path(opts["output"])
    output.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    records = paper_tables(max_steps=config.max_steps, tables=config.tables, double_phi=config.double_phi, say=say)
    document = paper_json(records)
    write_json(document, output / PAPER_JSON)
    write_paper_zarr(records, output / "bench-mgrit-paper.zarr")
    figures = plot_paper_figures(records, output)
    say(f"paper tables: {time.perf_counter() - t0:.1f} s; figures {', '.join(figures.values())}")
    echo(json.dumps(document, indent=1) if opts.get("as_json") else format_paper_tables(records))
    return document


__all__ = [
    "PAPER_JSON",
    "PaperConfig",
    "format_paper_tables",
    "paper_json",
    "paper_main",
    "paper_tables",
    "plot_paper_figures",
    "write_paper_zarr",
]
