"""Elementwise and blockwise pieces of forward and backward propagation.

Every function here works on whole arrays and on blocks of them alike, so the
grid methods can run the same arithmetic on their cells. Only the softmax
cross-entropy needs whole rows of the output layer.
"""

from __future__ import annotations

import numpy as np

ACTIVATIONS = ("relu", "leaky_relu")
OUTPUTS = ("linear", "softmax")
LOSSES = ("mse", "cross_entropy")


def activate(z, activation, negative_slope=0.01):
    """Apply a hidden-layer activation to pre-activations ``z``."""
    if activation == "relu":
        return np.maximum(z, 0)
    return np.where(z > 0, z, z * z.dtype.type(negative_slope))


def activation_backward(dA, z, activation, negative_slope=0.01):
    """Gradient with respect to ``z`` given the gradient ``dA`` of ``activate(z)``."""
    if activation == "relu":
        return np.where(z > 0, dA, 0).astype(dA.dtype, copy=False)
    return np.where(z > 0, dA, dA * dA.dtype.type(negative_slope))


def softmax(z):
    """Row-wise softmax, stable for large logits."""
    shifted = z - z.max(axis=1, keepdims=True)
    e = np.exp(shifted)
    return e / e.sum(axis=1, keepdims=True)


def dense_forward(X, W, b=None):
    """``X @ W + b`` for a dense layer or a block of one."""
    Z = X @ W
    if b is not None:
        Z += b
    return Z


def dense_backward(dZ, X, W):
    """Gradients of a dense layer (or block) ``Z = X @ W + b``.

    Returns ``(dX, dW, db)``; ``dX`` is ``dZ @ W.T``, ``dW`` is ``X.T @ dZ`` and
    ``db`` the column sums of ``dZ``.
    """
    return dZ @ W.T, X.T @ dZ, dZ.sum(axis=0)


def mse_loss(output, target):
    """Mean squared error over batch and outputs, as ``torch.nn.MSELoss``.

    Returns ``(loss, d_output)``.
    """
    diff = output - target
    loss = float(np.mean(diff * diff))
    return loss, diff * diff.dtype.type(2.0 / diff.size)


def cross_entropy_loss(logits, labels):
    """Mean softmax cross-entropy with integer labels, from logits.

    Returns ``(loss, d_logits)``.
    """
    n = logits.shape[0]
    shifted = logits - logits.max(axis=1, keepdims=True)
    log_norm = np.log(np.exp(shifted).sum(axis=1))
    rows = np.arange(n)
    loss = float(np.mean(log_norm - shifted[rows, labels]))
    d_logits = np.exp(shifted - log_norm[:, None])
    d_logits[rows, labels] -= 1
    d_logits *= d_logits.dtype.type(1.0 / n)
    return loss, d_logits


def output_loss(logits, target, *, loss, output):
    """Loss and its gradient with respect to the last layer's pre-activation.

    ``"cross_entropy"`` always works on logits (softmax is part of the loss, as in
    ``torch.nn.CrossEntropyLoss``); ``"mse"`` compares the network output, which
    is the softmax of the logits when ``output="softmax"``.
    """
    if loss == "cross_entropy":
        return cross_entropy_loss(logits, target)
    if output == "linear":
        return mse_loss(logits, target)
    probs = softmax(logits)
    value, d_probs = mse_loss(probs, target)
    d_logits = probs * (d_probs - (d_probs * probs).sum(axis=1, keepdims=True))
    return value, d_logits
