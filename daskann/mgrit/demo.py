"""The MGRIT part of ``daskann demo``."""

from __future__ import annotations

import time
import warnings

import dask

from daskann._cli_common import summarize
from daskann.data import load_dataset
from daskann.exceptions import MGRITDidNotPay
from daskann.mgrit.cli import mgrit_summary
from daskann.mgrit.trainer import MGRITTrainer


def run_demo(client=None, *, quick: bool = False) -> dict:
    """Train an 8-16-16-1 regression MLP for 256 steps by MGRIT on the cluster.

    Solver preset ``"solver2"`` (V-cycles, FCF relaxation, 3 levels,
    coarsening 4), float64; the serial run with the same settings is trained
    too, and the summary reports the MGRIT iterations and the relative error
    of the final weights against it. About 20 s on 2 workers
    (``quick=True``: 64 steps, a few seconds).

    Parameters
    ----------
    client : distributed.Client, optional
        Default: the current client, else an embedded LocalCluster.
    quick : bool
        A smaller run for tests.

    Returns
    -------
    dict
        The run's summary (as ``daskann train mgrit --json``).
    """
    steps = 64 if quick else 256
    data = load_dataset("linear", n_samples=640, n_features=8, n_outputs=1, seed=0)
    trainer = MGRITTrainer(
        (16, 16),
        loss=data.loss,
        lr=1e-3,
        batch_size=16,
        seed=0,
        preset="solver2",
        solver={"levels": 3, "cfactor": 4, "compute_error": True},
        engine={"intervals_per_task": 8},
        client=client,
    )
    start = time.perf_counter()
    # the demo shows the solver at work, whatever it costs: the summary's "ended" and "paid" say whether it paid
    with warnings.catch_warnings(), dask.config.set({"daskann.mgrit.solve": "study"}):
        warnings.simplefilter("ignore", MGRITDidNotPay)
        trainer.fit(data.X_train, data.y_train, steps=steps, validation_data=(data.X_val, data.y_val))
    return summarize(trainer, data, method="mgrit", seconds=time.perf_counter() - start, extra=mgrit_summary(trainer))
