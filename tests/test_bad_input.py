"""The bad-input catalogue: every case fails fast, names the parameter and submits no task.

One list, :data:`CASES`, counts the catalogue (issue 6, point 4). Each case is
a function ``(env) -> None`` that must raise; the test checks

* the error type (for the command line: the exit status and that click printed
  an error, not a traceback),
* that the message names the parameter (a regular expression per case),
* that the scheduler of the shared 4-worker cluster made no task transition
  (:func:`conftest.no_tasks_submitted`); command-line cases connect to that same
  scheduler with ``--address``, so the check covers them too. Cases that need a
  cluster of their own (multi-threaded workers, tiny memory limits) check that
  cluster's scheduler instead.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import dask
import numpy as np
import pytest
from click.testing import CliRunner
from conftest import no_tasks_submitted
from distributed import Client, LocalCluster

from daskann import SerialTrainer, store
from daskann.cli import main
from daskann.cluster import client as make_client
from daskann.data import make_linear
from daskann.mgrit import MGRITSolverOptions, MGRITTrainer
from daskann.nn import MLP
from daskann.npt import NPTEngineOptions, NPTTrainer
from daskann.partition import PartitionMergeOptions, PartitionSplitOptions, PartitionTrainer

# MGRIT fits here must run the solve, which the default policy skips for problems this small
pytestmark = pytest.mark.usefixtures("mgrit_study")

IS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0


@dataclass
class Env:
    client: Client
    tmp: Path
    X: np.ndarray
    y: np.ndarray
    labels: np.ndarray

    @property
    def address(self) -> str:
        return self.client.scheduler.address


@dataclass
class Case:
    id: str
    group: str  # npt, mgrit, partition, serial, data, store, cluster, cli
    run: Callable[[Env], None]
    error: type | int  # exception type, or a command-line exit status
    names: str  # regular expression the message must contain (the parameter)
    skip: Callable[[], str | None] | None = None
    own_cluster: bool = False  # the case checks a cluster of its own for submitted tasks


# -- helpers -------------------------------------------------------------------------------------------------------
def _npt(env, **kwargs):
    params = dict(grid="2x2", mode="graph", batch_size=16, client=env.client)
    params.update(kwargs)
    return NPTTrainer((5,), **params)


def _mgrit(env, **kwargs):
    params = dict(solver={"levels": 2, "cfactor": 4}, batch_size=16, client=env.client)
    if isinstance(kwargs.get("solver"), dict):
        kwargs["solver"] = {**params["solver"], **kwargs["solver"]}
    params.update(kwargs)
    return MGRITTrainer((5,), **params)


def _partition(env, **kwargs):
    params = dict(k=2, batch_size=16, client=env.client)
    params.update(kwargs)
    return PartitionTrainer((6,), **params)


def _fit(trainer, env, steps=8, X=None, y=None, **kwargs):
    trainer.fit(env.X if X is None else X, env.y if y is None else y, steps=steps, **kwargs)


def _with_nan(a):
    a = a.copy()
    a[3, 1] = np.nan
    return a


def _sparse(a):
    from scipy import sparse

    return sparse.csr_array(a)


def _with_inf(a):
    a = a.copy()
    a[5, 0] = np.inf
    return a


def _checkpoint_dir(env) -> Path:
    """A run folder with a real checkpoint of the (6, 5, 2) network env's data implies."""
    folder = env.tmp / "run"
    SerialTrainer((5,), batch_size=16, checkpoint=folder).fit(env.X, env.y, steps=2)
    return folder


def _damaged_checkpoint(env) -> Path:
    folder = _checkpoint_dir(env)
    ckpt = store.find_checkpoint(folder)
    chunk = next(p for p in sorted(ckpt.rglob("*")) if p.is_file() and "weights" in str(p) and p.name != "zarr.json")
    data = bytearray(chunk.read_bytes())
    data[len(data) // 2] ^= 0xFF
    chunk.write_bytes(bytes(data))
    return ckpt


def _foreign_store(env) -> Path:
    import zarr

    path = env.tmp / "foreign.zarr"
    zarr.open_group(str(path), mode="w").attrs["hello"] = "not daskann"
    return path


def _truncated_store(env) -> Path:
    ckpt = store.find_checkpoint(_checkpoint_dir(env))
    meta = ckpt / "zarr.json"
    meta.write_text(meta.read_text()[:40])
    return ckpt


@contextlib.contextmanager
def _locked(folder: Path):
    """``folder`` as another live run writing it would leave it: its lock held by a live process."""
    import json
    import socket

    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / store.LOCK_NAME).write_text(
            json.dumps({"host": socket.gethostname(), "pid": other.pid, "since": time.time()})
        )
        yield
    finally:
        other.kill()
        other.wait()


def _locked_fit(make, env):
    folder = env.tmp / "busy"
    with _locked(folder):
        _fit(make(env, checkpoint=folder), env)


def _full_fit(make, env, **kwargs):
    """A file system with 1000 bytes free under the run folder."""
    import shutil
    from unittest import mock

    usage = shutil.disk_usage(env.tmp)._replace(free=1000)
    with mock.patch("daskann.store._run_dir.shutil.disk_usage", return_value=usage):
        _fit(make(env, **kwargs), env, steps=64)


def _readonly_fit(env):
    folder = env.tmp / "readonly"
    folder.mkdir()
    folder.chmod(0o500)
    try:
        _fit(_npt(env, checkpoint=folder / "run"), env)
    finally:
        folder.chmod(0o700)


def _shared_directory_fit(folder):
    """An MGRIT fit on the cluster without a store, ``daskann.cluster.shared-directory`` naming ``folder(tmp)``."""

    def run(env):
        with dask.config.set({"daskann.cluster.shared-directory": str(folder(env.tmp))}):
            _fit(_mgrit(env), env)

    return run


def _readonly_shared_fit(env):
    folder = env.tmp / "readonly-shared"
    folder.mkdir()
    folder.chmod(0o500)
    try:
        _shared_directory_fit(lambda tmp: folder)(env)
    finally:
        folder.chmod(0o700)


def _readonly_filesystem():
    return None if not os.access("/proc/sys", os.W_OK) and os.path.isdir("/proc/sys") else "no read-only folder"


def _multithreaded(env):
    with (
        LocalCluster(n_workers=1, threads_per_worker=2, processes=False, dashboard_address=None) as cluster,
        Client(cluster, set_as_default=False) as c,
        no_tasks_submitted(c),
    ):
        _fit(_npt(env, grid="1x1", client=c), env)


#: memory monitor off on the tiny in-process cluster (its process is far above 64 MiB); the
#: nanny's terminate fraction off too, so the check compares with the whole memory_limit
_NO_MONITOR = {f"distributed.worker.memory.{k}": False for k in ("target", "spill", "pause", "terminate")}


def _out_of_memory(make):
    """A training whose data per worker exceeds the workers' 64 MiB memory_limit."""

    def run(env):
        X = np.random.default_rng(0).standard_normal((9000, 1000))  # 72 MB, above 64 MiB
        y = X[:, :2].copy()
        with (
            dask.config.set(_NO_MONITOR),
            LocalCluster(
                n_workers=2,
                threads_per_worker=1,
                processes=False,
                memory_limit="64MiB",
                dashboard_address=None,
            ) as cluster,
            Client(cluster, set_as_default=False) as c,
            no_tasks_submitted(c),
        ):
            make(c).fit(X, y, steps=16)

    return run


def _cli(*args, env_address=True):
    """``daskann train ...`` in-process; raise what the case checks (exit status, output)."""

    def run(env):
        full = [*args, "--n-samples", "64", "--batch-size", "16", "--steps", "4", "-q"]
        if env_address:
            full += ["--address", env.address]
        result = CliRunner().invoke(main, [str(a).replace("{tmp}", str(env.tmp)) for a in full])
        raise CliFailure(result.exit_code, result.output, result.exception)

    return run


class CliFailure(Exception):
    def __init__(self, code, output, exception):
        super().__init__(output)
        self.code, self.output, self.exception = code, output, exception


def _cli_subprocess(*args):
    def run(env):
        cmd = [
            sys.executable,
            "-m",
            "daskann",
            *args,
            "--n-samples",
            "64",
            "--batch-size",
            "16",
            "--steps",
            "4",
            "-q",
            "--address",
            env.address,
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=env.tmp)
        raise CliFailure(proc.returncode, proc.stdout + proc.stderr, None)

    return run


def _unreachable(env):
    start = time.perf_counter()
    try:
        make_client("tcp://127.0.0.1:1", timeout=2, quiet=True)
    finally:
        assert time.perf_counter() - start < 15, "an unreachable scheduler must fail in bounded time"


# -- the catalogue -------------------------------------------------------------------------------------------------
CASES: list[Case] = [
    # data: shapes, dtypes, non-finite values (one trainer each, all four covered)
    Case(
        "data-X-1d",
        "data",
        lambda e: _fit(_npt(e), e, X=e.X[:, 0]),
        ValueError,
        r"Expected 2D array.*Reshape your data",
    ),
    Case("data-X-3d", "data", lambda e: _fit(_npt(e), e, X=e.X[:, :, None]), ValueError, r"Found array with dim 3"),
    Case(
        "data-X-strings",
        "data",
        lambda e: _fit(_mgrit(e), e, X=np.full(e.X.shape, "a", dtype=object)),
        ValueError,
        r"could not convert string to float",
    ),
    Case("data-X-complex", "data", lambda e: _fit(_npt(e), e, X=e.X + 1j), ValueError, r"Complex data not supported"),
    Case(
        "data-X-sparse", "data", lambda e: _fit(_npt(e), e, X=_sparse(e.X)), TypeError, r"Sparse data was passed for X"
    ),
    Case("data-X-empty", "data", lambda e: _fit(_npt(e), e, X=e.X[:0], y=e.y[:0]), ValueError, r"0 sample\(s\)"),
    Case("data-X-no-features", "data", lambda e: _fit(_npt(e), e, X=e.X[:, :0]), ValueError, r"0 feature\(s\)"),
    Case(
        "data-X-ragged",
        "data",
        lambda e: _fit(_partition(e), e, X=[[1.0, 2.0], [3.0]] * 32),
        ValueError,
        r"inhomogeneous",
    ),
    Case("data-X-nan", "data", lambda e: _fit(_partition(e), e, X=_with_nan(e.X)), ValueError, r"X=.*NaN"),
    Case("data-y-inf", "data", lambda e: _fit(_npt(e), e, y=_with_inf(e.y)), ValueError, r"Input y contains infinity"),
    Case("data-y-none", "data", lambda e: _npt(e).fit(e.X, None, steps=8), ValueError, r"requires y to be passed"),
    Case(
        "data-y-rows", "data", lambda e: _fit(_mgrit(e), e, y=e.y[:-1]), ValueError, r"inconsistent numbers of samples"
    ),
    Case(
        "data-labels-continuous",
        "data",
        lambda e: _fit(_npt(e, loss="cross_entropy"), e, y=e.y[:, 0]),
        ValueError,
        r"Unknown label type: continuous",
    ),
    Case(
        "data-labels-2d",
        "data",
        lambda e: _fit(_partition(e, loss="cross_entropy"), e, y=np.c_[e.labels, e.labels]),
        ValueError,
        r"y should be a 1d array",
    ),
    Case(
        "data-validation-width",
        "data",
        lambda e: _fit(_npt(e), e, validation_data=(e.X[:, :3], e.y)),
        ValueError,
        r"validation_data\[0\]=",
    ),
    Case(
        "data-init-model-sizes",
        "data",
        lambda e: _fit(_mgrit(e), e, init_model=MLP((6, 4, 2))),
        ValueError,
        r"init_model=",
    ),
    # common settings
    Case("settings-lr-nan", "serial", lambda e: _fit(SerialTrainer((5,), lr=float("nan")), e), ValueError, r"lr="),
    Case(
        "settings-momentum-1",
        "npt",
        lambda e: _fit(_npt(e, sgd={"momentum": 1.0}), e),
        ValueError,
        r"sgd\['momentum'\]=",
    ),
    Case("settings-batch-0", "partition", lambda e: _fit(_partition(e, batch_size=0), e), ValueError, r"batch_size="),
    Case("settings-epochs-0", "mgrit", lambda e: _fit(_mgrit(e, epochs=0), e, steps=None), ValueError, r"epochs="),
    Case("settings-steps-float", "npt", lambda e: _fit(_npt(e, steps=2.5), e, steps=None), TypeError, r"steps="),
    Case(
        "settings-dtype-f16",
        "mgrit",
        lambda e: _fit(_mgrit(e, network={"dtype": "float16"}), e),
        TypeError,
        r"network\['dtype'\]=",
    ),
    Case("settings-steps-0", "npt", lambda e: _fit(_npt(e), e, steps=0), ValueError, r"steps="),
    # NPT: grids and modes
    Case(
        "npt-grid-larger-than-cluster",
        "npt",
        lambda e: _fit(_npt(e, grid="3x3"), e),
        ValueError,
        r"grid='3x3'.*share_workers",
    ),
    Case("npt-grid-unknown", "npt", lambda e: _fit(_npt(e, grid="wide"), e), ValueError, r"grid='wide'"),
    Case("npt-grid-not-rectangular", "npt", lambda e: _fit(_npt(e, grid="2x3x4"), e), ValueError, r"grid='2x3x4'"),
    Case("npt-grid-zero", "npt", lambda e: _fit(_npt(e, grid=(0, 2)), e), ValueError, r"grid\[0\]=0"),
    Case("npt-mode-unknown", "npt", lambda e: _fit(_npt(e, mode="fast"), e), ValueError, r"mode='fast'"),
    Case(
        "npt-pipeline-unknown",
        "npt",
        lambda e: _fit(_npt(e, engine={"pipeline": "deep"}), e),
        ValueError,
        r"engine\['pipeline'\]='deep'.*'fused'",
    ),
    Case(
        "npt-engine-unknown-key",
        "npt",
        lambda e: _fit(_npt(e, engine={"pipelines": "fused"}), e),
        ValueError,
        r"engine\['pipelines'\]='fused' is not valid: expected one of the engine options .*'pipeline'",
    ),
    Case(
        "npt-engine-not-a-group",
        "npt",
        lambda e: _fit(_npt(e, engine="fast"), e),
        TypeError,
        r"engine='fast'.*NPTEngineOptions",
    ),
    Case(
        "npt-engine-options-timeout-0",
        "npt",
        lambda e: _fit(_npt(e, engine=NPTEngineOptions(timeout=0)), e),
        ValueError,
        r"engine\['timeout'\]=0",
    ),
    Case(
        "npt-multithreaded-deterministic",
        "npt",
        _multithreaded,
        ValueError,
        r"engine\['deterministic'\]=True",
        own_cluster=True,
    ),
    # MGRIT: solver parameters and stores
    Case(
        "mgrit-levels-too-deep",
        "mgrit",
        lambda e: _fit(_mgrit(e, solver={"levels": 9}), e, steps=64),
        ValueError,
        r"solver\['levels'\]=",
    ),
    Case(
        "mgrit-cfactor-1",
        "mgrit",
        lambda e: _fit(_mgrit(e, solver={"cfactor": 1}), e),
        ValueError,
        r"solver\['cfactor'\]=1",
    ),
    Case(
        "mgrit-cfactor-not-a-number",
        "mgrit",
        lambda e: _fit(_mgrit(e, solver={"levels": None, "cfactor": [4, "a"]}), e, steps=64),
        TypeError,
        r"solver\['cfactor'\]\[1\]='a' is not valid: expected an integer",
    ),
    Case(
        "mgrit-solver-unknown-key",
        "mgrit",
        lambda e: _fit(_mgrit(e, solver={"cfactr": 2}), e),
        ValueError,
        r"solver\['cfactr'\]=2 is not valid: expected one of the solver options .*'cfactor'",
    ),
    Case(
        "mgrit-engine-unknown-key",
        "mgrit",
        lambda e: _fit(_mgrit(e, engine={"schedular": "sync"}), e),
        ValueError,
        r"engine\['schedular'\]='sync' is not valid: expected one of the engine options .*'scheduler'",
    ),
    Case(
        "mgrit-solver-not-a-group",
        "mgrit",
        lambda e: _fit(_mgrit(e, solver=["levels", 2]), e),
        TypeError,
        r"solver=\['levels', 2\].*a dict of solver options or MGRITSolverOptions",
    ),
    Case(
        "mgrit-solver-options-cycle-unknown",
        "mgrit",
        lambda e: _fit(_mgrit(e, solver=MGRITSolverOptions(levels=2, cycle_type="W")), e),
        ValueError,
        r"solver\['cycle_type'\]='W'",
    ),
    Case(
        "mgrit-require-convergence-not-bool",
        "mgrit",
        lambda e: _fit(_mgrit(e, solver={"require_convergence": "yes"}), e),
        TypeError,
        r"solver\['require_convergence'\]='yes'.*True or False",
    ),
    Case(
        "mgrit-preset-unknown", "mgrit", lambda e: _fit(_mgrit(e, preset="solver9"), e), ValueError, r"preset='solver9'"
    ),
    Case("mgrit-tol-0", "mgrit", lambda e: _fit(_mgrit(e, solver={"tol": 0.0}), e), ValueError, r"solver\['tol'\]="),
    Case(
        "mgrit-steps-too-few",
        "mgrit",
        lambda e: _fit(_mgrit(e, solver={"levels": 3, "cfactor": 4}), e, steps=3),
        ValueError,
        r"solver\['levels'\]=.*steps",
    ),
    Case(
        "mgrit-scheduler-unknown",
        "mgrit",
        lambda e: _fit(_mgrit(e, engine={"scheduler": "gpu"}), e),
        ValueError,
        r"engine\['scheduler'\]='gpu'",
    ),
    Case(
        "mgrit-store-is-a-file",
        "mgrit",
        lambda e: (
            e.tmp.joinpath("file.zarr").write_text("x"),
            _fit(_mgrit(e, engine={"store": e.tmp / "file.zarr"}), e),
        ),
        store.StoreError,
        r"store=.*a folder",
    ),
    Case(
        "mgrit-shared-directory-missing",
        "mgrit",
        _shared_directory_fit(lambda tmp: tmp / "missing"),
        FileNotFoundError,
        r"^daskann\.cluster\.shared-directory='[^\n]*missing' is not valid: expected an existing folder [^\n]*$",
    ),
    Case(
        "mgrit-shared-directory-read-only-chmod",
        "mgrit",
        _readonly_shared_fit,
        PermissionError,
        r"^daskann\.cluster\.shared-directory='[^\n]*readonly-shared' is not valid: expected a folder this user can",
        skip=lambda: "chmod does not bind root" if IS_ROOT else None,
    ),
    Case(
        "mgrit-shared-directory-read-only-filesystem",
        "mgrit",
        _shared_directory_fit(lambda tmp: Path("/proc/sys")),
        PermissionError,
        r"^daskann\.cluster\.shared-directory='/proc/sys' is not valid: expected a folder this user can write to$",
        skip=_readonly_filesystem,
    ),
    # partition: k, merge, noise
    Case("partition-k-1", "partition", lambda e: _fit(_partition(e, k=1), e), ValueError, r"k=1"),
    Case("partition-k-wider-than-layer", "partition", lambda e: _fit(_partition(e, k=7), e), ValueError, r"k=7"),
    Case(
        "partition-combine-unknown",
        "partition",
        lambda e: _fit(_partition(e, merge={"combine": "max"}), e),
        ValueError,
        r"merge\['combine'\]='max'",
    ),
    Case(
        "partition-noise-nan",
        "partition",
        lambda e: _fit(_partition(e, merge=PartitionMergeOptions(noise=float("nan"))), e),
        ValueError,
        r"merge\['noise'\]=nan",
    ),
    Case(
        "partition-noise-negative",
        "partition",
        lambda e: _fit(_partition(e, merge={"noise": -0.1}), e),
        ValueError,
        r"merge\['noise'\]=-0.1",
    ),
    Case(
        "partition-merge-unknown-key",
        "partition",
        lambda e: _fit(_partition(e, merge={"nois": 0.0}), e),
        ValueError,
        r"merge\['nois'\]=0.0 is not valid: expected one of the merge options .*'noise'",
    ),
    Case(
        "partition-split-unknown-key",
        "partition",
        lambda e: _fit(_partition(e, split={"steps": 4}), e),
        ValueError,
        r"split\['steps'\]=4 is not valid: expected one of the split options .*'sub_steps'",
    ),
    Case(
        "partition-split-retries-negative",
        "partition",
        lambda e: _fit(_partition(e, split=PartitionSplitOptions(retries=-1)), e),
        ValueError,
        r"split\['retries'\]=-1",
    ),
    Case(
        "partition-npt-parallel",
        "partition",
        lambda e: _fit(_partition(e, split={"sub_trainer": "npt"}), e),
        ValueError,
        r"split\['mode'\]='parallel'",
    ),
    # damaged, foreign or busy stores
    Case(
        "store-damaged-resume-npt",
        "store",
        lambda e: _fit(_npt(e), e, resume=_damaged_checkpoint(e)),
        store.DamagedStoreError,
        r"path=.*weights",
    ),
    Case(
        "store-truncated-metadata-serial",
        "store",
        lambda e: _fit(SerialTrainer((5,), batch_size=16), e, resume=_truncated_store(e)),
        store.DamagedStoreError,
        r"path=",
    ),
    Case(
        "store-foreign-resume-mgrit",
        "store",
        lambda e: _fit(_mgrit(e), e, resume=_foreign_store(e)),
        store.StoreError,
        r"path=.*not a daskann",
    ),
    Case(
        "store-other-config-resume-npt",
        "store",
        lambda e: _fit(_npt(e, lr=0.5), e, resume=_checkpoint_dir(e)),
        store.StoreError,
        r"resume=.*lr",
    ),
    Case(
        "store-not-a-partition-run",
        "store",
        lambda e: _fit(_partition(e), e, resume=_checkpoint_dir(e)),
        store.StoreError,
        r"resume=.*partition",
    ),
    Case(
        "store-busy-npt",
        "store",
        lambda e: _locked_fit(_npt, e),
        store.StoreError,
        r"checkpoint\['dir'\]=.*another run",
    ),
    Case(
        "store-busy-partition",
        "store",
        lambda e: _locked_fit(_partition, e),
        store.StoreError,
        r"checkpoint\['dir'\]=.*another run",
    ),
    Case(
        "store-busy-mgrit",
        "store",
        lambda e: _locked_fit(_mgrit, e),
        store.StoreError,
        r"checkpoint\['dir'\]=.*another run",
    ),
    Case(
        "output-full-npt",
        "store",
        lambda e: _full_fit(_npt, e, checkpoint={"dir": e.tmp / "full", "every": 1}),
        store.DiskFullError,
        r"checkpoint\['dir'\]=.*1000 bytes free",
    ),
    Case(
        "output-full-mgrit-store",
        "store",
        lambda e: _full_fit(_mgrit, e, engine={"store": e.tmp / "traj.zarr"}),
        store.DiskFullError,
        r"store=.*1000 bytes free",
    ),
    Case(
        "output-read-only-chmod",
        "store",
        _readonly_fit,
        ValueError,
        r"checkpoint\['dir'\]=.*not writable",
        skip=lambda: "chmod does not bind root" if IS_ROOT else None,
    ),
    Case(
        "output-read-only-filesystem",
        "store",
        lambda e: _fit(_partition(e, checkpoint="/proc/sys/daskann-run"), e),
        ValueError,
        r"checkpoint\['dir'\]=.*not writable",
        skip=_readonly_filesystem,
    ),
    Case(
        "output-is-a-file",
        "store",
        lambda e: (e.tmp.joinpath("f").write_text("x"), _fit(_mgrit(e, checkpoint=e.tmp / "f" / "run"), e)),
        ValueError,
        r"checkpoint\['dir'\]=",
    ),
    # cluster: unreachable scheduler, plain-text remote address, worker memory
    Case("cluster-unreachable", "cluster", _unreachable, ConnectionError, r"address='tcp://127.0.0.1:1'"),
    Case(
        "cluster-remote-plaintext",
        "cluster",
        lambda e: make_client("tcp://10.11.12.13:8786", quiet=True),
        ValueError,
        r"address=.*insecure=True",
    ),
    Case(
        "oom-npt",
        "npt",
        _out_of_memory(lambda c: NPTTrainer((5,), grid="1x1", mode="graph", client=c)),
        ValueError,
        r"X=.*memory_limit",
        own_cluster=True,
    ),
    Case(
        "oom-partition",
        "partition",
        _out_of_memory(lambda c: PartitionTrainer((6,), k=2, client=c)),
        ValueError,
        r"X=.*memory_limit",
        own_cluster=True,
    ),
    Case(
        "oom-mgrit",
        "mgrit",
        _out_of_memory(lambda c: MGRITTrainer((5,), solver={"levels": 2, "cfactor": 4}, client=c)),
        ValueError,
        r"X=.*memory_limit",
        own_cluster=True,
    ),
    # command line (exit status 1: a daskann error printed by click; 2: a usage error)
    Case(
        "cli-npt-grid-larger-than-cluster",
        "cli",
        _cli("train", "npt", "--grid", "3x3", "--mode", "graph"),
        1,
        r"--grid='3x3'",
    ),
    Case("cli-npt-mode-unknown", "cli", _cli("train", "npt", "--mode", "fast"), 2, r"--mode"),
    Case("cli-mgrit-coarsening-1", "cli", _cli("train", "mgrit", "--coarsening", "1"), 1, r"--coarsening=1 "),
    Case("cli-mgrit-preset-unknown", "cli", _cli("train", "mgrit", "--preset", "solver9"), 2, r"--preset"),
    Case("cli-partition-k-wide", "cli", _cli("train", "partition", "--hidden", "8", "-k", "9"), 1, r"--k=9 "),
    Case("cli-serial-lr-negative", "cli", _cli("train", "serial", "--lr", "-1", env_address=False), 1, r"--lr=-1"),
    Case(
        "cli-hidden-not-integers", "cli", _cli("train", "serial", "--hidden", "a,b", env_address=False), 2, r"--hidden"
    ),
    Case("cli-resume-without-run", "cli", _cli("train", "partition", "-o", "{tmp}/none", "--resume"), 1, r"--output="),
    Case(
        "cli-unreachable-scheduler",
        "cli",
        _cli("train", "npt", "--address", "tcp://127.0.0.1:1", env_address=False),
        1,
        r"--address='tcp://127.0.0.1:1'",
    ),
    Case("cli-subprocess-mgrit-levels", "cli", _cli_subprocess("train", "mgrit", "--levels", "12"), 1, r"--levels=12 "),
]


@pytest.fixture(scope="module")
def data():
    X, y = make_linear(64, 6, 2, noise=0.1, seed=3)
    labels = np.arange(64) % 3
    return X, y, labels


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input(case, client4, data, tmp_path):
    reason = case.skip() if case.skip else None
    if reason:
        pytest.skip(reason)
    env = Env(client4, tmp_path, *data)
    expected = CliFailure if isinstance(case.error, int) else case.error
    with no_tasks_submitted(client4):
        with pytest.raises(expected) as info:
            case.run(env)
    message = str(info.value)
    if isinstance(case.error, int):
        failure = info.value
        assert failure.code == case.error, failure.output
        assert "Error" in failure.output and "Traceback" not in failure.output, failure.output
        message = failure.output
    else:
        assert type(info.value) is case.error, f"{type(info.value).__name__}: {message}"
    assert re.search(case.names, message, flags=re.S), message


def test_catalogue_size_and_coverage():
    groups = {}
    for c in CASES:
        groups.setdefault(c.group, []).append(c.id)
    print(f"\nbad-input catalogue: {len(CASES)} cases; " + "; ".join(f"{g}: {len(ids)}" for g, ids in groups.items()))
    assert len(CASES) >= 30
    assert len({c.id for c in CASES}) == len(CASES)
    for method in ("npt", "mgrit", "partition", "cli", "store", "data", "cluster"):
        assert len(groups.get(method, [])) >= 2, method
