"""Numeric core: networks, losses and the optimiser, numpy only."""

from daskann.nn._functional import (
    ACTIVATIONS,
    LOSSES,
    OUTPUTS,
    activate,
    activation_backward,
    cross_entropy_loss,
    dense_backward,
    dense_forward,
    mse_loss,
    output_activation,
    output_backward,
    output_loss,
    sigmoid,
    softmax,
    sse_loss,
)
from daskann.nn._init import TILE, init_bias_block, init_weight_block, init_weights
from daskann.nn._mlp import MLP, SGD

__all__ = [
    "ACTIVATIONS",
    "LOSSES",
    "MLP",
    "OUTPUTS",
    "SGD",
    "TILE",
    "activate",
    "activation_backward",
    "cross_entropy_loss",
    "dense_backward",
    "dense_forward",
    "init_bias_block",
    "init_weight_block",
    "init_weights",
    "mse_loss",
    "output_activation",
    "output_backward",
    "output_loss",
    "sigmoid",
    "softmax",
    "sse_loss",
]
