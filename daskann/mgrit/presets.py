"""Named solver configurations: the paper's three solvers, as daskann defines them.

Schroder (arXiv:1708.02276) compares three MGRIT solvers ("Solver 1, 2, 3") on
training problems and reports that Solver 2 reached about 13x potential
speedup over 12,800 steps and Solver 3 was the most robust. The paper's text
defining them was not available when daskann was written, so the presets
below are daskann's own reading of the ingredients the paper names (F- and
FCF-relaxation, V- and F-cycles, coarse steps with a scaled learning rate
that must stay inside SGD's stability region). What each preset is, exactly:

``"solver1"`` -- plain learning-rate scaling
    V-cycles, F-relaxation, coarsening factor 4. A coarse step of level ``l``
    is one momentum-aware SGD step standing for all ``M_l = 4^l`` fine steps
    it spans (``alpha_l = M_l``, no cap). Cheapest per iteration; diverges
    once ``lr * M_l`` leaves SGD's stability region (deep hierarchies, large
    learning rates), which the solver reports as :class:`MGRITDiverged`.
``"solver2"`` -- FCF relaxation, capped coarse learning rate
    V-cycles, FCF-relaxation, coarsening factor 4, ``alpha_l = min(M_l, cap)``
    where the cap (``alpha_cap="auto"``) keeps ``lr * alpha`` below SGD's
    stability limit estimated from the curvature at the initial weights (four
    times the top Hessian eigenvalue of the first minibatches, half the
    limit; :func:`daskann.mgrit.propagators.auto_alpha_cap`), so deep levels
    stay stable.
``"solver3"`` -- F-cycles
    As ``"solver2"`` with F-cycles (pymgrit's: after each coarse-grid
    correction on a level below the finest, one more V-cycle from that
    level). More work per iteration; on the benchmark problem not fewer
    iterations (``daskann bench mgrit``).
``"solver4"`` -- ``"solver2"`` with a relative stopping test
    The cycles of ``"solver2"`` (so the same residual history), but the run
    also stops once the residual has fallen by ``rtol = 1e-9`` against the
    first iteration's (XBraid's ``braid_SetRelTol``), whichever of the two
    tests is met first. The first residual grows with the number of steps
    (more C-points), so the absolute test asks more of long runs than of short
    ones; the relative test counts the iterations a fixed reduction takes,
    the usual measure of a multigrid solver's scalability. On the benchmark
    problem the final weights still match serial training to about 1e-11
    (``daskann bench mgrit`` reports the error beside every iteration count).

``"solver1"`` to ``"solver3"`` stop at an absolute residual of 1e-9 (2-norm
over the fine C-points) or after 50 iterations; all start from ``u_i = u_0``
and use 3 levels unless told otherwise. Each is a :class:`SolverConfig`; every
option can be overridden (:func:`resolve_preset`).

The paper's own solvers (Schroder, arXiv:1708.02276 v2) are
:data:`PAPER_PRESETS`, resolved by :func:`paper_options` for a given number
of steps. All of them run plain gradient descent (momentum 0, the weights
alone are the state), coarsening ``m = 2``, levels added until the coarsest
has at most ``max_coarse = 10`` steps (two levels with ``cycle="two-level"``),
FCF relaxation, ``w_i = 0`` for ``i > 0`` as the initial guess (on which,
as with XBraid's default ``skip=1``, the first cycle starts with the coarse
levels' own solution: ``nested_iteration=True``; the paper ran XBraid), a halting
tolerance of ``1e-9 * sqrt(N)`` on the Euclidean norm of the global residual
and at most 50 iterations. Point ``i`` of a coarse level trains on the rows
of its own index ``i`` (the paper's section 2 rule). On serialized data the
step that computes point ``i`` of any level trains on row ``i mod K``
(``row_index="end"``: the steps are numbered ``1 .. N`` as the points they
compute); ``row_index="start"`` numbers them ``0 .. N - 1`` by the point
they start from. ``"end"`` reproduces the paper's Tables 5-7
(``docs/mgrit.md``). They differ in the coarse learning rate ``alpha^(l)``
of level ``l`` and the data of a step:

``"naive"``
    ``alpha^(l) = alpha_b`` on every level; batch (every step all rows).
``"schroder1"``
    ``alpha^(l) = min(2^l alpha_b, alpha_max)`` (the paper's eq. 14); batch.
``"schroder2"``
    ``"schroder1"`` with serialized data (step ``i`` uses row ``i mod K``).
``"schroder2-slow"``
    ``"schroder2"`` with the slow growth ``min(1.25^l alpha_b, alpha_max)``
    (eq. 18).

``double_phi`` (the paper's conclusion mentions a double application of
Phi for its undefined "Solver 3"): ``"split"`` makes a coarse step two
applications of Phi at ``alpha^(l) / 2`` each (the same distance, a fresh
gradient halfway); ``"repeat"`` two applications at ``alpha^(l)`` each
(twice the distance). Both cost two units in the work models.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass, field

from daskann._validation import CycleType, check_choice, check_int, invalid


def _solver(default):
    return field(default=default, metadata={"of": "solver"})


def _coarse(default):
    return field(default=default, metadata={"of": "propagator"})


@dataclass(frozen=True)
class SolverConfig:
    """One MGRIT configuration: the solver's cycles and stopping tests, and its coarse propagator.

    The one declaration of these options: :data:`PRESETS` are named
    instances, :func:`resolve_preset` overrides one, :class:`daskann.mgrit.MGRITSolverOptions`
    takes each as a keyword (None: the preset's), and a trainer's solver is
    made from one (:meth:`daskann.mgrit.MGRIT.from_config`). The defaults are
    ``"solver2"``'s. Values are checked where they are used, before any task:
    the solver's by :class:`daskann.mgrit.MGRIT`, the coarse propagator's by
    :class:`daskann.mgrit.propagators.SGDPropagator`.

    Attributes
    ----------
    levels : int
        Number of levels; a preset's is a maximum (a short fit keeps the levels its steps allow).
    cfactor : int or sequence of int
        Coarsening factor (at least 2), for all levels or per level.
    cf_iter : int or sequence of int
        CF sweeps after the first F-relaxation: 0 is F-, 1 FCF-relaxation.
    cycle_type : {"V", "F"}
    weight_c : float or sequence of float
        C-relaxation weight in (0, 2), per level if a sequence.
    weight_c_growth : float
        Factor of the C-relaxation weight per coarser level.
    tol : float
        Absolute tolerance on the residual norm.
    rtol : float or None
        Relative tolerance against the first iteration's residual.
    max_iter : int
        Most iterations.
    nested_iteration : bool
        Start from the coarse levels' own solutions.
    coarse : {"scaled", "repeat"} or callable
        The coarse propagator: one SGD step at a scaled learning rate, the fine
        steps repeated, or a user's ``coarse(state, start, stop, level)``.
    alpha_growth : float or None
        Coarse learning-rate factor ``growth ** level`` (None: the span).
    alpha_cap : float, "auto" or None
        Cap of the coarse learning-rate factor (``"auto"``: from the curvature).
    substeps : int
        SGD steps per coarse step.
    coarse_batches : int
        Minibatches a coarse step's gradient averages.
    """

    levels: int = _solver(3)
    cfactor: int | tuple = _solver(4)
    cf_iter: int | tuple = _solver(1)
    cycle_type: CycleType = _solver("V")
    weight_c: float | tuple = _solver(1.0)
    weight_c_growth: float = _solver(1.0)
    tol: float = _solver(1e-9)
    rtol: float | None = _solver(None)
    max_iter: int = _solver(50)
    nested_iteration: bool = _solver(False)
    coarse: str | Callable = _coarse("scaled")
    alpha_growth: float | None = _coarse(None)
    alpha_cap: float | str | None = _coarse("auto")
    substeps: int = _coarse(1)
    coarse_batches: int = _coarse(1)

    @classmethod
    def names(cls) -> tuple[str, ...]:
        """Every option, in declaration order."""
        return tuple(f.name for f in dataclasses.fields(cls))

    def to_dict(self) -> dict:
        """Every option by name."""
        return {name: getattr(self, name) for name in self.names()}

    def solver_kwargs(self) -> dict:
        """The options that are keywords of :class:`daskann.mgrit.MGRIT`."""
        return self._of("solver")

    def propagator_kwargs(self) -> dict:
        """The options that are keywords of :class:`daskann.mgrit.propagators.SGDPropagator`."""
        return self._of("propagator")

    def _of(self, part: str) -> dict:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.metadata["of"] == part}


PRESETS: dict[str, SolverConfig] = {
    "solver1": SolverConfig(cf_iter=0, alpha_cap=None),
    "solver2": SolverConfig(),
    "solver3": SolverConfig(cycle_type="F"),
    "solver4": SolverConfig(rtol=1e-9),
}


def resolve_preset(name: str, **overrides) -> dict:
    """The options of preset ``name`` with ``overrides`` (options given as None keep the preset's value).

    Returns
    -------
    dict
        :meth:`SolverConfig.to_dict` of the resolved configuration.

    Examples
    --------
    >>> resolve_preset("solver3", levels=4)["cycle_type"]
    'F'
    """
    check_choice("preset", name, tuple(PRESETS))
    names = SolverConfig.names()
    for key in overrides:
        if key not in names:
            raise invalid("option", key, "one of " + ", ".join(names))
    given = {key: value for key, value in overrides.items() if value is not None}
    return dataclasses.replace(PRESETS[name], **given).to_dict()


#: the paper's solvers: coarse learning-rate growth per level and the data of a step
PAPER_PRESETS: dict[str, dict] = {
    "naive": {"alpha_growth": 1.0, "data": "batch"},
    "schroder1": {"alpha_growth": 2.0, "data": "batch"},
    "schroder2": {"alpha_growth": 2.0, "data": "serialized"},
    "schroder2-slow": {"alpha_growth": 1.25, "data": "serialized"},
}
PAPER_CYCLES = ("two-level", "V", "F")
DOUBLE_PHI = (False, "split", "repeat")
ROW_INDEX = ("end", "start")


def paper_levels(n_steps: int, *, cfactor: int = 2, max_coarse: int = 10) -> int:
    """Levels of the paper's hierarchy: added until the coarsest has at most ``max_coarse`` steps (at least 2)."""
    levels, points = 1, n_steps
    while points > max_coarse or levels < 2:
        points //= cfactor
        levels += 1
    return levels


def paper_options(
    name: str,
    n_steps: int,
    *,
    alpha_b: float,
    alpha_max: float = math.inf,
    cycle: str = "V",
    double_phi=False,
    max_coarse: int = 10,
    max_iter: int = 50,
    row_index: str = "end",
) -> dict:
    """Solver and propagator options of the paper's solver ``name`` for ``n_steps`` steps.

    Parameters
    ----------
    name : {"naive", "schroder1", "schroder2", "schroder2-slow"}
    n_steps : int
        Training steps ``N``.
    alpha_b : float
        The fine learning rate (positive, finite).
    alpha_max : float
        Cap of the coarse learning rates (at least ``alpha_b``; ``inf`` for none).
    cycle : {"two-level", "V", "F"}
    double_phi : {False, "split", "repeat"}
        Coarse step as two applications of Phi (module docstring).
    max_coarse : int
        Most steps the coarsest level may have (at least 1).
    max_iter : int
    row_index : {"end", "start"}
        On serialized data, the step from point ``i - 1`` to point ``i`` of
        any level trains on row ``i mod K`` (``"end"``) or on row
        ``(i - 1) mod K`` (``"start"``); batch data ignores it.

    Returns
    -------
    dict
        ``"solver"``: keywords of :class:`daskann.mgrit.MGRIT`;
        ``"propagator"``: keywords of :class:`daskann.mgrit.SGDPropagator`;
        ``"data"``: ``"batch"`` or ``"serialized"``.

    Examples
    --------
    >>> options = paper_options("schroder1", 1600, alpha_b=1.0, alpha_max=8.0)
    >>> options["solver"]["levels"], options["propagator"]["alpha_cap"]
    (9, 8.0)
    """
    n_steps, alpha_b, alpha_max, max_coarse = _check_paper_arguments(
        name, n_steps, alpha_b, alpha_max, cycle, double_phi, max_coarse=max_coarse, row_index=row_index
    )
    preset = PAPER_PRESETS[name]
    levels = 2 if cycle == "two-level" else paper_levels(n_steps, max_coarse=max_coarse)
    solver = _paper_solver(n_steps, levels, cycle, max_iter)
    propagator = _paper_propagator(preset, alpha_b, alpha_max, double_phi=double_phi, row_index=row_index)
    return {"solver": solver, "propagator": propagator, "data": preset["data"]}


def _check_paper_arguments(name, n_steps, alpha_b, alpha_max, cycle, double_phi, *, max_coarse, row_index):
    """``(n_steps, alpha_b, alpha_max, max_coarse)`` of :func:`paper_options`, checked."""
    check_choice("preset", name, tuple(PAPER_PRESETS))
    n_steps = check_int("n_steps", n_steps)
    alpha_b = _check_alpha("alpha_b", alpha_b, "a positive finite learning rate")
    alpha_max = _check_alpha("alpha_max", alpha_max, f"a number >= alpha_b ({alpha_b!r}), or inf", lo=alpha_b)
    check_choice("cycle", cycle, PAPER_CYCLES)
    if double_phi not in DOUBLE_PHI or isinstance(double_phi, (int, float)) and double_phi is not False:
        raise invalid("double_phi", double_phi, "False, 'split' or 'repeat'")
    max_coarse = check_int("max_coarse", max_coarse, minimum=1)
    check_choice("row_index", row_index, ROW_INDEX)
    if n_steps // 2 < 1:
        raise invalid("n_steps", n_steps, "at least 2 (the coarsest level would keep fewer than 1 step)")
    return n_steps, alpha_b, alpha_max, max_coarse


def _paper_solver(n_steps: int, levels: int, cycle: str, max_iter) -> dict:
    """Keywords of :class:`daskann.mgrit.MGRIT` for the paper's solvers."""
    return {
        "levels": levels,
        "cfactor": 2,
        "cf_iter": 1,
        "cycle_type": "F" if cycle == "F" else "V",
        "tol": 1e-9 * math.sqrt(n_steps),
        "t_norm": 2,
        "max_iter": check_int("max_iter", max_iter),
        "initial_guess": "zero",
        # XBraid's default skip=1 (no work on the first down-cycle) starts from the coarse solution
        "nested_iteration": True,
        "min_coarse": 1,
    }


def _paper_propagator(preset: dict, alpha_b: float, alpha_max: float, *, double_phi, row_index: str) -> dict:
    """Keywords of :class:`daskann.mgrit.SGDPropagator` for the paper's solver ``preset``."""
    return {
        "lr": alpha_b,
        "momentum": 0.0,
        "coarse": "scaled",
        "alpha_growth": preset["alpha_growth"],
        "alpha_cap": None if alpha_max == math.inf else alpha_max / alpha_b,
        "substeps": 2 if double_phi == "split" else 1,
        "repeats": 2 if double_phi == "repeat" else 1,
        "coarse_data": "own",
        "velocity": False,
        # the step into point i uses row i mod K: shift the order by one (fine and coarse rows alike)
        "step_offset": 1 if preset["data"] == "serialized" and row_index == "end" else 0,
    }


def _check_alpha(name: str, value, expected: str, *, lo: float = 0.0) -> float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isnan(value)
    if name == "alpha_b":
        ok = ok and math.isfinite(value) and value > 0
    else:
        ok = ok and value >= lo
    if not ok:
        raise invalid(name, value, expected)
    return float(value)
