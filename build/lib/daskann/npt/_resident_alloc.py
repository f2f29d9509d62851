"""Heap settings for the life of a resident task (Linux glibc only).

distributed's nanny starts workers with ``MALLOC_TRIM_THRESHOLD_=65536``. Setting
that variable also fixes glibc's mmap threshold at its 128 KiB default (the
dynamic adjustment is off), so every array above 128 KiB is mapped on
allocation and unmapped on free, and its pages are faulted in anew on each
use. A resident step allocates dozens of such blocks (a 128 x 256 float64
block is 256 KiB): measured on a 2-core machine, the same numpy training step
ran about twice as slowly in such a worker as in the client process, and at
the speed of the client with the thresholds below.

While at least one resident task runs in a worker, blocks up to
:data:`HEAP_BLOCKS` come from the heap and freed memory is kept for reuse; the
worker's own settings come back when the last one ends. Workers started
without that variable (glibc's dynamic threshold still on) are left alone.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import sys
import threading

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_GLIBC_DEFAULT = 128 * 1024
#: while a resident task runs, allocations up to this size come from the heap
HEAP_BLOCKS = 64 * 2**20

_lock = threading.Lock()
_users = 0


def _mallopt():
    if not sys.platform.startswith("linux") or "MALLOC_TRIM_THRESHOLD_" not in os.environ:
        return None
    try:
        fn = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # not glibc
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn


def _env_int(name: str) -> int:
    try:
        return int(os.environ.get(name, _GLIBC_DEFAULT))
    except ValueError:
        return _GLIBC_DEFAULT


@contextlib.contextmanager
def heap_for_blocks():
    """Serve the blocks of a resident run from the heap while it runs."""
    global _users
    mallopt = _mallopt()
    if mallopt is None:
        yield
        return
    with _lock:
        if _users == 0:
            mallopt(_M_MMAP_THRESHOLD, HEAP_BLOCKS)
            mallopt(_M_TRIM_THRESHOLD, 2 * HEAP_BLOCKS)
        _users += 1
    try:
        yield
    finally:
        with _lock:
            _users -= 1
            if _users == 0:
                mallopt(_M_MMAP_THRESHOLD, _env_int("MALLOC_MMAP_THRESHOLD_"))
                mallopt(_M_TRIM_THRESHOLD, _env_int("MALLOC_TRIM_THRESHOLD_"))
