"""daskann on a real SLURM (``ci/slurm/start.sh``): starting, waiting for queued jobs, bad profiles.

Worker jobs are real SLURM jobs of one core, started by dask-jobqueue from a daskann profile; a
job ends whole (``scancel``), as on any batch system. Fault tests of the methods are in
``test_slurm_faults.py``; the documented examples and the chained-allocation recipe in
``test_slurm_examples.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import dask
import pytest
import yaml
from slurm_site import (
    JOB_NAME,
    cancel_all,
    needs_slurm,
    params,
    queued_jobs,
    relative_difference,
    release_held_jobs_after,
    wait_until_no_jobs,
    write_profile,
)

from daskann import load_checkpoint
from daskann.cluster import client, close, shared_directory
from daskann.exceptions import WorkerWaitTimeout

pytestmark = needs_slurm


@pytest.fixture(autouse=True)
def _no_jobs_left():
    yield
    cancel_all()
    wait_until_no_jobs()  # the next test starts on an empty queue


def test_profile_client_waits_for_queued_jobs_and_reports_them(tmp_path, capfd):
    # the jobs are held (reason JobHeldUser) until released 4 s later, as a busy queue would keep them
    profile = write_profile(tmp_path, cluster={"job_extra_directives": ["--hold"]})
    release_held_jobs_after(4)
    c = client(profile=profile)
    try:
        workers = c.scheduler_info(n_workers=-1)["workers"]
        assert len(workers) == 2
        assert all(addr.startswith("tls://127.0.0.1:") for addr in workers)
        assert shared_directory(c) == tmp_path / "shared"
        # the TLS files every job reads go to the shared folder, in a private folder of their own
        assert c.cluster.shared_temp_directory == str(tmp_path / "shared" / "daskann-tls")
    finally:
        close(c)
    err = capfd.readouterr().err
    print(err)
    assert "waiting for workers: 0 of 2 workers connected; jobs: 0 running, 2 pending" in err
    assert "JobHeldUser" in err
    assert not wait_until_no_jobs(), "close() leaves no job in the queue"


def test_worker_wait_running_out_names_the_jobs_and_the_setting_and_leaves_no_job(tmp_path):
    profile = write_profile(tmp_path, cluster={"job_extra_directives": ["--begin=now+600"]})
    with dask.config.set({"daskann.cluster.worker-wait": "3s"}), pytest.raises(WorkerWaitTimeout) as info:
        client(profile=profile)
    message = str(info.value)
    print(message)
    assert "daskann.cluster.worker-wait='3s' ran out" in message
    assert "0 of 2 workers connected" in message and "BeginTime" in message
    assert not wait_until_no_jobs(), "a failed start cancels its jobs"


def test_a_trainer_given_a_cluster_with_queued_jobs_waits_for_them(tmp_path, capfd):
    from distributed import Client

    from daskann.cluster import jobqueue_cluster, keep_jobs
    from daskann.data import make_linear
    from daskann.npt import NPTTrainer

    cluster, scale = jobqueue_cluster(write_profile(tmp_path, cluster={"job_extra_directives": ["--hold"]}))
    keep_jobs(cluster, scale)
    release_held_jobs_after(4)
    c = Client(cluster)
    try:
        assert not c.scheduler_info()["workers"]
        X, y = make_linear(64, 4, 2, seed=0)
        trainer = NPTTrainer((8,), grid="1x2", mode="graph", steps=5, client=c, verbose=1).fit(X, y)
        assert len(set(trainer.grid_.workers)) == 2
    finally:
        c.close()
        cluster.close()
    assert "waiting for workers" in capfd.readouterr().err


@pytest.mark.parametrize(
    ("change", "key", "expected"),
    [
        ({"cluster": {"queue": "no-such-partition"}}, "queue", "invalid partition"),
        (
            {"cluster": {"walltime": "00:01:00", "worker_extra_args": ["--lifetime", "60s"]}},
            "--lifetime",
            "shorter than the walltime",
        ),
        ({"shared_directory": "/no/such/folder"}, "shared_directory", "an existing folder"),
        ({"sharde_directory": "/tmp"}, "keys of", "only kind, cluster"),
    ],
    ids=["unknown-partition", "lifetime-not-under-walltime", "missing-shared-directory", "unknown-key"],
)
def test_bad_profiles_fail_in_one_line_before_any_job(tmp_path, change, key, expected):
    cluster = change.pop("cluster", {})
    profile = write_profile(tmp_path, cluster=cluster, **change)
    before = {job_id for job_id, _, _ in queued_jobs()}  # an earlier test's jobs may still be completing
    with pytest.raises((ValueError, TypeError, OSError)) as info:
        client(profile=profile)
    message = str(info.value)
    print(message)
    assert "\n" not in message and key in message and expected in message
    assert not {job_id for job_id, _, _ in queued_jobs()} - before, "no job may be queued for a profile that is refused"
    # a cluster built and then refused takes the workers' TLS keys out of the shared folder with it at once
    assert not list((tmp_path / "shared").rglob(".dask-jobqueue.worker.*"))


def test_the_command_line_trains_npt_on_a_profile_and_equals_serial(tmp_path):
    """The issue's first failure: ``daskann train npt --profile`` exited at once, with no worker yet."""
    profile = write_profile(tmp_path, cluster={"job_extra_directives": ["--hold"]})
    release_held_jobs_after(4)
    common = ["--dataset", "digits", "--hidden", "64", "--steps", "100", "--json"]
    env = {**os.environ, "DASKANN_SLURM_TEST": JOB_NAME}
    npt = subprocess.run(
        [sys.executable, "-m", "daskann", "train", "npt", "--profile", str(profile), "--grid", "1x2",
         *common, "--output", str(tmp_path / "npt")],
        capture_output=True, text=True, timeout=280, env=env,
    )  # fmt: skip
    assert npt.returncode == 0, npt.stderr[-3000:]
    serial = subprocess.run(
        [sys.executable, "-m", "daskann", "train", "serial", *common, "--output", str(tmp_path / "serial")],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert serial.returncode == 0, serial.stderr[-3000:]
    summary = json.loads(npt.stdout)
    got = params(load_checkpoint(tmp_path / "npt" / "model.zarr").model)
    ref = params(load_checkpoint(tmp_path / "serial" / "model.zarr").model)
    difference = relative_difference(got, ref)
    print(f"cli npt on 2 worker jobs vs serial: relative difference {difference:.1e}; grid {summary.get('grid')}")
    assert difference <= 1e-9
    assert "waiting for workers" in npt.stderr
    assert not wait_until_no_jobs(), "the command cancels its worker jobs when it ends"


def test_plan_measures_a_profile_cluster(tmp_path):
    """``daskann plan --measure --profile`` and ``--profile`` of a site profile without typical values."""
    profile = write_profile(tmp_path)
    out = tmp_path / "site-measured.yaml"
    measure = subprocess.run(
        [sys.executable, "-m", "daskann", "plan", "--measure", "--profile", str(profile), "-o", str(out)],
        capture_output=True, text=True, timeout=280,
    )  # fmt: skip
    assert measure.returncode == 0, measure.stderr[-3000:]
    measured = yaml.safe_load(out.read_text())
    print(measured)
    assert measured["flop_rate"] > 0 and measured["task_overhead"] > 0 and max(measured["workers"]) >= 2
    planned = subprocess.run(
        [sys.executable, "-m", "daskann", "plan", "--method", "partition", "--profile", str(profile), "--json"],
        capture_output=True, text=True, timeout=280,
    )  # fmt: skip
    assert planned.returncode == 0, planned.stderr[-3000:]
    assert json.loads(planned.stdout)
    assert not wait_until_no_jobs(), "plan cancels the worker jobs it started"
