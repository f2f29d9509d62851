"""BLAS in this process: on one thread, as in every dask worker, and the GEMM probe of its speed.

``daskann.cluster`` starts workers with one BLAS thread. A multi-threaded
OpenBLAS blocks a product with a long inner dimension (``(64, 784) @ (784,
512)``) differently, so the last bits of a result would depend on whether it
was computed in the client or on a worker.

The cost model, the planner and the benchmarks share the GEMM probe: each
probe times matrix products in the calling process; run it on a worker with
``client.run`` to probe the worker.
"""

from __future__ import annotations

import functools
import time

import numpy as np
from threadpoolctl import ThreadpoolController


@functools.cache
def _controller() -> ThreadpoolController:
    # inspecting the loaded libraries costs about 0.5 ms: once per process
    return ThreadpoolController()


def one_blas_thread():
    """Context manager: BLAS on one thread while it is open."""
    return _controller().limit(limits=1, user_api="blas")


def gemm_rate(n: int = 256, *, seconds: float = 0.1, repeats: int | None = None, dtype: str = "float64") -> float:
    """FLOP/s of ``n x n`` GEMMs in this process, after one warm-up product.

    Parameters
    ----------
    n : int
        Side of the square operands.
    seconds : float
        Time budget of back-to-back products; the rate is their count over the time taken.
    repeats : int, optional
        Instead of the budget, time this many products one by one and take the fastest
        (a peak rate: other load on a shared machine only ever slows a product down).
    dtype : str
        Type of the operands.
    """
    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n)).astype(dtype)
    b = rng.standard_normal((n, n)).astype(dtype)
    a @ b
    if repeats is not None:
        best = float("inf")
        for _ in range(repeats):
            t0 = time.perf_counter()
            a @ b
            best = min(best, time.perf_counter() - t0)
        return 2.0 * n**3 / best
    count, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        a @ b
        count += 1
    return 2.0 * n**3 * count / (time.perf_counter() - t0)


def gemm_call_seconds(n: int = 8, calls: int = 200) -> float:
    """Seconds of one tiny ``n x n`` GEMM call: the fixed cost of a call, averaged over ``calls``."""
    s = np.random.default_rng(0).standard_normal((n, n))
    t0 = time.perf_counter()
    for _ in range(calls):
        s @ s
    return (time.perf_counter() - t0) / calls


__all__ = ["gemm_call_seconds", "gemm_rate", "one_blas_thread"]
