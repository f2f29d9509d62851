"""Linear test problems and the two-level convergence theory they are checked against.

``u_{i+1} = A u_i`` with ``A = V diag(lambda) V^{-1}`` (backward Euler steps of
``u' = -K u``, so stable) and coarse propagators ``V diag(mu_l) V^{-1}`` (backward
Euler with the coarse step). For such diagonalisable problems, Dobrev,
Kolev, Petersson and Schroder (SIAM J. Sci. Comput. 39(5), 2017) bound the
two-level error propagator on the C-points, mode by mode:

* F-relaxation: ``|lambda^m - mu| (1 - |mu|^{N_c}) / (1 - |mu|)``
* FCF-relaxation: ``|lambda|^m`` times that,

where ``m`` is the coarsening factor and ``N_c`` the number of coarse steps;
the error measured in the eigenvector basis contracts at least by the largest
bound over the modes in every iteration.
"""

from __future__ import annotations

import numpy as np

from daskann._validation import check_choice, check_float, check_int, named_error
from daskann.mgrit.problem import Propagator


class LinearPropagator(Propagator):
    """Backward Euler steps of ``u' = -K u`` with ``K = V diag(k) V^{-1}``, ``k > 0``.

    Level ``l`` takes one backward Euler step of length ``dt * span``.

    Parameters
    ----------
    rates : array of float
        Eigenvalues ``k`` of ``K`` (positive: decaying modes).
    vectors : ndarray, optional
        Eigenvectors ``V`` (columns); identity by default.
    dt : float
        Fine time step.
    """

    def __init__(self, rates, vectors=None, *, dt: float = 1.0):
        self.rates = np.asarray(rates, dtype=np.float64)
        if self.rates.ndim != 1 or not np.all(self.rates > 0):
            raise named_error(ValueError, "rates", f"{rates!r} is not valid: expected a 1-d array of positive numbers")
        self.V = np.eye(self.rates.size) if vectors is None else np.asarray(vectors, dtype=np.float64)
        self.Vinv = np.linalg.inv(self.V)
        self.dt = check_float("dt", dt, minimum=0.0, min_inclusive=False)
        self._matrices: dict[int, np.ndarray] = {}

    @classmethod
    def dahlquist(cls, lam: float, *, dt: float = 1.0) -> LinearPropagator:
        """The scalar Dahlquist equation ``u' = lam u`` (``lam < 0``)."""
        lam = check_float("lam", lam, maximum=0.0, max_inclusive=False)
        return cls([-lam], dt=dt)

    @classmethod
    def random_stable(
        cls, size: int, *, seed: int = 0, dt: float = 1.0, slow: float = 0.01, fast: float = 0.5
    ) -> LinearPropagator:
        """A non-symmetric stable matrix: rates spread in ``[slow, fast]``, random eigenvectors."""
        size = check_int("size", size)
        rng = np.random.default_rng(seed)
        rates = np.geomspace(slow, fast, size)
        vectors = np.eye(size) + 0.3 * rng.standard_normal((size, size))
        return cls(rates, vectors, dt=dt)

    @property
    def size(self) -> int:
        return self.rates.size

    def eigenvalues(self, span: int) -> np.ndarray:
        """Eigenvalues of the step spanning ``span`` fine steps (one backward Euler step)."""
        return 1.0 / (1.0 + self.dt * span * self.rates)

    def fine_eigenvalues(self) -> np.ndarray:
        return self.eigenvalues(1)

    def coarse_eigenvalues(self, span: int) -> np.ndarray:
        return self.eigenvalues(span)

    def matrix(self, span: int) -> np.ndarray:
        if span not in self._matrices:
            self._matrices[span] = (self.V * self.eigenvalues(span)) @ self.Vinv
        return self._matrices[span]

    def step(self, state, start, stop, level):
        return (self.matrix(stop - start) @ state[0],)

    def exact_cpoints(self, u0: np.ndarray, n_steps: int, m: int) -> np.ndarray:
        """Serial solution at the C-points ``m, 2m, ...`` (rows)."""
        out, u = [], np.asarray(u0, dtype=np.float64)
        for i in range(1, n_steps + 1):
            u = self.matrix(1) @ u
            if i % m == 0:
                out.append(u)
        return np.array(out)

    def modal_norm(self, errors: np.ndarray) -> float:
        """2-norm over C-points and modes of the error in the eigenvector basis."""
        return float(np.linalg.norm(np.asarray(errors) @ self.Vinv.T))


def two_level_bound(fine_eigenvalues, coarse_eigenvalues, m: int, n_coarse: int, *, relaxation: str = "F") -> float:
    """Dobrev et al. (2017) bound of two-level MGRIT's C-point error propagator.

    Parameters
    ----------
    fine_eigenvalues, coarse_eigenvalues : array
        ``lambda`` of the fine step and ``mu`` of the coarse step, mode by mode.
    m : int
        Coarsening factor.
    n_coarse : int
        Coarse steps ``N_c``.
    relaxation : {"F", "FCF"}

    Returns
    -------
    float
        ``max_modes |lambda^m - mu| (1 - |mu|^N_c) / (1 - |mu|)``, times
        ``|lambda|^m`` for FCF.
    """
    check_choice("relaxation", relaxation, ("F", "FCF"))
    lam = np.asarray(fine_eigenvalues, dtype=np.complex128)
    mu = np.asarray(coarse_eigenvalues, dtype=np.complex128)
    m, n_coarse = check_int("m", m), check_int("n_coarse", n_coarse)
    a = np.abs(mu)
    geometric = np.where(np.isclose(a, 1.0), float(n_coarse), (1.0 - a**n_coarse) / np.where(a == 1, 1, 1.0 - a))
    bound = np.abs(lam**m - mu) * geometric
    if relaxation == "FCF":
        bound = bound * np.abs(lam) ** m
    return float(bound.max())


__all__ = ["LinearPropagator", "two_level_bound"]
