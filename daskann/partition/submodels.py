"""Train the k sub-models as independent Dask futures, with retries and failure reports.

Each sub-model is one long task (``client.submit``) that runs the serial
trainer on a worker: no communication between sub-models, the training data
scattered once to every worker and passed as futures. A task is a pure
function of its :class:`SubModelSpec` (seeded initialisation and batch
order), so a task the scheduler reruns after its worker died gives the same
weights; with a run folder it resumes from its own last checkpoint. Each
attempt announces on the scheduler's event log that it started, so that a
rerun which only waited for a worker is told apart from one that ran.

NPT sub-models (:func:`run_npt_submodels`) are not tasks: an NPT run spreads one
network over every worker, so they run one after another, each using the whole
cluster, a run that raises tried again up to ``retries`` times.
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
from distributed import as_completed, get_worker

from daskann import config, store
from daskann._base import constructor_arguments
from daskann._validation import named_error
from daskann.cluster import current_client, result_within, worker_addresses
from daskann.nn import MLP
from daskann.serial import SerialTrainer

#: settings a sub-model shares with the full network's trainer
SHARED_SETTINGS = (
    "activation",
    "output",
    "loss",
    "lr",
    "momentum",
    "batch_size",
    "shuffle",
    "dtype",
    "negative_slope",
)

#: scheduler event topic on which each sub-model attempt logs its task key as it starts
STARTED_TOPIC = "daskann-submodel-started"


@dataclass(frozen=True)
class SubModelSpec:
    """Everything one sub-model task needs besides the data (small and picklable)."""

    index: int
    hidden_sizes: tuple[int, ...]
    seed: int
    settings: dict
    steps: int
    eval_every: int | None = None
    checkpoint_dir: str | None = None
    checkpoint_every: int | None = None

    def trainer_arguments(self) -> dict:
        """The sub-model trainer's keywords: the shared settings, its seed and run folder, silent."""
        return constructor_arguments(
            self.settings,
            seed=self.seed,
            verbose=0,
            checkpoint_dir=self.checkpoint_dir,
            checkpoint_every=self.checkpoint_every,
        )


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
    started = time.time()
    _log_start()
    trainer = SerialTrainer(spec.hidden_sizes, **spec.trainer_arguments())
    resume, resumed_from = _resume_point(spec)
    t0, c0 = time.perf_counter(), time.thread_time()
    trainer.fit(X, y, steps=spec.steps, validation_data=validation, eval_every=spec.eval_every, resume=resume)
    seconds, cpu_seconds = time.perf_counter() - t0, time.thread_time() - c0
    _save_history(spec, trainer)
    return _result(spec, trainer, _worker_address(), started, seconds, cpu_seconds, resumed_from)


def run_npt_submodels(client, specs: list[SubModelSpec], data, *, retries: int, npt_options: dict):
    """Train each sub-model with :class:`daskann.NPTTrainer` on ``client``, one after another.

    Returns ``(results, failed)`` as :func:`run_submodels`.
    """
    from daskann.npt import NPTTrainer  # the NPT engine loads on first use, as in trainer._npt_trainer_class

    results: list = [None] * len(specs)
    failed: dict = {}
    for spec in specs:
        for attempt in range(retries + 1):
            started = time.time()
            trainer = NPTTrainer(spec.hidden_sizes, client=client, **spec.trainer_arguments(), **npt_options)
            resume, resumed_from = _resume_point(spec)
            t0 = time.perf_counter()
            try:
                # parts of the NPT engine look for the current client; make it this one
                with current_client(client):
                    trainer.fit(
                        data.X,
                        data.y,
                        steps=spec.steps,
                        validation_data=data.validation,
                        eval_every=spec.eval_every,
                        resume=resume,
                    )
            except Exception as exc:
                failed[spec.index] = exc
                continue
            failed.pop(spec.index, None)
            _save_history(spec, trainer)
            grid = trainer.grid_
            results[spec.index] = _result(
                spec,
                trainer,
                ",".join(sorted(set(grid.workers))),
                started,
                time.perf_counter() - t0,
                float("nan"),
                resumed_from,
                extra={"grid": f"{grid.rows}x{grid.cols}", "mode": trainer.mode_, "attempts": attempt + 1},
            )
            break
    return results, failed


def _resume_point(spec: SubModelSpec) -> tuple[str | None, int]:
    """The sub-model's own checkpoint to resume from and its step (``None, 0``: a fresh start)."""
    if spec.checkpoint_dir is not None and store.list_checkpoints(spec.checkpoint_dir):
        return spec.checkpoint_dir, store.load_checkpoint(spec.checkpoint_dir).step
    return None, 0


def _save_history(spec: SubModelSpec, trainer) -> None:
    if spec.checkpoint_dir is not None:
        store.save_history(trainer.history_, Path(spec.checkpoint_dir) / store.HISTORY_STORE)


def _result(spec, trainer, worker, started, seconds, cpu_seconds, resumed_from, extra=None) -> SubModelResult:
    """A trained sub-model and its attempt: where it ran, its clock times and training time."""
    return SubModelResult(
        index=spec.index,
        seed=spec.seed,
        model=trainer.model_,
        history=trainer.history_,
        worker=worker,
        host=socket.gethostname(),
        pid=os.getpid(),
        started=started,
        finished=time.time(),
        seconds=seconds,
        cpu_seconds=cpu_seconds,
        resumed_from=resumed_from,
        extra=extra or {},
    )


def _log_start() -> None:
    try:
        worker = get_worker()
    except ValueError:  # called outside a worker
        return
    worker.log_event(STARTED_TOPIC, worker.get_current_task())


def _worker_address() -> str:
    try:
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
    watch=None,
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
        ``rescatter`` they run again on the new copy, resuming from their
        checkpoints, at most ``daskann.partition.lost-data-reruns`` times in a
        row after an attempt that started and wrote no newer checkpoint.
    watch : callable, optional
        Called with every sub-model future as it is submitted (a progress
        display attaches a done-callback to it).

    Returns
    -------
    results : list
        One :class:`SubModelResult` per sub-model, ``None`` where it failed.
    failed : dict of int to BaseException
    """
    tasks = _SubModelTasks(client, specs, data, prefix, retries, timeout, rescatter, watch)
    if mode == "parallel":
        tasks.collect({spec.index: tasks.submit(spec) for spec in specs})
    else:
        for spec in specs:
            tasks.collect({spec.index: tasks.submit(spec)})
    return tasks.results, tasks.failed


class _SubModelTasks:
    """One phase's sub-model futures, the data they read, and what came back (see :func:`run_submodels`)."""

    def __init__(self, client, specs: list[SubModelSpec], data, prefix, retries, timeout, rescatter, watch):
        self.client, self.prefix, self.retries, self.timeout = client, prefix, retries, timeout
        self.rescatter, self.watch = rescatter, watch
        self.workers = tuple(worker_addresses(client))  # spread the sub-models over these
        self.deadline = time.perf_counter() + timeout  # by which every sub-model must have finished
        self.by_index = {spec.index: spec for spec in specs}
        self.data = data  # the latest copy of (X, y, validation) on the cluster
        self.results: list = [None] * len(specs)
        self.failed: dict = {}

    def remaining(self) -> float:
        return max(self.deadline - time.perf_counter(), 0.001)

    def submit(self, spec: SubModelSpec, rerun: int = 0):
        """The future of one sub-model task and the data it reads."""
        # a soft hint spreads the sub-models over the workers; never a hard pin,
        # so a task whose worker died can run on another one. Sub-models start in
        # index order, and a rerun keeps its sub-model's place in that order.
        hint = [self.workers[spec.index % len(self.workers)]] if self.workers else None
        X, y, validation = used = self.data
        key = f"{self.prefix}-submodel-{spec.index}" + (f"-rerun{rerun}" if rerun else "")
        future = self.client.submit(
            train_submodel,
            spec,
            X,
            y,
            validation,
            key=key,
            retries=self.retries,
            workers=hint,
            allow_other_workers=True,
            priority=-spec.index,
            pure=False,
        )
        if self.watch is not None:
            self.watch(future)
        return future, used

    def collect(self, futures: dict) -> None:
        """Wait for ``{index: (future, data)}`` as they finish, rerunning the tasks whose data was lost.

        A sub-model is rerun as soon as it was cancelled, not after the ones before it finished;
        sub-models that lost their data together rerun in index order.
        """
        running = {
            future: (g, used, _LostDataReruns(self.by_index[g].checkpoint_dir)) for g, (future, used) in futures.items()
        }
        finished = as_completed(list(running), loop=self.client.loop, timeout=self.remaining())
        while running:
            try:
                lost = self._take([next(finished)], running)
            except TimeoutError:
                self._time_out(running)
            if not lost:
                continue
            self._renew_data(lost)
            # a new scatter waits for workers to come back: by then the other tasks that lost the data were told
            lost += self._take(finished.next_batch(block=False), running)
            self._renew_data(lost)
            for g, reruns in sorted((g, reruns) for g, _, reruns in lost):
                future, used = self.submit(self.by_index[g], reruns.total)
                running[future] = (g, used, reruns)
                finished.add(future)

    def _take(self, done: list, running: dict) -> list:
        """Record the outcome of the ``done`` futures; returns ``(index, data, reruns)`` of those to rerun."""
        lost = []
        for future in done:
            g, used, reruns = running.pop(future)
            try:
                self.results[g] = result_within(future, self.remaining())
            except CancelledError as exc:
                if self.rescatter is not None and _lost_with_its_data(exc, used):
                    if reruns.allow(started=self._started(future.key)):
                        lost.append((g, used, reruns))
                        continue
                self.failed[g] = exc
            except Exception as exc:
                if future.status != "error":  # not finished by the deadline: recomputed after its result was lost
                    running[future] = (g, used, reruns)
                    self._time_out(running)
                self.failed[g] = exc  # raised on every attempt, or its workers died (KilledWorker)
            finally:
                future.release()
        return lost

    def _started(self, key) -> bool:
        """Whether the attempt with this task key began on a worker (it logged so as it started)."""
        return any(key == logged for _, logged in self.client.get_events(STARTED_TOPIC))

    def _renew_data(self, lost: list) -> None:
        # every copy of the data died with its workers: scatter it again (once) for the reruns
        if any(self.data is used for _, used, _ in lost) or _data_lost(self.data):
            self.data = self.rescatter()

    def _time_out(self, running: dict) -> None:
        pending = sorted(g for g, _, _ in running.values())
        self.client.cancel(list(running))
        raise named_error(
            TimeoutError,
            "timeout",
            f"{self.timeout:g} s is not enough: sub-models {pending} had not finished; "
            "raise the timeout or shorten sub_steps",
        ) from None


class _LostDataReruns:
    """How often one sub-model may rerun after its data was lost.

    On a batch system every copy of the scattered data may leave with its workers at each
    walltime, so a long sub-model loses it once per generation of worker jobs. An attempt that
    wrote a checkpoint made progress, and one that never started (it waited for a worker
    behind other sub-models) had no chance to: only attempts in a row that started and wrote
    no newer checkpoint count against ``daskann.partition.lost-data-reruns`` (without a run
    folder, every attempt that started does). The phase's timeout bounds the rest.
    """

    def __init__(self, checkpoint_dir: str | None):
        self.checkpoint_dir = checkpoint_dir
        self.newest = self._newest_checkpoint()
        self.in_a_row = 0
        self.total = 0

    def _newest_checkpoint(self) -> str | None:
        if self.checkpoint_dir is None:
            return None
        found = store.list_checkpoints(self.checkpoint_dir)
        return found[0].name if found else None

    def allow(self, started: bool) -> bool:
        """Whether the sub-model may run again after an attempt that ``started`` or not.

        An attempt that started and made no progress counts, when the sub-model may run again.
        """
        newest = self._newest_checkpoint()
        if newest != self.newest:
            self.newest, self.in_a_row = newest, 0
        if started:
            if self.in_a_row >= config.count("partition.lost-data-reruns"):
                return False
            self.in_a_row += 1
        self.total += 1
        return True


def _lost_with_its_data(exc: CancelledError, used) -> bool:
    # (the data futures may not know yet that they are lost when their dependants are told)
    return _data_lost(used) or any(reason in str(exc) for reason in ("lost dependencies", "already forgotten"))


def _data_lost(used) -> bool:
    X, y, validation = used
    return any(getattr(f, "status", "finished") != "finished" for f in (X, y, *(validation or ())))
