"""Deterministic batch order: which rows step ``i`` trains on.

The rows of a step are a pure function of ``(seed, step)``, so any process can
recompute them without shared state: MGRIT propagates many steps at once, and a
resumed run picks up exactly where it stopped.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from daskann._validation import check_int, invalid


class BatchOrder:
    """Rows of each training step.

    With ``shuffle=False`` step ``i`` uses rows
    ``(i * batch_size + arange(batch_size)) % n_samples``. Otherwise epoch ``e``
    is a permutation from ``numpy.random.default_rng([seed, e])`` cut into
    ``n_samples // batch_size`` batches (the incomplete last batch is dropped).

    Parameters
    ----------
    n_samples : int
    batch_size : int
        At most ``n_samples``.
    seed : int
        Seed of the epoch permutations.
    shuffle : bool
    """

    def __init__(self, n_samples: int, batch_size: int, *, seed: int = 0, shuffle: bool = True):
        self.n_samples = check_int("n_samples", n_samples)
        self.batch_size = check_int("batch_size", batch_size)
        if self.batch_size > self.n_samples:
            raise invalid("batch_size", batch_size, f"at most the number of samples ({self.n_samples})")
        self.seed = check_int("seed", seed, minimum=0)
        self.shuffle = bool(shuffle)

    @property
    def steps_per_epoch(self) -> int:
        return self.n_samples // self.batch_size

    def indices(self, step: int) -> np.ndarray:
        """Row indices of training step ``step`` (0-based)."""
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
        return f"BatchOrder({s['n_samples']}, {s['batch_size']}, seed={s['seed']}, shuffle={s['shuffle']})"


@lru_cache(maxsize=8)
def _permutation(seed: int, epoch: int, n_samples: int) -> np.ndarray:
    perm = np.random.default_rng([seed, epoch]).permutation(n_samples)
    perm.flags.writeable = False
    return perm
