"""MGRITTrainer: converged training equals serial training, divergence is an error, history, bad input."""

from __future__ import annotations

import time

import numpy as np
import pytest
from conftest import no_tasks_submitted
from mgrit_problems import _flat, _rel, _serial

from daskann import TrainingDiverged
from daskann.data import make_linear
from daskann.mgrit import MGRITDiverged, MGRITNotConverged, MGRITTrainer
from daskann.mgrit.presets import resolve_preset

# these tests study the solver on problems too small for MGRIT to pay
pytestmark = pytest.mark.usefixtures("mgrit_study")

# -- converged training equals serial training ---------------------------------------------------------------


ACCEPT = {0.0: 1e-3, 0.9: 1e-4}  # learning rates: the same effective step lr / (1 - momentum)


@pytest.fixture(scope="module")
def train_data():
    return make_linear(256, 8, 1, seed=0)


@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_converged_training_equals_serial_on_every_scheduler(momentum, train_data, cluster_factory):
    """512 steps, 3 levels, coarsening 4, float64: the weights of serial training to 1e-9."""
    X, y = train_data
    lr = ACCEPT[momentum]
    serial = _serial(X, y, 512, lr=lr, momentum=momentum, hidden=(8,))
    ref = _flat(serial.model_.params + serial.velocity_)
    common = dict(
        lr=lr,
        batch_size=16,
        seed=0,
        solver={"levels": 3, "cfactor": 4, "tol": 1e-9, "max_iter": 30},
        sgd={"momentum": momentum},
    )
    runs = {}
    schedulers = [
        ("2 workers", dict(client=cluster_factory(2))),
        ("threads", dict(engine={"scheduler": "threads"})),
        ("1 worker", dict(client=cluster_factory(1))),
    ]
    if momentum == 0.0:
        schedulers.append(("in-process", dict(engine={"scheduler": "inprocess"})))
    for name, kwargs in schedulers:
        start = time.perf_counter()
        engine = {"intervals_per_task": 32, **kwargs.pop("engine", {})}
        t = MGRITTrainer((8,), **common, engine=engine, **kwargs).fit(X, y, steps=512)
        runs[name] = t
        error = _rel(_flat(t.model_.params + t.velocity_), ref)
        print(
            f"momentum {momentum} {name}: {t.n_iter_} iterations, {time.perf_counter() - start:.1f} s, "
            f"relative error {error:.1e}"
        )
        assert t.result_.converged and error < 1e-9, name
    # nothing depends on the scheduler or the number of workers: same residuals, same bits
    first = runs["2 workers"]
    for t in runs.values():
        assert t.result_.residuals == first.result_.residuals
        assert all(
            np.array_equal(a, b)
            for a, b in zip(t.model_.params + t.velocity_, first.model_.params + first.velocity_, strict=True)
        )
    assert first.result_.executor == "distributed" and runs["threads"].result_.executor == "threads"


def test_inprocess_solve_gives_the_cluster_bits_under_a_threaded_blas(client2):
    """A wide input layer, whose product a multi-threaded OpenBLAS blocks differently from a single-threaded one:
    the in-process solve in a process with two BLAS threads gives the bits of the cluster (one BLAS thread a worker)."""
    from threadpoolctl import threadpool_limits

    rng = np.random.default_rng(0)
    X, y = rng.standard_normal((256, 784)), rng.integers(0, 3, 256)
    common = dict(lr=1e-3, batch_size=64, seed=0, solver={"levels": 2, "cfactor": 4}, loss="cross_entropy")
    with threadpool_limits(2, user_api="blas"):
        local = MGRITTrainer((64,), **common, engine={"scheduler": "inprocess"}).fit(X, y, steps=16)
    cluster = MGRITTrainer((64,), **common, client=client2).fit(X, y, steps=16)
    assert cluster.result_.executor == "distributed"
    assert local.result_.residuals == cluster.result_.residuals
    assert all(np.array_equal(a, b) for a, b in zip(local.model_.params, cluster.model_.params, strict=True))


@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_relative_stopping_preset_still_equals_serial(momentum, train_data):
    """solver4 (solver2's cycles, also stopping at a 1e-9 relative residual reduction): same acceptance setting,
    the weights of serial training to 1e-9, never more iterations than solver2 and the same residual history."""
    X, y = train_data
    lr = ACCEPT[momentum]
    serial = _serial(X, y, 512, lr=lr, momentum=momentum, hidden=(8,))
    ref = _flat(serial.model_.params + serial.velocity_)
    common = dict(
        lr=lr,
        batch_size=16,
        seed=0,
        solver={"levels": 3, "cfactor": 4, "max_iter": 30},
        engine={"scheduler": "inprocess"},
        sgd={"momentum": momentum},
    )
    assert resolve_preset("solver4") == resolve_preset("solver2", rtol=1e-9)
    relative = MGRITTrainer((8,), preset="solver4", **common).fit(X, y, steps=512)
    absolute = MGRITTrainer((8,), preset="solver2", **common).fit(X, y, steps=512)
    error = _rel(_flat(relative.model_.params + relative.velocity_), ref)
    print(
        f"momentum {momentum}: solver4 {relative.n_iter_} iterations (solver2 {absolute.n_iter_}), "
        f"relative error {error:.1e}"
    )
    assert relative.result_.converged and error < 1e-9
    assert relative.n_iter_ <= absolute.n_iter_
    assert relative.result_.residuals == absolute.result_.residuals[: relative.n_iter_]
    assert (
        relative.result_.residuals[-1] <= 1e-9 * relative.result_.residuals[0] or relative.result_.residuals[-1] <= 1e-9
    )


def test_unstable_configuration_is_an_error_not_a_result(train_data):
    X, y = train_data
    # uncapped coarse learning rate (lr * 16 on level 2) with momentum 0.9: beyond SGD's stability region
    trainer = MGRITTrainer(
        (8,),
        lr=0.01,
        batch_size=16,
        preset="solver1",
        # the strict solver; the adaptive default is tests/test_mgrit_adaptive.py
        solver={"levels": 3, "cfactor": 4, "max_iter": 20, "require_convergence": True},
        engine={"scheduler": "inprocess"},
        sgd={"momentum": 0.9},
    )
    with pytest.raises(MGRITDiverged) as info:
        trainer.fit(X, y, steps=512)
    assert isinstance(info.value, TrainingDiverged)
    assert 0 <= info.value.level < 3 and 0 < info.value.step <= 512
    assert f"level {info.value.level}" in str(info.value) and f"step {info.value.step}" in str(info.value)
    assert not hasattr(trainer, "model_")
    # the capped coarse step does not rescue it (the fine level's momentum oscillation): an error as well
    capped = MGRITTrainer(
        (8,),
        lr=0.01,
        batch_size=16,
        preset="solver2",
        solver={"levels": 3, "cfactor": 4, "max_iter": 8, "require_convergence": True},
        engine={"scheduler": "inprocess"},
        sgd={"momentum": 0.9},
    )
    with pytest.raises((MGRITDiverged, MGRITNotConverged)):
        capped.fit(X, y, steps=512)
    assert not hasattr(capped, "model_")


# -- history, parameters, bad input --------------------------------------------------------------------------


def test_trainer_history_params_and_not_converged(train_data):
    X, y = train_data
    t = MGRITTrainer(
        (8,),
        lr=1e-3,
        batch_size=16,
        solver={"levels": 2, "cfactor": 4, "compute_error": True, "tol": 1e-10},
        engine={"scheduler": "inprocess"},
    )
    assert t.get_params()["preset"] == "solver2" and t.set_params(solver__levels=3).solver["levels"] == 3
    t.set_params(solver__levels=2)
    t.fit(X, y, steps=64, validation_data=(X[:64], y[:64]))
    h = t.history_
    assert list(h.sizes) == ["iteration"] and h.sizes["iteration"] == t.n_iter_
    assert {"residual", "time", "error", "val_loss"} <= set(h.data_vars)
    assert h["residual"].attrs["units"] == "1" and h["error"].values[-1] < 1e-9
    assert h.attrs["mgrit_levels"] == 2 and h.attrs["method"] == "mgrit"
    # the adaptive default falls back to serial instead
    strict = {"levels": 2, "cfactor": 4, "max_iter": 1, "require_convergence": True}
    with pytest.raises(MGRITNotConverged, match="max_iter=1"):
        MGRITTrainer((8,), lr=1e-3, batch_size=16, solver=strict, engine={"scheduler": "inprocess"}).fit(X, y, steps=64)


def test_trainer_bad_input_fails_before_any_task(train_data, client2):
    X, y = train_data
    for kwargs, name in [
        (dict(solver={"cfactor": 1}), r"solver\['cfactor'\]"),
        (dict(solver={"levels": 9}), r"solver\['levels'\]"),
        (dict(solver={"tol": 0.0}), r"solver\['tol'\]"),
        (dict(solver={"max_iter": 0}), r"solver\['max_iter'\]"),
        (dict(solver={"cfactr": 2}), r"solver\['cfactr'\]"),
        (dict(solver={"divergence_factor": 0.5}), r"solver\['divergence_factor'\]"),
        (dict(preset="solver9"), "preset"),
        (dict(engine={"scheduler": "gpu"}), r"engine\['scheduler'\]"),
        (dict(engine={"intervals_per_task": 0}), r"engine\['intervals_per_task'\]"),
        (dict(engine={"timeout": -1.0}), r"engine\['timeout'\]"),
    ]:
        solver = {"compute_error": True, **kwargs.pop("solver", {})}
        with no_tasks_submitted(client2), pytest.raises(ValueError, match=f"{name}="):
            MGRITTrainer((8,), client=client2, solver=solver, **kwargs).fit(X, y, steps=64)
