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

from daskann.npt._run import checkpoint_layout, layer_arrays
from daskann.npt.grid import ProcessGrid, split_bounds


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
    def blocks(self, worker: str, source) -> dict:
        """``W``, ``vW``, ``b``, ``vb`` of ``worker``'s cells read from a block source.

        ``source`` is one of :mod:`daskann.npt._run`'s block sources: the seeded initialisation, a
        checkpoint store of any grid or mode (each block re-cut from the written blocks it overlaps,
        and verified), or a model the client holds.
        """
        cells = self.cells_of(worker)
        columns = sorted({j for _, j in cells})
        parts = {"W": {}, "vW": {}, "b": {}, "vb": {}}
        for k in range(self.n_layers):
            for name, places in (("W", cells), ("vW", cells), ("b", columns), ("vb", columns)):
                for where in places:
                    array, _, region = self._placed(name, k, where)
                    parts[name][k, where] = source.read(array, region)
        return parts

    def named_blocks(self, parts: dict):
        """The blocks of ``parts`` (some of ``W``, ``vW``, ``b``, ``vb``, keyed as :meth:`blocks` keys them)
        as a checkpoint names them: ``(array, "i.j" or "j", region, block)``, the inverse of :meth:`blocks`."""
        for name, held in parts.items():
            for (k, where), block in held.items():
                yield *self._placed(name, k, where), block

    def _placed(self, name: str, k: int, where) -> tuple:
        """Where block ``where`` (a cell, or a column for a bias) of ``name`` in layer ``k`` lies in a checkpoint:
        ``(array, "i.j" or "j", region)``."""
        array = layer_arrays(k)[("W", "vW", "b", "vb").index(name)]
        if name in ("W", "vW"):
            i, j = where
            return array, f"{i}.{j}", (self.features[k][i], self.features[k + 1][j])
        return array, str(where), (self.features[k + 1][where],)

    def store_layout(self, dtype) -> dict:
        """The arrays of a checkpoint of this net cut into this layout's blocks (:class:`daskann.store.BlockArray`)."""
        return checkpoint_layout(self.sizes, dtype, lambda k: (self.features[k], self.features[k + 1]))
