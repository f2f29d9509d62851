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
and use 3 levels unless told otherwise. Every option can be overridden
(:func:`resolve_preset`).
"""

from __future__ import annotations

from daskann._validation import check_choice, invalid

_COMMON = {
    "levels": 3,
    "cfactor": 4,
    "cf_iter": 1,
    "cycle_type": "V",
    "weight_c": 1.0,
    "weight_c_growth": 1.0,
    "tol": 1e-9,
    "rtol": None,
    "max_iter": 50,
    "nested_iteration": False,
    "coarse": "scaled",
    "alpha_growth": None,
    "alpha_cap": "auto",
    "substeps": 1,
    "coarse_batches": 1,
}

PRESETS: dict[str, dict] = {
    "solver1": {**_COMMON, "cf_iter": 0, "alpha_cap": None},
    "solver2": {**_COMMON},
    "solver3": {**_COMMON, "cycle_type": "F"},
    "solver4": {**_COMMON, "rtol": 1e-9},
}


def resolve_preset(name: str, **overrides) -> dict:
    """The options of preset ``name`` with ``overrides`` (options given as None keep the preset's value).

    Examples
    --------
    >>> resolve_preset("solver3", levels=4)["cycle_type"]
    'F'
    """
    check_choice("preset", name, tuple(PRESETS))
    options = dict(PRESETS[name])
    for key, value in overrides.items():
        if key not in options:
            raise invalid("option", key, "one of " + ", ".join(options))
        if value is not None:
            options[key] = value
    return options
