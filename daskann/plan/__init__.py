"""Predictions of training time per method and worker count, on measured or described clusters.

``daskann plan`` on the command line; :func:`plan` and :class:`ClusterSpec`
from Python.
"""

from __future__ import annotations

from daskann.plan._cluster import ClusterSpec, cluster_from_dict, load_cluster, write_cluster
from daskann.plan._measure import measure_cluster
from daskann.plan._model import (
    METHODS,
    Network,
    Prediction,
    paper_potential_speedup,
    plan,
    predict_mgrit,
    predict_npt,
    predict_partition,
    serial_step_seconds,
)

__all__ = [
    "METHODS",
    "ClusterSpec",
    "Network",
    "Prediction",
    "cluster_from_dict",
    "load_cluster",
    "measure_cluster",
    "paper_potential_speedup",
    "plan",
    "predict_mgrit",
    "predict_npt",
    "predict_partition",
    "serial_step_seconds",
    "write_cluster",
]
