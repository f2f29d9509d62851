"""Adaptive MGRIT training: try again with a safer solver, else finish serially from the last trusted point.

An attempt is one MGRIT solve. When it diverges (a non-finite state or a
residual grown past ``divergence_factor``), stalls, or runs out of iterations,
the next attempt changes the solver along a fixed ladder (:func:`next_change`)
and starts from the last iteration the failed attempt kept, as far as that
iterate is exact (:func:`initial_guess`). When the ladder or the iteration budget is spent, the steps after the
last C-point whose residuals (and all earlier ones) are at round-off are
propagated serially, so the trainer always ends at serial training's weights.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from daskann._blas import one_blas_thread
from daskann.exceptions import TrainingDiverged
from daskann.mgrit import workmodel
from daskann.mgrit._run import IterationRecord, series
from daskann.mgrit.solver import MGRITResult

#: iterations over which the residual must fall by ``STALL_FACTOR`` (or be on course for ``tol``)
STALL_WINDOW = 5
STALL_FACTOR = 0.5
#: a C-point residual below this multiple of the state's norm counts as round-off (the point is serial's)
TRUST = 1e-12


@dataclass(frozen=True)
class Adaptation:
    """One attempt of an adaptive fit (an entry of ``MGRITResult.adaptations``).

    Attributes
    ----------
    attempt : int
        0 is the configuration asked for; 1, 2, ... the adapted ones.
    change : str
        What this attempt changed against the one before (``""`` for attempt 0,
        ``"serial"`` for the serial finish).
    options : dict
        ``levels``, ``alpha_cap`` and ``substeps`` the attempt ran with.
    outcome : {"converged", "diverged", "stalled", "max_iter", "serial"}
    reason : str
        Why the attempt ended (the solver's message when it failed).
    iterations : int
        MGRIT iterations run (the serial finish: 0).
    work : float
        Work units (fine-step costs) the attempt spent; the serial finish: its steps.
    critical_path : float
        Work-model critical path of the attempt (the serial finish: its steps).
    seconds : float
        Wall time of the attempt.
    """

    attempt: int
    change: str
    options: dict
    outcome: str
    reason: str
    iterations: int
    work: float
    critical_path: float
    seconds: float

    def to_dict(self) -> dict:
        return {name: getattr(self, name) for name in self.__dataclass_fields__}


def stalled(residuals, tol: float) -> bool:
    """Whether an attempt's residual fell by less than ``STALL_FACTOR`` over the last ``STALL_WINDOW`` iterations.

    No projection of the rate: FCF MGRIT's residual often stays flat and then
    falls fast (the exact region grows by two C-points an iteration), so only
    a flat stretch counts.
    """
    if len(residuals) <= STALL_WINDOW:
        return False
    now, then = residuals[-1], residuals[-1 - STALL_WINDOW]
    return now > tol and now > STALL_FACTOR * then


def next_change(attempt: int, options: dict, alpha_max: float, *, callable_coarse: bool) -> tuple[str, dict] | None:
    """The change of attempt ``attempt`` (1, 2, ...) and its options, or None when the ladder is spent.

    1. the coarse learning-rate factor capped at a quarter of the largest one used;
    2. two levels, the cap quartered again and two substeps (fresh gradients) per coarse step.

    A user's coarse propagator has no learning rate to cap: its only rung is two levels.
    """
    levels = options["levels"]
    if callable_coarse:
        if attempt == 1 and levels > 2:
            return "levels=2", {**options, "levels": 2}
        return None
    cap = max(1.0, alpha_max / 4.0)
    if attempt == 1 and alpha_max > 1.0:
        return f"alpha_cap={cap:g}", {**options, "alpha_cap": cap}
    if attempt <= 2 and (levels > 2 or alpha_max > 1.0 or options["substeps"] < 2):
        change = {"levels": 2, "alpha_cap": cap, "substeps": 2}
        return ", ".join(f"{k}={v:g}" for k, v in change.items()), {**options, **change}
    return None


def trusted_start(kept, u0_vec: np.ndarray, cfactor: int, *, before: int | None = None) -> tuple[int, np.ndarray]:
    """The last point a kept iterate holds exactly (serial's, to round-off): its fine step and flat state.

    C-point ``j`` (fine step ``(j + 1) * cfactor``) is trusted when its residual
    and those of every earlier C-point are round-off. ``before`` keeps the
    point before that fine step.
    """
    if kept is None:
        return 0, u0_vec
    rows, norms = kept
    if len(norms) != len(rows):
        return 0, u0_vec
    trusted = 0
    for row, norm in zip(rows, norms, strict=True):
        if not (math.isfinite(norm) and norm <= TRUST * max(1.0, float(np.linalg.norm(row)))):
            break
        trusted += 1
    if before is not None:
        trusted = min(trusted, (before - 1) // cfactor)
    if trusted == 0:
        return 0, u0_vec
    return trusted * cfactor, np.array(rows[trusted - 1])


def initial_guess(kept, u0_vec: np.ndarray, cfactor: int) -> np.ndarray | None:
    """Fine C-points for the next attempt: the kept iterate's trusted prefix, its last trusted point after it.

    The untrusted rest of a failed attempt's iterate may be what made it fail
    (measured: attempts started from it diverged at once), so it is not reused.
    """
    if kept is None:
        return None
    rows = np.array(kept[0])
    start, vector = trusted_start(kept, u0_vec, cfactor)
    rows[start // cfactor :] = vector
    return rows


def finish_serially(prop, layout, start: int, vector: np.ndarray, n_steps: int, *, step_offset: int) -> tuple:
    """Steps ``start .. n_steps - 1`` by the fine propagator from ``vector``: the final state and velocity.

    The velocity is None where the state carries it (or no step is left);
    otherwise it is the last step's gradient, as SGD without momentum leaves it.

    Raises
    ------
    TrainingDiverged
        Serial training itself became non-finite (the step and the cause serial training names).
    """
    vector = np.array(vector)
    velocity = None
    with np.errstate(all="ignore"), one_blas_thread():  # as SerialTrainer and the workers compute it
        for i in range(start, n_steps):
            if i == n_steps - 1 and not prop.velocity:
                velocity = prop.gradient(layout.unpack(vector), i)
            cause = prop.serial_step(vector, i)  # fine_step's arithmetic, in place
            if cause:
                raise TrainingDiverged(step_offset + i + 1, cause.what)
    return tuple(np.array(a) for a in layout.unpack(vector)), velocity


def combined_paper_speedup(result: MGRITResult, hierarchy, serial_steps: float) -> float:
    """The paper's potential speedup over every attempt, the serial finish counted at one unit a step."""
    if result.iterations == 0:
        return result.n_steps / serial_steps if serial_steps else math.nan
    paper = workmodel.paper_speedup(result.n_steps, result.iterations, hierarchy.n_levels, result.cycle_type)
    sigma = result.n_steps / paper
    return result.n_steps / (sigma + serial_steps)


def records_cost(records: list[IterationRecord]) -> tuple[float, float]:
    """Total work and critical path (plus one unit per residual reduction) of some iterations."""
    return float(sum(r.work for r in records)), float(sum(r.critical_path + 1.0 for r in records))


def combined_result(
    template: MGRITResult | None, records: list[IterationRecord], state: tuple, **fields
) -> MGRITResult:
    """One result over every attempt's iterations (``template`` gives the fields the attempts share)."""
    lists = series(records)
    base = {} if template is None else {k: getattr(template, k) for k in template.__dataclass_fields__}
    base.update(lists)
    # a converged attempt's graphs are those of the last iterations; earlier ones count by their critical path
    graphs = list(template.graphs) if template is not None and fields.get("ended") in ("converged", "adapted") else []
    base.update(iterations=len(records), state=state, graphs=graphs, **fields)
    return MGRITResult(**base)


__all__ = [
    "Adaptation",
    "combined_paper_speedup",
    "combined_result",
    "finish_serially",
    "initial_guess",
    "next_change",
    "records_cost",
    "stalled",
    "trusted_start",
]
