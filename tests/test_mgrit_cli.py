"""MGRIT's command line (train, bench), demo and example notebook."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import run_notebook

# MGRIT fits here must run the solve, which the default policy skips for problems this small
pytestmark = pytest.mark.usefixtures("mgrit_study")

ROOT = Path(__file__).resolve().parent.parent


def test_train_command_inprocess_json(tmp_path):
    from daskann.mgrit.cli import train_command

    out = CliRunner().invoke(
        train_command,
        [
            "--dataset",
            "linear",
            "--n-samples",
            "160",
            "--n-features",
            "8",
            "--n-outputs",
            "1",
            "--hidden",
            "8",
            "--steps",
            "64",
            "--batch-size",
            "16",
            "--lr",
            "0.001",
            "--levels",
            "2",
            "--coarsening",
            "4",
            "--relaxation",
            "FCF",
            "--cycle",
            "V",
            "--tol",
            "1e-10",
            "--scheduler",
            "inprocess",
            "--compute-error",
            "--json",
            "--output",
            str(tmp_path / "run"),
        ],
    )
    assert out.exit_code == 0, out.output
    summary = json.loads(out.output)
    assert summary["method"] == "mgrit" and summary["converged"] and summary["steps"] == 64
    assert summary["error_vs_serial"] < 1e-9
    assert (tmp_path / "run" / "model.zarr").exists() and (tmp_path / "run" / "history.zarr").exists()
    bad = CliRunner().invoke(train_command, ["--coarsening", "1", "--scheduler", "inprocess", "--steps", "16"])
    assert bad.exit_code != 0 and "--coarsening=1" in bad.output


def test_bench_command_small(tmp_path):
    from daskann.mgrit.cli import bench_command

    out = CliRunner().invoke(
        bench_command,
        [
            "--steps",
            "32,64",
            "--presets",
            "solver2",
            "--cycles",
            "V,F",
            "--coarsest",
            "4",
            "--wall-steps",
            "0",
            "--output",
            str(tmp_path),
            "--json",
        ],
    )
    assert out.exit_code == 0, out.output
    report = json.loads((tmp_path / "mgrit-bench.json").read_text())
    configs = {r["config"] for r in report["study"]}
    assert configs == {"solver2", "solver2/F-cycle"}
    for rec in report["study"]:
        assert rec["status"] == "converged" and rec["error"] < 1e-8 and rec["speedup_unlimited"] > 0
    assert report["machine"]["blas"] is not None
    assert (tmp_path / "mgrit-iterations.png").stat().st_size > 1000
    assert (tmp_path / "mgrit-residuals.png").stat().st_size > 1000


def test_bench_efficiency_reports_both_efficiencies(tmp_path, client2):
    from daskann.mgrit.cli import bench_command

    args = ["--efficiency", "8-16-3", "--wall-steps", "32", "--repeats", "1", "--coarsest", "4"]
    args += ["--address", client2.scheduler.address, "--output", str(tmp_path), "--json"]
    out = CliRunner().invoke(bench_command, args)
    assert out.exit_code == 0, out.output
    (rec,) = json.loads((tmp_path / "mgrit-efficiency.json").read_text())["efficiency"]
    assert rec["sizes"] == [8, 16, 3] and rec["workers"] == 2 and rec["bit_identical"] is True
    # the figures they are made of are in the record, so anyone can recompute them
    assert rec["work_model_efficiency"] == pytest.approx(
        rec["work_units"] * rec["serial_step_seconds"] / rec["inprocess_solve_seconds"]
    )
    assert rec["parallel_efficiency"] == pytest.approx(
        rec["inprocess_solve_seconds"] / (2 * rec["cluster_solve_seconds"])
    )
    assert "later_iterations_efficiency" in rec
    bad = CliRunner().invoke(bench_command, ["--efficiency", "8-x-3", "--output", str(tmp_path)])
    assert bad.exit_code != 0 and "efficiency" in bad.output


def test_later_iterations_efficiency_leaves_out_the_first_two():
    from types import SimpleNamespace

    from daskann.bench.mgrit import _later_iterations

    result = SimpleNamespace(work=[10.0, 8.0, 8.0, 8.0], iteration_times=[5.0, 4.0, 1.0, 1.0])
    assert _later_iterations(result, 0.25) == pytest.approx(16 * 0.25 / 2.0)
    assert math.isnan(_later_iterations(SimpleNamespace(work=[10.0, 8.0], iteration_times=[5.0, 4.0]), 0.25))


def test_demo_quick(client2):
    from daskann.mgrit.cli import run_demo

    summary = run_demo(client2, quick=True)
    assert summary["method"] == "mgrit" and summary["converged"]
    assert summary["iterations"] >= 1 and summary["error_vs_serial"] < 1e-9


def test_example_notebook_runs():
    nb = run_notebook(ROOT / "examples" / "mgrit.ipynb", timeout=300)
    assert any(cell.get("outputs") for cell in nb.cells if cell.cell_type == "code")
