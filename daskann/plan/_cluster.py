"""Clusters the planner predicts for: described in a YAML file or shipped in a profile (measured: :mod:`._measure`).

A cluster is five numbers and the worker counts to predict for::

    workers: [1, 2, 4, 8, 16]
    flop_rate: 8.0e10      # float64 GEMM FLOP/s of one worker
    latency: 2.0e-6        # seconds per message
    bandwidth: 1.0e10      # bytes/s of one link
    task_overhead: 0.0     # scheduler seconds per task (0 for an MPI-like runtime)

and optional ones that default to 0 and matter for small nets and short
tasks: ``gemm_overhead`` (fixed seconds of a GEMM call), ``layer_overhead``
(seconds of the non-GEMM work of one layer in one training step),
``element_time`` (seconds per number a training step touches outside its
GEMMs: activations, gradients, the weight update and its checks),
``step_overhead`` (a trainer's bookkeeping per step), ``fit_overhead``
(seconds to set up and finish one trainer's ``fit``), ``store_overhead``
(seconds of one zarr chunk read or written), ``mgrit_task_overhead``
(seconds of one MGRIT task beyond its training steps, timed in a short MGRIT
solve on the live cluster; 0 builds it from the other numbers),
``partition_overhead`` (seconds of a partitioned run beyond its training:
scattering the data, collecting and merging the sub-models) and
``resident_step_overhead`` (an NPT resident-mode step's bookkeeping, timed in
short resident fits on the live cluster; 0 takes ``step_overhead``).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import yaml

from daskann._validation import invalid, named_error
from daskann.cluster import _profile_path

REQUIRED = ("flop_rate", "latency", "bandwidth", "task_overhead")
OPTIONAL = (
    "gemm_overhead",
    "layer_overhead",
    "element_time",
    "step_overhead",
    "fit_overhead",
    "store_overhead",
    "mgrit_task_overhead",
    "partition_overhead",
    "resident_step_overhead",
)
#: keys that may be zero (an MPI-like runtime has no task overhead)
ZERO_ALLOWED = ("task_overhead", *OPTIONAL)


@dataclass(frozen=True)
class ClusterSpec:
    """The numbers the planner's models read (seconds, FLOP/s, bytes/s).

    Attributes
    ----------
    workers : tuple of int
        Worker counts to predict for.
    flop_rate : float
        float64 GEMM FLOP/s of one worker.
    latency : float
        Seconds per message between two workers.
    bandwidth : float
        Bytes per second of one worker-to-worker link.
    task_overhead : float
        Scheduler seconds per task (0 for an MPI-like runtime).
    gemm_overhead : float
        Fixed seconds of one GEMM call.
    layer_overhead : float
        Seconds of one layer's non-GEMM work in a training step.
    element_time : float
        Seconds per number a training step touches outside its GEMMs
        (:func:`daskann.plan._model.step_elements` counts them).
    step_overhead : float
        Seconds of a trainer's bookkeeping per step (batch rows, checks, history).
    fit_overhead : float
        Seconds to set up and finish one trainer's ``fit`` (checks, history).
    store_overhead : float
        Seconds of one chunk read or written in a zarr store (MGRIT's trajectories).
    mgrit_task_overhead : float
        Seconds of one MGRIT task beyond its training steps: its scheduling in
        an iteration's graph, its trajectory reads and writes and its result.
        0 builds it from ``task_overhead``, ``latency`` and ``store_overhead``.
    partition_overhead : float
        Seconds of a partitioned run beyond its tasks and its training steps:
        the data scattered to the workers, the sub-models collected and merged.
    resident_step_overhead : float
        Seconds of an NPT resident-mode step beyond its products, its
        exchanges and the work per layer and per number: the cell program's
        loop (batch rows, the agreement on the loss and on divergence, its
        history row). 0 takes ``step_overhead`` (a :class:`SerialTrainer` step's).
    name : str
        Where the numbers come from (a file, a profile, a live cluster).
    """

    workers: tuple
    flop_rate: float
    latency: float
    bandwidth: float
    task_overhead: float
    gemm_overhead: float = 0.0
    layer_overhead: float = 0.0
    element_time: float = 0.0
    step_overhead: float = 0.0
    fit_overhead: float = 0.0
    store_overhead: float = 0.0
    mgrit_task_overhead: float = 0.0
    partition_overhead: float = 0.0
    resident_step_overhead: float = 0.0
    name: str = "cluster"

    def to_dict(self) -> dict:
        """The YAML/JSON layout (without ``name``)."""
        d = asdict(self)
        d.pop("name")
        d["workers"] = list(self.workers)
        return d


def check_workers(value, name: str = "workers") -> tuple:
    """A non-empty list of positive integer worker counts, sorted and without repeats."""
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        value = [value]
    if not isinstance(value, (list, tuple)) or not value:
        raise invalid(name, value, "a non-empty list of positive integer worker counts, e.g. [1, 2, 4]")
    for v in value:
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
            raise invalid(name, value, "a non-empty list of positive integer worker counts, e.g. [1, 2, 4]")
    return tuple(sorted({int(v) for v in value}))


def cluster_from_dict(spec, *, source: str = "cluster") -> ClusterSpec:
    """Check a cluster description (a mapping) and build its :class:`ClusterSpec`.

    Errors name the key, as ``flop_rate in mycluster.yaml=-1 is not valid: ...``.
    """
    if not isinstance(spec, dict):
        raise invalid(source, type(spec).__name__, "a YAML mapping with workers, " + ", ".join(REQUIRED))
    unknown = sorted(set(spec) - {"workers", *REQUIRED, *OPTIONAL})
    if unknown:
        raise invalid(f"keys of {source}", unknown, "only workers, " + ", ".join(REQUIRED + OPTIONAL))
    if "workers" not in spec:
        raise invalid(f"workers in {source}", None, "a list of positive integer worker counts (the key is missing)")
    workers = check_workers(spec["workers"], f"workers in {source}")
    values = {}
    for key in REQUIRED + OPTIONAL:
        if key not in spec:
            if key in REQUIRED:
                raise invalid(f"{key} in {source}", None, "a positive number (the key is missing)")
            continue
        value = _number(spec[key])
        positive = key not in ZERO_ALLOWED
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        if not ok or value < 0 or (positive and value == 0):
            raise invalid(f"{key} in {source}", value, "a positive number" if positive else "a number >= 0")
        values[key] = float(value)
    return ClusterSpec(workers=workers, name=source, **values)


def _number(value):
    """``value`` as a float where YAML left a number such as ``1e9`` (no dot) as a string."""
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return value
    return value


def load_cluster(path) -> ClusterSpec:
    """Read a cluster description from a YAML file (a ``plan:`` mapping inside a profile works too)."""
    path = Path(path)
    if not path.is_file():
        raise named_error(FileNotFoundError, "cluster", f"{str(path)!r} is not valid: expected an existing YAML file")
    spec = yaml.safe_load(path.read_text())
    if isinstance(spec, dict) and "plan" in spec and "kind" in spec:
        spec = spec["plan"]
    return cluster_from_dict(spec, source=path.name)


def profile_cluster(profile: str, *, missing_ok: bool = False) -> ClusterSpec | None:
    """The typical values a dask-jobqueue profile carries under its ``plan:`` key.

    A profile without them is refused, or gives None with ``missing_ok`` (the caller then
    starts the profile's cluster and measures it).
    """
    path = Path(_profile_path(profile))
    spec = yaml.safe_load(path.read_text()) or {}
    if "plan" not in spec:
        if missing_ok:
            return None
        raise invalid("profile", profile, f"a profile with a 'plan:' mapping ({path} has none)")
    return cluster_from_dict(spec["plan"], source=f"plan in {path.name}")


def write_cluster(cluster: ClusterSpec, path) -> Path:
    """Write ``cluster`` as a YAML file that :func:`load_cluster` reads back."""
    path = Path(path)
    header = f"# daskann plan cluster description ({cluster.name})\n"
    path.write_text(header + yaml.safe_dump(cluster.to_dict(), sort_keys=False))
    return path


__all__ = [
    "OPTIONAL",
    "REQUIRED",
    "ClusterSpec",
    "check_workers",
    "cluster_from_dict",
    "load_cluster",
    "profile_cluster",
    "write_cluster",
]
