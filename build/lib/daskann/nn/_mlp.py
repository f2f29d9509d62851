"""The multi-layer perceptron every daskann method trains."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from daskann._validation import check_choice, check_float_dtype, check_sizes
from daskann.nn._functional import (
    ACTIVATIONS,
    LOSSES,
    OUTPUTS,
    activate,
    activation_backward,
    dense_backward,
    dense_forward,
    output_loss,
    softmax,
)


class MLP:
    """Fully connected network with ReLU or Leaky ReLU hidden layers.

    A dense layer is ``Z = X @ W + b`` with ``W`` of shape ``(n_in, n_out)``.

    Parameters
    ----------
    sizes : sequence of int
        Layer widths from input to output, at least two entries.
    activation : {"relu", "leaky_relu"}
        Hidden-layer activation.
    output : {"linear", "softmax"}
        Output activation applied by :meth:`predict`.
    dtype : {"float64", "float32"}
        Floating point type of every parameter.
    seed : int
        Seed of the initialisation: ``U(-1/sqrt(n_in), 1/sqrt(n_in))`` for
        weights and biases alike, as ``torch.nn.Linear``.
    negative_slope : float
        Slope of Leaky ReLU for negative inputs.

    Attributes
    ----------
    weights : list of ndarray
    biases : list of ndarray

    Examples
    --------
    >>> net = MLP([4, 8, 2], seed=0)
    >>> net.predict(np.zeros((3, 4))).shape
    (3, 2)
    """

    def __init__(
        self,
        sizes: Sequence[int],
        *,
        activation: str = "relu",
        output: str = "linear",
        dtype="float64",
        seed: int = 0,
        negative_slope: float = 0.01,
    ):
        self.sizes = check_sizes(sizes)
        self.activation = check_choice("activation", activation, ACTIVATIONS)
        self.output = check_choice("output", output, OUTPUTS)
        self.dtype = check_float_dtype(dtype)
        self.negative_slope = float(negative_slope)
        self.seed = seed
        rng = np.random.default_rng(seed)
        self.weights, self.biases = [], []
        for n_in, n_out in zip(self.sizes[:-1], self.sizes[1:]):
            bound = 1.0 / np.sqrt(n_in)
            self.weights.append(rng.uniform(-bound, bound, (n_in, n_out)).astype(self.dtype))
            self.biases.append(rng.uniform(-bound, bound, n_out).astype(self.dtype))

    @classmethod
    def from_arrays(
        cls,
        weights: Sequence[np.ndarray],
        biases: Sequence[np.ndarray],
        *,
        activation: str = "relu",
        output: str = "linear",
        negative_slope: float = 0.01,
    ) -> MLP:
        """Build a network from given weight and bias arrays (copied)."""
        if len(weights) != len(biases) or not weights:
            raise ValueError(
                f"weights and biases must be non-empty lists of equal length, "
                f"got {len(weights)} weights and {len(biases)} biases"
            )
        sizes = [np.shape(weights[0])[0]] + [np.shape(w)[1] for w in weights]
        for i, (w, b) in enumerate(zip(weights, biases)):
            if np.ndim(w) != 2 or np.shape(w)[0] != sizes[i] or np.shape(b) != (sizes[i + 1],):
                raise ValueError(
                    f"layer {i}: weights shape {np.shape(w)} and biases shape {np.shape(b)} "
                    f"do not chain; expected ({sizes[i]}, n_out) and (n_out,)"
                )
        dtype = np.result_type(*weights, *biases)
        net = cls.__new__(cls)
        net.sizes = tuple(int(s) for s in sizes)
        net.activation = check_choice("activation", activation, ACTIVATIONS)
        net.output = check_choice("output", output, OUTPUTS)
        net.dtype = check_float_dtype(dtype)
        net.negative_slope = float(negative_slope)
        net.seed = None
        net.weights = [np.array(w, dtype=net.dtype) for w in weights]
        net.biases = [np.array(b, dtype=net.dtype) for b in biases]
        return net

    # -- structure -----------------------------------------------------------
    @property
    def n_layers(self) -> int:
        """Number of dense layers."""
        return len(self.weights)

    @property
    def n_parameters(self) -> int:
        """Number of weights and biases."""
        return sum(w.size + b.size for w, b in zip(self.weights, self.biases))

    @property
    def params(self) -> list[np.ndarray]:
        """All parameter arrays, weights then biases per layer (not copied)."""
        return [p for wb in zip(self.weights, self.biases) for p in wb]

    def get_config(self) -> dict:
        """JSON-safe description of the architecture."""
        return {
            "sizes": list(self.sizes),
            "activation": self.activation,
            "output": self.output,
            "dtype": self.dtype.name,
            "negative_slope": self.negative_slope,
        }

    def copy(self) -> MLP:
        """Deep copy."""
        return MLP.from_arrays(
            self.weights,
            self.biases,
            activation=self.activation,
            output=self.output,
            negative_slope=self.negative_slope,
        )

    def __repr__(self) -> str:
        return (
            f"MLP(sizes={list(self.sizes)}, activation={self.activation!r}, "
            f"output={self.output!r}, dtype={self.dtype.name!r})"
        )

    # -- propagation ---------------------------------------------------------
    def forward(self, X: np.ndarray, *, return_cache: bool = False):
        """Logits (last pre-activation); with ``return_cache`` also the
        ``(inputs, pre_activations)`` of every layer for :meth:`backward`."""
        A = np.asarray(X, dtype=self.dtype)
        inputs, pre = [], []
        for layer, (W, b) in enumerate(zip(self.weights, self.biases)):
            Z = dense_forward(A, W, b)
            inputs.append(A)
            pre.append(Z)
            A = activate(Z, self.activation, self.negative_slope) if layer < self.n_layers - 1 else Z
        return (A, (inputs, pre)) if return_cache else A

    def backward(self, d_logits: np.ndarray, cache):
        """Gradients ``(grad_weights, grad_biases)`` given ``d loss / d logits``."""
        inputs, pre = cache
        grad_w = [None] * self.n_layers
        grad_b = [None] * self.n_layers
        dZ = d_logits
        for layer in range(self.n_layers - 1, -1, -1):
            dA, grad_w[layer], grad_b[layer] = dense_backward(dZ, inputs[layer], self.weights[layer])
            if layer > 0:
                dZ = activation_backward(dA, pre[layer - 1], self.activation, self.negative_slope)
        return grad_w, grad_b

    def loss_and_gradients(self, X, y, loss: str):
        """Loss value and gradients of all parameters for one batch."""
        check_choice("loss", loss, LOSSES)
        logits, cache = self.forward(X, return_cache=True)
        value, d_logits = output_loss(logits, y, loss=loss, output=self.output)
        grad_w, grad_b = self.backward(d_logits, cache)
        return value, grad_w, grad_b

    def loss(self, X, y, loss: str) -> float:
        """Loss value on a data set, without gradients."""
        check_choice("loss", loss, LOSSES)
        return output_loss(self.forward(X), y, loss=loss, output=self.output)[0]

    def predict(self, X) -> np.ndarray:
        """Network output: logits for ``output="linear"``, probabilities for ``"softmax"``."""
        logits = self.forward(X)
        return softmax(logits) if self.output == "softmax" else logits

    def predict_class(self, X) -> np.ndarray:
        """Index of the largest output per row."""
        return np.argmax(self.forward(X), axis=1)

    def accuracy(self, X, labels) -> float:
        """Share of rows whose largest output is the label."""
        return float(np.mean(self.predict_class(X) == np.asarray(labels)))
