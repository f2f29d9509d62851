"""NPT checkpoints written by the grid's cells, resumed onto any grid, and a client that holds no block.

Every run uses real process workers (one thread each); results are compared
with SerialTrainer in float64.
"""

from __future__ import annotations

import gc
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
from daskann.store import checkpoint_path, verify_path

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


KWARGS = dict(lr=0.05, momentum=0.9, batch_size=16, seed=3)


def test_cells_write_their_blocks_and_any_grid_resumes(client4, regression, tmp_path):
    X, y = regression
    run = tmp_path / "run"
    with scheduler_watch(client4) as watch:
        npt = NPTTrainer(
            (12,), grid="2x2", mode="graph", client=client4, checkpoint_dir=run, checkpoint_every=2, **KWARGS
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
    reference = SerialTrainer((12,), **KWARGS).fit(X, y, steps=7)
    for grid in ("1x3", "3x3"):
        other = NPTTrainer((12,), grid=grid, mode="graph", share_workers=True, client=client4, **KWARGS)
        other.fit(X, y, steps=7, resume=run)
        assert list(other.history_["step"].values) == [5, 6, 7]
        assert _max_error(other, reference) < TOL
    assert _max_error(SerialTrainer((12,), **KWARGS).fit(X, y, steps=7, resume=run), reference) < TOL


def test_a_damaged_block_fails_where_it_is_read(client4, regression, tmp_path):
    X, y = regression
    run = tmp_path / "run"
    NPTTrainer((12,), grid="2x2", mode="graph", client=client4, checkpoint_dir=run, **KWARGS).fit(X, y, steps=2)
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
    kwargs = dict(loss="cross_entropy", output="softmax", lr=0.1, batch_size=16, seed=1)
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
    NPTTrainer((12,), grid="2x2", mode="graph", client=client4, checkpoint_dir=run, **KWARGS).fit(X, y, steps=2)
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
    kwargs = dict(lr=1e306, momentum=0.9, batch_size=20, seed=0)  # the first update overflows
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
        first = NPTTrainer(hidden, checkpoint_dir=folder, **kwargs).fit(X, y, steps=3)
        del first  # its final state, on the grid, is released: wait until the workers dropped it
        gc.collect()
        _wait_for_workers_below(kwargs["client"], 2**20)
        resumed = NPTTrainer(hidden, checkpoint_dir=folder, **kwargs).fit(X, y, steps=4, resume=folder)
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
    kwargs = dict(lr=0.01, momentum=0.9, batch_size=16, seed=2, grid="2x2", mode="graph", pipeline="fused")
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
    reference = SerialTrainer(sizes[1:-1], **{k: kwargs[k] for k in ("lr", "momentum", "batch_size", "seed")})
    assert _max_error(resumed, reference.fit(X, y, steps=4)) < TOL
