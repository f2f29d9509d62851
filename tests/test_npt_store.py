"""NPT checkpoints written by the grid's cells, resumed onto any grid, and a client that holds no block.

Every run uses real process workers (one thread each); results are compared
with SerialTrainer in float64.
"""

from __future__ import annotations

import gc
import re
import time
import tracemalloc

import numpy as np
import pytest
import zarr
from conftest import no_tasks_submitted, scheduler_watch
from distributed.diagnostics.plugin import WorkerPlugin

from daskann import SerialTrainer, StoreError, TrainingDiverged, load_checkpoint
from daskann.data import make_linear
from daskann.npt import NPTTrainer
from daskann.store import checkpoint_path, load_history, verify_path

TOL = 1e-10


def _rel(a, b):
    scale = np.max(np.abs(b))
    return float(np.max(np.abs(a - b)) / scale) if scale else float(np.max(np.abs(a)))


def _max_error(trainer, serial):
    pairs = [*zip(trainer.model_.params, serial.model_.params, strict=True)]
    pairs += [*zip(trainer.velocity_, serial.velocity_, strict=True)]
    return max(_rel(a, b) for a, b in pairs)


@pytest.fixture(scope="module")
def regression():
    return make_linear(96, 8, 4, noise=0.1, seed=4)


KWARGS = dict(lr=0.05, batch_size=16, seed=3, sgd={"momentum": 0.9})


def test_cells_write_their_blocks_and_any_grid_resumes(client4, regression, tmp_path):
    X, y = regression
    run = tmp_path / "run"
    with scheduler_watch(client4) as watch:
        npt = NPTTrainer(
            (12,), grid="2x2", mode="graph", client=client4, **KWARGS, checkpoint={"dir": run, "every": 2}
        ).fit(X, y, steps=4)
    # each block was written by a task pinned to its cell; the client committed the manifest
    saves = [k for k in watch.keys if "-save4-" in k]
    assert len(saves) == 2 * 2 * 4 + 2 * 2  # 2 layers x (weights, velocity) x 4 cells + 2 layers x 2 bias blocks
    store = checkpoint_path(run, 4)
    group = zarr.open_group(str(store), mode="r")
    manifest = group.attrs["daskann"]["manifest"]
    assert manifest["weights/0"]["bounds"] == [[[0, 4], [4, 8]], [[0, 6], [6, 12]]]
    assert set(manifest["weights/0"]["blocks"]) == {"0.0", "0.1", "1.0", "1.1"}
    assert group["weights/0"].chunks == (4, 6) and group["biases/0"].chunks == (6,)
    assert verify_path(run)["ok"]
    # nothing was gathered: the model is read from the store when first touched
    assert npt.__dict__.get("_model") is None
    assert [w.chunks for w in npt.weights_] == [((4, 4), (6, 6)), ((6, 6), (2, 2))]
    serial = SerialTrainer((12,), **KWARGS).fit(X, y, steps=4)
    assert _max_error(npt, serial) < TOL
    ckpt = load_checkpoint(store)
    assert ckpt.step == 4 and ckpt.extra["grid"] == "2x2"
    # re-cut on other grids (more cells than workers, too) and in a single process
    # beside it, the history through step 4, with the columns of the run's own history
    saved = load_history(run / "history.zarr")
    assert list(saved["step"].values) == [1, 2, 3, 4] and set(saved.data_vars) <= set(npt.history_.data_vars)
    reference = SerialTrainer((12,), **KWARGS).fit(X, y, steps=7)
    for grid in ("1x3", "3x3"):
        other = NPTTrainer((12,), grid=grid, mode="graph", engine={"share_workers": True}, client=client4, **KWARGS)
        other.fit(X, y, steps=7, resume=run)
        # the history saved beside the checkpoint carries steps 1 to 4 on
        assert list(other.history_["step"].values) == [1, 2, 3, 4, 5, 6, 7]
        np.testing.assert_allclose(other.history_["loss"].values, reference.history_["loss"].values, rtol=1e-12)
        assert set(other.history_.data_vars) == set(npt.history_.data_vars)
        assert _max_error(other, reference) < TOL
    assert _max_error(SerialTrainer((12,), **KWARGS).fit(X, y, steps=7, resume=run), reference) < TOL


def test_a_damaged_block_fails_where_it_is_read(client4, regression, tmp_path):
    X, y = regression
    run = tmp_path / "run"
    NPTTrainer((12,), grid="2x2", mode="graph", client=client4, **KWARGS, checkpoint=run).fit(X, y, steps=2)
    store = checkpoint_path(run, 2)
    z = zarr.open_array(str(store / "weights" / "1"), mode="r+")
    z[0, 0] = z[0, 0] + 1.0  # a plausible value, rewritten through zarr: only the manifest can tell
    report = verify_path(store)
    assert not report["ok"] and "block 0.0 of array 'weights/1'" in report["items"][0]["detail"]
    with pytest.raises(Exception, match=r"block 0\.0 of array 'weights/1' does not match its checksum"):
        NPTTrainer((12,), grid="2x2", mode="graph", client=client4, **KWARGS).fit(X, y, steps=3, resume=store)


def test_predict_runs_on_the_grid_until_the_model_is_touched(client4):
    rng = np.random.default_rng(0)
    X = rng.standard_normal((64, 6))
    y = (X[:, 0] - X[:, 1] > 0).astype(np.int64) + (X[:, 2] > 0.5)
    kwargs = dict(loss="cross_entropy", lr=0.1, batch_size=16, seed=1, network={"output": "softmax"})
    npt = NPTTrainer((10,), grid="2x2", mode="graph", client=client4, **kwargs).fit(X, y, steps=5)
    serial = SerialTrainer((10,), **kwargs).fit(X, y, steps=5)
    np.testing.assert_allclose(npt.predict_proba(X), serial.predict_proba(X), rtol=1e-10)
    assert npt.score(X, y) == serial.score(X, y)
    assert npt.__dict__.get("_model") is None  # computed on the grid, from weights_
    assert _max_error(npt, serial) < TOL  # the model gathered when touched


# -- bad input ---------------------------------------------------------------------------------
def test_resume_store_of_another_net_fails_before_any_task(client4, regression, tmp_path):
    X, y = regression
    run = tmp_path / "run"
    NPTTrainer((12,), grid="2x2", mode="graph", client=client4, **KWARGS, checkpoint=run).fit(X, y, steps=2)
    with no_tasks_submitted(client4):
        with pytest.raises(StoreError, match=r"resume=.*does not match.*: sizes \[8, 12, 4\] != \[8, 9, 4\]"):
            NPTTrainer((9,), grid="2x2", mode="graph", client=client4, **KWARGS).fit(X, y, steps=4, resume=run)


def test_blocks_too_big_for_a_worker_fail_before_any_task(client4, regression):
    X, y = regression
    # 2x2 blocks of a 30000 x 30000 layer: 1.7 GiB each with its velocity, over the 2 GiB workers' 95%
    with no_tasks_submitted(client4):
        with pytest.raises(ValueError, match=r"grid=.*2x2 blocks.*per worker.*memory_limit"):
            NPTTrainer((30000, 30000), grid="2x2", mode="graph", client=client4, **KWARGS).fit(X, y, steps=1)


# -- memory bound --------------------------------------------------------------------------------
def test_weights_gone_non_finite_keep_the_state_the_client_let_go(client4, regression):
    """The client holds no state a submitted step reads: the last finite one is trained again."""
    X, y = regression
    kwargs = dict(lr=1e306, batch_size=20, seed=0, sgd={"momentum": 0.9})  # the first update overflows
    with pytest.raises(TrainingDiverged, match="the weights") as want:
        SerialTrainer((10,), **kwargs).fit(X * 100, y, steps=4)
    serial = SerialTrainer((10,), **kwargs)
    with pytest.raises(TrainingDiverged):
        serial.fit(X * 100, y, steps=4)
    npt = NPTTrainer((10,), grid="2x2", mode="graph", client=client4, **kwargs)
    with pytest.raises(TrainingDiverged, match="the weights") as got:
        npt.fit(X * 100, y, steps=4)
    assert got.value.step == want.value.step and npt.n_steps_ == serial.n_steps_
    assert all(np.isfinite(p).all() for p in npt.model_.params)
    assert _max_error(npt, serial) == 0.0


class ManagedPeak(WorkerPlugin):
    """The most bytes a worker held in memory at once (its managed data)."""

    name = "daskann-test-managed-peak"

    def setup(self, worker):
        self.worker = worker
        self.peak = 0

    def transition(self, key, start, finish, **kwargs):
        self.peak = max(self.peak, self.worker.state.nbytes)


def _wait_for_workers_below(client, nbytes, timeout=30.0):
    deadline = time.monotonic() + timeout
    while max(client.run(lambda dask_worker: dask_worker.state.nbytes).values()) >= nbytes:
        assert time.monotonic() < deadline, "the workers kept the state of a finished fit"
        time.sleep(0.05)


def _traced_fit_and_resume(hidden, X, y, folder, **kwargs):
    """Client's traced peak over a 3-step fit (checkpointed) and its resumption for a 4th step."""
    gc.collect()
    tracemalloc.start()
    try:
        first = NPTTrainer(hidden, **kwargs, checkpoint=folder).fit(X, y, steps=3)
        del first  # its final state, on the grid, is released: wait until the workers dropped it
        gc.collect()
        _wait_for_workers_below(kwargs["client"], 2**20)
        resumed = NPTTrainer(hidden, **kwargs, checkpoint=folder).fit(X, y, steps=4, resume=folder)
        return tracemalloc.get_traced_memory()[1], resumed
    finally:
        tracemalloc.stop()


def test_client_holds_no_block_of_a_net_eight_times_its_cap(client4, tmp_path):
    """Fit, checkpoint and resume a net whose weights and velocity are 8x a cap on the client's memory.

    The test cluster's scheduler runs in this process, its records of every task traced too: the same
    run with a tiny net, the same tasks, measures them.
    """
    rng = np.random.default_rng(5)
    X, y = rng.standard_normal((64, 16)), rng.standard_normal((64, 4))
    sizes, cap = (16, 2048, 2048, 4), 8 * 2**20
    state_bytes = 2 * 8 * sum((a + 1) * b for a, b in zip(sizes[:-1], sizes[1:], strict=True))
    block_bytes = 8 * (2048 // 2) * (2048 // 2)
    assert state_bytes >= 8 * cap and block_bytes >= cap
    kwargs = dict(
        lr=0.01, batch_size=16, seed=2, grid="2x2", mode="graph", engine={"pipeline": "fused"}, sgd={"momentum": 0.9}
    )
    kwargs["client"] = client4
    tiny_peak, _ = _traced_fit_and_resume((8, 8), X, y, tmp_path / "tiny", **kwargs)
    client4.register_plugin(ManagedPeak())
    try:
        client_peak, resumed = _traced_fit_and_resume(sizes[1:-1], X, y, tmp_path / "run", **kwargs)
        peaks = client4.run(lambda dask_worker: dask_worker.plugins[ManagedPeak.name].peak)
    finally:
        client4.unregister_worker_plugin(ManagedPeak.name)
    print(
        f"model (weights + velocity) {state_bytes / 2**20:.1f} MiB, cap {cap / 2**20:.1f} MiB, client peak "
        f"{client_peak / 2**20:.2f} MiB (tiny net: {tiny_peak / 2**20:.2f} MiB), per-worker peak "
        + ", ".join(f"{p / 2**20:.1f}" for p in sorted(peaks.values()))
        + " MiB"
    )
    assert client_peak < cap
    # a worker holds its quarter of the state, the one block its update is making, and two borrowed weight
    # blocks (the two Cannon operand blocks in flight: one for the forward, one for the backward product);
    # 2 MiB more for activations, data and the small layers
    own = state_bytes / 4
    assert max(peaks.values()) < own + 3 * block_bytes + 2 * 2**20
    assert resumed.__dict__.get("_model") is None
    reference = SerialTrainer(sizes[1:-1], **{k: kwargs[k] for k in ("lr", "sgd", "batch_size", "seed")})
    assert _max_error(resumed, reference.fit(X, y, steps=4)) < TOL


# -- resident mode: the same store format, written and read by the cells -------------------------
def test_resident_cells_write_their_blocks_and_any_grid_or_mode_resumes(client4, regression, tmp_path):
    X, y = regression
    run = tmp_path / "run"
    with scheduler_watch(client4) as watch:
        npt = NPTTrainer(
            (12,), grid="2x2", mode="resident", client=client4, **KWARGS, checkpoint={"dir": run, "every": 2}
        ).fit(X, y, steps=4)
    # one task per worker wrote that worker's blocks; the client committed the manifest
    assert len([k for k in watch.keys if "-save-" in k]) == 2 * 4
    manifest = zarr.open_group(str(checkpoint_path(run, 4)), mode="r").attrs["daskann"]["manifest"]
    assert manifest["weights/0"]["bounds"] == [[[0, 4], [4, 8]], [[0, 6], [6, 12]]]
    assert manifest["weights/0"]["blocks"].keys() == {"0.0", "0.1", "1.0", "1.1"}
    assert manifest["biases/1"]["bounds"] == [[[0, 2], [2, 4]]]
    assert verify_path(run)["ok"]
    # the state stays on the cells: weights_ are dask arrays on the grid, model_ reads the final store
    assert npt.__dict__.get("_model") is None
    assert [w.chunks for w in npt.weights_] == [((4, 4), (6, 6)), ((6, 6), (2, 2))]
    assert [b.chunks for b in npt.biases_] == [((6, 6),), ((2, 2),)]
    serial = SerialTrainer((12,), **KWARGS).fit(X, y, steps=4)
    got = [client4.compute(a, sync=True) for a in npt.weights_ + npt.biases_]
    assert max(_rel(a, b) for a, b in zip(got, serial.model_.weights + serial.model_.biases, strict=True)) < TOL
    assert _max_error(npt, serial) < TOL
    # re-cut on other grids (a 2x3 grid runs on a virtual 6x6 one), in either mode, and in one process
    reference = SerialTrainer((12,), **KWARGS).fit(X, y, steps=7)
    for grid, mode in (("1x3", "resident"), ("2x3", "resident"), ("3x3", "graph")):
        other = NPTTrainer((12,), grid=grid, mode=mode, engine={"share_workers": True}, client=client4, **KWARGS)
        other.fit(X, y, steps=7, resume=run)
        # the history saved beside the checkpoint carries steps 1 to 4 on
        assert list(other.history_["step"].values) == [1, 2, 3, 4, 5, 6, 7]
        np.testing.assert_allclose(other.history_["loss"].values, reference.history_["loss"].values, rtol=1e-12)
        assert set(other.history_.data_vars) == set(npt.history_.data_vars)
        assert _max_error(other, reference) < TOL
    assert _max_error(SerialTrainer((12,), **KWARGS).fit(X, y, steps=7, resume=run), reference) < TOL
    # on the same grid, resuming changes no bit
    straight = NPTTrainer((12,), grid="2x2", mode="resident", client=client4, **KWARGS).fit(X, y, steps=7)
    resumed = NPTTrainer((12,), grid="2x2", mode="resident", client=client4, **KWARGS).fit(X, y, steps=7, resume=run)
    pairs = zip(resumed.model_.params + resumed.velocity_, straight.model_.params + straight.velocity_, strict=True)
    assert all(np.array_equal(a, b) for a, b in pairs)


def test_a_graph_checkpoint_resumes_in_resident_mode(client4, regression, tmp_path):
    X, y = regression
    run = tmp_path / "run"
    NPTTrainer((12,), grid="2x2", mode="graph", client=client4, **KWARGS, checkpoint=run).fit(X, y, steps=3)
    resumed = NPTTrainer((12,), grid="2x3", mode="resident", engine={"share_workers": True}, client=client4, **KWARGS)
    resumed.fit(X, y, steps=6, resume=run)
    assert resumed.__dict__.get("_model") is None
    assert _max_error(resumed, SerialTrainer((12,), **KWARGS).fit(X, y, steps=6)) < TOL


@pytest.mark.parametrize("mode", ["graph", "resident"])
def test_resuming_a_finished_run_gives_its_final_state(client4, regression, tmp_path, mode):
    # no step is left to train: the model is the stored one, as SerialTrainer reads it
    X, y = regression
    kwargs = dict(grid="2x2", mode=mode, engine={"share_workers": True}, client=client4, **KWARGS)
    NPTTrainer((12,), checkpoint={"dir": tmp_path / "run", "every": 2}, **kwargs).fit(X, y, steps=4)
    again = NPTTrainer((12,), **kwargs).fit(X, y, steps=4, resume=tmp_path / "run")
    assert again.n_steps_ == 4
    assert _max_error(again, SerialTrainer((12,), **KWARGS).fit(X, y, steps=4)) < TOL


def test_a_damaged_block_is_reported_before_any_training_task(client4, regression, tmp_path):
    X, y = regression
    run = tmp_path / "run"
    NPTTrainer((12,), grid="2x2", mode="resident", client=client4, **KWARGS, checkpoint=run).fit(X, y, steps=2)
    store = checkpoint_path(run, 2)
    z = zarr.open_array(str(store / "weights" / "1"), mode="r+")
    z[7, 3] = z[7, 3] + 1.0  # block 1.1 of the resident 2x2 layout, rewritten through zarr
    for mode in ("resident", "graph"):
        with scheduler_watch(client4) as watch:
            with pytest.raises(StoreError, match=r"block 1\.1 of array 'weights/1' does not match its checksum") as err:
                NPTTrainer((12,), grid="2x2", mode=mode, client=client4, **KWARGS).fit(X, y, steps=3, resume=store)
        assert repr(str(store)) in str(err.value)
        # only the checks ran: one task per worker, reading the blocks
        assert len(watch.keys) == 4 and all("-verify-" in k for k in watch.keys), watch.keys


@pytest.mark.parametrize("mode", ["resident", "graph"])
@pytest.mark.parametrize("store", [True, False], ids=["store", "no-store"])
def test_partial_fit_on_new_data_continues_on_the_cells(client4, regression, tmp_path, mode, store):
    X, y = regression
    X2, y2 = X[:64] * 0.5, y[:64]
    folder = tmp_path / "run" if store else None
    npt = NPTTrainer((12,), grid="2x2", mode=mode, client=client4, **KWARGS, checkpoint=folder).fit(X, y, steps=4)

    def refuse():
        raise AssertionError("partial_fit loaded the model onto the client")

    npt._load_final = refuse
    with scheduler_watch(client4) as watch:
        npt.partial_fit(X2, y2, steps=3)
    del npt._load_final
    # from the final store or the state the cells hold: no block was sent from the client
    assert not [k for k in watch.keys if re.search(r"-init\d+-", k)]
    assert npt.__dict__.get("_model") is None and npt.n_steps_ == 7
    serial = SerialTrainer((12,), **KWARGS).fit(X, y, steps=4).partial_fit(X2, y2, steps=3)
    assert _max_error(npt, serial) < TOL


@pytest.mark.parametrize("mode", ["resident", "graph"])
def test_divergence_leaves_the_last_finite_state_on_the_cells(client4, regression, mode):
    X, y = regression
    kwargs = dict(lr=1e306, batch_size=20, seed=0, sgd={"momentum": 0.9})
    serial = SerialTrainer((10,), **kwargs)
    with pytest.raises(TrainingDiverged) as want:
        serial.fit(X * 100, y, steps=4)
    npt = NPTTrainer((10,), grid="2x2", mode=mode, client=client4, **kwargs)
    with pytest.raises(TrainingDiverged) as got:
        npt.fit(X * 100, y, steps=4)
    assert npt.__dict__.get("_model") is None
    assert got.value.step == want.value.step and npt.n_steps_ == serial.n_steps_
    # the cause in serial's words, whichever mode ran
    assert want.value.what == "the weights" and str(got.value) == str(want.value)
    assert _max_error(npt, serial) == 0.0


def test_resident_client_holds_no_block_of_a_net_eight_times_its_cap(client4, tmp_path):
    """As the graph-mode test above, in resident mode: the cells write and read the checkpoint."""
    rng = np.random.default_rng(5)
    X, y = rng.standard_normal((64, 16)), rng.standard_normal((64, 4))
    # the cap is below one block and far above what the in-process scheduler's own records reach under load
    sizes, cap = (16, 3072, 3072, 4), 16 * 2**20
    state_bytes = 2 * 8 * sum((a + 1) * b for a, b in zip(sizes[:-1], sizes[1:], strict=True))
    block_bytes = 8 * (3072 // 2) * (3072 // 2)
    assert state_bytes >= 8 * cap and block_bytes >= cap
    kwargs = dict(lr=0.01, batch_size=16, seed=2, grid="2x2", mode="resident", client=client4, sgd={"momentum": 0.9})
    # the same run with a tiny net first: the modules it imports on first use are not the model's memory
    tiny_peak, _ = _traced_fit_and_resume((8, 8), X, y, tmp_path / "tiny", **kwargs)
    client_peak, resumed = _traced_fit_and_resume(sizes[1:-1], X, y, tmp_path / "run", **kwargs)
    print(
        f"resident: model (weights + velocity) {state_bytes / 2**20:.1f} MiB, cap {cap / 2**20:.1f} MiB, "
        f"client peak {client_peak / 2**20:.2f} MiB (tiny net: {tiny_peak / 2**20:.2f} MiB)"
    )
    assert client_peak < cap
    assert resumed.__dict__.get("_model") is None
    reference = SerialTrainer(sizes[1:-1], **{k: kwargs[k] for k in ("lr", "sgd", "batch_size", "seed")})
    assert _max_error(resumed, reference.fit(X, y, steps=4)) < TOL
