"""Resident NPT: worker-resident Cannon products against SerialTrainer.

Every run here uses real process workers (one thread each) and the worker
plugin's direct comm; results must equal SerialTrainer's in float64 whatever
the grid, including grids with uneven blocks and cells sharing workers.
"""

from __future__ import annotations

import importlib
import os
import signal
import threading
import time
import uuid
from dataclasses import replace

import numpy as np
import pytest
from conftest import no_tasks_submitted, restore_workers, scheduler_watch
from distributed import get_worker

from daskann import SerialTrainer, TrainingDiverged
from daskann.data import make_linear
from daskann.nn import MLP, SGD
from daskann.npt import NPTTrainer
from daskann.npt._exchange import ExchangeAborted, ExchangeTimeout, Mailbox, open_namespaces
from daskann.npt._resident_program import Layout
from daskann.npt._run import HeldBlocks
from daskann.npt.grid import ProcessGrid
from daskann.npt.resident import (
    ResidentError,
    RunStart,
    _gather_on,
    _gather_state,
    _payloads,
    current_workers,
    exchange_latency,
    train_resident,
)

TOL = 1e-10
#: (loss, activation, output) of the equality tests
SETTINGS = [("mse", "relu", "linear"), ("cross_entropy", "leaky_relu", "linear"), ("mse", "leaky_relu", "softmax")]


@pytest.fixture(scope="module")
def regression():
    return make_linear(120, 7, 5, noise=0.1, seed=1)


@pytest.fixture(scope="module")
def classification():
    rng = np.random.default_rng(2)
    X = rng.standard_normal((120, 7))
    return X, ((X[:, 0] + X[:, 1] > 0).astype(np.int64) + (X[:, 2] > 1)).astype(np.int64)


def _setup(X, y, hidden, **kwargs):
    """What NPTTrainer hands to train_resident, built by the base-trainer helpers."""
    trainer = SerialTrainer(hidden, **kwargs)
    settings = trainer._check_settings()
    data = trainer._check_data(X, y, None, settings)
    order = trainer._batch_order(settings, data.n_samples)
    model = trainer._initial_model(settings, data.n_features, data.n_outputs, None)
    start = RunStart(0, model, SGD.init_state(model.params))
    return dict(start=start, X=data.X, y=data.y, order=order, settings=settings)


def _rel(a, b):
    """Largest difference relative to the largest entry (no overflow for huge weights)."""
    scale = np.max(np.abs(b))
    return float(np.max(np.abs(a - b)) / scale) if scale else float(np.max(np.abs(a)))


def _run_and_compare(client, grid, X, y, hidden, steps=30, **kwargs):
    serial = SerialTrainer(hidden, **kwargs).fit(X, y, steps=steps)
    run_id = f"daskann-npt-test-{uuid.uuid4().hex[:8]}"
    result = train_resident(client, grid, **_setup(X, y, hidden, **kwargs), stop=steps, run_id=run_id)
    errors = [_rel(a, b) for a, b in zip(result.model.params, serial.model_.params, strict=True)]
    errors += [_rel(a, b) for a, b in zip(result.velocity, serial.velocity_, strict=True)]
    assert max(errors) < TOL, errors
    assert result.diverged_step is None and len(result.rows) == steps
    losses = np.array([r["loss"] for r in result.rows])
    np.testing.assert_allclose(losses, serial.history_["loss"].values, rtol=1e-12)
    return result, run_id


@pytest.mark.parametrize("loss,activation,output", SETTINGS)
def test_2x2_equals_serial(client4, regression, classification, loss, activation, output):
    X, y = regression if loss == "mse" else classification
    grid = ProcessGrid.from_client(client4, "2x2")
    kwargs = dict(
        loss=loss,
        activation=activation,
        lr=0.05,
        batch_size=16,
        seed=3,
        network={"output": output},
        sgd={"momentum": 0.9},
    )
    result, run_id = _run_and_compare(client4, grid, X, y, (12, 9), **kwargs)
    rows = result.rows
    assert all(r["bytes_moved"] > 0 and r["compute_time"] > 0 and r["comm_time"] >= 0 for r in rows)
    # every worker's mailbox of the run is gone afterwards
    left = client4.run(open_namespaces)
    assert not [ns for names in left.values() for ns in names if ns.startswith(run_id)], left


@pytest.mark.parametrize("loss,activation,output", SETTINGS)
def test_1x1_steps_exactly_as_serial(client4, regression, classification, loss, activation, output):
    """One cell steps with the numeric core itself: weights, velocities and losses are serial's, bit for bit."""
    X, y = regression if loss == "mse" else classification
    grid = ProcessGrid.from_client(client4, "1x1")
    kwargs = dict(
        loss=loss,
        activation=activation,
        lr=0.05,
        batch_size=16,
        seed=3,
        network={"output": output},
        sgd={"momentum": 0.9},
    )
    serial = SerialTrainer((12, 9), **kwargs).fit(X, y, steps=30)
    result = train_resident(
        client4,
        grid,
        **_setup(X, y, (12, 9), **kwargs),
        stop=30,
        run_id=f"daskann-npt-test-1x1-{uuid.uuid4().hex[:8]}",
        eval_fn=lambda done: done % 10 == 0,
    )
    for got, want in zip(result.model.params + result.velocity, serial.model_.params + serial.velocity_, strict=True):
        np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal([r["loss"] for r in result.rows], serial.history_["loss"].values)
    assert all(r["bytes_moved"] == 0 and r["compute_time"] > 0 for r in result.rows)
    assert sorted(result.snapshots) == [10, 20, 30]
    at10 = SerialTrainer((12, 9), **kwargs).fit(X, y, steps=10).model_
    for got, want in zip(result.snapshots[10].params, at10.params, strict=True):
        np.testing.assert_array_equal(got, want)


def test_eval_snapshots_are_the_models_of_those_steps(client4, regression):
    X, y = regression
    kwargs = dict(lr=0.05, batch_size=16, seed=4, sgd={"momentum": 0.5})
    grid = ProcessGrid.from_client(client4, "2x2")
    result = train_resident(
        client4,
        grid,
        **_setup(X, y, (9,), **kwargs),
        stop=8,
        run_id="daskann-npt-test-eval",
        eval_fn=lambda done: done % 4 == 0,
    )
    assert sorted(result.snapshots) == [4, 8]
    at4 = SerialTrainer((9,), **kwargs).fit(X, y, steps=4).model_
    assert max(_rel(a, b) for a, b in zip(result.snapshots[4].params, at4.params, strict=True)) < TOL
    assert max(_rel(a, b) for a, b in zip(result.snapshots[8].params, result.model.params, strict=True)) == 0


def test_continues_from_a_later_step(client4, regression):
    X, y = regression
    kwargs = dict(lr=0.05, batch_size=16, seed=5, sgd={"momentum": 0.9})
    first = SerialTrainer((8,), **kwargs).fit(X, y, steps=6)
    full = SerialTrainer((8,), **kwargs).fit(X, y, steps=12)
    setup = _setup(X, y, (8,), **kwargs)
    setup.update(start=RunStart(6, first.model_, first.velocity_))
    grid = ProcessGrid.from_client(client4, "2x2")
    result = train_resident(client4, grid, **setup, stop=12, run_id="daskann-npt-test-resume")
    assert max(_rel(a, b) for a, b in zip(result.model.params, full.model_.params, strict=True)) < TOL
    np.testing.assert_allclose([r["loss"] for r in result.rows], full.history_["loss"].values[6:], rtol=1e-12)


def test_float32_keeps_its_dtype_and_follows_serial(client4, regression):
    X, y = regression
    kwargs = dict(lr=0.05, batch_size=16, seed=9, network={"dtype": "float32"}, sgd={"momentum": 0.9})
    serial = SerialTrainer((10,), **kwargs).fit(X, y, steps=10)
    grid = ProcessGrid.from_client(client4, "2x2")
    result = train_resident(client4, grid, **_setup(X, y, (10,), **kwargs), stop=10, run_id="daskann-npt-f32")
    assert all(p.dtype == np.float32 for p in result.model.params + result.velocity)
    assert max(_rel(a, b) for a, b in zip(result.model.params, serial.model_.params, strict=True)) < 1e-5


def test_3x3_uneven_blocks_on_shared_workers(client4, classification):
    # 7 inputs, widths 10 and 8, 2 classes and batch 16: no size divisible by 3,
    # and the 2-wide output leaves an empty block; 9 cells share 4 workers
    X, y = classification
    y = (y > 0).astype(np.int64)
    grid = ProcessGrid.from_client(client4, "3x3", share_workers=True)
    assert len(set(grid.workers)) == 4
    kwargs = dict(loss="cross_entropy", lr=0.1, batch_size=16, seed=6, sgd={"momentum": 0.9})
    _run_and_compare(client4, grid, X, y, (10, 8), **kwargs)


@pytest.mark.parametrize("shape,loss", [("2x4", "mse"), ("4x2", "cross_entropy")])
def test_rectangular_grids(client4, regression, classification, shape, loss):
    X, y = regression if loss == "mse" else classification
    grid = ProcessGrid.from_client(client4, shape, share_workers=True)
    kwargs = dict(loss=loss, activation="leaky_relu", lr=0.05, batch_size=20, seed=7, sgd={"momentum": 0.9})
    _run_and_compare(client4, grid, X, y, (10, 6), **kwargs)


def test_layout_of_a_rectangular_grid():
    grid = ProcessGrid.from_workers("2x4", [f"tcp://w{k}" for k in range(8)])
    layout = Layout.build(grid, (7, 10, 5), 20)
    assert layout.q == 4
    # each process cell hosts two virtual cells of one virtual column
    assert all(len(layout.cells_of(w)) == 2 for w in grid.workers)
    assert {c[1] for c in layout.cells_of(grid.owner(1, 3))} == {3}
    model = MLP((7, 10, 5), seed=0)
    held = HeldBlocks(model, [np.random.default_rng(k).standard_normal(p.shape) for k, p in enumerate(model.params)])
    states = [layout.blocks(w, held) for w in grid.workers]
    net = {"activation": "relu", "output": "linear", "negative_slope": 0.01}
    assembled, velocity = _gather_state(layout, net, states, model.dtype, velocity=True)
    for got, want in zip([*assembled.params, *velocity], [*model.params, *held.velocity], strict=True):
        np.testing.assert_array_equal(got, want)


def test_each_worker_gets_only_its_column_bands(regression):
    X, y = regression
    grid = ProcessGrid.from_workers("2x2", [f"tcp://w{k}" for k in range(4)])
    setup = _setup(X, y, (8,), batch_size=16)
    model = setup["start"].model
    layout = Layout.build(grid, model.sizes, 16)
    weights = 0
    source = setup["start"].block_source(model.sizes, model.dtype)
    for _, payload in _payloads(layout, source, setup["X"], setup["y"], "mse"):
        # one column band of X (all samples: any row may be in a batch), never all of X
        assert sum(band.shape[1] for band in payload["X"].values()) in (3, 4)
        assert all(band.shape[0] == X.shape[0] for band in payload["X"].values())
        weights += sum(w.size for w in payload["W"].values())
    assert weights == model.n_parameters - sum(b.size for b in model.biases)


def test_no_scheduler_round_trip_per_step(client4, regression):
    X, y = regression
    grid = ProcessGrid.from_client(client4, "2x2")
    kwargs = dict(lr=0.05, batch_size=16, seed=8)

    def transitions(steps):
        """Transitions of the run's own keys, until the scheduler has forgotten them all."""
        run_id = f"daskann-npt-test-rt-{uuid.uuid4().hex[:8]}"
        with scheduler_watch(client4) as watch:
            train_resident(client4, grid, **_setup(X, y, (8,), **kwargs), stop=steps, run_id=run_id)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and client4.run_on_scheduler(
                lambda dask_scheduler, p=run_id: any(str(k).startswith(p) for k in dask_scheduler.tasks)
            ):
                time.sleep(0.05)
        return sum(key.startswith(run_id) for key in watch.events)

    few, many = transitions(2), transitions(20)
    assert many == few, (few, many)
    assert many <= 8 * len(set(grid.workers)), many  # a handful per worker, none per step


def test_silent_peer_fails_within_the_timeout(client4, regression):
    X, y = regression
    grid = ProcessGrid.from_client(client4, "2x2")
    busy = grid.owner(1, 1)
    client4.run(importlib.import_module, "daskann.npt._resident_program")  # time the failure, not the imports
    # the worker of cell (1, 1) is stuck in another task, so that cell never sends
    blocker = client4.submit(time.sleep, 6, workers=[busy], pure=False, key=f"blocker-{uuid.uuid4().hex[:6]}")
    deadline = time.monotonic() + 20
    while (
        client4.run(
            lambda dask_worker, k=blocker.key: getattr(dask_worker.state.tasks.get(k), "state", None), workers=[busy]
        )[busy]
        != "executing"
    ):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    run_id = f"daskann-npt-test-stuck-{uuid.uuid4().hex[:6]}"
    t0 = time.monotonic()
    with pytest.raises(ResidentError, match=r"sent nothing.*did not arrive within 1 s") as info:
        train_resident(client4, grid, **_setup(X, y, (8,), lr=0.05, batch_size=16), stop=5, run_id=run_id, timeout=1.0)
    elapsed = time.monotonic() - t0
    assert elapsed < 6, elapsed
    # the error names the silent cell and its worker, not just a waiting neighbour
    assert "(1, 1)" in str(info.value) and busy in str(info.value), info.value
    blocker.result()
    left = client4.run(open_namespaces)
    assert not [ns for names in left.values() for ns in names if ns.startswith(run_id)], left


def test_killed_worker_fails_fast_and_clearly(client4, regression):
    X, y = regression
    grid = ProcessGrid.from_client(client4, "2x2")
    victim = grid.owner(1, 0)
    client4.run(importlib.import_module, "daskann.npt._resident_program")

    def kill():
        time.sleep(1.5)  # the resident task has seceded, so this runs beside it and ends the process
        client4.submit(os._exit, 1, workers=[victim], pure=False, key=f"kill-{uuid.uuid4().hex[:6]}")

    threading.Thread(target=kill, daemon=True).start()
    t0 = time.monotonic()
    try:
        with pytest.raises(ResidentError, match=r"\(cells \(1, 0\)\) left the cluster during training"):
            train_resident(
                client4,
                grid,
                **_setup(X, y, (8,), lr=0.01, batch_size=16),
                stop=3000,
                run_id="daskann-npt-test-kill",
                timeout=60.0,
            )
        # well before the 60 s receive timeout: the client saw the worker leave
        assert time.monotonic() - t0 < 20
        survivors = client4.run(open_namespaces)
        assert not any(ns.startswith("daskann-npt-test-kill") for names in survivors.values() for ns in names)
    finally:
        restore_workers(client4, 4)


def test_a_worker_lost_while_its_blocks_are_read_is_a_resident_error(client4, regression):
    # a batch job's worker that leaves takes the cells' state with it; the scheduler forgets and
    # cancels the task that was reading it, which must read as a lost worker (the run replays), not leak
    X, y = regression
    grid = ProcessGrid.from_client(client4, "2x2")
    result = train_resident(
        client4, grid, **_setup(X, y, (8,), lr=0.01, batch_size=16), stop=3, run_id="daskann-npt-test-read", keep=True
    )
    state, victim = result.state, grid.owner(1, 0)
    try:
        # the victim's read lasts until its worker dies, whenever that is; the others end at once
        reads = state._each(lambda cells: time.sleep(60 if get_worker().address == victim else 0), tag="read")
        os.kill(client4.run(os.getpid, workers=[victim])[victim], signal.SIGKILL)
        deadline = time.monotonic() + 30
        while not all(f.done() for f in reads):  # the victim's read cancelled, the others finished
            assert time.monotonic() < deadline, [f.status for f in reads]
            time.sleep(0.05)
        assert sorted(f.status for f in reads) == ["cancelled", "finished", "finished", "finished"]
        with pytest.raises(ResidentError, match=r"left the cluster"):
            _gather_on(client4, reads, state.layout)
    finally:
        restore_workers(client4, 4)


def test_a_worker_gone_before_a_stretch_begins_is_replayed(client4, regression, tmp_path, monkeypatch):
    # a batch job's worker can end between two stretches, after the grid was chosen: the next stretch
    # finds it gone before any cell starts, which is a lost worker (replayed from the checkpoint), not bad input
    from daskann.npt import resident

    X, y = regression
    kwargs = dict(lr=0.05, batch_size=16, seed=6, sgd={"momentum": 0.9})
    train, calls = resident.train_resident, []

    def second_stretch_after_a_worker_left(client, grid, **settings):
        calls.append(grid)
        if len(calls) == 2:
            victim = grid.owner(1, 0)
            os.kill(client.run(os.getpid, workers=[victim])[victim], signal.SIGKILL)
            deadline = time.monotonic() + 30
            while victim in current_workers(client):
                assert time.monotonic() < deadline, f"{victim} still in the cluster"
                time.sleep(0.05)
        return train(client, grid, **settings)

    monkeypatch.setattr(resident, "train_resident", second_stretch_after_a_worker_left)
    trainer = NPTTrainer(
        (8,), grid="2x2", mode="resident", client=client4, checkpoint={"dir": tmp_path, "every": 6}, **kwargs
    )
    try:
        trainer.fit(X, y, steps=12)
    finally:
        restore_workers(client4, 4)
    assert trainer.recoveries_ == 1 and calls[0].owner(1, 0) not in trainer.grid_.workers
    serial = SerialTrainer((8,), **kwargs).fit(X, y, steps=12)
    assert max(_rel(a, b) for a, b in zip(trainer.model_.params, serial.model_.params, strict=True)) < TOL
    np.testing.assert_allclose(trainer.history_["loss"].values, serial.history_["loss"].values, rtol=1e-12)


@pytest.mark.parametrize("shape", ["2x2", "1x1"])
def test_divergence_stops_with_the_last_finite_state(client4, regression, shape):
    X, y = regression
    kwargs = dict(lr=1e5, batch_size=16, seed=3, sgd={"momentum": 0.9})
    serial = SerialTrainer((12, 9), **kwargs)
    with pytest.raises(TrainingDiverged) as info:
        serial.fit(X, y, steps=30)
    grid = ProcessGrid.from_client(client4, shape)
    result = train_resident(
        client4, grid, **_setup(X, y, (12, 9), **kwargs), stop=30, run_id=f"daskann-npt-test-diverge-{shape}"
    )
    assert (result.diverged_step, result.diverged_what) == (info.value.step, info.value.what)
    assert len(result.rows) == info.value.step - 1
    assert all(np.isfinite(p).all() for p in result.model.params + result.velocity)
    assert max(_rel(a, b) for a, b in zip(result.model.params, serial.model_.params, strict=True)) < TOL


#: (what serial says, scale of X, settings) of runs that diverge for either cause
CAUSES = [
    ("the weights", 100.0, dict(lr=1e306, batch_size=20, seed=0, sgd={"momentum": 0.9})),  # the first update overflows
    ("the loss or its gradients", 1.0, dict(lr=3.0, batch_size=20, seed=0, sgd={"momentum": 0.9})),
]


@pytest.mark.parametrize("shape", ["2x2", "1x1"])
@pytest.mark.parametrize("what,scale,kwargs", CAUSES, ids=["weights", "loss"])
def test_divergence_names_the_cause_serial_names(client4, regression, shape, what, scale, kwargs):
    """Each worker announces its cause of divergence; all agree on the worst, which the message names."""
    X, y = regression
    serial = SerialTrainer((10,), **kwargs)
    with pytest.raises(TrainingDiverged) as want:
        serial.fit(X * scale, y, steps=40)
    assert want.value.what == what  # the run diverges for the cause it is meant to
    npt = NPTTrainer((10,), grid=shape, mode="resident", client=client4, **kwargs)
    with pytest.raises(TrainingDiverged) as got:
        npt.fit(X * scale, y, steps=40)
    assert str(got.value) == str(want.value) and npt.n_steps_ == serial.n_steps_
    assert max(_rel(a, b) for a, b in zip(npt.model_.params, serial.model_.params, strict=True)) < TOL


def test_bad_input_fails_before_any_task(client4, regression):
    X, y = regression
    setup = _setup(X, y, (8,), batch_size=16)
    grid = ProcessGrid.from_client(client4, "2x2")
    with no_tasks_submitted(client4):
        with pytest.raises(ValueError, match="stop"):
            late = setup | {"start": replace(setup["start"], step=5)}
            train_resident(client4, grid, **late, stop=2, run_id="daskann-npt-test-bad")
        with pytest.raises(ValueError, match="timeout"):
            train_resident(client4, grid, **setup, stop=2, run_id="daskann-npt-test-bad", timeout=0)
        ghost = ProcessGrid.from_workers("1x2", [grid.workers[0], "tcp://127.0.0.1:1"])
        # a grid worker not in the cluster has left it, as far as the run can tell: its trainer replays
        with pytest.raises(ResidentError, match=r"worker tcp://127.0.0.1:1 \(cells .*\) is not in the cluster"):
            train_resident(client4, ghost, **setup, stop=2, run_id="daskann-npt-test-bad")


def test_mailbox_times_out_and_aborts():
    box = Mailbox()
    t0 = time.monotonic()
    with pytest.raises(ExchangeTimeout, match="block x from cell"):
        box.get("x", 0.2, lambda: "block x from cell (0, 1)")
    assert time.monotonic() - t0 < 2
    threading.Timer(0.1, box.abort, args=("run stopped",)).start()
    with pytest.raises(ExchangeAborted, match="run stopped"):
        box.get("y", 10)
    box2 = Mailbox()
    threading.Timer(0.05, box2.put, args=("z", 3)).start()
    assert box2.get("z", 10) == 3 and len(box2) == 0


def test_heap_settings_last_while_resident_tasks_run(monkeypatch):
    from daskann import _heap

    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "65536")  # as distributed's nanny starts workers
    active = _heap._libc() is not None
    with _heap.heap_for_blocks():
        with _heap.heap_for_blocks():
            assert _heap._users == (2 if active else 0)
        assert _heap._users == (1 if active else 0)
    assert _heap._users == 0


def test_exchange_latency(client4):
    figures = exchange_latency(client4, sizes=[8192, 1 << 20], repeats=3)
    assert list(figures) == [8192, 1 << 20]
    assert all(0 < t < 5 for t in figures.values())
    with pytest.raises(ValueError, match="workers"):
        exchange_latency(client4, workers=["tcp://a"])
