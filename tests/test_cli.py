"""The ``daskann`` command line."""

from __future__ import annotations

import json
import subprocess
import sys

import click
import numpy as np
from click.testing import CliRunner

from daskann import load_checkpoint
from daskann.cli import main
from daskann.npt.cli import plan_command


def _invoke(args):
    return CliRunner().invoke(main, args, catch_exceptions=False)


def test_train_serial_writes_a_verified_run_and_resumes(tmp_path):
    out = tmp_path / "run"
    common = [
        "train",
        "serial",
        "--dataset",
        "digits",
        "--hidden",
        "32",
        "--lr",
        "0.1",
        "--momentum",
        "0.9",
        "--batch-size",
        "32",
        "-o",
        str(out),
        "--json",
        "-q",
    ]
    result = _invoke([*common, "--steps", "30", "--checkpoint-every", "10"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output)
    assert summary["method"] == "serial" and summary["steps"] == 30 and summary["sizes"] == [64, 32, 10]
    assert 0 <= summary["val_accuracy"] <= 1
    assert _invoke(["verify", str(out)]).exit_code == 0
    # an existing run is not overwritten by accident
    again = _invoke([*common, "--steps", "30"])
    assert again.exit_code != 0 and "already holds a daskann run" in again.output
    resumed = _invoke([*common, "--steps", "50", "--resume"])
    assert json.loads(resumed.output)["steps"] == 50
    straight = _invoke([*common[:-4], "-o", str(tmp_path / "straight"), "--json", "-q", "--steps", "50"])
    assert straight.exit_code == 0
    a, b = load_checkpoint(out / "model.zarr"), load_checkpoint(tmp_path / "straight" / "model.zarr")
    assert all(
        np.array_equal(x, y) for x, y in zip(a.model.params + a.velocity, b.model.params + b.velocity, strict=True)
    )


def test_bad_flags_give_one_line_errors(tmp_path):
    cases = [
        # errors name the flag, with the value and what would be valid
        (["train", "serial", "--lr", "0"], "Error: --lr=0.0 is not valid: expected a finite number in (0, inf)"),
        (["train", "serial", "--momentum", "1.5"], "Error: --momentum=1.5 is not valid"),
        (["train", "serial", "--batch-size", "0"], "Error: --batch-size=0 is not valid: expected an integer >= 1"),
        (["train", "serial", "--hidden", "8,0"], "Error: --hidden[1]=0 is not valid"),
        (["train", "serial", "--steps", "5", "--epochs", "1"], "Error: --steps/--epochs=(5, 1) is not valid"),
        (["train", "serial", "--hidden", "8,x"], "comma-separated"),
        (["train", "serial", "--dataset", "imagenet"], "imagenet"),
        (["train", "serial", "--activation", "tanh"], "tanh"),
        (["train", "serial", "--dataset", "mnist"], "Error: --data-path=None is not valid"),
        (["train", "serial", "--resume"], "resume needs --output"),
        # the trainer's noise is --merge-noise; --noise is the linear data's
        (["train", "partition", "--merge-noise", "-1"], "Error: --merge-noise=-1.0 is not valid"),
        (["train", "partition", "--noise", "-1"], "Error: --noise=-1.0 is not valid"),
        (["train", "mgrit", "--coarsening", "1"], "Error: --coarsening=1 is not valid"),
        # checked as the command line is read, before a cluster starts
        (["train", "npt", "--grid", "2y2"], "Error: --grid='2y2' is not valid: expected 'auto', 'RxC'"),
        (["train", "npt", "--grid", "0x2"], "Error: --grid[0]=0 is not valid"),
    ]
    for args, message in cases:
        result = _invoke(args)
        assert result.exit_code != 0, args
        assert message in result.output, (args, result.output)
        assert "Traceback" not in result.output
        if " is not valid" in result.output:  # a daskann error: the flag, never the Python parameter name
            assert "_" not in result.output.split(" is not valid")[0].rpartition("Error: ")[2], result.output
    (tmp_path / "notes.txt").write_text("mine")
    result = _invoke(["train", "serial", "-o", str(tmp_path)])
    assert result.exit_code != 0 and "not a daskann run" in result.output


def test_verify_fails_on_a_damaged_store(tmp_path):
    out = tmp_path / "run"
    assert _invoke(["train", "serial", "--steps", "5", "-o", str(out), "-q"]).exit_code == 0
    chunk = next(p for p in (out / "model.zarr").rglob("*") if p.is_file() and "weights" in p.parts and "c" in p.parts)
    chunk.write_bytes(b"\0" * 8)
    result = _invoke(["verify", str(out), "--json"])
    assert result.exit_code == 1
    report = json.loads(result.output)
    assert not report["ok"] and any(i["status"] == "damaged" for i in report["items"])


def test_python_m_daskann_works():
    result = subprocess.run([sys.executable, "-m", "daskann", "--help"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and "train" in result.stdout


def _help_of(command) -> dict[str, str]:
    ctx = click.Context(command, info_name=command.name)
    return {p.name: p.help for p in command.get_params(ctx) if isinstance(p, click.Option)}


def test_help_text_on_every_option_and_true_to_the_code():
    from daskann.cli import train, verify

    for command in (verify, plan_command):
        missing = [name for name, text in _help_of(command).items() if not text]
        assert not missing, f"{command.name}: options without help: {missing}"
    serial = train.get_command(None, "serial")
    text = _help_of(serial)["output_activation"]
    assert "default for classification" not in text and "cross_entropy" in text
    option = next(p for p in serial.params if p.name == "output_activation")
    assert option.default == "linear"  # what trainer_settings uses when the flag is not given
    top = " ".join(_invoke(["--help"]).output.split())  # help wraps lines
    assert "--log-level" in top and "dask config get daskann" in top


def test_dashboard_link_on_stderr_and_log_level(tmp_path):
    args = [
        "train",
        "npt",
        "--workers",
        "1",
        "--grid",
        "1x1",
        "--hidden",
        "8",
        "--steps",
        "2",
        "--n-samples",
        "64",
        "--batch-size",
        "16",
    ]
    result = CliRunner().invoke(main, ["--log-level", "info", *args, "-q"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "Dask dashboard: http://127.0.0.1:" in result.stderr
    assert "Dask dashboard" not in result.stdout
    assert "INFO daskann.cluster: Dask dashboard: http://127.0.0.1:" in result.stderr  # the library logs it

    quiet = CliRunner().invoke(main, [*args, "--json"], catch_exceptions=False)
    assert quiet.exit_code == 0, quiet.output
    assert json.loads(quiet.stdout)["method"] == "npt"
    assert "Dask dashboard" not in quiet.stderr  # default level: warning; --json keeps the link off


def _options_of(command) -> dict[str, tuple]:
    ctx = click.Context(command, info_name=command.name)
    return {
        p.name: (tuple(p.opts), p.default, p.help, p.show_default)
        for p in command.get_params(ctx)
        if isinstance(p, click.Option)
    }


def test_shared_option_groups_read_the_same_in_every_command():
    from daskann.cli import bench

    shape = ("hidden", "n_features", "n_outputs", "batch_size", "dtype")
    npt_plan, top_plan = (_options_of(c) for c in (plan_command, main.get_command(None, "plan")))
    assert {n: npt_plan[n] for n in shape} == {n: top_plan[n] for n in shape}
    assert list(npt_plan)[: len(shape)] == list(shape)  # the group keeps its order in --help

    benches = {name: _options_of(bench.get_command(None, name)) for name in ("mgrit", "partition")}
    for name, options in benches.items():
        assert options["workers"][1] == 2 and options["address"][1] is None
        assert str(options["output"][1]) == f"bench-results/{name}" and options["output"][0] == ("--output", "-o")
        assert options["as_json"][0] == ("--json",) and options["as_json"][2] == "Print the JSON report."
        assert options["quiet"][0] == ("--quiet", "-q")
