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
import time

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
    wait_until_no_jobs,
    write_profile,
)

from daskann import SerialTrainer, store
from daskann.cluster import client, close
from daskann.data import make_linear
from daskann.exceptions import LostWorkersError

# MGRIT fits here must run the solve, which the default policy skips for problems this small
pytestmark = [*needs_slurm, pytest.mark.usefixtures("mgrit_study")]

TOLERANCE = 1e-9
COMMON = dict(lr=0.05, batch_size=20, seed=3, sgd={"momentum": 0.9})
#: walltime of the retiring workers' jobs
WALLTIME = "00:03:00"


@pytest.fixture(scope="module")
def data():
    return make_linear(240, 7, 4, noise=0.1, seed=1)


@pytest.fixture(autouse=True)
def _no_jobs_left():
    yield
    cancel_all()
    wait_until_no_jobs()  # the next test starts on an empty queue


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
def test_npt_survives_scancel_of_a_cell_job_and_waits_for_its_late_replacement(tmp_path, data, mode):
    """The replacement job comes from the queue 15 s or more later, with a new address: training waits for it.

    ``daskann.npt.regrid-timeout`` (the wait for a nanny's restart in place) is 1 s here, so a run that
    did not wait for the pending job would go on with one worker for both cells.
    """
    from daskann.npt import NPTTrainer

    X, y = data
    steps, every = (120, 20) if mode == "graph" else (600, 100)
    with dask.config.set({"daskann.npt.regrid-timeout": "1s"}), profile_client(tmp_path) as c:
        trainer = NPTTrainer(
            (16,), grid="1x2", mode=mode, client=c, checkpoint={"dir": tmp_path / "run", "every": every}, **COMMON
        )
        run = DuringFit(
            lambda: params(trainer.fit(X, y, steps=steps).model_),
            lambda: len(store.list_checkpoints(tmp_path / "run")) >= 1,
            lambda: (trainer.grid_.owner(0, 1), scancel_worker(c, trainer.grid_.owner(0, 1))),
        )
        final_workers = set(trainer.grid_.workers)
    assert run.faulted_mid_run and not run.hung, "the job was cancelled while the fit ran, and the fit ended"
    assert run.error is None, repr(run.error)
    victim, job = run.fault_result
    difference = relative_difference(run.result, serial(data, steps))
    report(f"npt {mode}: scancel of job {job}", at_s=round(run.fault_seconds, 1), seconds=round(run.seconds, 1),
           recoveries=trainer.recoveries_, workers=len(final_workers), difference=f"{difference:.1e}")  # fmt: skip
    assert trainer.recoveries_ >= 1 and difference <= TOLERANCE
    assert len(final_workers) == 2 and victim not in final_workers, "the grid is back on two workers, one of them new"


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
def retiring_cluster(tmp_path, lifetime="25s", stagger="5s"):
    """Two worker jobs whose workers retire after ``lifetime`` (give or take ``stagger``); each job is replaced.

    SpecCluster gives up on a worker that left after ``distributed.deploy.lost-worker-timeout`` (15 s),
    and only then is its job resubmitted: 3 s here, so that a run sees several generations of jobs.
    """
    with dask.config.set({"distributed.deploy.lost-worker-timeout": "3s"}):
        retiring = ["--lifetime", lifetime, "--lifetime-stagger", stagger]
        with profile_client(tmp_path, walltime=WALLTIME, worker_extra_args=retiring) as c, WorkersSeen(c) as seen:
            yield c, seen


def generations(seen, workers=2) -> float:
    return len(seen.addresses) / workers


def steps_per_second(fit, pilot: int) -> float:
    """The rate of ``fit(steps)``, undisturbed, timed on a ``pilot`` run (its set-up included: a low estimate).

    The retiring tests size their runs and checkpoints by the machine's speed, so that every run spans
    the same number of worker lifetimes, and checkpoints the same share of one, on a faster or a slower
    machine.
    """
    start = time.monotonic()
    fit(pilot)
    return pilot / (time.monotonic() - start)


def rounded(steps: float, multiple: int) -> int:
    """``steps`` down to a multiple of ``multiple``, at least one."""
    return max(multiple, int(steps) // multiple * multiple)


def steps_lasting(seconds: float, fit, pilot: int, multiple: int) -> int:
    """Steps that ``fit(steps)`` takes about ``seconds`` for, timed on a ``pilot`` run."""
    return rounded(steps_per_second(fit, pilot) * seconds, multiple)


def test_npt_graph_rides_through_workers_retiring_at_their_walltime(tmp_path, data):
    from daskann.npt import NPTTrainer

    X, y = data
    with retiring_cluster(tmp_path) as (c, seen):
        pilot = NPTTrainer((16,), grid="1x2", mode="graph", client=c, **COMMON)
        # 45 s: the first two workers (25 s, give or take 5) and their replacements are seen well before the end
        steps = steps_lasting(45, lambda n: pilot.fit(X, y, steps=n), pilot=100, multiple=50)
        trainer = NPTTrainer(
            (16,), grid="1x2", mode="graph", client=c, checkpoint={"dir": tmp_path / "run", "every": 50}, **COMMON
        )
        got = params(trainer.fit(X, y, steps=steps).model_)
    difference = relative_difference(got, serial(data, steps))
    report("npt graph, workers retiring", steps=steps, generations=generations(seen), recoveries=trainer.recoveries_,
           difference=f"{difference:.1e}")  # fmt: skip
    assert generations(seen) >= 2 and difference <= TOLERANCE


def test_npt_resident_rides_through_workers_retiring_at_their_walltime(tmp_path, data):
    from daskann.npt import NPTTrainer

    X, y = data
    with retiring_cluster(tmp_path, "20s", "4s") as (c, seen):
        pilot = NPTTrainer((16,), grid="1x2", mode="resident", client=c, **COMMON)
        rate = steps_per_second(lambda n: pilot.fit(X, y, steps=n), pilot=1000)
        # A worker leaves about every 10 s and its replacement joins several seconds later: both workers are there
        # for a few seconds at a time. Each departure restarts the stretch since the last checkpoint, and the
        # run gives up after three in a row (daskann.npt.resident-restarts): stretches of about a second and
        # a half, set-up and save included, fit those windows on a fast machine or a slow one.
        steps, every = rounded(rate * 40, 500), rounded(rate * 1.5, 50)
        trainer = NPTTrainer(
            (16,), grid="1x2", mode="resident", client=c, checkpoint={"dir": tmp_path / "run", "every": every}, **COMMON
        )
        start = time.monotonic()
        got = params(trainer.fit(X, y, steps=steps).model_)
        seconds = round(time.monotonic() - start, 1)
    difference = relative_difference(got, serial(data, steps))
    report("npt resident, workers retiring", steps=steps, checkpoint_every=every, generations=generations(seen),
           recoveries=trainer.recoveries_, seconds=seconds,
           difference=f"{difference:.1e}")  # fmt: skip
    assert generations(seen) >= 2 and difference <= TOLERANCE


def test_partition_rides_through_workers_retiring_at_their_walltime(tmp_path, data, client2):
    from daskann.partition import PartitionTrainer

    # each sub-model trains about two lifetimes of its workers (10 s each), timed on a sub-model's width here, so
    # that a busier moment while timing cannot make it end inside its first workers' life; every generation may
    # take all copies of the data with it, and the sub-model reruns from its checkpoint as often as that happens
    # (daskann.partition.lost-data-reruns bounds only attempts in a row that started and wrote no checkpoint: one
    # that waited for a worker while a generation came and went is not counted)
    sub_steps = steps_lasting(20, lambda n: SerialTrainer((16, 16), **COMMON).fit(*data, steps=n), 5000, 5000)
    kw = dict(k=2, merge={"noise": 0.02}, split={"sub_steps": sub_steps, "retries": 6, "timeout": 240.0}, **COMMON)
    reference = PartitionTrainer((32, 32), client=client2, **kw).fit(*data, steps=20)
    with retiring_cluster(tmp_path, "10s", "2s") as (c, seen):
        trainer = PartitionTrainer((32, 32), client=c, checkpoint={"dir": tmp_path / "run", "every": 5000}, **kw)
        trainer.fit(*data, steps=20)
    got = [p for m in trainer.submodels_ for p in m.params] + params(trainer.model_)
    ref = [p for m in reference.submodels_ for p in m.params] + params(reference.model_)
    difference = relative_difference(got, ref)
    resumed = [r.resumed_from for r in trainer.submodel_results_]
    report("partition, workers retiring", sub_steps=sub_steps, generations=generations(seen), resumed_from=resumed,
           difference=f"{difference:.1e}")  # fmt: skip
    assert generations(seen) >= 2 and difference <= TOLERANCE


# -- MGRIT: its trajectories in the shared folder, its tasks on jobs that end -------------------------------
MGRIT_CASE = dict(activation="leaky_relu", loss="mse", batch_size=16, lr=0.01, seed=0, sgd={"momentum": 0.9})


@pytest.fixture(scope="module")
def mgrit_case():
    X, y = make_linear(256, 8, 2, seed=0)
    return X, y, params(SerialTrainer((16, 16), **MGRIT_CASE).fit(X, y, steps=256).model_)


def test_mgrit_adapts_with_its_store_in_the_shared_folder(tmp_path, mgrit_case):
    """The issue's fourth failure: the ladder's second attempt dropped the store on workers of a batch system."""
    from daskann.mgrit import MGRITTrainer

    X, y, ref = mgrit_case
    with profile_client(tmp_path) as c:
        folder = tmp_path / "site" / "shared" / "trajectory.zarr"
        trainer = MGRITTrainer((16, 16), preset="solver1", client=c, engine={"store": str(folder)}, **MGRIT_CASE)
        got = params(trainer.fit(X, y, steps=256).model_)
        default = MGRITTrainer((16, 16), client=c, **MGRIT_CASE)
        default_got = params(default.fit(X, y, steps=256).model_)
    attempts = [a.outcome for a in trainer.result_.adaptations]
    difference = relative_difference(got, ref)
    report("mgrit adaptive, store in the shared folder", attempts=attempts, difference=f"{difference:.1e}",
           default_store_difference=f"{relative_difference(default_got, ref):.1e}")  # fmt: skip
    assert len(attempts) > 1 and attempts[0] != "converged" and difference <= TOLERANCE
    assert relative_difference(default_got, ref) <= TOLERANCE
    assert not any(p.name.startswith("daskann-mgrit-") for p in folder.parent.iterdir()), "scratch stores removed"


def test_mgrit_survives_scancel_and_workers_retiring(tmp_path, mgrit_case):
    from daskann.mgrit import MGRITTrainer

    X, y, ref = mgrit_case
    solver = {"levels": 3, "cfactor": 4, "tol": 1e-9, "max_iter": 60}
    with retiring_cluster(tmp_path, "10s", "2s") as (c, seen):
        trainer = MGRITTrainer((16, 16), client=c, solver=solver, engine={"intervals_per_task": 2}, **MGRIT_CASE)
        run = DuringFit(
            lambda: params(trainer.fit(X, y, steps=256).model_),
            lambda: any(processing_on(c, w) for w in c.scheduler_info()["workers"]),
            lambda: scancel_worker(c, next(w for w in c.scheduler_info()["workers"] if processing_on(c, w))),
        )
    assert run.faulted_mid_run and not run.hung and run.error is None, repr(run.error)
    difference = relative_difference(run.result, ref)
    report("mgrit: scancel, workers retiring", job=run.fault_result, generations=generations(seen),
           iterations=trainer.n_iter_, seconds=round(run.seconds, 1), difference=f"{difference:.1e}")  # fmt: skip
    assert difference <= TOLERANCE
