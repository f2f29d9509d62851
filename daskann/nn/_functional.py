"""Elementwise and blockwise pieces of forward and backward propagation.

Every function here works on whole arrays and on blocks of them alike, so the
grid methods can run the same arithmetic on their cells. Only the softmax
cross-entropy needs whole rows of the output layer.
"""

from __future__ import annotations

from typing import get_args

import numpy as np

from daskann._validation import Activation, Loss, Output

ACTIVATIONS = get_args(Activation)
OUTPUTS = get_args(Output)
LOSSES = get_args(Loss)


def sigmoid(z):
    """Logistic function ``1 / (1 + exp(-z))``, without overflow for large ``|z|``."""
    e = np.exp(-np.abs(z))
    one = e.dtype.type(1)
    return np.where(z >= 0, one / (one + e), e / (one + e))


def activate(z, activation, negative_slope=0.01):
    """Apply a hidden-layer activation to pre-activations ``z``."""
    if activation == "relu":
        return np.maximum(z, 0)
    if activation == "sigmoid":
        return sigmoid(z)
    if activation == "tanh":
        return np.tanh(z)
    return np.where(z > 0, z, z * z.dtype.type(negative_slope))


def activation_backward(dA, z, activation, negative_slope=0.01):
    """Gradient with respect to ``z`` given the gradient ``dA`` of ``activate(z)``."""
    if activation == "relu":
        return np.where(z > 0, dA, 0).astype(dA.dtype, copy=False)
    if activation in ("sigmoid", "tanh"):
        return output_backward(dA, activate(z, activation), activation)
    return np.where(z > 0, dA, dA * dA.dtype.type(negative_slope))


def output_activation(logits, output):
    """Network output from the last layer's pre-activation."""
    if output == "linear":
        return logits
    if output == "softmax":
        return softmax(logits)
    return activate(logits, output)


def output_backward(d_out, out, output):
    """Gradient with respect to the pre-activation given ``d_out`` and ``out = f(z)``.

    Uses the derivative written in the output itself: ``out * (1 - out)`` for
    sigmoid, ``1 - out**2`` for tanh and the softmax Jacobian-vector product.
    """
    if output == "linear":
        return d_out
    if output == "softmax":
        return out * (d_out - (d_out * out).sum(axis=1, keepdims=True))
    one = out.dtype.type(1)
    if output == "sigmoid":
        return d_out * (out * (one - out))
    return d_out * (one - out * out)


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


def dense_backward(dZ, X, W, *, input_grad=True):
    """Gradients of a dense layer (or block) ``Z = X @ W + b``.

    Returns ``(dX, dW, db)``; ``dX`` is ``dZ @ W.T`` (``None`` without
    ``input_grad``: the first layer's would be a whole product thrown away),
    ``dW`` is ``X.T @ dZ`` and ``db`` the column sums of ``dZ``.
    """
    return (dZ @ W.T if input_grad else None), X.T @ dZ, dZ.sum(axis=0)


def mse_loss(output, target):
    """Mean squared error over batch and outputs, as ``torch.nn.MSELoss``.

    Returns ``(loss, d_output)``.
    """
    diff = output - target
    loss = float(np.mean(diff * diff))
    return loss, diff * diff.dtype.type(2.0 / diff.size)


def sse_loss(output, target):
    """Half the sum of squared errors over rows and outputs, ``0.5 * sum((output - target)**2)``.

    The loss of classic backpropagation: its gradient is ``output - target``.
    Returns ``(loss, d_output)``.
    """
    diff = output - target
    return 0.5 * float(np.sum(diff * diff)), diff


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
    ``torch.nn.CrossEntropyLoss``); ``"mse"`` and ``"sse"`` compare the network
    output ``f(logits)`` (see :func:`output_activation`), so that ``"sse"`` with a
    sigmoid output gives the classic delta ``(out - y) * out * (1 - out)``.
    """
    if loss == "cross_entropy":
        return cross_entropy_loss(logits, target)
    out = output_activation(logits, output)
    value, d_out = (sse_loss if loss == "sse" else mse_loss)(out, target)
    return value, output_backward(d_out, out, output)
