"""Where each worker's step time goes: compute, serialisation, transfer and idle seconds.

Both modes give, per completed step and per worker, ``wall`` (the worker's
own step) split into ``compute`` (block products and the other arithmetic),
``serialise`` (graph mode: deserialising and spilling, as the worker reports
them; resident mode: 0, its sends encode on the event loop beside the
arithmetic), ``transfer`` (incoming blocks in transit while nothing was
computed) and ``idle`` (the rest: waiting for peers and the scheduler,
bookkeeping). The four add up to ``wall``.
"""

from __future__ import annotations

from collections import defaultdict

#: task-stream actions per part of a step, in the order a moment is counted (the first that covers it)
GRAPH_ACTIONS = (
    ("compute", ("compute",)),
    ("serialise", ("deserialize", "disk-read", "disk-write")),
    ("transfer", ("transfer",)),
)


def _merge(intervals) -> list:
    """Disjoint, sorted ``(start, stop)`` intervals covering the same moments as ``intervals``."""
    merged: list = []
    for start, stop in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], stop)
        else:
            merged.append([start, stop])
    return merged


def _covered(merged: list, start: float, stop: float) -> float:
    """Seconds of ``[start, stop]`` that the disjoint intervals ``merged`` cover."""
    return sum(max(0.0, min(b, stop) - max(a, start)) for a, b in merged)


def graph_worker_times(spans: dict, step_ends: dict) -> dict:
    """``{completed step: {worker: times}}`` from the task stream's intervals of a graph-mode run.

    Parameters
    ----------
    spans : dict
        ``{worker: {action: [(start, stop), ...]}}``, the task stream's ``startstops`` of the run's tasks
        on each worker.
    step_ends : dict
        ``{worker: {step: when its last task of that step (0-based) finished}}``.

    A worker's step runs from the end of its previous step (its first step: from its first interval)
    to the end of its last task of the step; steps overlap on the grid, so the parts are of what the
    worker did in that window, whichever step a task belonged to.
    """
    out: dict = defaultdict(dict)
    for worker, ends in step_ends.items():
        actions = spans.get(worker, {})
        layers, so_far = [], []
        for part, names in GRAPH_ACTIONS:
            so_far += [iv for name in names for iv in actions.get(name, ())]
            layers.append((part, _merge(so_far)))
        begin = min((iv[0] for iv in so_far), default=min(ends.values()))
        for step in sorted(ends):
            end = max(begin, ends[step])
            times, covered = {"wall": end - begin}, 0.0
            for part, merged in layers:
                now = _covered(merged, begin, end)
                times[part], covered = max(now - covered, 0.0), now
            times["idle"] = max(times["wall"] - covered, 0.0)
            out[step + 1][worker] = times
            begin = end
    return dict(out)


def resident_worker_times(compute: float, wall: float, waited: float, transfer_waited: float) -> dict:
    """One resident worker's step: its arithmetic, the blocks' transit it waited for, and the rest.

    ``waited`` (seconds in receives) is kept as ``recv_wait``: transit plus waiting for peers.
    """
    transfer = min(max(transfer_waited, 0.0), max(wall - compute, 0.0))
    return {
        "wall": wall,
        "compute": compute,
        "serialise": 0.0,
        "transfer": transfer,
        "idle": max(wall - compute - transfer, 0.0),
        "recv_wait": waited,
    }
