"""Validation in NPT's resident mode: evaluated by the cells, never by the client.

At evaluation steps each cell runs a Cannon forward pass over its grid row's band of the validation
rows with the weights it holds; the client only adds up one small number per worker. The history
equals SerialTrainer's in float64 whatever the grid, for numpy and dask-array validation data.
"""

from __future__ import annotations

import gc
import tracemalloc

import dask.array as da
import numpy as np
import pytest
from conftest import scheduler_watch

from daskann import SerialTrainer
from daskann.npt import NPTTrainer

TOL = 1e-10

SETTINGS = {
    "mse-linear": dict(loss="mse", network={"output": "linear"}),
    "cross_entropy": dict(loss="cross_entropy", network={"output": "softmax"}),
    "mse-softmax": dict(loss="mse", network={"output": "softmax"}),
}


def _data(loss: str, n: int, n_in: int = 7, n_out: int = 5, seed: int = 0):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, n_in))
    if loss == "cross_entropy":
        return X, rng.integers(0, n_out, n)
    return X, rng.random((n, n_out))


def _assert_same_history(got, want, names) -> None:
    assert list(got["step"].values) == list(want["step"].values)
    for name in names:
        a, b = got[name].values, want[name].values
        assert np.array_equal(np.isnan(a), np.isnan(b)), name
        np.testing.assert_allclose(a[~np.isnan(a)], b[~np.isnan(b)], rtol=TOL, atol=0, err_msg=name)


@pytest.mark.parametrize("kind", list(SETTINGS))
@pytest.mark.parametrize(
    ("grid", "n_val"), [("2x2", 30), ("2x3", 5), ("1x1", 30)], ids=["2x2", "2x3-empty-bands", "1x1-one-cell"]
)
def test_cells_evaluate_validation_as_serial_training(client4, kind, grid, n_val):
    """The 2x3 grid runs on a virtual 6x6 one: 5 validation rows leave one grid row with none.
    1x1 trains with the numeric core's own step and evaluates by the general program's products."""
    settings = SETTINGS[kind]
    X, y = _data(settings["loss"], 96)
    Xv, yv = _data(settings["loss"], n_val, seed=1)
    kwargs = dict(lr=0.05, batch_size=16, seed=3, **settings, sgd={"momentum": 0.9})
    serial = SerialTrainer((12, 6), **kwargs).fit(X, y, steps=5, validation_data=(Xv, yv), eval_every=2)
    npt = NPTTrainer((12, 6), grid=grid, mode="resident", engine={"share_workers": True}, client=client4, **kwargs)
    with scheduler_watch(client4) as watch:
        npt.fit(X, y, steps=5, validation_data=(Xv, yv), eval_every=2)
    names = ["loss", "val_loss"] + (["val_accuracy"] if settings["loss"] == "cross_entropy" else [])
    _assert_same_history(npt.history_, serial.history_, names)
    assert np.isnan(npt.history_["val_loss"].values).tolist() == [True, False, True, False, False]
    # no block of the model was read back: the final state stays on the cells
    assert npt.__dict__.get("_model") is None
    assert not [k for k in watch.keys if "-gather-" in k], watch.keys


@pytest.mark.parametrize("loss", ["mse", "cross_entropy"])
def test_dask_validation_is_read_on_the_workers(client4, tmp_path, loss):
    """Dask-array validation data gives the numpy input's history bit for bit; each worker reads its blocks."""
    settings = SETTINGS["cross_entropy" if loss == "cross_entropy" else "mse-linear"]
    X, y = _data(loss, 96)
    Xv, yv = _data(loss, 40, seed=1)
    kwargs = dict(lr=0.05, batch_size=16, seed=3, **settings, sgd={"momentum": 0.9})
    dX, dy = da.from_array(X, chunks=(32, 4)), da.from_array(y, chunks=32)
    dXv, dyv = da.from_array(Xv, chunks=(16, 3)), da.from_array(yv, chunks=16)
    expected = NPTTrainer((12,), grid="2x2", mode="resident", client=client4, **kwargs)
    expected.fit(X, y, steps=7, validation_data=(Xv, yv), eval_every=3)
    # checkpoints every 2 steps: four resident stretches, each evaluating the steps it ends or passes
    got = NPTTrainer(
        (12,), grid="2x2", mode="resident", client=client4, **kwargs, checkpoint={"dir": tmp_path, "every": 2}
    )
    with scheduler_watch(client4) as watch:
        got.fit(dX, dy, steps=7, validation_data=(dXv, dyv), eval_every=3)
    names = ["val_loss"] + (["val_accuracy"] if loss == "cross_entropy" else [])
    for name in names:
        np.testing.assert_array_equal(got.history_[name].values, expected.history_[name].values)
    serial = SerialTrainer((12,), **kwargs).fit(X, y, steps=7, validation_data=(Xv, yv), eval_every=3)
    _assert_same_history(got.history_, serial.history_, names)
    # each stretch reads every cell's block on that cell's worker: 4 stretches x 4 cells
    reads = [k for k in watch.keys if "-read-val-X-" in k]
    assert len(reads) == 4 * 4, reads


def test_partial_fit_keeps_evaluating_on_the_cells(client4):
    X, y = _data("cross_entropy", 96)
    Xv, yv = _data("cross_entropy", 30, seed=1)
    kwargs = dict(lr=0.05, batch_size=16, seed=3, **SETTINGS["cross_entropy"], sgd={"momentum": 0.9})
    npt = NPTTrainer((12,), grid="2x2", mode="resident", client=client4, **kwargs)
    npt.fit(X, y, steps=3, validation_data=(Xv, yv), eval_every=2).partial_fit(steps=3)
    serial = SerialTrainer((12,), **kwargs).fit(X, y, steps=3, validation_data=(Xv, yv), eval_every=2)
    serial.partial_fit(steps=3)
    _assert_same_history(npt.history_, serial.history_, ["loss", "val_loss", "val_accuracy"])
    assert npt.__dict__.get("_model") is None


def test_client_holds_no_block_while_validating_a_net_eight_times_its_cap(client4, tmp_path):
    """Fit with validation at every step, checkpoint and resume: the client's traced peak stays under the cap."""
    rng = np.random.default_rng(5)
    X, y = rng.standard_normal((64, 16)), rng.standard_normal((64, 4))
    Xv, yv = rng.standard_normal((48, 16)), rng.standard_normal((48, 4))
    sizes, cap = (16, 1536, 1536, 4), 4 * 2**20
    state_bytes = 2 * 8 * sum((a + 1) * b for a, b in zip(sizes[:-1], sizes[1:], strict=True))
    assert state_bytes >= 8 * cap
    kwargs = dict(lr=0.01, batch_size=16, seed=2, sgd={"momentum": 0.9})
    npt = dict(grid="2x2", mode="resident", client=client4)

    def traced(hidden, folder):
        gc.collect()
        tracemalloc.start()
        try:
            NPTTrainer(hidden, **npt, **kwargs, checkpoint=folder).fit(
                X, y, steps=3, validation_data=(Xv, yv), eval_every=1
            )
            gc.collect()
            resumed = NPTTrainer(hidden, **npt, **kwargs, checkpoint=folder)
            resumed.fit(X, y, steps=4, resume=folder, validation_data=(Xv, yv), eval_every=1)
            return tracemalloc.get_traced_memory()[1], resumed
        finally:
            tracemalloc.stop()

    tiny_peak, _ = traced((8, 8), tmp_path / "tiny")  # the modules imported on first use are not the model
    client_peak, resumed = traced(sizes[1:-1], tmp_path / "run")
    print(
        f"resident with validation: model (weights + velocity) {state_bytes / 2**20:.1f} MiB, "
        f"cap {cap / 2**20:.1f} MiB, client peak {client_peak / 2**20:.2f} MiB (tiny net: {tiny_peak / 2**20:.2f} MiB)"
    )
    assert client_peak < cap
    assert resumed.__dict__.get("_model") is None
    serial = SerialTrainer(sizes[1:-1], **kwargs).fit(X, y, steps=4, validation_data=(Xv, yv), eval_every=1)
    # steps 1 to 3 from the history saved beside the checkpoint, step 4 from the resumed run
    _assert_same_history(resumed.history_, serial.history_, ["loss", "val_loss"])
