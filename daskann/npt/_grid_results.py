"""The results of an NPT run read where they live: the final state on the grid's cells.

Both modes leave their final state on the cells (graph mode a ``GridState``, resident mode a
:class:`~daskann.npt.resident.ResidentState`); these helpers gather it, view its blocks as dask
arrays and predict from them without moving the model to the client; :class:`GridResults` gives
:class:`~daskann.npt.trainer.NPTTrainer` its fitted attributes through them.
"""

from __future__ import annotations

import operator
import uuid
from types import SimpleNamespace

import dask.array as da
import numpy as np
from dask.highlevelgraph import HighLevelGraph

from daskann import store
from daskann._compat import Task, TaskRef
from daskann._dask_input import is_dask_array
from daskann.nn import MLP, activate
from daskann.npt.graph_mode import GraphEngine


def is_resident(state) -> bool:
    """Whether a live final state is a resident run's (:class:`daskann.npt.resident.ResidentState`)."""
    return hasattr(state, "layout")


def state_client(state):
    """The client the futures of a final state belong to."""
    return next(iter(state.futures.values())).client


def gather_state(state, grid, sizes, settings: dict):
    """Model and velocity of a final state on ``grid``, gathered to the client."""
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
    name = f"{blocks[0].key}-dask-{uuid.uuid4().hex[:6]}"
    dsk = {}
    for j, blk in enumerate(blocks):
        dsk[(f"{name}-source", j)] = futures[blk.key]  # keeps the block alive
        dsk[(name, j)] = Task((name, j), operator.getitem, TaskRef((f"{name}-source", j)), blk.field)
    graph = HighLevelGraph.from_collections(name, dsk, dependencies=())
    chunks = (tuple(blk.shape[1] for blk in blocks),)
    return da.Array(graph, name, chunks, dtype=dtype, shape=(sum(chunks[0]),))


class GridResults:
    """Mixin of :class:`~daskann.npt.trainer.NPTTrainer`: its results read from where they live.

    After a run the final state stays on the grid's cells (``_grid_state``) and, with a checkpoint
    folder, in the last store they wrote (``_final_store``): ``model_`` and ``velocity_`` are read when
    first touched, ``weights_`` and ``biases_`` are dask arrays over the cells' blocks, and predictions
    run on the grid while the client does not hold the model. Reads the trainer's ``grid_``,
    ``client``, ``_sizes`` and ``_settings``.
    """

    @property
    def model_(self) -> MLP:
        """The trained network (numpy arrays), read when first touched.

        From the final checkpoint the grid's cells wrote, else gathered from the grid; until then
        the client holds no block.
        """
        if self.__dict__.get("_model") is None:
            self._load_final()
        return self._model

    @model_.setter
    def model_(self, value) -> None:
        self._model = value

    @property
    def velocity_(self) -> list:
        """SGD velocity per parameter (``model_.params`` order), read with :attr:`model_`."""
        if self.__dict__.get("_model") is None:
            self._load_final()
        return self._velocity

    @velocity_.setter
    def velocity_(self, value) -> None:
        self._velocity = value

    def _load_final(self) -> None:
        self._model, self._velocity = self._read_final()

    def _read_final(self) -> tuple:
        """Model and velocity from the last store the cells wrote, else gathered from the grid."""
        path = self.__dict__.get("_final_store")
        if path is not None:
            ckpt = store.load_checkpoint(path)
            return ckpt.model, ckpt.velocity
        state = self._live_grid_state()
        if state is None:
            raise AttributeError(f"{type(self).__name__} has no model_ (not fitted, or its grid is gone)")
        return self._gather_grid(state)

    def _gather_grid(self, state):
        """Model and velocity of a grid state, gathered to the client."""
        return gather_state(state, self.grid_, self._sizes, self._settings)

    def __sklearn_is_fitted__(self) -> bool:
        return any(self.__dict__.get(name) is not None for name in ("_model", "_final_store")) or (
            self._live_grid_state() is not None
        )

    def _grid_client(self):
        """The client of the final grid state while its cluster runs, else None."""
        state = self._live_grid_state()
        if state is None or self.__dict__.get("_model") is not None:
            return None
        return state_client(state)

    def _compute(self, array) -> np.ndarray:
        client = self._grid_client()
        return client.compute(array, sync=True) if client is not None else super()._compute(array)

    def _logits(self, X):
        """Computed on the grid, from :attr:`weights_`, while the client does not hold the model.

        Each layer is ``A @ W + b`` on dask arrays chunked as the grid's blocks; numpy ``X`` is
        scattered once (not held in the graph), dask-array ``X`` is read where it is and the result
        stays lazy.
        """
        client = self._grid_client()
        if client is None:
            return super()._logits(X)
        return grid_logits(client, X, self.weights_, self.biases_, self._settings)

    @property
    def weights_(self) -> list:
        """Trained weight matrices as dask arrays whose chunks are the grid's blocks, where they live.

        Built from the final state's block futures (in resident mode, chunked on the virtual Cannon
        grid's blocks): nothing moves until computed (on the trainer's client, e.g.
        ``client.compute(w)``). Once the embedded cluster of ``client=None`` is closed, numpy arrays
        of :attr:`model_`.
        """
        state = self._live_grid_state()
        if state is None:
            return super().weights_
        return state_weights(state)

    @property
    def biases_(self) -> list:
        """Trained bias vectors, as :attr:`weights_` (one chunk per grid column, on its column's first cell)."""
        state = self._live_grid_state()
        if state is None:
            return super().biases_
        return state_biases(state, self._settings["dtype"])

    def __getstate__(self):
        # the final state's futures belong to one live client, and a copy may load where neither the grid nor
        # the checkpoint folder is: the copy holds the model itself; the live trainer keeps reading where it is
        state = super().__getstate__()
        state.pop("_grid_state", None)
        if state.get("_model") is None and (
            state.get("_final_store") is not None or self._live_grid_state() is not None
        ):
            state["_model"], state["_velocity"] = self._read_final()
        return state

    def _live_grid_state(self):
        """The final graph-mode state while its cluster runs (an embedded cluster is closed after ``fit``)."""
        state = getattr(self, "_grid_state", None)
        if state is None or not state.futures:
            return None
        return state if state_client(state).status == "running" else None

    def _keep_if_closing(self) -> None:
        """Gather a final state held on the grid alone while its cluster runs, if that cluster closes after fit."""
        if self._final_store is None and self.client is None and self._live_grid_state() is not None:
            self.model_, self.velocity_ = self._gather_grid(self._grid_state)
