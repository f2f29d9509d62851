"""Partitioned pre-training: split, sub-models as futures, merge, fine-tune, benchmark."""

from __future__ import annotations

import contextlib
import importlib
import itertools
import json
import math
import os
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from conftest import no_tasks_submitted, restore_workers, run_notebook
from distributed import get_task_stream

from daskann import TrainingDiverged, store
from daskann.bench.partition import BenchmarkConfig, run_benchmark, time_to_target
from daskann.data import load_dataset
from daskann.nn import MLP
from daskann.partition import (
    PartitionMergeOptions,
    PartitionSplitOptions,
    PartitionTrainer,
    SubModelError,
    combine_logits,
    linear_cka,
    merge_submodels,
    split_network,
    submodel_diversity,
    submodel_seeds,
)
from daskann.partition.cli import bench_command, train_command
from daskann.serial import SerialTrainer

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def digits():
    return load_dataset("digits", seed=0)


def _settings(**overrides):
    s = dict(loss="cross_entropy", lr=0.1, batch_size=32, seed=3, sgd={"momentum": 0.9})
    s.update(overrides)
    return s


# -- split ------------------------------------------------------------------------
def test_split_groups_and_parameter_counts():
    p = split_network([40, 512, 512, 512, 10], 2)
    assert p.submodels == [(40, 256, 256, 256, 10)] * 2
    counts = p.parameter_counts()
    full = 40 * 512 + 512 + 2 * (512 * 512 + 512) + 512 * 10 + 10
    sub = 40 * 256 + 256 + 2 * (256 * 256 + 256) + 256 * 10 + 10
    assert counts["full"] == full == MLP([40, 512, 512, 512, 10]).n_parameters
    assert counts["submodels"] == [sub, sub] and counts["submodels_total"] == 2 * sub
    # hidden-to-hidden matrices shrink by k^2, input and output layers by k
    assert [layer["shrink"] for layer in counts["layers"]] == [2.0, 4.0, 4.0, 2.0]
    assert [layer["shrink"] for layer in split_network([40, 512, 512, 512, 10], 4).parameter_counts()["layers"]] == [
        4.0,
        16.0,
        16.0,
        4.0,
    ]

    uneven = split_network([5, 7, 10, 3], 3)
    assert uneven.submodels == [(5, 3, 4, 3), (5, 2, 3, 3), (5, 2, 3, 3)]
    for widths in zip(*[s[1:-1] for s in uneven.submodels], strict=True):
        assert max(widths) - min(widths) <= 1
    assert uneven.parameter_counts()["submodels"] == [MLP(s).n_parameters for s in uneven.submodels]
    # the diagonal blocks tile the hidden layers exactly once
    masks = uneven.block_mask()
    assert masks[0].all() and masks[-1].all() and masks[1].sum() == 3 * 4 + 2 * 3 + 2 * 3


# -- merge ------------------------------------------------------------------------
def test_merge_mean_and_sum_match_the_submodels_logits_exactly():
    p = split_network([6, 9, 7, 4], 3)
    rng = np.random.default_rng(0)
    subs = []
    for g, sizes in enumerate(p.submodels):
        net = MLP(sizes, seed=g)
        # non-trivial biases of every layer, as trained sub-models have
        net = MLP.from_arrays(net.weights, [b + rng.normal(size=b.shape) for b in net.biases])
        subs.append(net)
    X = rng.normal(size=(50, 6))
    mean = merge_submodels(p, subs, combine="mean", noise=0.0)
    total = merge_submodels(p, subs, combine="sum", noise=0.0)
    expected_mean = sum(s.forward(X) for s in subs) / 3
    expected_sum = sum(s.forward(X) for s in subs)
    assert np.max(np.abs(mean.forward(X) - expected_mean)) <= 1e-12
    assert np.max(np.abs(total.forward(X) - expected_sum)) <= 1e-12
    assert np.array_equal(combine_logits(subs, X, combine="sum"), expected_sum)
    assert np.allclose(mean.biases[-1], np.mean([s.biases[-1] for s in subs], axis=0), rtol=0, atol=1e-15)
    # cross-group weights are zero without noise
    for W, mask in zip(mean.weights, p.block_mask(), strict=True):
        assert np.all(W[~mask] == 0)


def test_merge_noise_is_bounded_seeded_and_fills_the_zero_blocks():
    p = split_network([4, 8, 8, 3], 2)
    subs = [MLP(s, seed=g) for g, s in enumerate(p.submodels)]
    exact = merge_submodels(p, subs, noise=0.0)
    a = merge_submodels(p, subs, noise=0.05, seed=7)
    b = merge_submodels(p, subs, noise=0.05, seed=7)
    c = merge_submodels(p, subs, noise=0.05, seed=8)
    assert all(np.array_equal(x, y) for x, y in zip(a.params, b.params, strict=True))
    assert not all(np.array_equal(x, y) for x, y in zip(a.params, c.params, strict=True))
    for noisy, clean in zip(a.params, exact.params, strict=True):
        assert np.max(np.abs(noisy - clean)) <= 0.05 * np.max(np.abs(clean)) + 1e-15
    assert np.all(a.weights[1][~p.block_mask()[1]] != 0)


def test_diversity_is_zero_for_identical_models_and_positive_otherwise():
    X = np.random.default_rng(1).normal(size=(200, 6))
    a, b = MLP([6, 8, 3], seed=0), MLP([6, 8, 3], seed=1)
    same = submodel_diversity([a, a.copy()], X)
    assert same["representation"] == pytest.approx(0.0, abs=1e-12) and same["disagreement"] == 0.0
    other = submodel_diversity([a, b], X)
    assert 0 < other["representation"] <= 1 and 0 < other["disagreement"] <= 1
    # CKA ignores rotations and scaling of a representation
    H = np.random.default_rng(2).normal(size=(100, 5))
    Q, _ = np.linalg.qr(np.random.default_rng(3).normal(size=(5, 5)))
    assert linear_cka(H, 3.0 * H @ Q) == pytest.approx(1.0)


# -- training as futures ----------------------------------------------------------
def _reference_submodel(digits, partition, g, seed, steps, **settings):
    """The sub-model trained directly by the serial trainer, in this process."""
    return SerialTrainer(partition.submodel_sizes(g)[1:-1], **{**_settings(**settings), "seed": seed}).fit(
        digits.X_train, digits.y_train, steps=steps, validation_data=(digits.X_val, digits.y_val), eval_every=10
    )


def _compute_intervals(stream, marker):
    out = {}
    for record in stream:
        key = record["key"]
        key = key if isinstance(key, str) else str(key)
        if marker in key:
            for ss in record["startstops"]:
                if ss["action"] == "compute":
                    out.setdefault(key, []).append((ss["start"], ss["stop"], record["worker"]))
    return out


def test_submodels_run_at_the_same_time_on_different_workers_and_match_serial(client2, digits):
    # a cold worker spends its first second importing; that skew is not what this test measures
    client2.run(importlib.import_module, "daskann.partition.submodels")
    hidden = (128, 128)
    trainer = PartitionTrainer(
        hidden, **_settings(), k=2, merge={"noise": 0.0}, split={"sub_steps": 500}, client=client2
    )
    with get_task_stream(client=client2) as ts:
        trainer.fit(
            digits.X_train, digits.y_train, steps=30, validation_data=(digits.X_val, digits.y_val), eval_every=10
        )
    intervals = _compute_intervals(ts.data, trainer.run_prefix_)
    assert len(intervals) == 2, intervals
    (s0, e0, w0), (s1, e1, w1) = [v[-1] for _, v in sorted(intervals.items())]
    assert w0 != w1, "the sub-models ran on the same worker"
    overlap = min(e0, e1) - max(s0, s1)
    assert overlap > 0.3 * min(e0 - s0, e1 - s1), f"sub-models did not overlap: {intervals}"

    # each sub-model is exactly the serial trainer's run with its derived seed
    p = trainer.partition_
    assert trainer.seeds_ == submodel_seeds(3, 2) and len(set(trainer.seeds_)) == 2
    for g in range(2):
        ref = _reference_submodel(digits, p, g, trainer.seeds_[g], 500)
        assert all(np.array_equal(x, y) for x, y in zip(trainer.submodels_[g].params, ref.model_.params, strict=True))
    # noise-free "mean" merge: the merged network is the sub-models' ensemble
    X = digits.X_val
    assert np.max(np.abs(trainer.merged_model_.forward(X) - combine_logits(trainer.submodels_, X))) <= 1e-12
    # fine-tuning is the serial trainer from the merged network, momentum reset
    ref = SerialTrainer(hidden, **_settings()).fit(
        digits.X_train,
        digits.y_train,
        steps=30,
        validation_data=(X, digits.y_val),
        eval_every=10,
        init_model=trainer.merged_model_,
    )
    assert all(np.array_equal(x, y) for x, y in zip(trainer.model_.params, ref.model_.params, strict=True))
    assert all(np.array_equal(x, y) for x, y in zip(trainer.velocity_, ref.velocity_, strict=True))

    h = trainer.history_
    phases = list(h["phase"].values)
    assert phases == ["submodel"] * 500 + ["merge"] + ["finetune"] * 30
    assert np.all(np.diff(h["time"].values) >= 0) and h["step"].values[-1] == 531
    assert h["val_accuracy"].values[500] == pytest.approx(trainer.merged_model_.accuracy(X, digits.y_val))
    assert trainer.submodel_history_.sizes == {"submodel": 2, "step": 500}
    assert set(trainer.timings_) >= {"submodel", "merge", "finetune", "total"}
    assert 0 < trainer.diversity_["representation"] < 1 and 0 <= trainer.diversity_["disagreement"] <= 1


def test_sequential_mode_runs_one_after_another_with_the_same_submodels(client2, digits):
    kwargs = dict(**_settings(), k=3, merge={"noise": 0.02}, client=client2)
    par = PartitionTrainer((24, 24), **kwargs, split={"sub_steps": 40}).fit(digits.X_train, digits.y_train, steps=10)
    seq = PartitionTrainer((24, 24), **kwargs, split={"sub_steps": 40, "mode": "sequential"})
    with get_task_stream(client=client2) as ts:
        seq.fit(digits.X_train, digits.y_train, steps=10)
    spans = sorted(v[-1][:2] for v in _compute_intervals(ts.data, seq.run_prefix_).values())
    assert len(spans) == 3 and all(a[1] <= b[0] for a, b in itertools.pairwise(spans))
    # independent of the order and the workers: bit-identical sub-models and result
    for a, b in zip(par.submodels_ + [par.model_], seq.submodels_ + [seq.model_], strict=True):
        assert all(np.array_equal(x, y) for x, y in zip(a.params, b.params, strict=True))


# -- bad input --------------------------------------------------------------------
@pytest.mark.parametrize(
    "kwargs, error, name",
    [
        (dict(k=1), ValueError, "k=1"),
        (dict(k=17), ValueError, "k=17"),
        (dict(k=2.5), TypeError, "k=2.5"),
        (dict(hidden_sizes=()), ValueError, "hidden_sizes=[]"),
        (dict(merge={"noise": -0.01}), ValueError, "merge['noise']=-0.01"),
        (dict(merge={"noise": float("nan")}), ValueError, "merge['noise']=nan"),
        (dict(merge=PartitionMergeOptions(noise=float("inf"))), ValueError, "merge['noise']=inf"),
        (dict(merge={"combine": "max"}), ValueError, "merge['combine']='max'"),
        (dict(merge={"finetune_trainer": "gpu"}), ValueError, "merge['finetune_trainer']='gpu'"),
        (dict(merge={"noise_level": 0.1}), ValueError, "merge['noise_level']=0.1 is not valid: expected one of"),
        (dict(merge="mean"), TypeError, "merge='mean' is not valid: expected None, a dict"),
        (dict(split={"mode": "async"}), ValueError, "split['mode']='async'"),
        (dict(split={"sub_trainer": "torch"}), ValueError, "split['sub_trainer']='torch'"),
        (dict(split={"sub_steps": 0}), ValueError, "split['sub_steps']=0"),
        (dict(split={"sub_steps": 5, "sub_epochs": 1}), ValueError, "at most one of 'sub_steps' and 'sub_epochs'"),
        (dict(split=PartitionSplitOptions(retries=-1)), ValueError, "split['retries']=-1"),
        (dict(split={"timeout": 0}), ValueError, "split['timeout']=0"),
        (dict(split={"npt_options": "1x2"}), TypeError, "split['npt_options']='1x2'"),
        (dict(split={"steps": 5}), ValueError, "split['steps']=5 is not valid: expected one of the split options"),
    ],
)
def test_bad_input_fails_before_any_task(client2, digits, kwargs, error, name):
    params = dict(hidden_sizes=(16, 32), **_settings(), k=2, client=client2)
    params.update(kwargs)
    with no_tasks_submitted(client2), pytest.raises(error, match=None) as info:
        PartitionTrainer(**params).fit(digits.X_train, digits.y_train, steps=5)
    assert name in str(info.value)


def test_bad_target_fails_before_any_task(client2):
    for target in (0.0, -0.1, 1.01, float("nan")):
        with no_tasks_submitted(client2), pytest.raises(ValueError, match="target="):
            run_benchmark(BenchmarkConfig.preset("digits", target=target), client=client2)
    with pytest.raises(ValueError, match="k=64"):
        BenchmarkConfig.preset("digits", hidden=(32, 32), ks=(2, 64))
    assert time_to_target([1.0, 2.0, 3.0], [0.5, 0.9, 0.95], 0.9) == 2.0
    assert time_to_target([1.0], [0.5], 0.9) is None


# -- failures ---------------------------------------------------------------------
@contextlib.contextmanager
def _allowed_failures(client, value):
    old = client.run_on_scheduler(lambda dask_scheduler: dask_scheduler.allowed_failures)
    client.run_on_scheduler(lambda dask_scheduler: setattr(dask_scheduler, "allowed_failures", value))
    try:
        yield
    finally:
        client.run_on_scheduler(lambda dask_scheduler: setattr(dask_scheduler, "allowed_failures", old))


def _kill_worker_running(client, marker, stop, found):
    """Kill (os._exit) the worker that runs the task whose key contains ``marker``."""
    deadline = time.time() + 60
    while time.time() < deadline and not stop.is_set():
        for worker, keys in client.processing().items():
            if any(marker in str(k) for k in keys):
                found.append(worker)
                with contextlib.suppress(Exception):
                    client.run(os._exit, 1, workers=[worker])
                return
        time.sleep(0.02)


def _fit_with_killer(client, trainer, digits, marker, steps):
    stop, found = threading.Event(), []
    killer = threading.Thread(target=_kill_worker_running, args=(client, marker, stop, found), daemon=True)
    killer.start()
    try:
        trainer.fit(digits.X_train, digits.y_train, steps=steps)
    finally:
        stop.set()
        killer.join(10)
        restore_workers(client, 2)
    return found


def test_a_submodel_whose_worker_dies_is_rerun_with_the_same_result(client2, digits):
    kwargs = dict(**_settings(), k=2, merge={"noise": 0.0}, split={"sub_steps": 1000}, client=client2)
    trainer = PartitionTrainer((64, 64), **kwargs)
    killed = _fit_with_killer(client2, trainer, digits, "partition-", steps=5)
    assert killed, "no sub-model task was seen running"
    ref = [_reference_submodel(digits, trainer.partition_, g, trainer.seeds_[g], 1000) for g in range(2)]
    for sub, r in zip(trainer.submodels_, ref, strict=True):
        assert all(np.array_equal(x, y) for x, y in zip(sub.params, r.model_.params, strict=True))


def test_a_submodel_that_fails_for_good_is_named_and_the_others_are_kept(client2, digits, tmp_path):
    kwargs = dict(
        **_settings(),
        k=2,
        merge={"noise": 0.0},
        split={"sub_steps": 20, "retries": 2},
        client=client2,
        checkpoint=tmp_path,
    )
    first = PartitionTrainer((16, 16), **kwargs).fit(digits.X_train, digits.y_train, steps=5)
    # damage sub-model 1's only checkpoint: resuming it raises on every attempt
    ckpt = store.list_checkpoints(tmp_path / "partition" / "submodel-1")[0]
    (ckpt / "zarr.json").write_text("{damaged")
    again = PartitionTrainer((16, 16), **kwargs)
    with pytest.raises(SubModelError, match="sub-model 1 of 2") as info:
        again.fit(digits.X_train, digits.y_train, steps=5, resume=tmp_path)
    assert "DamagedStoreError" in str(info.value) and "[0] are kept" in str(info.value)
    assert set(info.value.failed) == {1}
    assert again.submodels_[1] is None
    assert all(
        np.array_equal(x, y) for x, y in zip(again.submodels_[0].params, first.submodels_[0].params, strict=True)
    )
    # the scheduler's records: the failing task was sent to a worker 1 + retries times
    key = f"{again.run_prefix_}-submodel-1"
    story = client2.run_on_scheduler(lambda dask_scheduler: [s[1:3] for s in dask_scheduler.story(key)])
    attempts = [s for s in story if s[1] == "processing"]
    assert len(attempts) == 3, f"expected 1 + retries=2 attempts: {story}"


def test_a_diverging_submodel_is_named_with_the_serial_trainers_own_error(client2, digits):
    # the error crosses from the worker whole: its type, and the step and cause serial training names
    diverging = _settings(lr=1e200, sgd={"momentum": 0.0})
    trainer = PartitionTrainer((16, 16), **diverging, k=2, split={"sub_steps": 50, "retries": 0}, client=client2)
    with pytest.raises(SubModelError, match=r"TrainingDiverged: training diverged at step") as info:
        trainer.fit(digits.X_train, digits.y_train, steps=5)
    assert info.value.failed
    for g, error in info.value.failed.items():
        with pytest.raises(TrainingDiverged) as serial:
            _reference_submodel(digits, trainer.partition_, g, trainer.seeds_[g], 50, lr=1e200, sgd={"momentum": 0.0})
        assert type(error) is TrainingDiverged and (error.step, error.what) == (serial.value.step, serial.value.what)


def test_a_worker_death_beyond_the_allowed_failures_names_the_submodel(client2, digits):
    trainer = PartitionTrainer(
        (64, 64),
        **_settings(),
        k=2,
        merge={"noise": 0.0},
        split={"sub_steps": 1000, "retries": 0},
        client=client2,
    )
    with _allowed_failures(client2, 0), pytest.raises(SubModelError, match=r"sub-model \d of 2 failed") as info:
        _fit_with_killer(client2, trainer, digits, "submodel-1", steps=5)
    assert set(info.value.failed) == {1} and "KilledWorker" in str(info.value)
    assert trainer.submodels_[0] is not None and trainer.submodels_[1] is None


def test_a_slow_submodel_phase_times_out_instead_of_hanging(client2, digits):
    # sub-models of a second or more: the deadline is seen within 0.1 s (as_completed's poll), before either ends
    split = {"sub_steps": 10000, "timeout": 0.01}
    trainer = PartitionTrainer((32, 32), **_settings(), k=2, split=split, client=client2)
    with pytest.raises(TimeoutError, match=r"timeout=0.01 s is not enough: sub-models \[0, 1\]"):
        trainer.fit(digits.X_train, digits.y_train, steps=5)
    # the cancelled tasks leave the cluster usable
    client2.submit(sum, [1, 2], pure=False).result(timeout=60)


def test_resume_skips_finished_submodels_and_continues_fine_tuning(client2, digits, tmp_path):
    kwargs = dict(
        **_settings(), k=2, merge={"noise": 0.02}, split={"sub_steps": 30}, client=client2, checkpoint={"every": 10}
    )
    run = {**kwargs, "checkpoint": {"dir": tmp_path / "a", "every": 10}}
    PartitionTrainer((16, 16), **run).fit(digits.X_train, digits.y_train, steps=20)
    resumed = PartitionTrainer((16, 16), **run).fit(digits.X_train, digits.y_train, steps=40, resume=tmp_path / "a")
    assert [r.resumed_from for r in resumed.submodel_results_] == [30, 30]
    straight = PartitionTrainer((16, 16), **kwargs).fit(digits.X_train, digits.y_train, steps=40)
    assert resumed.n_steps_ == 40
    for x, y in zip(
        resumed.model_.params + resumed.velocity_, straight.model_.params + straight.velocity_, strict=True
    ):
        assert np.array_equal(x, y)
    with pytest.raises(store.StoreError, match="other settings"):
        PartitionTrainer((16, 16), **kwargs).set_params(merge__noise=0.0).fit(
            digits.X_train, digits.y_train, steps=40, resume=tmp_path / "a"
        )
    # a damaged record of the run's settings is refused by name, before any task
    (tmp_path / "a" / "partition" / "config.json").write_text('{"k": 2, ')
    with no_tasks_submitted(client2), pytest.raises(store.StoreError, match=r"resume=.*: config.json is damaged"):
        PartitionTrainer((16, 16), **run).fit(digits.X_train, digits.y_train, steps=40, resume=tmp_path / "a")


# -- command line, benchmark, notebook ------------------------------------------------
def test_train_partition_command(client2, tmp_path):
    out = tmp_path / "run"
    args = [
        "--dataset",
        "digits",
        "--hidden",
        "32,32",
        "-k",
        "2",
        "--sub-steps",
        "30",
        "--steps",
        "20",
        "--lr",
        "0.1",
        "--momentum",
        "0.9",
        "--merge-noise",
        "0",
        "--address",
        client2.scheduler.address,
        "-o",
        str(out),
        "--json",
        "-q",
    ]
    result = CliRunner().invoke(train_command, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output)
    assert summary["method"] == "partition" and summary["k"] == 2 and summary["steps"] == 20
    assert summary["submodel_sizes"] == [[64, 16, 16, 10]] * 2 and len(summary["workers"]) == 2
    assert 0 <= summary["val_accuracy"] <= 1 and "diversity_representation" in summary
    assert store.load_checkpoint(out / "model.zarr").step == 20
    history = store.load_history(out / "history.zarr")
    assert set(history["phase"].values) == {"submodel", "merge", "finetune"}
    for bad, message in (
        (["-k", "1"], "k=1 is not valid"),
        (["--merge-noise", "-1"], "noise=-1.0 is not valid"),
        (["--combine", "max"], "max"),
    ):
        with no_tasks_submitted(client2):
            result = CliRunner().invoke(
                train_command, ["--dataset", "digits", "--hidden", "32", *bad, "--address", client2.scheduler.address]
            )
        assert result.exit_code != 0 and message in result.output, result.output


def test_bench_partition_writes_report_and_plot(client2, tmp_path):
    args = [
        "--dataset",
        "digits",
        "--hidden",
        "32,32",
        "-k",
        "2",
        "--seeds",
        "2",
        "--steps",
        "60",
        "--sub-steps",
        "30",
        "--finetune-steps",
        "40",
        "--eval-every",
        "10",
        "--target",
        "0.8",
        "--address",
        client2.scheduler.address,
        "-o",
        str(tmp_path),
        "-q",
    ]
    result = CliRunner().invoke(bench_command, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "parallel-2" in result.output and "sequential-2" in result.output and "BLAS" in result.output
    report = json.loads((tmp_path / "partition-bench.json").read_text())
    assert (tmp_path / "partition-bench.png").stat().st_size > 10_000
    assert {r["variant"] for r in report["runs"]} == {"full", "alone-2", "parallel-2", "sequential-2"}
    assert len(report["runs"]) == 8 and report["machine"]["workers"] == 2
    assert all(r["identical_submodels"] for r in report["runs"] if r["variant"] == "sequential-2")
    assert set(report["summary"]) == {"full", "alone-2", "parallel-2", "sequential-2"}
    assert "parallel-2_median_speedup" in report["acceptance"]
    bad = CliRunner().invoke(bench_command, ["--target", "1.5", "--address", client2.scheduler.address])
    assert bad.exit_code != 0 and "target=1.5 is not valid" in bad.output


def test_bench_partition_paper_model_tiny(client2, tmp_path):
    args = ["--model", "paper-430k", "--hidden", "16,16", "-k", "2", "--seeds", "1", "--n-samples", "400"]
    args += ["--steps", "40", "--sub-steps", "20", "--finetune-steps", "20", "--eval-every", "10", "--target", "0.3"]
    args += ["--address", client2.scheduler.address, "-o", str(tmp_path), "-q"]
    result = CliRunner().invoke(bench_command, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "model paper-430k: 784-16-16-10, 13,002 parameters; data mnist1d-784: MNIST-1D" in result.output
    assert "gap par (pts)" in result.output and "paper parallel-2: 2.10x" in result.output
    report = json.loads((tmp_path / "partition-bench.json").read_text())
    assert report["config"]["model"] == "paper-430k" and report["config"]["dataset"] == "mnist1d-784"
    assert report["data"]["n_features"] == 784 and report["data"]["n_train"] == 320
    assert report["model"]["parameters"] == 784 * 16 + 16 + 16 * 16 + 16 + 16 * 10 + 10
    assert report["model"]["submodel_parameters"] == {"2": 784 * 8 + 8 + 8 * 8 + 8 + 8 * 10 + 10}
    full = next(r for r in report["runs"] if r["variant"] == "full")
    for run in report["runs"]:
        if run["variant"] in ("parallel-2", "sequential-2"):
            before = [a for t, a in full["curve"] if t <= run["seconds"]]
            assert run["full_accuracy_at_equal_time"] == (before[-1] if before else None)
            if before:
                gap = 100 * (run["final_accuracy"] - before[-1])
                assert run["accuracy_gap_points"] == pytest.approx(gap, abs=1e-3)
            assert "median_accuracy_gap_points" in report["summary"][run["variant"]]
    rows = report["table"]
    assert [r["seed"] for r in rows] == [0, "median"] and {r["k"] for r in rows} == {2}
    assert set(rows[0]) == {
        "model",
        "parameters",
        "k",
        "seed",
        "parallel_speedup",
        "sequential_speedup",
        "parallel_gap_points",
        "sequential_gap_points",
    }
    assert set(report["acceptance"]["paper"]) == {"parallel-2", "sequential-2", "met"}
    assert "parallel-2_median_speedup" in report["acceptance"]


def test_bench_partition_paper_presets():
    small = BenchmarkConfig.preset(model="paper-430k")
    assert (small.dataset, small.hidden, small.ks, small.seeds) == ("mnist1d-784", (368, 368), (2, 4), 3)
    large = BenchmarkConfig.from_options(model="paper-2.1m", data_path="/data/mnist")
    assert (large.dataset, large.hidden, large.seeds, large.data_path) == ("mnist", (844, 844, 844), 3, "/data/mnist")
    assert BenchmarkConfig.from_options().dataset == "mnist1d" and BenchmarkConfig.from_options().seeds == 5
    with pytest.raises(ValueError, match="dataset='digits'"):
        BenchmarkConfig.preset("digits", model="paper-430k")
    with pytest.raises(ValueError, match="dataset='mnist1d-784'"):
        BenchmarkConfig.preset("mnist1d-784")
    from daskann.bench.partition_models import accuracy_at

    assert accuracy_at([[1.0, 0.5], [2.0, 0.6], [3.0, 0.7]], 2.5) == 0.6
    assert accuracy_at([[1.0, 0.5]], 0.5) is None


def test_demo_and_notebook(client2, monkeypatch):
    from daskann.partition.cli import run_demo

    summary = run_demo(client2, quick=True)
    assert summary["method"] == "partition" and summary["k"] == 2 and 0 < summary["val_accuracy"] <= 1
    monkeypatch.setenv("DASKANN_SCHEDULER", client2.scheduler.address)
    nb = run_notebook(ROOT / "examples" / "partition.ipynb", timeout=300)
    outputs = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))
    assert "max |merged - mean of sub-models|" in outputs


def test_npt_sub_trainer(client2, digits):
    npt = pytest.importorskip("daskann.npt")
    if not hasattr(npt, "NPTTrainer"):
        pytest.skip("daskann.npt has no NPTTrainer")
    with no_tasks_submitted(client2), pytest.raises(ValueError, match=r"split\['mode'\]='parallel'"):
        PartitionTrainer((16, 16), **_settings(), k=2, split={"sub_trainer": "npt"}, client=client2).fit(
            digits.X_train, digits.y_train, steps=5
        )
    trainer = PartitionTrainer(
        (16, 16),
        **_settings(),
        k=2,
        merge={"noise": 0.0},
        split={
            "sub_steps": 4,
            "sub_trainer": "npt",
            "mode": "sequential",
            "npt_options": {"grid": "1x2", "mode": "graph"},
        },
        client=client2,
    )
    trainer.fit(digits.X_train, digits.y_train, steps=5)
    for g in range(2):
        ref = _reference_submodel(digits, trainer.partition_, g, trainer.seeds_[g], 4)
        for x, y in zip(trainer.submodels_[g].params, ref.model_.params, strict=True):
            assert np.max(np.abs(x - y)) <= 1e-10
    assert [r.extra["grid"] for r in trainer.submodel_results_] == ["1x2", "1x2"]
    # fine-tuning on the grid too, from the merged network
    ref = SerialTrainer((16, 16), **_settings()).fit(
        digits.X_train, digits.y_train, steps=5, init_model=trainer.merged_model_
    )
    for x, y in zip(trainer.model_.params, ref.model_.params, strict=True):
        assert np.max(np.abs(x - y)) <= 1e-10
    assert math.isfinite(trainer.history_["loss"].values[-1])
