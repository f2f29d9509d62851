"""The multi-layer perceptron every daskann method trains, and the SGD that trains it."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from daskann._validation import (
    Activation,
    FloatDType,
    Output,
    check_choice,
    check_float_dtype,
    check_learning_rate,
    check_momentum,
    check_sizes,
    invalid,
)
from daskann.nn._functional import (
    ACTIVATIONS,
    LOSSES,
    OUTPUTS,
    activate,
    activation_backward,
    dense_backward,
    dense_forward,
    output_activation,
    output_loss,
)
from daskann.nn._init import check_seed, init_weights


class MLP:
    """Fully connected network with ReLU, Leaky ReLU, sigmoid or tanh hidden layers.

    A dense layer is ``Z = X @ W + b`` with ``W`` of shape ``(n_in, n_out)``, or
    ``Z = X @ W`` without biases.

    Parameters
    ----------
    sizes : sequence of int
        Layer widths from input to output, at least two entries.
    activation : {"relu", "leaky_relu", "sigmoid", "tanh"}
        Hidden-layer activation.
    output : {"linear", "softmax", "sigmoid", "tanh"}
        Output activation, applied by :meth:`predict` and by the ``"mse"`` and
        ``"sse"`` losses (``"cross_entropy"`` always takes the softmax of the
        last pre-activation).
    dtype : {"float64", "float32"}
        Floating point type of every parameter.
    seed : int or None
        Non-negative seed of the initialisation (``None``: a fresh one):
        ``U(-1/sqrt(n_in), 1/sqrt(n_in))`` for weights and biases alike, as
        ``torch.nn.Linear``. The values are layout-independent: each
        ``128 x 128`` tile of a weight matrix (and each 128-long piece of a
        bias) is drawn from its own stream
        ``numpy.random.default_rng([seed, layer, kind, tile_row, tile_col])``
        (``kind`` 0 for weights, 1 for biases, ``tile_row`` 0), so any block
        of any process grid is computed on its own and equals the same part
        of the whole matrix (see :func:`daskann.nn.init_weight_block`).
    negative_slope : float
        Slope of Leaky ReLU for negative inputs.
    bias : bool
        Whether the dense layers have biases.

    Attributes
    ----------
    weights : list of ndarray
    biases : list of ndarray
        Empty when ``bias`` is false.
    bias : bool

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
        activation: Activation = "relu",
        output: Output = "linear",
        dtype: FloatDType | np.dtype = "float64",
        seed: int = 0,
        negative_slope: float = 0.01,
        bias: bool = True,
    ):
        self.sizes = check_sizes(sizes)
        self.activation = check_choice("activation", activation, ACTIVATIONS)
        self.output = check_choice("output", output, OUTPUTS)
        self.dtype = check_float_dtype(dtype)
        self.negative_slope = float(negative_slope)
        self.bias = _check_bias(bias)
        self.seed = check_seed(seed)
        self.weights, self.biases = init_weights(self.sizes, self.seed, bias=self.bias, dtype=self.dtype)

    @classmethod
    def from_arrays(
        cls,
        weights: Sequence[np.ndarray],
        biases: Sequence[np.ndarray] | None = None,
        *,
        activation: str = "relu",
        output: str = "linear",
        negative_slope: float = 0.01,
        bias: bool = True,
    ) -> MLP:
        """Build a network from given weight and bias arrays (copied).

        With ``bias=False``, ``biases`` must be ``None`` or empty.
        """
        bias = _check_bias(bias)
        biases = _check_bias_arrays(weights, biases, bias)
        sizes = [np.shape(weights[0])[0]] + [np.shape(w)[1] for w in weights]
        for i, w in enumerate(weights):
            b_ok = not bias or np.shape(biases[i]) == (sizes[i + 1],)
            if np.ndim(w) != 2 or np.shape(w)[0] != sizes[i] or not b_ok:
                found = f" and biases shape {np.shape(biases[i])}" if bias else ""
                raise ValueError(
                    f"layer {i}: weights shape {np.shape(w)}{found} do not chain; "
                    f"expected ({sizes[i]}, n_out)" + (" and (n_out,)" if bias else "")
                )
        dtype = np.result_type(*weights, *biases)
        net = cls.__new__(cls)
        net.sizes = tuple(int(s) for s in sizes)
        net.activation = check_choice("activation", activation, ACTIVATIONS)
        net.output = check_choice("output", output, OUTPUTS)
        net.dtype = check_float_dtype(dtype)
        net.negative_slope = float(negative_slope)
        net.bias = bias
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
        return sum(p.size for p in self.params)

    @property
    def params(self) -> list[np.ndarray]:
        """All parameter arrays, weights then biases per layer (not copied)."""
        return self.interleave(self.weights, self.biases)

    def assign_params(self, arrays) -> None:
        """Make ``arrays``, in :attr:`params` order, the network's parameters (not copied)."""
        arrays, shapes = list(arrays), [p.shape for p in self.params]
        if [np.shape(a) for a in arrays] != shapes:
            raise invalid("arrays", f"{len(arrays)} arrays", f"arrays of the shapes of params: {shapes}")
        if self.bias:
            self.weights[:], self.biases[:] = arrays[0::2], arrays[1::2]
        else:
            self.weights[:] = arrays

    def interleave(self, weights, biases) -> list:
        """Per-layer ``weights`` and ``biases`` (or their gradients) in :attr:`params` order."""
        if not self.bias:
            return list(weights)
        return [p for wb in zip(weights, biases, strict=True) for p in wb]

    def get_config(self) -> dict:
        """JSON-safe description of the architecture (``"bias"`` only when false)."""
        config = {
            "sizes": list(self.sizes),
            "activation": self.activation,
            "output": self.output,
            "dtype": self.dtype.name,
            "negative_slope": self.negative_slope,
        }
        # absent means biases, so the descriptions (and run identities) of existing models do not change
        if not self.bias:
            config["bias"] = False
        return config

    def copy(self) -> MLP:
        """Deep copy."""
        return MLP.from_arrays(
            self.weights,
            self.biases,
            activation=self.activation,
            output=self.output,
            negative_slope=self.negative_slope,
            bias=self.bias,
        )

    def __repr__(self) -> str:
        return (
            f"MLP(sizes={list(self.sizes)}, activation={self.activation!r}, "
            f"output={self.output!r}, dtype={self.dtype.name!r}" + (")" if self.bias else ", bias=False)")
        )

    # -- propagation ---------------------------------------------------------
    def forward(self, X: np.ndarray, *, return_cache: bool = False):
        """Logits (last pre-activation); with ``return_cache`` also the
        ``(inputs, pre_activations)`` of every layer for :meth:`backward`."""
        A = np.asarray(X, dtype=self.dtype)
        inputs, pre = [], []
        for layer, W in enumerate(self.weights):
            Z = dense_forward(A, W, self.biases[layer] if self.bias else None)
            inputs.append(A)
            pre.append(Z)
            A = activate(Z, self.activation, self.negative_slope) if layer < self.n_layers - 1 else Z
        return (A, (inputs, pre)) if return_cache else A

    def backward(self, d_logits: np.ndarray, cache):
        """Gradients ``(grad_weights, grad_biases)`` given ``d loss / d logits``.

        ``grad_biases`` is empty for a network without biases.
        """
        inputs, pre = cache
        grad_w = [None] * self.n_layers
        grad_b = [None] * self.n_layers
        dZ = d_logits
        for layer in range(self.n_layers - 1, -1, -1):
            dA, grad_w[layer], grad_b[layer] = dense_backward(
                dZ, inputs[layer], self.weights[layer], input_grad=layer > 0
            )
            if layer > 0:
                dZ = activation_backward(dA, pre[layer - 1], self.activation, self.negative_slope)
        return grad_w, (grad_b if self.bias else [])

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
        """Network output: logits for ``output="linear"``, else the output activation of them."""
        return output_activation(self.forward(X), self.output)

    def predict_class(self, X) -> np.ndarray:
        """Index of the largest output per row."""
        return np.argmax(self.forward(X), axis=1)

    def accuracy(self, X, labels) -> float:
        """Share of rows whose largest output is the label."""
        return float(np.mean(self.predict_class(X) == np.asarray(labels)))


def _check_bias(bias) -> bool:
    if not isinstance(bias, (bool, np.bool_)):
        raise invalid("bias", bias, "True or False", TypeError)
    return bool(bias)


def _check_bias_arrays(weights, biases, bias: bool) -> list:
    """``biases`` as a list that matches ``weights`` and ``bias``."""
    if not weights:
        raise invalid("weights", weights, "a non-empty list of weight matrices")
    if not bias:
        if biases is not None and len(biases):
            raise invalid("biases", f"{len(biases)} arrays", "None or an empty list with bias=False")
        return []
    if biases is None or len(biases) != len(weights):
        found = None if biases is None else f"{len(biases)} arrays"
        raise invalid("biases", found, f"one bias vector per layer ({len(weights)}), or bias=False")
    return list(biases)


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
