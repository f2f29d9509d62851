"""Data sets, local-file loaders and the deterministic batch order."""

from daskann.data._batches import BatchOrder
from daskann.data._synthetic import make_linear

__all__ = ["BatchOrder", "make_linear"]
