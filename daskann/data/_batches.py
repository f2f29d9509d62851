"""Deterministic batch order: which rows step ``i`` trains on.

The rows of a step are a pure function of ``(seed, step)``, so any process can
recompute them without shared state: MGRIT propagates many steps at once, and a
resumed run picks up exactly where it stopped.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Literal

import numpy as np

from daskann._validation import check_int, invalid

#: the ``shuffle`` value of the one-row-per-step order of Schroder (2017)
SERIALIZED = "serialized"


def check_batch_order(batch_size, shuffle, shuffle_name="shuffle") -> tuple[int | None, bool | str]:
    """Validated ``(batch_size, shuffle)`` of a batch order.

    ``batch_size=None`` is the full batch; ``shuffle="serialized"`` takes one
    row per step and so refuses a batch size. ``shuffle_name`` is how errors
    name ``shuffle`` (a trainer's is ``sgd['shuffle']``).
    """
    if isinstance(shuffle, str):
        if shuffle != SERIALIZED:
            raise invalid(shuffle_name, shuffle, f"True, False or {SERIALIZED!r}")
        if batch_size is not None:
            raise invalid("batch_size", batch_size, f"None with shuffle={SERIALIZED!r} (one row per step)")
        return None, SERIALIZED
    shuffle = bool(shuffle)
    return (None if batch_size is None else check_int("batch_size", batch_size)), shuffle


class BatchOrder:
    """Rows of each training step.

    With ``shuffle=False`` step ``i`` uses rows
    ``(i * batch_size + arange(batch_size)) % n_samples``. With ``shuffle=True``
    epoch ``e`` is a permutation from ``numpy.random.default_rng([seed, e])`` cut
    into ``n_samples // batch_size`` batches (the incomplete last batch is
    dropped). ``batch_size=None`` is full-batch training: every step uses all
    rows, in order, whatever ``shuffle`` says (a permutation would change only
    the rounding of the sums). ``shuffle="serialized"`` (with
    ``batch_size=None``) is the serialized order of Schroder (2017): step ``i``
    uses the single row ``i % n_samples``.

    Parameters
    ----------
    n_samples : int
    batch_size : int or None
        At most ``n_samples``; ``None`` for the full batch, or with the
        serialized order.
    seed : int
        Seed of the epoch permutations.
    shuffle : bool or "serialized"

    See Also
    --------
    coarse_indices : the rows of a point on a coarse MGRIT level.

    Examples
    --------
    >>> BatchOrder(5, None, shuffle="serialized").indices(7)
    array([2])
    >>> BatchOrder(3, None).indices(7)
    array([0, 1, 2])
    """

    def __init__(
        self,
        n_samples: int,
        batch_size: int | None,
        *,
        seed: int = 0,
        shuffle: bool | Literal["serialized"] = True,
    ):
        self.n_samples = check_int("n_samples", n_samples)
        self.batch_size, self.shuffle = check_batch_order(batch_size, shuffle)
        if self.batch_size is not None and self.batch_size > self.n_samples:
            raise invalid("batch_size", batch_size, f"at most the number of samples ({self.n_samples})")
        self.seed = check_int("seed", seed, minimum=0)

    @property
    def full_batch(self) -> bool:
        """Whether every step uses all rows."""
        return self.batch_size is None and self.shuffle != SERIALIZED

    @property
    def steps_per_epoch(self) -> int:
        if self.shuffle == SERIALIZED:
            return self.n_samples
        return 1 if self.batch_size is None else self.n_samples // self.batch_size

    def indices(self, step: int) -> np.ndarray:
        """Row indices of training step ``step`` (0-based)."""
        if self.shuffle == SERIALIZED:
            return np.array([int(step) % self.n_samples])
        if self.batch_size is None:
            return np.arange(self.n_samples)
        if not self.shuffle:
            return (step * self.batch_size + np.arange(self.batch_size)) % self.n_samples
        epoch, k = divmod(int(step), self.steps_per_epoch)
        perm = _permutation(self.seed, epoch, self.n_samples)
        return perm[k * self.batch_size : (k + 1) * self.batch_size]

    def get_state(self) -> dict:
        """JSON-safe state, stored in every checkpoint."""
        return {
            "n_samples": self.n_samples,
            "batch_size": self.batch_size,
            "seed": self.seed,
            "shuffle": self.shuffle,
        }

    @classmethod
    def from_state(cls, state: dict) -> BatchOrder:
        return cls(state["n_samples"], state["batch_size"], seed=state["seed"], shuffle=state["shuffle"])

    def __eq__(self, other) -> bool:
        return isinstance(other, BatchOrder) and self.get_state() == other.get_state()

    def __repr__(self) -> str:
        s = self.get_state()
        return f"BatchOrder({s['n_samples']}, {s['batch_size']}, seed={s['seed']}, shuffle={s['shuffle']!r})"


def coarse_indices(
    order: BatchOrder, point: int, *, level: int, cfactor: int = 2, rule: Literal["own", "fine"] = "own"
) -> np.ndarray:
    """Rows that point ``point`` of MGRIT level ``level`` trains on.

    The coarse propagator of level ``level`` steps from point ``point`` to
    ``point + 1``; which data it sees is a choice of the method.

    Parameters
    ----------
    order : BatchOrder
        The order of the fine level (level 0).
    point : int
        Index of the point on its own level, from 0.
    level : int
        MGRIT level, 0 the finest.
    cfactor : int
        Coarsening factor ``m``: point ``i`` of level ``l`` lies on fine step ``m**l * i``.
    rule : {"own", "fine"}
        ``"own"`` is the rule of Schroder (2017, section 2): point ``i`` of every
        level uses the rows of step ``i`` of ``order`` (in the serialized order
        the single row ``i mod K``, not ``m**l i mod K``). ``"fine"`` uses the
        rows of the fine step the point lies on. The paper presets shift
        ``point`` by one so that the step *into* point ``i`` uses row
        ``i mod K`` (``row_index="end"`` of
        :func:`daskann.mgrit.presets.paper_options`).

    Returns
    -------
    ndarray of int

    Examples
    --------
    >>> order = BatchOrder(5, None, shuffle="serialized")
    >>> coarse_indices(order, 3, level=2)
    array([3])
    >>> coarse_indices(order, 3, level=2, rule="fine")
    array([2])
    """
    point = check_int("point", point, minimum=0)
    level = check_int("level", level, minimum=0)
    cfactor = check_int("cfactor", cfactor, minimum=2)
    if rule == "own":
        return order.indices(point)
    if rule == "fine":
        return order.indices(cfactor**level * point)
    raise invalid("rule", rule, "'own' or 'fine'")


@lru_cache(maxsize=8)
def _permutation(seed: int, epoch: int, n_samples: int) -> np.ndarray:
    perm = np.random.default_rng([seed, epoch]).permutation(n_samples)
    perm.flags.writeable = False
    return perm
