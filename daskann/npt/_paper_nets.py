"""The paper's three nets of network-parallel training (``daskann bench npt`` and ``daskann plan --net``)."""

from __future__ import annotations

#: the paper's three nets (widths are not in the available text: these are ours)
PAPER_NETS = {
    "one-hidden": {"n_features": 64, "hidden": (128,), "n_outputs": 8},
    "two-hidden": {"n_features": 64, "hidden": (128, 128), "n_outputs": 8},
    "two-hidden-256": {"n_features": 64, "hidden": (256, 256), "n_outputs": 8},
}

__all__ = ["PAPER_NETS"]
