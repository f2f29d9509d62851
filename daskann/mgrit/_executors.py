"""Running one iteration's tasks: in this process, on dask's local schedulers, or on a cluster.

Every executor runs the same task functions on the same inputs, so results do
not depend on where they run or on the number of workers. Tasks run in this
process with one BLAS thread, as in every worker (see :mod:`daskann._blas`).
"""

from __future__ import annotations

import contextlib
import math
import time
import uuid
from concurrent.futures import CancelledError

import dask
import numpy as np
from dask.highlevelgraph import HighLevelGraph, MaterializedLayer
from distributed import Client

from daskann import config
from daskann._blas import one_blas_thread
from daskann._dask_input import is_dask_array, materialize
from daskann._validation import invalid, named_error
from daskann.cluster import result_within, wait_watching, worker_addresses, workers_left
from daskann.exceptions import DaskannError, LostWorkersError
from daskann.mgrit._kernels import release_kept
from daskann.mgrit._plan import owner

#: seconds one broadcast of the context may take before it is tried again
BROADCAST_TIMEOUT = 90.0
#: seconds between checks that the workers an iteration's tasks are placed on are all still there
PLACEMENT_POLL = 1.0
#: times one iteration may be placed again on the workers there are, after some of those it was placed on left
MAX_PLACEMENTS = 50


class _WorkersLeft(DaskannError):
    """A worker the tasks of an iteration were placed on left the cluster."""


class InProcessExecutor:
    """Runs tasks one after another in submission order (a topological order)."""

    name = "inprocess"

    def __init__(self, store, context):
        self.store, self.context = store, context

    def release(self, run: str) -> None:
        pass

    def run(self, tasks, while_running=None) -> dict:
        """The results of all ``tasks``, by key; then ``while_running()``, when given (nothing runs beside it)."""
        results = {}
        with one_blas_thread():
            for task in tasks:
                deps = [results[d] for d in task.deps]
                results[task.key] = task.func(task.spec, self.store, self.context, *deps)
        if while_running is not None:
            while_running()
        return results

    def close(self) -> None:
        pass


class DaskExecutor:
    """Submits each iteration as one dask graph.

    On a distributed cluster each task runs on the worker that owns its range
    of time (:func:`_placed`), in the order of the workers' addresses at the
    start of the iteration.

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

    def run(self, tasks, while_running=None) -> dict:
        """The results of the :func:`reported` tasks of ``tasks``, by key.

        ``while_running()``, when given, is called once while the cluster
        computes (the client's own bookkeeping then costs the iteration
        nothing); on the local schedulers, before they start.
        """
        shown = reported(tasks)
        keys = [t.key for t in shown]
        if self.name == "distributed":
            pending = [while_running] if while_running is not None else []

            def once():  # an iteration placed or run again does not call it again
                while pending:
                    pending.pop()()

            attempts = config.count("mgrit.context-attempts")
            attempt = broadcasts = placements = 0
            while True:
                try:
                    values = self._run_distributed(tasks, shown, attempt, once)
                    break
                except _WorkersLeft:
                    # a task waits for the worker it is placed on: place the iteration on the workers there are
                    placements += 1
                    if placements > MAX_PLACEMENTS:
                        raise LostWorkersError(
                            f"an MGRIT iteration was placed {placements} times as workers left the cluster"
                        ) from None
                except CancelledError as exc:
                    # every worker holding the scattered context died (scattered data is never
                    # recomputed): scatter it again and rerun the iteration, whose tasks are idempotent
                    # (the context future may not know yet that it is lost when its dependants are told)
                    lost = self._context.status != "finished" or any(
                        reason in str(exc) for reason in ("lost dependencies", "already forgotten")
                    )
                    broadcasts += 1
                    if not lost or broadcasts == attempts:
                        raise
                    self._context = self._broadcast()
                attempt += 1
        else:
            if while_running is not None:
                while_running()
            graph = _graph(tasks, shown, self.store, self._context)
            wanted = [_fetched_key(t, str) for t in shown]
            with one_blas_thread():
                if self.name == "threads":
                    values = dask.threaded.get(graph, wanted, num_workers=self.num_workers)
                else:
                    values = dask.get(graph, wanted)
        return dict(zip(keys, values, strict=True))

    def measure(self, prefix: str, rounds: int = 4) -> dict:
        """Measured costs that size the tasks: one fine step on a worker, and the scheduler's per-task cost.

        The per-task cost is the latency of a chain of empty tasks (each waits
        for the one before, as the tasks of successive sweeps do). Their keys
        start with the run's ``prefix``, like every other task of the run.
        """
        client, prefix = self.scheduler, f"{prefix}-measure-{uuid.uuid4().hex[:6]}"
        step = client.submit(_time_step, self._context, rounds, key=f"{prefix}-step", pure=False)
        step_seconds = result_within(step, self.timeout)
        t0 = time.perf_counter()
        future = None
        for i in range(rounds):
            future = client.submit(_noop, future, key=f"{prefix}-noop-{i}", pure=False)
        result_within(future, self.timeout)
        task_seconds = (time.perf_counter() - t0) / rounds
        workers = len(worker_addresses(client))
        return {"step_seconds": step_seconds, "task_seconds": task_seconds, "workers": workers}

    def _broadcast(self):
        """Scatter the context to every worker, again if a worker died during the broadcast."""
        for attempt in range(attempts := config.count("mgrit.context-attempts")):
            try:
                if is_dask_array(getattr(self._raw_context.propagator, "X", None)):
                    return self._broadcast_read(attempt)
                # bounded: a replication that lost the worker it was sending to can otherwise wait forever
                timeout = min(self.timeout, BROADCAST_TIMEOUT)
                return self.scheduler.scatter(self._raw_context, broadcast=True, hash=False, timeout=timeout)
            except (KeyError, OSError) as exc:  # the scheduler's replication lost a worker it was sending to
                if attempt + 1 == attempts:
                    raise LostWorkersError(
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

    def _run_distributed(self, tasks, shown, attempt: int, while_running=None) -> list:
        def name(key):  # a rerun uses new keys: the cancelled ones may still be forgotten by the scheduler
            return key if attempt == 0 else f"{key}-retry{attempt}"

        workers = self._workers()
        home = _homes(tasks, name, workers, self._raw_context.hierarchy.n_steps) if workers else None
        graph = _placed(_graph(tasks, shown, self.store, self._context, name, home), home)
        keys = [_fetched_key(t, name) for t in shown]
        futures = self.scheduler.get(graph, keys, sync=False)
        deadline = time.monotonic() + self.timeout
        try:
            if while_running is not None:
                while_running()
            values = self._results(futures, deadline, workers)
        except TimeoutError:
            self.scheduler.cancel(futures)
            raise named_error(
                TimeoutError,
                "timeout",
                f"{self.timeout:g}: an MGRIT iteration ({len(tasks)} tasks) did not finish in time; "
                "the store keeps the last completed iteration",
            ) from None
        except BaseException:
            self.scheduler.cancel(futures)
            raise
        return values

    def _results(self, futures, deadline: float, workers: list[str]) -> list:
        """The futures' results by ``deadline``; a task's error as soon as it fails; :class:`_WorkersLeft` once one
        of ``workers`` has left."""

        def look():
            if all(f.done() for f in futures) or any(f.status in ("error", "cancelled") for f in futures):
                return True
            if time.monotonic() >= deadline:
                raise TimeoutError
            return None

        def watch():
            if workers_left(self.scheduler, workers):
                raise _WorkersLeft

        wait_watching(futures, look, poll=PLACEMENT_POLL, watch=watch)
        for future in futures:
            if future.status in ("error", "cancelled"):
                future.result()  # raises the task's error (a cancelled one: CancelledError)
        return [future.result() for future in futures]

    def release(self, run: str) -> None:
        """Forget the C-values the run's final sweeps kept in the workers' memory."""
        release_kept(run)
        if self.name == "distributed":
            try:
                self.scheduler.run(release_kept, run)
            except Exception:  # the cluster may already be gone, and its memory with it
                pass

    def _workers(self) -> list[str]:
        """The cluster's workers now, in a fixed order (the owners of successive ranges of time)."""
        return sorted(worker_addresses(self.scheduler))

    def close(self) -> None:
        if self.name == "distributed":
            # released, not cancelled: cancelling a scattered key trips an assertion in the scheduler
            with contextlib.suppress(Exception):  # the cluster may already be gone
                self._context.release()
            self._context = None


def _time_step(context, rounds: int) -> float:
    """Seconds of one fine step on this worker (the fastest of ``rounds``, after a first)."""
    x = context.u0
    with np.errstate(all="ignore"):
        out = context.phi(x, 0, 0)
        best = math.inf
        for _ in range(rounds):
            t0 = time.perf_counter()
            context.phi(x, 0, 0, out=out)
            best = min(best, time.perf_counter() - t0)
    return best


def _noop(_previous) -> None:
    return None


def _graph(tasks, shown, store, context, name=lambda key: key, home=None) -> dict:
    """Each task, handed its dependencies' results, and a small summary of the results the client fetches.

    The client fetches the results of the tasks ``shown`` only (:func:`reported`), as
    they are for a final sweep (its rows went to the store) and as a summary
    otherwise: the rows a task computes go from worker to worker (to the
    tasks that read them) and are released once read.

    A task is handed the rows it reads as pieces of its writers' results, so
    a task that needs one boundary row of its neighbour receives that row's
    chunk, not the neighbour's whole output. A piece of a result on another
    worker is a small task beside its writer (one per run of adjacent
    chunks); a piece of a result in the task's own process (``home``: the
    worker of each key, as :func:`_placed` places them; every result when
    ``home`` is None) is cut inside the task, which spares the scheduler a
    task and a round trip on the path from one sweep to the next.
    """
    graph = {}
    for t in tasks:
        key = name(t.key)
        pieces = []
        for writer, (array, lead, lo, hi) in _merged(t.pieces):
            piece = (_piece, name(writer), array, lead, lo, hi)
            if home is not None and home[name(writer)] != home[key]:
                graph.setdefault(_piece_key(*piece[1:]), piece)
                piece = _piece_key(*piece[1:])
            pieces.append(piece)
        graph[key] = (t.func, t.spec, store, context, *pieces)
    for t in shown:
        if not t.final:
            graph[_summary_key(name(t.key))] = (_summary, name(t.key))
    return graph


def reported(tasks) -> list:
    """The tasks whose results the client fetches: the final sweep's, and any other that no task reads.

    A task after a failed one is skipped and passes the failure on
    (:func:`~daskann.mgrit._kernels.first_failure`), so every failure
    reaches one of these; and a final sweep's result is small, its rows
    written to the store.
    """
    read = {d for t in tasks for d in t.data_deps}
    return [t for t in tasks if t.final or t.key not in read]


def _fetched_key(task, name) -> str:
    return name(task.key) if task.final else _summary_key(name(task.key))


def _homes(tasks, name, workers: list[str], n_steps: int) -> dict:
    """The worker each task runs on: the owner of its range of time (:func:`~daskann.mgrit._plan.owner`)."""
    return {name(t.key): workers[owner(t.start, n_steps, len(workers))] for t in tasks}


def _placed(graph: dict, home: dict) -> HighLevelGraph:
    """``graph`` with each task on its worker in ``home`` (:func:`_homes`).

    Each worker then reads its own rows and only those at the ends of its
    range move. A piece or a summary runs beside the result it reads (left
    free, the scheduler may move a whole result to an idle worker for it).
    The restrictions are strict, so that no worker steals a task and then
    hands its whole result back; a task whose worker has left would wait
    for it, so the executor places the iteration again as soon as one of
    the workers it was placed on has left (:meth:`DaskExecutor._result`).
    """
    if not home:
        return HighLevelGraph.from_collections("mgrit", graph)
    parts: dict[str | None, dict] = {}
    for key, value in graph.items():
        # a piece (_piece, writer, ...) or a summary (_summary, task) goes where the result it reads is
        address = home[key] if key in home else home.get(value[1])
        parts.setdefault(address, {})[key] = value
    free = parts.pop(None, {})
    layers = {
        f"mgrit-{i}": MaterializedLayer(part, annotations={"workers": [address], "allow_other_workers": False})
        for i, (address, part) in enumerate(parts.items())
    }
    if free:
        layers["mgrit-free"] = MaterializedLayer(free)
    # the layers depend on each other both ways: the scheduler orders the tasks by their keys' dependencies
    return HighLevelGraph(layers, {layer: set(layers) - {layer} for layer in layers})


def _merged(pieces) -> list[tuple]:
    """The chunks a task reads, adjacent ones from one writer's array joined: one piece per run of rows."""
    runs: dict[tuple, list[list[int]]] = {}
    for writer, (array, lead, lo, hi) in pieces:
        runs.setdefault((writer, array, tuple(lead)), []).append([lo, hi])
    out = []
    for (writer, array, lead), spans in runs.items():
        spans.sort()
        joined = [spans[0]]
        for lo, hi in spans[1:]:
            if lo <= joined[-1][1]:
                joined[-1][1] = max(joined[-1][1], hi)
            else:
                joined.append([lo, hi])
        out += [(writer, (array, lead, lo, hi)) for lo, hi in joined]
    return out


def _piece_key(writer: str, array: str, lead: tuple, lo: int, hi: int) -> str:
    return f"{writer}-{array}-{'-'.join(map(str, lead))}-r{lo}-{hi}"


def _piece(result: dict, array: str, lead: tuple, lo: int, hi: int) -> dict:
    """Rows ``lo .. hi - 1`` of ``array`` (leading indices ``lead``) from a task's result, as views."""
    if not result.get("ok", True):
        return result  # the failure (small), for the reader to pass on
    blocks = []
    for name, block_lead, first, rank, values in result.get("blocks", ()):
        a, b = max(lo, first), min(hi, first + len(values))
        if name == array and tuple(block_lead) == tuple(lead) and a < b:
            blocks.append((name, block_lead, a, rank, values[a - first : b - first]))
    return {"ok": True, "blocks": blocks}


def _summary_key(key: str) -> str:
    return f"{key}-summary"


def _summary(result: dict) -> dict:
    """A task's result without the rows it computed."""
    return {k: v for k, v in result.items() if k != "blocks"}


def _with_data(context, X, y):
    """``context`` on a worker, its propagator given the data read there."""
    return type(context)(context.propagator.with_data(X, y), context.layout, context.hierarchy, context.u0)
