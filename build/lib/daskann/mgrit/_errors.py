"""Errors of the MGRIT solver."""

from __future__ import annotations

from daskann._base import TrainingDiverged


class PropagatorError(ValueError):
    """A propagator returned a state of another structure, shape or dtype.

    Attributes
    ----------
    level : int
        Level of the propagator that misbehaved.
    step : int
        Fine step index the propagator started from.
    """

    def __init__(self, message: str, *, level: int, step: int):
        self.level, self.step = int(level), int(step)
        super().__init__(f"propagator={message} (level {self.level}, from fine step {self.step})")


class MGRITDiverged(TrainingDiverged):
    """The MGRIT iteration became unstable: a non-finite state or a growing residual.

    The store (if any) keeps the last completed iteration; nothing is returned
    as a result.

    Attributes
    ----------
    level : int
        Level on which the problem appeared (0 is the fine level).
    step : int
        Fine step index of the offending point.
    iteration : int
        MGRIT iteration during which it appeared (1-based).
    residuals : list of float
        Residual norms of the completed iterations.
    """

    def __init__(self, what: str, *, level: int, step: int, iteration: int, residuals=()):
        self.level, self.step, self.iteration = int(level), int(step), int(iteration)
        self.residuals = [float(r) for r in residuals]
        self.what = what
        RuntimeError.__init__(
            self,
            f"MGRIT diverged in iteration {self.iteration}: {what} on level {self.level} at fine step "
            f"{self.step}. The coarse propagator is probably outside the optimiser's stability region: "
            "lower the coarse learning-rate factor (alpha_cap), use fewer levels or a smaller coarsening "
            "factor, or more relaxation (cf_iter).",
        )


class MGRITNotConverged(RuntimeError):
    """The residual did not reach the tolerance within ``max_iter`` iterations.

    Attributes
    ----------
    result : MGRITResult
        The solver's record (residual history, timings); its state is not the
        serial solution.
    """

    def __init__(self, result):
        self.result = result
        last = result.residuals[-1] if result.residuals else float("nan")
        super().__init__(
            f"MGRIT did not converge: residual {last:.3e} after {result.iterations} iterations "
            f"(max_iter={result.max_iter}, tol={result.tol:g}); raise max_iter, or choose a more robust "
            "preset (cycle_type='F', more cf_iter, a capped coarse learning rate)"
        )
