"""Progress with verbose=1: a bar on a terminal, plain periodic lines in a log, nothing with verbose=0."""

from __future__ import annotations

import io
import re

import numpy as np
import pytest

from daskann import MGRITTrainer, NPTTrainer, PartitionTrainer, SerialTrainer
from daskann._progress import ProgressBar
from daskann.data import make_linear

# MGRIT fits here must run the solve, which the default policy skips for problems this small
pytestmark = pytest.mark.usefixtures("mgrit_study")

LINE = re.compile(r"^(?P<label>[\w -]+): (?P<done>\d+)/(?P<total>\d+) (?P<unit>[\w-]+)s \(\d+%\), [\d.]+ s")


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture(scope="module")
def regression():
    return make_linear(64, 4, 1, seed=0)


def _lines(text: str, label: str) -> list[re.Match]:
    found = [LINE.match(line) for line in text.splitlines()]
    return [m for m in found if m and m["label"] == label]


def test_verbose_serial_writes_plain_lines_to_a_log(capfd, regression):
    X, y = regression
    SerialTrainer((8,), lr=0.05, batch_size=16, verbose=1).fit(X, y, steps=50)
    out, err = capfd.readouterr()
    assert out == "" and "\r" not in err  # a log gets lines, never a redrawn bar
    lines = _lines(err, "serial")
    assert 2 <= len(lines) <= 11  # one per tenth of the run at most, and the end
    assert [m["done"] for m in lines][-1] == "50" and all(m["total"] == "50" for m in lines)
    assert "loss=" in err.splitlines()[-1]


def test_verbose_zero_writes_nothing(capfd, regression):
    X, y = regression
    SerialTrainer((8,), lr=0.05, batch_size=16).fit(X, y, steps=50)
    MGRITTrainer(
        (8,), lr=0.01, batch_size=16, solver={"levels": 2, "cfactor": 4}, engine={"scheduler": "inprocess"}
    ).fit(X, y, steps=16)
    assert capfd.readouterr() == ("", "")


def test_verbose_mgrit_reports_iterations_with_the_residual(capfd, regression):
    X, y = regression
    trainer = MGRITTrainer(
        (8,), lr=0.01, batch_size=16, solver={"levels": 2, "cfactor": 4}, engine={"scheduler": "inprocess"}, verbose=1
    )
    trainer.fit(X, y, steps=16)
    out, err = capfd.readouterr()
    lines = _lines(err, "mgrit")
    assert out == "" and lines and all(m["unit"] == "iteration" for m in lines)
    # over the iteration budget; the last line is where the converged run stopped
    assert int(lines[-1]["done"]) == trainer.n_iter_ and int(lines[-1]["total"]) >= trainer.n_iter_
    assert "residual=" in lines[-1].string


def test_verbose_partition_counts_submodels_then_fine_tuning(capfd, client2, regression):
    X, y = regression
    PartitionTrainer((8,), lr=0.05, batch_size=16, k=2, client=client2, verbose=1).fit(X, y, steps=20)
    err = capfd.readouterr().err
    submodels = _lines(err, "partition sub-models")
    assert submodels[-1]["done"] == submodels[-1]["total"] == "2" and submodels[-1]["unit"] == "sub-model"
    assert _lines(err, "serial")[-1]["done"] == "20"  # the fine-tuning's own progress follows


def test_verbose_npt_reports_steps(capfd, client2, regression):
    X, y = regression
    NPTTrainer((8,), lr=0.05, batch_size=16, grid="1x2", mode="graph", client=client2, verbose=1).fit(X, y, steps=4)
    lines = _lines(capfd.readouterr().err, "npt 1x2 graph")
    assert lines and lines[-1]["done"] == lines[-1]["total"] == "4"


def test_a_terminal_gets_a_tqdm_bar():
    stream = Terminal()
    with ProgressBar(20, "mgrit", unit="iteration", stream=stream) as bar:
        for i in range(1, 6):
            bar.update(i, residual=10.0**-i)
    text = stream.getvalue()
    assert "\r" in text and "5/20" in text and "residual=1e-5" in text and not _lines(text, "mgrit")


def test_plain_lines_come_each_tenth_and_at_least_every_interval():
    stream = io.StringIO()
    bar = ProgressBar(1000, "serial", stream=stream)
    for done in range(1, 1001):
        bar.update(done)
    assert [int(m["done"]) for m in _lines(stream.getvalue(), "serial")] == list(range(100, 1001, 100))
    # a slow run: a line at every update once ``interval`` has passed, even between tenths
    stream = io.StringIO()
    bar = ProgressBar(1000, "slow", stream=stream, interval=0.0)
    for done in (1, 2, 3):
        bar.update(done)
    bar.close()  # no second line for the same count
    assert [int(m["done"]) for m in _lines(stream.getvalue(), "slow")] == [1, 2, 3]


def test_advance_counts_from_callback_threads():
    import threading

    stream = io.StringIO()
    bar = ProgressBar(8, "partition sub-models", unit="sub-model", stream=stream)
    threads = [threading.Thread(target=bar.advance) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    bar.close()
    assert bar.n == 8 and _lines(stream.getvalue(), "partition sub-models")[-1]["done"] == "8"


def test_disabled_bar_writes_nothing():
    stream = Terminal()
    with ProgressBar(5, "serial", enabled=False, stream=stream) as bar:
        bar.update(5, loss=np.float64(0.5))
    assert stream.getvalue() == ""
