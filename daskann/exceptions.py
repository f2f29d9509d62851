"""Every error daskann raises, under one base class.

Each class also derives from the built-in error it always was
(:class:`ValueError`, :class:`RuntimeError`, :class:`OSError`,
:class:`TimeoutError`), so ``except ValueError`` keeps catching a
:class:`StoreError` and ``except DaskannError`` catches them all. The modules
that raise them re-export them under their old names. Beside
:class:`TrainingDiverged`, :class:`DivergenceCause` is the one rule by which
every trainer names what became NaN or Inf.
"""

from __future__ import annotations

from enum import IntEnum

__all__ = [
    "DamagedStoreError",
    "BatchSizeClipped",
    "DaskannError",
    "DiskFullError",
    "ExchangeAborted",
    "ExchangeTimeout",
    "LostWorkersError",
    "MGRITDidNotPay",
    "MGRITDiverged",
    "MGRITNotConverged",
    "PropagatorError",
    "ResidentError",
    "StoreError",
    "SubModelError",
    "TrainingDiverged",
    "WorkerLost",
    "WorkerWaitTimeout",
]


class DaskannError(Exception):
    """Base class of the errors daskann raises.

    Every one pickles and copies with its type, message and attributes, as Python's own errors
    do, whatever its constructor takes: errors travel between processes as task arguments and
    results, and inside one another (:attr:`SubModelError.failed`).
    """

    def __reduce__(self):
        return _rebuilt, (type(self), self.args, self.__dict__)


def _rebuilt(cls: type, args: tuple, attributes: dict) -> BaseException:
    """An error of ``cls`` with ``args`` and ``attributes``, made without calling its constructor again."""
    error = cls.__new__(cls, *args)
    if isinstance(error, OSError):  # errno and strerror, as the constructor's OSError.__init__ set them
        OSError.__init__(error, *args)
    error.args = args
    error.__dict__.update(attributes)
    return error


# -- training ----------------------------------------------------------------------
class DivergenceCause(IntEnum):
    """What became NaN or Inf in a training step, as a number that workers can exchange.

    The causes are ordered: a step trained in parts (cells of a grid) has the
    largest of its parts' causes, since a loss or gradient that is not finite
    anywhere makes the weights it updates not finite too (``lr > 0``).
    :meth:`of` is the one rule every trainer names a cause by, and :attr:`what`
    its words in :class:`TrainingDiverged`'s message.
    """

    FINITE = 0
    WEIGHTS = 1
    LOSS_OR_GRADIENTS = 2

    @classmethod
    def of(cls, *, loss: bool = True, gradients: bool = True, weights: bool = True) -> DivergenceCause:
        """The cause of a step from whether its loss, its gradients and the new weights are finite.

        A part not looked at counts as finite: :class:`~daskann.serial.SerialTrainer`
        looks at the gradients only once the weights they made are not finite.
        """
        if not (loss and gradients):
            return cls.LOSS_OR_GRADIENTS
        return cls.FINITE if weights else cls.WEIGHTS

    @property
    def what(self) -> str:
        """What became NaN or Inf, in words (empty for :attr:`FINITE`)."""
        return _DIVERGED_WHAT[self]


_DIVERGED_WHAT = {
    DivergenceCause.FINITE: "",
    DivergenceCause.WEIGHTS: "the weights",
    DivergenceCause.LOSS_OR_GRADIENTS: "the loss or its gradients",
}


class TrainingDiverged(DaskannError, RuntimeError):
    """Loss, gradients or weights became NaN or Inf.

    The trainer keeps the last finite state in ``model_``.

    Attributes
    ----------
    step : int
        Step (1-based) at which training stopped.
    what : str
        What became NaN or Inf: for the trainers of SGD steps,
        :attr:`DivergenceCause.what` of the step's cause, the same words
        whichever trainer ran it.
    """

    def __init__(self, step: int, what: str):
        self.step = int(step)
        self.what = what
        super().__init__(
            f"training diverged at step {self.step}: {what} became NaN or Inf; "
            f"the model keeps the last finite state (after {self.step - 1} steps). "
            "Lower the learning rate or the momentum."
        )


class BatchSizeClipped(DaskannError, UserWarning):
    """Warning: ``batch_size`` was larger than the data, so each step trains on all rows (as ``MLPClassifier``)."""


# -- stores ------------------------------------------------------------------------
class StoreError(DaskannError, ValueError):
    """A store is missing, damaged, foreign or does not match what loads it."""


class DamagedStoreError(StoreError):
    """A store's arrays do not match its manifest."""


class DiskFullError(DaskannError, OSError):
    """A store could not be written for lack of space; the stores written before are intact."""


# -- MGRIT -------------------------------------------------------------------------
class PropagatorError(DaskannError, ValueError):
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
        # TrainingDiverged's message speaks of SGD steps; this one names the level and iteration
        RuntimeError.__init__(
            self,
            f"MGRIT diverged in iteration {self.iteration}: {what} on level {self.level} at fine step "
            f"{self.step}. The coarse propagator is probably outside the optimiser's stability region: "
            "lower the coarse learning-rate factor (alpha_cap), use fewer levels or a smaller coarsening "
            "factor, or more relaxation (cf_iter).",
        )


class MGRITNotConverged(DaskannError, RuntimeError):
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


class MGRITDidNotPay(DaskannError, UserWarning):
    """Warning: an MGRIT fit fell back to serial propagation, or its work exceeded serial training's.

    The weights are still serial training's; the time spent on MGRIT was not
    repaid. ``MGRITTrainer.result_.adaptations`` says what each attempt cost.
    """


# -- partitioned pre-training ------------------------------------------------------
class SubModelError(DaskannError, RuntimeError):
    """One or more sub-models failed for good (after their retries).

    Attributes
    ----------
    failed : dict of int to BaseException
        The error of each failed sub-model, by index.
    results : list
        One :class:`~daskann.partition.SubModelResult` per sub-model, ``None``
        where it failed; the trainer also keeps them in ``submodel_results_``.
    """

    def __init__(self, failed: dict, results: list, attempts: int):
        self.failed = dict(failed)
        self.results = list(results)
        kept = [g for g, r in enumerate(results) if r is not None]
        parts = [
            f"sub-model {g} of {len(results)} failed after up to {attempts} attempts: {type(exc).__name__}: {exc}"
            for g, exc in sorted(self.failed.items())
        ]
        parts.append(
            f"the results of sub-models {kept} are kept (PartitionTrainer.submodels_)"
            if kept
            else "no sub-model finished"
        )
        super().__init__("; ".join(parts))


# -- network-parallel training -----------------------------------------------------
class ResidentError(DaskannError, RuntimeError):
    """A resident run failed: a cell raised, a block timed out, or a worker left."""


class ExchangeTimeout(DaskannError, TimeoutError):
    """A block that a peer cell should have sent did not arrive in time.

    ``source`` is the address of the worker that should have sent it.
    """

    def __init__(self, message: str, source: str | None = None):
        super().__init__(message, source)

    @property
    def source(self) -> str | None:
        return self.args[1]

    def __str__(self) -> str:
        return self.args[0]


class ExchangeAborted(DaskannError, RuntimeError):
    """The run was cancelled while this task waited for a block."""


class WorkerLost(DaskannError, RuntimeError):
    """A worker of the grid left the cluster during training."""


class LostWorkersError(DaskannError, RuntimeError):
    """Training gave up after losing workers.

    Graph and resident modes of NPT replay from the last state saved at most a few times per
    checkpoint interval (``daskann.npt.graph-replays``, ``daskann.npt.resident-restarts``), and
    cannot restart at all when the state lost was only in the workers' memory; MGRIT gives up on an
    iteration placed or broadcast again too often as workers leave. Resident mode raises it as a
    :class:`ResidentError` too.
    """


class WorkerWaitTimeout(DaskannError, TimeoutError):
    """The workers a run needs did not connect within ``daskann.cluster.worker-wait``.

    On a batch system their jobs may still be queued: the message lists them with the batch
    system's reason (``squeue``'s), and names the setting to raise.
    """
