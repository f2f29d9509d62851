"""What every benchmark report shares: the machine it ran on.

The machine is its platform, library versions, CPU and BLAS (client and
workers). Each benchmark's report keeps the layout it always had (other tools
read them), so there is one function per layout, built from the same pieces.
"""

from __future__ import annotations

import os
import platform

import dask
import distributed
import numpy as np

from daskann.cluster import _blas_info, blas_info, worker_addresses, worker_threads

#: the BLAS fields of each report, in their order
NPT_BLAS_KEYS = ("internal_api", "num_threads", "filepath", "version", "threading_layer", "architecture")
MGRIT_BLAS_KEYS = ("internal_api", "version", "architecture", "num_threads")
PARTITION_BLAS_KEYS = ("internal_api", "version", "architecture", "num_threads", "threading_layer")


def _where() -> dict:
    return {"platform": platform.platform(), "processor": platform.processor() or platform.machine()}


def _versions() -> dict:
    return {
        "python": platform.python_version(),
        "numpy": np.__version__,
        "dask": dask.__version__,
        "distributed": distributed.__version__,
    }


def cpu_model() -> str | None:
    """The CPU's model name from ``/proc/cpuinfo`` (``None`` where there is none)."""
    try:
        with open("/proc/cpuinfo") as f:
            names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
    except OSError:
        return None
    return names[0] if names else None


def npt_machine(client=None) -> dict:
    """``bench-npt.json``'s ``machine``: this process's BLAS, the load, and one worker's BLAS."""
    info = {
        **_where(),
        "cpu_count": os.cpu_count(),
        **_versions(),
        "blas_client": _blas_info(NPT_BLAS_KEYS),
        "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "cpu_model": cpu_model(),
    }
    if client is not None:
        workers = worker_addresses(client)
        info["workers"] = len(workers)
        info["threads_per_worker"] = sorted(set(worker_threads(client).values()))
        if workers:
            info["blas_worker"] = blas_info(client, keys=NPT_BLAS_KEYS, workers=workers[:1])[workers[0]]
    return info


def mgrit_machine() -> dict:
    """``mgrit-bench.json``'s and ``mgrit-efficiency.json``'s ``machine``: this process only."""
    return {**_where(), **_versions(), "blas": _blas_info(MGRIT_BLAS_KEYS)}


def partition_machine(client=None) -> dict:
    """``partition-bench.json``'s ``machine``: this process's BLAS and every worker's."""
    report = {**_where(), "cpu_count": os.cpu_count(), **_versions(), "client_blas": _blas_info(PARTITION_BLAS_KEYS)}
    model = cpu_model()
    if model is not None:
        report["cpu_model"] = model
    if client is not None:
        threads = worker_threads(client)
        report["workers"] = len(threads)
        report["threads_per_worker"] = sorted(set(threads.values()))
        report["worker_blas"] = blas_info(client, keys=PARTITION_BLAS_KEYS)
    return report


__all__ = [
    "cpu_model",
    "mgrit_machine",
    "npt_machine",
    "partition_machine",
]
