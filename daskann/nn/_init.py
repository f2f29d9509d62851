"""Layout-independent initialisation: any block of any layer, computed on its own.

Every weight matrix is cut into fixed ``TILE x TILE`` tiles (smaller at the
right and bottom edges) and every bias vector into ``TILE``-long pieces. The
values of a tile come from their own counter-based stream,
``numpy.random.default_rng([seed, layer, kind, tile_row, tile_col])``, so a
block of any grid is assembled from the tiles it overlaps and equals the same
part of the whole matrix, whichever process computes it.
"""

from __future__ import annotations

import numpy as np

from daskann._validation import check_int, invalid

__all__ = ["TILE", "init_bias_block", "init_weight_block", "init_weights"]

#: side of the tiles the seeded values are drawn in (part of the definition: changing it changes every net)
TILE = 128

_WEIGHT, _BIAS = 0, 1


def _bound(n_in: int) -> float:
    # torch.nn.Linear's default: U(-1/sqrt(n_in), 1/sqrt(n_in)) for weights and biases alike
    return 1.0 / np.sqrt(n_in)


def _tile(seed: int, layer: int, kind: int, ti: int, tj: int, shape: tuple[int, int], bound: float) -> np.ndarray:
    rng = np.random.default_rng([seed, layer, kind, ti, tj])
    return rng.uniform(-bound, bound, shape)


def _tiles(start: int, stop: int, n: int):
    """``(tile, first, last, out0)`` for every tile of a length-``n`` axis overlapping ``start:stop``.

    ``first:last`` is the overlap relative to the tile, ``out0`` where it lands in the block.
    """
    if stop <= start:
        return
    for t in range(start // TILE, -(-stop // TILE)):
        t0 = t * TILE
        first, last = max(start, t0), min(stop, t0 + TILE, n)
        yield t, first - t0, last - t0, first - start


def init_weight_block(seed: int, layer: int, shape, rows, cols, dtype="float64") -> np.ndarray:
    """Rows ``rows = (r0, r1)`` and columns ``cols = (c0, c1)`` of layer ``layer``'s initial weights.

    Parameters
    ----------
    seed : int
        Non-negative seed of the network.
    layer : int
        Index of the dense layer.
    shape : (int, int)
        ``(n_in, n_out)`` of the whole weight matrix.
    rows, cols : (int, int)
        ``(start, stop)`` of the block; any cut gives the same values as slicing the whole matrix.
    dtype : numpy dtype

    Returns
    -------
    ndarray of shape ``(r1 - r0, c1 - c0)``
    """
    n_in, n_out = (int(s) for s in shape)
    (r0, r1), (c0, c1) = _check_bounds("rows", rows, n_in), _check_bounds("cols", cols, n_out)
    out = np.empty((r1 - r0, c1 - c0), dtype=dtype)
    bound = _bound(n_in)
    for ti, a0, a1, o0 in _tiles(r0, r1, n_in):
        tile_rows = min(TILE, n_in - ti * TILE)
        for tj, b0, b1, p0 in _tiles(c0, c1, n_out):
            tile = _tile(seed, layer, _WEIGHT, ti, tj, (tile_rows, min(TILE, n_out - tj * TILE)), bound)
            out[o0 : o0 + a1 - a0, p0 : p0 + b1 - b0] = tile[a0:a1, b0:b1]
    return out


def init_bias_block(seed: int, layer: int, shape, cols, dtype="float64") -> np.ndarray:
    """Entries ``cols = (c0, c1)`` of layer ``layer``'s initial bias (``shape`` as :func:`init_weight_block`)."""
    n_in, n_out = (int(s) for s in shape)
    c0, c1 = _check_bounds("cols", cols, n_out)
    out = np.empty(c1 - c0, dtype=dtype)
    bound = _bound(n_in)
    for tj, b0, b1, p0 in _tiles(c0, c1, n_out):
        tile = _tile(seed, layer, _BIAS, 0, tj, (min(TILE, n_out - tj * TILE),), bound)
        out[p0 : p0 + b1 - b0] = tile[b0:b1]
    return out


def init_weights(sizes, seed: int, *, bias: bool = True, dtype="float64") -> tuple[list, list]:
    """Whole initial weights and biases (empty list when ``bias`` is false) of a net of ``sizes``."""
    weights, biases = [], []
    for layer, shape in enumerate(zip(sizes[:-1], sizes[1:], strict=True)):
        weights.append(init_weight_block(seed, layer, shape, (0, shape[0]), (0, shape[1]), dtype))
        if bias:
            biases.append(init_bias_block(seed, layer, shape, (0, shape[1]), dtype))
    return weights, biases


def check_seed(seed) -> int:
    """A non-negative integer seed; ``None`` draws a fresh one."""
    if seed is None:
        return int(np.random.SeedSequence().entropy % 2**63)
    return check_int("seed", seed, minimum=0)


def _check_bounds(name: str, bounds, n: int) -> tuple[int, int]:
    start, stop = (int(b) for b in bounds)
    if not 0 <= start <= stop <= n:
        raise invalid(name, bounds, f"(start, stop) with 0 <= start <= stop <= {n}")
    return start, stop
