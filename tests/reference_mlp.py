"""An independent float64 implementation of MLP training, for checking daskann.

Written from the definitions (PyTorch's Linear, ReLU, LeakyReLU, MSELoss,
CrossEntropyLoss and SGD) with explicit loops over layers and samples where
that keeps it obviously right; it shares no code with daskann.
"""

from __future__ import annotations

import math

import numpy as np


def act(z, kind, slope=0.01):
    out = z.copy()
    neg = z <= 0
    out[neg] = 0.0 if kind == "relu" else slope * z[neg]
    return out


def act_grad(z, kind, slope=0.01):
    g = np.ones_like(z)
    g[z <= 0] = 0.0 if kind == "relu" else slope
    return g


def loss_and_grads(Ws, bs, X, y, *, activation, loss):
    """Loss and gradients, per-sample accumulation of the chain rule."""
    n = X.shape[0]
    L = len(Ws)
    gW = [np.zeros_like(W) for W in Ws]
    gb = [np.zeros_like(b) for b in bs]
    total = 0.0
    for s in range(n):
        a = [X[s]]
        z = []
        for layer in range(L):
            z.append(a[-1] @ Ws[layer] + bs[layer])
            a.append(act(z[-1], activation) if layer < L - 1 else z[-1])
        out = a[-1]
        if loss == "mse":
            diff = out - y[s]
            total += float(np.sum(diff**2)) / (n * out.size)
            delta = 2.0 * diff / (n * out.size)
        else:
            m = max(out)
            logsum = m + math.log(sum(math.exp(v - m) for v in out))
            total += (logsum - out[y[s]]) / n
            p = np.exp(out - logsum)
            p[y[s]] -= 1.0
            delta = p / n
        for layer in range(L - 1, -1, -1):
            gW[layer] += np.outer(a[layer], delta)
            gb[layer] += delta
            if layer > 0:
                delta = (Ws[layer] @ delta) * act_grad(z[layer - 1], activation)
    return total, gW, gb


def init(sizes, seed):
    """torch.nn.Linear's default: U(-1/sqrt(n_in), 1/sqrt(n_in)) for W and b, drawn W then b per layer."""
    rng = np.random.default_rng(seed)
    Ws, bs = [], []
    for n_in, n_out in zip(sizes[:-1], sizes[1:]):
        k = 1.0 / math.sqrt(n_in)
        Ws.append(rng.uniform(-k, k, (n_in, n_out)))
        bs.append(rng.uniform(-k, k, n_out))
    return Ws, bs


def train(X, y, sizes, *, activation, loss, lr, momentum, batch_size, steps, seed):
    """SGD with momentum over the documented batch order (seeded epoch permutations)."""
    Ws, bs = init(sizes, seed)
    vW = [np.zeros_like(W) for W in Ws]
    vb = [np.zeros_like(b) for b in bs]
    per_epoch = X.shape[0] // batch_size
    losses = []
    for step in range(steps):
        epoch, k = divmod(step, per_epoch)
        perm = np.random.default_rng([seed, epoch]).permutation(X.shape[0])
        rows = perm[k * batch_size : (k + 1) * batch_size]
        value, gW, gb = loss_and_grads(Ws, bs, X[rows], y[rows], activation=activation, loss=loss)
        losses.append(value)
        for p, g, v in zip(Ws + bs, gW + gb, vW + vb):
            v[...] = momentum * v + g
            p -= lr * v
    return Ws, bs, vW, vb, losses
