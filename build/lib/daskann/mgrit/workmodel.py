"""The work model: how long MGRIT would take if every step cost one unit and communication were free.

One fine step (one training step) costs 1; a coarse step costs what its
propagator says (:meth:`Propagator.cost`). An iteration's tasks form a graph
(the solver's own, with the dependencies its tasks really have); its critical
path is the longest chain of task costs, and with ``p`` workers a greedy list
schedule in submission order gives the makespan. Each iteration adds one unit
for the residual reduction. The serial reference costs ``N``.
"""

from __future__ import annotations

import heapq


def critical_path(tasks) -> float:
    """Longest path through an iteration's tasks (task costs summed along dependencies)."""
    finish: dict[str, float] = {}
    for task in tasks:  # submission order is topological
        start = max((finish[d] for d in task.deps), default=0.0)
        finish[task.key] = start + task.cost
    return max(finish.values(), default=0.0)


def makespan(tasks, workers: int) -> float:
    """Finish time of a greedy list schedule of ``tasks`` on ``workers`` workers.

    A task becomes ready when its dependencies are done; ready tasks start in
    submission order on the first free worker.
    """
    if workers < 1:
        raise ValueError(f"workers={workers} is not valid: expected at least 1")
    order = {t.key: i for i, t in enumerate(tasks)}
    by_key = {t.key: t for t in tasks}
    waiting = {t.key: len(t.deps) for t in tasks}
    children: dict[str, list[str]] = {t.key: [] for t in tasks}
    for t in tasks:
        for d in t.deps:
            children[d].append(t.key)
    ready_at: dict[str, float] = {t.key: 0.0 for t in tasks if not t.deps}
    ready = [(order[k], k) for k in ready_at]
    heapq.heapify(ready)
    free = [0.0] * workers  # times at which workers become free
    heapq.heapify(free)
    running: list[tuple[float, str]] = []
    finish: dict[str, float] = {}
    now = 0.0
    while ready or running:
        while ready and free:
            _, key = heapq.heappop(ready)
            worker_free = heapq.heappop(free)
            start = max(worker_free, ready_at[key], now)
            end = start + by_key[key].cost
            heapq.heappush(running, (end, key))
        end, key = heapq.heappop(running)
        now = end
        finish[key] = end
        heapq.heappush(free, end)
        for child in children[key]:
            waiting[child] -= 1
            ready_at[child] = max(ready_at.get(child, 0.0), end)
            if waiting[child] == 0:
                heapq.heappush(ready, (order[child], child))
    return max(finish.values(), default=0.0)


def total_work(tasks) -> float:
    return float(sum(t.cost for t in tasks))


def speedup(n_steps: int, iteration_times) -> float:
    """Serial steps over the MGRIT time (each iteration plus one unit for its residual norm)."""
    total = sum(t + 1.0 for t in iteration_times)
    return float(n_steps) / total if total > 0 else float("nan")
