"""Where each block of a resident run lives.

Cannon's algorithm needs a square grid. A ``rows x cols`` process grid runs it
on a virtual ``q x q`` grid with ``q = lcm(rows, cols)`` (the generalised Cannon
algorithm): virtual cell ``(I, J)`` belongs to process cell
``(I // (q // rows), J // (q // cols))``, so every process cell holds the same
number of virtual cells and the square case is the plain algorithm.

Every matrix is cut into ``q x q`` blocks by :func:`split_bounds` of each of
its dimensions (uneven when ``q`` does not divide a size; a block may even be
empty). An activation ``(batch, n)`` block ``(I, J)`` and a weight ``(n_in,
n_out)`` block ``(K, J)`` sit on virtual cell ``(I, J)`` and ``(K, J)``; a
layer's output lands where the next layer's input must be.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from daskann.nn import init_bias_block, init_weight_block
from daskann.npt.grid import ProcessGrid, split_bounds
from daskann.store import BlockArray, read_region


@dataclass(frozen=True)
class Layout:
    """Virtual Cannon grid over a process grid, and the block bounds of a net.

    Parameters
    ----------
    q : int
        Side of the virtual square grid.
    cell_workers : dict
        Worker address of each virtual cell ``(I, J)``.
    workers : tuple of str
        The distinct workers, in order of first appearance on the grid.
    batch : list of (start, stop)
        Row bounds of the minibatch.
    features : list of list of (start, stop)
        Column bounds of each layer width ``sizes[l]``.
    """

    q: int
    grid_shape: tuple[int, int]
    cell_workers: dict
    workers: tuple[str, ...]
    sizes: tuple[int, ...]
    batch_size: int
    batch: tuple
    features: tuple

    @classmethod
    def build(cls, grid: ProcessGrid, sizes, batch_size: int) -> Layout:
        q = math.lcm(grid.rows, grid.cols)
        row_group, col_group = q // grid.rows, q // grid.cols
        cell_workers = {(i, j): grid.owner(i // row_group, j // col_group) for i in range(q) for j in range(q)}
        workers = tuple(dict.fromkeys(grid.workers))
        return cls(
            q=q,
            grid_shape=(grid.rows, grid.cols),
            cell_workers=cell_workers,
            workers=workers,
            sizes=tuple(int(s) for s in sizes),
            batch_size=int(batch_size),
            batch=tuple(split_bounds(batch_size, q)),
            features=tuple(tuple(split_bounds(n, q)) for n in sizes),
        )

    @property
    def n_layers(self) -> int:
        return len(self.sizes) - 1

    def cells_of(self, worker: str) -> list[tuple[int, int]]:
        """Virtual cells hosted by ``worker``, row-major."""
        return [c for c, w in self.cell_workers.items() if w == worker]

    def process_cell(self, cell) -> tuple[int, int]:
        rows, cols = self.grid_shape
        return cell[0] // (self.q // rows), cell[1] // (self.q // cols)

    def describe(self, cell) -> str:
        """Human name of a virtual cell for error messages."""
        text = f"cell {self.process_cell(cell)}"
        if self.q != self.grid_shape[0] or self.q != self.grid_shape[1]:
            text += f" (virtual block {tuple(cell)})"
        return f"{text} on worker {self.cell_workers[tuple(cell)]}"

    # -- blocks of full arrays -------------------------------------------------
    def weight_block(self, layer: int, cell, array: np.ndarray) -> np.ndarray:
        (r0, r1), (c0, c1) = self.features[layer][cell[0]], self.features[layer + 1][cell[1]]
        return np.ascontiguousarray(array[r0:r1, c0:c1])

    def bias_block(self, layer: int, column: int, array: np.ndarray) -> np.ndarray:
        c0, c1 = self.features[layer + 1][column]
        return np.array(array[c0:c1])

    def born_blocks(self, worker: str, seed: int, dtype) -> dict:
        """``W``, ``vW``, ``b``, ``vb`` of ``worker``'s cells at the seeded initialisation, computed here.

        Each block comes from :mod:`daskann.nn._init`'s tiles, so it equals the same part of
        ``MLP(sizes, seed=seed)``; velocities start at zero.
        """
        cells = self.cells_of(worker)
        columns = sorted({j for _, j in cells})
        parts = {"W": {}, "vW": {}, "b": {}, "vb": {}}
        for k in range(self.n_layers):
            shape = (self.sizes[k], self.sizes[k + 1])
            for cell in cells:
                w = init_weight_block(seed, k, shape, self.features[k][cell[0]], self.features[k + 1][cell[1]], dtype)
                parts["W"][k, cell], parts["vW"][k, cell] = w, np.zeros_like(w)
            for j in columns:
                b = init_bias_block(seed, k, shape, self.features[k + 1][j], dtype)
                parts["b"][k, j], parts["vb"][k, j] = b, np.zeros_like(b)
        return parts

    def stored_blocks(self, worker: str, path: str) -> dict:
        """``W``, ``vW``, ``b``, ``vb`` of ``worker``'s cells read, and verified, from the checkpoint ``path``.

        The store may come from any grid or mode: each block is re-cut from the written blocks it overlaps.
        """
        cells = self.cells_of(worker)
        columns = sorted({j for _, j in cells})
        parts = {"W": {}, "vW": {}, "b": {}, "vb": {}}
        for k in range(self.n_layers):
            for cell in cells:
                region = (self.features[k][cell[0]], self.features[k + 1][cell[1]])
                parts["W"][k, cell] = read_region(path, f"weights/{k}", region)
                parts["vW"][k, cell] = read_region(path, f"velocity/{2 * k}", region)
            for j in columns:
                parts["b"][k, j] = read_region(path, f"biases/{k}", (self.features[k + 1][j],))
                parts["vb"][k, j] = read_region(path, f"velocity/{2 * k + 1}", (self.features[k + 1][j],))
        return parts

    def store_layout(self, dtype) -> dict:
        """The arrays of a checkpoint of this net cut into this layout's blocks (:class:`daskann.store.BlockArray`)."""
        layout, name = {}, np.dtype(dtype).name
        for k in range(self.n_layers):
            shape = (self.sizes[k], self.sizes[k + 1])
            for array in (f"weights/{k}", f"velocity/{2 * k}"):
                layout[array] = BlockArray(shape, name, (self.features[k], self.features[k + 1]))
            for array in (f"biases/{k}", f"velocity/{2 * k + 1}"):
                layout[array] = BlockArray((shape[1],), name, (self.features[k + 1],))
        return layout

    def assemble_weight(self, layer: int, blocks: dict, dtype) -> np.ndarray:
        out = np.empty((self.sizes[layer], self.sizes[layer + 1]), dtype=dtype)
        for (k, j), block in blocks.items():
            (r0, r1), (c0, c1) = self.features[layer][k], self.features[layer + 1][j]
            out[r0:r1, c0:c1] = block
        return out

    def assemble_bias(self, layer: int, blocks: dict, dtype) -> np.ndarray:
        out = np.empty(self.sizes[layer + 1], dtype=dtype)
        for j, block in blocks.items():
            c0, c1 = self.features[layer + 1][j]
            out[c0:c1] = block
        return out
