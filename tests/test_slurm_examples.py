"""The documented SLURM examples, run on the one-node SLURM of ``ci/slurm/start.sh``, scaled to it.

* ``cluster/sbatch-example.sh`` as the chained-allocation recipe of ``cluster/README.md``: the
  first driver job reaches its walltime (one minute) mid-run and is killed by SLURM; the next one,
  queued with ``--dependency=afterany``, resumes from the last checkpoint, and so on until the run
  is complete. The weights equal one uninterrupted (serial) run.
* ``cluster/slurm-runner-example.sh``: one allocation of four tasks (scheduler, client, two workers).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from slurm_site import JOB_NAME, cancel_all, needs_slurm, params, relative_difference, wait_until_no_jobs, write_profile

from daskann import load_checkpoint
from daskann.store import load_history

pytestmark = needs_slurm

REPO = Path(__file__).resolve().parents[1]
#: the virtual environment the examples activate (their VENV), the one running the tests
VENV = Path(sys.prefix) if sys.prefix != sys.base_prefix else None


@pytest.fixture(autouse=True)
def _no_jobs_left():
    yield
    cancel_all()
    wait_until_no_jobs()  # the next test starts on an empty queue


def sbatch(script: str, *options: str, env: dict) -> str:
    """Submit ``script`` (from the repository root, as its README says) with ``options`` over its #SBATCH lines."""
    done = subprocess.run(
        ["sbatch", "--parsable", f"--job-name={JOB_NAME}", *options, script],
        cwd=REPO, capture_output=True, text=True, timeout=60, env={**os.environ, **env}, check=True,
    )  # fmt: skip
    return done.stdout.strip().split(";")[0]


def wait_for_jobs(job_ids, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        out = subprocess.run(["squeue", "-h", "-j", ",".join(job_ids), "-o", "%i"], capture_output=True, text=True)
        if not out.stdout.strip():
            return
        time.sleep(2)
    raise AssertionError(f"jobs {job_ids} still queued after {timeout:.0f} s")


def example_env(tmp_path) -> dict:
    env = {"DASKANN_PROFILE": str(write_profile(tmp_path / "site", cluster={"death_timeout": 20}))}
    if VENV is not None:
        env["VENV"] = str(VENV)
    return env


NET = "--dataset digits --hidden 32 --lr 0.05 --momentum 0.9"
RESIDENT = "--mode resident --grid 1x2"
CHECKPOINT_EVERY = 1000


def chained_steps(tmp_path) -> int:
    """Steps of the chained run: at least 15,000, and 150 s of training at this machine's rate.

    A one-minute allocation trained 6,000 to 11,000 of these steps here: the run must outlast the
    first allocation on a faster machine too. The rate is a short run's own (its history's time,
    the embedded cluster's start left out), with the chain's settings.
    """
    out = tmp_path / "pilot"
    pilot = subprocess.run(
        [sys.executable, "-m", "daskann", "train", "npt", *NET.split(), *RESIDENT.split(), "--steps", "1000",
         "--checkpoint-every", str(CHECKPOINT_EVERY), "--output", str(out)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert pilot.returncode == 0, pilot.stderr[-2000:]
    history = load_history(out / "history.zarr")
    rate = history.sizes["step"] / float(history["time"].values[-1])
    print(f"pilot: {rate:.0f} steps per second")
    return max(15000, int(rate * 150) // CHECKPOINT_EVERY * CHECKPOINT_EVERY)


@pytest.mark.timeout(900)
def test_a_run_longer_than_an_allocation_continues_in_the_next_job_and_equals_one_run(tmp_path):
    steps = chained_steps(tmp_path)
    run = tmp_path / "run"
    env = {
        **example_env(tmp_path),
        "DASKANN_RUN": str(run),
        "DASKANN_TRAINING": f"{NET} --steps {steps} {RESIDENT}",
        "DASKANN_CHECKPOINT_EVERY": str(CHECKPOINT_EVERY),
    }
    jobs = []
    for _ in range(5):  # each allocation has one minute; the chain ends once the run is complete
        after = [f"--dependency=afterany:{jobs[-1]}"] if jobs else []
        jobs.append(sbatch("cluster/sbatch-example.sh", "--time=1", "--mem=1G", "--cpus-per-task=1",
                           f"--output={tmp_path}/driver-%j.log", *after, env=env))  # fmt: skip
    wait_for_jobs(jobs, timeout=840)
    logs = {job: (tmp_path / f"driver-{job}.log").read_text() for job in jobs}
    timed_out = [job for job, log in logs.items() if "DUE TO TIME LIMIT" in log]
    resumed = {job: m.group(1) for job, log in logs.items() if (m := re.search(r"resuming from .*step-(\d+)", log))}
    completed = [job for job, log in logs.items() if '"steps"' in log]
    for job, log in logs.items():
        print(f"--- driver job {job}\n{log[-1500:]}")
    assert timed_out and resumed and len(completed) == 1, "one job reached its walltime, a later one finished"
    serial = subprocess.run(
        [sys.executable, "-m", "daskann", "train", "serial", *NET.split(), "--steps", str(steps), "--output",
         str(tmp_path / "serial")],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert serial.returncode == 0, serial.stderr[-2000:]
    difference = relative_difference(
        params(load_checkpoint(run / "model.zarr").model),
        params(load_checkpoint(tmp_path / "serial" / "model.zarr").model),
    )
    print(f"chained allocations of {steps} steps: jobs {jobs}, timed out {timed_out}, resumed from steps {resumed}, "
          f"completed by {completed}; relative difference to one serial run {difference:.1e}")  # fmt: skip
    assert difference <= 1e-9
    # each allocation saved its rows beside its checkpoints: the history is the whole run's, as one run's
    history, reference = (load_history(d / "history.zarr") for d in (run, tmp_path / "serial"))
    assert list(history["step"].values) == list(range(1, steps + 1))
    np.testing.assert_allclose(history["loss"].values, reference["loss"].values, rtol=1e-9)


@pytest.mark.timeout(600)
def test_the_slurm_runner_example_trains_in_one_allocation(tmp_path):
    env = {
        **example_env(tmp_path),
        "DASKANN_SAMPLES": "400",
        "DASKANN_HIDDEN": "16",
        "DASKANN_EPOCHS": "2",
        "DASKANN_INTERFACE": "lo",
    }
    job = sbatch("cluster/slurm-runner-example.sh", "--ntasks=4", "--mem-per-cpu=700M", "--time=8",
                 f"--output={tmp_path}/runner-%j.log", env=env)  # fmt: skip
    wait_for_jobs([job], timeout=540)
    log = (tmp_path / f"runner-{job}.log").read_text()
    print(log[-3000:])
    assert re.search(r"final loss \d+\.\d+", log), "the client task trained and logged its result"
