"""``daskann bench npt``'s outputs: the table as text, ``bench-npt.json``, ``bench-npt.zarr`` and three plots."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import xarray as xr

from daskann import _plotting, store
from daskann._json import clean_json, write_json
from daskann.bench.npt_checks import fmt


def format_table(table: list[dict]) -> str:
    """The table as text: ``ms/step`` the steady step, ``setup s`` the rest of the fit, ``E hw`` against the bound."""
    head = (
        f"{'net':>15} {'sizes':>16} {'batch':>5} {'grid':>5} {'p':>2} {'mode':>13} {'ms/step':>10} "
        f"{'setup s':>8} {'speedup':>8} {'E':>6} {'E hw':>6} {'vs peer':>8} {'vs serial':>9} {'model':>7}"
    )
    lines = [head]
    for r in table:
        lines.append(
            f"{r['net']:>15} {r['sizes']:>16} {r['batch']:>5} {r['grid']:>5} {r['p']:>2} {r['mode']:>13} "
            f"{r['time_per_step'] * 1e3:>10.3f} {fmt(r.get('setup_s')):>8} {r['speedup']:>8.3g} "
            f"{r['efficiency']:>6.3g} {fmt(r.get('hw_efficiency')):>6} {r['vs_peer']:>8.3g} {r['vs_serial']:>9.3g} "
            f"{fmt(_model_ratio(r)):>7}"
        )
    return "\n".join(lines)


def _model_ratio(row: dict) -> float | None:
    """The cost model's predicted step over the measured one (1: exact; none for rows it does not predict)."""
    predicted = row.get("predicted_s")
    return None if predicted is None or predicted != predicted else predicted / row["time_per_step"]


def write_outputs(result: dict, out_dir) -> dict:
    """``bench-npt.json``, ``bench-npt.zarr`` and three PNG plots in ``out_dir``; their paths."""

    out = Path(out_dir)
    paths = {"json": write_json(clean_json(result), out / "bench-npt.json", indent=2)}
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
_STYLES.update({f"graph-{p}": ("-", m) for p, m in zip(("fused", "single", "double"), "v<>", strict=True)})


def plot(table: list[dict], out_dir) -> dict:
    """PNG plots of time per step, speedup and efficiency against ``p`` (matplotlib, imported here).

    One colour per net, one line style per mode; serial training is the
    dashed horizontal line of its net's colour on the time plot. The ``p``
    axis is log2 with a tick at each measured cell count.
    """

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


__all__ = ["format_table", "plot", "write_outputs"]
