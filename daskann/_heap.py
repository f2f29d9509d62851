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
the last one ends, the worker's own settings come back and the freed memory is
given back to the system, so the worker's memory between tasks is what dask
expects. Workers started without that variable (glibc's dynamic threshold still
on) are left alone.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import sys
import threading

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_GLIBC_DEFAULT = 128 * 1024
#: while a training task runs, allocations up to this size come from the heap
HEAP_BLOCKS = 64 * 2**20

_lock = threading.Lock()
_users = 0


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


@contextlib.contextmanager
def heap_for_blocks():
    """Serve a training task's blocks from the heap while it runs (nested and concurrent uses share it)."""
    global _users
    libc = _libc()
    if libc is None:
        yield
        return
    with _lock:
        if _users == 0:
            libc.mallopt(_M_MMAP_THRESHOLD, HEAP_BLOCKS)
            libc.mallopt(_M_TRIM_THRESHOLD, 2 * HEAP_BLOCKS)
        _users += 1
    try:
        yield
    finally:
        with _lock:
            _users -= 1
            if _users == 0:
                libc.mallopt(_M_MMAP_THRESHOLD, _env_int("MALLOC_MMAP_THRESHOLD_"))
                libc.mallopt(_M_TRIM_THRESHOLD, _env_int("MALLOC_TRIM_THRESHOLD_"))
                libc.malloc_trim(0)
