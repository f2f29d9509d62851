"""The work of one task: relaxation sweeps over a block of intervals, and the coarsest solve.

These functions run on workers (or in-process) and touch the trajectory only
through a store object with ``read(name, index)``, ``buffer(name, index,
shape)`` and ``write(name, index, value)``. States are flat contiguous
vectors, stepped in place or straight into the rows that keep them: one copy
per step at most, and no stacking. Every value a task computes is checked
(layout and finiteness); a failing task returns a record naming the level
and the fine step, and never touches the C-values an iteration was committed
from, so the store keeps its last consistent state.

Where the rows live: in-process, tasks compute into the numpy arrays of
:class:`~daskann.mgrit._store.MemoryTrajectory` (one task at a time). On
dask's schedulers a task hands the rows it computes to the tasks that read
them, in memory, as part of its result (:class:`TaskStore`); only the final
sweep of an iteration writes to the zarr store, whole chunks once it has
checked them: the committed C-points of level 0 (and ``v1``/``g1`` when it
restricts, ``u0`` when fine points are kept), which is what a resumed run
starts from. Their C-relaxed copy, which starts the next iteration, stays in
the memory of the worker that computed it and is handed to the next
iteration by a task on that worker (:func:`run_handoff`). A worker lost in an
iteration costs the recomputation of what it held, from the committed
C-points; a lost copy costs the next iteration one more sweep.

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

Chunks along time hold whole blocks of intervals (a function of the
hierarchy only); a task relaxes one or more whole chunks, so no two tasks
write one chunk.
"""

from __future__ import annotations

import contextlib
import inspect
import threading
import time
from dataclasses import dataclass

import numpy as np

from daskann._heap import heap_for_blocks
from daskann.exceptions import DaskannError

#: C-value slots per level: a sweep reads one and writes others; the final sweep of an iteration also avoids
#: the slot the iteration started from, which a recomputed task may read again
SLOTS = 5
#: arrays a task finds in the zarr store when no task of its iteration wrote them (an earlier iteration's
#: final sweep, or the set-up); every other array is handed from task to task in memory
PERSISTED = frozenset({"init", "last", "c0", "v1", "g1", "u0"})


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
        Generation of ``v{l+1}`` the correction reads.
    gen_restrict : int
        Generation of ``v{l+1}``/``g{l+1}`` the restriction writes (the other
        one when the sweep also corrects).
    persist : bool
        Write to the zarr store (the final sweep: what the next iteration and
        a resumed run start from); otherwise the rows go to the dependent
        tasks in memory.
    order : int
        Position in the iteration's submission order (the latest writer of a
        chunk wins).
    keep : tuple or None
        The final sweep on dask's schedulers: ``(run, iteration, token)``
        under which the worker keeps the ``fuse_c`` values in its memory for
        the next iteration (:func:`run_handoff`) instead of writing them to
        the store; a resumed run does not need them.
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
    gen_restrict: int = 1
    persist: bool = False
    order: int = 0
    keep: tuple | None = None


@dataclass(frozen=True)
class CoarseSpec:
    """The sequential solve on the coarsest level (one task)."""

    level: int
    rhs: bool
    gen: int = 0
    persist: bool = False
    order: int = 0


@dataclass(frozen=True)
class HandoffSpec:
    """The C-values a final sweep kept in its worker's memory, handed to the next iteration (one task).

    Attributes
    ----------
    token : tuple
        ``(run, iteration, token)`` of the final sweep task that kept them.
    """

    token: tuple
    persist: bool = False
    order: int = 0


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
        self._flat_out = self._flat is not None and "out" in inspect.signature(self._flat).parameters

    def phi(
        self, x: np.ndarray, level: int, point: int, rhs: np.ndarray | None = None, out: np.ndarray | None = None
    ) -> np.ndarray:
        """``Phi_level(x) + rhs`` from ``point``; checked, as a flat vector.

        ``out`` (which may be ``x`` itself) receives the result, so a sweep
        steps a state in place or straight into the row of the store that
        keeps it; without it a new vector is returned.
        """
        span = self.hierarchy.span(level)
        start = point * span
        # callers hold np.errstate(all="ignore"): overflow shows up as NaN/Inf, checked below
        y = None
        if self._flat is not None:
            extra = {"out": out} if self._flat_out else {}
            y = self._flat(x, start, start + span, level, **extra)
        if y is None:
            result = self.propagator.step(self.layout.unpack(x), start, start + span, level)
            self.layout.check(result, level=level, step=start)
            y = self.layout.pack(result, out=out)
        elif out is not None and y is not out:
            out[...] = y
            y = out
        if rhs is not None:
            y += rhs
        if not finite(y):
            raise StepFailed(level, start + span, "the state became NaN or Inf")
        return y


def finite(y: np.ndarray) -> bool:
    """Are all entries finite? One pass and no temporary for the usual finite state
    (NaN and Inf propagate into ``y @ y``; an overflowing square is checked entry by entry)."""
    return bool(np.isfinite(y @ y)) or bool(np.isfinite(y).all())


def _skipped(deps) -> dict | None:
    """The result of a task that does not run because a dependency failed (None when none did).

    It passes on the earliest failure among its dependencies (by task
    order) as its ``"cause"``, so that the failure of any task reaches the
    client through the few results it fetches.
    """
    failed = [d for d in deps if d is not None and not d.get("ok", True)]
    return {"ok": False, "skipped": True, "cause": first_failure(failed)} if failed else None


def first_failure(results) -> dict | None:
    """The earliest failure (by task order) among task results and the causes they pass on, or None."""
    causes = [r.get("cause") if r.get("skipped") else r for r in results if not r.get("ok", True)]
    known = [c for c in causes if c is not None]
    return min(known, key=lambda c: c["order"]) if known else None


def _cvalues(store, ctx: Context, spec: SweepSpec, first: int, last: int) -> list[np.ndarray]:
    """Values of C-points ``first .. last`` of the sweep's level, with the pending correction.

    One read per array: a block's rows lie in one or two chunks. The rows may
    be read-only views of the store: a sweep never writes what it reads.
    """
    level = spec.level
    lo = max(first, 1)
    out = [ctx.u0] if first == 0 else []
    if last < lo:
        return out
    kind = spec.source[0]
    if kind == "c":
        values = store.rows(f"c{level}", (spec.source[1], slice(lo - 1, last)))
    elif kind == "v":
        m = ctx.hierarchy.cfactors[level]
        values = store.rows(f"v{level}", (spec.gen, slice(lo * m - 1, last * m, m)))
    else:
        values = store.rows(f"u{level + 1}", slice(lo - 1, last))
    if spec.correct:
        # FAS correction at the C-points: u_l += u_{l+1} - v_{l+1}
        correction = store.read(f"u{level + 1}", slice(lo - 1, last)) - store.read(
            f"v{level + 1}", (spec.gen_next, slice(lo - 1, last))
        )
        values = np.add(values, correction)
        bad = ~np.isfinite(values).all(axis=1)
        if bad.any():
            q = lo + int(np.argmax(bad))
            raise StepFailed(level, q * ctx.hierarchy.span(level + 1), "the corrected state became NaN or Inf")
    return out + list(values)


def _rows(index) -> tuple[tuple, range]:
    """``index`` as (leading indices, rows): ``slice`` or ``(slot, slice)``."""
    if isinstance(index, tuple):
        *lead, rows = index
    else:
        lead, rows = [], index
    return tuple(lead), range(rows.start or 0, rows.stop, rows.step or 1)


class TaskStore:
    """What a dask task reads and writes: its dependencies' rows in memory, the zarr store for the rest.

    Rows a task computes travel to the tasks that read them as part of its
    result, so only the final sweep of an iteration writes to zarr (its
    C-points: what the next iteration and a resumed run start from). A row
    no dependency holds was written by an earlier iteration (or the set-up)
    and is read from zarr (:data:`PERSISTED`).

    Parameters
    ----------
    backing : ZarrTrajectory
    deps : sequence of dict
        The results of the task's dependencies (their ``"blocks"``).
    persist : bool
        Writes go to ``backing``; otherwise they are kept for the result.
    order : int
        The task's position in its iteration.
    dtype : numpy.dtype
        Of the states.
    """

    def __init__(self, backing, deps, *, persist: bool, order: int, dtype, keep: tuple = ()):
        self.backing, self.persist, self.order, self.dtype = backing, persist, order, dtype
        self.keep = keep  # (name, lead) of rows kept in this worker's memory rather than written
        self.kept: list[tuple] = []
        self.found: dict[tuple, list] = {}
        for dep in deps:
            for block in dep.get("blocks", ()) if dep is not None else ():
                name, lead, first, rank, array = block
                self.found.setdefault((name, lead), []).append((rank, first, array))
        for blocks in self.found.values():
            blocks.sort(key=lambda b: -b[0])  # the latest writer of a row first
        self.blocks: list[tuple] = []

    def _locate(self, name: str, lead: tuple, row: int):
        for _rank, first, array in self.found.get((name, lead), ()):
            if first <= row < first + len(array):
                return array, row - first
        return None, None

    def read(self, name: str, index) -> np.ndarray:
        rows = self.rows(name, index)
        return rows if isinstance(rows, np.ndarray) else np.stack(rows)

    def rows(self, name: str, index):
        """The rows as one array when one block (or the store) holds them all, else as a list of row views."""
        lead, rows = _rows(index)
        parts = [self._locate(name, lead, r) for r in rows]
        if all(a is None for a, _ in parts):
            if name not in PERSISTED:
                raise AssertionError(f"rows {index} of {name!r}: no dependency computed them")
            return self.backing.read(name, index)
        if any(a is None for a, _ in parts):
            raise AssertionError(f"rows {index} of {name!r}: only some were computed by a dependency")
        first, i0 = parts[0]
        if rows.step == 1 and all(a is first and i == i0 + k for k, (a, i) in enumerate(parts)):
            return first[i0 : i0 + len(parts)]  # one block holds them all: a view
        return [a[i] for a, i in parts]

    def buffer(self, name: str, index, shape) -> np.ndarray:
        return np.empty(shape, dtype=self.dtype)

    def write(self, name: str, index, value) -> None:
        lead, rows = _rows(index)
        if self.persist and (name, lead) == self.keep:
            self.kept.append((name, lead, rows.start, self.order, value))
        elif self.persist:
            self.backing.write(name, index, value)
        else:
            self.blocks.append((name, lead, rows.start, self.order, value))


class _Timed:
    """Store wrapper that adds up the time spent reading and writing."""

    def __init__(self, store):
        self.store, self.seconds = store, 0.0

    @contextlib.contextmanager
    def _clock(self):
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.seconds += time.perf_counter() - t0

    def read(self, name, index):
        with self._clock():
            return self.store.read(name, index)

    def rows(self, name, index):
        """Rows to index one at a time: row views where a copy into one array would serve nothing."""
        with self._clock():
            return getattr(self.store, "rows", self.store.read)(name, index)

    def write(self, name, index, value):
        with self._clock():
            self.store.write(name, index, value)

    def buffer(self, name, index, shape):
        return self.store.buffer(name, index, shape)


def _task_store(store, spec, ctx: Context, deps):
    """The store a task works on: the in-process arrays themselves, or a :class:`TaskStore`."""
    if getattr(store, "in_place", False):
        return store
    keep = (f"c{spec.level}", (spec.fuse_c,)) if getattr(spec, "keep", None) else ()
    return TaskStore(store, deps, persist=spec.persist, order=spec.order, dtype=ctx.layout.dtype, keep=keep)


#: C-values final sweeps keep in this process for the next iteration: ``token -> blocks``
_KEPT: dict[tuple, list] = {}
_KEPT_LOCK = threading.Lock()


def _keep(token: tuple, blocks: list) -> None:
    """Keep a final sweep's rows under ``token = (run, iteration, key)``; drop the run's older iterations'."""
    run, iteration, _key = token
    with _KEPT_LOCK:
        for old in [t for t in _KEPT if t[0] == run and t[1] < iteration]:
            del _KEPT[old]
        _KEPT[token] = blocks


def release_kept(run: str) -> None:
    """Forget the rows kept for run ``run`` (and its re-planned attempts) in this process."""
    with _KEPT_LOCK:
        for token in [t for t in _KEPT if t[0] == run]:
            del _KEPT[token]


def run_handoff(spec: HandoffSpec, store, ctx: Context, *deps) -> dict:
    """The C-values the previous iteration's final sweep kept on this worker, for this iteration's first sweep.

    Runs on the worker that ran that sweep. Anywhere else (that worker left
    the cluster, or was replaced) the rows are not here: the result says the
    hand-off is stale and the caller re-plans the iteration from the
    committed C-points in the store. The task has no dependencies, so dask
    can never recompute an earlier iteration from slots overwritten since.
    """
    with _KEPT_LOCK:
        blocks = _KEPT.get(spec.token)
    if blocks is None:
        gone = "the kept C-values are gone"
        return {"ok": False, "stale": True, "level": 0, "step": 0, "what": gone, "order": spec.order}
    # the rows are read, never written: the same arrays serve a recomputed reader
    return {"ok": True, "residuals": [], "last": None, "blocks": [(*b[:3], spec.order, b[4]) for b in blocks]}


def _done(result: dict, store) -> dict:
    """The task's result, with the rows it computed for its dependants."""
    blocks = getattr(store.store, "blocks", None)
    if blocks:
        result["blocks"] = blocks
    return result


def run_sweep(spec: SweepSpec, store, ctx: Context, *deps) -> dict:
    """Relax intervals ``q0 .. q1 - 1`` of one level; see :class:`SweepSpec`."""
    if (skipped := _skipped(deps)) is not None:
        return skipped
    t0, cpu0 = time.perf_counter(), time.thread_time()
    timed = _Timed(_task_store(store, spec, ctx, deps))
    with heap_for_blocks():  # the store's encoding buffers too
        try:
            with np.errstate(all="ignore"):
                writes, residuals, last = _sweep_block(spec, timed, ctx)
        except StepFailed as exc:
            return {"ok": False, "level": exc.level, "step": exc.step, "what": exc.what, "order": spec.order}
        for name, index, value in writes:
            timed.write(name, index, value)
    if spec.keep is not None and getattr(timed.store, "kept", None):
        _keep(spec.keep, timed.store.kept)
    result = {
        "ok": True,
        "residuals": residuals,
        "last": last,
        "seconds": time.perf_counter() - t0,
        "cpu_seconds": time.thread_time() - cpu0,
        "io_seconds": timed.seconds,
    }
    return _done(result, timed)


class _Block:
    """The output rows of one task, allocated once: the store's own rows in-process, private buffers otherwise.

    Each array a task writes is one buffer of whole chunks
    (:meth:`MemoryTrajectory.buffer`, :meth:`ZarrTrajectory.buffer`); states
    are computed straight into its rows, so nothing is stacked or copied
    again before the write.
    """

    def __init__(self, store, size: int):
        self.store, self.size = store, size
        self.arrays: list[tuple[str, tuple, np.ndarray]] = []

    def add(self, name: str, index, rows: int) -> np.ndarray:
        buf = self.store.buffer(name, index, (rows, self.size))
        self.arrays.append((name, index, buf))
        return buf


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
    g = store.rows(f"g{level}", (spec.gen, slice(row0, row1))) if spec.rhs else None
    block, new_c, fused, v_next, g_next, u = _sweep_rows(spec, store, ctx, c_last, row0, row1)
    work = np.empty(ctx.layout.size, dtype=ctx.layout.dtype)  # the running state when no row keeps it
    residuals, x = [], None
    for q in range(q0, q1):
        points = hier.interval_points(level, q)
        has_c = q < n_c
        start = cvals[q - q0]
        x = start
        for p in points[: len(points) - 1] if has_c else points:
            rhs = None if g is None else g[p - 1 - row0]
            x = ctx.phi(x, level, p - 1, rhs, out=work if u is None else u[p - 1 - row0])
        if not has_c:
            continue
        p, j = points[-1], q - q0
        rhs = None if g is None else g[p - 1 - row0]
        old = cvals[q + 1 - q0]
        if spec.mode == "C":
            new = _c_relax(spec, ctx, x, old, p, rhs, out=new_c[j], work=work)
            if u is not None:
                u[p - 1 - row0] = new
            continue
        new_c[j] = old
        if u is not None:
            u[p - 1 - row0] = old
        if spec.mode != "R":
            continue
        a = ctx.phi(x, level, p - 1, rhs, out=fused[j] if fused is not None and spec.weight == 1.0 else work)
        if fused is not None and spec.weight != 1.0:
            np.multiply(spec.weight, a, out=fused[j])
            fused[j] += (1.0 - spec.weight) * old
        r = np.subtract(a, old, out=work if a is not work else a)
        residuals.append(float(np.linalg.norm(r)))
        if v_next is not None:
            _restrict(ctx, level, p, q, r, old, start, v_next=v_next[j], g_next=g_next[j], work=work)
    last = None
    if row1 == n_points and row1 > row0:
        last = np.array(u[-1] if u is not None else (x if not hier.has_cpoint(level, q1 - 1) else new_c[-1]))
    return block.arrays, residuals, last


def _sweep_rows(spec: SweepSpec, store, ctx: Context, c_last: int, row0: int, row1: int):
    """A sweep task's output block and its rows ``(block, c, fused c, v{l+1}, g{l+1}, u)``, None where unwritten."""
    level, q0 = spec.level, spec.q0
    n_new = c_last - q0  # C-points this block owns
    block = _Block(store, ctx.layout.size)
    new_c = block.add(f"c{level}", (spec.dst, slice(q0, c_last)), n_new) if n_new > 0 else None
    fused = None
    if n_new > 0 and spec.fuse_c is not None:
        fused = block.add(f"c{level}", (spec.fuse_c, slice(q0, c_last)), n_new)
    v_next = g_next = None
    if spec.restrict and spec.mode == "R" and n_new > 0:
        v_next = block.add(f"v{level + 1}", (spec.gen_restrict, slice(q0, c_last)), n_new)
        g_next = block.add(f"g{level + 1}", (spec.gen_restrict, slice(q0, c_last)), n_new)
    u = block.add(f"u{level}", slice(row0, row1), row1 - row0) if spec.store_u and row1 > row0 else None
    return block, new_c, fused, v_next, g_next, u


def _c_relax(spec: SweepSpec, ctx: Context, x, old, p: int, rhs, *, out, work):
    """The C-relaxed value at point ``p`` into ``out``: Phi of ``x``, weighted with ``old`` unless the weight is 1."""
    level = spec.level
    if spec.weight == 1.0:
        return ctx.phi(x, level, p - 1, rhs, out=out)
    a = ctx.phi(x, level, p - 1, rhs, out=work)
    new = np.multiply(spec.weight, a, out=out)
    new += (1.0 - spec.weight) * old
    if not finite(new):
        raise StepFailed(level, p * ctx.hierarchy.span(level), "the relaxed state became NaN or Inf")
    return new


def _restrict(ctx: Context, level: int, p: int, q: int, r, old, start, *, v_next, g_next, work) -> None:
    """FAS restriction to coarse point ``q + 1``: ``v_{l+1} = old``, ``g_{l+1} = r + v_{l+1} - Phi_{l+1}(v_{l+1})``."""
    rhs_next = np.add(r, old, out=g_next)
    rhs_next -= ctx.phi(start, level + 1, q, out=work)
    if not finite(rhs_next):
        raise StepFailed(level + 1, p * ctx.hierarchy.span(level), "the FAS right-hand side became NaN or Inf")
    v_next[...] = old


def run_coarse(spec: CoarseSpec, store, ctx: Context, *deps) -> dict:
    """Sequential forward solve ``u_p = g_p + Phi(u_{p-1})`` on the coarsest level."""
    if (skipped := _skipped(deps)) is not None:
        return skipped
    t0, cpu0 = time.perf_counter(), time.thread_time()
    store = _Timed(_task_store(store, spec, ctx, deps))
    level = spec.level
    n = ctx.hierarchy.n_points(level)
    g = store.rows(f"g{level}", (spec.gen, slice(0, n))) if spec.rhs else None
    x = ctx.u0
    out = store.buffer(f"u{level}", slice(0, n), (n, x.size))
    try:
        with np.errstate(all="ignore"), heap_for_blocks():
            for p in range(1, n + 1):
                x = ctx.phi(x, level, p - 1, None if g is None else g[p - 1], out=out[p - 1])
    except StepFailed as exc:
        return {"ok": False, "level": exc.level, "step": exc.step, "what": exc.what, "order": spec.order}
    store.write(f"u{level}", slice(0, n), out)
    result = {
        "ok": True,
        "residuals": [],
        "last": out[-1].copy(),
        "seconds": time.perf_counter() - t0,
        "cpu_seconds": time.thread_time() - cpu0,
        "io_seconds": store.seconds,
    }
    return _done(result, store)
