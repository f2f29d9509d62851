"""Network-parallel training (NPT): every matrix product by Cannon's algorithm on a grid of workers.

* :class:`ProcessGrid`: which worker owns which cell, with a printable placement map;
* :class:`GridMatrix`: a block matrix on a grid (to and from chunked dask arrays);
* :func:`matmul`, :func:`matmul_tn`, :func:`matmul_nt`: ``A @ B``, ``A.T @ B``
  and ``A @ B.T`` by (generalised) Cannon, each block product on the worker
  that owns its output block;
* :class:`NPTTrainer`: training in graph mode (a task per block product) or
  resident mode (one long-lived task per worker exchanging blocks directly);
* :mod:`daskann.npt.costmodel`: the measured cost model behind ``grid="auto"``,
  ``mode="auto"`` and ``daskann plan``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from daskann import _attach

# the names __getattr__ loads on first use (submodules included), for type checkers and readers
if TYPE_CHECKING:
    from daskann.npt import cannon, costmodel, graph_mode, grid, matrix, trainer  # noqa: F401
    from daskann.npt.cannon import matmul, matmul_nt, matmul_tn
    from daskann.npt.costmodel import CostModel, choose_grid, measure
    from daskann.npt.grid import ProcessGrid, nearest_grids, parse_grid
    from daskann.npt.matrix import GridMatrix
    from daskann.npt.trainer import NPTEngineOptions, NPTTrainer

__all__ = [
    "CostModel",
    "GridMatrix",
    "NPTEngineOptions",
    "NPTTrainer",
    "ProcessGrid",
    "choose_grid",
    "matmul",
    "matmul_nt",
    "matmul_tn",
    "measure",
    "nearest_grids",
    "parse_grid",
]

__getattr__, __dir__ = _attach(
    __name__,
    {
        "CostModel": "daskann.npt.costmodel",
        "GridMatrix": "daskann.npt.matrix",
        "NPTEngineOptions": "daskann.npt.trainer",
        "NPTTrainer": "daskann.npt.trainer",
        "ProcessGrid": "daskann.npt.grid",
        "choose_grid": "daskann.npt.costmodel",
        "matmul": "daskann.npt.cannon",
        "matmul_nt": "daskann.npt.cannon",
        "matmul_tn": "daskann.npt.cannon",
        "measure": "daskann.npt.costmodel",
        "nearest_grids": "daskann.npt.grid",
        "parse_grid": "daskann.npt.grid",
    },
    submodules=(
        "cannon",
        "costmodel",
        "graph_mode",
        "grid",
        "matrix",
        "trainer",
    ),
)
