"""The partitioned pre-training part of ``daskann demo``."""

from __future__ import annotations

import time

from daskann._cli_common import summarize
from daskann.data import load_dataset
from daskann.partition.cli import partition_summary
from daskann.partition.trainer import PartitionTrainer


def run_demo(client=None, *, quick: bool = False) -> dict:
    """Train 2 sub-models of an MNIST-1D network as futures, merge them, fine-tune.

    About 20 s on 2 workers (``quick=True``: the 8x8 digits, a few seconds).

    Parameters
    ----------
    client : distributed.Client, optional
        Default: the current client, else an embedded LocalCluster.
    quick : bool
        A smaller run for tests.

    Returns
    -------
    dict
        The run's summary (as ``daskann train partition --json``), with the
        merged network's accuracy before fine-tuning, the diversity of the
        sub-models and the time of each phase.
    """
    if quick:
        data = load_dataset("digits", seed=0)
        hidden, sub_steps, steps, eval_every = (64, 64), 100, 60, 20
    else:
        data = load_dataset("mnist1d", n_samples=4000, seed=0)
        hidden, sub_steps, steps, eval_every = (128, 128, 128), 600, 400, 100
    trainer = PartitionTrainer(
        hidden,
        loss=data.loss,
        lr=0.05,
        batch_size=64,
        seed=0,
        sgd={"momentum": 0.9},
        k=2,
        merge={"combine": "mean", "noise": 0.02},
        split={"sub_steps": sub_steps},
        client=client,
    )
    start = time.perf_counter()
    trainer.fit(
        data.X_train, data.y_train, steps=steps, validation_data=(data.X_val, data.y_val), eval_every=eval_every
    )
    return summarize(
        trainer, data, method="partition", seconds=time.perf_counter() - start, extra=partition_summary(trainer)
    )
