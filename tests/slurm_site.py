"""A site on the one-node SLURM of ``ci/slurm/start.sh``, for the tests marked ``slurm``.

Profiles are written per test into a temporary folder: two one-core worker jobs over TLS, every
job named after the test session so that cleaning up cancels only this session's jobs. The
scheduler and workers listen on the loopback interface; nothing else is reached.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import numpy as np
import pytest
import yaml

#: the name of every job this test session submits (squeue -n, scancel -n)
JOB_NAME = f"daskann-test-{uuid.uuid4().hex[:8]}"


def slurm_answers() -> bool:
    """Whether a SLURM controller answers here (``sinfo``)."""
    if shutil.which("sinfo") is None:
        return False
    try:
        return subprocess.run(["sinfo", "-h"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


#: marks a module's tests: skipped, with the reason, where no SLURM answers (CI starts one)
needs_slurm = [
    pytest.mark.slurm,
    pytest.mark.skipif(not slurm_answers(), reason="no SLURM answers here (sinfo): run ci/slurm/start.sh as root"),
]


def write_profile(folder: Path, *, jobs: int = 2, cluster: dict | None = None, **top) -> Path:
    """A profile of one-core worker jobs on the test node; ``cluster`` and ``top`` override its keys."""
    folder.mkdir(parents=True, exist_ok=True)
    shared = folder / "shared"
    shared.mkdir(exist_ok=True)
    spec = {
        "kind": "slurm",
        "security": True,
        "shared_directory": str(shared),
        "cluster": {
            "cores": 1,
            "memory": "1GB",
            "walltime": "00:10:00",
            "interface": "lo",
            "job_name": JOB_NAME,
            "python": sys.executable,
            "local_directory": str(folder / "local"),
            "log_directory": str(folder / "logs"),
            "death_timeout": 60,
            "scheduler_options": {"dashboard_address": "127.0.0.1:0"},
            **(cluster or {}),
        },
        "scale": {"jobs": jobs},
        **top,
    }
    path = folder / "site.yaml"
    path.write_text(yaml.safe_dump(spec), encoding="utf-8")
    return path


def queued_jobs() -> list[tuple[str, str, str]]:
    """``(job id, state, reason)`` of this session's jobs still known to SLURM."""
    out = subprocess.run(
        ["squeue", "-h", "-n", JOB_NAME, "-o", "%i|%T|%r"], capture_output=True, text=True, timeout=30
    ).stdout
    return [tuple(line.split("|")) for line in out.splitlines() if line.strip()]


def cancel_all() -> None:
    """Cancel every job of this session (a test's clean-up)."""
    subprocess.run(["scancel", "-n", JOB_NAME], capture_output=True, timeout=30)


def wait_until_no_jobs(timeout: float = 60) -> list:
    """This session's jobs once none is left, or those still there after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while (left := queued_jobs()) and time.monotonic() < deadline:
        time.sleep(0.5)
    return left


def job_of_worker(c, address: str) -> str:
    """The SLURM job id of the worker at ``address`` (its worker name is its job's name in the cluster)."""
    name = c.scheduler_info(n_workers=-1)["workers"][address]["name"]
    return str(c.cluster.workers[name].job_id)


def scancel_worker(c, address: str) -> str:
    """End the job of one worker as the batch system does (``scancel``: nanny, worker and job alike)."""
    job_id = job_of_worker(c, address)
    subprocess.run(["scancel", job_id], check=True, timeout=30)
    return job_id


def params(model) -> list[np.ndarray]:
    return [np.asarray(p) for p in model.params]


def relative_difference(a, b) -> float:
    """Largest difference over the largest magnitude, across every array of two weight lists."""
    assert len(a) == len(b)
    diff = max(float(np.max(np.abs(x - y))) for x, y in zip(a, b, strict=True))
    scale = max(float(np.max(np.abs(y))) for y in b)
    return diff / scale


class DuringFit:
    """Run ``fit`` in a thread; ``fault()`` runs once ``ready()`` says so, while the fit still runs.

    ``error`` holds what the fit raised; ``fault_seconds`` when the fault came, ``seconds`` the fit's length.
    """

    def __init__(self, fit, ready, fault, *, timeout: float = 280):
        self.error = None
        self.result = None
        self.fault_result = None
        start = time.monotonic()
        thread = threading.Thread(target=self._run, args=(fit,), daemon=True)
        thread.start()
        while not ready() and thread.is_alive() and time.monotonic() - start < timeout:
            time.sleep(0.05)
        self.fault_seconds = time.monotonic() - start
        self.faulted_mid_run = thread.is_alive()
        if self.faulted_mid_run:
            self.fault_result = fault()
        thread.join(max(1.0, timeout - (time.monotonic() - start)))
        self.hung = thread.is_alive()
        self.seconds = time.monotonic() - start

    def _run(self, fit):
        try:
            self.result = fit()
        except BaseException as exc:  # reported by the test
            self.error = exc


def processing_on(c, address: str) -> bool:
    """Whether the worker at ``address`` is running a task now."""
    return bool(c.processing(workers=[address]).get(address))


class WorkersSeen:
    """Every worker address the scheduler lists while the ``with`` block runs (polled twice a second)."""

    def __init__(self, c):
        self.c = c
        self.addresses: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            with contextlib.suppress(Exception):  # the scheduler is busy: look again
                self.addresses.update(self.c.scheduler_info(n_workers=-1)["workers"])
            self._stop.wait(0.5)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(10)


def release_held_jobs_after(seconds: float) -> threading.Timer:
    """Release this session's held jobs (``--hold``, reason JobHeldUser) ``seconds`` from now, as a queue would."""

    def release():
        ids = [job_id for job_id, state, _ in queued_jobs() if state == "PENDING"]
        if ids:
            subprocess.run(["scontrol", "release", ",".join(ids)], capture_output=True, timeout=30)

    timer = threading.Timer(seconds, release)
    timer.daemon = True
    timer.start()
    return timer
