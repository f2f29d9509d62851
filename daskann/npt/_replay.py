"""Replay after lost grid workers: the one loop graph and resident modes restart their tries with.

A try that loses a grid worker raises :class:`~daskann.exceptions.WorkerLost`, carrying the latest
:class:`~daskann.npt._start.RunStart` it saved (or None: the one it began from). The same grid is
then laid onto the workers there are (sharing workers if the cluster shrank) and a new try, under
its own number, restarts from that state. The budget is per saved state: ``budget`` replays from
one state, renewed by a try that reached a later one, so a long run with checkpoints survives any
number of spaced-out worker losses.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from daskann import config
from daskann._batch import wait_for_replacements
from daskann.cluster import worker_addresses
from daskann.exceptions import LostWorkersError, WorkerLost
from daskann.npt._start import RunStart
from daskann.npt.grid import ProcessGrid

T = TypeVar("T")


class Replays:
    """The tries of one run on a grid that may lose workers.

    Parameters
    ----------
    client : distributed.Client
    grid : ProcessGrid
        The grid of the first try; :attr:`grid` is the latest try's.
    what : str
        The training named in errors (``"graph-mode training"``).
    budget : int
        Replays from one saved state before giving up.
    timeout : float
        Seconds the training allows without progress (bounds the wait for replacement workers).
    error : type
        Raised on giving up: :class:`~daskann.exceptions.LostWorkersError` or a subclass.
    """

    def __init__(self, client, grid: ProcessGrid, *, what: str, budget: int, timeout: float, error=LostWorkersError):
        self.client, self.grid, self.what = client, grid, what
        self.budget, self.timeout, self.error = budget, timeout, error
        self.tries = 0  # replays so far, over every call of run (each try has its own number)

    def run(self, start: RunStart, attempt: Callable[[ProcessGrid, RunStart, int], T]) -> T:
        """``attempt(grid, start, number)``, tried again from the state a lost worker left, until it returns."""
        since = 0  # replays since the state they restart from was saved
        while True:
            try:
                return attempt(self.grid, start, self.tries)
            except WorkerLost as exc:
                self.tries += 1
                reached = exc.args[1] if len(exc.args) > 1 and exc.args[1] is not None else start
                # the cells' state may have left with the worker: only a store or the client can restart it
                if (reached := reached.without_cells()) is None:
                    raise self.error(
                        f"{self.what} lost the grid state it continued from, which no checkpoint holds ({exc.args[0]})"
                    ) from exc
                since = 1 if reached.step > start.step else since + 1
                start = reached
                if since > self.budget:
                    raise self.error(
                        f"{self.what} lost workers {since} times since step {start.step} ({exc.args[0]}); "
                        f"giving up after {self.budget} replays"
                    ) from exc
                self.grid = self._regrid()

    def _regrid(self) -> ProcessGrid:
        """The same grid shape on the workers there are once the lost ones are replaced, or no more are coming.

        A nanny restarts a worker in place within seconds (``daskann.npt.regrid-timeout``); a batch
        system's replacement job comes from the queue, waited for while the cluster has jobs to come
        (``daskann.cluster.worker-wait``).
        """
        client, grid = self.client, self.grid
        try:
            wait_for_replacements(
                client, len(set(grid.workers)), grace=min(config.seconds("npt.regrid-timeout"), self.timeout)
            )
        except OSError:  # the scheduler itself is gone: the next try says so
            pass
        workers = worker_addresses(client)
        if not workers:
            raise self.error(f"{self.what} lost every worker of the cluster")
        return ProcessGrid.from_workers(grid.shape, workers, share_workers=True)
