"""Stochastic gradient descent with momentum, PyTorch semantics."""

from __future__ import annotations

import numpy as np

from daskann._validation import check_learning_rate, check_momentum


class SGD:
    """SGD with heavy-ball momentum as ``torch.optim.SGD``.

    ``v = momentum * v + g; w = w - lr * v`` with ``v`` starting at zero. The
    velocity is held outside the optimiser (see :meth:`init_state`) so that it
    can live on a grid cell or in a checkpoint beside the weights.

    Parameters
    ----------
    lr : float
        Learning rate, positive and finite.
    momentum : float
        Momentum factor in ``[0, 1)``.
    """

    def __init__(self, lr: float = 0.01, momentum: float = 0.0):
        self.lr = check_learning_rate(lr)
        self.momentum = check_momentum(momentum)

    def __repr__(self) -> str:
        return f"SGD(lr={self.lr!r}, momentum={self.momentum!r})"

    @staticmethod
    def init_state(params):
        """Zero velocity for each parameter array."""
        return [np.zeros_like(p) for p in params]

    def update(self, param: np.ndarray, grad: np.ndarray, velocity: np.ndarray) -> None:
        """Update one parameter array (or block) and its velocity in place."""
        dtype = param.dtype.type
        if self.momentum:
            velocity *= dtype(self.momentum)
            velocity += grad
            param -= dtype(self.lr) * velocity
        else:
            velocity[...] = grad
            param -= dtype(self.lr) * grad

    def update_into(self, param, grad, velocity, new_param, new_velocity) -> None:
        """:meth:`update` with its results written to ``new_param`` and ``new_velocity``.

        The same operations give the same bits, and ``param`` and ``velocity``
        stay as they were: a training loop that must fall back on the state
        before a step (when the new one is not finite) swaps two sets of arrays
        instead of copying its whole state at every step.
        """
        dtype = param.dtype.type
        if self.momentum:
            np.multiply(velocity, dtype(self.momentum), out=new_velocity)
            new_velocity += grad
        else:
            np.copyto(new_velocity, grad)
        np.multiply(new_velocity, dtype(self.lr), out=new_param)  # lr * v, then w minus it
        np.subtract(param, new_param, out=new_param)

    def step(self, params, grads, velocities) -> None:
        """Update every parameter array in place."""
        for p, g, v in zip(params, grads, velocities, strict=True):
            self.update(p, g, v)
