"""The NPT part of ``daskann demo``: a small grid run checked against SerialTrainer."""

from __future__ import annotations

import time

import numpy as np

from daskann._cli_common import summarize
from daskann.cluster import worker_addresses
from daskann.data import load_dataset
from daskann.npt.trainer import NPTTrainer
from daskann.serial import SerialTrainer


def run_demo(client) -> dict:
    """Train the 8x8 digits on a 1x2 grid of ``client``'s workers and compare with serial training.

    Resident mode (fast at this size). Returns the summary of
    :func:`daskann._cli_common.summarize` plus the grid, the mode and the
    largest relative difference of the weights from :class:`SerialTrainer`
    trained the same way.
    """
    data = load_dataset("digits", seed=0)
    n_workers = len(worker_addresses(client))
    grid = "1x2" if n_workers >= 2 else "1x1"
    mode, steps = "resident", 100
    settings = {"loss": "cross_entropy", "lr": 0.1, "batch_size": 32, "seed": 0, "sgd": {"momentum": 0.9}}
    start = time.perf_counter()
    trainer = NPTTrainer((64,), grid=grid, mode=mode, client=client, **settings).fit(
        data.X_train, data.y_train, steps=steps, validation_data=(data.X_val, data.y_val)
    )
    seconds = time.perf_counter() - start
    reference = SerialTrainer((64,), **settings).fit(data.X_train, data.y_train, steps=steps)
    difference = max(
        float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-300))
        for a, b in zip(trainer.model_.params, reference.model_.params, strict=True)
    )
    return summarize(
        trainer,
        data,
        method="npt",
        seconds=seconds,
        extra={
            "grid": grid,
            "mode": trainer.mode_,
            "max_relative_difference_from_serial": float(f"{difference:.3g}"),
        },
    )
