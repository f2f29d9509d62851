"""Cannon-ordered block products on a process grid.

``C = op(A) @ op(B)`` where ``op`` is the identity or the transpose, each
matrix cut into blocks on the cells of a ``rows x cols`` grid
(:class:`~daskann.npt.matrix.GridMatrix`). Block ``(i, j)`` of ``C`` is
computed by tasks pinned to the worker of cell ``(i, j)``; the operand blocks
travel to it worker-to-worker.

**Generalised Cannon.** The contraction axis is cut at every block boundary
of either operand (their common refinement: ``q`` segments on a square grid
with matching blocks, at most ``rows + cols - 1`` on a rectangular one). Cell
``(i, j)`` visits the segments in cyclic order starting at ``(i + j) mod S``:
the skew of Cannon's algorithm, so that in any one step the cells of a grid
row read different blocks of ``A`` and the cells of a grid column different
blocks of ``B`` (no broadcast hot spot). On a square grid with matching
blocks this is exactly Cannon's algorithm: step ``s`` of cell ``(i, j)``
multiplies ``A(i, k) B(k, j)`` with ``k = (i + j + s) mod q``. Rectangular
grids and blocks that do not line up (the rows of ``W`` are cut ``rows``
ways, the columns of the activations ``cols`` ways) give steps of several
smaller products, each writing its window of the output block.

**Overlap and memory.** All steps of a product are submitted at once, as two
accumulation chains per cell (even and odd steps) joined by a final task: a
chain step becomes runnable when the previous step of its own chain is done,
so the operands of step ``s + 1`` travel while step ``s`` multiplies, and at
most two steps' operand blocks are in flight per cell. With ``chains=1``
the steps form one chain (fewer tasks; for blocks too small to hide a
transfer behind). With ``chains=0`` one task per output block runs all its
products in the same Cannon order (for blocks so small that the scheduler's
cost per task would dwarf them; the trainer picks this only then).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

import numpy as np
from distributed import default_client

from daskann._validation import check_int, invalid
from daskann.npt import _kernels
from daskann.npt.matrix import Block, GraphBuilder, GridMatrix


@dataclass(frozen=True)
class Term:
    """One block product of a step: stored block indices and windows."""

    a_index: tuple[int, int]
    a_window: tuple[int, int, int, int]
    b_index: tuple[int, int]
    b_window: tuple[int, int, int, int]
    out_window: tuple[int, int, int, int]


def overlaps(lo: int, hi: int, bounds) -> list[tuple[int, int, int]]:
    """``(index, start, stop)`` of each piece of ``bounds`` that meets ``[lo, hi)``."""
    out = []
    for k, (a, b) in enumerate(bounds):
        start, stop = max(lo, a), min(hi, b)
        if start < stop:
            out.append((k, start, stop))
    return out


def refine(a_bounds, b_bounds) -> list[tuple[int, int, int, int]]:
    """Common refinement of two partitions of one axis: ``(ia, ib, start, stop)``."""
    cuts = sorted({a for a, _ in a_bounds} | {b for b, _ in b_bounds} | {a_bounds[-1][1]})
    segments = []
    for lo, hi in zip(cuts[:-1], cuts[1:], strict=True):
        ia = next(k for k, (a, b) in enumerate(a_bounds) if a <= lo < b)
        ib = next(k for k, (a, b) in enumerate(b_bounds) if a <= lo < b)
        segments.append((ia, ib, lo, hi))
    return segments


def _op_bounds(m: GridMatrix, trans: bool):
    return (m.col_bounds, m.row_bounds) if trans else (m.row_bounds, m.col_bounds)


def plan_product(a: GridMatrix, b: GridMatrix, out_rows, out_cols, *, trans_a=False, trans_b=False):
    """Steps of every output cell: ``{(i, j): [[Term, ...], ...]}`` in Cannon order."""
    a_rows, a_cols = _op_bounds(a, trans_a)
    b_rows, b_cols = _op_bounds(b, trans_b)
    if a_cols[-1][1] != b_rows[-1][1]:
        raise invalid("b", f"matrix of shape {b.shape}", f"an inner dimension of {a_cols[-1][1]}, as op(a)")
    segments = refine(a_cols, b_rows)
    n_seg = len(segments)
    plan = {}
    for i, (r0, r1) in enumerate(out_rows):
        m_pieces = overlaps(r0, r1, a_rows)
        for j, (c0, c1) in enumerate(out_cols):
            n_pieces = overlaps(c0, c1, b_cols)
            steps = []
            for s in range(n_seg):
                ka, kb, k0, k1 = segments[(i + j + s) % n_seg]
                terms = []
                for p, m0, m1 in m_pieces:
                    for q, n0, n1 in n_pieces:
                        # windows in op() coordinates, relative to each block
                        aw = (m0 - a_rows[p][0], m1 - a_rows[p][0], k0 - a_cols[ka][0], k1 - a_cols[ka][0])
                        bw = (k0 - b_rows[kb][0], k1 - b_rows[kb][0], n0 - b_cols[q][0], n1 - b_cols[q][0])
                        a_index, a_window = ((ka, p), (aw[2], aw[3], aw[0], aw[1])) if trans_a else ((p, ka), aw)
                        b_index, b_window = ((q, kb), (bw[2], bw[3], bw[0], bw[1])) if trans_b else ((kb, q), bw)
                        terms.append(Term(a_index, a_window, b_index, b_window, (m0 - r0, m1 - r0, n0 - c0, n1 - c0)))
                steps.append(terms)
            plan[i, j] = steps
    return plan


def add_product(
    builder: GraphBuilder,
    a: GridMatrix,
    b: GridMatrix,
    *,
    name: str,
    trans_a: bool = False,
    trans_b: bool = False,
    out_rows=None,
    out_cols=None,
    chains: int = 2,
    finish=None,
    ledger=None,
) -> GridMatrix:
    """Add the tasks of ``op(a) @ op(b)`` to ``builder``; the result's blocks are pending keys.

    ``finish(i, j)`` gives the epilogue of block ``(i, j)`` (see
    :func:`~daskann.npt._kernels.block_product`) and the operand specs it
    reads. ``ledger`` (a :class:`TrafficLedger`) counts the bytes that
    operand blocks will move between workers.
    """
    grid = a.grid
    a_rows, _ = _op_bounds(a, trans_a)
    _, b_cols = _op_bounds(b, trans_b)
    out_rows = out_rows if out_rows is not None else GridMatrix.layout(grid, (a_rows[-1][1], 1))[0]
    out_cols = out_cols if out_cols is not None else GridMatrix.layout(grid, (1, b_cols[-1][1]))[1]
    shape = (out_rows[-1][1], out_cols[-1][1])
    dtype = np.result_type(a.dtype, b.dtype)
    plan = plan_product(a, b, out_rows, out_cols, trans_a=trans_a, trans_b=trans_b)
    ref = builder.ref
    blocks = []
    for i, (r0, r1) in enumerate(out_rows):
        line = []
        for j, (c0, c1) in enumerate(out_cols):
            owner = grid.owner(i, j)
            block = ((r1 - r0, c1 - c0), dtype, owner)
            epilogue, extras = finish(i, j) if finish is not None else (None, ())
            step_specs = [_term_specs(t, a, b, ref, trans_a, trans_b, block[0], owner, ledger) for t in plan[i, j]]
            _add_output_block(builder, f"{name}-{i}-{j}", step_specs, block, chains, (epilogue, tuple(extras)))
            line.append(Block(f"{name}-{i}-{j}", block[0]))
        blocks.append(line)
    return GridMatrix(grid, shape, np.dtype(dtype), list(out_rows), list(out_cols), blocks)


def _add_output_block(builder: GraphBuilder, key: str, step_specs: list, block: tuple, chains: int, finish) -> None:
    """The tasks of one output block: its Cannon steps' products, then ``finish`` (epilogue, extra specs).

    ``block`` is ``(shape, dtype, owner)``; ``step_specs`` the operand specs of each step, in Cannon order.
    """
    if chains == 0:
        # one task per output block: its products in Cannon order, all operands fetched at once
        _product_task(builder, key, None, [s for specs in step_specs for s in specs], block, finish=finish)
        return
    n_chains = min(chains, len(step_specs))
    heads = [None] * n_chains
    for pos, specs in enumerate(step_specs):
        chain = pos % n_chains
        acc = builder.ref(heads[chain]) if heads[chain] is not None else None
        if pos == len(step_specs) - 1 and n_chains == 1:
            heads[chain] = _product_task(builder, key, acc, specs, block, finish=finish)
        else:
            heads[chain] = _product_task(builder, f"{key}-k{pos}", acc, specs, block)
    if n_chains == 2:
        _product_task(builder, key, builder.ref(heads[0]), [], block, builder.ref(heads[1]), finish=finish)
    elif not step_specs:
        _product_task(builder, key, None, [], block, finish=finish)


def _product_task(builder: GraphBuilder, key: str, acc, specs, block: tuple, other=None, *, finish=None) -> str:
    """One :func:`~daskann.npt._kernels.block_product` task; with ``finish``, the block's last (adds ``other``)."""
    shape, dtype, owner = block
    if finish is None:
        return builder.add(key, _kernels.block_product, acc, specs, shape, dtype, owner=owner)
    return builder.add(key, _kernels.block_product, acc, specs, shape, dtype, other, *finish, owner=owner)


def _term_specs(terms, a, b, ref, trans_a, trans_b, block_shape, owner, ledger) -> list:
    specs = []
    for t in terms:
        ab = a.blocks[t.a_index[0]][t.a_index[1]]
        bb = b.blocks[t.b_index[0]][t.b_index[1]]
        specs.append(
            (
                ab.spec(ref(ab.key), t.a_window, a.transform),
                trans_a,
                bb.spec(ref(bb.key), t.b_window, b.transform),
                trans_b,
                _full_or(t.out_window, block_shape),
            )
        )
        if ledger is not None:
            ledger.fetch(ab.key, a.owner(*t.a_index), owner, _nbytes(ab, a.dtype))
            ledger.fetch(bb.key, b.owner(*t.b_index), owner, _nbytes(bb, b.dtype))
    return specs


def _full_or(window, shape):
    return None if window == (0, shape[0], 0, shape[1]) else window


def _nbytes(block: Block, dtype) -> int:
    return int(np.prod(block.stored_shape)) * np.dtype(dtype).itemsize


class TrafficLedger:
    """Bytes that operand blocks move between workers, counted once per (key, worker)."""

    def __init__(self):
        self._seen: set = set()
        self.bytes = 0

    def fetch(self, key: str, source: str, dest: str, nbytes: int) -> None:
        if source == dest or (key, dest) in self._seen:
            return
        self._seen.add((key, dest))
        self.bytes += nbytes


# -- public products ------------------------------------------------------------
def matmul(a, b, *, grid=None, client=None, trans_a: bool = False, trans_b: bool = False, chains: int = 2):
    """``op(a) @ op(b)`` by Cannon's algorithm on a process grid.

    Parameters
    ----------
    a, b : GridMatrix, dask.array.Array or numpy array
        Grid matrices must share one grid. Other arrays are laid onto
        ``grid`` first.
    grid : ProcessGrid, optional
        Needed when neither operand is a :class:`GridMatrix`.
    client : distributed.Client, optional
        Default: the current client.
    trans_a, trans_b : bool
        Use the transpose of ``a`` / ``b``.
    chains : {0, 1, 2}
        Accumulation chains per output block: 2 overlaps transfers with
        products; 0 runs all products of an output block in one task.

    Returns
    -------
    GridMatrix, or a dask array when ``a`` was a dask array.

    Examples
    --------
    >>> grid = ProcessGrid.from_client(client, "2x2")          # doctest: +SKIP
    >>> c = matmul(da.ones((6, 4)), da.ones((4, 5)), grid=grid) # doctest: +SKIP
    >>> c.compute()[0, 0]                                        # doctest: +SKIP
    4.0
    """
    chains = check_int("chains", chains, minimum=0, maximum=2)
    client = client or default_client()
    returns_dask = _is_dask(a)
    grids = [m.grid for m in (a, b) if isinstance(m, GridMatrix)]
    if grids:
        if grid is not None and grid != grids[0]:
            raise invalid("grid", grid, "the grid of the GridMatrix operands")
        grid = grids[0]
        if len(grids) == 2 and grids[0] != grids[1]:
            raise invalid("b", "a GridMatrix on another grid", "operands on one grid")
    elif grid is None:
        raise invalid("grid", None, "a ProcessGrid when no operand is a GridMatrix")
    a = _as_grid_matrix(client, a, grid, "a")
    b = _as_grid_matrix(client, b, grid, "b")
    a_cols = a.shape[0] if trans_a else a.shape[1]
    b_rows = b.shape[1] if trans_b else b.shape[0]
    if a_cols != b_rows:
        raise invalid(
            "b",
            f"matrix of shape {b.shape}",
            f"{'columns' if trans_b else 'rows'} matching the {a_cols} inner dimension of op(a)",
        )
    name = f"daskann-npt-{uuid.uuid4().hex[:12]}-matmul"
    builder = GraphBuilder(client, name)
    out = add_product(builder, a, b, name=name, trans_a=trans_a, trans_b=trans_b, chains=chains)
    out.futures = builder.submit(out.keys(), keep=[a.futures, b.futures])
    return out.to_dask() if returns_dask else out


def matmul_tn(a, b, **kwargs):
    """``a.T @ b`` by Cannon's algorithm (see :func:`matmul`)."""
    return matmul(a, b, trans_a=True, **kwargs)


def matmul_nt(a, b, **kwargs):
    """``a @ b.T`` by Cannon's algorithm (see :func:`matmul`)."""
    return matmul(a, b, trans_b=True, **kwargs)


def _is_dask(x) -> bool:
    return hasattr(x, "__dask_graph__") and hasattr(x, "chunks")


def _as_grid_matrix(client, x, grid, name) -> GridMatrix:
    if isinstance(x, GridMatrix):
        return x
    if _is_dask(x):
        return GridMatrix.from_dask(client, x, grid)
    array = np.asarray(x)
    if array.ndim != 2 or not np.issubdtype(array.dtype, np.number):
        raise invalid(name, f"array of shape {array.shape}", "a 2-d numeric array, dask array or GridMatrix", TypeError)
    return GridMatrix.from_numpy(client, array, grid)
