"""The ``daskann`` command line."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
from click.testing import CliRunner

from daskann import load_checkpoint
from daskann.cli import main


def _invoke(args):
    return CliRunner().invoke(main, args, catch_exceptions=False)


def test_train_serial_writes_a_verified_run_and_resumes(tmp_path):
    out = tmp_path / "run"
    common = ["train", "serial", "--dataset", "digits", "--hidden", "32", "--lr", "0.1", "--momentum", "0.9",
              "--batch-size", "32", "-o", str(out), "--json", "-q"]
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
    assert all(np.array_equal(x, y) for x, y in zip(a.model.params + a.velocity, b.model.params + b.velocity))


def test_bad_flags_give_one_line_errors(tmp_path):
    cases = [
        (["train", "serial", "--lr", "0"], "lr=0.0 is not valid"),
        (["train", "serial", "--momentum", "1.5"], "momentum=1.5 is not valid"),
        (["train", "serial", "--batch-size", "0"], "batch_size=0 is not valid"),
        (["train", "serial", "--hidden", "8,x"], "comma-separated"),
        (["train", "serial", "--dataset", "imagenet"], "imagenet"),
        (["train", "serial", "--activation", "tanh"], "tanh"),
        (["train", "serial", "--dataset", "mnist"], "path="),
        (["train", "serial", "--resume"], "resume needs --output"),
    ]
    for args, message in cases:
        result = _invoke(args)
        assert result.exit_code != 0, args
        assert message in result.output, (args, result.output)
        assert "Traceback" not in result.output
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
