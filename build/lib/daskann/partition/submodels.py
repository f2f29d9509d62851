"""Train the k sub-models as independent Dask futures, with retries and failure reports.

Each sub-model is one long task (``client.submit``) that runs the serial
trainer on a worker: no communication between sub-models, the training data
scattered once to every worker and passed as futures. A task is a pure
function of its :class:`SubModelSpec` (seeded initialisation and batch
order), so a task the scheduler reruns after its worker died gives the same
weights; with a run folder it resumes from its own last checkpoint.
"""

from __future__ import annotations

import os
import socket
import time
from concurrent.futures import CancelledError
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import xarray as xr

from daskann.nn import MLP

#: reruns of a sub-model task cancelled because every copy of its scattered data was lost
LOST_DATA_RERUNS = 2

#: settings a sub-model shares with the full network's trainer
SHARED_SETTINGS = (
    "activation", "output", "loss", "lr", "momentum", "batch_size", "shuffle", "dtype", "negative_slope",
    "eval_every",
)


class SubModelError(RuntimeError):
    """One or more sub-models failed for good (after their retries).

    Attributes
    ----------
    failed : dict of int to BaseException
        The error of each failed sub-model, by index.
    results : list
        One :class:`SubModelResult` per sub-model, ``None`` where it failed;
        the trainer also keeps them in ``submodel_results_``.
    """

    def __init__(self, failed: dict, results: list, attempts: int):
        self.failed = dict(failed)
        self.results = list(results)
        kept = [g for g, r in enumerate(results) if r is not None]
        parts = [
            f"sub-model {g} of {len(results)} failed after up to {attempts} attempts: {type(exc).__name__}: {exc}"
            for g, exc in sorted(self.failed.items())
        ]
        parts.append(
            f"the results of sub-models {kept} are kept (PartitionTrainer.submodels_)" if kept
            else "no sub-model finished"
        )
        super().__init__("; ".join(parts))


@dataclass(frozen=True)
class SubModelSpec:
    """Everything one sub-model task needs besides the data (small and picklable)."""

    index: int
    hidden_sizes: tuple[int, ...]
    seed: int
    settings: dict
    steps: int
    checkpoint_dir: str | None = None
    checkpoint_every: int | None = None


@dataclass
class SubModelResult:
    """A trained sub-model and where, when and how long it ran.

    Attributes
    ----------
    index, seed : int
    model : MLP
    history : xarray.Dataset
        The serial trainer's history over ``step``.
    worker : str
        Address of the worker that ran the (last, successful) attempt.
    host, pid : str, int
    started, finished : float
        Wall-clock times (``time.time()``) of the attempt, on the worker.
    seconds : float
        Training time of the attempt (wall clock).
    cpu_seconds : float
        CPU time of the thread that trained (unaffected by other load on the machine).
    resumed_from : int
        Step of the checkpoint the attempt resumed from (0: from scratch).
    """

    index: int
    seed: int
    model: MLP
    history: xr.Dataset
    worker: str = ""
    host: str = ""
    pid: int = 0
    started: float = 0.0
    finished: float = 0.0
    seconds: float = 0.0
    cpu_seconds: float = 0.0
    resumed_from: int = 0
    extra: dict = field(default_factory=dict)


def submodel_seeds(seed: int, k: int) -> list[int]:
    """Distinct seeds of the ``k`` sub-models, derived from the run seed."""
    ss = np.random.SeedSequence(int(seed), spawn_key=(0x5EED,))
    return [int(child.generate_state(1, dtype=np.uint32)[0]) for child in ss.spawn(k)]


def merge_seed(seed: int) -> np.random.SeedSequence:
    """Seed of the merge noise, derived from the run seed apart from the sub-model seeds."""
    return np.random.SeedSequence(int(seed), spawn_key=(0x3E46E,))


def submodel_dir(run_dir, index: int) -> Path:
    """Run folder of sub-model ``index`` inside a partition run folder."""
    return Path(run_dir) / "partition" / f"submodel-{index}"


def train_submodel(spec: SubModelSpec, X, y, validation) -> SubModelResult:
    """Train one sub-model with the serial trainer (runs as a Dask task).

    With a run folder, checkpoints go to the sub-model's own folder, and a
    checkpoint already there is resumed: the trainer clears the folder before
    a fresh run, so a checkpoint found is either the user's run being resumed
    or an earlier attempt of this task whose worker died.
    """
    from daskann import store
    from daskann.serial import SerialTrainer

    started = time.time()
    trainer = SerialTrainer(
        spec.hidden_sizes, seed=spec.seed, checkpoint_every=spec.checkpoint_every, verbose=0,
        checkpoint_dir=spec.checkpoint_dir, **spec.settings,
    )
    resume, resumed_from = None, 0
    if spec.checkpoint_dir is not None and store.list_checkpoints(spec.checkpoint_dir):
        resume = spec.checkpoint_dir
        resumed_from = store.load_checkpoint(resume).step
    t0, c0 = time.perf_counter(), time.thread_time()
    trainer.fit(X, y, steps=spec.steps, validation_data=validation, resume=resume)
    seconds, cpu_seconds = time.perf_counter() - t0, time.thread_time() - c0
    if spec.checkpoint_dir is not None:
        store.save_history(trainer.history_, Path(spec.checkpoint_dir) / "history.zarr")
    return SubModelResult(
        index=spec.index, seed=spec.seed, model=trainer.model_, history=trainer.history_,
        worker=_worker_address(), host=socket.gethostname(), pid=os.getpid(),
        started=started, finished=time.time(), seconds=seconds, cpu_seconds=cpu_seconds, resumed_from=resumed_from,
    )


def _worker_address() -> str:
    try:
        from distributed import get_worker

        return get_worker().address
    except ValueError:  # called outside a worker
        return ""


def run_submodels(
    client,
    specs: list[SubModelSpec],
    data,
    *,
    mode: str,
    prefix: str,
    retries: int,
    timeout: float,
    rescatter=None,
) -> tuple[list, dict]:
    """Submit the sub-model tasks and collect what finished.

    Parameters
    ----------
    client : distributed.Client
    specs : list of SubModelSpec
    data : tuple
        ``(X, y, validation)`` as futures (or small objects) for the tasks.
    mode : {"parallel", "sequential"}
        All at once, or each submitted when the previous one finished.
    prefix : str
        Per-run key prefix.
    retries : int
        Extra attempts of a task that raises.
    timeout : float
        Seconds to wait for the sub-model phase before giving up.
    rescatter : callable, optional
        Gives ``data`` scattered anew. Scattered data is never recomputed: when
        every worker holding it died, the tasks that need it are cancelled; with
        ``rescatter`` they run again (resuming from their checkpoints) on the
        new copy, at most :data:`LOST_DATA_RERUNS` times each.

    Returns
    -------
    results : list
        One :class:`SubModelResult` per sub-model, ``None`` where it failed.
    failed : dict of int to BaseException
    """
    from daskann.cluster import worker_addresses

    workers = worker_addresses(client)
    current = {"data": data}
    deadline = time.perf_counter() + timeout
    results: list = [None] * len(specs)
    failed: dict = {}
    by_index = {spec.index: spec for spec in specs}

    def submit(spec, rerun=0):
        # a soft hint spreads the sub-models over the workers; never a hard pin,
        # so a task whose worker died can run on another one
        hint = [workers[spec.index % len(workers)]] if workers else None
        X, y, validation = used = current["data"]
        key = f"{prefix}-submodel-{spec.index}" + (f"-rerun{rerun}" if rerun else "")
        future = client.submit(
            train_submodel, spec, X, y, validation, key=key,
            retries=retries, workers=hint, allow_other_workers=True, pure=False,
        )
        return future, used

    def data_lost(used) -> bool:
        X, y, validation = used
        return any(getattr(f, "status", "finished") != "finished" for f in (X, y, *(validation or ())))

    def collect(futures: dict):
        for g, (future, used) in futures.items():
            rerun = 0
            while True:
                try:
                    results[g] = future.result(timeout=max(deadline - time.perf_counter(), 0.001))
                except CancelledError as exc:
                    # (the data futures may not know yet that they are lost when their dependants are told)
                    lost = data_lost(used) or any(
                        reason in str(exc) for reason in ("lost dependencies", "already forgotten"))
                    if rescatter is None or rerun >= LOST_DATA_RERUNS or not lost:
                        failed[g] = exc
                        future.release()
                        break
                    # every copy of the data died with its workers: scatter it again (once) and rerun
                    if current["data"] is used or data_lost(current["data"]):
                        current["data"] = rescatter()
                    future.release()
                    rerun += 1
                    future, used = submit(by_index[g], rerun)
                    continue
                except Exception as exc:
                    if not future.done():  # still running: the phase ran out of time
                        pending = [i for i, (f, _) in futures.items() if not f.done()]
                        client.cancel([f for f, _ in futures.values()] + [future])
                        raise TimeoutError(
                            f"timeout={timeout:g} s is not enough: sub-models {pending} had not finished; "
                            "raise the timeout or shorten sub_steps"
                        ) from None
                    failed[g] = exc  # raised on every attempt, or its workers died (KilledWorker)
                future.release()
                break

    if mode == "parallel":
        collect({spec.index: submit(spec) for spec in specs})
    else:
        for spec in specs:
            collect({spec.index: submit(spec)})
    return results, failed
