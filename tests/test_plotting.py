"""Benchmark figures: plain tick labels, and no pyplot or backend state touched."""

from __future__ import annotations

import pytest

matplotlib = pytest.importorskip("matplotlib")

from daskann import _plotting  # noqa: E402


def _labels(ax, axis="y"):
    ticks = ax.get_xticklabels() if axis == "x" else ax.get_yticklabels()
    return [t.get_text() for t in ticks]


def test_count_axis_ticks_every_measured_count():
    fig, (ax,) = _plotting.figure()
    ax.plot([1, 2, 4, 8], [1.0, 1.5, 1.6, 1.2])
    _plotting.count_axis(ax, [1, 2, 4, 8, 4])
    assert ax.get_xscale() == "log"
    assert list(ax.get_xticks()) == [1, 2, 4, 8] and _labels(ax, "x") == ["1", "2", "4", "8"]


def test_log_axis_labels_plainly_with_at_least_two_ticks():
    fig, (ax,) = _plotting.figure()
    _plotting.log_axis(ax, [1.6, 1.7])  # once one tick labelled "1.6 x 10^0"
    assert _labels(ax) == ["1", "2"]
    _plotting.log_axis(ax, [0.3, 1.6])
    assert _labels(ax) == ["0.2", "0.5", "1", "2"]
    _plotting.log_axis(ax, [1e-4, 0.5], include=[8.0])
    labels = _labels(ax)
    assert 2 <= len(labels) <= 9 and labels[0] == "0.0001" and labels[-1] == "10"
    assert not any("e" in label or "^" in label for label in labels)


def test_npt_plots_leave_pyplot_and_the_backend_alone(tmp_path):
    import matplotlib.pyplot as plt

    from daskann.bench.npt import _derive
    from daskann.bench.npt_output import plot

    backend, figures = matplotlib.get_backend(), plt.get_fignums()
    table = [{"net": "one-hidden", "grid": "-", "cells": 1, "p": 1, "mode": "serial", "time_per_step": 0.002}]
    for grid, cells, p, seconds in (
        ("1x1", 1, 1, 0.003),
        ("1x2", 2, 2, 0.0016),
        ("2x2", 4, 4, 0.0012),
        ("2x4", 8, 4, 0.0015),
    ):
        table.append(
            {"net": "one-hidden", "grid": grid, "cells": cells, "p": p, "mode": "resident", "time_per_step": seconds}
        )
    _derive(table)
    paths = plot(table, tmp_path)
    assert sorted(paths) == ["efficiency", "speedup", "time_per_step"]
    assert all(path.stat().st_size > 1000 for path in paths.values())
    assert matplotlib.get_backend() == backend and plt.get_fignums() == figures
