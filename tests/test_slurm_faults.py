"""Every method through a batch system's faults, on the one-node SLURM of ``ci/slurm/start.sh``.

A worker here is a SLURM job of one core started by a daskann profile (TLS, loopback). The faults
are the batch system's own: ``scancel`` ends one worker job whole (nanny and worker alike), and
``--lifetime`` retires every worker before its walltime, several times in one run. The profile's
cluster keeps its two jobs, so each ended job is replaced from the queue by a new one, with a new
address, about ``distributed.deploy.lost-worker-timeout`` (15 s) later. Each run must end with
serial training's weights (relative difference at most 1e-9, float64) or, where nothing can
restart it, raise :class:`~daskann.exceptions.LostWorkersError`; never an error of distributed's.
Run with ``-s`` to see each case's figures.
"""

from __future__ import annotations

import contextlib

import dask
import pytest
from slurm_site import (
    DuringFit,
    WorkersSeen,
    cancel_all,
    needs_slurm,
    params,
    processing_on,
    relative_difference,
    scancel_worker,
    write_profile,
)

from daskann import SerialTrainer, store
from daskann.cluster import client, close
from daskann.data import make_linear
from daskann.exceptions import LostWorkersError

pytestmark = needs_slurm

TOLERANCE = 1e-9
COMMON = dict(lr=0.05, batch_size=20, seed=3, sgd={"momentum": 0.9})
#: workers retire every 20-30 s; their jobs' walltime is 2 minutes
RETIRING = {"walltime": "00:02:00", "worker_extra_args": ["--lifetime", "25s", "--lifetime-stagger", "5s"]}


@pytest.fixture(scope="module")
def data():
    return make_linear(240, 7, 4, noise=0.1, seed=1)


@pytest.fixture(autouse=True)
def _no_jobs_left():
    yield
    cancel_all()


@contextlib.contextmanager
def profile_client(tmp_path, **cluster):
    c = client(profile=write_profile(tmp_path / "site", cluster=cluster))
    try:
        yield c
    finally:
        close(c)


def serial(data, steps, hidden=(16,)):
    X, y = data
    return params(SerialTrainer(hidden, **COMMON).fit(X, y, steps=steps).model_)


def report(name, **figures):
    print(f"\n[slurm faults] {name}: " + ", ".join(f"{k}={v}" for k, v in figures.items()), flush=True)


def addresses_seen(c, during):
    """Every worker address the scheduler saw during ``during()`` (polled), and its result."""
    seen = set(c.scheduler_info(n_workers=-1)["workers"])
    result = during(lambda: seen.update(c.scheduler_info(n_workers=-1)["workers"]))
    return seen, result


# -- one worker job cancelled -------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["graph", "resident"])
def test_npt_survives_scancel_of_a_cell_job(tmp_path, data, mode):
    from daskann.npt import NPTTrainer

    X, y = data
    steps, every = (120, 20) if mode == "graph" else (600, 100)
    with profile_client(tmp_path) as c:
        trainer = NPTTrainer(
            (16,), grid="1x2", mode=mode, client=c, checkpoint={"dir": tmp_path / "run", "every": every}, **COMMON
        )
        run = DuringFit(
            lambda: params(trainer.fit(X, y, steps=steps).model_),
            lambda: len(store.list_checkpoints(tmp_path / "run")) >= 1,
            lambda: scancel_worker(c, trainer.grid_.owner(0, 1)),
        )
    assert run.faulted_mid_run and not run.hung, "the job was cancelled while the fit ran, and the fit ended"
    assert run.error is None, repr(run.error)
    difference = relative_difference(run.result, serial(data, steps))
    report(f"npt {mode}: scancel of job {run.fault_result}", at_s=round(run.fault_seconds, 1),
           seconds=round(run.seconds, 1), recoveries=trainer.recoveries_, difference=f"{difference:.1e}")  # fmt: skip
    assert trainer.recoveries_ >= 1 and difference <= TOLERANCE


def test_npt_resident_without_checkpoint_restarts_from_the_start_or_raises_lost_workers(tmp_path, data):
    """No checkpoint: the run restarts from the state the client holds (its start), or says what was lost.

    Never an error of distributed's (``CommClosedError``) and never a hang.
    """
    from daskann.npt import NPTTrainer

    X, y = data
    steps = 4000
    with profile_client(tmp_path) as c:
        trainer = NPTTrainer((16,), grid="1x2", mode="resident", client=c, **COMMON)
        run = DuringFit(
            lambda: params(trainer.fit(X, y, steps=steps).model_),
            lambda: hasattr(trainer, "grid_") and processing_on(c, trainer.grid_.owner(0, 1)),
            lambda: scancel_worker(c, trainer.grid_.owner(0, 1)),
            timeout=240,
        )
    assert run.faulted_mid_run and not run.hung
    if run.error is not None:
        report("npt resident, no checkpoint: scancel", error=repr(run.error)[:300], seconds=round(run.seconds, 1))
        assert isinstance(run.error, LostWorkersError), repr(run.error)
        assert "checkpoint" in str(run.error)
        return
    difference = relative_difference(run.result, serial(data, steps))
    report("npt resident, no checkpoint: scancel", restarted_from_step=0, recoveries=trainer.recoveries_,
           seconds=round(run.seconds, 1), difference=f"{difference:.1e}")  # fmt: skip
    assert trainer.recoveries_ >= 1 and difference <= TOLERANCE


def test_partition_survives_scancel_of_a_submodel_job(tmp_path, data):
    from daskann.partition import PartitionTrainer

    X, y = data
    kw = dict(k=2, merge={"noise": 0.02}, split={"sub_steps": 3000, "retries": 2, "timeout": 240.0}, **COMMON)
    reference = PartitionTrainer((32, 32), client=None, **kw)
    with profile_client(tmp_path) as c:
        reference.set_params(client=c).fit(*data, steps=20)
        trainer = PartitionTrainer((32, 32), client=c, checkpoint={"dir": tmp_path / "run", "every": 500}, **kw)
        run = DuringFit(
            lambda: trainer.fit(*data, steps=20),
            lambda: any(processing_on(c, w) for w in c.scheduler_info()["workers"]),
            lambda: scancel_worker(c, next(w for w in c.scheduler_info()["workers"] if processing_on(c, w))),
        )
    assert run.faulted_mid_run and not run.hung and run.error is None, repr(run.error)
    got = [p for m in trainer.submodels_ for p in m.params] + params(trainer.model_)
    ref = [p for m in reference.submodels_ for p in m.params] + params(reference.model_)
    difference = relative_difference(got, ref)
    report("partition: scancel of a sub-model's job", job=run.fault_result, seconds=round(run.seconds, 1),
           difference=f"{difference:.1e}")  # fmt: skip
    assert difference <= TOLERANCE


# -- every worker retiring at its walltime, several times in one run ---------------------------------------
@contextlib.contextmanager
def retiring_cluster(tmp_path):
    """Two worker jobs whose workers retire every 12-16 s; the cluster replaces each job from the queue.

    SpecCluster gives up on a worker that left after ``distributed.deploy.lost-worker-timeout`` (15 s),
    and only then is its job resubmitted: 3 s here, so that a run sees several generations of jobs.
    """
    with dask.config.set({"distributed.deploy.lost-worker-timeout": "3s"}):
        with profile_client(tmp_path, **RETIRING) as c, WorkersSeen(c) as seen:
            yield c, seen


def generations(seen, workers=2) -> float:
    return len(seen.addresses) / workers


def test_npt_graph_rides_through_workers_retiring_at_their_walltime(tmp_path, data):
    from daskann.npt import NPTTrainer

    X, y = data
    steps = 1500
    with retiring_cluster(tmp_path) as (c, seen):
        trainer = NPTTrainer(
            (16,), grid="1x2", mode="graph", client=c, checkpoint={"dir": tmp_path / "run", "every": 50}, **COMMON
        )
        got = params(trainer.fit(X, y, steps=steps).model_)
    difference = relative_difference(got, serial(data, steps))
    report("npt graph, workers retiring", generations=generations(seen), recoveries=trainer.recoveries_,
           difference=f"{difference:.1e}")  # fmt: skip
    assert generations(seen) >= 3 and difference <= TOLERANCE
