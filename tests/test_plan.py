"""daskann plan: the models on described clusters, the command's output, bad input and validation."""

from __future__ import annotations

import json
import math

import pytest
from click.testing import CliRunner

from daskann.plan import METHODS, ClusterSpec, Network, cluster_from_dict, load_cluster, plan, write_cluster
from daskann.plan._model import (
    mgrit_iteration_seconds,
    npt_step_seconds,
    partition_seconds,
    placed_makespan,
    predict_mgrit,
    predict_npt,
    predict_partition,
    serial_step_seconds,
    step_elements,
)
from daskann.plan.cli import plan_command

# numbers chosen so that hand arithmetic is exact
SYNTHETIC = ClusterSpec(workers=(1, 2, 4), flop_rate=1e9, latency=1e-3, bandwidth=1e8, task_overhead=1e-2)
NET = Network(sizes=(10, 20, 20, 5), batch_size=10, steps=100, n_samples=100, name="small")


def _write(tmp_path, text: str):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    return path


def test_serial_step_is_flops_over_rate():
    # 6 * batch * (10*20 + 20*20 + 20*5) = 6 * 10 * 700 = 42,000 flops at 1 GFLOP/s
    assert serial_step_seconds(NET.sizes, NET.batch_size, SYNTHETIC) == pytest.approx(42e-6)
    with_overheads = ClusterSpec(**{**SYNTHETIC.__dict__, "gemm_overhead": 1e-6, "layer_overhead": 1e-5})
    assert serial_step_seconds(NET.sizes, 10, with_overheads) == pytest.approx(42e-6 + 9e-6 + 3e-5)


def test_trainer_costs_in_the_serial_step():
    # numbers touched: 10 rows of 10 + 20 + 20 + 5 activations and 745 parameters
    assert step_elements(NET.sizes, 10) == 10 * 55 + 745
    costs = ClusterSpec(**{**SYNTHETIC.__dict__, "element_time": 1e-9, "step_overhead": 2e-5})
    assert serial_step_seconds(NET.sizes, 10, costs) == pytest.approx(42e-6 + 1295e-9 + 2e-5, rel=1e-12)


def test_partition_fit_and_run_overheads_exact():
    # each sub-model task and the fine-tuning start a trainer; a measured own cost of the run replaces
    # the built one (a task overhead and two messages per wave)
    costs = ClusterSpec(**{**SYNTHETIC.__dict__, "fit_overhead": 3e-3, "partition_overhead": 0.05})
    for p in (1, 2):
        waves = 2 // p
        extra = waves * 3e-3 + 3e-3 + 0.05 - waves * (0.01 + 2 * 0.001)
        assert partition_seconds(NET, costs, p, 2, 0.25) == pytest.approx(
            partition_seconds(NET, SYNTHETIC, p, 2, 0.25) + extra, rel=1e-12
        )


class _Task:
    def __init__(self, key, cost, deps=()):
        self.key, self.cost, self.deps = key, cost, tuple(deps)


def test_placed_schedule_keeps_tasks_with_their_inputs():
    # four tasks reading one result run where it is, one after the other: dask moves tasks to data
    fan = [_Task("a", 1.0), *(_Task(f"b{i}", 2.0, ["a"]) for i in range(4))]
    assert placed_makespan(fan, 2) == 9.0
    # tasks without inputs spread; a task reading results of both workers runs on the one free first
    spread = [_Task("x", 1.0), _Task("y", 3.0), _Task("z", 1.0, ["x", "y"]), _Task("w", 1.0)]
    assert placed_makespan(spread, 2) == 4.0
    assert placed_makespan(spread, 1) == 6.0


def test_mgrit_measured_task_cost_replaces_the_built_one():
    config = {"preset": "solver2", "levels": 2, "cfactor": 4}
    built = mgrit_iteration_seconds(NET, SYNTHETIC, 2, config)
    measured = ClusterSpec(**{**SYNTHETIC.__dict__, "mgrit_task_overhead": 0.05})
    slower = ClusterSpec(**{**SYNTHETIC.__dict__, "mgrit_task_overhead": 0.1})
    first, later = mgrit_iteration_seconds(NET, measured, 2, config)
    assert first > later > built[1]
    assert mgrit_iteration_seconds(NET, slower, 2, config)[1] > later
    # one worker runs every task in a row: slower than two, however the tasks are placed
    assert mgrit_iteration_seconds(NET, measured, 1, config)[1] > later


def test_pilots_train_the_planned_net_unless_it_is_large():
    from daskann.plan._measure import _pilot_net

    small = Network((16, 8, 2), 8, 100, n_samples=64)
    net, X, y, settings = _pilot_net(small, 64, SYNTHETIC, runs=12)
    assert net.sizes == small.sizes and net.steps == 64 and X.shape == (64, 16) and y.shape == (64, 2)
    # a step of seconds would make the pilot a training run: its costs are arithmetic, measured apart
    large = Network((1024, 4096, 4096, 10), 128, 100)
    assert _pilot_net(large, 64, SYNTHETIC, runs=12)[0].sizes == (8, 8, 2)


def test_partition_exact_on_synthetic_cluster():
    # k=2: sub-net 10-10-10-5, 6*10*(100+100+50) = 15,000 flops = 15 us per step, 75 sub-steps
    # task: 75 sub-steps + overhead + 2 messages + (data: 100 rows * 15 numbers, sub-model: 275 params) * 8 bytes
    # merge: the full net's 745 params * 8 bytes; fine-tune: 25 steps of 42 us
    task = 75 * 15e-6 + 0.01 + 0.002 + (100 * 15 * 8 + 275 * 8) / 1e8
    expected_two_workers = task + 745 * 8 / 1e8 + 25 * 42e-6
    assert partition_seconds(NET, SYNTHETIC, 2, 2, 0.25) == pytest.approx(expected_two_workers, rel=1e-12)
    # one worker: the two sub-models run one after the other
    assert partition_seconds(NET, SYNTHETIC, 1, 2, 0.25) == pytest.approx(expected_two_workers + task, rel=1e-12)
    row = predict_partition(NET, SYNTHETIC, 2)
    assert row.speedup == pytest.approx(100 * 42e-6 / row.seconds)


def test_npt_single_worker_exact_and_mgrit_serial_bound():
    # one worker: the 1x1 grid; resident mode costs the step's products, without the first layer's input gradient
    row = predict_npt(NET, SYNTHETIC, 1)
    products = 2 * 10 * (2 * 10 * 20 + 3 * 20 * 20 + 3 * 20 * 5)  # 2 products on the first layer, 3 on the others
    assert row.config == {"grid": "1x1", "mode": "resident"}
    assert row.seconds_per_step == pytest.approx(products / 1e9)
    # MGRIT on one worker with no overheads does at least the serial work per iteration
    free = ClusterSpec(workers=(1,), flop_rate=1e9, latency=1e-9, bandwidth=1e15, task_overhead=0.0)
    mg = predict_mgrit(NET, free, 1, [{"preset": "solver2", "levels": 2, "cfactor": 4, "iterations": 3}])
    assert mg.speedup < 1.0 / 2


def test_npt_resident_bookkeeping_measured_replaces_the_trainers():
    # 1x1 resident: the step's products (no first-layer input gradient), all its numbers touched, and the
    # resident program's own bookkeeping where it was measured (else the trainer's); graph mode keeps the trainer's
    products = 2 * 10 * (2 * 10 * 20 + 3 * 20 * 20 + 3 * 20 * 5)
    costs = ClusterSpec(**{**SYNTHETIC.__dict__, "element_time": 1e-9, "step_overhead": 3e-5})
    resident = ClusterSpec(**{**costs.__dict__, "resident_step_overhead": 2e-4})
    assert npt_step_seconds(NET, costs, 1, (1, 1), "resident") == pytest.approx(products / 1e9 + 1295e-9 + 3e-5)
    assert npt_step_seconds(NET, resident, 1, (1, 1), "resident") == pytest.approx(products / 1e9 + 1295e-9 + 2e-4)
    assert npt_step_seconds(NET, resident, 2, (1, 2), "graph") == npt_step_seconds(NET, costs, 2, (1, 2), "graph")
    row = predict_npt(NET, resident, 1)
    assert row.config == {"grid": "1x1", "mode": "resident"}
    assert row.seconds == pytest.approx(100 * (products / 1e9 + 1295e-9 + 2e-4), rel=1e-12)


def test_npt_resident_grid_exact_on_an_mpi_like_cluster():
    # 2x2 on 4 workers, one cell each: a quarter of the 38,000 flops; per product a skew and 2 shifts (3 messages)
    # of its larger operand's block (bytes: 400 400 800 400 800 400 400 200 = 3,800); per step 5 all-gathers
    # of ceil(log2(5)) = 3 hops; a quarter of the 1,295 numbers touched and the measured bookkeeping
    mpi = ClusterSpec(
        workers=(4,),
        flop_rate=1e9,
        latency=1e-3,
        bandwidth=1e8,
        task_overhead=0.0,
        element_time=1e-9,
        resident_step_overhead=2e-4,
    )
    expected = 38_000 / 4 / 1e9 + 3 * (8 * 1e-3 + 3800 / 1e8) + 5 * 3 * 1e-3 + 1295e-9 / 4 + 2e-4
    assert npt_step_seconds(NET, mpi, 4, (2, 2), "resident") == pytest.approx(expected, rel=1e-12)
    # no task graph on an MPI-like runtime: every grid runs the message-passing program
    assert {predict_npt(NET, mpi, p).config["mode"] for p in (1, 2, 4, 8)} == {"resident"}
    square = predict_npt(NET, mpi, 8, square=True).config["grid"]
    assert square in ("1x1", "2x2")


def test_mgrit_configuration_carries_its_own_task_cost():
    config = {"preset": "solver1", "levels": 2, "cfactor": 4, "iterations": 3}
    measured = ClusterSpec(**{**SYNTHETIC.__dict__, "mgrit_task_overhead": 0.05})
    own = predict_mgrit(NET, SYNTHETIC, 2, [{**config, "task_overhead_s": 0.05}])
    assert own.seconds == predict_mgrit(NET, measured, 2, [config]).seconds
    assert own.seconds != predict_mgrit(NET, SYNTHETIC, 2, [config]).seconds
    assert own.config["task_overhead_s"] == 0.05


@pytest.mark.parametrize("method", ["npt", "mgrit", "partition"])
def test_monotone_in_flop_rate_and_latency(method):
    configs = [{"preset": "solver2", "levels": 2, "cfactor": 4, "iterations": 5}]
    base = ClusterSpec(workers=(1, 2, 4, 8), flop_rate=1e9, latency=1e-4, bandwidth=1e9, task_overhead=1e-4)
    faster = ClusterSpec(**{**base.__dict__, "flop_rate": 4e9})
    slower = ClusterSpec(**{**base.__dict__, "latency": 1e-2})
    net = Network(sizes=(64, 256, 256, 8), batch_size=64, steps=256)
    for p in base.workers:
        t = {}
        for name, c in (("base", base), ("faster", faster), ("slower", slower)):
            r = plan(net, ClusterSpec(**{**c.__dict__, "workers": (p,)}), methods=(method,), mgrit_configs_=configs)
            t[name] = r["predictions"][0]["seconds"]
        assert t["faster"] < t["base"] <= t["slower"], (p, t)


def test_mpi_like_npt_optimum_grows_with_the_net():
    from daskann.npt.costmodel import PAPER_NETS

    mpi = ClusterSpec(workers=(1, 4, 16, 64, 256), flop_rate=1e10, latency=2e-6, bandwidth=5e9, task_overhead=0.0)
    optimum = []
    for spec in PAPER_NETS.values():
        net = Network((spec["n_features"], *spec["hidden"], spec["n_outputs"]), 128, 100)
        rows = [predict_npt(net, mpi, p) for p in mpi.workers]
        best = min(rows, key=lambda r: r.seconds)
        optimum.append(math.prod(int(x) for x in best.config["grid"].split("x")))
    assert optimum == sorted(optimum) and optimum[0] < optimum[-1]


@pytest.mark.parametrize(
    ("bandwidth", "expected"), [(1e10, ["5x5", "7x7", "11x11"]), (1e9, ["11x11", "11x11", "20x20"])]
)
def test_paper_nets_npt_optimum_on_the_documented_mpi_cluster(bandwidth, expected):
    # docs/plan.md's table: 10 GFLOP/s, 1 us per message, square Cannon grids, batch 128
    from daskann.npt.costmodel import PAPER_NETS

    mpi = ClusterSpec(workers=(1,), flop_rate=1e10, latency=1e-6, bandwidth=bandwidth, task_overhead=0.0)
    grids = []
    for spec in PAPER_NETS.values():
        net = Network((spec["n_features"], *spec["hidden"], spec["n_outputs"]), 128, 200)
        rows = [predict_npt(net, mpi, 2**e, square=True) for e in range(11)]
        grids.append(min(rows, key=lambda r: r.seconds).config["grid"])
    assert grids == expected


def test_partition_speedup_on_the_documented_mpi_cluster():
    # docs/plan.md's table: the paper's parameter counts, k sub-models on k workers, a quarter fine-tuning
    mpi = ClusterSpec(workers=(1,), flop_rate=1e10, latency=1e-6, bandwidth=1e9, task_overhead=0.0)
    speedups = []
    for sizes, k in (((784, 540, 10), 2), ((784, 1100, 1100, 10), 4)):
        net = Network(sizes, 128, 10000, n_samples=60000)
        serial = net.steps * serial_step_seconds(sizes, 128, mpi)
        speedups.append(serial / partition_seconds(net, mpi, k, k, 0.25))
    assert speedups == pytest.approx([1.60, 2.81], abs=0.01)


# -- cluster files -----------------------------------------------------------------------------
def test_cluster_file_round_trip(tmp_path):
    path = write_cluster(SYNTHETIC, tmp_path / "mine.yaml")
    assert load_cluster(path).to_dict() == SYNTHETIC.to_dict()
    measured = ClusterSpec(**{**SYNTHETIC.__dict__, "mgrit_task_overhead": 0.012, "fit_overhead": 0.003})
    path = write_cluster(measured, tmp_path / "measured.yaml")
    assert load_cluster(path).to_dict() == measured.to_dict()


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("workers: [1, 2]\nflop_rate: 1e9\nlatency: 1e-3\nbandwidth: 1e8\n", "task_overhead"),
        ("workers: [1, 2]\nflop_rate: -1.0\nlatency: 1e-3\nbandwidth: 1e8\ntask_overhead: 0\n", "flop_rate"),
        ("workers: [1, 2]\nflop_rate: 1e9\nlatency: 0\nbandwidth: 1e8\ntask_overhead: 0\n", "latency"),
        ("workers: [0, 2]\nflop_rate: 1e9\nlatency: 1e-3\nbandwidth: 1e8\ntask_overhead: 0\n", "workers"),
        ("workers: [1.5]\nflop_rate: 1e9\nlatency: 1e-3\nbandwidth: 1e8\ntask_overhead: 0\n", "workers"),
        ("flop_rate: 1e9\nlatency: 1e-3\nbandwidth: 1e8\ntask_overhead: 0\n", "workers"),
        ("workers: [1]\nflop_rate: 1e9\nlatency: 1e-3\nbandwidth: abc\ntask_overhead: 0\n", "bandwidth"),
        (
            "workers: [1]\nflop_rate: 1e9\nlatency: 1e-3\nbandwidth: 1e8\ntask_overhead: 0\nmgrit_task_overhead: -1\n",
            "mgrit_task_overhead",
        ),
    ],
)
def test_bad_cluster_file_names_the_key_and_runs_nothing(tmp_path, text, named):
    path = _write(tmp_path, text)
    with pytest.raises(ValueError, match=f"^{named} in c.yaml="):
        load_cluster(path)
    out = CliRunner().invoke(plan_command, ["--method", "npt", "--cluster", str(path), "--json"])
    assert out.exit_code != 0 and f"{named} in c.yaml=" in out.output and "predictions" not in out.output


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--method", "mgrit", "--iterations", "0"], "--iterations=0 is not valid"),
        (["--method", "mgrit", "--iterations", "-3"], "--iterations=-3 is not valid"),
        (["--method", "sgd"], "--method"),
        (["--method", "npt", "--net", "huge"], "--net"),
        (["--method", "npt", "--workers", "0"], "--workers=0 is not valid"),
        (["--method", "npt", "--steps", "0"], "--steps=0 is not valid"),
        (["--measure"], "--output=None is not valid"),
    ],
)
def test_bad_flags(tmp_path, args, named):
    path = write_cluster(SYNTHETIC, tmp_path / "ok.yaml")
    out = CliRunner().invoke(plan_command, [*args, "--cluster", str(path)])
    assert out.exit_code != 0 and named in out.output, out.output


def test_bad_values_checked_directly():
    with pytest.raises(ValueError, match="workers in x="):
        cluster_from_dict(
            {"workers": [1, -2], "flop_rate": 1, "latency": 1, "bandwidth": 1, "task_overhead": 0}, source="x"
        )
    with pytest.raises(ValueError, match="keys of x="):
        cluster_from_dict({"workers": [1], "flops": 1}, source="x")


# -- the command ----------------------------------------------------------------------------------
def test_json_layout_and_plot(tmp_path):
    path = write_cluster(SYNTHETIC, tmp_path / "c.yaml")
    png = tmp_path / "speedup.png"
    args = ["--method", "all", "--cluster", str(path), "--hidden", "32,32", "--n-features", "8", "--n-outputs", "2"]
    out = CliRunner().invoke(plan_command, [*args, "--iterations", "4", "--steps", "64", "--json", "--plot", str(png)])
    assert out.exit_code == 0, out.output
    result = json.loads(out.output)
    assert set(result) == {"predictions", "best"}
    keys = {"method", "net", "workers", "seconds", "seconds_per_step", "speedup", "config"}
    assert all(set(r) == keys for r in result["predictions"])
    # "all": every method the registry plans
    assert {(r["method"], r["workers"]) for r in result["predictions"]} == {(m, p) for m in METHODS for p in (1, 2, 4)}
    assert set(result["best"]) == keys
    assert result["best"]["seconds"] == min(r["seconds"] for r in result["predictions"])
    assert {"grid", "mode"} <= set(result["predictions"][0]["config"])
    assert png.stat().st_size > 1000
    text = CliRunner().invoke(plan_command, [*args, "--iterations", "4", "--steps", "64"])
    assert text.exit_code == 0 and "fastest:" in text.output and "partition" in text.output


def test_profile_plan_key_predicts_and_cluster_ignores_it():
    pytest.importorskip("dask_jobqueue", reason="profiles need the hpc extra (dask-jobqueue)")
    from daskann.cluster import load_profile

    assert "plan" not in load_profile("slurm")
    out = CliRunner().invoke(plan_command, ["--method", "npt", "--profile", "slurm", "--json"])
    assert out.exit_code == 0, out.output
    assert max(r["workers"] for r in json.loads(out.output)["predictions"]) == 64


def test_measure_writes_a_file_cluster_reads(client2, tmp_path):
    address = client2.scheduler.address
    path = tmp_path / "measured.yaml"
    out = CliRunner().invoke(plan_command, ["--measure", "-o", str(path), "--address", address])
    assert out.exit_code == 0, out.output
    measured = load_cluster(path)
    assert measured.workers == (1, 2) and measured.flop_rate > 1e7 and measured.task_overhead > 0
    # real tasks and fits, timed on the cluster
    assert measured.mgrit_task_overhead > 0 and measured.fit_overhead > 0
    assert measured.partition_overhead >= 0 and measured.step_overhead >= 0 and measured.element_time >= 0
    assert measured.resident_step_overhead > 0
    out = CliRunner().invoke(plan_command, ["--method", "npt", "--cluster", str(path), "--json"])
    assert out.exit_code == 0 and len(json.loads(out.output)["predictions"]) == 2


def test_validate_on_two_workers(client2, monkeypatch):
    from daskann.plan import _planners

    # two rounds of runs predicted to last 0.1 s keep the test short; the command's defaults are 5 and 1 s
    monkeypatch.setattr(_planners, "VALIDATION_ROUNDS", 2)
    monkeypatch.setattr(_planners, "VALIDATION_SECONDS", 0.1)
    address = client2.scheduler.address
    args = ["--validate", "--method", "all", "--address", address, "--hidden", "16,16", "--n-features", "8"]
    out = CliRunner().invoke(plan_command, [*args, "--n-outputs", "2", "--steps", "32", "--json"])
    assert out.exit_code == 0, out.output
    rows = json.loads(out.output)["validation"]
    assert {"npt", "partition"} <= {r["method"] for r in rows} <= set(METHODS)
    for r in rows:
        assert set(r) == {"method", "workers", "predicted_s", "measured_s"} and r["workers"] == 2
        assert r["predicted_s"] > 0 and r["measured_s"] > 0


def test_validated_steps_grow_until_a_run_lasts_long_enough():
    from daskann.plan._planners import MGRITPlanner, NPTPlanner, PartitionPlanner, _at_steps, _Check, _long_enough

    npt_planner = NPTPlanner(finetune_fraction=0.25)
    npt = _Check(npt_planner, NET, predict_npt(NET, SYNTHETIC, 2).config)
    longer = _long_enough(npt, SYNTHETIC, 2, seconds=0.1)

    def predicted(check):
        return check.planner.seconds(check.net, check.config, SYNTHETIC, 2)

    # NPT's time is linear in its steps: scaled once, exactly far enough
    assert predicted(npt) < 0.01
    assert longer.net.steps == math.ceil(NET.steps * 0.1 / predicted(npt))
    assert predicted(longer) >= 0.1 and longer.config == npt.config
    # prediction and measurement count the same steps: partition's phases split the validated ones
    partition_planner = PartitionPlanner(finetune_fraction=0.25)
    part = _Check(partition_planner, NET, predict_partition(NET, SYNTHETIC, 2).config)
    part = _long_enough(part, SYNTHETIC, 2, 0.1)
    assert part.config["sub_steps"] + part.config["finetune_steps"] == part.net.steps > NET.steps
    assert predicted(part) >= 0.1
    # MGRIT's steps double and its iterations grow from its pilot's, as the plan grows them
    config = {"preset": "solver2", "levels": 2, "cfactor": 4, "iterations": 3}
    config.update(pilot_iterations=3, pilot_steps=100)
    mgrit = _at_steps(_Check(MGRITPlanner(finetune_fraction=0.25), NET, config), 400)
    assert mgrit.config["iterations"] == 5 and mgrit.net.steps == 400
    assert MGRITPlanner().grown_steps(100, 0.01, 1.0) == 200
    # a run never grows past 64 times the planned steps
    assert _long_enough(npt, SYNTHETIC, 2, seconds=1e9).net.steps == 64 * NET.steps


def test_mgrit_task_cost_calibrated_per_configuration(client2):
    from daskann.plan._measure import calibrate_mgrit

    net = Network((8, 8, 2), 8, 32, n_samples=64, momentum=False)
    configs = [{"preset": p, "levels": 2, "cfactor": 4, "iterations": 3} for p in ("solver1", "solver2")]
    calibrated = calibrate_mgrit(client2, SYNTHETIC, net, [*configs, {**configs[0], "levels": 4}])
    assert [c["task_overhead_s"] > 0 for c in calibrated[:2]] == [True, True]
    assert "task_overhead_s" not in calibrated[2]  # 32 steps cannot coarsen three times by 4
    assert [{k: c[k] for k in configs[0]} for c in calibrated[:2]] == configs


def test_without_method_the_npt_grid_table_as_before(client2):
    out = CliRunner().invoke(plan_command, ["--address", client2.scheduler.address, "--hidden", "32"])
    assert out.exit_code == 0, out.output
    assert "grid='auto' takes" in out.output and "1x1" in out.output
