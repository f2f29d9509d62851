"""The planner's methods and its fine-tuning share, apart from its models.

``daskann plan``'s choices and defaults read them without loading the cost
models (and with them distributed).
"""

from __future__ import annotations

#: the methods a plan predicts
METHODS = ("npt", "mgrit", "partition")
#: share of the steps the merged network is fine-tuned for (the rest trains the sub-models)
FINETUNE_FRACTION = 0.25
