"""The MGRIT solver: cycles against an independent implementation, exactness, two-level theory, bad options."""

from __future__ import annotations

import math

import numpy as np
import pytest
from conftest import no_tasks_submitted
from mgrit_problems import _flat, _problem, _rel, _serial
from reference_mgrit import reference_mgrit

from daskann.mgrit import (
    MGRIT,
    FunctionPropagator,
    MGRITDiverged,
    Propagator,
    PropagatorError,
    linear,
    stable_alpha_cap,
)

# -- cycles against an independent FAS-MGRIT -----------------------------------------------------------------


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


# -- training problems ---------------------------------------------------------------------------------------


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


def test_a_solve_driven_through_its_public_options_continues_from_its_last_iterate():
    """What the adaptive fit does: stop one solve early, start the next from the iterate it kept."""
    X, y, net, prop = _problem(
        coarse=lambda state, start, stop, level: tuple(0.5 * a for a in state), lr=0.01, momentum=0.9
    )
    n, m = 64, 4
    serial = _serial(X, y, n, lr=0.01, momentum=0.9)
    options = dict(levels=2, cfactor=m, tol=1e-300, divergence_factor=None)
    first = MGRIT(prop, prop.initial_state(net), n, max_iter=3, **options)
    assert first.check()["max_iter"] == 3 and first.last_iterate_ is None  # checked, nothing run
    result = first.solve()
    rows, norms = first.last_iterate_
    assert result.status == "max_iter" and rows.shape[0] == n // m and len(norms) == n // m
    # FCF makes two more C-points exact per iteration: three iterations, then five from where they ended
    second = MGRIT(prop, prop.initial_state(net), n, max_iter=5, initial_cpoints=rows, **options)
    fresh = MGRIT(prop, prop.initial_state(net), n, max_iter=5, **options)
    errors = []
    for solver in (second, fresh):
        model, _ = prop.split(solver.solve().state)
        errors.append(_rel(_flat(model.params), _flat(serial.model_.params)))
    assert errors[0] < 1e-13 and errors[1] > 1e-6, errors


def test_a_stall_criterion_fails_the_solve_with_its_iterate_kept():
    X, y, net, prop = _problem(
        coarse=lambda state, start, stop, level: tuple(0.5 * a for a in state), lr=0.01, momentum=0.9
    )
    seen = []

    def stall(residuals, tol):
        seen.append(len(residuals))
        return len(residuals) == 2

    solver = MGRIT(prop, prop.initial_state(net), 64, levels=2, cfactor=4, tol=1e-300, stall=stall)
    with pytest.raises(MGRITDiverged, match="stalled") as info:
        solver.solve()
    assert info.value.stalled and seen == [1, 2]
    rows, norms = solver.last_iterate_
    assert rows.shape[0] == 16 and len(norms) == 16
    with pytest.raises(TypeError, match="stall="):
        MGRIT(prop, prop.initial_state(net), 64, stall="yes").check()


def test_auto_alpha_cap_follows_the_learning_rate():
    caps = [_problem(lr=lr, alpha_cap="auto")[3].alpha_cap for lr in (1e-3, 1e-2)]
    assert 5 < caps[0] / caps[1] < 20 and caps[1] >= 1.0
    # with momentum the same coarse step stands for fewer fine steps: lr * c_w(alpha) stays below the limit
    assert stable_alpha_cap(1e-3, 0.9, 10.0) < stable_alpha_cap(1e-3, 0.0, 10.0)
    assert stable_alpha_cap(1e-3, 0.0, 10.0) == pytest.approx(2 * 0.5 / (1e-3 * 10.0))


# -- linear problems against two-level theory ----------------------------------------------------------------


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


# -- divergence and bad input --------------------------------------------------------------------------------


def test_residual_growth_is_reported_with_level_and_step():
    prop = FunctionPropagator(lambda s, i: (1.01 * s[0],), lambda s, a, b, lvl: (-3.0 * s[0],))
    with pytest.raises(MGRITDiverged, match="residual grew") as info:
        MGRIT(prop, (np.ones(2),), 64, levels=2, cfactor=4, max_iter=30, divergence_factor=10).solve()
    assert info.value.level == 0 and info.value.step % 4 == 0


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


def test_propagator_contract_is_abstract():
    with pytest.raises(TypeError):
        Propagator()
