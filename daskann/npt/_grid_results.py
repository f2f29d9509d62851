"""The results of an NPT run read where they live: the final state on the grid's cells.

Both modes leave there one kind of :class:`FinalState` (graph mode a ``GridState``, resident mode a
:class:`~daskann.npt.resident.ResidentState`); :func:`grid_logits` predicts from its blocks without
moving the model to the client; :class:`GridResults` gives :class:`~daskann.npt.trainer.NPTTrainer`
its fitted attributes through it.
"""

from __future__ import annotations

from typing import Protocol

import dask.array as da
import numpy as np

from daskann import store
from daskann._dask_input import is_dask_array
from daskann.nn import MLP, activate


class FinalState(Protocol):
    """The state a run left on the grid's cells, read and written where it lives.

    ``client`` is the client its ``futures`` belong to; :meth:`gather` brings the model and its
    velocity to the client, :meth:`save` has the cells write a checkpoint store's blocks and returns
    their digests, :meth:`weights` and :meth:`biases` view the blocks as dask arrays.
    """

    futures: dict

    @property
    def client(self): ...

    def gather(self, settings: dict) -> tuple[MLP, list]: ...

    def save(self, tmp) -> dict: ...

    def weights(self) -> list: ...

    def biases(self) -> list: ...


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
        return state.gather(self._settings)

    def __sklearn_is_fitted__(self) -> bool:
        return any(self.__dict__.get(name) is not None for name in ("_model", "_final_store")) or (
            self._live_grid_state() is not None
        )

    def _grid_client(self):
        """The client of the final grid state while its cluster runs, else None."""
        state = self._live_grid_state()
        if state is None or self.__dict__.get("_model") is not None:
            return None
        return state.client

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
        return state.weights()

    @property
    def biases_(self) -> list:
        """Trained bias vectors, as :attr:`weights_` (one chunk per grid column, on its column's first cell)."""
        state = self._live_grid_state()
        if state is None:
            return super().biases_
        return state.biases()

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

    def _live_grid_state(self) -> FinalState | None:
        """The final state on the grid while its cluster runs (an embedded cluster is closed after ``fit``)."""
        state = getattr(self, "_grid_state", None)
        if state is None or not state.futures:
            return None
        return state if state.client.status == "running" else None

    def _keep_if_closing(self) -> None:
        """Gather a final state held on the grid alone while its cluster runs, if that cluster closes after fit."""
        if self._final_store is None and self.client is None and self._live_grid_state() is not None:
            self.model_, self.velocity_ = self._grid_state.gather(self._settings)
