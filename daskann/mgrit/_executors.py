"""Running one iteration's tasks: in this process, on dask's local schedulers, or on a cluster.

Every executor runs the same task functions on the same inputs, so results do
not depend on where they run or on the number of workers.
"""

from __future__ import annotations

import time
import uuid
from concurrent.futures import CancelledError

import dask
from distributed import Client

from daskann import config
from daskann._dask_input import is_dask_array, materialize
from daskann._validation import invalid


class InProcessExecutor:
    """Runs tasks one after another in submission order (a topological order)."""

    name = "inprocess"

    def __init__(self, store, context):
        self.store, self.context = store, context

    def run(self, tasks) -> dict:
        results = {}
        for task in tasks:
            deps = [results[d] for d in task.deps]
            results[task.key] = task.func(task.spec, self.store, self.context, *deps)
        return results

    def close(self) -> None:
        pass


class DaskExecutor:
    """Submits each iteration as one dask graph.

    Parameters
    ----------
    scheduler : distributed.Client, "threads" or "sync"
    store : ZarrTrajectory
        The tasks read and write it by path.
    context : Context
        Propagator, layout and hierarchy; scattered to every worker once
        (broadcast) on a distributed cluster, so the training data is not
        shipped with each task.
    timeout : float
        Seconds one iteration may take on a cluster before it is abandoned.
    """

    def __init__(self, scheduler, store, context, *, timeout: float = 600.0, num_workers: int | None = None):
        self.scheduler, self.store, self.timeout = scheduler, store, timeout
        self.num_workers = num_workers
        if isinstance(scheduler, Client):
            self.name = "distributed"
            self._raw_context = context
            self._context = self._broadcast()
        elif scheduler in ("threads", "sync"):
            self.name = scheduler
            self._context = context
        else:
            raise invalid("scheduler", scheduler, "a distributed.Client, 'threads' or 'sync'", TypeError)

    def run(self, tasks) -> dict:
        keys = [t.key for t in tasks]
        if self.name == "distributed":
            for attempt in range(attempts := config.count("mgrit.context-attempts")):
                try:
                    values = self._run_distributed(tasks, attempt)
                    break
                except CancelledError as exc:
                    # every worker holding the scattered context died (scattered data is never
                    # recomputed): scatter it again and rerun the iteration, whose tasks are idempotent
                    # (the context future may not know yet that it is lost when its dependants are told)
                    lost = self._context.status != "finished" or any(
                        reason in str(exc) for reason in ("lost dependencies", "already forgotten")
                    )
                    if not lost or attempt + 1 == attempts:
                        raise
                    self._context = self._broadcast()
        else:
            graph = {t.key: (t.func, t.spec, self.store, self._context, *t.deps) for t in tasks}
            if self.name == "threads":
                values = dask.threaded.get(graph, keys, num_workers=self.num_workers)
            else:
                values = dask.get(graph, keys)
        return dict(zip(keys, values, strict=True))

    def _broadcast(self):
        """Scatter the context to every worker, again if a worker died during the broadcast."""
        for attempt in range(attempts := config.count("mgrit.context-attempts")):
            try:
                if is_dask_array(getattr(self._raw_context.propagator, "X", None)):
                    return self._broadcast_read(attempt)
                return self.scheduler.scatter(self._raw_context, broadcast=True, hash=False)
            except (KeyError, OSError) as exc:  # the scheduler's replication lost a worker it was sending to
                if attempt + 1 == attempts:
                    raise RuntimeError(
                        f"broadcasting the MGRIT context failed {attempts} times as workers left the cluster ({exc!r})"
                    ) from exc
                time.sleep(1.0)

    def _broadcast_read(self, attempt: int):
        """The context with dask-array data: read on one worker and replicated, never through the client."""
        context, client = self._raw_context, self.scheduler
        prop = context.propagator
        prefix = f"mgrit-data-{uuid.uuid4().hex[:12]}-{attempt}"
        X = materialize(client, prop.X, key=f"{prefix}-X")
        y = materialize(client, prop.y, key=f"{prefix}-y")
        bare = type(context)(prop.without_data(), context.layout, context.hierarchy, context.u0)
        future = client.submit(_with_data, bare, X, y, key=f"{prefix}-context", pure=False)
        client.replicate([future])
        return future

    def _run_distributed(self, tasks, attempt: int) -> list:
        def name(key):  # a rerun uses new keys: the cancelled ones may still be forgotten by the scheduler
            return key if attempt == 0 else f"{key}-retry{attempt}"

        graph = {name(t.key): (t.func, t.spec, self.store, self._context, *map(name, t.deps)) for t in tasks}
        keys = [name(t.key) for t in tasks]
        futures = self.scheduler.get(graph, keys, sync=False)
        deadline = time.monotonic() + self.timeout
        values = []
        try:
            for future in futures:
                values.append(future.result(timeout=max(0.0, deadline - time.monotonic())))
        except TimeoutError:
            self.scheduler.cancel(futures)
            raise TimeoutError(
                f"timeout={self.timeout:g}: an MGRIT iteration ({len(keys)} tasks) did not finish in time; "
                "the store keeps the last completed iteration"
            ) from None
        except BaseException:
            self.scheduler.cancel(futures)
            raise
        return values

    def close(self) -> None:
        if self.name == "distributed":
            try:
                self.scheduler.cancel([self._context])
            except Exception:  # the cluster may already be gone
                pass
            self._context = None


def _with_data(context, X, y):
    """``context`` on a worker, its propagator given the data read there."""
    return type(context)(context.propagator.with_data(X, y), context.layout, context.hierarchy, context.u0)
