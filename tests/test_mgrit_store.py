"""The zarr trajectory store of an MGRIT run: layout, resume, refusal, a consistent store after a failure."""

from __future__ import annotations

import json
from pathlib import Path

import dask
import numpy as np
import pytest
import zarr
from conftest import no_tasks_submitted

from daskann import SerialTrainer, StoreError
from daskann.data import make_linear
from daskann.mgrit import MGRIT, MGRITDiverged, MGRITTrainer, _store, linear

# MGRIT fits here must run the solve, which the default policy skips for problems this small
pytestmark = pytest.mark.usefixtures("mgrit_study")


class Interrupt(Exception):
    pass


def test_store_layout_resume_and_refusal(tmp_path, client2):
    prop = linear.LinearPropagator.random_stable(5, seed=1)
    u0 = (np.ones(5),)
    store = tmp_path / "run.zarr"
    kwargs = dict(levels=3, cfactor=4, tol=1e-13, max_iter=40, intervals_per_task=2, scheduler=client2)
    full = MGRIT(prop, u0, 64, **kwargs).solve()

    def stop_after_3(info):
        if info.iteration == 3:
            raise Interrupt

    with pytest.raises(Interrupt):
        MGRIT(prop, u0, 64, store=store, run_id="run-a", callback=stop_after_3, **kwargs).solve()
    progress = json.loads((store / "progress.json").read_text())
    assert progress["iteration"] == 3 and progress["status"] == "running"
    group = zarr.open_group(str(store), mode="r")
    assert group.attrs["daskann"]["run_id"] == "run-a"
    # chunks hold whole blocks of intervals (2 per task here) and carry a CRC32C checksum
    assert group["c0"].chunks == (1, 2, 5) and group["u1"].chunks == (4 * 2, 5)
    assert group["g1"].chunks == (1, 2, 5) and group["u2"].chunks == group["u2"].shape
    assert any("crc32c" in type(c).__name__.lower() for c in group["c0"].compressors)
    # another run may not use it, and asking submits nothing
    with no_tasks_submitted(client2), pytest.raises(StoreError, match="store=.*belongs to run 'run-a'"):
        MGRIT(prop, u0, 64, store=store, run_id="run-b", **kwargs).solve()
    with no_tasks_submitted(client2), pytest.raises(ValueError, match="store="):
        MGRIT(prop, u0, 64, store=store, **kwargs).solve()
    with no_tasks_submitted(client2), pytest.raises(StoreError, match="another configuration"):
        MGRIT(prop, u0, 64, store=store, run_id="run-a", **{**kwargs, "cfactor": 2}).solve()
    # a damaged progress record is refused by name, before any task
    progress_text = (store / "progress.json").read_text()
    (store / "progress.json").write_text(progress_text[: len(progress_text) // 2])
    with no_tasks_submitted(client2), pytest.raises(StoreError, match=r"store=.*: progress.json is damaged"):
        MGRIT(prop, u0, 64, store=store, run_id="run-a", **kwargs).solve()
    (store / "progress.json").write_text(progress_text)
    # the same run continues from iteration 3 and ends exactly where the uninterrupted run ends
    resumed = MGRIT(prop, u0, 64, store=store, run_id="run-a", **kwargs).solve()
    assert resumed.residuals == full.residuals and len(resumed.iteration_times) == full.iterations
    assert np.array_equal(resumed.state[0], full.state[0])
    assert json.loads((store / "progress.json").read_text())["status"] == "converged"


def _inf_at_step_38(state, i):
    return (state[0] * (np.inf if i == 37 else 0.99),)


@pytest.mark.parametrize("scheduler", ["sync", "distributed"])
def test_non_finite_state_stops_and_keeps_the_store_consistent(scheduler, tmp_path, request):
    # on a cluster the failing sweep's result never reaches the client: the tasks after it pass the failure on
    store = tmp_path / "t.zarr"
    with pytest.raises(MGRITDiverged) as info:
        MGRIT(
            _inf_at_step_38,
            (np.ones(3),),
            64,
            levels=2,
            cfactor=4,
            intervals_per_task=2,
            store=store,
            run_id="r",
            scheduler=request.getfixturevalue("client2") if scheduler == "distributed" else scheduler,
            max_iter=5,
            divergence_factor=None,
        ).solve()
    assert (info.value.level, info.value.step, info.value.iteration) == (0, 38, 1)
    assert "NaN or Inf" in str(info.value) and "level 0 at fine step 38" in str(info.value)
    progress = json.loads((store / "progress.json").read_text())
    assert progress["status"] == "diverged" and progress["failure"]["step"] == info.value.step
    group = zarr.open_group(str(store), mode="r")
    committed = progress.get("committed", 0)
    assert np.isfinite(group["c0"][committed]).all()


def test_threaded_workers_count_as_local_for_a_temporary_store():
    from daskann.mgrit.solver import _workers_are_local

    class Info:
        """A client whose scheduler knows the workers at ``addresses``."""

        def __init__(self, *addresses):
            self.addresses, self.scheduler = addresses, self

        def identity(self, n_workers=-1):
            return {"workers": {a: {} for a in self.addresses}}

        def sync(self, func, **kwargs):
            return func(**kwargs)

    assert _workers_are_local(Info("inproc://10.11.12.13/4242/1", "tcp://127.0.0.1:40000"))
    assert not _workers_are_local(Info("tcp://127.0.0.1:40000", "tcp://10.11.12.13:40001"))


# -- where MGRITTrainer keeps its stores ---------------------------------------------------------------------------


def _record_stores(monkeypatch) -> list[Path]:
    """The paths of the trajectory stores created from now on, in order."""
    created, create = [], _store.create_store
    monkeypatch.setattr(_store, "create_store", lambda path, **kw: (created.append(Path(path)), create(path, **kw))[1])
    return created


def _fit_on_other_machines(client, monkeypatch, **kwargs):
    """A fit on ``client`` as if its workers ran on other machines (a temporary folder here is refused)."""
    from daskann.mgrit import solver

    monkeypatch.setattr(solver, "_workers_are_local", lambda c: False)
    X, y = make_linear(128, 4, 1, seed=0)
    settings = dict(batch_size=16, lr=1e-3, seed=0)
    serial = SerialTrainer((8,), **settings).fit(X, y, steps=64)
    trainer = MGRITTrainer((8,), solver={"levels": 2, "cfactor": 4}, client=client, **settings, **kwargs)
    trainer.fit(X, y, steps=64)
    a, b = (np.concatenate([p.ravel() for p in t.model_.params]) for t in (trainer, serial))
    assert trainer.result_.converged and np.linalg.norm(a - b) / np.linalg.norm(b) < 1e-9
    return trainer


def test_trainer_without_a_store_writes_under_the_shared_directory(tmp_path, client2, monkeypatch):
    shared = tmp_path / "shared"
    shared.mkdir()
    created = _record_stores(monkeypatch)
    with dask.config.set({"daskann.cluster.shared-directory": str(shared)}):
        # the shared folder wins over the checkpoint folder: the workers may not see that one
        _fit_on_other_machines(client2, monkeypatch, checkpoint=tmp_path / "run")
    assert len(created) == 1 and created[0].parent.parent == shared
    assert not any(shared.iterdir())  # a fresh folder of the run's, removed once it ended


def test_a_profiles_shared_directory_wins_over_the_setting(tmp_path, client2, monkeypatch):
    profile, setting = tmp_path / "profile", tmp_path / "setting"
    profile.mkdir()
    monkeypatch.setattr(client2.cluster, "_daskann_shared_directory", profile, raising=False)
    created = _record_stores(monkeypatch)
    # a folder that does not exist: the profile's folder wins, so the setting is not even read
    with dask.config.set({"daskann.cluster.shared-directory": str(setting)}):
        _fit_on_other_machines(client2, monkeypatch)
    assert len(created) == 1 and created[0].parent.parent == profile and not any(profile.iterdir())
