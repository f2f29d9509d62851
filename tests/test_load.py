"""Load: 4 and 16 trainings submitted at once to one cluster (issue 6, point 5).

Every training runs in its own thread of this process with its own
:class:`distributed.Client` on the shared 4-worker cluster, so the scheduler
knows which run submitted or holds each key. A scheduler plugin records, for
every key, the clients that submitted it (``update_graph``) or hold it
(``who_wants``: scattered data). The tests check that

* each run's result is bit-identical (``np.array_equal``, no tolerance) to
  the same configuration trained alone on the same cluster;
* no key belongs to two runs;
* every graph key of a run starts with a per-run prefix
  ``daskann-<method>-<12 hex digits>`` that no other run uses; identical
  configurations running at the same time (the 16-run case runs each of the 4
  configurations 4 times) get distinct prefixes too.

Scattered data (the partition and MGRIT trainers' broadcast of the training
data) has random ``<type>-<uuid>`` keys rather than the run prefix; they are
checked for sharing like every other key.
"""

from __future__ import annotations

import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import dask
import numpy as np
import pytest
from distributed import Client
from distributed.diagnostics.plugin import SchedulerPlugin

from daskann.data import make_linear
from daskann.mgrit import MGRITTrainer
from daskann.npt import NPTTrainer
from daskann.partition import PartitionTrainer

# MGRIT fits here must run the solve, which the default policy skips for problems this small
pytestmark = pytest.mark.usefixtures("mgrit_study")

PREFIX = re.compile(r"^daskann-(npt|mgrit|partition)-[0-9a-f]{12}")
#: keys of ``client.scatter(..., hash=False)``: random, one per call, without the run prefix
RANDOM = re.compile(r"^[A-Za-z_]+-[0-9a-f]{32}$")
PLUGIN = "daskann-test-keylog"


class KeyLog(SchedulerPlugin):
    """Clients that submitted (graph keys) or hold (scattered keys) each key seen during the test."""

    name = PLUGIN

    def __init__(self):
        self.graph: dict[str, set[str]] = {}
        self.held: dict[str, set[str]] = {}
        self._callback = None

    async def start(self, scheduler):
        from tornado.ioloop import PeriodicCallback

        self.scheduler = scheduler
        self._callback = PeriodicCallback(self._scan, 20)
        self._callback.start()

    async def close(self):
        if self._callback is not None:
            self._callback.stop()

    def update_graph(self, scheduler, *, client, keys, tasks, **kwargs):
        for key in tasks:
            self.graph.setdefault(str(key), set()).add(client)

    def transition(self, key, start, finish, *args, **kwargs):
        ts = self.scheduler.tasks.get(key)
        if ts is not None:
            self._note(ts)
            for dep in ts.dependencies:
                self._note(dep)

    def _note(self, ts):
        if ts.who_wants:
            self.held.setdefault(str(ts.key), set()).update(cs.client_key for cs in ts.who_wants)

    def _scan(self):
        for ts in list(self.scheduler.tasks.values()):
            self._note(ts)

    def snapshot(self) -> dict:
        self._scan()
        return {
            "graph": {k: sorted(v) for k, v in self.graph.items()},
            "held": {k: sorted(v) for k, v in self.held.items()},
        }


def _snapshot(dask_scheduler):
    return dask_scheduler.plugins[PLUGIN].snapshot()


# -- the four configurations (tiny nets: the test is about the scheduler, not the arithmetic) ---------------------
def _npt_2x2(c):
    return NPTTrainer(
        (6,),
        grid="2x2",
        mode="graph",
        engine={"pipeline": "fused", "share_workers": True},
        batch_size=16,
        lr=0.05,
        seed=1,
        client=c,
        sgd={"momentum": 0.5},
    )


def _npt_1x2(c):
    return NPTTrainer(
        (5, 4),
        grid="1x2",
        mode="graph",
        engine={"pipeline": "fused", "share_workers": True},
        batch_size=8,
        lr=0.05,
        seed=2,
        client=c,
    )


def _partition(c):
    return PartitionTrainer((6,), k=2, batch_size=16, lr=0.05, seed=3, client=c, sgd={"momentum": 0.5})


def _mgrit(c):
    return MGRITTrainer(
        (5,),
        solver={"levels": 2, "cfactor": 4, "max_iter": 3, "require_convergence": False},
        batch_size=16,
        lr=0.05,
        seed=4,
        client=c,
    )


CONFIGS = {"npt-2x2": (_npt_2x2, 3), "npt-1x2": (_npt_1x2, 3), "partition": (_partition, 4), "mgrit": (_mgrit, 16)}


@pytest.fixture(scope="module")
def data():
    return make_linear(64, 6, 2, noise=0.1, seed=7)


def _train(name, address, X, y):
    """One training on its own client; returns (parameters, client id)."""
    make, steps = CONFIGS[name]
    with Client(address, set_as_default=False, timeout=60) as c:
        trainer = make(c).fit(X, y, steps=steps)
        return [*trainer.model_.params, *trainer.velocity_], c.id


@pytest.fixture(scope="module")
def solo(client4, data):
    """Each configuration trained alone on the cluster."""
    X, y = data
    with dask.config.set({"daskann.mgrit.solve": "study"}):  # a module fixture: before the tests' own
        return {name: _train(name, client4.scheduler.address, X, y)[0] for name in CONFIGS}


def _run_at_once(client4, data, names):
    X, y = data
    client4.register_plugin(KeyLog(), name=PLUGIN)
    try:
        start = time.perf_counter()
        barrier = threading.Barrier(len(names))

        def job(name):
            barrier.wait(timeout=60)  # all submit together
            return _train(name, client4.scheduler.address, X, y)

        with ThreadPoolExecutor(len(names)) as pool:
            results = list(pool.map(job, names))
        seconds = time.perf_counter() - start
        log = client4.run_on_scheduler(_snapshot)
    finally:
        client4.unregister_scheduler_plugin(PLUGIN)
    return results, log, seconds


def _check(client4, data, solo, names):
    scheduler_option = dask.config.get("scheduler", None)
    results, log, seconds = _run_at_once(client4, data, names)
    # concurrent runs leave dask's global scheduler option alone (its save-and-restore is not thread-safe)
    assert dask.config.get("scheduler", None) == scheduler_option
    # every result equals the same configuration trained alone, bit for bit
    for name, (params, _) in zip(names, results, strict=True):
        assert all(np.array_equal(a, b) for a, b in zip(params, solo[name], strict=True)), name
    runs = {cid: name for name, (_, cid) in zip(names, results, strict=True)}
    assert len(runs) == len(names)
    keys = {}
    for kind in ("graph", "held"):
        for key, clients in log[kind].items():
            keys.setdefault(key, set()).update(c for c in clients if c in runs)
    keys = {k: v for k, v in keys.items() if v}  # keys of the runs (not the test's own client)
    shared = {k: v for k, v in keys.items() if len(v) > 1}
    assert not shared, f"{len(shared)} keys shared between runs, e.g. {next(iter(shared.items()))}"
    prefixes: dict[str, set[str]] = {cid: set() for cid in runs}
    graph_keys = 0
    for key, clients in log["graph"].items():
        owners = [c for c in clients if c in runs]
        if not owners:
            continue
        match = PREFIX.match(key)
        if match is None and RANDOM.match(key):
            continue  # scattered data
        graph_keys += 1
        assert match, f"graph key {key!r} of run {runs[owners[0]]} has no per-run prefix"
        assert match.group(1) == runs[owners[0]].split("-")[0], (key, runs[owners[0]])
        prefixes[owners[0]].add(match.group(0))
    for cid, found in prefixes.items():
        assert found, f"run {runs[cid]} submitted no prefixed key"
        for other, theirs in prefixes.items():
            if other != cid:
                assert not found & theirs, (runs[cid], runs[other], found & theirs)
    scattered = len(keys) - graph_keys
    print(
        f"\n{len(names)} trainings at once: {seconds:.1f} s, all bit-identical to their solo runs; "
        f"{len(keys)} keys checked ({graph_keys} graph keys with a per-run prefix, {scattered} scattered), "
        f"0 shared; {sum(map(len, prefixes.values()))} distinct prefixes"
    )
    return seconds


def test_four_trainings_at_once(client4, data, solo):
    _check(client4, data, solo, list(CONFIGS))


def test_sixteen_trainings_at_once(client4, data, solo):
    # each configuration four times: identical runs at the same time must not share keys either
    names = [name for name in CONFIGS for _ in range(4)]
    seconds = _check(client4, data, solo, names)
    assert seconds < 120


def test_key_log_sees_a_key_two_runs_share(client4):
    """Negative control: two clients submitting one key under the same name are caught as sharing it."""
    client4.register_plugin(KeyLog(), name=PLUGIN)
    try:
        with (
            Client(client4.scheduler.address, set_as_default=False) as a,
            Client(client4.scheduler.address, set_as_default=False) as b,
        ):
            key = "daskann-npt-000000000000-shared"
            assert a.submit(sum, [1, 2], key=key).result() == 3
            assert b.submit(sum, [1, 2], key=key).result() == 3
            log = client4.run_on_scheduler(_snapshot)
            assert set(log["graph"][key]) >= {a.id, b.id}
    finally:
        client4.unregister_scheduler_plugin(PLUGIN)
