"""``daskann bench npt --breakdown``: where each worker's step time went in the large net's rows.

For every NPT row of the large net (and its ``grid="auto"`` row) the bench keeps,
per timed step and per worker, the parts of :attr:`NPTTrainer.worker_times_`:
``wall`` (the worker's own step), ``compute`` (block products and the other
arithmetic: task time in graph mode, the kernels' timers in resident mode),
``serialise`` (graph mode: deserialising and spilling), ``transfer`` (incoming
blocks in transit while the worker computed nothing) and ``idle`` (the rest:
waiting for peers or the scheduler, bookkeeping); the four add up to ``wall``.
Resident rows add ``recv_wait``, the seconds spent waiting in receives (transit
and waiting for peers together).
"""

from __future__ import annotations

import numpy as np

#: the parts of a step, in the order the table shows them
PARTS = ("wall", "compute", "transfer", "serialise", "idle")


def collect(row: dict, worker_times: dict, warmup: int) -> dict:
    """The breakdown of one measured row: per worker, a list per part over the steps after ``warmup``.

    ``worker_times`` is the trainer's ``{completed step: {worker: {part: seconds}}}``.
    """
    steps = sorted(done for done in worker_times if done > warmup)
    workers = sorted({w for done in steps for w in worker_times[done]})
    per_worker = {}
    for w in workers:
        parts = dict.fromkeys(k for done in steps for k in worker_times[done].get(w, {}))
        per_worker[w] = {k: [float(worker_times[done].get(w, {}).get(k, 0.0)) for done in steps] for k in parts}
    return {
        "net": row["net"],
        "grid": row["grid"],
        "mode": row["mode"],
        "time_per_step": row["time_per_step"],
        "steps": steps,
        "workers": per_worker,
        "median": {w: {k: float(np.median(v)) for k, v in parts.items()} for w, parts in per_worker.items()},
    }


def format_breakdown(entries: list[dict]) -> str:
    """Per row and worker, the median seconds per step of each part and the share of the step computing."""
    head = (
        f"{'net':>15} {'grid':>5} {'mode':>13} {'worker':>22} {'wall ms':>9} {'compute':>9} {'transfer':>9} "
        f"{'serialise':>9} {'idle':>9} {'compute %':>9}"
    )
    lines = ["where the step time goes (median per step and worker, ms):", head]
    for entry in entries:
        for worker, median in entry["median"].items():
            ms = [median.get(k, float("nan")) * 1e3 for k in PARTS]
            share = 100.0 * median["compute"] / median["wall"] if median.get("wall") else float("nan")
            cells = " ".join(f"{v:>9.1f}" for v in ms)
            lines.append(
                f"{entry['net']:>15} {entry['grid']:>5} {entry['mode']:>13} {worker:>22} {cells} {share:>9.1f}"
            )
    return "\n".join(lines)


__all__ = ["PARTS", "collect", "format_breakdown"]
