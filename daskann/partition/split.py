"""Split a network's hidden layers into k groups of units, one group per sub-model."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from daskann._validation import check_int, check_sizes, invalid


@dataclass(frozen=True)
class Partition:
    """How the hidden units of a network are shared out among ``k`` sub-models.

    Each hidden layer of width ``H`` is cut into ``k`` contiguous groups whose
    sizes differ by at most one (the first ``H % k`` groups get the extra
    unit). Sub-model ``g`` owns group ``g`` of every hidden layer and keeps the
    full input and output layers, so its sizes are
    ``(n_in, h_1[g], ..., h_L[g], n_out)``.

    Attributes
    ----------
    sizes : tuple of int
        Layer widths of the full network, input to output.
    k : int
        Number of sub-models.
    bounds : tuple of tuple of int
        ``bounds[l]`` are the ``k + 1`` unit offsets of hidden layer ``l``:
        group ``g`` is ``bounds[l][g]:bounds[l][g + 1]``.
    """

    sizes: tuple[int, ...]
    k: int
    bounds: tuple[tuple[int, ...], ...]

    @property
    def n_hidden(self) -> int:
        """Number of hidden layers."""
        return len(self.sizes) - 2

    def group(self, layer: int, g: int) -> slice:
        """Units of hidden layer ``layer`` (0-based) that sub-model ``g`` owns."""
        return slice(self.bounds[layer][g], self.bounds[layer][g + 1])

    def unit_slices(self, g: int) -> list[slice]:
        """Slices of every layer (input and output whole) that sub-model ``g`` owns."""
        return [slice(0, self.sizes[0])] + [self.group(i, g) for i in range(self.n_hidden)] + [slice(0, self.sizes[-1])]

    def submodel_sizes(self, g: int) -> tuple[int, ...]:
        """Layer widths of sub-model ``g``."""
        return tuple(s.stop - s.start for s in self.unit_slices(g))

    @property
    def submodels(self) -> list[tuple[int, ...]]:
        """Layer widths of every sub-model."""
        return [self.submodel_sizes(g) for g in range(self.k)]

    def parameter_counts(self) -> dict:
        """Weights and biases of the full network and of the sub-models.

        Returns
        -------
        dict
            ``full`` (full network), ``submodels`` (list, one per sub-model),
            ``submodels_total``, ``largest_submodel``, ``size_ratio`` (full
            over largest sub-model), and per layer ``layers``: a list of dicts
            with the weight-matrix shape of the full network and of sub-model 0
            and their ``shrink`` factor (``k`` for the input and output
            layers, ``k**2`` for hidden-to-hidden ones when ``k`` divides the
            widths).
        """
        full = _count(self.sizes)
        subs = [_count(s) for s in self.submodels]
        first = self.submodel_sizes(0)
        layers = []
        for i in range(len(self.sizes) - 1):
            full_shape = (self.sizes[i], self.sizes[i + 1])
            sub_shape = (first[i], first[i + 1])
            layers.append(
                {
                    "layer": i,
                    "full_shape": list(full_shape),
                    "submodel_shape": list(sub_shape),
                    "shrink": (full_shape[0] * full_shape[1]) / (sub_shape[0] * sub_shape[1]),
                }
            )
        return {
            "full": full,
            "submodels": subs,
            "submodels_total": sum(subs),
            "largest_submodel": max(subs),
            "size_ratio": full / max(subs),
            "layers": layers,
        }

    def block_mask(self) -> list[np.ndarray]:
        """Boolean masks of the weights a merge fills from sub-models (``True``).

        Input and output layers are fully covered; hidden-to-hidden matrices
        only on their ``k`` diagonal blocks.
        """
        masks = []
        for i in range(len(self.sizes) - 1):
            mask = np.zeros((self.sizes[i], self.sizes[i + 1]), dtype=bool)
            for g in range(self.k):
                units = self.unit_slices(g)
                mask[units[i], units[i + 1]] = True
            masks.append(mask)
        return masks

    def to_dict(self) -> dict:
        """JSON-safe description."""
        return {"sizes": list(self.sizes), "k": self.k, "submodels": [list(s) for s in self.submodels]}


def _count(sizes: Sequence[int]) -> int:
    return int(sum(a * b + b for a, b in zip(sizes[:-1], sizes[1:], strict=True)))


def group_bounds(width: int, k: int) -> tuple[int, ...]:
    """Offsets cutting ``width`` units into ``k`` contiguous groups differing by at most one."""
    base, extra = divmod(width, k)
    sizes = [base + (1 if g < extra else 0) for g in range(k)]
    return tuple(int(v) for v in np.concatenate([[0], np.cumsum(sizes)]))


def split_network(sizes: Sequence[int], k: int) -> Partition:
    """Plan the split of a network of layer widths ``sizes`` into ``k`` sub-models.

    Parameters
    ----------
    sizes : sequence of int
        Layer widths from input to output; at least one hidden layer.
    k : int
        Number of sub-models, from 2 to the width of the narrowest hidden layer.

    Returns
    -------
    Partition

    Raises
    ------
    ValueError
        If the network has no hidden layer, or ``k`` is below 2 or larger than
        the narrowest hidden layer (a sub-model would get no unit).

    Examples
    --------
    >>> p = split_network([40, 512, 512, 10], 2)
    >>> p.submodels
    [(40, 256, 256, 10), (40, 256, 256, 10)]
    >>> p.parameter_counts()["layers"][1]["shrink"]
    4.0
    """
    sizes = check_sizes(sizes)
    k = check_hidden_k(k, sizes[1:-1])  # refuses a network without a hidden layer too
    bounds = tuple(group_bounds(h, k) for h in sizes[1:-1])
    return Partition(sizes=tuple(sizes), k=k, bounds=bounds)


def check_hidden_k(k, hidden: Sequence[int]) -> int:
    """Validate the number of sub-models against the hidden widths."""
    if not hidden:
        raise invalid("hidden_sizes", list(hidden), "at least one hidden layer to split into sub-models")
    smallest = min(hidden)
    k = check_int("k", k)
    if smallest < 2:
        raise invalid("k", k, f"at most {smallest}, the narrowest hidden layer's width, which cannot hold 2 sub-models")
    if not 2 <= k <= smallest:
        raise invalid("k", k, f"an integer from 2 to {smallest}, the width of the narrowest hidden layer")
    return k
