"""The resident-mode run of :class:`~daskann.npt.trainer.NPTTrainer`: stretches between checkpoints.

Each stretch is one :func:`~daskann.npt.resident.train_resident` call whose state stays on the
cells; they write the checkpoint at its end themselves, and the next stretch continues from
their memory. A lost grid worker restarts the stretch from its starting state (the checkpoint
before it) on the workers there are (:class:`~daskann.npt._run.Replays`).
"""

from __future__ import annotations

import time
from functools import partial

from daskann import config
from daskann.cluster import worker_addresses
from daskann.exceptions import WorkerLost
from daskann.npt._run import Replays, RunRecord, RunSpec, RunStart
from daskann.npt.resident import ResidentError, ResidentLostWorkers, ResidentResult, train_resident


def run_resident(client, run: RunSpec, start: RunStart, record: RunRecord) -> None:
    """Resident mode from ``start`` on ``record.grid``: history rows, grid and the cells' state go into ``record``."""
    t0 = time.perf_counter() - run.time_offset
    budget = config.count("npt.resident-restarts") if run.max_recoveries is None else run.max_recoveries
    replays = Replays(
        client, record.grid, what="resident training", budget=budget, timeout=run.timeout, error=ResidentLostWorkers
    )
    for stop in sorted(run.checkpoint_steps | {run.stop}):
        if stop <= start.step:
            continue
        save = run.on_checkpoint if stop in run.checkpoint_steps else None
        try:
            result, path, began = replays.run(start, partial(_stretch, client, run, stop=stop, save=save))
        finally:
            record.grid, record.recoveries = replays.grid, replays.tries
        _add_rows(run, result, start.step, began - t0, time.perf_counter() - began, record)
        record.state = result.state
        if result.diverged_step is not None:
            # the cells rolled back to the last finite state
            record.diverged = (result.diverged_step, result.diverged_what)
            return
        # the next stretch continues from the cells' memory, or after a lost worker, from the store
        start = RunStart(stop, path=path, state=result.state)


def _stretch(client, run: RunSpec, grid, start: RunStart, number: int, *, stop: int, save):
    """Try ``number`` at steps ``start.step .. stop - 1`` on ``grid``; :class:`WorkerLost` if a grid worker left.

    With ``save`` (:attr:`RunSpec.on_checkpoint`), the cells then write the checkpoint of step ``stop``.
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


def _add_rows(
    run: RunSpec, result: ResidentResult, start: int, clock: float, elapsed: float, record: RunRecord
) -> None:
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
        record.history.append(done, **values)
        record.worker_times[done] = row["workers"]
        if run.progress is not None:
            run.progress(done, row["loss"])
