"""Figures for the benchmark reports: plain ``matplotlib.figure.Figure`` objects.

The benchmarks draw without pyplot, so they leave the caller's backend and
figure registry alone (a notebook's inline backend, a GUI session) and need
no display on a batch node. Axes carry explicit ticks with plain labels:
log2 ticks at the measured counts where counts double, 1-2-5 ticks on
logarithmic time and ratio axes.
"""

from __future__ import annotations

import math
from pathlib import Path

#: mantissas of the ticks of a logarithmic axis, from the densest choice to the sparsest
_MANTISSAS = ((1, 2, 5), (1, 3), (1,))
_MAX_TICKS = 9


def figure(ncols: int = 1, *, size: tuple[float, float] = (6.0, 4.0)):
    """A new figure with one row of ``ncols`` axes, each ``size`` inches.

    Returns
    -------
    fig : matplotlib.figure.Figure
        Not registered with pyplot: save it with :func:`save`.
    axes : list of matplotlib.axes.Axes
    """
    from matplotlib.figure import Figure  # matplotlib is optional (the plot extra)

    fig = Figure(figsize=(size[0] * ncols, size[1]), layout="constrained")
    return fig, list(fig.subplots(1, ncols, squeeze=False)[0])


def save(fig, path, *, dpi: int = 110) -> Path:
    """Write ``fig`` as PNG to ``path``; returns the path."""
    fig.savefig(path, dpi=dpi)
    return Path(path)


def colour(index: int):
    """The ``index``-th colour of matplotlib's ``tab10`` cycle."""
    from matplotlib import colormaps  # matplotlib is optional (the plot extra)

    return colormaps["tab10"](index % 10)


def plain(value: float) -> str:
    """A tick label without scientific notation for everyday magnitudes (``0.05``, ``1.6``, ``3200``)."""
    return f"{value:g}" if 1e-4 <= abs(value) < 1e6 or value == 0 else f"{value:.0e}"


def count_axis(ax, values, *, axis: str = "x") -> None:
    """A log2 axis with one tick at each measured count (worker counts, grid cells, step counts).

    A single count gets a linear axis with that one tick.
    """
    values = sorted({v for v in values if v is not None and v > 0})
    if not values:
        return
    if len(values) > 1:
        _set_scale(ax, axis, "log", base=2)
        pad = 2**0.25
        _set_lim(ax, axis, values[0] / pad, values[-1] * pad)
    _set_ticks(ax, axis, values)


def log_axis(ax, values, *, axis: str = "y", include=()) -> None:
    """A log10 axis whose limits are ticks enclosing ``values`` (and ``include``), labelled plainly.

    Ticks are 1-2-5 multiples of powers of ten, thinned to fewer per decade when the
    data span many decades, so there are always at least two and at most a handful.
    """
    finite = [v for v in (*values, *include) if v is not None and math.isfinite(v) and v > 0]
    if not finite:
        return
    lo, hi = min(finite), max(finite)
    for mantissas in _MANTISSAS:
        ticks = _enclosing_ticks(lo, hi, mantissas)
        if len(ticks) <= _MAX_TICKS:
            break
    _set_scale(ax, axis, "log")
    _set_lim(ax, axis, ticks[0], ticks[-1])
    _set_ticks(ax, axis, ticks)


def _enclosing_ticks(lo: float, hi: float, mantissas) -> list[float]:
    """``m * 10**e`` values from the largest one at or below ``lo`` to the smallest at or above ``hi``."""
    candidates = sorted(
        m * 10.0**e for e in range(math.floor(math.log10(lo)) - 1, math.ceil(math.log10(hi)) + 2) for m in mantissas
    )
    below = [t for t in candidates if t <= lo * (1 + 1e-9)]
    above = [t for t in candidates if t >= hi * (1 - 1e-9)]
    first, last = below[-1], above[0]
    if first == last:  # the data sit on one tick: show its neighbours too
        k = candidates.index(first)
        first, last = candidates[max(k - 1, 0)], candidates[k + 1]
    return [t for t in candidates if first <= t <= last]


def _set_scale(ax, axis: str, scale: str, **kwargs) -> None:
    (ax.set_xscale if axis == "x" else ax.set_yscale)(scale, **kwargs)


def _set_lim(ax, axis: str, lo: float, hi: float) -> None:
    (ax.set_xlim if axis == "x" else ax.set_ylim)(lo, hi)


def _set_ticks(ax, axis: str, ticks) -> None:
    from matplotlib.ticker import NullLocator  # matplotlib is optional (the plot extra)

    target = ax.xaxis if axis == "x" else ax.yaxis
    target.set_minor_locator(NullLocator())
    (ax.set_xticks if axis == "x" else ax.set_yticks)(list(ticks), [plain(t) for t in ticks])
