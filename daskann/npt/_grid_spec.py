"""The ``grid`` option of NPT: ``"auto"``, ``"RxC"``, ``"Q"`` or a pair.

Apart from :mod:`daskann.npt.grid` (which needs distributed), so that
``daskann train npt --grid`` is checked before anything heavy loads.
"""

from __future__ import annotations

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


__all__ = ["parse_grid"]
