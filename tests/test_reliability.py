"""Runs killed at random points resume from their stores and end bit-identical.

The figures of docs/reliability.md come from these tests.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from daskann import SerialTrainer, load_checkpoint, store
from daskann.data import load_dataset

TRAIN = [
    sys.executable,
    "-m",
    "daskann",
    "train",
    "serial",
    "--dataset",
    "linear",
    "--n-samples",
    "2048",
    "--hidden",
    "128,128",
    "--lr",
    "0.02",
    "--momentum",
    "0.9",
    "--batch-size",
    "64",
    "--steps",
    "600",
    "--checkpoint-every",
    "50",
    "-q",
]


def _params(ckpt):
    return ckpt.model.params + ckpt.velocity


def _equal(a, b):
    return all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))


@pytest.fixture(scope="module")
def straight_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("straight") / "run"
    subprocess.run([*TRAIN, "-o", str(out)], check=True, timeout=300)
    return load_checkpoint(out / "model.zarr")


def _kill_after_progress(proc, out, delay, timeout=300):
    """SIGKILL ``proc`` ``delay`` seconds after it writes a new checkpoint; False if it ended first."""
    seen = {p.name for p in store.list_checkpoints(out)}
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        if {p.name for p in store.list_checkpoints(out)} - seen:
            time.sleep(delay)
            if proc.poll() is not None:
                return False
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=60)
            return True
        time.sleep(0.02)
    proc.kill()
    pytest.fail("no progress within the time limit")


def test_client_killed_at_random_points_resumes_bit_identical(tmp_path, straight_run):
    out = tmp_path / "run"
    rng = np.random.default_rng(12345)
    kills = 0
    command = [*TRAIN, "-o", str(out)]
    for _attempt in range(8):
        proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        if kills < 4 and _kill_after_progress(proc, out, float(rng.uniform(0.0, 0.5))):
            kills += 1
            command = [*TRAIN, "-o", str(out), "--resume"]
            continue
        proc.wait(timeout=300)
        assert proc.returncode == 0, proc.stderr.read().decode()
        break
    assert kills == 4, "the campaign must actually interrupt the run"
    final = load_checkpoint(out / "model.zarr")
    assert final.step == 600
    assert _equal(_params(final), _params(straight_run))
    report = store.verify_path(out)
    assert not [i for i in report["items"] if i["status"] == "damaged"]
    # killed writes may leave hidden temporaries; they never count as checkpoints
    assert all(".tmp-" in i["path"] or ".old-" in i["path"] for i in report["items"] if i["status"] == "orphan")


@pytest.mark.parametrize("control", ["momentum dropped", "batch order re-seeded"])
def test_negative_controls_break_equality(tmp_path, control):
    data = load_dataset("linear", n_samples=512, seed=0)
    kwargs = {"lr": 0.02, "batch_size": 64, "seed": 0, "sgd": {"momentum": 0.9}}
    straight = SerialTrainer((32,), **kwargs).fit(data.X_train, data.y_train, steps=60)
    SerialTrainer((32,), **kwargs, checkpoint=tmp_path).fit(data.X_train, data.y_train, steps=30)
    ckpt = load_checkpoint(tmp_path)
    if control == "momentum dropped":
        ckpt.velocity = [np.zeros_like(v) for v in ckpt.velocity]
        broken = SerialTrainer((32,), **kwargs)
    else:
        broken = SerialTrainer((32,), **{**kwargs, "seed": 1})
    store.save_checkpoint(tmp_path / "tampered.zarr", ckpt)
    if control == "batch order re-seeded":
        with pytest.raises(store.StoreError, match="batch order"):
            broken.fit(data.X_train, data.y_train, steps=60, resume=tmp_path / "tampered.zarr")
        # forcing it through init_model (no optimiser state, new order) must differ
        broken.fit(data.X_train, data.y_train, steps=30, init_model=ckpt.model)
    else:
        broken.fit(data.X_train, data.y_train, steps=60, resume=tmp_path / "tampered.zarr")
    assert not _equal(broken.model_.params, straight.model_.params)
    honest = SerialTrainer((32,), **kwargs).fit(data.X_train, data.y_train, steps=60, resume=tmp_path)
    assert _equal(honest.model_.params, straight.model_.params)


def test_kill_during_checkpoint_write_keeps_the_previous_checkpoint(tmp_path):
    data = load_dataset("linear", n_samples=512, seed=0)
    SerialTrainer((32,), batch_size=64, checkpoint={"dir": tmp_path, "every": 5}).fit(
        data.X_train, data.y_train, steps=10
    )
    # a writer killed between the temporary write and the rename leaves only a hidden temporary
    code = (
        "import os, signal\n"
        "from daskann import store\n"
        "from daskann.store import _atomic\n"
        f"ck = store.load_checkpoint({str(tmp_path)!r})\n"
        "_atomic.atomic_replace_dir = lambda tmp, target: os.kill(os.getpid(), signal.SIGKILL)\n"
        "ck.step = 15\n"
        f"store.save_checkpoint(store.checkpoint_path({str(tmp_path)!r}, 15), ck)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], timeout=120)
    assert result.returncode == -signal.SIGKILL
    assert store.find_checkpoint(tmp_path).name == "step-00000010.zarr"
    report = store.verify_path(tmp_path)
    assert [i["status"] for i in report["items"]].count("orphan") == 1
    assert all(i["status"] in ("ok", "orphan") for i in report["items"])
    assert os.path.exists(tmp_path / "checkpoints" / "step-00000010.zarr")
