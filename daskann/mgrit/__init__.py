"""MGRIT over training steps: FAS multigrid in time as dask task graphs over zarr trajectories.

:class:`MGRIT` solves ``u_{i+1} = Phi_i(u_i)`` for all steps at once (V- and
F-cycles, F/FCF relaxation, nested iteration) in this process, on dask's
local schedulers or on a cluster; :class:`MGRITTrainer` applies it to SGD
training and converges to the weights :class:`daskann.SerialTrainer` gives.
"""

from daskann.exceptions import MGRITDidNotPay, MGRITDiverged, MGRITNotConverged, PropagatorError
from daskann.mgrit import linear, workmodel
from daskann.mgrit._adapt import Adaptation
from daskann.mgrit.presets import PRESETS, resolve_preset
from daskann.mgrit.problem import FunctionPropagator, Propagator, StateLayout
from daskann.mgrit.propagators import SGDPropagator, auto_alpha_cap, stable_alpha_cap, top_curvature
from daskann.mgrit.solver import MGRIT, IterationInfo, MGRITResult, solve
from daskann.mgrit.trainer import MGRITEngineOptions, MGRITSolverOptions, MGRITTrainer

__all__ = [
    "MGRIT",
    "PRESETS",
    "Adaptation",
    "FunctionPropagator",
    "IterationInfo",
    "MGRITDidNotPay",
    "MGRITDiverged",
    "MGRITEngineOptions",
    "MGRITNotConverged",
    "MGRITResult",
    "MGRITSolverOptions",
    "MGRITTrainer",
    "Propagator",
    "PropagatorError",
    "SGDPropagator",
    "StateLayout",
    "auto_alpha_cap",
    "linear",
    "resolve_preset",
    "solve",
    "stable_alpha_cap",
    "top_curvature",
    "workmodel",
]
