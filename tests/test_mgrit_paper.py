"""The paper's MGRIT (Schroder 2017): presets, model problems, speedup model and the ``--paper`` benchmark."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from daskann.bench.mgrit_paper import TABLES, four_layer, paper_propagator, solve_paper, step_growth, three_layer
from daskann.bench.mgrit_tables import paper_json, paper_main, paper_tables
from daskann.data import BatchOrder
from daskann.mgrit import SGDPropagator, workmodel
from daskann.mgrit.presets import PAPER_PRESETS, PRESETS, paper_levels, paper_options
from daskann.nn import MLP


def _trask_xor(steps: int, alpha: float, *, serialized: bool = False):
    """Reference: the tutorial's loop (full batch, sigmoid, no biases, delta (out - y) out (1 - out));
    ``serialized``: step ``i = 1 .. steps`` (the one computing point ``i``) on row ``i mod 4`` alone."""
    X_all = np.array([[0, 0, 1], [0, 1, 1], [1, 0, 1], [1, 1, 1]], dtype=float)
    y_all = np.array([[0, 1, 1, 0]], dtype=float).T
    legacy = np.random.RandomState(1)  # the tutorial's np.random.seed(1), without the global generator
    syn0 = 2 * legacy.random_sample((3, 4)) - 1
    syn1 = 2 * legacy.random_sample((4, 1)) - 1
    for i in range(1, steps + 1):
        X, y = (X_all[[i % 4]], y_all[[i % 4]]) if serialized else (X_all, y_all)
        l1 = 1 / (1 + np.exp(-X @ syn0))
        l2 = 1 / (1 + np.exp(-l1 @ syn1))
        l2_delta = (l2 - y) * l2 * (1 - l2)
        l1_delta = l2_delta @ syn1.T * l1 * (1 - l1)
        syn1 = syn1 - alpha * l1.T @ l2_delta
        syn0 = syn0 - alpha * X.T @ l1_delta
    return syn0, syn1


# -- presets ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "growth", "data"),
    [("naive", 1.0, "batch"), ("schroder1", 2.0, "batch"), ("schroder2", 2.0, "serialized"),
     ("schroder2-slow", 1.25, "serialized")],
)  # fmt: skip
def test_paper_presets_options(name, growth, data):
    options = paper_options(name, 1600, alpha_b=0.5, alpha_max=8.0, cycle="F")
    solver, prop = options["solver"], options["propagator"]
    assert options["data"] == data
    assert prop["alpha_growth"] == growth and prop["alpha_cap"] == 16.0 and prop["lr"] == 0.5
    assert prop["momentum"] == 0.0 and prop["velocity"] is False and prop["coarse_data"] == "own"
    assert solver["cfactor"] == 2 and solver["cf_iter"] == 1 and solver["cycle_type"] == "F"
    assert solver["initial_guess"] == "zero" and solver["max_iter"] == 50
    assert solver["tol"] == pytest.approx(1e-9 * 40.0)
    assert solver["levels"] == 9  # 1600 800 ... 12 6: the coarsest at most 10 steps
    assert paper_options(name, 1600, alpha_b=0.5, cycle="two-level")["solver"]["levels"] == 2
    assert paper_options(name, 100, alpha_b=0.5)["propagator"]["alpha_cap"] is None  # alpha_max inf: no cap


def test_paper_levels_coarsest_at_most_ten():
    for n in (20, 100, 1280, 12800, 25600):
        levels = paper_levels(n)
        assert n // 2 ** (levels - 1) <= 10 < n // 2 ** (levels - 2)


def test_double_phi_options_and_cost():
    split = paper_options("schroder1", 64, alpha_b=1.0, alpha_max=8.0, double_phi="split")["propagator"]
    repeat = paper_options("schroder1", 64, alpha_b=1.0, alpha_max=8.0, double_phi="repeat")["propagator"]
    assert (split["substeps"], split["repeats"]) == (2, 1)
    assert (repeat["substeps"], repeat["repeats"]) == (1, 2)
    prob = three_layer()
    for options, expected in ((split, 2.0), (repeat, 2.0)):
        prop = paper_propagator(prob, {"propagator": options, "data": "batch"})
        assert prop.cost(1, 2) == expected
    # repeat: twice the coarse step at alpha; split: two steps of alpha / 2 (not the same point)
    opts = {"data": "batch"}
    single = paper_propagator(prob, {**opts, "propagator": {**repeat, "repeats": 1}})
    u0 = single.initial_state(prob.model)
    twice = single.step(single.step(u0, 0, 2, 1), 0, 2, 1)
    np.testing.assert_array_equal(paper_propagator(prob, {**opts, "propagator": repeat}).step(u0, 0, 2, 1)[0], twice[0])
    assert not np.allclose(paper_propagator(prob, {**opts, "propagator": split}).step(u0, 0, 2, 1)[0], twice[0])


def test_existing_presets_unchanged():
    assert set(PRESETS) == {"solver1", "solver2", "solver3", "solver4"}
    assert not set(PAPER_PRESETS) & set(PRESETS)


# -- the paper's Phi -----------------------------------------------------------------------------------------------


def test_paper_phi_is_the_tutorial_loop():
    prob = three_layer()
    opts = paper_options("naive", 8, alpha_b=1.0)
    prop = paper_propagator(prob, opts)
    state = prop.initial_state(prob.model)
    assert len(state) == 2  # weights only: no biases, no velocity
    for i in range(8):
        state = prop.step(state, i, i + 1, 0)
    syn0, syn1 = _trask_xor(8, 1.0)
    np.testing.assert_allclose(state[0], syn0, rtol=0, atol=1e-13)
    np.testing.assert_allclose(state[1], syn1, rtol=0, atol=1e-13)


def test_mgrit_reproduces_serial_gradient_descent():
    result = solve_paper(three_layer(), 64, "schroder1", cycle="V", alpha_b=1.0, alpha_max=8.0)
    assert result.converged
    syn0, syn1 = _trask_xor(64, 1.0)
    np.testing.assert_allclose(result.state[0], syn0, atol=1e-8)
    np.testing.assert_allclose(result.state[1], syn1, atol=1e-8)


def test_coarse_data_own_rule():
    X = np.arange(10.0).reshape(5, 2)
    y = np.ones((5, 1))
    net = MLP([2, 3, 1], activation="sigmoid", output="sigmoid", bias=False, seed=0)
    order = BatchOrder(5, None, shuffle="serialized")
    seen = []

    class Recording(SGDPropagator):
        def _gradients(self, params, rows):
            seen.append(int(rows[0]))
            return super()._gradients(params, rows)

    own = Recording(net, X, y, loss="sse", order=order, lr=0.1, coarse_data="own", velocity=False)
    u0 = own.initial_state(net)
    own.step(u0, 12, 16, 2)  # point 3 of level 2 (span 4): row 3 of its own index, not row 12 mod 5 = 2
    fine = Recording(net, X, y, loss="sse", order=order, lr=0.1, velocity=False)
    fine.step(u0, 12, 16, 2)
    assert seen == [3, 2]


def test_serialized_row_index_options():
    assert paper_options("schroder2", 64, alpha_b=1.0)["propagator"]["step_offset"] == 1
    assert paper_options("schroder2", 64, alpha_b=1.0, row_index="start")["propagator"]["step_offset"] == 0
    assert paper_options("schroder1", 64, alpha_b=1.0)["propagator"]["step_offset"] == 0  # batch: every row


def test_serialized_row_index_end_rows():
    """The step that computes point i of any level trains on row i mod K (K = 4 rows)."""
    prob = three_layer()
    seen = []

    class Recording(SGDPropagator):
        def _gradients(self, params, rows):
            seen.append(int(rows[0]))
            return super()._gradients(params, rows)

    options = paper_options("schroder2", 64, alpha_b=1.0, cycle="F")
    order = BatchOrder(4, None, shuffle="serialized")
    prop = Recording(prob.model, prob.X, prob.y, loss="sse", order=order, **options["propagator"])
    u0 = prop.initial_state(prob.model)
    for start in range(6):
        prop.step(u0, start, start + 1, 0)  # fine step into point start + 1
    prop.step(u0, 12, 16, 2)  # level 2 (span 4): the step into its point 4
    prop.step(u0, 40, 48, 3)  # level 3 (span 8): the step into its point 6
    assert seen == [1, 2, 3, 0, 1, 2, 0, 2]


def test_serialized_mgrit_reproduces_serial_gradient_descent():
    result = solve_paper(three_layer(), 64, "schroder2", cycle="F", alpha_b=1.0, alpha_max=8.0)
    assert result.converged
    syn0, syn1 = _trask_xor(64, 1.0, serialized=True)
    np.testing.assert_allclose(result.state[0], syn0, atol=1e-8)
    np.testing.assert_allclose(result.state[1], syn1, atol=1e-8)


def test_bias_free_propagator_with_velocity():
    X = np.random.default_rng(0).standard_normal((16, 3))
    y = np.random.default_rng(1).standard_normal((16, 2))
    net = MLP([3, 5, 2], activation="tanh", bias=False, seed=0)
    prop = SGDPropagator(net, X, y, loss="mse", order=BatchOrder(16, 4, seed=0), lr=0.05, momentum=0.9)
    state = prop.initial_state(net)
    assert [a.shape for a in state] == [(3, 5), (5, 2), (3, 5), (5, 2)]
    model, velocity = prop.split(prop.step(state, 0, 1, 0))
    assert not model.bias and len(velocity) == 2


def test_velocity_false_needs_zero_momentum():
    net = MLP([2, 2, 1], bias=False, seed=0)
    with pytest.raises(ValueError, match="velocity=False"):
        SGDPropagator(net, np.ones((4, 2)), np.ones((4, 1)), loss="sse", order=BatchOrder(4, None), lr=0.1,
                      momentum=0.9, velocity=False)  # fmt: skip


def test_four_layer_problem():
    prob = four_layer()
    assert prob.X.shape == (500, 24) and prob.y.shape == (500, 12)
    assert prob.model.n_parameters == 12032 and not prob.model.bias
    # the target is the sum of the two addends (12 binary digits, most significant first)
    digits = 2 ** np.arange(11, -1, -1)
    np.testing.assert_array_equal(prob.X[:, :12] @ digits + prob.X[:, 12:] @ digits, prob.y @ digits)
    assert np.all(prob.X[:, :12] @ digits < 2**11)
    np.testing.assert_array_equal(four_layer().model.weights[0], prob.model.weights[0])  # seeded


def test_four_layer_phi_is_the_vanilla_loop():
    """A batch step is the synthetic-gradients tutorial's plain network on all 500 rows at once: the deltas
    summed over the rows, not averaged (the reading of Tables 8-11, docs/mgrit.md)."""
    prob = four_layer()
    prop = paper_propagator(prob, paper_options("naive", 4, alpha_b=0.1))
    w = [np.array(a) for a in prob.model.weights]
    ours = prop.step(prop.initial_state(prob.model), 0, 1, 0)
    layers = [prob.X]
    for W in w:
        layers.append(1 / (1 + np.exp(-layers[-1] @ W)))
    delta = (layers[-1] - prob.y) * layers[-1] * (1 - layers[-1])
    for k in (2, 1, 0):
        grad = layers[k].T @ delta
        delta = delta @ w[k].T * layers[k] * (1 - layers[k])
        np.testing.assert_allclose(ours[k], w[k] - 0.1 * grad, rtol=0, atol=1e-12)


@pytest.mark.timeout(60)  # about 7 s of CPU (the solve: 10 iterations over 40 steps of 500 rows); a loaded machine
def test_table11_coarse_steps_leave_the_stability_region():
    """Why Table 11 (Solver 1, alpha_b 0.025, two-level, batch) does not converge.

    Full-batch gradient descent on the 500 summed rows sharpens: the top Hessian eigenvalue rises from 33 at
    w_0 past 2 / 0.05 = 40 by step 20 (and past 2 / 0.025 = 80 near step 40). From there Solver 1's coarse step
    (alpha^(1) = 0.05) magnifies errors more than the two fine steps it stands for, and the sequential coarse
    solve multiplies them step after step. At N = 40 the FCF iterate is exact after N / 4 = 10 iterations, but
    the coarse correction puts back round-off grown tenfold per coarse step at the end of the interval: the
    residual stalls above the tolerance. At larger N the same growth acts on the whole coarse error."""
    from threadpoolctl import threadpool_limits

    from daskann.mgrit.propagators import top_curvature

    n, alpha_b = 40, 0.025
    prob = four_layer()
    with threadpool_limits(1):
        prop = paper_propagator(prob, paper_options("schroder1", n, alpha_b=alpha_b, alpha_max=0.2, cycle="two-level"))
        coarse_lr = prop.alpha(1, 2) * prop.optimizer.lr
        assert coarse_lr == pytest.approx(2 * alpha_b)
        serial = [prop.initial_state(prob.model)]
        for i in range(n):
            serial.append(prop.fine_step(serial[-1], i))
        assert top_curvature(prop, serial[0]) < 2 / coarse_lr < top_curvature(prop, serial[20])
        assert top_curvature(prop, serial[38]) > 2 / alpha_b
        for i in (20, 30):  # the coarse step magnifies errors; the two fine steps it stands for much less
            coarse = step_growth(prop, serial[i], i, level=1, span=2, iterations=12)
            assert coarse > 1.5 and coarse > 1.4 * step_growth(prop, serial[i], i, span=2, iterations=12)
        assert step_growth(prop, serial[38], 38, level=1, span=2, iterations=12) > 5
        result = solve_paper(prob, n, "schroder1", cycle="two-level", alpha_b=alpha_b, alpha_max=0.2,
                             max_iter=n // 4, store_fine=True)  # fmt: skip
    assert not result.converged and result.residuals[-1] > result.tol
    flat = [np.concatenate([a.ravel() for a in s]) for s in serial]
    error = [float(np.linalg.norm(result.fine_points[i] - flat[i])) for i in range(0, n + 1, 2)]
    assert max(error[:11]) < 1e-13  # exact to round-off up to point 20
    assert error[-1] > 1e-9  # ... but not at the end: round-off grown by the coarse steps
    assert all(b > 3 * a for a, b in zip(error[-5:-1], error[-4:], strict=True))


# -- Table 1 ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("table", "n_steps"), [(5, 100), (6, 100), (6, 200), (7, 200)])
def test_serialized_tables_first_entries(table, n_steps):
    spec = TABLES[table - 1]
    options = {k: spec[k] for k in ("cycle", "alpha_b", "alpha_max")}
    result = solve_paper(three_layer(), n_steps, spec["solver"], **options)
    assert result.converged and result.iterations == spec["paper"][spec["steps"].index(n_steps)]


@pytest.mark.slow
def test_table6_at_800_steps():
    """Serialized F-cycles: the paper's 21 with the step into point i on row i mod K (``"start"`` gives 17)."""
    spec = TABLES[5]
    options = {k: spec[k] for k in ("cycle", "alpha_b", "alpha_max")}
    assert solve_paper(three_layer(), 800, "schroder2", **options).iterations == 21


@pytest.mark.parametrize(("n_steps", "paper"), [(100, 14), (200, 19)])
def test_table1_first_entries(n_steps, paper):
    result = solve_paper(three_layer(), n_steps, "naive", cycle="two-level", alpha_b=1.0, alpha_max=8.0)
    assert result.converged
    assert abs(result.iterations - paper) <= 2
    assert result.residuals[-1] < 1e-9 * math.sqrt(n_steps)


def test_result_rho_and_potential_speedup():
    result = solve_paper(three_layer(), 100, "schroder1", cycle="two-level", alpha_b=1.0, alpha_max=8.0)
    r, k = result.residuals, result.iterations
    assert result.rho == pytest.approx((r[-1] / r[0]) ** (1 / (k - 1)))
    assert result.potential_speedup == pytest.approx(100 / ((7 + 50) * k))  # coarse level: 50 serial steps
    summary = result.to_dict()
    assert summary["rho"] == result.rho and summary["potential_speedup"] == result.potential_speedup


# -- the speedup model -------------------------------------------------------------------------------------------


def test_paper_speedup_formula():
    assert workmodel.paper_sigma(6, 2) == 102.0  # 17 per iteration with a coarsest level of 10 steps
    assert workmodel.paper_sigma(6, 9, "V") == 6 * (17 + 7 * 8)
    assert workmodel.paper_sigma(7, 4, "F") == 7 * ((17 + 16) + (17 + 8))
    assert workmodel.paper_sigma(5, 3, "F") == workmodel.paper_sigma(5, 3, "V")
    # two levels: the coarse level's N / 2 steps are serial
    assert workmodel.paper_speedup(25600, 5, 2, "V", coarsest=12800) == pytest.approx(25600 / (5 * (7 + 12800)))
    assert workmodel.paper_sigma(1, 5, "V", coarse_cost=2.0) == 7 + 24 + 20
    assert math.isnan(workmodel.paper_speedup(100, 0, 2))
    assert workmodel.convergence_factor([1.0, 0.1, 0.01]) == pytest.approx(0.1)
    assert math.isnan(workmodel.convergence_factor([1.0]))


# -- the benchmark ---------------------------------------------------------------------------------------------------


def test_paper_json_layout(tmp_path):
    pytest.importorskip("matplotlib")
    opts = {"output": tmp_path, "max_steps": 100, "tables": (2, 13), "double_phi": "none", "quiet": True}
    document = paper_main(opts)
    on_disk = json.loads((tmp_path / "bench-mgrit-paper.json").read_text())
    assert on_disk == document
    keys = ["table", "problem", "solver", "cycle", "alpha_b", "alpha_max", "steps", "iterations", "converged", "rho",
            "potential_speedup"]  # fmt: skip
    assert [list(t) for t in on_disk["tables"]] == [keys, keys]
    t13 = on_disk["tables"][1]
    assert {k: t13[k] for k in keys[:6]} == {"table": 13, "problem": "four-layer", "solver": "schroder2",
                                             "cycle": "two-level", "alpha_b": 0.025, "alpha_max": 0.2}  # fmt: skip
    assert t13["steps"] == [100] and isinstance(t13["converged"][0], bool)
    assert (tmp_path / "mgrit-paper-figure6.png").stat().st_size > 0
    assert (tmp_path / "mgrit-paper-figure7.png").stat().st_size > 0
    xr = pytest.importorskip("xarray")
    ds = xr.open_zarr(tmp_path / "bench-mgrit-paper.zarr", group="table13", consolidated=False)
    assert int(ds["iterations"].sel(steps=100)) == t13["iterations"][0]


def test_paper_tables_not_converged_flag():
    records = paper_tables(max_steps=100, tables=[1], max_iter=3)
    assert records[0]["converged"] == [False] and records[0]["iterations"] == [3]
    assert paper_json(records)["tables"][0]["converged"] == [False]


def test_every_table_listed():
    assert [t["table"] for t in TABLES] == list(range(1, 17))
    assert max(max(t["steps"]) for t in TABLES if t["problem"] == "three-layer") == 25600
    assert max(max(t["steps"]) for t in TABLES if t["problem"].startswith("four-layer")) == 12800


# -- bad input -------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [({"alpha_b": 0.0}, "alpha_b"), ({"alpha_b": -1.0}, "alpha_b"), ({"alpha_b": math.inf}, "alpha_b"),
     ({"alpha_b": math.nan}, "alpha_b"), ({"alpha_b": 1.0, "alpha_max": 0.5}, "alpha_max"),
     ({"alpha_b": 1.0, "max_coarse": 0}, "max_coarse"), ({"alpha_b": 1.0, "n_steps": 1}, "n_steps"),
     ({"alpha_b": 1.0, "cycle": "W"}, "cycle"), ({"alpha_b": 1.0, "double_phi": "triple"}, "double_phi"),
     ({"alpha_b": 1.0, "double_phi": True}, "double_phi"), ({"alpha_b": 1.0, "row_index": "middle"}, "row_index")],
)  # fmt: skip
def test_bad_input_names_the_parameter(kwargs, name, monkeypatch):
    import daskann.mgrit.solver as solver

    monkeypatch.setattr(solver.MGRIT, "solve", lambda self: pytest.fail("a solve started"))
    kwargs = {"n_steps": 100, **kwargs}
    with pytest.raises(ValueError, match=f"^{name}="):
        solve_paper(three_layer(), kwargs.pop("n_steps"), "schroder1", **kwargs)


def test_bad_preset_name():
    with pytest.raises(ValueError, match="^preset="):
        paper_options("solver3", 100, alpha_b=1.0)


def test_bad_bench_options(tmp_path):
    with pytest.raises(ValueError, match="^tables="):
        paper_main({"output": tmp_path, "tables": (17,), "quiet": True})
    with pytest.raises(ValueError, match="^max_steps="):
        paper_main({"output": tmp_path, "max_steps": 1, "quiet": True})


def test_cli_paper_prints_tables_beside_the_paper(tmp_path):
    pytest.importorskip("matplotlib")
    from click.testing import CliRunner

    from daskann.mgrit.cli import bench_command

    args = ["--paper", "--max-steps", "200", "--tables", "1", "--double-phi", "split", "-o", str(tmp_path), "-q"]
    out = CliRunner().invoke(bench_command, args)
    assert out.exit_code == 0, out.output
    assert "Table 1: three-layer, naive, two-level" in out.output
    rows = [line.split() for line in out.output.splitlines() if line.strip().startswith(("100 ", "200 "))]
    assert [row[:2] for row in rows] == [["100", "14"], ["200", "19"]]  # N and the paper's iterations
    assert json.loads((tmp_path / "bench-mgrit-paper.json").read_text())["tables"][0]["steps"] == [100, 200]
