"""Merge trained sub-models into the block-diagonal initialisation of the full network."""

from __future__ import annotations

from collections.abc import Sequence
from typing import get_args

import numpy as np

from daskann._validation import Combine, check_choice, check_float, invalid
from daskann.nn import MLP
from daskann.partition.split import Partition

COMBINES = get_args(Combine)


def check_combine(combine, name="combine") -> str:
    """Validate the output-layer combination (``name``: how errors name it)."""
    return check_choice(name, combine, COMBINES)


def check_noise(noise, name="noise") -> float:
    """Validate the merge noise level (finite, >= 0; ``name``: how errors name it)."""
    return check_float(name, noise, minimum=0.0)


def merge_submodels(
    partition: Partition,
    submodels: Sequence[MLP],
    *,
    combine: Combine = "mean",
    noise: float = 0.02,
    seed=0,
) -> MLP:
    """Place each sub-model into its diagonal block of the full network.

    Hidden layer ``l`` of the full network is the concatenation of the sub-models' hidden layers
    ``l``; weights between units of different groups are zero. The output layer reads every group:
    with ``combine="mean"`` its weights are the sub-models' output weights over ``k`` and its bias
    the mean of their output biases, so that the merged network's logits are the mean of the
    sub-models' logits; with ``"sum"`` the weights are kept and the biases summed, so the logits
    are their sum. Then each parameter array ``p`` receives independent uniform noise on
    ``[-a, a]`` with ``a = noise * max|p|`` (zero blocks included, which is what lets the groups
    start to interact). The optimiser's momentum is not carried over: fine-tuning starts from
    zero velocity.

    Parameters
    ----------
    partition : Partition
        The split the sub-models were trained under.
    submodels : sequence of MLP
        ``partition.k`` networks, sub-model ``g`` of sizes
        ``partition.submodel_sizes(g)``, all of one dtype and activation.
    combine : {"mean", "sum"}
        How the output layer combines the groups.
    noise : float
        Noise level relative to each array's largest absolute value, ``>= 0``.
    seed : int or numpy.random.SeedSequence
        Seed of the noise.

    Returns
    -------
    MLP
        The merged network of sizes ``partition.sizes``.

    Examples
    --------
    >>> from daskann.partition import split_network
    >>> p = split_network([4, 6, 3], 2)
    >>> subs = [MLP(s, seed=g) for g, s in enumerate(p.submodels)]
    >>> merged = merge_submodels(p, subs, noise=0.0)
    >>> X = np.ones((2, 4))
    >>> bool(np.allclose(merged.forward(X), (subs[0].forward(X) + subs[1].forward(X)) / 2))
    True
    """
    combine = check_combine(combine)
    noise = check_noise(noise)
    submodels = _check_submodels(partition, submodels)
    weights, biases = _block_diagonal(partition, submodels, combine)
    _add_noise([p for pair in zip(weights, biases, strict=True) for p in pair], noise, seed)
    first = submodels[0]
    return MLP.from_arrays(
        weights, biases, activation=first.activation, output=first.output, negative_slope=first.negative_slope
    )


def _check_submodels(partition: Partition, submodels: Sequence[MLP]) -> list[MLP]:
    """The sub-models as a list, checked: one per group, of the group's sizes, all alike but for their sizes."""
    if not isinstance(partition, Partition):
        raise invalid("partition", type(partition).__name__, "a Partition from split_network", TypeError)
    submodels = list(submodels)
    if len(submodels) != partition.k:
        raise invalid("submodels", f"{len(submodels)} networks", f"{partition.k}, one per sub-model of the partition")
    first = submodels[0]
    for g, sub in enumerate(submodels):
        if not isinstance(sub, MLP):
            raise invalid(f"submodels[{g}]", type(sub).__name__, "an MLP", TypeError)
        if tuple(sub.sizes) != partition.submodel_sizes(g):
            raise invalid(f"submodels[{g}]", sub, f"an MLP of sizes {list(partition.submodel_sizes(g))}")
        for attr in ("activation", "output", "dtype", "negative_slope"):
            if getattr(sub, attr) != getattr(first, attr):
                expected = f"{getattr(first, attr)!r}, as submodels[0]"
                raise invalid(f"submodels[{g}].{attr}", getattr(sub, attr), expected)
    return submodels


def _block_diagonal(partition: Partition, submodels: list[MLP], combine: str) -> tuple[list, list]:
    """Weights and biases of the full network, each sub-model in its diagonal block, the output layer combined."""
    dtype = submodels[0].dtype
    sizes = partition.sizes
    n_layers = len(sizes) - 1
    weights = [np.zeros((sizes[i], sizes[i + 1]), dtype=dtype) for i in range(n_layers)]
    biases = [np.zeros(sizes[i + 1], dtype=dtype) for i in range(n_layers)]
    scale = 1.0 / partition.k if combine == "mean" else 1.0
    for g, sub in enumerate(submodels):
        units = partition.unit_slices(g)
        for i in range(n_layers - 1):
            weights[i][units[i], units[i + 1]] = sub.weights[i]
            biases[i][units[i + 1]] = sub.biases[i]
        # the output layer reads every group: scaling its weights and biases
        # by 1/k makes the merged logits the mean of the sub-models' logits
        weights[-1][units[-2], :] = sub.weights[-1] * dtype.type(scale)
        biases[-1] += sub.biases[-1]
    if combine == "mean":
        biases[-1] /= dtype.type(partition.k)
    return weights, biases


def _add_noise(arrays: list[np.ndarray], noise: float, seed) -> None:
    """Add uniform noise on ``[-a, a]``, ``a = noise * max|p|``, to each array ``p`` in place, in order."""
    if noise > 0:
        rng = np.random.default_rng(seed)
        for array in arrays:
            amplitude = noise * float(np.max(np.abs(array))) if array.size else 0.0
            if amplitude > 0:
                array += rng.uniform(-amplitude, amplitude, array.shape).astype(array.dtype)


def combine_logits(submodels: Sequence[MLP], X, *, combine: Combine = "mean") -> np.ndarray:
    """The mean (or sum) of the sub-models' logits on ``X``: what a noise-free merge computes."""
    combine = check_combine(combine)
    total = sum(sub.forward(X) for sub in submodels)
    return total / len(submodels) if combine == "mean" else total
