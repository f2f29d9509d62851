"""``daskann bench npt``: the hardware's bound, set-up apart from the step, and the kernels it times."""

from __future__ import annotations

import json

import numpy as np
import pytest

from daskann import store
from daskann.bench import npt as bench
from daskann.bench import npt_checks, npt_output
from daskann.nn._functional import mse_loss
from daskann.npt import _kernels
from daskann.npt.costmodel import CostModel, step_product_flops

#: keys every row of the benchmark's table had before the hardware's bound was added
OLD_ROW_KEYS = {"net", "sizes", "batch", "grid", "cells", "p", "mode", "time_per_step", "speedup", "efficiency"}


def _spec(array):
    return (array, None, None, None)


def test_step_flops_of_the_wide_net():
    # the 4096-wide step: five products of 2 * 4096**3 flops each
    assert step_product_flops((4096, 4096, 4096), 4096) == pytest.approx(687.19e9, rel=1e-4)
    assert step_product_flops((4096, 8192, 4096), 4096) == 2 * step_product_flops((4096, 4096, 4096), 4096)


@pytest.mark.parametrize("overlap", [False, True])
def test_windowed_products_equal_a_plain_sum(overlap):
    rng = np.random.default_rng(3)
    a = [rng.standard_normal((5, 7)) for _ in range(2)]
    b = rng.standard_normal((7, 6))
    windows = [(0, 5, 0, 6), (3, 8, 0, 6) if overlap else (5, 10, 0, 6)]
    terms = [(_spec(x), False, _spec(b), False, w) for x, w in zip(a, windows, strict=True)]
    out = _kernels.block_product(None, terms, (10, 6), np.float64)
    expected = np.zeros((10, 6))
    for x, (r0, r1, c0, c1) in zip(a, windows, strict=True):
        expected[r0:r1, c0:c1] += x @ b
    assert np.array_equal(out, expected)
    # inputs are never modified
    again = _kernels.block_product(None, terms, (10, 6), np.float64)
    assert np.array_equal(again, out)


def test_windowed_products_on_a_running_sum_and_transposed_operands():
    rng = np.random.default_rng(4)
    acc = rng.standard_normal((4, 6))
    a, b = rng.standard_normal((3, 4)), rng.standard_normal((6, 3))
    terms = [(_spec(a), True, _spec(b), True, (0, 4, 0, 6))]
    out = _kernels.block_product(acc, terms, (4, 6), np.float64)
    assert np.array_equal(out, acc + a.T @ b.T)
    assert out is not acc


def test_weight_update_is_sgds():
    rng = np.random.default_rng(5)
    w, v = rng.standard_normal((6, 4)), rng.standard_normal((6, 4))
    before = w.copy(), v.copy()
    assert np.array_equal(_kernels.weight_update(w, v, 0.05), w - 0.05 * v)
    assert np.array_equal(w, before[0]) and np.array_equal(v, before[1])


def test_mse_epilogue_equals_serial_loss_and_gradient():
    rng = np.random.default_rng(6)
    a, w, bias = rng.standard_normal((8, 5)), rng.standard_normal((5, 3)), rng.standard_normal(3)
    target = rng.standard_normal((12, 3))
    rows = np.arange(2, 10)
    terms = [(_spec(a), False, _spec(w), False, None)]
    out = _kernels.block_product(
        None, terms, (8, 3), np.float64, epilogue=_kernels.BiasMSE(2.0 / 24, rows, True), extras=(_spec(bias), target)
    )
    loss, grad = mse_loss(a @ w + bias, target[rows])
    assert np.array_equal(out["g"], grad)
    assert out["loss"] / 24 == pytest.approx(loss, rel=1e-14)


def test_steady_step_is_the_timed_windows_throughput():
    # pipelined steps: a late result (3.0) shortens the interval after it (1.0); the median would say 3.0
    times = np.cumsum([9.0, 2.0, 3.0, 1.0, 3.0, 1.0])
    assert bench._steady_step(times, warmup=1) == pytest.approx(2.0)
    assert bench._steady_step(times, warmup=0) == pytest.approx(19.0 / 6)
    assert np.isnan(bench._steady_step(times[:1], warmup=1))


def test_rate_interpolates_the_clusters_aggregate_throughput():
    model = CostModel({1: 100.0, 2: 100.0, 4: 50.0}, 0.0, 0.0, 0.0, 0.0, 1.0, 4)
    # 4 workers on 2 cores: 3 busy workers share the 200 flop/s of the two cores
    assert model.rate(3) == pytest.approx(200.0 / 3)
    assert model.rate(2) == 100.0 and model.rate(8) == pytest.approx(25.0)


def test_bench_reports_the_bound_and_set_up_per_row(client2, tmp_path, monkeypatch):
    config = bench.BenchConfig(
        nets=["one-hidden"],
        grids=["1x1", "1x2"],
        batch_size=32,
        n_samples=256,
        graph_steps=2,
        resident_steps=20,
        peer_steps=2,
        serial_steps=20,
        warmup=1,
        large_width=48,
        large_hidden=96,
        large_batch=64,
        large_grids=["1x1", "1x2"],
        widths=[],
        modes=["graph", "resident", "auto"],
        gemm_size=128,
    )
    from daskann.npt import costmodel

    measured = []
    task_seconds = costmodel.task_seconds
    monkeypatch.setattr(costmodel, "task_seconds", lambda *a, **k: measured.append(1) or task_seconds(*a, **k))
    result = bench.run(client2, config, log=lambda *_: None)
    hardware = result["hardware"]
    assert hardware["cores"] >= 1 and hardware["gemm_rate"] == max(hardware["gemm_rates"]) > 0
    table = result["table"]
    assert {r["net"] for r in table} == {"one-hidden", "large-48-96"}
    for r in table:
        assert OLD_ROW_KEYS <= set(r)
        assert r["flops"] == step_product_flops(tuple(int(s) for s in r["sizes"].split("-")), r["batch"])
        # the large net's rows against the GEMM rate probed beside them; the fastest probe is the run's
        rate = r["gemm_rate"] if r["net"].startswith("large-") else hardware["gemm_rate"]
        assert 0 < rate <= hardware["gemm_rate"]
        assert r["bound_s"] == pytest.approx(r["flops"] / (r["cores"] * rate))
        assert r["hw_efficiency"] == pytest.approx(r["bound_s"] / r["time_per_step"])
        assert r["hw_efficiency_run_peak"] == pytest.approx(r["hw_efficiency"] * rate / hardware["gemm_rate"])
        assert r["fit_s"] > 0 and 0 <= r["setup_s"] <= r["fit_s"]
        assert r["cores"] == (1 if r["mode"] == "serial" else hardware["cores"])
    # resident steps are the workers' own: the fit's set-up is not shared out over them
    resident = next(r for r in table if r["mode"] == "resident" and r["grid"] == "1x1")
    assert resident["time_per_step"] * 21 < resident["fit_s"]
    checks = result["checks"]
    bound = checks["large_bound"]
    assert bound["target"] == ">= 0.8" and bound["mode"].startswith("auto-") and bound["gemm_rate"] > 0
    assert "one-hidden" in checks["resident_1x1_vs_serial"]
    assert "large-48-96" in checks["grid_auto"]
    text = npt_output.format_table(table) + npt_checks.format_checks(checks)
    assert "E hw" in text and "setup s" in text and "hardware's bound" in text
    # grid="auto" fits find the cost model cached: its probing is not their set-up
    assert len(measured) <= 1  # the run's own measurement at most: every auto fit found it cached
    assert all(r["probe_s"] >= 0 for r in table if r["mode"].startswith("auto-"))
    paths = npt_output.write_outputs(result, tmp_path)
    saved = json.loads(paths["json"].read_text())
    assert saved["hardware"]["cores"] == hardware["cores"] and "hw_efficiency" in saved["table"][0]
    columns = store.load_history(paths["zarr"])
    assert {"hw_efficiency", "setup_s", "probe_s", "time_per_step"} <= set(columns.data_vars)


def _row(net, grid, mode, seconds, cells=1):
    return {"net": net, "grid": grid, "mode": mode, "time_per_step": seconds, "cells": cells}


def test_auto_check_judges_the_pick_not_two_timings_of_it():
    table = [
        _row("n", "-", "serial", 1.0e-3),
        _row("n", "1x1", "resident", 0.8e-3),
        _row("n", "2x2", "resident", 0.9e-3, cells=4),
        _row("n", "1x1", "auto-resident", 1.0e-3),  # the same configuration, timed 25% slower
    ]
    got = npt_checks._check_auto(table, {}, "n", {"grid": "1x1", "mode": "resident"})
    assert got["picked_best"] and got["within_10pct"] and got["no_grid_pays"] is False
    # another grid than the best: judged by its time
    table[-1] = _row("n", "2x2", "auto-resident", 1.0e-3, cells=4)
    got = npt_checks._check_auto(table, {}, "n", {"grid": "2x2", "mode": "resident"})
    assert not got["picked_best"] and not got["within_10pct"]
    table[-1] = _row("n", "2x2", "auto-resident", 0.85e-3, cells=4)
    assert npt_checks._check_auto(table, {}, "n", {"grid": "2x2", "mode": "resident"})["within_10pct"]


def test_single_worker_check_takes_the_median_of_rounds_timed_in_turn():
    rows = {
        ("one-hidden", "-", "serial"): {"time_per_step": 0.3e-3},
        ("one-hidden", "1x1", "resident"): {"time_per_step": 0.45e-3, "setup_s": 0.1},
    }
    # the sweep's own pair alone (a busy spell during the resident run) fails the target
    assert not npt_checks._check_single_worker(rows, {})["one-hidden"]["met"]
    pairs = {"one-hidden": [(0.3e-3, 0.45e-3), (0.4e-3, 0.4e-3), (0.42e-3, 0.38e-3)]}
    got = npt_checks._check_single_worker(rows, pairs)["one-hidden"]
    assert got["ratio"] == pytest.approx(1.0) and got["met"] and len(got["rounds"]) == 3
    assert got["step_s"] == pytest.approx(0.4e-3) and got["serial_s"] == pytest.approx(0.4e-3)


def test_breakdown_flag_writes_where_each_workers_step_went(client2, tmp_path):
    from click.testing import CliRunner

    from daskann.cli import main

    args = ["bench", "npt", "--address", client2.scheduler.address, "--nets", "", "--widths", "", "--grids", "1x1"]
    args += ["--large-width", "64", "--large-batch", "64", "--large-grids", "1x2", "--large-steps", "3"]
    args += ["--modes", "graph,resident,auto", "--breakdown", "-o", str(tmp_path)]
    out = CliRunner().invoke(main, args, catch_exceptions=False)
    assert out.exit_code == 0, out.output
    assert "where the step time goes" in out.output
    entries = json.loads((tmp_path / "bench-npt.json").read_text())["breakdown"]
    modes = {e["mode"] for e in entries}
    assert {"graph", "resident"} <= modes and any(m.startswith("auto-") for m in modes)
    workers = {w for w in client2.scheduler_info()["workers"]}
    for entry in entries:
        assert entry["grid"] == "1x2" or entry["mode"].startswith("auto-")
        assert entry["steps"] == [2, 3, 4]  # after the warm-up step
        assert set(entry["workers"]) <= workers and entry["workers"]
        for worker, parts in entry["workers"].items():
            assert {"wall", "compute", "transfer", "serialise", "idle"} <= set(parts)
            for k in range(len(entry["steps"])):
                values = {p: parts[p][k] for p in ("compute", "transfer", "serialise", "idle")}
                assert all(v >= 0 for v in values.values())
                assert sum(values.values()) == pytest.approx(parts["wall"][k], rel=1e-6, abs=1e-9)
            assert entry["median"][worker]["wall"] == pytest.approx(float(np.median(parts["wall"])))
    alone = json.loads((tmp_path / "bench-npt.json").read_text())["products_alone"]
    assert set(alone["per_worker"]) == workers and alone["seconds"] == max(alone["per_worker"].values())
    assert alone["flops"] == step_product_flops((64, 64, 64), 64)
    assert alone["hw_efficiency"] == pytest.approx(alone["bound_s"] / alone["seconds"]) and alone["bound_s"] > 0
    assert "the step's matrix products alone, on 2 workers at once" in out.output


def test_breakdown_is_off_by_default():
    opts = {
        "nets": "",
        "grids": "1x1",
        "modes": "graph",
        "widths": "",
        "large_width": 0,
        "large_batch": 8,
        "large_steps": 1,
        "large_hidden": 0,
        "large_grids": "1x2",
    }
    assert not bench.BenchConfig.from_options(**opts).breakdown
    assert bench.BenchConfig.from_options(**opts, breakdown=True).breakdown


def test_graph_rows_run_the_pipeline_they_name(client2, monkeypatch):
    config = bench.BenchConfig(
        nets=["one-hidden"],
        grids=["1x2"],
        batch_size=32,
        n_samples=128,
        graph_steps=1,
        serial_steps=2,
        warmup=1,
        large_width=0,
        widths=[],
        modes=["graph-double", "graph", "graph-fused", "graph-single"],
        gemm_size=64,
    )
    pipelines = []

    class Recording(bench.NPTTrainer):
        def fit(self, X, y=None, **kwargs):
            super().fit(X, y, **kwargs)
            pipelines.append(self.history_.attrs["pipeline"])
            return self

    monkeypatch.setattr(bench, "NPTTrainer", Recording)
    result = bench.run(client2, config, log=lambda *_: None)
    table = result["table"]
    # in the order of bench.MODES; "graph" runs the pipeline graph mode picks for this small net
    assert [r["mode"] for r in table if r["mode"] != "serial"] == [
        "graph",
        "graph-fused",
        "graph-single",
        "graph-double",
    ]
    assert pipelines == ["fused", "fused", "single", "double"]
    # each row beside the cost model's step for the pipeline it ran: the model's ranking can be checked
    model = CostModel(**{**result["cost_model"], "flop_rate": _rates(result["cost_model"])})
    sizes = tuple(int(s) for s in table[0]["sizes"].split("-"))
    predicted = [model.predict(sizes, 32, (1, 2), mode="graph", chains=c) for c in (0, 0, 1, 2)]
    assert [r["predicted_s"] for r in table if r["mode"] != "serial"] == predicted
    assert predicted[0] < predicted[2]  # a task per block product costs more than it hides on a net this small
    assert " model" in npt_output.format_table(table).splitlines()[0]


def _rates(cost_model: dict) -> dict:
    """A cost model's ``flop_rate`` as :meth:`CostModel.to_dict` wrote it (worker counts as strings)."""
    return {int(p): rate for p, rate in cost_model["flop_rate"].items()}


def test_bench_modes_name_the_valid_ones():
    with pytest.raises(ValueError, match="modes.*'graph-triple'.*graph-fused, graph-single, graph-double"):
        bench.BenchConfig.from_options(
            nets="",
            grids="1x1",
            modes="graph,graph-triple",
            widths="",
            large_width=0,
            large_batch=8,
            large_steps=1,
            large_hidden=0,
            large_grids="1x2",
        )


def test_graph_worker_times_split_each_window_once():
    from daskann.npt._run import graph_worker_times, resident_worker_times

    # compute 0-1 and 2-3; a transfer 0.5-2.5 is exposed only in 1-2; deserialising 3.5-4 before the last task
    spans = {
        "w": {"compute": [(0.0, 1.0), (2.0, 3.0), (4.0, 5.0)], "transfer": [(0.5, 2.5)], "deserialize": [(3.5, 4)]}
    }
    times = graph_worker_times(spans, {"w": {0: 1.0, 1: 3.0, 2: 5.0}})
    assert times[1]["w"] == {"wall": 1.0, "compute": 1.0, "serialise": 0.0, "transfer": 0.0, "idle": 0.0}
    assert times[2]["w"] == {"wall": 2.0, "compute": 1.0, "serialise": 0.0, "transfer": 1.0, "idle": 0.0}
    assert times[3]["w"] == {"wall": 2.0, "compute": 1.0, "serialise": 0.5, "transfer": 0.0, "idle": 0.5}
    parts = resident_worker_times(1.0, 3.0, 1.5, 0.5)
    assert parts["transfer"] == 0.5 and parts["idle"] == 1.5 and parts["recv_wait"] == 1.5
