"""MGRIT over training steps: FAS multigrid in time as dask task graphs over zarr trajectories.

:class:`MGRIT` solves ``u_{i+1} = Phi_i(u_i)`` for all steps at once (V- and
F-cycles, F/FCF relaxation, nested iteration) in this process, on dask's
local schedulers or on a cluster; :class:`MGRITTrainer` applies it to SGD
training and converges to the weights :class:`daskann.SerialTrainer` gives.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from daskann import _attach

# the names __getattr__ loads on first use (submodules included), for type checkers and readers
if TYPE_CHECKING:
    from daskann.exceptions import MGRITDidNotPay, MGRITDiverged, MGRITNotConverged, PropagatorError
    from daskann.mgrit import linear, presets, problem, propagators, solver, trainer, workmodel  # noqa: F401
    from daskann.mgrit._adapt import Adaptation
    from daskann.mgrit.presets import PRESETS, SolverConfig, resolve_preset
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
    "SolverConfig",
    "StateLayout",
    "auto_alpha_cap",
    "linear",
    "resolve_preset",
    "solve",
    "stable_alpha_cap",
    "top_curvature",
    "workmodel",
]

__getattr__, __dir__ = _attach(
    __name__,
    {
        "Adaptation": "daskann.mgrit._adapt",
        "FunctionPropagator": "daskann.mgrit.problem",
        "IterationInfo": "daskann.mgrit.solver",
        "MGRIT": "daskann.mgrit.solver",
        "MGRITDidNotPay": "daskann.exceptions",
        "MGRITDiverged": "daskann.exceptions",
        "MGRITEngineOptions": "daskann.mgrit.trainer",
        "MGRITNotConverged": "daskann.exceptions",
        "MGRITResult": "daskann.mgrit.solver",
        "MGRITSolverOptions": "daskann.mgrit.trainer",
        "MGRITTrainer": "daskann.mgrit.trainer",
        "PRESETS": "daskann.mgrit.presets",
        "Propagator": "daskann.mgrit.problem",
        "PropagatorError": "daskann.exceptions",
        "SGDPropagator": "daskann.mgrit.propagators",
        "SolverConfig": "daskann.mgrit.presets",
        "StateLayout": "daskann.mgrit.problem",
        "auto_alpha_cap": "daskann.mgrit.propagators",
        "resolve_preset": "daskann.mgrit.presets",
        "solve": "daskann.mgrit.solver",
        "stable_alpha_cap": "daskann.mgrit.propagators",
        "top_curvature": "daskann.mgrit.propagators",
    },
    submodules=(
        "linear",
        "presets",
        "problem",
        "propagators",
        "solver",
        "trainer",
        "workmodel",
    ),
)
