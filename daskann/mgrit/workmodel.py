"""The work model: how long MGRIT would take if every step cost one unit and communication were free.

One fine step (one training step) costs 1; a coarse step costs what its
propagator says (:meth:`Propagator.cost`). An iteration's tasks form a graph
(the solver's own, with the dependencies its tasks really have); its critical
path is the longest chain of task costs, and with ``p`` workers a greedy list
schedule in submission order gives the makespan. Each iteration adds one unit
for the residual reduction. The serial reference costs ``N``.

Beside it, the paper's own model (Schroder 2017, eqs. 16-17):
:func:`paper_sigma` counts consecutive applications of Phi on the critical
path of an iteration with ``N / m`` processors, whatever the propagators cost,
and :func:`paper_speedup` is ``N / sigma``.
"""

from __future__ import annotations

import heapq
import math

from daskann._validation import named_error


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
        raise named_error(ValueError, "workers", f"{workers} is not valid: expected at least 1")
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


def paper_sigma(
    iterations: int, levels: int, cycle_type: str = "V", *, coarsest: int = 10, coarse_cost: float = 1.0
) -> float:
    """Critical path of the paper's potential-speedup model (eqs. 16-17), in applications of Phi.

    A V-cycle over ``L`` levels costs ``sigma_V(L) = 17 + sum_{l=1}^{L-2} 8 =
    17 + 8 (L - 2)`` per iteration: FCF relaxation 3, FAS residual 4, one
    interpolation and the relaxations of each intermediate level 8, and about
    10 for the serial solve on the coarsest level. That last term is
    ``coarse_cost * max(coarsest, 10)`` here: the paper's 10, or the coarsest
    level's real number of steps where larger (a two-level run's coarse level
    has ``N / 2`` steps, all serial), times the cost of a coarse step (2 with
    double Phi). An F-cycle costs ``sum_{l=1}^{L-2} sigma_V(L - l + 1)`` per
    iteration: one V-cycle from each level but the two coarsest, down to the
    coarsest (daskann's reading of eq. 17's ``sum_{l=1}^{L-2} sigma_V(l)``,
    which leaves ``l`` undefined; for ``L <= 2`` the V-cycle formula).

    Examples
    --------
    >>> paper_sigma(6, 9, "V"), paper_sigma(7, 4, "F"), paper_sigma(6, 2, coarsest=50)
    (438.0, 406.0, 342.0)
    """
    serial = coarse_cost * max(coarsest, 10)

    def v_cycle(n_levels: int) -> float:
        return 7 + 8 * max(n_levels - 2, 0) + serial

    if cycle_type == "F" and levels > 2:
        per_iteration = sum(v_cycle(levels - lvl + 1) for lvl in range(1, levels - 1))
    else:
        per_iteration = v_cycle(levels)
    return float(iterations * per_iteration)


def paper_speedup(
    n_steps: int, iterations: int, levels: int, cycle_type: str = "V", *, coarsest: int = 10, coarse_cost: float = 1.0
) -> float:
    """The paper's potential speedup ``N / sigma`` (:func:`paper_sigma`); NaN without iterations or levels."""
    if levels < 2:
        return math.nan
    s = paper_sigma(iterations, levels, cycle_type, coarsest=coarsest, coarse_cost=coarse_cost)
    return float(n_steps) / s if s > 0 else math.nan


def convergence_factor(residuals) -> float:
    """The paper's ``rho = (||r_k|| / ||r_0||)^(1/k)``, ``r_0`` the first residual computed.

    NaN with fewer than two residuals or a zero first residual.
    """
    r = [float(x) for x in residuals]
    if len(r) < 2 or not r[0] > 0 or not math.isfinite(r[0]) or not math.isfinite(r[-1]):
        return math.nan
    return (r[-1] / r[0]) ** (1.0 / (len(r) - 1))
