"""The results of an NPT run read where they live: the final state on the grid's cells.

Both modes leave their final state on the cells (graph mode a ``GridState``, resident mode a
:class:`~daskann.npt.resident.ResidentState`); these helpers gather it, view its blocks as dask
arrays and predict from them without moving the model to the client.
"""

from __future__ import annotations

import operator
import uuid
from types import SimpleNamespace

import numpy as np

from daskann._dask_input import is_dask_array
from daskann.nn import activate


def is_resident(state) -> bool:
    """Whether a live final state is a resident run's (:class:`daskann.npt.resident.ResidentState`)."""
    return hasattr(state, "layout")


def state_client(state):
    """The client the futures of a final state belong to."""
    return next(iter(state.futures.values())).client


def gather_state(state, grid, sizes, settings: dict):
    """Model and velocity of a final state on ``grid``, gathered to the client."""
    from daskann.npt.graph_mode import GraphEngine

    if is_resident(state):
        return state.gather(settings)
    engine = GraphEngine(state_client(state), grid, sizes=sizes, settings=settings, prefix="gather")
    like = SimpleNamespace(**{k: settings[k] for k in ("activation", "output", "negative_slope")})
    return engine.gather_state(state, like)


def state_weights(state) -> list:
    """The weights of a final state as dask arrays chunked as its blocks."""
    if is_resident(state):
        return state.weights()
    return [mat.to_dask() for mat in state.weights]


def state_biases(state, dtype) -> list:
    """The biases of a final state as dask arrays, one chunk per grid column."""
    if is_resident(state):
        return state.biases()
    return [_bias_to_dask(line, state.futures, np.dtype(dtype)) for line in state.biases]


def grid_logits(client, X, weights, biases, settings: dict):
    """The network's output on ``X`` from weight and bias dask arrays chunked as the grid's blocks.

    Each layer is ``A @ W + b``; numpy ``X`` is scattered once (not held in the graph), dask-array
    ``X`` is read where it is and the result stays lazy.
    """
    import dask.array as da

    lazy = is_dask_array(X)
    if not lazy:
        # a key of its own: a re-scattered twin of a key being released would lose its data
        X = da.from_delayed(client.scatter(X, hash=False), X.shape, dtype=X.dtype)
    A = X.rechunk({1: weights[0].chunks[0]})
    for W, b in zip(weights, biases, strict=True):
        Z = A @ W + b
        A = Z.map_blocks(activate, settings["activation"], settings["negative_slope"], dtype=Z.dtype)
    Z = Z.rechunk({1: -1})
    return Z if lazy else client.compute(Z, sync=True)


def _bias_to_dask(blocks, futures: dict, dtype):
    """A 1-d dask array over a layer's bias blocks (``{"b", "v"}`` dicts on the grid), read where they live."""
    import dask.array as da
    from dask.highlevelgraph import HighLevelGraph

    from daskann._compat import Task, TaskRef

    name = f"{blocks[0].key}-dask-{uuid.uuid4().hex[:6]}"
    dsk = {}
    for j, blk in enumerate(blocks):
        dsk[(f"{name}-source", j)] = futures[blk.key]  # keeps the block alive
        dsk[(name, j)] = Task((name, j), operator.getitem, TaskRef((f"{name}-source", j)), blk.field)
    graph = HighLevelGraph.from_collections(name, dsk, dependencies=())
    chunks = (tuple(blk.shape[1] for blk in blocks),)
    return da.Array(graph, name, chunks, dtype=dtype, shape=(sum(chunks[0]),))
