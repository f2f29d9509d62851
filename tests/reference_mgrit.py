"""An independent FAS-MGRIT with full storage, written after pymgrit's Mgrit, for checking daskann.mgrit.

Every level keeps all its points in Python lists and the cycles run as plain recursion: no tasks, no
blocks, no stores; it shares no code with daskann.
"""

from __future__ import annotations

import math

import numpy as np


def reference_mgrit(phis, u0, n, levels, m, *, cf_iter, cycle, iterations):
    """Residual history of pymgrit-style MGRIT (all points stored, point lists, no tasks)."""
    sizes = [n // m**lvl for lvl in range(levels)]
    u = [[u0.copy() for _ in range(sizes[lvl] + 1)] for lvl in range(levels)]
    g = [[np.zeros_like(u0) for _ in range(sizes[lvl] + 1)] for lvl in range(levels)]
    v = [[None] * (sizes[lvl] + 1) for lvl in range(levels)]

    def f_relax(lvl):
        for p in range(1, sizes[lvl] + 1):
            if p % m:
                u[lvl][p] = g[lvl][p] + phis[lvl](u[lvl][p - 1], p - 1)

    def c_relax(lvl):
        for p in range(m, sizes[lvl] + 1, m):
            u[lvl][p] = g[lvl][p] + phis[lvl](u[lvl][p - 1], p - 1)

    def iteration(lvl, kind):
        if lvl == levels - 1:
            for p in range(1, sizes[lvl] + 1):
                u[lvl][p] = g[lvl][p] + phis[lvl](u[lvl][p - 1], p - 1)
            return
        f_relax(lvl)
        for _ in range(cf_iter):
            c_relax(lvl)
            f_relax(lvl)
        for q in range(sizes[lvl + 1] + 1):
            v[lvl + 1][q] = u[lvl][q * m].copy()
            u[lvl + 1][q] = u[lvl][q * m].copy()
        for q in range(1, sizes[lvl + 1] + 1):
            r = g[lvl][q * m] + phis[lvl](u[lvl][q * m - 1], q * m - 1) - u[lvl][q * m]
            g[lvl + 1][q] = r + v[lvl + 1][q] - phis[lvl + 1](v[lvl + 1][q - 1], q - 1)
        iteration(lvl + 1, kind)
        for q in range(1, sizes[lvl + 1] + 1):
            u[lvl][q * m] = u[lvl][q * m] + (u[lvl + 1][q] - v[lvl + 1][q])
        f_relax(lvl)
        if lvl > 0 and kind == "F":
            iteration(lvl, "V")

    history = []
    for _ in range(iterations):
        iteration(0, cycle)
        history.append(
            math.sqrt(sum(float(np.sum((phis[0](u[0][p - 1], p - 1) - u[0][p]) ** 2)) for p in range(m, n + 1, m)))
        )
    return history
