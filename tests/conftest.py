"""Shared test set-up: process-worker clusters started once per session.

Every dask test runs on the real distributed scheduler with worker processes
(one thread each). Clusters are cached by worker count, so a module asking for
4 workers reuses the cluster another module started.
"""

from __future__ import annotations

import contextlib
import os
import time
import traceback
import uuid

# scikit-learn's check_array_api_input runs (rather than skips) only with SciPy's array API mode on,
# which must be chosen before SciPy is imported; with numpy input it changes nothing else
os.environ.setdefault("SCIPY_ARRAY_API", "1")

import dask  # noqa: E402
import pytest  # noqa: E402
from distributed import Client  # noqa: E402
from distributed.diagnostics.plugin import SchedulerPlugin  # noqa: E402

from daskann.cluster import local_cluster  # noqa: E402

TEST_CONFIG = {
    # a pinned task whose worker is gone must fail, never hang
    "distributed.scheduler.no-workers-timeout": "60s",
    "distributed.comm.timeouts.connect": "30s",
}


@pytest.fixture(scope="session", autouse=True)
def _dask_test_config():
    with dask.config.set(TEST_CONFIG):
        yield


@pytest.fixture
def mgrit_study(monkeypatch):
    """MGRITTrainer's adaptive fits solve whatever their prediction and cost (``daskann.mgrit.solve="study"``).

    For tests of the solver and its adaptive ladder on problems too small for MGRIT to pay, where the default
    policy would train serially; the command lines the test starts inherit it through the environment.
    """
    monkeypatch.setenv("DASK_DASKANN__MGRIT__SOLVE", "study")
    with dask.config.set({"daskann.mgrit.solve": "study"}):
        yield


class ClusterFactory:
    """``factory(n)`` gives a client on a cached ``n``-worker process cluster."""

    def __init__(self):
        self._clients: dict[int, Client] = {}

    def __call__(self, n_workers: int) -> Client:
        if n_workers not in self._clients:
            cluster = local_cluster(n_workers, threads_per_worker=1, dashboard=False, memory_limit="2GiB")
            self._clients[n_workers] = Client(cluster, set_as_default=False)
        c = self._clients[n_workers]
        restore_workers(c, n_workers)
        return c

    def close(self):
        for c in self._clients.values():
            cluster = c.cluster
            c.close()
            cluster.close()
        self._clients.clear()


def restore_workers(c: Client, n_workers: int, timeout: float = 60.0) -> None:
    """Wait until ``c``'s cluster has ``n_workers`` running workers, replacing any its nanny did not bring back.

    A test that kills a worker relies on the nanny to restart it; on a busy machine a nanny's restart can
    stall or give up, which would leave the shared cluster short for every later test. Such a worker's
    spec is dropped and the cluster scaled back up, so a fresh nanny takes its place.
    """
    try:
        c.wait_for_workers(n_workers, timeout=timeout)
        return
    except TimeoutError:  # distributed's WorkerStartTimeoutError is one
        pass
    cluster = c.cluster
    running = {w["name"] for w in c.scheduler_info(n_workers=-1)["workers"].values() if w["status"] == "running"}
    lost = [name for name in cluster.worker_spec if name not in running]
    for name in lost:
        del cluster.worker_spec[name]
    cluster.scale(len(cluster.worker_spec))  # closes the lost workers' nannies, freeing their names
    deadline = time.monotonic() + 60
    while any(name in cluster.workers for name in lost) and time.monotonic() < deadline:
        time.sleep(0.1)
    cluster.scale(n_workers)
    c.wait_for_workers(n_workers, timeout=120)


@pytest.fixture(scope="session")
def cluster_factory():
    factory = ClusterFactory()
    yield factory
    factory.close()


@pytest.fixture(scope="session")
def client2(cluster_factory):
    """Client on a 2-process, 1-thread-per-worker LocalCluster."""
    return cluster_factory(2)


@pytest.fixture(scope="session")
def client4(cluster_factory):
    """Client on a 4-process, 1-thread-per-worker LocalCluster."""
    return cluster_factory(4)


class TaskLedger(SchedulerPlugin):
    """Records, on the scheduler, the keys that graphs and transitions touch while a watch is open.

    Counting the scheduler's global transitions is timing-dependent: a previous
    test's futures may still be released while the next test runs. A watch
    instead records keys, and keys that already existed when it opened are
    left out, so only what the watched block submitted (or scattered) counts.
    """

    name = "daskann-test-ledger"

    def __init__(self):
        self.watches: dict[str, dict] = {}

    def open(self, token: str) -> None:
        self.watches[token] = {"before": {str(k) for k in self.scheduler.tasks}, "events": [], "submitted": []}

    def close_watch(self, token: str) -> dict:
        watch = self.watches.pop(token)
        before = watch["before"]
        new_events = [key for key in watch["events"] if key not in before]
        now = {str(k) for k in self.scheduler.tasks}
        return {"events": new_events, "keys": sorted(set(new_events) | set(watch["submitted"]) | (now - before))}

    def update_graph(self, scheduler, *, tasks, **kwargs):
        for watch in self.watches.values():
            watch["submitted"].extend(str(key) for key in tasks)

    def transition(self, key, start, finish, *args, **kwargs):
        for watch in self.watches.values():
            watch["events"].append(str(key))


def _ledger(dask_scheduler, action, token):
    plugin = dask_scheduler.plugins.get(TaskLedger.name)
    if plugin is None:
        plugin = TaskLedger()
        plugin.scheduler = dask_scheduler
        dask_scheduler.add_plugin(plugin)  # once per scheduler; watches of all tests share it
    return plugin.open(token) if action == "open" else plugin.close_watch(token)


class Watch:
    """What a watched block did on the scheduler.

    ``keys``: the keys it submitted or created; ``events``: one key per transition of those keys.
    """

    keys: list[str]
    events: list[str]


@contextlib.contextmanager
def scheduler_watch(c: Client, settle: float = 0.2):
    """Record the keys the block submits or scatters to ``c``'s scheduler (any client of that scheduler).

    ``settle`` seconds pass before the watch closes, so that messages the block
    sent on the client's batched stream reach the scheduler first.
    """
    token = uuid.uuid4().hex
    c.run_on_scheduler(_ledger, action="open", token=token)
    watch = Watch()
    try:
        yield watch
    finally:
        time.sleep(settle)
        record = c.run_on_scheduler(_ledger, action="close", token=token)
        watch.keys, watch.events = record["keys"], record["events"]


@contextlib.contextmanager
def no_tasks_submitted(c: Client):
    """Assert that the block submits (or scatters) nothing to ``c``'s scheduler."""
    with scheduler_watch(c) as watch:
        yield
    assert not watch.keys, (
        f"{len(watch.keys)} keys reached the scheduler (e.g. {watch.keys[:3]}); bad input must fail before submitting"
    )


def cli_failure(result) -> str:
    """What a click command printed and, when it raised, where: the message of a failed ``CliRunner`` run."""
    if result.exc_info is None or isinstance(result.exception, SystemExit):
        return result.output
    return result.output + "".join(traceback.format_exception(*result.exc_info))


def run_notebook(path, timeout: int = 600, cwd=None):
    """Execute a notebook top to bottom with nbclient; returns the executed notebook.

    The notebook runs in memory: the committed file, outputs included, is left as it is.
    """
    import nbformat
    from nbclient import NotebookClient

    committed = path.read_bytes()
    nb = nbformat.read(str(path), as_version=4)
    # the committed outputs must not satisfy a test's assertions: only this run's count
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    NotebookClient(
        nb, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": str(cwd or path.parent)}}
    ).execute()
    assert path.read_bytes() == committed, f"executing {path.name} changed the committed file"
    return nb


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
