"""The resident-mode run of :class:`~daskann.npt.trainer.NPTTrainer`: stretches between checkpoints.

Each stretch is one :func:`~daskann.npt.resident.train_resident` call whose state stays on the
cells; they write the checkpoint at its end themselves, and the next stretch continues from
their memory. A lost grid worker restarts the stretch from its starting state (the checkpoint
before it) on the workers there are (:class:`~daskann.npt._replay.Replays`).
"""

from __future__ import annotations

import time
from functools import partial

from daskann import config
from daskann.cluster import worker_addresses
from daskann.exceptions import WorkerLost
from daskann.npt._replay import Replays
from daskann.npt._start import RunStart
from daskann.npt._stretch import Outcome, Stretch
from daskann.npt.resident import ResidentError, ResidentLostWorkers, ResidentResult, train_resident


def run_resident(client, run: Stretch, start: RunStart, outcome: Outcome) -> None:
    """Resident mode from ``start`` on ``outcome.grid``: history rows, grid and the cells' state go into ``outcome``."""
    t0 = time.perf_counter() - run.time_offset
    budget = config.count("npt.resident-restarts") if run.max_recoveries is None else run.max_recoveries
    replays = Replays(
        client, outcome.grid, what="resident training", budget=budget, timeout=run.timeout, error=ResidentLostWorkers
    )
    for stop in sorted(run.checkpoint_steps | {run.stop}):
        if stop <= start.step:
            continue
        save = run.on_checkpoint if stop in run.checkpoint_steps else None
        try:
            result, path, began = replays.run(start, partial(_stretch, client, run, stop=stop, save=save))
        finally:
            outcome.grid, outcome.recoveries = replays.grid, replays.tries
        _record(run, result, start.step, began - t0, time.perf_counter() - began, outcome)
        outcome.state = result.state
        if result.diverged_step is not None:
            # the cells rolled back to the last finite state
            outcome.diverged = (result.diverged_step, "the loss, its gradients or the weights")
            return
        # the next stretch continues from the cells' memory, or after a lost worker, from the store
        start = RunStart(stop, path=path, state=result.state)


def _stretch(client, run: Stretch, grid, start: RunStart, number: int, *, stop: int, save):
    """Try ``number`` at steps ``start.step .. stop - 1`` on ``grid``; :class:`WorkerLost` if a grid worker left.

    With ``save`` (:attr:`Stretch.on_checkpoint`), the cells then write the checkpoint of step ``stop``.
    Returns the result, the checkpoint's path (or None) and when the try began.
    """
    began = time.perf_counter()
    try:
        result = train_resident(
            client,
            grid,
            start=start,
            sizes=run.sizes,
            keep=True,
            X=run.X,
            y=run.y,
            order=run.order,
            settings=run.settings,
            stop=stop,
            run_id=f"{run.run_id}-r{number}",
            timeout=run.timeout,
            eval_fn=(lambda d: d in run.eval_steps) if run.eval_steps else None,
            validation=run.validation,
        )
        path = None
        if save is not None and result.diverged_step is None:
            state = result.state
            path = save(stop, state.layout.store_layout(state.dtype), state.save)
        return result, path, began
    except ResidentError as exc:
        if set(grid.workers) <= set(worker_addresses(client)):
            raise
        # a worker left: restart this stretch from its starting state on the workers there are
        raise WorkerLost(str(exc), None) from exc


def _record(run: Stretch, result: ResidentResult, start: int, clock: float, elapsed: float, outcome: Outcome) -> None:
    """History rows of a stretch that began ``clock`` seconds into the run and took ``elapsed``.

    The stretch's wall time is shared out over its steps in proportion to each step's compute and comm time.
    """
    busy = sum(r["compute_time"] + r["comm_time"] for r in result.rows) or 1.0
    for k, row in enumerate(result.rows):
        done = start + k + 1
        clock += (row["compute_time"] + row["comm_time"]) * elapsed / busy
        values = {
            "loss": row["loss"],
            "time": clock,
            "compute_time": row["compute_time"],
            "comm_time": row["comm_time"],
            "bytes_moved": float(row["bytes_moved"]),
        }
        # evaluated by the cells: neither the model nor the validation data came to the client
        values.update(result.evaluations.get(done, {}))
        outcome.history.append(done, **values)
        outcome.worker_times[done] = row["workers"]
        if run.progress is not None:
            run.progress(done, row["loss"])
