"""Process grids: which worker owns which block.

A grid of ``rows x cols`` cells is laid over a matrix by cutting its rows into
``rows`` nearly equal bands and its columns into ``cols`` (sizes differ by at
most one, so no padding is needed and every size works). Cell ``(i, j)`` lives
on one worker; several cells may share a worker only when asked.

Only :meth:`ProcessGrid.from_client` loads distributed, so that ``daskann train npt --grid`` is
checked by :func:`parse_grid` before anything heavy loads.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from daskann._validation import OptionName, check_int, invalid


def parse_grid(grid) -> tuple[int, int] | str:
    """``(r, c)`` from a tuple, ``"RxC"``, ``"Q"`` (square) or ``"auto"``.

    Parameters
    ----------
    grid : str, int or pair of int
        ``"auto"``, ``"RxC"`` such as ``"2x4"``, ``"Q"`` or ``Q`` for
        ``QxQ``, or ``(rows, cols)``.

    Returns
    -------
    tuple of int, or str
        ``(rows, cols)``, or ``"auto"``.

    Examples
    --------
    >>> parse_grid("2x4"), parse_grid(3), parse_grid(" Auto ")
    ((2, 4), (3, 3), 'auto')
    """
    if isinstance(grid, str):
        text = grid.strip().lower()
        if text == "auto":
            return "auto"
        try:
            parts = [int(p) for p in text.split("x")]
        except ValueError:
            parts = []
        if len(parts) == 1:
            parts = parts * 2
        if len(parts) != 2:
            raise invalid("grid", grid, "'auto', 'RxC' such as '2x2' or '2x4', or a pair (rows, cols)")
        grid = tuple(parts)
    if isinstance(grid, int) and not isinstance(grid, bool):
        grid = (grid, grid)
    if not isinstance(grid, (tuple, list)) or len(grid) != 2:
        raise invalid("grid", grid, "'auto', 'RxC' such as '2x2' or '2x4', or a pair (rows, cols)")
    name = OptionName(("grid",))
    return check_int(name.at(0), grid[0]), check_int(name.at(1), grid[1])


def split_sizes(n: int, parts: int) -> tuple[int, ...]:
    """Sizes of ``parts`` nearly equal pieces of ``n`` (larger ones first)."""
    base, extra = divmod(int(n), int(parts))
    return tuple(base + 1 if k < extra else base for k in range(parts))


def split_bounds(n: int, parts: int) -> list[tuple[int, int]]:
    """``(start, stop)`` of each piece of :func:`split_sizes`."""
    edges = np.concatenate([[0], np.cumsum(split_sizes(n, parts))])
    return [(int(a), int(b)) for a, b in zip(edges[:-1], edges[1:], strict=True)]


def nearest_grids(n_workers: int) -> list[tuple[int, int]]:
    """Grids that use every one of ``n_workers`` workers, squarest first."""
    shapes = [(r, n_workers // r) for r in range(1, n_workers + 1) if n_workers % r == 0]
    return sorted(shapes, key=lambda s: (abs(s[0] - s[1]), -s[0]))


@dataclass(frozen=True)
class ProcessGrid:
    """A ``rows x cols`` grid of cells mapped onto worker addresses.

    Parameters
    ----------
    rows, cols : int
    workers : tuple of str
        Worker address of each cell in row-major order.

    Use :meth:`from_client` to build one from a cluster.
    """

    rows: int
    cols: int
    workers: tuple[str, ...]

    @classmethod
    def from_workers(cls, grid, workers, *, share_workers: bool = False) -> ProcessGrid:
        """Lay ``grid`` over the given worker addresses (row-major, in order).

        A grid with more cells than workers is refused unless
        ``share_workers``, when cells are dealt out round-robin.
        """
        rows, cols = parse_grid(grid)
        workers = list(workers)
        if not workers:
            raise invalid("workers", workers, "at least one worker")
        cells = rows * cols
        if cells > len(workers) and not share_workers:
            options = ", ".join(f"{r}x{c}" for r, c in nearest_grids(len(workers))[:3])
            raise invalid(
                "grid",
                f"{rows}x{cols}",
                f"at most {len(workers)} cells on this cluster of {len(workers)} workers "
                f"(nearest valid grids: {options}), or pass share_workers=True (NPTTrainer: "
                "engine={'share_workers': True}) to place several cells per worker",
            )
        return cls(rows, cols, tuple(workers[k % len(workers)] for k in range(cells)))

    @classmethod
    def from_client(cls, client, grid, *, share_workers: bool = False) -> ProcessGrid:
        """Lay ``grid`` over the client's workers (sorted by worker name)."""
        from daskann.cluster import worker_addresses

        return cls.from_workers(grid, worker_addresses(client), share_workers=share_workers)

    @property
    def shape(self) -> tuple[int, int]:
        return self.rows, self.cols

    @property
    def size(self) -> int:
        return self.rows * self.cols

    @property
    def is_square(self) -> bool:
        return self.rows == self.cols

    def owner(self, i: int, j: int) -> str:
        """Worker address of cell ``(i, j)``."""
        return self.workers[i * self.cols + j]

    def cells(self):
        """All ``(i, j)`` in row-major order."""
        return [(i, j) for i in range(self.rows) for j in range(self.cols)]

    def block_bounds(self, shape: tuple[int, int], *, row_parts: int | None = None, col_parts: int | None = None):
        """Row and column ``(start, stop)`` bounds of a matrix of ``shape`` on this grid."""
        return (
            split_bounds(shape[0], row_parts or self.rows),
            split_bounds(shape[1], col_parts or self.cols),
        )

    def placement_map(self, names: dict[str, str] | None = None) -> str:
        """Printable table of which worker owns each cell."""
        names = names or {}
        labels = [names.get(w, w.split("://")[-1]) for w in self.workers]
        width = max(len(s) for s in labels) + 2
        lines = [f"grid {self.rows}x{self.cols} on {len(set(self.workers))} workers"]
        lines.append(" " * 6 + "".join(f"col {j}".ljust(width) for j in range(self.cols)))
        for i in range(self.rows):
            lines.append(f"row {i} " + "".join(labels[i * self.cols + j].ljust(width) for j in range(self.cols)))
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.placement_map()
