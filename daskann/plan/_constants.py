"""The planner's methods and its fine-tuning share, apart from its models.

``daskann plan``'s choices and defaults read them without loading the cost
models (and with them distributed).
"""

from __future__ import annotations

from daskann._methods import planned

#: the methods a plan predicts (those whose entry in daskann._methods is planned)
METHODS = planned()
#: share of the steps the merged network is fine-tuned for (the rest trains the sub-models)
FINETUNE_FRACTION = 0.25
