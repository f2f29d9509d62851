"""Training problems shared by the MGRIT test modules: an SGD propagator, serial training to compare with."""

from __future__ import annotations

import numpy as np

from daskann import SerialTrainer
from daskann.data import BatchOrder, make_linear
from daskann.mgrit import SGDPropagator
from daskann.nn import MLP


def _rel(a, b):
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def _flat(arrays):
    return np.concatenate([np.ravel(a) for a in arrays])


def _problem(n_samples=256, momentum=0.0, lr=1e-3, hidden=(16, 16), batch_size=16, **kwargs):
    X, y = make_linear(n_samples, 8, 1, seed=0)
    net = MLP((8, *hidden, 1), seed=0)
    order = BatchOrder(n_samples, batch_size, seed=0)
    prop = SGDPropagator(net, X, y, loss="mse", order=order, lr=lr, momentum=momentum, **kwargs)
    return X, y, net, prop


def _serial(X, y, steps, *, lr, momentum, hidden=(16, 16), batch_size=16):
    return SerialTrainer(hidden, lr=lr, batch_size=batch_size, seed=0, sgd={"momentum": momentum}).fit(
        X, y, steps=steps
    )
