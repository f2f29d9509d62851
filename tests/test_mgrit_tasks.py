"""MGRIT's tasks: the work model, what a task is handed, which worker runs it, its heap, data sent once."""

from __future__ import annotations

import pickle
import re
import sys

import numpy as np
import pytest
from mgrit_problems import _problem

from daskann.mgrit import MGRIT, linear, workmodel

# -- work model ----------------------------------------------------------------------------------------------


def test_work_model_on_a_known_graph():
    class T:
        def __init__(self, key, cost, deps=()):
            self.key, self.cost, self.deps = key, cost, tuple(deps)

    tasks = [T("a", 2), T("b", 3), T("c", 1, ["a", "b"]), T("d", 4, ["a"])]
    assert workmodel.critical_path(tasks) == 6.0
    assert workmodel.makespan(tasks, 1) == workmodel.total_work(tasks) == 10.0
    assert workmodel.makespan(tasks, 2) == 6.0
    assert workmodel.speedup(12, [5.0]) == 2.0


# -- task graph and placement --------------------------------------------------------------------------------


def test_tasks_are_handed_chunks_not_their_neighbours_whole_output(client2, tmp_path):
    from daskann.mgrit._executors import _piece

    prop = linear.LinearPropagator.random_stable(5, seed=1)
    u0 = (np.ones(5),)
    kwargs = dict(levels=3, cfactor=4, tol=1e-13, max_iter=40, intervals_per_task=2)
    ref = MGRIT(prop, u0, 64, scheduler=None, **kwargs).solve()
    got = MGRIT(prop, u0, 64, scheduler=client2, store=tmp_path / "run.zarr", run_id="r", **kwargs).solve()
    assert got.residuals == ref.residuals and np.array_equal(got.state[0], ref.state[0])
    # a piece is the rows of one chunk (here 2 intervals: 2 C-values, or 8 points), as views of the writer's rows
    rows = np.arange(30.0).reshape(6, 5)
    result = {"ok": True, "blocks": [("c0", (1,), 4, 3, rows), ("c0", (2,), 4, 3, rows), ("u1", (), 4, 3, rows)]}
    piece = _piece(result, "c0", (1,), 2, 6)
    assert [(b[0], b[1], b[2]) for b in piece["blocks"]] == [("c0", (1,), 4)]
    assert np.shares_memory(piece["blocks"][0][4], rows) and np.array_equal(piece["blocks"][0][4], rows[:2])
    # a failed writer's result is its failure, handed on as it is
    assert _piece({"ok": False, "level": 0, "order": 3}, "c0", (1,), 2, 6) == {"ok": False, "level": 0, "order": 3}


def test_only_pieces_that_cross_workers_are_tasks_of_their_own():
    from daskann.mgrit._executors import _graph, _homes, _piece, _piece_key, reported
    from daskann.mgrit._levels import Hierarchy
    from daskann.mgrit._plan import Planner

    h = Hierarchy(64, (4, 4))
    options = {"cf_iter": [1, 1], "weight_c": [1.0, 1.0], "cycle_type": "V", "store_fine": False, "blocks": (2, 2)}
    tasks = Planner(h, options, lambda level: 1.0, "p").iteration(1)
    home = _homes(tasks, str, ["tcp://a", "tcp://b"], h.n_steps)
    graph = _graph(tasks, reported(tasks), None, None, home=home)
    crossing = inline = 0
    for t in tasks:
        for arg in graph[t.key][4:]:
            if isinstance(arg, tuple):  # cut inside the task from a result in its own process
                assert arg[0] is _piece and home[arg[1]] == home[t.key]
                inline += 1
            else:  # a task beside the writer: only that chunk moves to this worker
                assert graph[arg][0] is _piece and home[graph[arg][1]] != home[t.key]
                assert arg == _piece_key(*graph[arg][1:])
                crossing += 1
    assert inline > crossing > 0
    # the client fetches the final sweep's results (its rows are in the store), not one summary per task
    assert reported(tasks) == [t for t in tasks if t.final] and len(reported(tasks)) < len(tasks) / 3
    assert not [key for key in graph if key.endswith("-summary")]
    # without workers (threads, sync) every piece is cut inside its task
    assert not [key for key, task in _graph(tasks, reported(tasks), None, None).items() if task[0] is _piece]


_SWEEP_KEY = re.compile(r"-it\d+-\d{4}-L(\d)-(?:[CFR]-q(\d+)|handoff-s(\d+)|coarse)$")


def test_each_worker_relaxes_its_own_range_of_time(client2):
    from distributed import get_task_stream

    from daskann.mgrit._plan import owner

    prop = linear.LinearPropagator.random_stable(5, seed=1)
    u0 = (np.ones(5),)
    kwargs = dict(levels=3, cfactor=4, tol=1e-13, max_iter=40, intervals_per_task=4)
    ref = MGRIT(prop, u0, 64, scheduler=None, **kwargs).solve()
    with get_task_stream(client2) as stream:
        got = MGRIT(prop, u0, 64, scheduler=client2, **kwargs).solve()
    assert got.residuals == ref.residuals and np.array_equal(got.state[0], ref.state[0])
    workers = sorted(client2.scheduler_info(n_workers=-1)["workers"])
    placed = kinds = 0
    for record in stream.data:
        match = _SWEEP_KEY.search(str(record["key"]))
        if match is None:
            continue
        level, q0, start = int(match[1]), match[2], match[3]
        start = int(start) if start is not None else int(q0 or 0) * 4 * 4**level
        assert record["worker"] == workers[owner(start, 64, len(workers))], record["key"]
        placed += 1
        kinds += "handoff" in str(record["key"])
    # every sweep, the coarse solve and the hand-offs of the C-values kept from one iteration to the next
    assert placed > 0 and kinds > 0


def test_kept_cvalues_lost_between_iterations_replan_from_the_store(client2, monkeypatch):
    from daskann.mgrit import _kernels, _run

    prop = linear.LinearPropagator.random_stable(5, seed=1)
    u0 = (np.ones(5),)
    kwargs = dict(levels=3, cfactor=4, tol=1e-13, max_iter=40, intervals_per_task=4)
    ref = MGRIT(prop, u0, 64, scheduler=None, **kwargs).solve()
    replans = []
    original = _run.SolveRun._replan

    def spy(self):
        replans.append(self.iteration)
        return original(self)

    def clear():
        _kernels._KEPT.clear()

    def forget(info):  # as if the workers holding them had been replaced
        if info.iteration == 2:
            client2.run(clear)

    monkeypatch.setattr(_run.SolveRun, "_replan", spy)
    got = MGRIT(prop, u0, 64, scheduler=client2, callback=forget, **kwargs).solve()
    assert replans == [2]
    assert got.residuals == ref.residuals and np.array_equal(got.state[0], ref.state[0])
    assert not any(client2.run(lambda: len(_kernels._KEPT)).values())  # released at the end of the run


def test_task_sizes_give_each_worker_an_even_share():
    from daskann.mgrit._levels import Hierarchy
    from daskann.mgrit._plan import block_sizes, task_sizes

    h = Hierarchy(128, (4, 4))
    blocks = block_sizes(h, "auto")
    # cheap scheduler: two tasks per worker on each level; dear one: one task per worker
    assert task_sizes(h, blocks, lambda level: 1.0, step_seconds=1e-3, task_seconds=1e-4, workers=2) == (8, 2)
    assert task_sizes(h, blocks, lambda level: 1.0, step_seconds=1e-3, task_seconds=1.0, workers=2) == (16, 4)
    assert task_sizes(h, blocks, lambda level: 1.0, step_seconds=1e-3, task_seconds=1.0, workers=1) == (32, 8)


@pytest.mark.parametrize("cf_iter,cycle", [(1, "V"), (1, "F"), (0, "V")])
def test_an_inprocess_solve_touches_fewer_slots_than_a_dask_run(cf_iter, cycle):
    """In-process tasks run once, in order, in place: with FCF relaxation, four C-value slots of the fine level and
    one generation of v/g (less fresh memory to fault in); a dask run keeps five and two."""
    from daskann.mgrit._levels import Hierarchy
    from daskann.mgrit._plan import Planner

    h = Hierarchy(64, (4, 4))
    options = {"cf_iter": (cf_iter,) * 3, "weight_c": (1.0,) * 3, "cycle_type": cycle, "store_fine": False}
    touched = {}
    for sequential in (False, True):
        planner = Planner(h, {**options, "blocks": (4, 1)}, lambda level: 1.0, "p")
        planner.sequential = sequential
        slots, gens = set(), set()
        for k in range(1, 7):
            for task in planner.iteration(k):
                spec = task.spec
                if getattr(spec, "level", None) == 0 and hasattr(spec, "dst"):
                    slots |= {spec.dst} | ({spec.fuse_c} if spec.fuse_c is not None else set())
                if getattr(spec, "restrict", False):
                    gens.add((spec.level + 1, spec.gen_restrict))
        touched[sequential] = (len(slots | {0}), max(sum(g[0] == lvl for g in gens) for lvl in (1, 2)))
    # F-relaxation at the fine level: no C-relaxed copy to keep, and its final sweep corrects and restricts
    assert touched == ({False: (5, 2), True: (4, 1)} if cf_iter else {False: (3, 2), True: (3, 2)})


# -- the workers' heap ---------------------------------------------------------------------------------------


def test_heap_scope_with_and_without_the_nannys_trim_setting(monkeypatch, released_heap):
    heap_for_blocks = released_heap.heap_for_blocks

    for trim in (None, "65536"):
        if trim is None:
            monkeypatch.delenv("MALLOC_TRIM_THRESHOLD_", raising=False)
        else:
            monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", trim)
        with heap_for_blocks():
            a = np.ones(2**20)
        assert a.sum() == 2**20


def test_the_heap_is_kept_between_the_tasks_of_a_run(monkeypatch, released_heap):
    """The heap settings outlive a training task by KEEP_SECONDS, so the run's next task finds its memory mapped;
    one pending release serves every task that ends, and it gives the memory back only after a quiet spell."""
    heap = released_heap
    libc = heap._glibc()
    if libc is None or not sys.platform.startswith("linux"):
        pytest.skip("glibc's malloc only")
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "65536")
    monkeypatch.setattr(heap, "KEEP_SECONDS", 60.0)
    assert heap._heap_blocks() == heap.HEAP_BLOCKS  # not in a worker: no memory limit to respect
    with heap.heap_for_blocks():
        block = np.ones(2**22)
    del block
    pending = heap._release_timer
    assert heap._kept and heap._users == 0 and pending is not None and pending.interval == 60.0
    with heap.heap_for_blocks():  # the run's next task: still kept, no second timer
        assert heap._kept
    assert heap._release_timer is pending
    pending.cancel()
    heap._release(libc)  # the timer fires less than KEEP_SECONDS after the last task ended: wait on
    assert heap._kept and heap._release_timer is not None and heap._release_timer is not pending
    heap._release_timer.cancel()
    monkeypatch.setattr(heap, "_idle_since", heap._idle_since - 61.0)  # a quiet spell of KEEP_SECONDS
    heap._release(libc)
    assert not heap._kept and heap._release_timer is None


# -- training data -------------------------------------------------------------------------------------------


def test_training_data_travels_once_not_with_every_task(client2, monkeypatch):
    X, y, net, prop = _problem(n_samples=4096, lr=1e-3)
    graphs = []
    original = type(client2).get

    def spy(self, dsk, keys, **kwargs):
        graphs.append(dsk)
        return original(self, dsk, keys, **kwargs)

    monkeypatch.setattr(type(client2), "get", spy)
    result = MGRIT(
        prop,
        prop.initial_state(net),
        32,
        levels=2,
        cfactor=4,
        intervals_per_task=1,
        max_iter=2,
        scheduler=client2,
        tol=1e-300,
    ).solve()
    data_bytes = X.nbytes + y.nbytes
    for graph in graphs:
        for key, task in graph.items():
            assert key.startswith("daskann-mgrit-")
            assert len(pickle.dumps(task[1:])) < data_bytes / 10
    assert result.iterations == 2
