"""Shared test set-up: process-worker clusters started once per session.

Every dask test runs on the real distributed scheduler with worker processes
(one thread each). Clusters are cached by worker count, so a module asking for
4 workers reuses the cluster another module started.
"""

from __future__ import annotations

import contextlib

import dask
import pytest
from distributed import Client

from daskann.cluster import local_cluster

TEST_CONFIG = {
    # a pinned task whose worker is gone must fail, never hang
    "distributed.scheduler.no-workers-timeout": "60s",
    "distributed.comm.timeouts.connect": "30s",
}


@pytest.fixture(scope="session", autouse=True)
def _dask_test_config():
    with dask.config.set(TEST_CONFIG):
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
        c.wait_for_workers(n_workers, timeout=120)
        return c

    def close(self):
        for c in self._clients.values():
            cluster = c.cluster
            c.close()
            cluster.close()
        self._clients.clear()


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


def scheduler_transitions(c: Client) -> int:
    """Number of task state transitions the scheduler has made so far."""
    return c.run_on_scheduler(lambda dask_scheduler: dask_scheduler.transition_counter)


@contextlib.contextmanager
def no_tasks_submitted(c: Client):
    """Assert that the block submits no task to ``c``'s scheduler."""
    before = scheduler_transitions(c)
    yield
    after = scheduler_transitions(c)
    assert after == before, f"{after - before} task transitions happened; bad input must fail before submitting"


def run_notebook(path, timeout: int = 600, cwd=None):
    """Execute a notebook top to bottom with nbclient; returns the executed notebook."""
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(str(path), as_version=4)
    NotebookClient(nb, timeout=timeout, kernel_name="python3",
                   resources={"metadata": {"path": str(cwd or path.parent)}}).execute()
    return nb
