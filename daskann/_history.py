"""Training history as an ``xarray.Dataset``."""

from __future__ import annotations

import numpy as np
import xarray as xr

# long_name and units of the variables any trainer may record
VARIABLES = {
    "loss": ("training loss of the step's minibatch", "1"),
    "time": ("wall time since training started", "s"),
    "val_loss": ("validation loss", "1"),
    "val_accuracy": ("validation accuracy", "1"),
    "compute_time": ("time spent in block products and updates", "s"),
    "comm_time": ("time spent moving blocks between workers", "s"),
    "bytes_moved": ("bytes moved between workers", "B"),
    "residual": ("MGRIT residual norm over C-points", "1"),
    "error": ("relative error against serial training", "1"),
    "phase": ("training phase", ""),
}


class HistoryRecorder:
    """Collects one row per step (or iteration) and builds the Dataset.

    Parameters
    ----------
    dim : str
        Name of the dimension, ``"step"`` or ``"iteration"``.
    """

    def __init__(self, dim: str = "step"):
        self.dim = dim
        self._coords: list[int] = []
        self._rows: list[dict] = []

    def __len__(self) -> int:
        return len(self._rows)

    def append(self, coord: int, **values) -> None:
        self._coords.append(int(coord))
        self._rows.append(values)

    def last_coord(self, default: int = 0) -> int:
        return self._coords[-1] if self._coords else default

    def last_value(self, name: str, default: float = 0.0) -> float:
        for row in reversed(self._rows):
            if row.get(name) is not None:
                return float(row[name])
        return default

    def with_rows(self, rows: dict) -> HistoryRecorder:
        """A copy with ``rows`` (``{coord: values}``) appended in coordinate order."""
        copy = HistoryRecorder(self.dim)
        copy._coords, copy._rows = list(self._coords), list(self._rows)
        for coord in sorted(rows):
            copy.append(coord, **rows[coord])
        return copy

    def extend_from(self, dataset: xr.Dataset | None) -> None:
        """Start from an earlier history (a resumed or continued run)."""
        if dataset is None or self.dim not in dataset.dims:
            return
        names = list(dataset.data_vars)
        for i, coord in enumerate(dataset[self.dim].values):
            self.append(int(coord), **{n: dataset[n].values[i].item() for n in names})

    def to_dataset(self, attrs: dict | None = None) -> xr.Dataset:
        names: list[str] = []
        for row in self._rows:
            names.extend(n for n in row if n not in names)
        data_vars = {}
        for name in names:
            values = [row.get(name) for row in self._rows]
            if any(isinstance(v, str) for v in values):
                array = np.array(["" if v is None else v for v in values], dtype=str)
            else:
                array = np.array([np.nan if v is None else v for v in values], dtype=np.float64)
            long_name, units = VARIABLES.get(name, (name, ""))
            data_vars[name] = (self.dim, array, {"long_name": long_name, "units": units})
        coords = {self.dim: (self.dim, np.array(self._coords, dtype=np.int64))}
        return xr.Dataset(data_vars, coords=coords, attrs=dict(attrs or {}))
