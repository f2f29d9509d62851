"""The numeric core: forward, backward, losses and SGD."""

from __future__ import annotations

import numpy as np
import pytest
from reference_mlp import loss_and_grads

from daskann.nn import MLP, SGD, cross_entropy_loss, dense_backward, mse_loss, output_loss, sigmoid, softmax, sse_loss


def _data(loss, n=12, n_in=5, n_out=3, seed=1):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, n_in))
    y = rng.integers(0, n_out, n) if loss == "cross_entropy" else rng.standard_normal((n, n_out))
    return X, y


@pytest.mark.parametrize("activation", ["relu", "leaky_relu"])
@pytest.mark.parametrize("loss", ["mse", "cross_entropy"])
def test_gradients_match_finite_differences(activation, loss):
    X, y = _data(loss)
    net = MLP([5, 7, 6, 3], activation=activation, seed=3)
    _, grad_w, grad_b = net.loss_and_gradients(X, y, loss)
    eps = 1e-6
    worst = 0.0
    for params, grads in ((net.weights, grad_w), (net.biases, grad_b)):
        for p, g in zip(params, grads, strict=True):
            numeric = np.zeros_like(p)
            for idx in np.ndindex(p.shape):
                old = p[idx]
                p[idx] = old + eps
                up = net.loss(X, y, loss)
                p[idx] = old - eps
                down = net.loss(X, y, loss)
                p[idx] = old
                numeric[idx] = (up - down) / (2 * eps)
            worst = max(worst, np.max(np.abs(numeric - g)) / max(np.max(np.abs(g)), 1e-12))
    assert worst < 1e-6


@pytest.mark.parametrize("activation", ["relu", "leaky_relu"])
@pytest.mark.parametrize("loss", ["mse", "cross_entropy"])
def test_gradients_match_independent_implementation(activation, loss):
    X, y = _data(loss)
    net = MLP([5, 8, 3], activation=activation, seed=4)
    value, grad_w, grad_b = net.loss_and_gradients(X, y, loss)
    ref_value, ref_w, ref_b = loss_and_grads(net.weights, net.biases, X, y, activation=activation, loss=loss)
    assert value == pytest.approx(ref_value, rel=1e-13)
    for g, r in zip(grad_w + grad_b, ref_w + ref_b, strict=True):
        np.testing.assert_allclose(g, r, rtol=1e-12, atol=1e-15)


def test_initialisation_is_seeded_and_typed():
    a, b = MLP([4, 6, 2], seed=5), MLP([4, 6, 2], seed=5)
    assert all(np.array_equal(x, y) for x, y in zip(a.params, b.params, strict=True))
    assert not np.array_equal(a.weights[0], MLP([4, 6, 2], seed=6).weights[0])
    net32 = MLP([4, 6, 2], dtype="float32")
    assert all(p.dtype == np.float32 for p in net32.params)
    assert net32.forward(np.ones((2, 4), np.float32)).dtype == np.float32
    assert np.all(np.abs(a.weights[0]) <= 0.5) and a.n_parameters == 4 * 6 + 6 + 6 * 2 + 2


def test_losses_follow_pytorch_definitions():
    out = np.array([[1.0, 2.0], [0.0, -1.0]])
    target = np.array([[0.0, 2.0], [1.0, 1.0]])
    value, grad = mse_loss(out, target)
    assert value == pytest.approx((1 + 0 + 1 + 4) / 4)
    np.testing.assert_allclose(grad, 2 * (out - target) / 4)
    logits = np.array([[1000.0, 0.0], [0.0, 0.0]])
    value, grad = cross_entropy_loss(logits, np.array([0, 1]))
    assert np.isfinite(value) and value == pytest.approx(np.log(2) / 2)
    np.testing.assert_allclose(softmax(logits).sum(axis=1), 1.0)


def test_softmax_output_with_mse_backpropagates_through_softmax():
    X, y = _data("mse")
    net = MLP([5, 4, 3], output="softmax", seed=2)
    _, grad_w, _ = net.loss_and_gradients(X, y, "mse")
    W = net.weights[0]
    eps = 1e-6
    W[0, 0] += eps
    up = net.loss(X, y, "mse")
    W[0, 0] -= 2 * eps
    down = net.loss(X, y, "mse")
    W[0, 0] += eps
    assert grad_w[0][0, 0] == pytest.approx((up - down) / (2 * eps), rel=1e-6)


def test_dense_backward_on_blocks_sums_to_whole():
    rng = np.random.default_rng(0)
    X, W, dZ = rng.standard_normal((6, 4)), rng.standard_normal((4, 5)), rng.standard_normal((6, 5))
    dX, dW, db = dense_backward(dZ, X, W)
    # the same gradient assembled from a 2x2 split of the contraction
    dW_blocks = dense_backward(dZ[:3], X[:3], W)[1] + dense_backward(dZ[3:], X[3:], W)[1]
    np.testing.assert_allclose(dW, dW_blocks, rtol=1e-14)
    np.testing.assert_allclose(dX[:, :2], dZ @ W[:2].T)
    np.testing.assert_allclose(db, dZ.sum(axis=0))


def test_sgd_follows_pytorch_momentum():
    w = np.array([1.0, 2.0])
    v = np.zeros(2)
    opt = SGD(lr=0.1, momentum=0.9)
    opt.update(w, np.array([1.0, 1.0]), v)
    np.testing.assert_allclose(w, [0.9, 1.9])
    opt.update(w, np.array([1.0, 1.0]), v)
    np.testing.assert_allclose(v, [1.9, 1.9])
    np.testing.assert_allclose(w, [0.9 - 0.19, 1.9 - 0.19])


@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_sgd_update_into_gives_the_bits_of_update(momentum):
    rng = np.random.default_rng(0)
    w, v, g = rng.standard_normal((3, 5, 7))
    opt = SGD(lr=0.037, momentum=momentum)
    new_w, new_v = np.empty_like(w), np.empty_like(v)
    before = w.copy(), v.copy()
    opt.update_into(w, g, v, new_w, new_v)
    np.testing.assert_array_equal(w, before[0])  # the state it started from is left alone
    np.testing.assert_array_equal(v, before[1])
    opt.update(w, g, v)
    np.testing.assert_array_equal(new_w, w)
    np.testing.assert_array_equal(new_v, v)


def test_assign_params_swaps_the_arrays_in():
    net = MLP([4, 3, 2], seed=0)
    arrays = [p + 1.0 for p in net.params]
    net.assign_params(arrays)
    assert all(p is a for p, a in zip(net.params, arrays, strict=True))
    with pytest.raises(ValueError, match="arrays"):
        net.assign_params(arrays[:-1])
    with pytest.raises(ValueError, match="arrays"):
        net.assign_params([np.zeros((1, 1))] * len(arrays))


@pytest.mark.parametrize(
    ("kwargs", "error", "name"),
    [
        ({"lr": 0.0}, ValueError, "lr"),
        ({"lr": float("nan")}, ValueError, "lr"),
        ({"lr": float("inf")}, ValueError, "lr"),
        ({"momentum": 1.0}, ValueError, "momentum"),
        ({"momentum": -0.1}, ValueError, "momentum"),
    ],
)
def test_sgd_rejects_bad_settings(kwargs, error, name):
    with pytest.raises(error, match=name):
        SGD(**kwargs)


@pytest.mark.parametrize(
    ("kwargs", "error", "name"),
    [
        ({"activation": "swish"}, ValueError, "activation='swish'.*'relu', 'leaky_relu', 'sigmoid', 'tanh'"),
        ({"output": "relu"}, ValueError, "output='relu'.*'linear', 'softmax', 'sigmoid', 'tanh'"),
        ({"bias": "no"}, TypeError, "bias='no'"),
        ({"dtype": "int32"}, TypeError, "dtype"),
        ({"dtype": "float16"}, TypeError, "dtype"),
    ],
)
def test_mlp_rejects_bad_settings(kwargs, error, name):
    with pytest.raises(error, match=name):
        MLP([3, 4, 2], **kwargs)


def test_mlp_rejects_bad_sizes_and_arrays():
    with pytest.raises(ValueError, match="sizes"):
        MLP([3])
    with pytest.raises(ValueError, match=r"sizes\[1\]"):
        MLP([3, 0, 2])
    with pytest.raises(ValueError, match="layer 1"):
        MLP.from_arrays([np.zeros((3, 4)), np.zeros((5, 2))], [np.zeros(4), np.zeros(2)])


# -- sigmoid and tanh, networks without biases, the "sse" loss ---------------------------------------

_CLASSIC = [
    ("sigmoid", "sigmoid", "sse", False),
    ("tanh", "tanh", "sse", False),
    ("tanh", "linear", "sse", True),
    ("sigmoid", "tanh", "mse", True),
    ("tanh", "sigmoid", "mse", False),
]


@pytest.mark.parametrize(("activation", "output", "loss", "bias"), _CLASSIC)
def test_classic_networks_match_finite_differences(activation, output, loss, bias):
    X, y = _data("mse")
    y = np.tanh(y) if output == "tanh" else 1 / (1 + np.exp(-y))
    net = MLP([5, 6, 3], activation=activation, output=output, bias=bias, seed=3)
    _, grad_w, grad_b = net.loss_and_gradients(X, y, loss)
    assert len(grad_b) == (2 if bias else 0)
    eps, worst = 1e-6, 0.0
    for p, g in zip(net.params, net.interleave(grad_w, grad_b), strict=True):
        numeric = np.zeros_like(p)
        for idx in np.ndindex(p.shape):
            old = p[idx]
            p[idx] = old + eps
            up = net.loss(X, y, loss)
            p[idx] = old - eps
            down = net.loss(X, y, loss)
            p[idx] = old
            numeric[idx] = (up - down) / (2 * eps)
        worst = max(worst, np.max(np.abs(numeric - g)) / max(np.max(np.abs(g)), 1e-12))
    assert worst < 1e-6


@pytest.mark.parametrize(("activation", "output", "loss", "bias"), _CLASSIC)
def test_classic_networks_match_independent_implementation(activation, output, loss, bias):
    X, y = _data("mse")
    net = MLP([5, 8, 3], activation=activation, output=output, bias=bias, seed=4)
    value, grad_w, grad_b = net.loss_and_gradients(X, y, loss)
    ref_value, ref_w, ref_b = loss_and_grads(
        net.weights, net.biases if bias else None, X, y, activation=activation, loss=loss, output=output
    )
    assert value == pytest.approx(ref_value, rel=1e-13)
    for g, r in zip(grad_w + grad_b, ref_w + (ref_b or []), strict=True):
        np.testing.assert_allclose(g, r, rtol=1e-12, atol=1e-15)


def test_sse_gives_the_classic_backpropagation_delta():
    out_z = np.array([[0.3, -1.2], [2.0, 0.1]])
    y = np.array([[1.0, 0.0], [0.0, 1.0]])
    value, d_out = sse_loss(out_z, y)
    assert value == pytest.approx(0.5 * np.sum((out_z - y) ** 2))
    np.testing.assert_array_equal(d_out, out_z - y)
    out = 1 / (1 + np.exp(-out_z))
    _, delta = output_loss(out_z, y, loss="sse", output="sigmoid")
    np.testing.assert_allclose(delta, (out - y) * out * (1 - out), rtol=1e-15)
    _, delta = output_loss(out_z, y, loss="sse", output="tanh")
    np.testing.assert_allclose(delta, (np.tanh(out_z) - y) * (1 - np.tanh(out_z) ** 2), rtol=1e-14)


def test_sigmoid_is_exact_and_quiet_for_large_inputs():
    z = np.array([-800.0, -30.0, 0.0, 30.0, 800.0])
    s = sigmoid(z)  # warnings are errors in the tests: no overflow in exp
    np.testing.assert_allclose(s[1:4], [1 / (1 + np.exp(30.0)), 0.5, 1 / (1 + np.exp(-30.0))], rtol=1e-15)
    assert s[0] == 0.0 and s[-1] == 1.0
    assert sigmoid(np.float32(-1.0)).dtype == np.float32


def test_network_without_biases():
    net = MLP([4, 6, 2], bias=False, seed=5, activation="tanh", output="sigmoid")
    assert net.biases == [] and net.params == net.weights and net.n_parameters == 4 * 6 + 6 * 2
    # the weights do not depend on whether there are biases (each layer's tiles have their own streams)
    assert all(np.array_equal(a, b) for a, b in zip(net.weights, MLP([4, 6, 2], seed=5).weights, strict=True))
    tile = np.random.default_rng([5, 1, 0, 0, 0]).uniform(-1 / np.sqrt(6), 1 / np.sqrt(6), (6, 2))
    assert np.array_equal(net.weights[1], tile)
    X = np.random.default_rng(0).standard_normal((3, 4))
    expected = 1 / (1 + np.exp(-(np.tanh(X @ net.weights[0]) @ net.weights[1])))
    np.testing.assert_allclose(net.predict(X), expected, rtol=1e-14)
    copy = net.copy()
    assert not copy.bias and copy.get_config()["bias"] is False and "bias=False" in repr(copy)
    assert "bias" not in MLP([4, 2]).get_config()
    built = MLP.from_arrays(net.weights, None, bias=False, activation="tanh")
    assert built.biases == [] and built.n_parameters == net.n_parameters


def test_from_arrays_checks_biases_against_bias():
    W = [np.zeros((3, 4)), np.zeros((4, 2))]
    with pytest.raises(ValueError, match="biases=.*bias=False"):
        MLP.from_arrays(W, [np.zeros(4), np.zeros(2)], bias=False)
    with pytest.raises(ValueError, match="biases=None.*one bias vector per layer"):
        MLP.from_arrays(W, None)
    with pytest.raises(ValueError, match="biases=.*one bias vector per layer"):
        MLP.from_arrays(W, [np.zeros(4)])


def test_unknown_loss_is_named():
    X, y = _data("mse")
    with pytest.raises(ValueError, match="loss='hinge'.*'mse', 'cross_entropy', 'sse'"):
        MLP([5, 3]).loss_and_gradients(X, y, "hinge")
