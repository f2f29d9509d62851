"""The cycle logic: which sweeps run in which order, as tasks with chunk-level dependencies.

The planner walks V- and F-cycles (and nested iteration) exactly as pymgrit's
``Mgrit.iteration`` does, but emits one task per block of intervals per sweep
instead of computing. Each task declares the store chunks it reads and
writes; a task depends on the last writer of every chunk it reads, and on the
last writer and the readers of every chunk it overwrites. The graph of one
iteration therefore pipelines across sweeps and levels with no barrier but the
residual check at its end, and its longest path is the work model's critical
path.
"""

from __future__ import annotations

import dataclasses
import math
from collections import defaultdict
from dataclasses import dataclass

from daskann.mgrit._kernels import SLOTS, CoarseSpec, HandoffSpec, SweepSpec, run_coarse, run_handoff, run_sweep


@dataclass
class Task:
    key: str
    func: object
    spec: object
    deps: tuple  # every ordering constraint (the work model's graph)
    cost: float
    level: int
    final: bool = False
    data_deps: tuple = ()  # the last writers of the chunks the task reads: the results it is handed
    #: ``(writer, (name, lead, lo, hi))`` per chunk read: the task is handed rows ``lo .. hi - 1`` of array
    #: ``name`` (leading indices ``lead``) from the writer's result, not the writer's whole result
    pieces: tuple = ()
    #: the fine step where the task's intervals start: on a cluster the task runs on the worker that owns
    #: this point of time (:func:`owner`), so that only the rows at the ends of a worker's range move
    start: int = 0


def owner(start: int, n_steps: int, workers: int) -> int:
    """The worker (0 .. ``workers - 1``) that owns fine step ``start``: each owns one contiguous range of time."""
    return min(workers - 1, start * workers // max(n_steps, 1))


AUTO_TASKS = 32  # tasks per sweep that intervals_per_task="auto" aims at


def block_sizes(hierarchy, intervals_per_task) -> tuple[int, ...]:
    """Intervals per task on each level but the coarsest.

    ``"auto"`` gives each sweep about :data:`AUTO_TASKS` tasks (a function of
    the hierarchy only, so the store layout does not depend on the cluster).
    """
    sizes = []
    for level in range(hierarchy.n_levels - 1):
        n = hierarchy.n_intervals(level)
        sizes.append(max(1, -(-n // AUTO_TASKS)) if intervals_per_task == "auto" else min(intervals_per_task, n))
    return tuple(sizes)


#: a task should run at least this many times the scheduler's per-task cost ("auto" on a cluster)
TASK_COST_RATIO = 20


#: the most tasks per worker in one sweep: two let a worker start on one end of its range while the rows at
#: the other end are still on their way
TASKS_PER_WORKER = 2


def task_sizes(hierarchy, blocks, cost, *, step_seconds: float, task_seconds: float, workers: int) -> tuple:
    """Intervals per task on each level but the coarsest, from measured costs (``intervals_per_task="auto"``).

    Each worker owns one contiguous range of time (:func:`owner`) and
    relaxes it in one or :data:`TASKS_PER_WORKER` tasks of whole store chunks
    (``blocks[l]`` intervals each), as many as keep each task at least
    :data:`TASK_COST_RATIO` times the scheduler's per-task cost
    ``task_seconds`` (one step of level ``l`` takes ``cost(l) *
    step_seconds``). The tasks of a sweep are as long as each other, so the
    workers share it evenly.
    """
    workers = max(workers, 1)
    sizes = []
    for level, block in enumerate(blocks):
        n = hierarchy.n_intervals(level)
        interval = max(hierarchy.cfactors[level] * cost(level) * step_seconds, 1e-9)
        want = math.ceil(TASK_COST_RATIO * task_seconds / interval)  # intervals a task should at least hold
        chunks = -(-math.ceil(n / block) // workers)  # whole chunks per worker
        per_worker = max(1, min(TASKS_PER_WORKER, chunks * block // max(want, 1)))
        sizes.append(min(n, block * -(-chunks // per_worker)))
    return tuple(sizes)


class _Tracker:
    """Read-after-write and write-after-read dependencies between tasks, per chunk."""

    def __init__(self):
        self.writer: dict = {}
        self.readers: dict = defaultdict(set)

    def add(self, key: str, reads, writes) -> tuple[tuple, tuple, tuple]:
        """The task's dependencies: all of them, those whose results it reads, and (writer, chunk) per read."""
        deps = set()
        pieces = []
        for chunk in reads:
            if chunk in self.writer and self.writer[chunk] != key:
                deps.add(self.writer[chunk])
                pieces.append((self.writer[chunk], chunk))
        data = tuple(sorted(deps))
        for chunk in writes:
            if chunk in self.writer:
                deps.add(self.writer[chunk])
            deps |= self.readers.get(chunk, set())
        for chunk in reads:
            self.readers[chunk].add(key)
        for chunk in writes:
            self.writer[chunk] = key
            self.readers[chunk] = set()
        deps.discard(key)
        return tuple(sorted(deps)), data, tuple(pieces)


class Planner:
    """Builds the tasks of each MGRIT iteration and tracks where every level's values are.

    Parameters
    ----------
    hierarchy : Hierarchy
    options : dict
        ``cf_iter`` (per level), ``weight_c`` (per level), ``cycle_type``,
        ``store_fine``, ``blocks`` (intervals per task, per level).
    cost : callable
        ``cost(level)``: work units of one step of ``level``.
    prefix : str
        Key prefix of the run.
    run : str, optional
        The run's name in the tokens of kept C-values (default ``prefix``).

    Attributes
    ----------
    keep_fused : bool
        The final sweep keeps the C-relaxed values that start the next
        iteration in its worker's memory (dask's schedulers), and the next
        iteration's first sweep is handed them (:func:`run_handoff`): they
        never go through the store.
    sequential : bool
        The tasks run one after another in this process, in place in the
        in-memory trajectory (:class:`~daskann.mgrit._executors.InProcessExecutor`):
        no task is ever recomputed, so the final sweep may write over the slot
        the iteration started from, and a restriction reuses its generation
        unless the same sweep also corrects from it. The trajectory then
        touches four C-value slots of level 0 and one generation of ``v``/``g``
        where a dask run needs five and two (less fresh memory to fault in).
    """

    def __init__(self, hierarchy, options: dict, cost, prefix: str, *, run: str | None = None):
        self.h = hierarchy
        self.L = hierarchy.n_levels
        self.opt = options
        self.cost = cost
        self.prefix = prefix
        self.run = prefix if run is None else run
        self.keep_fused = False
        self.sequential = False
        self.kept: list[tuple] = []  # (token, start, chunks) of each task of the last final sweep that kept rows
        self.blocks = options["blocks"]  # intervals per chunk of the store
        self.task_blocks = self.blocks  # intervals per task: whole chunks (:func:`task_sizes`)
        self.source = [None] * self.L
        self.pending = [False] * self.L
        self.rhs = [False] * self.L
        self.gen = [0] * self.L  # generation of v{l}/g{l} holding the current restriction
        self.committed = 0
        self.restricted = False  # v1/g1 hold the restriction of the committed state
        self.prerelaxed = None  # slot holding the C-relaxed committed state, if any
        self.start_slot = None  # the slot of level 0 an iteration reads from the store
        self.source[0] = ("c", 0)
        self._tasks: list[Task] = []
        self._tracker = _Tracker()
        self._counter = 0
        self._iteration = 0

    # -- state -------------------------------------------------------------------
    def restart_from(self, slot: int) -> None:
        """Continue from committed C-values in ``slot`` (a resumed run)."""
        self.committed = slot
        self.source[0] = ("c", slot)
        self.restricted = False
        self.prerelaxed = None
        self.kept = []

    # -- chunks ------------------------------------------------------------------
    def _u_chunk(self, level: int, row: int) -> tuple:
        if level == self.L - 1:
            # the coarsest solution, in the blocks of intervals of the level below that read it
            return ("u", level, 0 if self.L == 1 else row // self.blocks[level - 1])
        return ("u", level, row // (self.h.cfactors[level] * self.blocks[level]))

    def _chunk_rows(self, chunk: tuple) -> tuple[str, tuple, int, int]:
        """A chunk as (array name, leading indices, first row, end row)."""
        kind, level, *rest = chunk
        if kind == "c":
            slot, b = rest
            size = self.blocks[level]
            return f"c{level}", (slot,), b * size, (b + 1) * size
        if kind == "u":
            (b,) = rest
            if level == self.L - 1:
                size = self.h.n_points(level) if self.L == 1 else self.blocks[level - 1]
            else:
                size = self.h.cfactors[level] * self.blocks[level]
            return f"u{level}", (), b * size, (b + 1) * size
        gen, b = rest
        size = self.blocks[level - 1]
        return f"{kind}{level}", (gen,), b * size, (b + 1) * size

    def _vg_chunk(self, name: str, level: int, gen: int, row: int) -> tuple:
        # v{l}/g{l} rows are written in blocks by the tasks of level l - 1
        return (name, level, gen, row // self.blocks[level - 1])

    def _c_reads(self, level: int, source: tuple, correct: bool, q: int) -> list:
        if q == 0:
            return []
        m = self.h.cfactors[level]
        if source[0] == "c":
            chunks = [("c", level, source[1], (q - 1) // self.blocks[level])]
        elif source[0] == "v":
            chunks = [self._vg_chunk("v", level, self.gen[level], q * m - 1)]
        else:
            chunks = [self._u_chunk(level + 1, q - 1)]
        if correct:
            chunks += [self._u_chunk(level + 1, q - 1), self._vg_chunk("v", level + 1, self.gen[level + 1], q - 1)]
        return chunks

    def _free_slots(self, level: int, *taken) -> list[int]:
        avoid = {s for s in taken if s is not None}
        if level == 0 and self.committed is not None:
            avoid.add(self.committed)
        return [s for s in range(SLOTS) if s not in avoid]

    # -- emitting tasks ------------------------------------------------------------
    def _emit(self, func, spec, reads, writes, cost, level, final=False, label="", start=0, keep=()) -> None:
        key = f"{self.prefix}-it{self._iteration}-{self._counter:04d}-L{level}{label}"
        spec = dataclasses.replace(spec, persist=final, order=self._counter)
        if keep:  # the chunks ``keep`` stay in the worker's memory under this token
            token = (self.run, self._iteration, key)
            spec = dataclasses.replace(spec, keep=token)
            self._kept_now.append((token, start, tuple(keep)))
        self._counter += 1
        deps, data, reads_from = self._tracker.add(key, reads, writes)
        pieces = tuple((writer, self._chunk_rows(chunk)) for writer, chunk in reads_from)
        self._tasks.append(Task(key, func, spec, deps, cost, level, final, data, pieces, start))

    def sweep(
        self,
        level: int,
        mode: str,
        *,
        restrict: bool = False,
        fuse_c: bool = False,
        store_u: bool | None = None,
        final: bool = False,
    ) -> int | None:
        """Emit one relaxation sweep over every interval of ``level``."""
        source = self.source[level]
        src_slot = source[1] if source[0] == "c" else None
        # the final sweep writes the store: never over the slot this iteration started from, which a
        # recomputed task of a dask run may read again
        free = self._free_slots(level, src_slot, self.start_slot if final and not self.sequential else None)
        gen_next = self.gen[level + 1] if level + 1 < self.L else 0
        # a restriction writes the other generation where a task of the same sweep may still read the
        # current one (the correction); a dask run keeps both, as its store and recomputed tasks expect
        gen_restrict = 1 - gen_next if self.pending[level] or not self.sequential else gen_next
        spec = SweepSpec(
            level=level,
            q0=0,
            q1=0,
            mode=mode,
            source=source,
            dst=free[0],
            correct=self.pending[level],
            rhs=self.rhs[level],
            store_u=level > 0 if store_u is None else store_u,
            restrict=restrict,
            fuse_c=free[1] if fuse_c else None,
            weight=self.opt["weight_c"][level],
            gen=self.gen[level],
            gen_next=gen_next,
            gen_restrict=gen_restrict,
        )
        first = len(self._tasks)
        n_int = self.h.n_intervals(level)
        for q0 in range(0, n_int, self.task_blocks[level]):
            self._emit_sweep_task(dataclasses.replace(spec, q0=q0, q1=min(q0 + self.task_blocks[level], n_int)), final)
        keys = {t.key for t in self._tasks[first:]}
        if any(d in keys for t in self._tasks[first:] for d in t.deps):
            raise AssertionError(f"tasks of one sweep on level {level} depend on each other")
        self._swept(spec)
        return spec.fuse_c

    def _emit_sweep_task(self, spec: SweepSpec, final: bool) -> None:
        """Emit the task of intervals ``spec.q0 <= q < spec.q1`` of a sweep."""
        h, level = self.h, spec.level
        reads, cost = self._sweep_reads(spec)
        writes = self._sweep_writes(spec)
        start = spec.q0 * h.cfactors[level] * h.span(level)
        keep = [w for w in writes if w[0] == "c" and w[2] == spec.fuse_c] if final and self.keep_fused else ()
        self._emit(run_sweep, spec, reads, writes, cost, level, final, f"-{spec.mode}-q{spec.q0}", start, keep)

    def _sweep_reads(self, spec: SweepSpec) -> tuple[list, float]:
        """The chunks a sweep task reads (each once) and its cost."""
        h, level = self.h, spec.level
        reads = []
        cost = 0.0
        for q in range(spec.q0, spec.q1):
            points = h.interval_points(level, q)
            reads += self._c_reads(level, spec.source, spec.correct, q)
            if h.has_cpoint(level, q):
                reads += self._c_reads(level, spec.source, spec.correct, q + 1)
                if spec.restrict:
                    cost += self.cost(level + 1)
            if spec.rhs:
                reads += [self._vg_chunk("g", level, spec.gen, p - 1) for p in points]
            cost += len(points) * self.cost(level)
        return list(dict.fromkeys(reads)), cost

    def _sweep_writes(self, spec: SweepSpec) -> list:
        """The chunks a sweep task writes: those of its intervals."""
        level, block = spec.level, self.blocks[spec.level]
        writes = []
        for b in range(spec.q0 // block, (spec.q1 - 1) // block + 1):
            if self.h.has_cpoint(level, b * block):
                writes.append(("c", level, spec.dst, b))
                if spec.fuse_c is not None:
                    writes.append(("c", level, spec.fuse_c, b))
                if spec.restrict:
                    writes += [("v", level + 1, spec.gen_restrict, b), ("g", level + 1, spec.gen_restrict, b)]
            if spec.store_u:
                writes.append(("u", level, b))
        return writes

    def _swept(self, spec: SweepSpec) -> None:
        """Record where a sweep left the C-values of its level (and, restricting, the next level's inputs)."""
        level = spec.level
        self.source[level] = ("c", spec.dst)
        self.pending[level] = False
        if spec.restrict:
            if level + 1 < self.L - 1:
                self.source[level + 1] = ("v",)
            self.pending[level + 1] = False
            self.rhs[level + 1] = True
            self.gen[level + 1] = spec.gen_restrict

    def coarse_solve(self) -> None:
        level = self.L - 1
        rhs = self.rhs[level]
        n = self.h.n_points(level)
        gen = self.gen[level]
        reads = list(dict.fromkeys(self._vg_chunk("g", level, gen, r) for r in range(n))) if rhs else []
        self._emit(
            run_coarse,
            CoarseSpec(level=level, rhs=rhs, gen=gen),
            reads,
            list(dict.fromkeys(self._u_chunk(level, r) for r in range(n))),
            n * self.cost(level),
            level,
            final=(level == 0),
            label="-coarse",
        )

    def cycle(self, level: int, kind: str) -> None:
        """V- or F-cycle starting on ``level >= 1`` (pymgrit ``iteration``)."""
        if level == self.L - 1:
            self.coarse_solve()
            return
        for _ in range(self.opt["cf_iter"][level]):
            self.sweep(level, "C")
        self.sweep(level, "R", restrict=True)
        self.cycle(level + 1, kind)
        self.pending[level] = True
        if kind == "F":
            # pymgrit's F-cycle: one more V-cycle from this level after the correction
            self.cycle(level, "V")
        else:
            self.sweep(level, "F")

    def nested(self) -> None:
        """Nested iteration: solve the coarsest level's own problem, refine level by level."""
        self.rhs = [False] * self.L
        self.coarse_solve()
        for level in range(self.L - 2, 0, -1):
            self.source[level] = ("u",)
            self.pending[level] = False
            self.cycle(level, "V")
        self.source[0] = ("u",)
        self.committed = None
        self.restricted = False
        self.prerelaxed = None

    # -- one iteration ---------------------------------------------------------------
    def handoffs(self) -> None:
        """Tasks that hand the C-values the last final sweep kept in memory to this iteration's first sweep."""
        for token, start, chunks in self.kept:
            self._emit(run_handoff, HandoffSpec(token), [], chunks, 0.0, 0, label=f"-handoff-s{start}", start=start)

    def iteration(self, iteration: int, *, nested: bool = False) -> list[Task]:
        """The tasks of MGRIT iteration ``iteration`` (1-based)."""
        self._tasks, self._tracker, self._counter = [], _Tracker(), 0
        self._iteration = iteration
        self._kept_now: list[tuple] = []
        if self.L == 1:
            self.coarse_solve()
            return self._tasks
        if nested:
            self.nested()
        cf0 = self.opt["cf_iter"][0]
        self.start_slot = self.prerelaxed if self.prerelaxed is not None else self.committed
        if cf0 == 0:
            if not self.restricted:
                self.sweep(0, "R", restrict=True)
        else:
            pre = cf0
            if self.prerelaxed is not None:
                self.source[0] = ("c", self.prerelaxed)
                self.handoffs()
                pre -= 1
            for _ in range(pre):
                self.sweep(0, "C")
            self.sweep(0, "R", restrict=True)
        self.cycle(1, self.opt["cycle_type"])
        self.pending[0] = True
        fused = self.sweep(0, "R", restrict=(cf0 == 0), fuse_c=(cf0 > 0), store_u=self.opt["store_fine"], final=True)
        self.committed = self.source[0][1]
        self.restricted = cf0 == 0
        self.prerelaxed = fused
        self.kept = self._kept_now
        return self._tasks
