"""Matrices cut into blocks that live on the cells of a process grid.

A :class:`GridMatrix` is a ``rows x cols`` grid of blocks: block ``(i, j)``
covers rows ``row_bounds[i]`` and columns ``col_bounds[j]`` and is held by a
future on the worker of grid cell ``(i, j)``. It converts to and from a
chunked :class:`dask.array.Array` whose chunks are exactly these blocks.

Tasks on blocks go to the scheduler through a :class:`GraphBuilder`, each
restricted to one worker (``allow_other_workers=False``): soft restrictions
would let work stealing move block products off their cells. A whole
training step goes to the scheduler as one graph, which costs far less than
one ``client.submit`` per block product.

Tasks run in the order they were added, among those ready on a worker: each
gets a priority that falls with every task any builder adds. Dask's own
order would let a worker start the next product's first step before the
task that finishes the block another worker waits for (measured on the
4096-wide net on 1x2: a fifth of a second idle per step on one worker).
"""

from __future__ import annotations

import itertools
import uuid
from dataclasses import dataclass, field

import dask.array as da
import numpy as np
from dask.base import tokenize
from dask.highlevelgraph import HighLevelGraph, MaterializedLayer
from distributed import futures_of

from daskann import _wire
from daskann._compat import Task, TaskRef, parse_input
from daskann._validation import invalid
from daskann.npt._kernels import operand, view
from daskann.npt.grid import ProcessGrid, split_bounds


@dataclass(frozen=True)
class Block:
    """One stored block: a key, what to take from its value, and its shape.

    ``field`` picks an entry of a dict value; ``window = (r0, r1, c0, c1)``
    a part of the array (``None``: all of it).
    """

    key: str
    shape: tuple[int, int]
    field: str | None = None
    window: tuple[int, int, int, int] | None = None
    stored: tuple[int, int] | None = None

    @property
    def stored_shape(self) -> tuple[int, int]:
        """Shape of the whole stored array (a panel may hold several blocks)."""
        return self.stored or self.shape

    def spec(self, ref, window=None, transform=None):
        """Operand spec for a kernel, ``window`` relative to this block."""
        if window is not None and window == (0, self.shape[0], 0, self.shape[1]):
            window = None
        if window is None:
            combined = self.window
        elif self.window is None:
            combined = window
        else:
            r0, _, c0, _ = self.window
            combined = (r0 + window[0], r0 + window[1], c0 + window[2], c0 + window[3])
        return (ref, self.field, combined, transform)


@dataclass
class GridMatrix:
    """A block matrix on a process grid.

    Parameters
    ----------
    grid : ProcessGrid
    shape : (int, int)
    dtype : numpy dtype
    row_bounds, col_bounds : list of (start, stop)
        Rows and columns of each block; ``len(row_bounds) == grid.rows``
        and ``len(col_bounds) == grid.cols``.
    blocks : list of list of Block
    futures : dict of key -> Future
        Keeps the blocks alive on the cluster.
    transform : tuple or None
        ``(activation, negative_slope)`` when the matrix stands for the
        activation of the stored pre-activations.

    Examples
    --------
    >>> m = GridMatrix.from_numpy(client, np.ones((5, 3)), grid)   # doctest: +SKIP
    >>> m.to_dask().sum().compute()                               # doctest: +SKIP
    15.0
    """

    grid: ProcessGrid
    shape: tuple[int, int]
    dtype: np.dtype
    row_bounds: list[tuple[int, int]]
    col_bounds: list[tuple[int, int]]
    blocks: list[list[Block]]
    futures: dict = field(default_factory=dict, repr=False)
    transform: tuple | None = None
    placement: list | None = None

    def owner(self, i: int, j: int) -> str:
        """Worker holding block ``(i, j)``: its cell's, unless ``placement`` says otherwise."""
        if self.placement is not None:
            return self.placement[i][j]
        return self.grid.owner(i, j)

    # -- layout ---------------------------------------------------------------
    @staticmethod
    def layout(grid: ProcessGrid, shape) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
        """Row and column bounds of a matrix of ``shape`` on ``grid``."""
        return split_bounds(shape[0], grid.rows), split_bounds(shape[1], grid.cols)

    @property
    def chunks(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        return (tuple(b - a for a, b in self.row_bounds), tuple(b - a for a, b in self.col_bounds))

    def block(self, i: int, j: int) -> Block:
        return self.blocks[i][j]

    def keys(self) -> list[str]:
        return [b.key for row in self.blocks for b in row]

    def activated(self, activation: str, negative_slope: float) -> GridMatrix:
        """The same blocks read through a hidden-layer activation."""
        return GridMatrix(
            self.grid,
            self.shape,
            self.dtype,
            self.row_bounds,
            self.col_bounds,
            self.blocks,
            self.futures,
            (activation, float(negative_slope)),
            self.placement,
        )

    # -- in and out -----------------------------------------------------------
    @classmethod
    def from_numpy(cls, client, array, grid: ProcessGrid, *, name: str | None = None) -> GridMatrix:
        """Scatter the blocks of ``array`` to their cells' workers."""
        array = np.asarray(array)
        if array.ndim != 2:
            raise invalid("array", f"array of shape {array.shape}", "a 2-d array")
        name = name or f"daskann-npt-{uuid.uuid4().hex[:12]}-matrix"
        rows, cols = cls.layout(grid, array.shape)
        data, where = {}, {}
        blocks = []
        for i, (r0, r1) in enumerate(rows):
            line = []
            for j, (c0, c1) in enumerate(cols):
                key = f"{name}-{i}-{j}"
                data[key] = np.ascontiguousarray(array[r0:r1, c0:c1])
                where.setdefault(grid.owner(i, j), []).append(key)
                line.append(Block(key, (r1 - r0, c1 - c0)))
            blocks.append(line)
        futures = scatter_to(client, data, where)
        return cls(grid, array.shape, array.dtype, rows, cols, blocks, futures)

    @classmethod
    def from_dask(cls, client, array, grid: ProcessGrid, *, name: str | None = None) -> GridMatrix:
        """Lay a 2-d dask array onto ``grid`` (rechunked to the grid's blocks)."""
        if getattr(array, "ndim", None) != 2:
            raise invalid("array", type(array).__name__, "a 2-d dask array")
        rows, cols = cls.layout(grid, array.shape)
        chunks = (tuple(b - a for a, b in rows), tuple(b - a for a, b in cols))
        source = array.rechunk(chunks) if array.chunks != chunks else array
        persisted = client.persist(source)
        name = name or f"daskann-npt-{tokenize(source)}-{uuid.uuid4().hex[:8]}"
        builder = GraphBuilder(client, name)
        blocks, keep = [], {}
        inner = {f.key: f for f in futures_of(persisted)}
        for i, (r0, r1) in enumerate(rows):
            line = []
            for j, (c0, c1) in enumerate(cols):
                src = (persisted.name, i, j)
                key = builder.add(f"{name}-{i}-{j}", _identity, builder.ref(src), owner=grid.owner(i, j))
                line.append(Block(key, (r1 - r0, c1 - c0)))
            blocks.append(line)
        futures = builder.submit([b.key for line in blocks for b in line], keep=inner)
        del keep
        return cls(grid, tuple(array.shape), np.dtype(array.dtype), rows, cols, blocks, futures)

    def to_dask(self):
        """A chunked :class:`dask.array.Array` over the blocks (no data moves)."""
        name = f"{self.blocks[0][0].key}-dask-{uuid.uuid4().hex[:6]}"
        dsk = {}
        for i, line in enumerate(self.blocks):
            for j, b in enumerate(line):
                key = (name, i, j)
                if b.field is None and b.window is None and self.transform is None:
                    dsk[key] = self.futures[b.key]
                else:
                    # the future sits in the graph under its own key (keeping it alive), read through a window
                    source = (f"{name}-source", i, j)
                    dsk[source] = self.futures[b.key]
                    dsk[key] = Task(key, view, parse_input(b.spec(TaskRef(source), transform=self.transform)))
        graph = HighLevelGraph.from_collections(name, dsk, dependencies=())
        return da.Array(graph, name, self.chunks, dtype=self.dtype, shape=self.shape)

    def gather(self, client) -> np.ndarray:
        """The whole matrix as a numpy array on the client."""
        values = client.gather([self.futures[b.key] for line in self.blocks for b in line])
        out = np.empty(self.shape, dtype=self.dtype)
        k = 0
        for i, (r0, r1) in enumerate(self.row_bounds):
            for j, (c0, c1) in enumerate(self.col_bounds):
                b = self.blocks[i][j]
                out[r0:r1, c0:c1] = operand(b.spec(values[k], transform=self.transform))
                k += 1
        return out

    def release(self) -> None:
        """Drop this matrix's hold on its blocks."""
        self.futures = {}


def block_digests(parts) -> dict:
    """``{array: {"i.j": sha256}}`` from the ``[(array, "i.j", sha256), ...]`` the cells' save tasks return."""
    digests: dict = {}
    for part in parts:
        for array, index, digest in part:
            digests.setdefault(array, {})[index] = digest
    return digests


def blocks_to_dask(name: str, sources: list, reads: dict, chunks, dtype):
    """A dask array named ``name`` over blocks read where they live (no data moves).

    Chunk ``index`` is ``fn(sources[k], *args)`` for ``reads[index] = (k, fn, *args)``; the
    ``sources`` (futures) sit in the graph under keys of their own, keeping them alive.
    """
    dsk = {(f"{name}-source", k): future for k, future in enumerate(sources)}
    for index, (k, fn, *args) in reads.items():
        dsk[(name, *index)] = Task((name, *index), fn, TaskRef((f"{name}-source", k)), *args)
    graph = HighLevelGraph.from_collections(name, dsk, dependencies=())
    return da.Array(graph, name, chunks, dtype=dtype)


def scatter_to(client, data: dict, where: dict) -> dict:
    """Scatter ``data`` (key -> value) with each key on the worker ``where`` names."""
    futures = {}
    for worker, keys in where.items():
        futures.update(client.scatter({k: data[k] for k in keys}, workers=[worker], hash=False))
    return futures


#: one count for every task added in this process: earlier tasks take precedence
_added = itertools.count()


class GraphBuilder:
    """Collects tasks ``key -> func(*args)`` each pinned to one worker.

    Parameters
    ----------
    client : distributed.Client
    name : str
        Name of the graph layer (a per-run, per-step prefix).
    """

    def __init__(self, client, name: str):
        self.client = client
        self.name = name
        self.tasks: dict = {}
        self.owners: dict = {}
        self.priorities: dict = {}

    @staticmethod
    def ref(key) -> TaskRef:
        """A reference to the value of ``key`` (in this graph or on the cluster)."""
        return TaskRef(key)

    def add(self, key: str, func, *args, owner: str, **kwargs) -> str:
        """Add ``key = func(*args, **kwargs)`` to run on worker ``owner``."""
        if key in self.tasks:
            raise KeyError(f"task key {key!r} added twice")
        # results are stored as wire arrays, so that they reach other workers aligned
        self.tasks[key] = Task(
            key, _wire.call, func, *(parse_input(a) for a in args), **{k: parse_input(v) for k, v in kwargs.items()}
        )
        self.owners[key] = owner
        self.priorities[key] = -next(_added)
        return key

    def __len__(self) -> int:
        return len(self.tasks)

    def submit(self, keys, *, keep=None) -> dict:
        """Send the graph; futures of ``keys`` (a list) by key.

        ``keep`` (futures the graph reads) is held until the graph is sent.
        """
        if not self.tasks:
            return {}
        owners, priorities = self.owners, self.priorities
        layer = MaterializedLayer(
            dict(self.tasks),
            annotations={
                "workers": lambda k: [owners[k]],
                "allow_other_workers": False,
                "priority": lambda k: priorities[k],
            },
        )
        graph = HighLevelGraph({self.name: layer}, {self.name: set()})
        keys = list(keys)
        futures = self.client.get(graph, keys, sync=False)
        del keep
        self.tasks, self.owners, self.priorities = {}, {}, {}
        return dict(zip(keys, futures, strict=True))


def _identity(x):
    return x
