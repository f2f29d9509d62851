"""An independent float64 implementation of MLP training, for checking daskann.

Written from the definitions (PyTorch's Linear, ReLU, LeakyReLU, Sigmoid, Tanh,
MSELoss, CrossEntropyLoss and SGD, and the half sum of squared errors of classic
backpropagation) with explicit loops over layers and samples where that keeps
it obviously right; it shares no code with daskann. ``bs=None`` is a network
without biases.
"""

from __future__ import annotations

import math

import numpy as np


def act(z, kind, slope=0.01):
    if kind == "linear":
        return z.copy()
    if kind == "sigmoid":
        return np.array([1.0 / (1.0 + math.exp(-v)) for v in z])
    if kind == "tanh":
        return np.array([math.tanh(v) for v in z])
    out = z.copy()
    neg = z <= 0
    out[neg] = 0.0 if kind == "relu" else slope * z[neg]
    return out


def act_grad(z, kind, slope=0.01):
    """Derivative of ``act`` at ``z``, from the definitions (not from the output)."""
    if kind == "linear":
        return np.ones_like(z)
    if kind == "sigmoid":
        return np.array([math.exp(-v) / (1.0 + math.exp(-v)) ** 2 for v in z])
    if kind == "tanh":
        return np.array([1.0 / math.cosh(v) ** 2 for v in z])
    g = np.ones_like(z)
    g[z <= 0] = 0.0 if kind == "relu" else slope
    return g


def loss_and_grads(Ws, bs, X, y, *, activation, loss, output="linear"):
    """Loss and gradients, per-sample accumulation of the chain rule.

    ``output`` is applied to the last layer for ``"mse"`` and ``"sse"``;
    ``"cross_entropy"`` takes the softmax of the last pre-activation.
    """
    n = X.shape[0]
    L = len(Ws)
    gW = [np.zeros_like(W) for W in Ws]
    gb = None if bs is None else [np.zeros_like(b) for b in bs]
    total = 0.0
    for s in range(n):
        a = [X[s]]
        z = []
        for layer in range(L):
            z.append(a[-1] @ Ws[layer] + (0.0 if bs is None else bs[layer]))
            a.append(act(z[-1], activation) if layer < L - 1 else z[-1])
        out = a[-1]
        if loss in ("mse", "sse"):
            out = act(z[-1], output)
            diff = out - y[s]
            scale = 1.0 / (n * out.size) if loss == "mse" else 0.5
            total += scale * float(np.sum(diff**2))
            delta = 2.0 * scale * diff * act_grad(z[-1], output)
        else:
            m = max(out)
            logsum = m + math.log(sum(math.exp(v - m) for v in out))
            total += (logsum - out[y[s]]) / n
            p = np.exp(out - logsum)
            p[y[s]] -= 1.0
            delta = p / n
        for layer in range(L - 1, -1, -1):
            gW[layer] += np.outer(a[layer], delta)
            if gb is not None:
                gb[layer] += delta
            if layer > 0:
                delta = (Ws[layer] @ delta) * act_grad(z[layer - 1], activation)
    return total, gW, gb


def init(sizes, seed, bias=True):
    """torch.nn.Linear's default, U(-1/sqrt(n_in), 1/sqrt(n_in)) for W and b, drawn in 128 x 128 tiles.

    Tile ``(ti, tj)`` of layer ``l``'s W comes from ``default_rng([seed, l, 0, ti, tj])``, piece ``tj`` of
    its bias from ``default_rng([seed, l, 1, 0, tj])`` (edge tiles are cut to the matrix).
    """
    Ws, bs = [], []
    for layer, (n_in, n_out) in enumerate(zip(sizes[:-1], sizes[1:], strict=True)):
        k = 1.0 / math.sqrt(n_in)
        W = np.zeros((n_in, n_out))
        for r in range(0, n_in, 128):
            for c in range(0, n_out, 128):
                tile = np.random.default_rng([seed, layer, 0, r // 128, c // 128])
                W[r : r + 128, c : c + 128] = tile.uniform(-k, k, (min(n_in - r, 128), min(n_out - c, 128)))
        Ws.append(W)
        if bias:
            pieces = [np.random.default_rng([seed, layer, 1, 0, c // 128]) for c in range(0, n_out, 128)]
            bs.append(np.concatenate([g.uniform(-k, k, min(n_out - 128 * t, 128)) for t, g in enumerate(pieces)]))
    return Ws, (bs if bias else None)


def rows_of_step(step, n, batch_size, seed, shuffle=True):
    """Seeded epoch permutations; ``batch_size=None``: all rows; ``"serialized"``: row ``step mod n``."""
    if shuffle == "serialized":
        return [step % n]
    if batch_size is None:
        return list(range(n))
    epoch, k = divmod(step, n // batch_size)
    perm = np.random.default_rng([seed, epoch]).permutation(n)
    return perm[k * batch_size : (k + 1) * batch_size]


def train(
    X, y, sizes, *, activation, loss, lr, momentum, batch_size, steps, seed, output="linear", bias=True, shuffle=True
):
    """SGD with momentum over the documented batch order."""
    Ws, bs = init(sizes, seed, bias)
    vW = [np.zeros_like(W) for W in Ws]
    vb = [np.zeros_like(b) for b in (bs or [])]
    losses = []
    for step in range(steps):
        rows = rows_of_step(step, X.shape[0], batch_size, seed, shuffle)
        value, gW, gb = loss_and_grads(Ws, bs, X[rows], y[rows], activation=activation, loss=loss, output=output)
        losses.append(value)
        for p, g, v in zip(Ws + (bs or []), gW + (gb or []), vW + vb, strict=True):
            v[...] = momentum * v + g
            p -= lr * v
    return Ws, bs, vW, (vb if bias else None), losses
