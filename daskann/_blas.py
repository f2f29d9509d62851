"""BLAS on one thread in this process, as in every dask worker.

``daskann.cluster`` starts workers with one BLAS thread. A multi-threaded
OpenBLAS blocks a product with a long inner dimension (``(64, 784) @ (784,
512)``) differently, so the last bits of a result would depend on whether it
was computed in the client or on a worker.
"""

from __future__ import annotations

import functools

from threadpoolctl import ThreadpoolController


@functools.cache
def _controller() -> ThreadpoolController:
    # inspecting the loaded libraries costs about 0.5 ms: once per process
    return ThreadpoolController()


def one_blas_thread():
    """Context manager: BLAS on one thread while it is open."""
    return _controller().limit(limits=1, user_api="blas")
