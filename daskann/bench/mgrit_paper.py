"""The model problems and tables of Schroder, "Parallelizing over artificial neural network training runs with
multigrid" (arXiv:1708.02276 v2).

Two problems, both sigmoid networks without biases trained by plain gradient
descent on half the sum of squared errors (the classic backpropagation delta
``(out - y) * out * (1 - out)``):

three-layer
    The XOR net of Trask's "A neural network in 11 lines of Python": four
    rows ``[[0,0,1],[0,1,1],[1,0,1],[1,1,1]]``, targets ``[0,1,1,0]``, sizes
    3-4-1, weights drawn as in the tutorial after ``numpy.random.seed(1)``.
four-layer
    Binary addition (Trask's synthetic-gradients tutorial, its "plain vanilla"
    network): 500 pairs of addends ``int(rand * 2**11)`` written as 12 binary
    digits, most significant first; input the two addends' digits side by
    side, target the sum's; sizes 24-128-64-12, weights ``randn * 0.2 - 0.1``.
    The paper gives no seed: daskann draws the data and then the weights from
    ``numpy.random.RandomState(FOUR_LAYER_SEED)``.

:data:`TABLES` lists every table the paper reports (its numbering), with its
iteration counts where our copy has them (Tables 1-11); :func:`solve_paper` runs one entry, and
:func:`step_growth` measures how much one step of a level magnifies errors (on the batch problem Solver 1's
coarse step leaves gradient descent's stability region, which is why Table 11 stalls: docs/mgrit.md). The
assignment of the four-layer Tables 8-11 to (solver, alpha_b) and the cycle of
Table 12 are daskann's reading of the paper's description, and so is the row a
serialized step trains on: the step that computes point ``i`` (of any level)
uses row ``i mod K`` (``row_index="end"`` of
:func:`daskann.mgrit.presets.paper_options`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from daskann._validation import named_error
from daskann.data import BatchOrder
from daskann.mgrit.presets import paper_options
from daskann.mgrit.propagators import SGDPropagator
from daskann.mgrit.solver import MGRIT, MGRITResult
from daskann.nn import MLP

FOUR_LAYER_SEED = 1
THREE_LAYER_STEPS = (100, 200, 400, 800, 1600, 3200, 6400, 12800, 25600)
FOUR_LAYER_BATCH_STEPS = (40, 80, 160, 320, 640, 1280)
FOUR_LAYER_STEPS = (100, 200, 400, 800, 1600, 3200, 6400, 12800)

_COLUMNS = ("table", "problem", "solver", "cycle", "alpha_b", "alpha_max", "steps", "paper")
_THREE, _FOUR, _FOUR_BATCH = THREE_LAYER_STEPS, FOUR_LAYER_STEPS, FOUR_LAYER_BATCH_STEPS

#: the paper's tables: problem, solver, cycle, alpha_b, alpha_max, steps and its iterations (three-layer and the
#: four-layer batch Tables 8-11; None for 12-16); None stands for the paper's "50+" (its 50 with a convergence
#: factor of 0.88 or above: Table 8 at N = 1280, Table 9 from N = 80)
TABLES: tuple[dict, ...] = tuple(dict(zip(_COLUMNS, row, strict=True)) for row in (
    (1, "three-layer", "naive", "two-level", 1.0, 8.0, _THREE, (14, 19, 24, 31, 40, 49, None, None, None)),
    (2, "three-layer", "schroder1", "two-level", 1.0, 8.0, _THREE, (6, 6, 6, 6, 6, 6, 6, 6, 5)),
    (3, "three-layer", "schroder1", "F", 1.0, 8.0, _THREE, (6, 6, 7, 7, 7, 8, 11, 16, 21)),
    (4, "three-layer", "schroder1", "F", 0.5, 8.0, _THREE, (5, 5, 5, 6, 6, 5, 6, 9, 12)),
    (5, "three-layer", "schroder2", "two-level", 1.0, 8.0, _THREE, (10, 12, 15, 18, 20, 20, 20, 20, 19)),
    (6, "three-layer", "schroder2", "F", 1.0, 8.0, _THREE, (10, 12, 15, 21, 26, 27, 29, 41, 50)),
    (7, "three-layer", "schroder2", "F", 0.1, 30.0, _THREE, (5, 5, 5, 6, 7, 8, 10, 13, 14)),
    (8, "four-layer", "naive", "two-level", 0.1, 0.2, _FOUR_BATCH, (9, 13, 19, 36, 48, None)),
    (9, "four-layer", "schroder1", "two-level", 0.1, 0.2, _FOUR_BATCH, (9, None, None, None, None, None)),
    (10, "four-layer", "naive", "two-level", 0.025, 0.2, _FOUR_BATCH, (8, 12, 17, 23, 31, 43)),
    (11, "four-layer", "schroder1", "two-level", 0.025, 0.2, _FOUR_BATCH, (5, 7, 11, 16, 25, 37)),
    (12, "four-layer-50", "schroder1", "two-level", 0.025, 0.2, _FOUR, None),
    (13, "four-layer", "schroder2", "two-level", 0.025, 0.2, _FOUR, None),
    (14, "four-layer", "schroder2", "F", 0.025, 0.2, _FOUR, None),
    (15, "four-layer", "schroder2", "V", 0.025, 0.2, _FOUR, None),
    (16, "four-layer", "schroder2-slow", "F", 0.025, 0.2, _FOUR, None),
))  # fmt: skip


@dataclass(frozen=True)
class PaperProblem:
    """A model problem: the initial network and the training rows."""

    name: str
    model: MLP
    X: np.ndarray
    y: np.ndarray


def _network(weights) -> MLP:
    return MLP.from_arrays(weights, None, activation="sigmoid", output="sigmoid", bias=False)


def three_layer() -> PaperProblem:
    """The XOR problem with the tutorial's seed-1 weights (16 weights)."""
    X = np.array([[0, 0, 1], [0, 1, 1], [1, 0, 1], [1, 1, 1]], dtype=np.float64)
    y = np.array([[0], [1], [1], [0]], dtype=np.float64)
    rng = np.random.RandomState(1)  # the tutorial's np.random.seed(1) stream
    syn0 = 2 * rng.random_sample((3, 4)) - 1
    syn1 = 2 * rng.random_sample((4, 1)) - 1
    return PaperProblem("three-layer", _network([syn0, syn1]), X, y)


def _binary(values: np.ndarray, bits: int = 12) -> np.ndarray:
    """Rows of ``bits`` binary digits, most significant first."""
    shifts = np.arange(bits - 1, -1, -1)
    return ((values[:, None] >> shifts) & 1).astype(np.float64)


def four_layer(n_pairs: int = 500, *, seed: int = FOUR_LAYER_SEED) -> PaperProblem:
    """Binary addition of two 11-bit numbers in 12 digits: 24-128-64-12 (12,032 weights)."""
    rng = np.random.RandomState(seed)
    a = (rng.random_sample(n_pairs) * 2**11).astype(np.int64)
    b = (rng.random_sample(n_pairs) * 2**11).astype(np.int64)
    X = np.hstack([_binary(a), _binary(b)])
    y = _binary(a + b)
    weights = [rng.randn(n_in, n_out) * 0.2 - 0.1 for n_in, n_out in ((24, 128), (128, 64), (64, 12))]
    name = "four-layer" if n_pairs == 500 else f"four-layer-{n_pairs}"
    return PaperProblem(name, _network(weights), X, y)


def problem(name: str) -> PaperProblem:
    """A problem by the name :data:`TABLES` uses."""
    if name == "three-layer":
        return three_layer()
    if name.startswith("four-layer"):
        return four_layer(int(name.rsplit("-", 1)[1]) if name != "four-layer" else 500)
    raise named_error(
        ValueError, "problem", f"{name!r} is not valid: expected 'three-layer', 'four-layer' or 'four-layer-<pairs>'"
    )


def paper_propagator(prob: PaperProblem, options: dict) -> SGDPropagator:
    """The paper's Phi on ``prob`` for options from :func:`daskann.mgrit.presets.paper_options`."""
    shuffle = "serialized" if options["data"] == "serialized" else False
    order = BatchOrder(len(prob.X), None, shuffle=shuffle)
    return SGDPropagator(prob.model, prob.X, prob.y, loss="sse", order=order, **options["propagator"])


def step_growth(
    propagator: SGDPropagator, state, start: int, *, level: int = 0, span: int = 1, iterations: int = 20, seed: int = 0
) -> float:
    """Growth factor of one step: ``max ||Phi(w + e v) - Phi(w)|| / e`` over directions ``v``.

    The step is that of ``level`` from fine point ``start`` over ``span``
    fine steps (``span = 2**level`` in the paper's hierarchies), at the state
    ``state``; on level 0, ``span`` fine steps one after another (what a
    coarse step stands for). Power iteration on finite differences of the step; the
    Jacobian of a gradient-descent step, ``I - alpha H``, is symmetric, so
    this is its norm: above 1 the step magnifies errors in some direction
    (``alpha`` times the top Hessian eigenvalue beyond 2, or a negative
    curvature), and a coarse solve through such steps multiplies them.

    Examples
    --------
    >>> prob = three_layer()
    >>> prop = paper_propagator(prob, paper_options("naive", 8, alpha_b=1.0))
    >>> 0.9 < step_growth(prop, prop.initial_state(prob.model), 0) < 1.1
    True
    """

    def step(vector):
        if level:
            return propagator.step_flat(vector, start, start + span, level)
        for i in range(start, start + span):  # the fine steps a coarse step stands for
            vector = propagator.step_flat(vector, i, i + 1, 0)
        return vector

    w = np.concatenate([np.asarray(a, dtype=np.float64).ravel() for a in state])
    base = step(w)
    eps = 1e-6 * max(1.0, float(np.linalg.norm(w)))
    v = np.random.default_rng(seed).standard_normal(w.size)
    v /= np.linalg.norm(v)
    growth = 0.0
    for _ in range(iterations):
        jv = (step(w + eps * v) - base) / eps
        growth = float(np.linalg.norm(jv))
        if growth == 0.0:
            break
        v = jv / growth
    return growth


def solve_paper(
    prob: PaperProblem,
    n_steps: int,
    solver: str,
    *,
    cycle: str = "V",
    alpha_b: float,
    alpha_max: float = math.inf,
    double_phi=False,
    max_coarse: int = 10,
    row_index: str = "end",
    **solver_options,
) -> MGRITResult:
    """Run one of the paper's solvers on ``prob`` over ``n_steps`` steps, in this process.

    The options are :func:`daskann.mgrit.presets.paper_options`'s; extra
    keywords go to :class:`daskann.mgrit.MGRIT` (e.g. ``max_iter``). Bad input
    fails here, before any step runs.

    Examples
    --------
    >>> result = solve_paper(three_layer(), 100, "naive", cycle="two-level", alpha_b=1.0, alpha_max=8.0)
    >>> result.converged, result.iterations
    (True, 14)
    """
    options = paper_options(
        solver,
        n_steps,
        alpha_b=alpha_b,
        alpha_max=alpha_max,
        cycle=cycle,
        double_phi=double_phi,
        max_coarse=max_coarse,
        row_index=row_index,
    )
    prop = paper_propagator(prob, options)
    kwargs = {**options["solver"], "divergence_factor": None, **solver_options}
    # the paper's runs go on to 50 iterations whatever the residual does: no divergence stop
    return MGRIT(prop, prop.initial_state(prob.model), n_steps, **kwargs).solve()
