"""MGRIT over training steps: solver semantics, theory, exactness, training against serial, store, inputs."""

from __future__ import annotations

import json
import math
import pickle
import re
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import zarr
from click.testing import CliRunner
from conftest import no_tasks_submitted, run_notebook

from daskann import SerialTrainer, StoreError, TrainingDiverged
from daskann.data import BatchOrder, make_linear
from daskann.mgrit import (
    MGRIT,
    FunctionPropagator,
    MGRITDiverged,
    MGRITNotConverged,
    MGRITTrainer,
    Propagator,
    PropagatorError,
    SGDPropagator,
    linear,
    stable_alpha_cap,
    workmodel,
)
from daskann.mgrit.presets import resolve_preset
from daskann.nn import MLP

ROOT = Path(__file__).resolve().parent.parent


def _rel(a, b):
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def _flat(arrays):
    return np.concatenate([np.ravel(a) for a in arrays])


# -- an independent FAS-MGRIT with full storage, written after pymgrit's Mgrit ----------------------------


def reference_mgrit(phis, u0, n, levels, m, *, cf_iter, cycle, iterations):
    """Residual history of pymgrit-style MGRIT (all points stored, point lists, no tasks)."""
    sizes = [n // m**lvl for lvl in range(levels)]
    u = [[u0.copy() for _ in range(sizes[lvl] + 1)] for lvl in range(levels)]
    g = [[np.zeros_like(u0) for _ in range(sizes[lvl] + 1)] for lvl in range(levels)]
    v = [[None] * (sizes[lvl] + 1) for lvl in range(levels)]

    def f_relax(lvl):
        for p in range(1, sizes[lvl] + 1):
            if p % m:
                u[lvl][p] = g[lvl][p] + phis[lvl](u[lvl][p - 1], p - 1)

    def c_relax(lvl):
        for p in range(m, sizes[lvl] + 1, m):
            u[lvl][p] = g[lvl][p] + phis[lvl](u[lvl][p - 1], p - 1)

    def iteration(lvl, kind):
        if lvl == levels - 1:
            for p in range(1, sizes[lvl] + 1):
                u[lvl][p] = g[lvl][p] + phis[lvl](u[lvl][p - 1], p - 1)
            return
        f_relax(lvl)
        for _ in range(cf_iter):
            c_relax(lvl)
            f_relax(lvl)
        for q in range(sizes[lvl + 1] + 1):
            v[lvl + 1][q] = u[lvl][q * m].copy()
            u[lvl + 1][q] = u[lvl][q * m].copy()
        for q in range(1, sizes[lvl + 1] + 1):
            r = g[lvl][q * m] + phis[lvl](u[lvl][q * m - 1], q * m - 1) - u[lvl][q * m]
            g[lvl + 1][q] = r + v[lvl + 1][q] - phis[lvl + 1](v[lvl + 1][q - 1], q - 1)
        iteration(lvl + 1, kind)
        for q in range(1, sizes[lvl + 1] + 1):
            u[lvl][q * m] = u[lvl][q * m] + (u[lvl + 1][q] - v[lvl + 1][q])
        f_relax(lvl)
        if lvl > 0 and kind == "F":
            iteration(lvl, "V")

    history = []
    for _ in range(iterations):
        iteration(0, cycle)
        history.append(
            math.sqrt(sum(float(np.sum((phis[0](u[0][p - 1], p - 1) - u[0][p]) ** 2)) for p in range(m, n + 1, m)))
        )
    return history


def _decay_problem(dim=3, lam=0.95):
    rates = np.linspace(0.8, lam, dim)

    def phi(state, i):
        return (rates * state[0],)

    def coarse(state, start, stop, level):
        return ((1.0 - (1.0 - rates) * (stop - start)) * state[0],)

    def levels_phi(m, levels):
        return [lambda x, p: rates * x] + [
            (lambda span: lambda x, p: (1.0 - (1.0 - rates) * span) * x)(m**lvl) for lvl in range(1, levels)
        ]

    return FunctionPropagator(phi, coarse), levels_phi


@pytest.mark.parametrize("levels,m,cf_iter,cycle", [(2, 4, 1, "V"), (3, 4, 0, "V"), (3, 2, 1, "F"), (4, 2, 2, "F")])
def test_cycles_match_an_independent_fas_implementation(levels, m, cf_iter, cycle):
    prop, level_phis = _decay_problem()
    result = MGRIT(
        prop, (np.ones(3),), 64, levels=levels, cfactor=m, cf_iter=cf_iter, cycle_type=cycle, tol=1e-300, max_iter=5
    ).solve()
    expected = reference_mgrit(
        level_phis(m, levels), np.ones(3), 64, levels, m, cf_iter=cf_iter, cycle=cycle, iterations=5
    )
    np.testing.assert_allclose(result.residuals, expected, rtol=1e-9, atol=1e-16)


@pytest.mark.parametrize("cycle", ["V", "F"])
def test_nested_iteration_and_weights_converge_to_the_serial_solution(cycle):
    prop = linear.LinearPropagator.random_stable(4, seed=2)
    exact = prop.exact_cpoints(np.ones(4), 128, 2)[-1]
    plain = MGRIT(prop, (np.ones(4),), 128, levels=4, cfactor=2, cycle_type=cycle, tol=1e-12).solve()
    nested = MGRIT(
        prop,
        (np.ones(4),),
        128,
        levels=4,
        cfactor=2,
        cycle_type=cycle,
        tol=1e-12,
        nested_iteration=True,
        weight_c=[1.0, 1.2, 1.2],
        t_norm=np.inf,
    ).solve()
    for result in (plain, nested):
        assert result.converged and np.allclose(result.state[0], exact, rtol=1e-10, atol=0)
    assert nested.residuals[0] < plain.residuals[0]  # the coarse levels' solution is a better start


def test_one_level_is_serial_bitwise():
    rng = np.random.default_rng(0)
    A = rng.standard_normal((4, 4)) * 0.3

    def phi(state, i):
        return (np.tanh(A @ state[0] + 0.01 * i),)

    u = np.ones(4)
    serial = [u]
    for i in range(37):
        serial.append(phi((serial[-1],), i)[0])
    result = MGRIT(phi, (u,), 37, levels=1, store_fine=True).solve()
    assert result.converged and result.iterations == 1
    assert np.array_equal(result.state[0], serial[-1])
    assert np.array_equal(result.fine_points, np.array(serial))


# -- training problems -------------------------------------------------------------------------------------


def _problem(n_samples=256, momentum=0.0, lr=1e-3, hidden=(16, 16), batch_size=16, **kwargs):
    X, y = make_linear(n_samples, 8, 1, seed=0)
    net = MLP((8, *hidden, 1), seed=0)
    order = BatchOrder(n_samples, batch_size, seed=0)
    prop = SGDPropagator(net, X, y, loss="mse", order=order, lr=lr, momentum=momentum, **kwargs)
    return X, y, net, prop


def _serial(X, y, steps, *, lr, momentum, hidden=(16, 16), batch_size=16):
    return SerialTrainer(hidden, lr=lr, batch_size=batch_size, seed=0, sgd={"momentum": momentum}).fit(
        X, y, steps=steps
    )


def test_fine_propagator_is_the_serial_step():
    X, y, net, prop = _problem(momentum=0.9, lr=0.01)
    serial = _serial(X, y, 5, lr=0.01, momentum=0.9)
    state = prop.initial_state(net)
    for i in range(5):
        state = prop.step(state, i, i + 1, 0)
    model, velocity = prop.split(state)
    for a, b in zip(model.params + velocity, serial.model_.params + serial.velocity_, strict=True):
        assert np.array_equal(a, b)


@pytest.mark.parametrize("cf_iter", [0, 1])
def test_exactness_two_levels_any_coarse_propagator(cf_iter):
    """XBraid's property: F-relaxation makes one more C-point exact per iteration, FCF two."""
    X, y, net, prop = _problem(
        coarse=lambda state, start, stop, level: tuple(0.5 * a for a in state), lr=0.01, momentum=0.9
    )
    n, m = 64, 4
    serial = _serial(X, y, n, lr=0.01, momentum=0.9)
    exact_after = (n // m) if cf_iter == 0 else -(-(n // m) // 2)
    errors = []

    def record(info):
        model, _ = prop.split(info.state)
        errors.append(_rel(_flat(model.params), _flat(serial.model_.params)))

    MGRIT(
        prop,
        prop.initial_state(net),
        n,
        levels=2,
        cfactor=m,
        cf_iter=cf_iter,
        tol=1e-300,
        max_iter=exact_after,
        divergence_factor=None,
        callback=record,
    ).solve()
    assert errors[-1] < 1e-13, errors
    assert errors[-2] > 1e-6, "the coarse propagator is so poor that one iteration less is not exact"


# -- linear problems against two-level theory ------------------------------------------------------------


@pytest.mark.parametrize("cf_iter", [0, 1])
@pytest.mark.parametrize("problem", ["dahlquist", "matrix"])
def test_linear_convergence_agrees_with_two_level_theory(problem, cf_iter):
    m, n = 4, 256
    if problem == "dahlquist":
        prop = linear.LinearPropagator.dahlquist(-0.05 * 4, dt=0.25)
    else:
        prop = linear.LinearPropagator.random_stable(6, seed=3)
    n_c = n // m
    bound = linear.two_level_bound(
        prop.fine_eigenvalues(), prop.coarse_eigenvalues(m), m, n_c, relaxation="F" if cf_iter == 0 else "FCF"
    )
    u0 = (np.ones(prop.size),)
    exact = prop.exact_cpoints(u0[0], n, m)
    factors = []
    previous = [prop.modal_norm(np.broadcast_to(u0[0], exact.shape) - exact)]

    def record(info):
        err = prop.modal_norm(info.cpoints() - exact)
        factors.append(err / previous[0])
        previous[0] = err

    result = MGRIT(prop, u0, n, levels=2, cfactor=m, cf_iter=cf_iter, tol=1e-12, max_iter=40, callback=record).solve()
    assert result.converged
    assert 0 < bound < 1
    # every iteration contracts the C-point error at least as fast as the bound says ...
    assert max(factors[:-1]) <= bound * (1 + 1e-9), (factors, bound)
    # ... and the solver's iteration count is what the bound predicts, to within a few iterations
    predicted = math.ceil(math.log(1e-12 / result.residuals[0]) / math.log(bound)) + 1
    assert result.iterations <= predicted
    assert max(factors) >= 0.7 * bound, (factors, bound)  # and the bound is nearly attained


# -- converged training equals serial training --------------------------------------------------------------

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


def test_residual_growth_is_reported_with_level_and_step():
    prop = FunctionPropagator(lambda s, i: (1.01 * s[0],), lambda s, a, b, lvl: (-3.0 * s[0],))
    with pytest.raises(MGRITDiverged, match="residual grew") as info:
        MGRIT(prop, (np.ones(2),), 64, levels=2, cfactor=4, max_iter=30, divergence_factor=10).solve()
    assert info.value.level == 0 and info.value.step % 4 == 0


# -- the zarr trajectory store ------------------------------------------------------------------------------


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


# -- bad input ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs,name",
    [
        (dict(cfactor=1), "cfactor"),
        (dict(levels=6, cfactor=4), "levels"),
        (dict(tol=0.0), "tol"),
        (dict(tol=-1e-3), "tol"),
        (dict(max_iter=0), "max_iter"),
        (dict(cf_iter=-1), "cf_iter"),
        (dict(cycle_type="W"), "cycle_type"),
        (dict(weight_c=2.5), "weight_c"),
    ],
)
def test_bad_solver_options_fail_before_any_task(kwargs, name, client2):
    prop = FunctionPropagator(lambda s, i: (0.9 * s[0],))
    with no_tasks_submitted(client2), pytest.raises(ValueError, match=f"{name}="):
        MGRIT(prop, (np.ones(2),), 64, scheduler=client2, **{"levels": 3, "cfactor": 2, **kwargs}).solve()


@pytest.mark.parametrize("bad", ["shape", "dtype", "count"])
def test_propagator_of_another_shape_or_dtype_fails_before_any_task(bad, client2):
    def phi(state, start, stop, level):
        x = state[0]
        return {"shape": (np.ones(3),), "dtype": (x.astype(np.float32),), "count": (x, x)}[bad]

    with no_tasks_submitted(client2), pytest.raises(PropagatorError, match="propagator=") as info:
        MGRIT(
            FunctionPropagator(lambda s, i: (0.5 * s[0],), phi),
            (np.ones(2),),
            16,
            levels=2,
            cfactor=4,
            scheduler=client2,
        ).solve()
    assert info.value.level == 1


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


# -- trainer, work model, data handling ---------------------------------------------------------------------


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


def test_auto_alpha_cap_follows_the_learning_rate():
    caps = [_problem(lr=lr, alpha_cap="auto")[3].alpha_cap for lr in (1e-3, 1e-2)]
    assert 5 < caps[0] / caps[1] < 20 and caps[1] >= 1.0
    # with momentum the same coarse step stands for fewer fine steps: lr * c_w(alpha) stays below the limit
    assert stable_alpha_cap(1e-3, 0.9, 10.0) < stable_alpha_cap(1e-3, 0.0, 10.0)
    assert stable_alpha_cap(1e-3, 0.0, 10.0) == pytest.approx(2 * 0.5 / (1e-3 * 10.0))


def test_work_model_on_a_known_graph():
    class T:
        def __init__(self, key, cost, deps=()):
            self.key, self.cost, self.deps = key, cost, tuple(deps)

    tasks = [T("a", 2), T("b", 3), T("c", 1, ["a", "b"]), T("d", 4, ["a"])]
    assert workmodel.critical_path(tasks) == 6.0
    assert workmodel.makespan(tasks, 1) == workmodel.total_work(tasks) == 10.0
    assert workmodel.makespan(tasks, 2) == 6.0
    assert workmodel.speedup(12, [5.0]) == 2.0


def test_tasks_are_handed_chunks_not_their_neighbours_whole_output(client2, tmp_path):
    from daskann.mgrit._executors import _piece

    prop = linear.LinearPropagator.random_stable(5, seed=1)
    u0 = (np.ones(5),)
    kwargs = dict(levels=3, cfactor=4, tol=1e-13, max_iter=40, intervals_per_task=2)
    ref = MGRIT(prop, u0, 64, scheduler=None, **kwargs).solve()
    got = MGRIT(prop, u0, 64, scheduler=client2, store=tmp_path / "run.zarr", run_id="r", **kwargs).solve()
    assert got.residuals == ref.residuals and np.array_equal(got.state[0], ref.state[0])
    # a piece is the rows of one chunk (here 2 intervals: 2 C-values, or 8 points), as views of the writer's rows
    rows = np.arange(30.0).reshape(6, 5)
    result = {"ok": True, "blocks": [("c0", (1,), 4, 3, rows), ("c0", (2,), 4, 3, rows), ("u1", (), 4, 3, rows)]}
    piece = _piece(result, "c0", (1,), 2, 6)
    assert [(b[0], b[1], b[2]) for b in piece["blocks"]] == [("c0", (1,), 4)]
    assert np.shares_memory(piece["blocks"][0][4], rows) and np.array_equal(piece["blocks"][0][4], rows[:2])
    # a failed writer's result is its failure, handed on as it is
    assert _piece({"ok": False, "level": 0, "order": 3}, "c0", (1,), 2, 6) == {"ok": False, "level": 0, "order": 3}


def test_only_pieces_that_cross_workers_are_tasks_of_their_own():
    from daskann.mgrit._executors import _graph, _homes, _piece, _piece_key, reported
    from daskann.mgrit._levels import Hierarchy
    from daskann.mgrit._plan import Planner

    h = Hierarchy(64, (4, 4))
    options = {"cf_iter": [1, 1], "weight_c": [1.0, 1.0], "cycle_type": "V", "store_fine": False, "blocks": (2, 2)}
    tasks = Planner(h, options, lambda level: 1.0, "p").iteration(1)
    home = _homes(tasks, str, ["tcp://a", "tcp://b"], h.n_steps)
    graph = _graph(tasks, reported(tasks), None, None, home=home)
    crossing = inline = 0
    for t in tasks:
        for arg in graph[t.key][4:]:
            if isinstance(arg, tuple):  # cut inside the task from a result in its own process
                assert arg[0] is _piece and home[arg[1]] == home[t.key]
                inline += 1
            else:  # a task beside the writer: only that chunk moves to this worker
                assert graph[arg][0] is _piece and home[graph[arg][1]] != home[t.key]
                assert arg == _piece_key(*graph[arg][1:])
                crossing += 1
    assert inline > crossing > 0
    # the client fetches the final sweep's results (its rows are in the store), not one summary per task
    assert reported(tasks) == [t for t in tasks if t.final] and len(reported(tasks)) < len(tasks) / 3
    assert not [key for key in graph if key.endswith("-summary")]
    # without workers (threads, sync) every piece is cut inside its task
    assert not [key for key, task in _graph(tasks, reported(tasks), None, None).items() if task[0] is _piece]


_SWEEP_KEY = re.compile(r"-it\d+-\d{4}-L(\d)-(?:[CFR]-q(\d+)|handoff-s(\d+)|coarse)$")


def test_each_worker_relaxes_its_own_range_of_time(client2):
    from distributed import get_task_stream

    from daskann.mgrit._plan import owner

    prop = linear.LinearPropagator.random_stable(5, seed=1)
    u0 = (np.ones(5),)
    kwargs = dict(levels=3, cfactor=4, tol=1e-13, max_iter=40, intervals_per_task=4)
    ref = MGRIT(prop, u0, 64, scheduler=None, **kwargs).solve()
    with get_task_stream(client2) as stream:
        got = MGRIT(prop, u0, 64, scheduler=client2, **kwargs).solve()
    assert got.residuals == ref.residuals and np.array_equal(got.state[0], ref.state[0])
    workers = sorted(client2.scheduler_info(n_workers=-1)["workers"])
    placed = kinds = 0
    for record in stream.data:
        match = _SWEEP_KEY.search(str(record["key"]))
        if match is None:
            continue
        level, q0, start = int(match[1]), match[2], match[3]
        start = int(start) if start is not None else int(q0 or 0) * 4 * 4**level
        assert record["worker"] == workers[owner(start, 64, len(workers))], record["key"]
        placed += 1
        kinds += "handoff" in str(record["key"])
    # every sweep, the coarse solve and the hand-offs of the C-values kept from one iteration to the next
    assert placed > 0 and kinds > 0


def test_kept_cvalues_lost_between_iterations_replan_from_the_store(client2, monkeypatch):
    from daskann.mgrit import _kernels, _run

    prop = linear.LinearPropagator.random_stable(5, seed=1)
    u0 = (np.ones(5),)
    kwargs = dict(levels=3, cfactor=4, tol=1e-13, max_iter=40, intervals_per_task=4)
    ref = MGRIT(prop, u0, 64, scheduler=None, **kwargs).solve()
    replans = []
    original = _run.SolveRun._replan

    def spy(self):
        replans.append(self.iteration)
        return original(self)

    def clear():
        _kernels._KEPT.clear()

    def forget(info):  # as if the workers holding them had been replaced
        if info.iteration == 2:
            client2.run(clear)

    monkeypatch.setattr(_run.SolveRun, "_replan", spy)
    got = MGRIT(prop, u0, 64, scheduler=client2, callback=forget, **kwargs).solve()
    assert replans == [2]
    assert got.residuals == ref.residuals and np.array_equal(got.state[0], ref.state[0])
    assert not any(client2.run(lambda: len(_kernels._KEPT)).values())  # released at the end of the run


def test_task_sizes_give_each_worker_an_even_share():
    from daskann.mgrit._levels import Hierarchy
    from daskann.mgrit._plan import block_sizes, task_sizes

    h = Hierarchy(128, (4, 4))
    blocks = block_sizes(h, "auto")
    # cheap scheduler: two tasks per worker on each level; dear one: one task per worker
    assert task_sizes(h, blocks, lambda level: 1.0, step_seconds=1e-3, task_seconds=1e-4, workers=2) == (8, 2)
    assert task_sizes(h, blocks, lambda level: 1.0, step_seconds=1e-3, task_seconds=1.0, workers=2) == (16, 4)
    assert task_sizes(h, blocks, lambda level: 1.0, step_seconds=1e-3, task_seconds=1.0, workers=1) == (32, 8)


@pytest.mark.parametrize("cf_iter,cycle", [(1, "V"), (1, "F"), (0, "V")])
def test_an_inprocess_solve_touches_fewer_slots_than_a_dask_run(cf_iter, cycle):
    """In-process tasks run once, in order, in place: with FCF relaxation, four C-value slots of the fine level and
    one generation of v/g (less fresh memory to fault in); a dask run keeps five and two."""
    from daskann.mgrit._levels import Hierarchy
    from daskann.mgrit._plan import Planner

    h = Hierarchy(64, (4, 4))
    options = {"cf_iter": (cf_iter,) * 3, "weight_c": (1.0,) * 3, "cycle_type": cycle, "store_fine": False}
    touched = {}
    for sequential in (False, True):
        planner = Planner(h, {**options, "blocks": (4, 1)}, lambda level: 1.0, "p")
        planner.sequential = sequential
        slots, gens = set(), set()
        for k in range(1, 7):
            for task in planner.iteration(k):
                spec = task.spec
                if getattr(spec, "level", None) == 0 and hasattr(spec, "dst"):
                    slots |= {spec.dst} | ({spec.fuse_c} if spec.fuse_c is not None else set())
                if getattr(spec, "restrict", False):
                    gens.add((spec.level + 1, spec.gen_restrict))
        touched[sequential] = (len(slots | {0}), max(sum(g[0] == lvl for g in gens) for lvl in (1, 2)))
    # F-relaxation at the fine level: no C-relaxed copy to keep, and its final sweep corrects and restricts
    assert touched == ({False: (5, 2), True: (4, 1)} if cf_iter else {False: (3, 2), True: (3, 2)})


@pytest.fixture
def released_heap():
    """This process's heap settings as the worker's own, before and after the test (no release pending)."""
    import daskann._heap as heap

    def release():
        if heap._release_timer is not None:
            heap._release_timer.cancel()
        libc = heap._glibc()
        if heap._kept and libc is not None:
            heap._idle_since = float("-inf")
            heap._release(libc)
        heap._release_timer = None

    release()
    yield heap
    release()


def test_heap_scope_with_and_without_the_nannys_trim_setting(monkeypatch, released_heap):
    heap_for_blocks = released_heap.heap_for_blocks

    for trim in (None, "65536"):
        if trim is None:
            monkeypatch.delenv("MALLOC_TRIM_THRESHOLD_", raising=False)
        else:
            monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", trim)
        with heap_for_blocks():
            a = np.ones(2**20)
        assert a.sum() == 2**20


def test_the_heap_is_kept_between_the_tasks_of_a_run(monkeypatch, released_heap):
    """The heap settings outlive a training task by KEEP_SECONDS, so the run's next task finds its memory mapped;
    one pending release serves every task that ends, and it gives the memory back only after a quiet spell."""
    heap = released_heap
    libc = heap._glibc()
    if libc is None or not sys.platform.startswith("linux"):
        pytest.skip("glibc's malloc only")
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "65536")
    monkeypatch.setattr(heap, "KEEP_SECONDS", 60.0)
    assert heap._heap_blocks() == heap.HEAP_BLOCKS  # not in a worker: no memory limit to respect
    with heap.heap_for_blocks():
        block = np.ones(2**22)
    del block
    pending = heap._release_timer
    assert heap._kept and heap._users == 0 and pending is not None and pending.interval == 60.0
    with heap.heap_for_blocks():  # the run's next task: still kept, no second timer
        assert heap._kept
    assert heap._release_timer is pending
    pending.cancel()
    heap._release(libc)  # the timer fires less than KEEP_SECONDS after the last task ended: wait on
    assert heap._kept and heap._release_timer is not None and heap._release_timer is not pending
    heap._release_timer.cancel()
    monkeypatch.setattr(heap, "_idle_since", heap._idle_since - 61.0)  # a quiet spell of KEEP_SECONDS
    heap._release(libc)
    assert not heap._kept and heap._release_timer is None


def test_training_data_travels_once_not_with_every_task(client2, monkeypatch):
    X, y, net, prop = _problem(n_samples=4096, lr=1e-3)
    graphs = []
    original = type(client2).get

    def spy(self, dsk, keys, **kwargs):
        graphs.append(dsk)
        return original(self, dsk, keys, **kwargs)

    monkeypatch.setattr(type(client2), "get", spy)
    result = MGRIT(
        prop,
        prop.initial_state(net),
        32,
        levels=2,
        cfactor=4,
        intervals_per_task=1,
        max_iter=2,
        scheduler=client2,
        tol=1e-300,
    ).solve()
    data_bytes = X.nbytes + y.nbytes
    for graph in graphs:
        for key, task in graph.items():
            assert key.startswith("daskann-mgrit-")
            assert len(pickle.dumps(task[1:])) < data_bytes / 10
    assert result.iterations == 2


# -- command line, demo, notebook ---------------------------------------------------------------------------


def test_train_command_inprocess_json(tmp_path):
    from daskann.mgrit.cli import train_command

    out = CliRunner().invoke(
        train_command,
        [
            "--dataset",
            "linear",
            "--n-samples",
            "160",
            "--n-features",
            "8",
            "--n-outputs",
            "1",
            "--hidden",
            "8",
            "--steps",
            "64",
            "--batch-size",
            "16",
            "--lr",
            "0.001",
            "--levels",
            "2",
            "--coarsening",
            "4",
            "--relaxation",
            "FCF",
            "--cycle",
            "V",
            "--tol",
            "1e-10",
            "--scheduler",
            "inprocess",
            "--compute-error",
            "--json",
            "--output",
            str(tmp_path / "run"),
        ],
    )
    assert out.exit_code == 0, out.output
    summary = json.loads(out.output)
    assert summary["method"] == "mgrit" and summary["converged"] and summary["steps"] == 64
    assert summary["error_vs_serial"] < 1e-9
    assert (tmp_path / "run" / "model.zarr").exists() and (tmp_path / "run" / "history.zarr").exists()
    bad = CliRunner().invoke(train_command, ["--coarsening", "1", "--scheduler", "inprocess", "--steps", "16"])
    assert bad.exit_code != 0 and "--coarsening=1" in bad.output


def test_bench_command_small(tmp_path):
    from daskann.mgrit.cli import bench_command

    out = CliRunner().invoke(
        bench_command,
        [
            "--steps",
            "32,64",
            "--presets",
            "solver2",
            "--cycles",
            "V,F",
            "--coarsest",
            "4",
            "--wall-steps",
            "0",
            "--output",
            str(tmp_path),
            "--json",
        ],
    )
    assert out.exit_code == 0, out.output
    report = json.loads((tmp_path / "mgrit-bench.json").read_text())
    configs = {r["config"] for r in report["study"]}
    assert configs == {"solver2", "solver2/F-cycle"}
    for rec in report["study"]:
        assert rec["status"] == "converged" and rec["error"] < 1e-8 and rec["speedup_unlimited"] > 0
    assert report["machine"]["blas"] is not None
    assert (tmp_path / "mgrit-iterations.png").stat().st_size > 1000
    assert (tmp_path / "mgrit-residuals.png").stat().st_size > 1000


def test_bench_efficiency_reports_both_efficiencies(tmp_path, client2):
    from daskann.mgrit.cli import bench_command

    args = ["--efficiency", "8-16-3", "--wall-steps", "32", "--repeats", "1", "--coarsest", "4"]
    args += ["--address", client2.scheduler.address, "--output", str(tmp_path), "--json"]
    out = CliRunner().invoke(bench_command, args)
    assert out.exit_code == 0, out.output
    (rec,) = json.loads((tmp_path / "mgrit-efficiency.json").read_text())["efficiency"]
    assert rec["sizes"] == [8, 16, 3] and rec["workers"] == 2 and rec["bit_identical"] is True
    # the figures they are made of are in the record, so anyone can recompute them
    assert rec["work_model_efficiency"] == pytest.approx(
        rec["work_units"] * rec["serial_step_seconds"] / rec["inprocess_solve_seconds"]
    )
    assert rec["parallel_efficiency"] == pytest.approx(
        rec["inprocess_solve_seconds"] / (2 * rec["cluster_solve_seconds"])
    )
    assert "later_iterations_efficiency" in rec
    bad = CliRunner().invoke(bench_command, ["--efficiency", "8-x-3", "--output", str(tmp_path)])
    assert bad.exit_code != 0 and "efficiency" in bad.output


def test_later_iterations_efficiency_leaves_out_the_first_two():
    from types import SimpleNamespace

    from daskann.bench.mgrit import _later_iterations

    result = SimpleNamespace(work=[10.0, 8.0, 8.0, 8.0], iteration_times=[5.0, 4.0, 1.0, 1.0])
    assert _later_iterations(result, 0.25) == pytest.approx(16 * 0.25 / 2.0)
    assert math.isnan(_later_iterations(SimpleNamespace(work=[10.0, 8.0], iteration_times=[5.0, 4.0]), 0.25))


def test_demo_quick(client2):
    from daskann.mgrit.demo import run_demo

    summary = run_demo(client2, quick=True)
    assert summary["method"] == "mgrit" and summary["converged"]
    assert summary["iterations"] >= 1 and summary["error_vs_serial"] < 1e-9


def test_example_notebook_runs():
    nb = run_notebook(ROOT / "examples" / "mgrit.ipynb", timeout=300)
    assert any(cell.get("outputs") for cell in nb.cells if cell.cell_type == "code")


def test_propagator_contract_is_abstract():
    with pytest.raises(TypeError):
        Propagator()


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
