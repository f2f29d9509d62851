"""The time grids of an MGRIT hierarchy: which fine steps each level's points stand for.

Level 0 has the points ``0 .. N`` (one per completed training step). Level
``l + 1`` keeps every ``m_l``-th point of level ``l`` (``m_l`` is the
coarsening factor, XBraid's ``cfactor``), so a step of level ``l`` spans
``M_l = m_0 * ... * m_{l-1}`` fine steps. On a level ``l`` below the coarsest,
the points ``q * m_l`` are C-points and the others F-points; interval ``q``
holds the F-points ``q * m_l + 1 ..`` and, when it is complete, its right
C-point ``(q + 1) * m_l``. A level whose size is not a multiple of ``m_l``
ends with a trailing interval of F-points only (as in pymgrit and XBraid).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

from daskann._validation import OptionName, check_int, invalid, option_name


@dataclass(frozen=True)
class Hierarchy:
    """Sizes and index maps of every level.

    Attributes
    ----------
    n_steps : int
        Fine steps ``N``.
    cfactors : tuple of int
        Coarsening factor from level ``l`` to ``l + 1`` (one per level but the last).
    """

    n_steps: int
    cfactors: tuple[int, ...]

    @property
    def n_levels(self) -> int:
        return len(self.cfactors) + 1

    def span(self, level: int) -> int:
        """Fine steps covered by one step of ``level`` (``M_l``)."""
        return math.prod(self.cfactors[:level])

    def n_points(self, level: int) -> int:
        """Steps of ``level`` (its points are ``0 .. n_points``)."""
        return self.n_steps // self.span(level)

    def n_cpoints(self, level: int) -> int:
        """C-points of ``level`` after point 0 (the points of ``level + 1``)."""
        return self.n_points(level + 1)

    def n_intervals(self, level: int) -> int:
        """Intervals of ``level``: complete ones plus a trailing one if any."""
        return -(-self.n_points(level) // self.cfactors[level])

    def interval_points(self, level: int, q: int) -> range:
        """Points of ``level`` in interval ``q`` (F-points and the right C-point)."""
        m = self.cfactors[level]
        return range(q * m + 1, min((q + 1) * m, self.n_points(level)) + 1)

    def has_cpoint(self, level: int, q: int) -> bool:
        """Does interval ``q`` end in a C-point?"""
        return q < self.n_cpoints(level)

    def describe(self) -> list[dict]:
        return [{"level": lvl, "points": self.n_points(lvl), "span": self.span(lvl)} for lvl in range(self.n_levels)]


def per_level(name: OptionName, value, n: int, check, *, each: str = "value") -> tuple:
    """``value`` for each of ``n`` levels, each checked by ``check(name, value)``: one for all, or one per level."""
    if isinstance(value, (list, tuple)):
        if len(value) != n:
            raise invalid(name, list(value), f"one {each} per level but the coarsest ({n} values)")
        return tuple(check(name.at(i), v) for i, v in enumerate(value))
    return (check(name, value),) * n


def check_hierarchy(n_steps, levels, cfactor, *, min_coarse: int = 1, name_of=option_name) -> Hierarchy:
    """Validate the number of steps, levels and coarsening factors.

    Parameters
    ----------
    n_steps : int
        Fine steps ``N`` (at least 1).
    levels : int
        Number of levels (1 means a plain serial forward solve).
    cfactor : int or sequence of int
        Coarsening factor (XBraid ``SetCFactor``), one for all levels or one per
        level but the coarsest; each at least 2.
    min_coarse : int
        Fewest steps the coarsest level may keep (XBraid ``SetMinCoarse``).
    name_of : callable
        How errors name ``levels`` and ``cfactor`` (a trainer's ``solver['levels']``).
    """
    n_steps = check_int("n_steps", n_steps)
    levels = check_int(name_of("levels"), levels)
    factors = per_level(name_of("cfactor"), cfactor, levels - 1, functools.partial(check_int, minimum=2), each="factor")
    hierarchy = Hierarchy(n_steps, factors)
    coarse = hierarchy.n_points(levels - 1)
    if coarse < min_coarse:
        most = 1
        while most < levels and n_steps // math.prod(factors[:most]) >= min_coarse:
            most += 1
        raise invalid(
            name_of("levels"),
            levels,
            f"at most {most} levels for {n_steps} steps with coarsening {list(factors) or cfactor} "
            f"(the coarsest level would keep {coarse} steps, fewer than {min_coarse})",
        )
    return hierarchy
