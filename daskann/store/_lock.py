"""The run lock: one training at a time writes to a run folder."""

from __future__ import annotations

import contextvars
import json
import os
import socket
import sys
import time
from pathlib import Path

from daskann import config as settings
from daskann._json import temporary_sibling
from daskann._validation import named_error
from daskann.exceptions import StoreError

LOCK_NAME = ".daskann-lock"
# run folders whose lock this context holds (contextvars: not inherited by other threads)
_HELD_LOCKS: contextvars.ContextVar[frozenset] = contextvars.ContextVar("daskann_held_locks", default=frozenset())


class RunLock:
    """Exclusive claim on a run folder while a training writes to it.

    The lock file is created with ``O_EXCL`` and holds the owner's host and
    pid; a lock left by a process of this host that no longer exists is stale
    and taken over. Re-entrant within one context: a training that holds the
    lock may run an inner training on the same folder (partition's fine-tune),
    while another thread or process is refused.
    """

    def __init__(self, folder):
        self.path = Path(folder) / LOCK_NAME
        self._held = False

    def _key(self) -> str:
        return str(self.path.resolve())

    def acquire(self) -> RunLock:
        held = _HELD_LOCKS.get()
        if self._key() in held:
            return self  # the enclosing training of this context holds it
        self.path.parent.mkdir(parents=True, exist_ok=True)
        owner = {"host": socket.gethostname(), "pid": os.getpid(), "since": time.time()}
        deadline = time.monotonic() + _holder_wait()
        takeovers = 0
        while True:
            if self._create(owner):
                self._held = True
                _HELD_LOCKS.set(held | {self._key()})
                return self
            holder = self._holder()
            if holder is None or self._is_stale(holder):
                if (takeovers := takeovers + 1) > 2:
                    raise named_error(StoreError, "output", f"{str(self.path.parent)!r}: could not take the run lock")
                self.path.unlink(missing_ok=True)
                continue
            if time.monotonic() >= deadline:
                raise named_error(
                    StoreError,
                    "output",
                    f"{str(self.path.parent)!r} is being written by another run "
                    f"(pid {holder.get('pid')} on {holder.get('host')}); wait for it or choose another folder",
                )
            time.sleep(0.2)

    def _create(self, owner: dict) -> bool:
        """Create the lock file with its content in one step; False if it exists."""
        # written aside and hard-linked into place: the lock never exists without its owner
        tmp = temporary_sibling(self.path)
        tmp.write_text(json.dumps(owner))
        try:
            os.link(tmp, self.path)
            return True
        except FileExistsError:
            return False
        except OSError:
            pass  # a file system without hard links: exclusive create, then write
        finally:
            tmp.unlink(missing_ok=True)
        try:
            fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o640)
        except FileExistsError:
            return False
        with os.fdopen(fd, "w") as f:
            json.dump(owner, f)
        return True

    def check_free(self, name: str = "output") -> None:
        """Refuse, without taking it, a lock that a live run holds (a check before any work starts)."""
        if self._key() in _HELD_LOCKS.get():
            return
        deadline = time.monotonic() + _holder_wait()
        while (holder := self._holder() if self.path.exists() else None) is not None and not self._held:
            if self._is_stale(holder) or time.monotonic() >= deadline:
                break
            time.sleep(0.2)
        if holder is not None and not self._held and not self._is_stale(holder):
            raise named_error(
                StoreError,
                name,
                f"{str(self.path.parent)!r} is being written by another run "
                f"(pid {holder.get('pid')} on {holder.get('host')}); wait for it or choose another folder",
            )

    def _holder(self) -> dict | None:
        """The lock's owner; a placeholder for a lock being written; None when it is gone or unreadable."""
        try:
            return json.loads(self.path.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError):
            try:
                young = time.time() - self.path.stat().st_mtime < settings.seconds("store.lock-write-grace")
            except OSError:
                return None
            # a lock created but not yet written (file systems without hard links) is held;
            # an unreadable old one is stale
            return {"host": "?", "pid": "?"} if young else None

    @staticmethod
    def _is_stale(holder: dict) -> bool:
        if holder.get("host") != socket.gethostname():
            return False
        if holder.get("pid") == os.getpid():
            return False
        try:
            os.kill(int(holder["pid"]), 0)
        except ProcessLookupError:
            return True
        except (PermissionError, KeyError, ValueError, TypeError):
            return False
        return False

    def release(self) -> None:
        if self._held:
            self.path.unlink(missing_ok=True)
            self._held = False
            _HELD_LOCKS.set(_HELD_LOCKS.get() - {self._key()})

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def _holder_wait() -> float:
    """Seconds a task on a Dask worker waits for a live holder of its lock (``daskann.store.lock-wait-in-task``).

    A task rerun after its worker left may find the lock of its first run still held: a worker retiring
    at its ``--lifetime`` finishes the task it runs while the scheduler has already given it to another
    worker. Outside a task (a user's fit) a held lock is refused at once.
    """
    distributed = sys.modules.get("distributed")
    if distributed is None:
        return 0.0
    try:
        distributed.get_worker()
    except ValueError:
        return 0.0
    return settings.seconds("store.lock-wait-in-task")
