"""Errors of the MGRIT solver."""

from __future__ import annotations

from daskann.exceptions import MGRITDidNotPay, MGRITDiverged, MGRITNotConverged, PropagatorError

__all__ = ["MGRITDidNotPay", "MGRITDiverged", "MGRITNotConverged", "PropagatorError"]
