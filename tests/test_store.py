"""Checkpoints and histories: atomic, checksummed, verified on load."""

from __future__ import annotations

import importlib
import json
import pickletools
import subprocess
import sys
from pathlib import Path

import dask
import numpy as np
import pytest

from daskann import MLP, SGD, SerialTrainer, store
from daskann.data import make_linear


def _checkpoint(dtype="float64"):
    model = MLP([5, 7, 3], activation="leaky_relu", dtype=dtype, seed=2)
    velocity = [np.random.default_rng(i).standard_normal(p.shape).astype(dtype) for i, p in enumerate(model.params)]
    return store.Checkpoint(
        model=model,
        velocity=velocity,
        step=17,
        batch_order={"n_samples": 10, "batch_size": 2, "seed": 0, "sgd": {"shuffle": True}},
        training={"method": "serial", "loss": "mse", "lr": 0.1, "sgd": {"momentum": 0.9}},
    )


def _chunk_files(path: Path):
    return sorted(p for p in path.rglob("*") if p.is_file() and "c" in p.relative_to(path).parts)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_checkpoint_round_trip_is_bit_exact(tmp_path, dtype):
    ckpt = _checkpoint(dtype)
    store.save_checkpoint(tmp_path / "c.zarr", ckpt)
    loaded = store.load_checkpoint(tmp_path / "c.zarr")
    assert loaded.step == 17 and loaded.training == ckpt.training and loaded.batch_order == ckpt.batch_order
    assert loaded.model.get_config() == ckpt.model.get_config()
    for a, b in zip(loaded.model.params + loaded.velocity, ckpt.model.params + ckpt.velocity, strict=True):
        assert a.dtype == b.dtype and np.array_equal(a, b)
    assert not list(tmp_path.glob(".*tmp-*")), "temporary store left behind"


def test_overwriting_a_checkpoint_replaces_it_whole(tmp_path):
    ckpt = _checkpoint()
    store.save_checkpoint(tmp_path / "c.zarr", ckpt)
    ckpt.step = 18
    store.save_checkpoint(tmp_path / "c.zarr", ckpt)
    assert store.load_checkpoint(tmp_path / "c.zarr").step == 18
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.zarr"]


def test_flipped_byte_is_detected(tmp_path):
    store.save_checkpoint(tmp_path / "c.zarr", _checkpoint())
    chunk = next(p for p in _chunk_files(tmp_path / "c.zarr") if "weights" in str(p))
    data = bytearray(chunk.read_bytes())
    data[len(data) // 2] ^= 0xFF
    chunk.write_bytes(bytes(data))
    with pytest.raises(store.DamagedStoreError, match="weights"):
        store.load_checkpoint(tmp_path / "c.zarr")


def test_deleted_chunk_is_detected(tmp_path):
    store.save_checkpoint(tmp_path / "c.zarr", _checkpoint())
    next(p for p in _chunk_files(tmp_path / "c.zarr") if "velocity" in str(p)).unlink()
    with pytest.raises(store.DamagedStoreError, match="velocity"):
        store.load_checkpoint(tmp_path / "c.zarr")


def test_truncated_metadata_and_foreign_stores_are_refused(tmp_path):
    store.save_checkpoint(tmp_path / "c.zarr", _checkpoint())
    meta = tmp_path / "c.zarr" / "zarr.json"
    meta.write_text(meta.read_text()[:40])
    with pytest.raises(store.DamagedStoreError, match="path="):
        store.load_checkpoint(tmp_path / "c.zarr")
    import zarr

    zarr.open_group(str(tmp_path / "foreign.zarr"), mode="w").attrs["hello"] = 1
    with pytest.raises(store.StoreError, match="not a daskann checkpoint"):
        store.load_checkpoint(tmp_path / "foreign.zarr")
    with pytest.raises(FileNotFoundError, match="path="):
        store.load_checkpoint(tmp_path / "absent.zarr")


def test_checkpoint_that_does_not_match_the_model_is_refused(tmp_path):
    X, y = make_linear(40, 5, 3, seed=0)
    SerialTrainer((7,), batch_size=8, checkpoint=tmp_path).fit(X, y, steps=3)
    with pytest.raises(store.StoreError, match="does not match.*sizes"):
        SerialTrainer((6,), batch_size=8).fit(X, y, steps=5, resume=tmp_path)
    with pytest.raises(store.StoreError, match="does not match.*batch order"):
        SerialTrainer((7,), batch_size=4).fit(X, y, steps=5, resume=tmp_path)


def test_run_folder_resume_skips_a_damaged_newest_checkpoint(tmp_path):
    X, y = make_linear(40, 5, 3, seed=0)
    SerialTrainer((7,), batch_size=8, checkpoint={"dir": tmp_path, "every": 2}).fit(X, y, steps=4)
    newest = store.list_checkpoints(tmp_path)[0]
    assert newest.name == "step-00000004.zarr"
    next(p for p in _chunk_files(newest) if "weights" in str(p)).unlink()
    with pytest.warns(RuntimeWarning, match="skipping damaged checkpoint"):
        assert store.find_checkpoint(tmp_path).name == "step-00000002.zarr"
    with pytest.warns(RuntimeWarning):
        resumed = SerialTrainer((7,), batch_size=8).fit(X, y, steps=6, resume=tmp_path)
    straight = SerialTrainer((7,), batch_size=8).fit(X, y, steps=6)
    assert all(np.array_equal(a, b) for a, b in zip(resumed.model_.params, straight.model_.params, strict=True))


def _refuse_to_compute(*args, **kwargs):
    raise AssertionError("a dask graph was computed")


def test_history_round_trip_and_damage(tmp_path):
    X, y = make_linear(40, 5, 3, seed=0)
    trainer = SerialTrainer((7,), batch_size=8).fit(X, y, steps=6, validation_data=(X, y))
    store.save_history(trainer.history_, tmp_path / "h.zarr")
    # read without dask: inside a task, a dask compute would go through the worker's client and secede
    with dask.config.set(scheduler=_refuse_to_compute):
        loaded = store.load_history(tmp_path / "h.zarr")
    assert loaded.equals(trainer.history_) and loaded["loss"].attrs["long_name"]
    chunk = next(p for p in _chunk_files(tmp_path / "h.zarr") if "loss" in p.parts)
    chunk.unlink()
    with pytest.raises(store.DamagedStoreError, match="loss"):
        store.load_history(tmp_path / "h.zarr")


def test_prepare_run_dir_guards_foreign_folders(tmp_path):
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "thesis.tex").write_text("precious")
    with pytest.raises(ValueError, match="output=.*not a daskann run"):
        store.prepare_run_dir(foreign, method="serial", config={})
    with pytest.raises(ValueError, match="output=.*thesis.tex"):
        store.prepare_run_dir(foreign, method="serial", config={}, overwrite=True)
    assert (foreign / "thesis.tex").read_text() == "precious"
    run = store.prepare_run_dir(tmp_path / "run", method="serial", config={"lr": 0.1})
    (run / "checkpoints").mkdir()
    with pytest.raises(ValueError, match="already holds a daskann run"):
        store.prepare_run_dir(run, method="serial", config={})
    store.prepare_run_dir(run, method="serial", config={}, resume=True)
    store.prepare_run_dir(run, method="serial", config={}, overwrite=True)
    assert not (run / "checkpoints").exists()


def test_verify_reports_damage_and_orphans(tmp_path):
    X, y = make_linear(40, 5, 3, seed=0)
    SerialTrainer((7,), batch_size=8, checkpoint={"dir": tmp_path, "every": 2}).fit(X, y, steps=4)
    report = store.verify_path(tmp_path)
    assert report["ok"] and {i["kind"] for i in report["items"]} == {"checkpoint", "history"}
    (tmp_path / "checkpoints" / ".step-00000006.zarr.tmp-1234abcd").mkdir()
    victim = store.list_checkpoints(tmp_path)[0]
    next(p for p in _chunk_files(victim) if "biases" in str(p)).unlink()
    report = store.verify_path(tmp_path)
    statuses = {Path(i["path"]).name: i["status"] for i in report["items"]}
    assert not report["ok"]
    assert statuses[victim.name] == "damaged" and statuses[".step-00000006.zarr.tmp-1234abcd"] == "orphan"
    assert statuses["step-00000002.zarr"] == "ok"


def test_stored_artefacts_hold_no_pickles(tmp_path):
    X, y = make_linear(40, 5, 3, seed=0)
    SerialTrainer((7,), batch_size=8, checkpoint=tmp_path).fit(X, y, steps=2)
    for path in tmp_path.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            # pickle protocol 2+ streams start with PROTO (0x80) followed by the protocol number
            assert not (len(data) > 1 and data[0] == 0x80 and data[1] <= 5), path
    assert pickletools  # the check above mirrors pickletools' PROTO opcode


def test_sgd_state_is_part_of_the_checkpoint(tmp_path):
    model = MLP([3, 4, 2])
    velocity = SGD.init_state(model.params)
    velocity[0][:] = 1.5
    ckpt = store.Checkpoint(model=model, velocity=velocity, step=1, batch_order={}, training={})
    store.save_checkpoint(tmp_path / "c.zarr", ckpt)
    assert np.all(store.load_checkpoint(tmp_path / "c.zarr").velocity[0] == 1.5)


def test_a_run_folder_being_written_is_refused(tmp_path):
    X, y = make_linear(40, 5, 3, seed=0)
    with store.RunLock(tmp_path / "run"):
        # the lock of a live process (this one, seen from a child's point of view) is respected
        import subprocess
        import sys

        code = f"from daskann import store\nstore.RunLock({str(tmp_path / 'run')!r}).acquire()\n"
        result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
        assert result.returncode != 0 and "being written by another run" in result.stderr
    # released: training can take it
    SerialTrainer((4,), batch_size=8, checkpoint=tmp_path / "run").fit(X, y, steps=2)
    assert not (tmp_path / "run" / store.LOCK_NAME).exists()


def test_a_stale_lock_is_taken_over(tmp_path):
    import json
    import socket
    import subprocess
    import sys

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    (tmp_path / store.LOCK_NAME).write_text(json.dumps({"host": socket.gethostname(), "pid": int(dead.stdout)}))
    with store.RunLock(tmp_path):
        pass


def test_read_only_output_is_refused_before_training(tmp_path):
    import os

    X, y = make_linear(40, 5, 3, seed=0)
    locked = tmp_path / "ro"
    locked.mkdir()
    os.chmod(locked, 0o500)
    try:
        if os.access(locked, os.W_OK):  # root ignores permission bits; use a file in the way instead
            locked = tmp_path / "file"
            locked.write_text("")
            target = locked / "run"
        else:
            target = locked / "run"
        with pytest.raises(ValueError, match=r"checkpoint\['dir'\]="):
            SerialTrainer((4,), batch_size=8, checkpoint=target).fit(X, y, steps=2)
    finally:
        os.chmod(tmp_path / "ro", 0o700)


def test_each_verifier_module_registers_its_kind():
    from daskann.store._verify import VERIFIER_MODULES, VERIFIERS

    for kind, module in VERIFIER_MODULES.items():
        importlib.import_module(module)
        assert kind in VERIFIERS, (kind, module)


def test_mgrit_trajectory_store_is_verified(tmp_path):
    from daskann.mgrit import MGRIT, linear

    class Stop(Exception):
        pass

    def stop_after_2(info):
        if info.iteration == 2:
            raise Stop

    prop = linear.LinearPropagator.random_stable(5, seed=1)
    path = tmp_path / "run" / "trajectory.zarr"
    kwargs = dict(levels=2, cfactor=4, tol=1e-13, max_iter=40, store=path, run_id="run-a", scheduler="sync")
    with pytest.raises(Stop):
        MGRIT(prop, (np.ones(5),), 32, callback=stop_after_2, **kwargs).solve()
    report = store.verify_path(tmp_path / "run")
    assert report["ok"], report
    assert [item["kind"] for item in report["items"]] == ["mgrit-trajectory"]
    # in a fresh interpreter that has not loaded MGRIT, the scan loads the verifier of the kind it meets
    code = (
        "import sys; from daskann.store import verify_path; assert 'daskann.mgrit' not in sys.modules; "
        "print(verify_path(sys.argv[1])['ok'])"
    )
    fresh = subprocess.run([sys.executable, "-c", code, str(tmp_path / "run")], capture_output=True, text=True)
    assert fresh.returncode == 0 and fresh.stdout.split() == ["True"], fresh.stderr

    # a flipped byte in a committed chunk: the scan reports it and a resume refuses the store
    committed = json.loads((path / "progress.json").read_text())["committed"]
    chunk = path / "c0" / "c" / str(committed) / "0" / "0"
    data = bytearray(chunk.read_bytes())
    data[len(data) // 2] ^= 0xFF
    chunk.write_bytes(bytes(data))
    report = store.verify_path(path)
    assert not report["ok"] and "c0" in report["items"][0]["detail"]
    with pytest.raises(store.StoreError, match="c0"):
        MGRIT(prop, (np.ones(5),), 32, **kwargs).solve()

    # a deleted chunk would read back as zeros: the scan names it missing
    chunk.unlink()
    report = store.verify_path(path)
    assert not report["ok"] and "missing" in report["items"][0]["detail"]


def test_the_run_lock_is_reentrant_in_its_own_context_only(tmp_path):
    import threading

    folder = tmp_path / "run"
    with store.RunLock(folder):
        with store.RunLock(folder):  # an inner training of the same run (partition's fine-tune)
            store.RunLock(folder).check_free()
        assert (folder / store.LOCK_NAME).exists()  # the inner release keeps the outer claim
        errors = []

        def other_thread():
            try:
                store.RunLock(folder).acquire()
            except store.StoreError as exc:
                errors.append(exc)

        thread = threading.Thread(target=other_thread)
        thread.start()
        thread.join()
        assert len(errors) == 1 and "being written by another run" in str(errors[0])
    assert not (folder / store.LOCK_NAME).exists()


def _held_during_fit(trainer, X, y, steps, folder):
    """Fit in a thread; while it runs, the folder's lock must refuse this thread."""
    import threading
    import time

    errors = []

    def fit():
        try:
            trainer.fit(X, y, steps=steps)
        except BaseException as exc:  # reported to the test's thread
            errors.append(exc)

    thread = threading.Thread(target=fit)
    thread.start()
    lock = folder / store.LOCK_NAME
    deadline = time.monotonic() + 60
    while not lock.exists() and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.005)
    seen = lock.exists()
    refused = None
    if seen:
        with pytest.raises(store.StoreError, match="being written by another run") as refused:
            store.RunLock(folder).acquire()
    thread.join(180)
    assert not thread.is_alive() and not errors, errors
    return seen, refused, lock.exists()


@pytest.mark.parametrize("method", ["npt", "mgrit", "partition"])
def test_a_fit_holds_its_run_folder_until_it_ends(client2, tmp_path, method):
    from daskann.mgrit import MGRITTrainer
    from daskann.npt import NPTTrainer
    from daskann.partition import PartitionTrainer

    X, y = make_linear(256, 6, 2, seed=0)
    folder = tmp_path / "run"
    common = dict(batch_size=16, client=client2, checkpoint=folder)
    trainer, steps = {
        "npt": lambda: (NPTTrainer((5,), grid="1x2", mode="graph", **common), 300),
        "mgrit": lambda: (MGRITTrainer((5,), solver={"levels": 2, "cfactor": 4}, **common), 512),
        # the fine-tune is a SerialTrainer on the same folder: the lock is re-entered, not refused
        "partition": lambda: (PartitionTrainer((6,), k=2, **common), 300),
    }[method]()
    seen, refused, left = _held_during_fit(trainer, X, y, steps, folder)
    assert seen and refused is not None, "the fit ended before its lock was observed"
    assert not left and trainer.model_ is not None


def test_a_full_disk_is_refused_before_training(tmp_path, monkeypatch):
    import shutil

    X, y = make_linear(64, 5, 3, seed=0)
    usage = shutil.disk_usage(tmp_path)._replace(free=100_000)
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage)
    trainer = SerialTrainer((4,), batch_size=8, checkpoint={"dir": tmp_path / "run", "every": 1})
    with pytest.raises(store.DiskFullError, match=r"checkpoint\['dir'\]=.*run.* has 97\.7 KiB free"):
        trainer.fit(X, y, steps=50)
    assert not (tmp_path / "run").exists()


def test_a_disk_that_fills_up_keeps_the_earlier_checkpoints_and_the_run_resumes(tmp_path, monkeypatch):
    import errno

    import zarr.storage

    X, y = make_linear(64, 5, 3, seed=0)

    def make(folder):
        return SerialTrainer((4,), batch_size=8, sgd={"momentum": 0.9}, checkpoint={"dir": folder, "every": 2})

    clean = make(tmp_path / "clean").fit(X, y, steps=6)
    real_set = zarr.storage.LocalStore.set

    async def full_after_step_2(self, key, value):
        if "step-00000004" in str(self.root):
            raise OSError(errno.ENOSPC, "No space left on device")
        return await real_set(self, key, value)

    monkeypatch.setattr(zarr.storage.LocalStore, "set", full_after_step_2)
    folder = tmp_path / "run"
    with pytest.raises(store.DiskFullError, match=r"path=.*step-00000004.*earlier checkpoints are intact"):
        make(folder).fit(X, y, steps=6)
    monkeypatch.setattr(zarr.storage.LocalStore, "set", real_set)
    # the failed write left nothing behind, the step-2 checkpoint is whole, and the lock is released
    assert [p.name for p in store.list_checkpoints(folder)] == ["step-00000002.zarr"]
    report = store.verify_path(folder)
    assert report["ok"], report
    assert not (folder / store.LOCK_NAME).exists()
    resumed = make(folder).fit(X, y, steps=6, resume=folder)
    for a, b in zip(resumed.model_.params + resumed.velocity_, clean.model_.params + clean.velocity_, strict=True):
        assert np.array_equal(a, b)


def test_racing_claims_on_a_run_folder_leave_one_owner(tmp_path):
    import threading

    folder = tmp_path / "run"
    for _ in range(20):
        barrier = threading.Barrier(8)
        owners, refused = [], []

        def claim(barrier=barrier, owners=owners, refused=refused):
            lock = store.RunLock(folder)
            barrier.wait()
            try:
                owners.append(lock.acquire())
            except store.StoreError:
                refused.append(lock)

        threads = [threading.Thread(target=claim) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        # a lock file is never seen without its owner, so nobody takes over a claim being made
        assert len(owners) == 1 and len(refused) == 7
        owners[0].release()
        assert not (folder / store.LOCK_NAME).exists()
