"""The work of one task: relaxation sweeps over a block of intervals, and the coarsest solve.

These functions run on workers (or in-process) and touch the trajectory only
through a store object with ``read(name, index)`` and ``write(name, index,
value)``. Every value a task computes is checked (layout and finiteness)
before anything is written: a failing task writes nothing and returns a
record naming the level and the fine step, so the store keeps its last
consistent state.

Arrays of the trajectory store (``P`` = state size, ``K_l`` = C-points of
level ``l`` after point 0, ``N_l`` = points of level ``l`` after point 0):

``init`` (P,)
    The initial state; point 0 of every level.
``c{l}`` (SLOTS, K_l, P)
    C-point values of level ``l`` in alternating slots (row ``q`` is C-point
    ``q + 1``, the right end of interval ``q``); a sweep reads one slot and
    writes another, so no task reads a chunk another task of the same sweep
    writes.
``u{l}`` (N_l, P)
    All points of level ``l`` (row ``p - 1`` is point ``p``; interval ``q``
    owns rows ``q m .. q m + m - 1``): coarse levels always, the fine level
    when fine points are kept.
``v{l}``, ``g{l}`` (2, N_l, P)
    Restricted values and FAS right-hand side of level ``l >= 1`` in two
    generations (a sweep may correct from one while restricting into the
    other); row ``q`` is written by the task owning interval ``q`` of level
    ``l - 1``.

Chunks along time hold whole blocks of intervals (the intervals one task
relaxes), so every task writes whole chunks that no other task writes.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from daskann.exceptions import DaskannError

SLOTS = 4


class StepFailed(DaskannError):
    """A propagated state was not finite (caught inside the task and reported as a result)."""

    def __init__(self, level: int, step: int, what: str):
        self.level, self.step, self.what = level, step, what
        super().__init__(f"{what} on level {level} at fine step {step}")


@dataclass(frozen=True)
class SweepSpec:
    """One relaxation task: a block of intervals of one level.

    Attributes
    ----------
    level : int
    q0, q1 : int
        Intervals ``q0 <= q < q1``.
    mode : {"C", "F", "R"}
        ``C``: F-relaxation then C-relaxation; ``F``: F-relaxation;
        ``R``: F-relaxation and the residual at the C-points.
    source : tuple
        Where the level's C-values are: ``("c", slot)``, ``("v",)`` (the
        restricted values) or ``("u",)`` (the next coarser level's solution:
        nested iteration).
    dst : int
        Slot the C-values go to.
    correct : bool
        Add the coarse-grid correction ``u{l+1} - v{l+1}`` to the C-values first.
    rhs : bool
        Level has an FAS right-hand side ``g{l}``.
    store_u : bool
        Write the level's points to ``u{l}``.
    restrict : bool
        Write ``v{l+1}`` and ``g{l+1}`` (FAS restriction); mode ``R`` only.
    fuse_c : int or None
        Mode ``R``: also write the C-relaxed values to this slot (they start
        the next iteration, saving one sweep).
    weight : float
        C-relaxation weight (1 is plain C-relaxation).
    gen : int
        Generation of ``v{l}``/``g{l}`` this level reads.
    gen_next : int
        Generation of ``v{l+1}`` the correction reads (and the restriction
        does not write).
    """

    level: int
    q0: int
    q1: int
    mode: str
    source: tuple
    dst: int
    correct: bool
    rhs: bool
    store_u: bool
    restrict: bool
    fuse_c: int | None
    weight: float
    gen: int = 0
    gen_next: int = 0


@dataclass(frozen=True)
class CoarseSpec:
    """The sequential solve on the coarsest level (one task)."""

    level: int
    rhs: bool
    gen: int = 0


class Context:
    """What every task needs besides the store: propagator, layout, hierarchy, initial state.

    Scattered once per run to every worker, so the training data a propagator
    holds travels once.
    """

    def __init__(self, propagator, layout, hierarchy, u0):
        self.propagator, self.layout, self.hierarchy = propagator, layout, hierarchy
        self.u0 = u0
        # a propagator may step the flat vector itself (returning None where it does not)
        self._flat = getattr(propagator, "step_flat", None)

    def phi(self, x: np.ndarray, level: int, point: int, rhs: np.ndarray | None = None) -> np.ndarray:
        """``Phi_level(x) + rhs`` from ``point``; checked, as a new flat vector."""
        span = self.hierarchy.span(level)
        start = point * span
        # callers hold np.errstate(all="ignore"): overflow shows up as NaN/Inf, checked below
        y = self._flat(x, start, start + span, level) if self._flat is not None else None
        if y is None:
            out = self.propagator.step(self.layout.unpack(x), start, start + span, level)
            self.layout.check(out, level=level, step=start)
            y = self.layout.pack(out)
        if rhs is not None:
            y += rhs
        if not np.isfinite(y).all():
            raise StepFailed(level, start + span, "the state became NaN or Inf")
        return y


def _failed(deps) -> bool:
    return any(d is not None and not d.get("ok", True) for d in deps)


SKIPPED = {"ok": False, "skipped": True}


def _cvalues(store, ctx: Context, spec: SweepSpec, first: int, last: int) -> np.ndarray:
    """Values of C-points ``first .. last`` of the sweep's level, with the pending correction.

    One read per array: a block's rows lie in one or two chunks.
    """
    level = spec.level
    out = np.empty((last - first + 1, ctx.layout.size), dtype=ctx.layout.dtype)
    lo = max(first, 1)
    if first == 0:
        out[0] = ctx.u0
    if last < lo:
        return out
    kind = spec.source[0]
    if kind == "c":
        values = store.read(f"c{level}", (spec.source[1], slice(lo - 1, last)))
    elif kind == "v":
        m = ctx.hierarchy.cfactors[level]
        values = store.read(f"v{level}", (spec.gen, slice(lo * m - 1, last * m, m)))
    else:
        values = store.read(f"u{level + 1}", slice(lo - 1, last))
    if spec.correct:
        # FAS correction at the C-points: u_l += u_{l+1} - v_{l+1}
        values = values + (
            store.read(f"u{level + 1}", slice(lo - 1, last))
            - store.read(f"v{level + 1}", (spec.gen_next, slice(lo - 1, last)))
        )
        bad = ~np.isfinite(values).all(axis=1)
        if bad.any():
            q = lo + int(np.argmax(bad))
            raise StepFailed(level, q * ctx.hierarchy.span(level + 1), "the corrected state became NaN or Inf")
    out[lo - first :] = values
    return out


class _Timed:
    """Store wrapper that adds up the time spent reading and writing."""

    def __init__(self, store):
        self.store, self.seconds = store, 0.0

    def read(self, name, index):
        t0 = time.perf_counter()
        try:
            return self.store.read(name, index)
        finally:
            self.seconds += time.perf_counter() - t0

    def write(self, name, index, value):
        t0 = time.perf_counter()
        try:
            self.store.write(name, index, value)
        finally:
            self.seconds += time.perf_counter() - t0


def run_sweep(spec: SweepSpec, store, ctx: Context, *deps) -> dict:
    """Relax intervals ``q0 .. q1 - 1`` of one level; see :class:`SweepSpec`."""
    if _failed(deps):
        return SKIPPED
    t0 = time.perf_counter()
    timed = _Timed(store)
    try:
        with np.errstate(all="ignore"):
            writes, residuals, last = _sweep_block(spec, timed, ctx)
    except StepFailed as exc:
        return {"ok": False, "level": exc.level, "step": exc.step, "what": exc.what}
    for name, index, value in writes:
        timed.write(name, index, value)
    return {
        "ok": True,
        "residuals": residuals,
        "last": last,
        "seconds": time.perf_counter() - t0,
        "io_seconds": timed.seconds,
    }


def _sweep_block(spec: SweepSpec, store, ctx: Context):
    """A block's writes (whole chunks), its C-point residuals and the level's last point."""
    hier = ctx.hierarchy
    level, m = spec.level, hier.cfactors[spec.level]
    n_points = hier.n_points(level)
    n_c = hier.n_cpoints(level)
    q0, q1 = spec.q0, spec.q1
    c_last = min(q1, n_c)
    cvals = _cvalues(store, ctx, spec, q0, c_last)
    row0, row1 = q0 * m, min(q1 * m, n_points)  # rows of u{level} and g{level} in this block
    g = store.read(f"g{level}", (spec.gen, slice(row0, row1))) if spec.rhs else None
    new_c, fused, v_next, g_next, rows, residuals = [], [], [], [], [], []
    for q in range(q0, q1):
        points = hier.interval_points(level, q)
        has_c = q < n_c
        start = cvals[q - q0]
        x = start
        for p in points[: len(points) - 1] if has_c else points:
            x = ctx.phi(x, level, p - 1, None if g is None else g[p - 1 - row0])
            rows.append(x)
        if not has_c:
            continue
        p = points[-1]
        a = ctx.phi(x, level, p - 1, None if g is None else g[p - 1 - row0])
        old = cvals[q + 1 - q0]
        if spec.mode == "C":
            new = a if spec.weight == 1.0 else spec.weight * a + (1.0 - spec.weight) * old
            if not np.isfinite(new).all():
                raise StepFailed(level, p * hier.span(level), "the relaxed state became NaN or Inf")
            new_c.append(new)
            rows.append(new)
            continue
        new_c.append(old)
        rows.append(old)
        if spec.mode != "R":
            continue
        r = a - old
        residuals.append(float(np.linalg.norm(r)))
        if spec.fuse_c is not None:
            fused.append(a if spec.weight == 1.0 else spec.weight * a + (1.0 - spec.weight) * old)
        if spec.restrict:
            # FAS: g_{l+1} = r + v_{l+1} - Phi_{l+1}(v_{l+1}) at coarse point q + 1
            rhs = (r + old) - ctx.phi(start, level + 1, q)
            if not np.isfinite(rhs).all():
                raise StepFailed(level + 1, p * hier.span(level), "the FAS right-hand side became NaN or Inf")
            v_next.append(old)
            g_next.append(rhs)
    writes = []
    if new_c:
        writes.append((f"c{level}", (spec.dst, slice(q0, c_last)), np.stack(new_c)))
    if fused:
        writes.append((f"c{level}", (spec.fuse_c, slice(q0, c_last)), np.stack(fused)))
    if v_next:
        gen = 1 - spec.gen_next
        writes.append((f"v{level + 1}", (gen, slice(q0, c_last)), np.stack(v_next)))
        writes.append((f"g{level + 1}", (gen, slice(q0, c_last)), np.stack(g_next)))
    if spec.store_u and rows:
        writes.append((f"u{level}", slice(row0, row1), np.stack(rows)))
    last = rows[-1] if row1 == n_points and rows else None
    return writes, residuals, last


def run_coarse(spec: CoarseSpec, store, ctx: Context, *deps) -> dict:
    """Sequential forward solve ``u_p = g_p + Phi(u_{p-1})`` on the coarsest level."""
    if _failed(deps):
        return SKIPPED
    t0 = time.perf_counter()
    store = _Timed(store)
    level = spec.level
    n = ctx.hierarchy.n_points(level)
    g = store.read(f"g{level}", (spec.gen, slice(0, n))) if spec.rhs else None
    x = ctx.u0
    out = np.empty((n, x.size), dtype=x.dtype)
    try:
        with np.errstate(all="ignore"):
            for p in range(1, n + 1):
                x = ctx.phi(x, level, p - 1, None if g is None else g[p - 1])
                out[p - 1] = x
    except StepFailed as exc:
        return {"ok": False, "level": exc.level, "step": exc.step, "what": exc.what}
    store.write(f"u{level}", slice(0, n), out)
    return {
        "ok": True,
        "residuals": [],
        "last": out[-1].copy(),
        "seconds": time.perf_counter() - t0,
        "io_seconds": store.seconds,
    }
