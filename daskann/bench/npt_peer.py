"""The benchmark's peer: the same training written with dask.array's own ``@``.

Weights, biases and velocities are dask arrays with the chunks NPT uses on
the same grid (rows of ``W`` cut ``rows`` ways, columns ``cols`` ways; the
minibatch's rows ``rows`` ways), persisted after every step. Products are
dask.array's ``@`` (one task per block product, then a tree sum over the
contraction index, placed by the scheduler), elementwise work is dask.array
too. The arithmetic follows :class:`daskann.SerialTrainer`, so the peer also
serves as a check on the benchmark's numbers.
"""

from __future__ import annotations

import time
import uuid

import dask.array as da
import numpy as np
from dask.highlevelgraph import HighLevelGraph

from daskann.nn import MLP
from daskann.npt.grid import split_sizes


class DaskArrayPeer:
    """Minibatch SGD with momentum on dask arrays, as a baseline for NPT.

    Parameters
    ----------
    client : distributed.Client
    grid_shape : (int, int)
        ``(rows, cols)``: how every array is chunked.
    settings : dict
        Validated trainer settings (MSE or cross-entropy; a linear output layer).
    """

    def __init__(self, client, grid_shape, settings: dict):
        self.client = client
        self.rows, self.cols = grid_shape
        self.settings = settings

    def _scatter(self, array, chunks):
        """A dask array over blocks scattered to the cluster (the scheduler places them)."""
        name = f"daskann-peer-{uuid.uuid4().hex[:12]}"
        rows = np.concatenate([[0], np.cumsum(chunks[0])])
        cols = np.concatenate([[0], np.cumsum(chunks[1])])
        data = {
            f"{name}-{i}-{j}": np.ascontiguousarray(array[rows[i] : rows[i + 1], cols[j] : cols[j + 1]])
            for i in range(len(chunks[0]))
            for j in range(len(chunks[1]))
        }
        futures = self.client.scatter(data, hash=False)
        dsk = {(name, i, j): futures[f"{name}-{i}-{j}"] for i in range(len(chunks[0])) for j in range(len(chunks[1]))}
        graph = HighLevelGraph.from_collections(name, dsk, dependencies=())
        return da.Array(graph, name, chunks, dtype=array.dtype, shape=array.shape)

    def _chunks(self, shape):
        return (split_sizes(shape[0], self.rows), split_sizes(shape[1], self.cols))

    def fit(self, model: MLP, X, y, order, steps: int, *, lookahead: int = 1) -> dict:
        """Train ``steps`` steps from ``model``; returns ``{"model", "velocity", "losses", "times"}``."""
        s = self.settings
        dtype = model.dtype
        lr, momentum = dtype.type(s["lr"]), dtype.type(s["momentum"])
        # the data as column bands, scattered once; the parameters in the grid's chunks
        Xd = self._scatter(X, ((X.shape[0],), split_sizes(X.shape[1], self.cols)))
        cross_entropy = s["loss"] == "cross_entropy"
        yd = None if cross_entropy else self._scatter(y, ((y.shape[0],), split_sizes(y.shape[1], self.cols)))
        W = [self._scatter(w, self._chunks(w.shape)) for w in model.weights]
        b = [self._scatter(v[None, :], ((1,), split_sizes(v.shape[0], self.cols)))[0] for v in model.biases]
        vW = [da.zeros_like(w) for w in W]
        vb = [da.zeros_like(v) for v in b]
        vW, vb = self.client.persist(vW), self.client.persist(vb)
        losses, times, pending = [], [], []
        t0 = time.perf_counter()
        for step in range(steps):
            rows = order.indices(step)
            batch_chunks = split_sizes(len(rows), self.rows)
            A = Xd[rows].rechunk((batch_chunks, Xd.chunks[1]))
            inputs, pre = [], []
            for layer in range(len(W)):
                Z = A @ W[layer] + b[layer]
                inputs.append(A)
                pre.append(Z)
                A = _activate(Z, s) if layer < len(W) - 1 else Z
            loss, dZ = _cross_entropy(A, np.asarray(y)[rows], dtype) if cross_entropy else _mse(A, yd[rows], dtype)
            new_W, new_b, new_vW, new_vb = [None] * len(W), [None] * len(W), [None] * len(W), [None] * len(W)
            for layer in range(len(W) - 1, -1, -1):
                gW = inputs[layer].T @ dZ
                gb = dZ.sum(axis=0)
                if layer > 0:
                    dA = dZ @ W[layer].T
                    dZ = _activation_backward(dA, pre[layer - 1], s)
                new_vW[layer] = vW[layer] * momentum + gW if s["momentum"] else gW
                new_vb[layer] = vb[layer] * momentum + gb if s["momentum"] else gb
                new_W[layer] = W[layer] - lr * new_vW[layer]
                new_b[layer] = b[layer] - lr * new_vb[layer]
            L = len(W)
            state = self.client.persist([*new_W, *new_b, *new_vW, *new_vb, loss])
            W, b, vW, vb, loss = state[:L], state[L : 2 * L], state[2 * L : 3 * L], state[3 * L : 4 * L], state[-1]
            pending.append(loss)
            if len(pending) > lookahead:
                losses.append(float(self.client.compute(pending.pop(0)).result()))
                times.append(time.perf_counter() - t0)
        for loss in pending:
            losses.append(float(self.client.compute(loss).result()))
            times.append(time.perf_counter() - t0)
        trained, velocity = self._gathered(model, W, b, vW, vb)
        return {"model": trained, "velocity": velocity, "losses": losses, "times": times}

    def _gathered(self, model: MLP, W, b, vW, vb) -> tuple:
        """The trained model and its velocities (``[vW0, vb0, vW1, ...]``) as numpy, from the cluster."""
        L = len(W)
        values = self.client.gather(self.client.compute([*W, *b, *vW, *vb]))
        weights, biases, vW, vb = values[:L], values[L : 2 * L], values[2 * L : 3 * L], values[3 * L :]
        velocity = [np.asarray(v) for pair in zip(vW, vb, strict=True) for v in pair]
        trained = MLP.from_arrays(
            [np.asarray(w) for w in weights],
            [np.asarray(v) for v in biases],
            activation=model.activation,
            output=model.output,
            negative_slope=model.negative_slope,
        )
        return trained, velocity


def _cross_entropy(A, labels, dtype) -> tuple:
    """Mean cross-entropy of the logits ``A`` against integer ``labels``, and its gradient."""
    n = len(labels)
    onehot = np.zeros((n, A.shape[1]), dtype=dtype)
    onehot[np.arange(n), labels] = 1
    onehot = da.from_array(onehot, chunks=A.chunks)
    shifted = A - A.max(axis=1, keepdims=True)
    log_norm = da.log(da.exp(shifted).sum(axis=1))
    loss = (log_norm - (shifted * onehot).sum(axis=1)).mean()
    return loss, (da.exp(shifted - log_norm[:, None]) - onehot) * dtype.type(1.0 / n)


def _mse(A, target, dtype) -> tuple:
    """Mean squared error of ``A`` against ``target`` (rechunked as ``A``), and its gradient."""
    diff = A - target.rechunk(A.chunks)
    return (diff * diff).mean(), diff * dtype.type(2.0 / diff.size)


def _activate(Z, s):
    if s["activation"] == "relu":
        return da.maximum(Z, 0)
    return da.where(Z > 0, Z, Z * Z.dtype.type(s["negative_slope"]))


def _activation_backward(dA, Z, s):
    if s["activation"] == "relu":
        return da.where(Z > 0, dA, 0).astype(dA.dtype)
    return da.where(Z > 0, dA, dA * dA.dtype.type(s["negative_slope"]))
