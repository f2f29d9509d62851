"""Predictions of training time per method and worker count, on measured or described clusters.

``daskann plan`` on the command line; :func:`plan` and :class:`ClusterSpec`
from Python.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from daskann import _attach

# the names __getattr__ loads on first use (submodules included), for type checkers and readers
if TYPE_CHECKING:
    from daskann.plan._cluster import ClusterSpec, cluster_from_dict, load_cluster, write_cluster
    from daskann.plan._measure import measure_cluster
    from daskann.plan._model import (
        Network,
        Prediction,
        paper_potential_speedup,
        predict_mgrit,
        predict_npt,
        predict_partition,
        serial_step_seconds,
    )
    from daskann.plan._planners import plan
    from daskann.plan._report import METHODS

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

__getattr__, __dir__ = _attach(
    __name__,
    {
        "ClusterSpec": "daskann.plan._cluster",
        "METHODS": "daskann.plan._report",
        "Network": "daskann.plan._model",
        "Prediction": "daskann.plan._model",
        "cluster_from_dict": "daskann.plan._cluster",
        "load_cluster": "daskann.plan._cluster",
        "measure_cluster": "daskann.plan._measure",
        "paper_potential_speedup": "daskann.plan._model",
        "plan": "daskann.plan._planners",
        "predict_mgrit": "daskann.plan._model",
        "predict_npt": "daskann.plan._model",
        "predict_partition": "daskann.plan._model",
        "serial_step_seconds": "daskann.plan._model",
        "write_cluster": "daskann.plan._cluster",
    },
)
