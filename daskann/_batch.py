"""Worker jobs of a batch-system cluster: which are still to come, and waiting for them.

On a batch system workers arrive when the queue starts their jobs, minutes after
they were submitted, and leave whole (walltime, ``scancel``, a failed node); a
replacement comes from the queue later, with a new address. A dask-jobqueue
cluster knows which workers it expects (its *plan*); the scheduler knows which
are connected. Everything here reads those two and, on SLURM, ``squeue``'s view
of the jobs, so that starting a run and replacing lost workers wait as long as
the queue needs, bounded by ``daskann.cluster.worker-wait``.
"""

from __future__ import annotations

import logging
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass

from daskann import config
from daskann.exceptions import WorkerWaitTimeout

logger = logging.getLogger("daskann.cluster")

#: seconds between two progress reports while waiting
REPORT_EVERY = 10.0
#: seconds between two looks at the scheduler while waiting
POLL = 0.5


@dataclass(frozen=True)
class Job:
    """One worker job as the batch system reports it (``state`` and ``reason`` as ``squeue`` prints them)."""

    job_id: str
    state: str
    reason: str

    def __str__(self) -> str:
        reason = f": {self.reason}" if self.reason and self.reason not in ("None", "(null)") else ""
        return f"{self.job_id} ({self.state}{reason})"


def is_batch_cluster(cluster) -> bool:
    """Whether ``cluster`` submits its workers as batch jobs (a dask-jobqueue cluster)."""
    return hasattr(cluster, "job_cls") and hasattr(cluster, "job_script")


#: scheduler statuses of a worker on its way out: retiring (at its job's walltime, ``--lifetime``) or closing
LEAVING = ("closing_gracefully", "closing", "closed")


def connected(c) -> dict[str, str]:
    """``{address: name}`` of the workers connected to ``c``'s scheduler and staying, asked of the scheduler itself.

    A worker that is leaving is not counted: its job is ending, and the job that replaces it is still to
    come (:func:`pending`), so a wait for replacements does not end on workers about to go.
    """
    info = c.sync(c.scheduler.identity, n_workers=-1)["workers"]
    return {addr: str(w.get("name")) for addr, w in info.items() if w.get("status") not in LEAVING}


def expected(c) -> set[str]:
    """Names of the workers ``c``'s cluster plans to have (empty when the client has no cluster object)."""
    cluster = getattr(c, "cluster", None)
    plan = getattr(cluster, "plan", None)
    return {str(name) for name in plan} if plan is not None else set()


def pending(c) -> set[str]:
    """Names of the workers ``c``'s cluster plans but the scheduler has not seen yet."""
    return expected(c) - set(connected(c).values())


def jobs(cluster) -> list[Job]:
    """The cluster's worker jobs as the batch system sees them (SLURM's ``squeue``; others: ids only)."""
    ids = [str(job.job_id) for job in getattr(cluster, "workers", {}).values() if getattr(job, "job_id", None)]
    if not ids:
        return []
    if shutil.which("squeue") is None or getattr(cluster.job_cls, "submit_command", None) != "sbatch":
        return [Job(i, "SUBMITTED", "") for i in ids]
    try:
        out = subprocess.run(
            ["squeue", "-h", "-o", "%i|%T|%r", "-j", ",".join(ids)], capture_output=True, text=True, timeout=10
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return [Job(i, "UNKNOWN", "squeue did not answer") for i in ids]
    seen = {}
    for line in out.splitlines():
        job_id, _, rest = line.partition("|")
        state, _, reason = rest.partition("|")
        seen[job_id.strip()] = Job(job_id.strip(), state.strip(), reason.strip())
    return [seen.get(i, Job(i, "ENDED", "")) for i in ids]


def describe(c, want: int) -> str:
    """One line on the wait: workers connected against wanted, and the jobs running and pending (with why)."""
    line = f"{len(connected(c))} of {want} workers connected"
    cluster = getattr(c, "cluster", None)
    if is_batch_cluster(cluster):
        states = jobs(cluster)
        running = sum(job.state == "RUNNING" for job in states)
        waiting = [job for job in states if job.state != "RUNNING"]
        line += f"; jobs: {running} running, {len(waiting)} pending"
        if waiting:
            line += " (" + ", ".join(map(str, waiting)) + ")"
    return line


def wait_for_workers(
    c,
    n: int | None = None,
    *,
    timeout: float | None = None,
    report: Callable[[str], None] | None = None,
) -> list[str]:
    """Wait until ``c`` has ``n`` workers (default: every worker its cluster plans, at least one).

    Parameters
    ----------
    c : distributed.Client
    n : int, optional
        Workers to wait for.
    timeout : float, optional
        Seconds (default: the setting ``daskann.cluster.worker-wait``).
    report : callable, optional
        Called with a line on the workers and jobs every ``REPORT_EVERY`` seconds of waiting
        (default: the ``daskann.cluster`` logger at INFO).

    Returns
    -------
    list of str
        The addresses of the connected workers.

    Raises
    ------
    WorkerWaitTimeout
        Fewer than ``n`` workers after ``timeout`` seconds; the message names the jobs still
        queued and the setting.
    """
    setting = timeout is None
    timeout = config.seconds("cluster.worker-wait") if setting else float(timeout)
    report = report or (lambda line: logger.info("Waiting for workers: %s", line))
    want = n if n is not None else max(1, len(expected(c)))
    start = time.monotonic()
    next_report = start + min(2.0, REPORT_EVERY)
    while len(now := connected(c)) < want:
        elapsed = time.monotonic() - start
        if elapsed >= timeout:
            where = f"daskann.cluster.worker-wait={config.get('cluster.worker-wait')!r}" if setting else "timeout"
            raise WorkerWaitTimeout(
                f"{where} ran out after {elapsed:.0f} s: {describe(c, want)}. Raise the setting "
                "(dask.config.set({'daskann.cluster.worker-wait': '2h'}) or DASK_DASKANN__CLUSTER__WORKER_WAIT=2h), "
                "or look at the queue (squeue --me)"
            )
        if time.monotonic() >= next_report:
            report(describe(c, want))
            next_report = time.monotonic() + REPORT_EVERY
        time.sleep(POLL)
    return list(now)


def wait_for_replacements(c, n: int, *, grace: float, timeout: float | None = None) -> list[str]:
    """Wait for lost workers' replacements; return the workers there are when the wait ends.

    A batch cluster that still has workers to come (its plan lists jobs that have not
    connected) is waited for up to ``timeout`` (default: ``daskann.cluster.worker-wait``),
    since a replacement job may queue for minutes; any other cluster for ``grace`` seconds,
    the time a nanny takes to restart a worker in place. Never raises on running out: the
    caller decides what to do with fewer workers.
    """
    cluster = getattr(c, "cluster", None)
    deadline = time.monotonic() + grace
    bound = time.monotonic() + (config.seconds("cluster.worker-wait") if timeout is None else timeout)
    batch = is_batch_cluster(cluster)
    next_report = time.monotonic() + REPORT_EVERY
    while len(now := connected(c)) < n:
        # jobs still to come, from the same look at the scheduler as the workers counted
        waiting_for_jobs = batch and bool(expected(c) - set(now.values()))
        if time.monotonic() >= (bound if waiting_for_jobs else deadline):
            break
        if batch and time.monotonic() >= next_report:
            logger.warning("Waiting for replacement workers: %s", describe(c, n))
            next_report = time.monotonic() + REPORT_EVERY
        time.sleep(POLL)
    return list(now)
