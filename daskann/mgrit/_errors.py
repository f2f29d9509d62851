"""Errors of the MGRIT solver."""

from __future__ import annotations

from daskann.exceptions import MGRITDiverged, MGRITNotConverged, PropagatorError

__all__ = ["MGRITDiverged", "MGRITNotConverged", "PropagatorError"]
