"""The serial part of ``daskann demo``; each method adds its own demo."""

from __future__ import annotations

import time

from daskann._cli_common import summarize
from daskann.data import load_dataset
from daskann.serial import SerialTrainer


def serial_demo(client=None) -> dict:
    """Train the reference trainer on scikit-learn's 8x8 digits."""
    data = load_dataset("digits", seed=0)
    start = time.perf_counter()
    trainer = SerialTrainer((64,), loss="cross_entropy", lr=0.1, batch_size=32, seed=0, sgd={"momentum": 0.9}).fit(
        data.X_train, data.y_train, epochs=10, validation_data=(data.X_val, data.y_val)
    )
    return summarize(trainer, data, method="serial", seconds=time.perf_counter() - start)
