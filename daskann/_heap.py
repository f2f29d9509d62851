"""Heap settings while a training task runs in a dask worker (Linux glibc only).

distributed's nanny starts workers with ``MALLOC_TRIM_THRESHOLD_=65536``
(``distributed.nanny.pre-spawn-environ``), so that a worker's memory falls as
soon as its data is released. Setting that variable also fixes glibc's mmap
threshold at its 128 KiB default (the dynamic adjustment is off), so every
array above 128 KiB is mapped on allocation and unmapped on free, and its pages
are faulted in anew on each use. A training step allocates dozens of such
blocks (activations, gradients, weight blocks): measured on a 2-core machine, a
resident NPT step ran about twice as slowly in such a worker as in the client
process, an MGRIT step (256-512-512-10) used about 1.5 times its in-process CPU
and its store writes 2 to 6 times; both ran at the client's speed with the
thresholds below.

While at least one training task runs in a worker, blocks up to
:data:`HEAP_BLOCKS` come from the heap and freed memory is kept for reuse; when
the last one has ended and no other started for :data:`KEEP_SECONDS`, the
worker's own settings come back and the freed memory is given back to the
system, so the worker's memory between runs is what dask expects. The delay
keeps the memory of a run whose tasks follow one another (an MGRIT iteration's
sweeps, the next iteration) in the process: memory given back and mapped again
is cleared again by the kernel, and on a virtual machine that returns freed
pages to its host (free page reporting), a page freed for more than about two
seconds costs a host fault too. Measured on such a machine (2 cores): a fresh
128 MiB block took 250 ms against 5 ms from the kept heap; an MGRIT solve of
256-512-512-10 over 256 steps on two workers took 36 to 40 s against 50 to 52 s,
and a graph-mode NPT step of the 4096-wide net on a 2x1 grid 8.6 s against 9.7 s.
Workers started without that variable (glibc's dynamic threshold still on) are
left alone.

A task's own thread allocates from its own glibc arena, whose heaps are at most
64 MiB: larger blocks are mapped afresh whatever the threshold, unless the
worker runs with one arena (``MALLOC_ARENA_MAX=1``, which daskann's clusters
set: :data:`daskann.cluster.WORKER_ENVIRON`).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import sys
import threading
import time

from distributed import get_worker

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_GLIBC_DEFAULT = 128 * 1024
#: while a training task runs, allocations up to this size (an eighth of the worker's memory limit at most)
#: come from the heap, and up to twice as much freed memory stays at its top
HEAP_BLOCKS = 2**30
#: seconds the heap stays kept after the last training task ended, for the next task of the same run
KEEP_SECONDS = 5.0

_lock = threading.Lock()
_users = 0
_kept = False  # the heap settings are in force (while tasks run, and KEEP_SECONDS after)
_idle_since = 0.0  # monotonic time the last task ended
_release_timer: threading.Timer | None = None  # at most one, however many tasks end


@functools.cache
def _glibc():
    try:
        libc = ctypes.CDLL(None)
        libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
        libc.malloc_trim.argtypes = [ctypes.c_size_t]
    except (OSError, AttributeError):  # not glibc
        return None
    return libc


def _libc():
    """glibc, when the worker was started with ``MALLOC_TRIM_THRESHOLD_``; else None."""
    if not sys.platform.startswith("linux") or "MALLOC_TRIM_THRESHOLD_" not in os.environ:
        return None
    return _glibc()


def _env_int(name: str) -> int:
    try:
        return int(os.environ.get(name, _GLIBC_DEFAULT))
    except ValueError:
        return _GLIBC_DEFAULT


def _heap_blocks() -> int:
    """:data:`HEAP_BLOCKS`, or an eighth of this worker's memory limit if that is less."""
    try:
        limit = get_worker().memory_manager.memory_limit
    except (ValueError, AttributeError):  # not in a worker
        limit = None
    return int(min(HEAP_BLOCKS, limit // 8)) if limit else HEAP_BLOCKS


@contextlib.contextmanager
def heap_for_blocks():
    """Serve a training task's blocks from the heap while it runs (nested and concurrent uses share it)."""
    global _users, _kept, _idle_since
    libc = _libc()
    if libc is None:
        yield
        return
    with _lock:
        if not _kept:
            blocks = _heap_blocks()
            libc.mallopt(_M_MMAP_THRESHOLD, blocks)
            libc.mallopt(_M_TRIM_THRESHOLD, 2 * blocks)
            _kept = True
        _users += 1
    try:
        yield
    finally:
        with _lock:
            _users -= 1
            if _users == 0:
                _idle_since = time.monotonic()
                if _release_timer is None:
                    _schedule_release(libc, KEEP_SECONDS)


def keeps_heap(func):
    """Decorate a task function to run inside :func:`heap_for_blocks`."""

    @functools.wraps(func)
    def task(*args, **kwargs):
        with heap_for_blocks():
            return func(*args, **kwargs)

    return task


def _schedule_release(libc, seconds: float) -> None:
    global _release_timer
    _release_timer = threading.Timer(seconds, _release, args=(libc,))
    _release_timer.daemon = True
    _release_timer.start()


def _release(libc) -> None:
    """The worker's own settings back and the freed memory given back, once no task ran for KEEP_SECONDS."""
    global _kept, _release_timer
    with _lock:
        _release_timer = None
        if not _kept or _users:
            return  # a running task schedules the release again when it ends
        wait = _idle_since + KEEP_SECONDS - time.monotonic()
        if wait > 0:  # a task ended since this timer started
            _schedule_release(libc, wait)
            return
        libc.mallopt(_M_MMAP_THRESHOLD, _env_int("MALLOC_MMAP_THRESHOLD_"))
        libc.mallopt(_M_TRIM_THRESHOLD, _env_int("MALLOC_TRIM_THRESHOLD_"))
        libc.malloc_trim(0)
        _kept = False
