"""The ``engine`` options of :class:`~daskann.npt.trainer.NPTTrainer`, and the checks of its grid, mode and engine."""

from __future__ import annotations

from typing import get_args

import numpy as np
from distributed import Client

from daskann._options import OptionGroup, resolve_group
from daskann._validation import NPTMode, NPTPipeline, check_choice, check_float, invalid
from daskann.npt.grid import parse_grid

MODES = get_args(NPTMode)
PIPELINES = get_args(NPTPipeline)
#: accumulation chains per block product of each graph-mode pipeline
CHAINS = {"fused": 0, "single": 1, "double": 2}


class NPTEngineOptions(OptionGroup):
    """The ``engine`` options of :class:`NPTTrainer`: how the grid runs, beyond its shape and mode.

    Given as ``engine=NPTEngineOptions(...)`` or a dict of the same keywords
    (``engine={"deterministic": False}``); either way
    ``trainer.set_params(engine__deterministic=False)`` sets one option.

    Parameters
    ----------
    share_workers : bool
        Allow a grid with more cells than workers (cells dealt out
        round-robin); otherwise such a grid is an error.
    deterministic : bool
        Refuse clusters whose workers run more than one thread, whose results
        could depend on timing.
    pipeline : {"auto", "fused", "single", "double"}
        Graph mode only: how each output block's Cannon steps become tasks.
        ``"double"``: a task per block product in two accumulation chains
        (the next operands travel while the current product runs);
        ``"single"``: a task per block product in one chain; ``"fused"``: one
        task per output block running its products in Cannon order.
        ``"auto"`` picks by the size of a block product.
    timeout : float
        Seconds without progress after which training fails (never hangs).
    """

    group = "engine"

    def __init__(self, *, share_workers=False, deterministic=True, pipeline: NPTPipeline = "auto", timeout=120.0):
        self._store(locals())


def check_npt_options(grid, mode, engine, client) -> dict:
    """The trainer's ``grid``, ``mode``, ``engine`` and ``client`` checked: the options of an NPT run.

    Returns ``{"grid", "mode", "share_workers", "deterministic", "timeout", "pipeline"}``; raises
    before any task for a value that is not valid.
    """
    grid = parse_grid(grid)
    mode = check_choice("mode", mode, MODES)
    engine = resolve_group(engine, NPTEngineOptions)
    pipeline = check_choice(NPTEngineOptions.name_of("pipeline"), engine["pipeline"], PIPELINES)
    for name in ("share_workers", "deterministic"):
        if not isinstance(engine[name], (bool, np.bool_)):
            raise invalid(NPTEngineOptions.name_of(name), engine[name], "True or False", TypeError)
    timeout = check_float(NPTEngineOptions.name_of("timeout"), engine["timeout"], minimum=0.0, min_inclusive=False)
    if client is not None and not isinstance(client, Client):
        raise invalid("client", type(client).__name__, "a distributed.Client or None", TypeError)
    return {
        "grid": grid,
        "mode": mode,
        "share_workers": bool(engine["share_workers"]),
        "deterministic": bool(engine["deterministic"]),
        "timeout": timeout,
        "pipeline": pipeline,
    }
