"""MGRITTrainer adapts where a solve fails and always ends at serial training's weights."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import dask
import numpy as np
import pytest

from daskann import SerialTrainer, TrainingDiverged
from daskann.data import load_dataset, make_linear
from daskann.exceptions import MGRITDidNotPay, MGRITDiverged
from daskann.mgrit import Adaptation, MGRITTrainer

# these tests study the solver on problems too small for MGRIT to pay
pytestmark = pytest.mark.usefixtures("mgrit_study")

ENDINGS = {"converged", "adapted", "serial-fallback"}


def _rel(trainer, serial) -> float:
    a = np.concatenate([p.ravel() for p in trainer.model_.params])
    b = np.concatenate([p.ravel() for p in serial.model_.params])
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def _fit(trainer, X, y, steps):
    """Fit, returning the MGRITDidNotPay warnings it gave."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", MGRITDidNotPay)
        trainer.fit(X, y, steps=steps)
    return [w for w in caught if issubclass(w.category, MGRITDidNotPay)]


@pytest.fixture(scope="module")
def mlp_case():
    """8-16-16-2 leaky-ReLU MLP, MSE, batch 16, lr 0.01, momentum 0.9, 256 steps (issue 11)."""
    X, y = make_linear(256, 8, 2, seed=0)
    settings = dict(activation="leaky_relu", loss="mse", batch_size=16, lr=0.01, seed=0, sgd={"momentum": 0.9})
    serial = SerialTrainer((16, 16), **settings).fit(X, y, steps=256)
    return X, y, settings, serial


def test_diverging_preset_falls_back_to_serial_weights(mlp_case):
    X, y, settings, serial = mlp_case
    trainer = MGRITTrainer((16, 16), preset="solver1", engine={"scheduler": "inprocess"}, **settings)
    caught = _fit(trainer, X, y, 256)
    assert _rel(trainer, serial) < 1e-9
    result = trainer.result_
    assert result.ended == "serial-fallback" and not result.converged
    assert len(caught) == 1 and "serial-fallback" in str(caught[0].message)
    # every attempt is recorded with its cost; the ladder ends in the serial finish
    attempts = result.adaptations
    assert all(isinstance(a, Adaptation) for a in attempts)
    assert [a.attempt for a in attempts] == list(range(len(attempts)))
    assert attempts[0].change == "" and attempts[0].outcome == "diverged" and attempts[-1].outcome == "serial"
    assert all(a.work > 0 and a.seconds >= 0 for a in attempts)
    assert sum(a.iterations for a in attempts) == result.iterations == len(result.residuals)
    assert result.iterations <= result.max_iter
    assert 0 < attempts[-1].work <= 256 and attempts[-1].options["start"] % 4 == 0
    # the history says the same
    h = trainer.history_
    assert h.attrs["mgrit_ended"] == "serial-fallback"
    assert [a["outcome"] for a in json.loads(h.attrs["mgrit_adaptations"])] == [a.outcome for a in attempts]
    assert set(np.unique(h["attempt"].values)) <= set(range(len(attempts)))
    assert result.to_dict()["ended"] == "serial-fallback"


def test_default_preset_returns_serial_weights(mlp_case):
    X, y, settings, serial = mlp_case
    trainer = MGRITTrainer((16, 16), engine={"scheduler": "inprocess"}, **settings)
    _fit(trainer, X, y, 256)
    assert trainer.result_.ended in ENDINGS
    assert _rel(trainer, serial) < 1e-9


def test_strict_mode_keeps_raising(mlp_case):
    X, y, settings, _ = mlp_case
    trainer = MGRITTrainer(
        (16, 16), preset="solver1", engine={"scheduler": "inprocess"}, solver={"require_convergence": True}, **settings
    )
    with pytest.raises(MGRITDiverged):
        trainer.fit(X, y, steps=256)
    assert not hasattr(trainer, "model_")


def _record_stores(monkeypatch) -> list[Path]:
    """The paths of the trajectory stores created from now on, in order."""
    from daskann.mgrit import _store

    created, create = [], _store.create_store
    monkeypatch.setattr(_store, "create_store", lambda path, **kw: (created.append(Path(path)), create(path, **kw))[1])
    return created


@pytest.mark.parametrize("where", ["store", "checkpoint"])
def test_adapted_attempts_write_in_the_given_folder(where, mlp_case, client2, tmp_path, monkeypatch):
    """Workers on other machines cannot see a temporary folder of this one: every attempt writes where it was told."""
    from daskann.mgrit import solver

    X, y, settings, serial = mlp_case
    monkeypatch.setattr(solver, "_workers_are_local", lambda client: False)  # as if on other machines
    created = _record_stores(monkeypatch)
    if where == "store":
        folder = tmp_path / "traj.zarr"
        kwargs = {"engine": {"store": str(folder)}}
    else:
        kwargs = {"checkpoint": tmp_path / "run"}
    trainer = MGRITTrainer((16, 16), preset="solver1", client=client2, **kwargs, **settings)
    _fit(trainer, X, y, 256)
    assert _rel(trainer, serial) < 1e-9
    attempts = [a for a in trainer.result_.adaptations if a.outcome != "serial"]
    assert attempts[0].outcome != "converged" and len(attempts) > 1
    # the first attempt's store is the run's; every later one is a store of its own inside it, removed once it ended
    if where == "checkpoint":
        folder = created[0]
        assert folder.parent == tmp_path / "run" / "checkpoints" and not folder.exists()  # the trainer's, removed
    assert created[0] == folder and len(created) == len(attempts)
    assert all(folder in path.parents for path in created[1:])
    if where == "store":
        assert not any(p.name.startswith("daskann-mgrit-") for p in folder.iterdir())


def test_stalled_solve_adapts_then_finishes_serially():
    # digits, cross-entropy, lr 0.05, momentum 0.9: the residual stays flat (issue 11's CLI case, shortened)
    d = load_dataset("digits")
    settings = dict(loss="cross_entropy", batch_size=64, lr=0.05, seed=0, sgd={"momentum": 0.9})
    serial = SerialTrainer((16,), **settings).fit(d.X_train, d.y_train, steps=256)
    trainer = MGRITTrainer((16,), engine={"scheduler": "inprocess"}, **settings)
    caught = _fit(trainer, d.X_train, d.y_train, 256)
    assert _rel(trainer, serial) < 1e-9
    assert trainer.result_.ended in ENDINGS
    outcomes = [a.outcome for a in trainer.result_.adaptations]
    assert outcomes[0] in {"stalled", "diverged", "converged"}
    if trainer.result_.ended == "serial-fallback":
        assert caught


@pytest.mark.slow
def test_cli_case_of_the_issue_returns_serial_weights():
    d = load_dataset("digits")
    settings = dict(loss=d.loss, batch_size=64, lr=0.05, seed=0, sgd={"momentum": 0.9})
    serial = SerialTrainer((64,), **settings).fit(d.X_train, d.y_train, steps=512)
    trainer = MGRITTrainer((64,), engine={"scheduler": "inprocess"}, **settings)
    _fit(trainer, d.X_train, d.y_train, 512)
    assert _rel(trainer, serial) < 1e-9 and trainer.result_.ended in ENDINGS


def _nan_coarse(state, start, stop, level):
    return tuple(np.full_like(a, np.nan) for a in state)


@pytest.mark.parametrize("momentum", [0.5, 0.0])
def test_coarse_propagator_returning_nan_is_handled(momentum):
    X, y = make_linear(128, 4, 1, seed=1)
    settings = dict(batch_size=16, lr=0.01, seed=1, sgd={"momentum": momentum})
    serial = SerialTrainer((8,), **settings).fit(X, y, steps=64)
    trainer = MGRITTrainer(
        (8,), solver={"levels": 3, "cfactor": 4, "coarse": _nan_coarse}, engine={"scheduler": "inprocess"}, **settings
    )
    caught = _fit(trainer, X, y, 64)
    assert _rel(trainer, serial) < 1e-9
    # without momentum the state carries no velocity: the serial finish's last step gives it
    for a, b in zip(trainer.velocity_, serial.velocity_, strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-12 * np.abs(b).max())
    assert trainer.result_.ended == "serial-fallback" and caught
    changes = [a.change for a in trainer.result_.adaptations]
    assert changes[0] == "" and "levels=2" in changes and changes[-1] == "serial"


def test_converged_run_records_one_attempt():
    X, y = make_linear(128, 4, 1, seed=0)
    settings = dict(batch_size=16, lr=1e-3, seed=0)
    serial = SerialTrainer((8,), **settings).fit(X, y, steps=64)
    trainer = MGRITTrainer((8,), solver={"levels": 2, "cfactor": 4}, engine={"scheduler": "inprocess"}, **settings)
    _fit(trainer, X, y, 64)
    assert trainer.result_.ended == "converged" and trainer.result_.converged
    assert [a.outcome for a in trainer.result_.adaptations] == ["converged"]
    assert _rel(trainer, serial) < 1e-9
    # the converged attempt's task graphs stay, so the work model can be scheduled on a few workers
    result = trainer.result_
    assert len(result.graphs) == result.iterations
    assert result.speedup(1) < result.speedup(4) <= result.speedup()


def test_unstable_serial_training_still_raises():
    X, y = make_linear(128, 4, 1, seed=0)
    trainer = MGRITTrainer(
        (8,),
        batch_size=16,
        lr=50.0,
        solver={"levels": 2, "cfactor": 4},
        engine={"scheduler": "inprocess"},
        sgd={"momentum": 0.9},
    )
    with pytest.raises(TrainingDiverged):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", MGRITDidNotPay)
            trainer.fit(X, y, steps=64)
    assert not hasattr(trainer, "model_")
    with pytest.raises(TrainingDiverged):
        SerialTrainer((8,), batch_size=16, lr=50.0, sgd={"momentum": 0.9}).fit(X, y, steps=64)


#: (what serial says, scale of X, settings) of runs that diverge for either cause, and one whose
#: loss overflows a step before its weights do
DIVERGING = [
    ("the weights", 100.0, dict(lr=1e306, batch_size=16, seed=0, sgd={"momentum": 0.9})),
    ("the loss or its gradients", 1.0, dict(lr=50.0, batch_size=16, seed=0, sgd={"momentum": 0.9})),
    ("the loss or its gradients", 1.0, dict(lr=5.0, batch_size=16, seed=0, sgd={"momentum": 0.0})),
]


@pytest.mark.parametrize("solve", ["predict", "force"])
@pytest.mark.parametrize("what,scale,kwargs", DIVERGING, ids=["weights", "loss", "loss-first"])
def test_unstable_serial_training_names_the_step_and_cause_serial_names(solve, what, scale, kwargs):
    X, y = make_linear(128, 4, 1, seed=0)
    with pytest.raises(TrainingDiverged) as want:
        SerialTrainer((8,), **kwargs).fit(X * scale, y, steps=64)
    assert want.value.what == what  # the run diverges for the cause it is meant to
    trainer = MGRITTrainer((8,), **kwargs, solver={"levels": 2, "cfactor": 4}, engine={"scheduler": "inprocess"})
    with dask.config.set({"daskann.mgrit.solve": solve}), pytest.raises(TrainingDiverged) as got:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", MGRITDidNotPay)
            trainer.fit(X * scale, y, steps=64)
    assert type(got.value) is TrainingDiverged and str(got.value) == str(want.value)


def test_grid_bench_rows_and_table():
    from click.testing import CliRunner

    from daskann.bench import mgrit_grid as grid
    from daskann.mgrit.cli import bench_command

    rows = grid.run_grid(steps=32, problems=("linear",), lrs=(1e-3,), momenta=(0.0,), log=None)
    assert len(rows) == 1 and rows[0]["ended"] in ENDINGS and rows[0]["error"] < 1e-9
    assert "| linear | solver2 | 0.001 | 0 |" in grid.markdown(rows)
    out = CliRunner().invoke(bench_command, ["--help"])
    assert out.exit_code == 0 and "--grid" in out.output
