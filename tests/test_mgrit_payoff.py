"""Whether MGRIT pays: the prediction before the solve, the pilot, the bound on its cost and the setting."""

from __future__ import annotations

import json
import math
import warnings

import dask
import numpy as np
import pytest
from conftest import no_tasks_submitted

from daskann import SerialTrainer
from daskann.data import load_dataset, make_linear
from daskann.exceptions import MGRITDidNotPay
from daskann.mgrit import MGRIT, MGRITTrainer, _payoff, linear

DIGITS = dict(loss="cross_entropy", batch_size=32, epochs=10)  # the README's example: 440 steps


@pytest.fixture(scope="module")
def digits():
    data = load_dataset("digits")
    return data.X_train, data.y_train


def _fit_recording(trainer, X, y, **kwargs):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(X, y, **kwargs)
    return [w for w in caught if issubclass(w.category, MGRITDidNotPay)]


@pytest.mark.parametrize("lr,momentum", [(0.1, 0.9), (0.1, 0.0), (0.01, 0.0)])
def test_a_net_too_small_trains_serially_without_a_task(digits, client2, lr, momentum):
    X, y = digits
    settings = dict(DIGITS, lr=lr, sgd={"momentum": momentum})
    serial = SerialTrainer((64,), **settings).fit(X, y)
    trainer = MGRITTrainer((64,), **settings, client=client2)
    with no_tasks_submitted(client2):  # in-memory data: serial training runs here, nothing reaches the cluster
        caught = _fit_recording(trainer, X, y)
    assert len(caught) == 1
    text = str(caught[0].message)
    assert "MGRIT would not pay, so the fit trains serially: its predicted speedup over serial training is" in text
    assert "on 2 worker(s)" in text and "too few workers" in text and "a gain is possible from" in text
    assert ("momentum 0.9 at lr 0.1" in text) == (momentum > 0)
    # serial training's weights, bit for bit
    for got, want in zip(trainer.model_.params, serial.model_.params, strict=True):
        np.testing.assert_array_equal(got, want)
    result = trainer.result_
    assert result.ended == "serial-predicted" and result.iterations == 0 and not result.converged
    assert result.forecast["stage"] == "before" and result.forecast["policy"] == "predict"
    assert result.forecast["workers"] == 2 and 0 < result.forecast["speedup"] < 1 and not result.forecast["pays"]
    assert [a.outcome for a in result.adaptations] == ["serial"]
    attrs = trainer.history_.attrs
    assert attrs["mgrit_ended"] == "serial-predicted"
    assert json.loads(attrs["mgrit_forecast"])["reason"] == result.forecast["reason"]
    assert trainer.n_steps_ == 440 and trainer.predict(X[:5]).shape == (5,)


def test_the_bound_counts_workers_and_steps():
    options = MGRITTrainer()._levels_for(MGRITTrainer()._solver_options(), 440)
    step = 1e-4
    two = _payoff.forecast(options, 440, 2, step, scheduler="distributed", lr=0.01, momentum=0.0)
    many = _payoff.forecast(options, 440, 256, step, scheduler="distributed", lr=0.01, momentum=0.0)
    assert not two.pays and "too few workers" in two.reason
    assert many.mgrit_seconds < two.mgrit_seconds and many.pays
    # the workers it names are where the same bound passes serial training
    named = int(two.advice.split("a gain is possible from ")[1].split(" workers")[0])
    assert _payoff.forecast(options, 440, named, step, scheduler="distributed", lr=0.01, momentum=0.0).pays
    assert not _payoff.forecast(options, 440, named // 2, step, scheduler="distributed", lr=0.01, momentum=0.0).pays
    # in this process (one worker) MGRIT never pays: an iteration does several serial trainings' work
    one = _payoff.forecast(options, 440, 1, step, scheduler="inprocess", lr=0.01, momentum=0.0)
    assert not one.pays and one.mgrit_seconds > 2 * one.serial_seconds
    # a dask scheduler's cost per task: tiny steps on many workers lose to it
    tiny = _payoff.forecast(options, 440, 4096, 1e-7, scheduler="distributed", lr=0.01, momentum=0.0)
    assert not tiny.pays and "too few steps" in tiny.reason


def test_the_bound_is_below_the_work_model_of_a_real_solve():
    X, y = make_linear(256, 4, 1, seed=0)
    trainer = MGRITTrainer((8,), lr=1e-3, batch_size=16, engine={"scheduler": "inprocess"})
    with dask.config.set({"daskann.mgrit.solve": "study"}), warnings.catch_warnings():
        warnings.simplefilter("ignore", MGRITDidNotPay)
        trainer.fit(X, y, steps=256)
    result = trainer.result_
    shape = _payoff.iteration_shape(trainer._levels_for(trainer._solver_options(), 256), 256)
    assert shape.work == pytest.approx(result.work[-1])  # the solver's own graphs
    assert shape.fixed_path + shape.coarsest_points * shape.coarsest_cost <= min(result.critical_path) + 1e-9


def test_the_pilot_stops_a_solve_its_first_iterations_say_will_not_pay(digits, monkeypatch):
    X, y = digits
    settings = dict(DIGITS, lr=0.01, epochs=2)

    def optimistic(*args, **kwargs):  # the bound lets the solve start; the pilot must stop it
        return _payoff.Forecast("before", 1e-3, 1e-4, 2.0, 1, 1e-6, True)

    monkeypatch.setattr(_payoff, "forecast", optimistic)
    monkeypatch.setattr(_payoff, "cost_lost", lambda spent, serial: False)
    trainer = MGRITTrainer((64,), **settings, engine={"scheduler": "inprocess"})
    caught = _fit_recording(trainer, X, y)
    assert len(caught) == 1 and "predicted from its first iterations" in str(caught[0].message)
    result = trainer.result_
    assert result.ended == "serial-predicted" and result.iterations == _payoff.MIN_ITERATIONS
    assert result.forecast["pilot"]["stage"] == "pilot" and not result.forecast["pilot"]["pays"]
    assert [a.outcome for a in result.adaptations] == ["stopped", "serial"]
    serial = SerialTrainer((64,), **settings).fit(X, y)
    for got, want in zip(trainer.model_.params, serial.model_.params, strict=True):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)


def test_a_forced_solve_stops_once_it_costs_more_than_serial_training(digits):
    X, y = digits
    settings = dict(DIGITS, lr=0.01)
    trainer = MGRITTrainer((64,), **settings, engine={"scheduler": "inprocess"})
    with dask.config.set({"daskann.mgrit.solve": "force"}):
        caught = _fit_recording(trainer, X, y)
    result = trainer.result_
    # one in-process iteration of this net does several serial trainings' work: the first one loses already
    assert result.ended == "serial-fallback" and result.iterations == 1
    assert [a.outcome for a in result.adaptations] == ["stopped", "serial"]
    assert "more than serial training's" in result.adaptations[0].reason
    assert result.forecast["policy"] == "force" and "more than serial training's" in result.forecast["stopped"]
    assert len(caught) == 1 and "did not pay" in str(caught[0].message)
    serial = SerialTrainer((64,), **settings).fit(X, y)
    for got, want in zip(trainer.model_.params, serial.model_.params, strict=True):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)


def test_study_and_strict_fits_solve_whatever_the_prediction(digits):
    X, y = digits
    settings = dict(DIGITS, lr=0.01, epochs=1)  # 44 steps
    study = MGRITTrainer((64,), **settings, engine={"scheduler": "inprocess"})
    with dask.config.set({"daskann.mgrit.solve": "study"}):
        _fit_recording(study, X, y)
    assert study.result_.ended in ("converged", "adapted") and study.result_.iterations > 2
    assert not study.result_.forecast["pays"]  # predicted, recorded, not acted on
    strict = MGRITTrainer((64,), **settings, solver={"require_convergence": True}, engine={"scheduler": "inprocess"})
    strict.fit(X, y)
    assert strict.result_.converged and strict.result_.forecast is None
    assert strict.n_iter_ == study.n_iter_


@pytest.mark.parametrize("value", ["yes", True, 1, None, "Force"])
def test_a_bad_setting_fails_before_any_task(digits, client2, value):
    X, y = digits
    with dask.config.set({"daskann.mgrit.solve": value}), no_tasks_submitted(client2):
        with pytest.raises(ValueError, match=r"^daskann\.mgrit\.solve=.* is not valid: expected one of 'predict', "):
            MGRITTrainer((64,), **DIGITS, client=client2).fit(X, y)


def test_a_forced_solve_too_short_for_two_levels_fails_before_any_task(digits, client2):
    X, y = digits
    with dask.config.set({"daskann.mgrit.solve": "force"}), no_tasks_submitted(client2):
        with pytest.raises(ValueError, match=r"^steps=7 is not valid: expected at least 8 steps to solve"):
            MGRITTrainer((64,), **DIGITS, client=client2).fit(X, y, steps=7)
    # the default policy trains such a run serially, and says why
    trainer = MGRITTrainer((64,), **DIGITS, client=client2)
    caught = _fit_recording(trainer, X, y, steps=7)
    assert trainer.result_.ended == "serial-predicted" and "MGRIT needs two" in str(caught[0].message)


def test_pilot_forecast_counts_the_iterations_left():
    pays = _payoff.pilot_forecast([1.0, 0.1], [0.5, 0.1], 0.7, 1e-9, 10.0, 2, 1e-3, most_iterations=100)
    assert pays.iterations == 2 + 8 and pays.mgrit_seconds == pytest.approx(0.7 + 8 * 0.1) and pays.pays
    flat = _payoff.pilot_forecast([1.0, 1.0], [0.5, 0.1], 0.7, 1e-9, 2.0, 2, 1e-3, most_iterations=30)
    # a residual that does not fall: FCF's exactness still ends the solve within half the intervals
    assert flat.iterations == 30 and flat.mgrit_seconds == pytest.approx(0.7 + 28 * 0.1) and not flat.pays
    assert "does not fall" not in flat.reason and math.isfinite(flat.mgrit_seconds)
    done = _payoff.pilot_forecast([1.0, 1e-12], [0.5, 0.1], 0.7, 1e-9, 10.0, 2, 1e-3, most_iterations=30)
    assert done.iterations == 2 and done.pays


def test_a_callback_raising_stop_iteration_ends_the_solve():
    prop = linear.LinearPropagator.random_stable(4, seed=2)
    seen = []

    def callback(info):
        seen.append(info.iteration)
        if info.iteration == 2:
            raise StopIteration

    result = MGRIT(prop, (np.ones(4),), 64, levels=3, cfactor=2, tol=1e-300, max_iter=10, callback=callback).solve()
    assert seen == [1, 2] and result.status == "stopped" and result.iterations == 2 and not result.converged


def test_dask_array_data_trains_serially_on_a_worker(digits, client2):
    import dask.array as da

    X, y = digits
    settings = dict(DIGITS, lr=0.01, epochs=2)
    Xd, yd = client2.persist([da.from_array(X, chunks=200), da.from_array(y, chunks=200)])
    trainer = MGRITTrainer((64,), **settings, client=client2)
    caught = _fit_recording(trainer, Xd, yd)
    assert len(caught) == 1 and trainer.result_.ended == "serial-predicted"
    assert trainer.result_.forecast["step_seconds"] > 0
    serial = SerialTrainer((64,), **settings).fit(X, y)
    for got, want in zip(trainer.model_.params, serial.model_.params, strict=True):
        np.testing.assert_array_equal(got, want)
