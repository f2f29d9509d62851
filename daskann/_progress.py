"""Progress of a training run on stderr: a tqdm bar where someone watches, periodic lines in a log.

On a terminal or in a Jupyter notebook a bar (``tqdm.auto``: the notebook
widget when ipywidgets is there) follows the run. When stderr is a file or a
pipe, as in an sbatch log, a redrawn bar would fill the log with carriage
returns, so the same progress comes as plain lines: one each tenth of the
run, at least one every ``interval`` seconds while it moves, and one at the end.
"""

from __future__ import annotations

import sys
import threading
import time
import warnings

from tqdm import TqdmWarning

__all__ = ["ProgressBar"]


class ProgressBar:
    """Progress of ``total`` units of work on ``stream`` (stderr by default).

    Parameters
    ----------
    total : int
        Units of the whole run (steps, iterations, sub-models).
    label : str
        Names the run in the bar or at the start of each line.
    enabled : bool
        ``False`` writes nothing (a trainer's ``verbose=0``).
    unit : str
        What one unit is, for the display.
    initial : int
        Units already done (a resumed or continued run).
    stream : file, optional
        Where to write; default ``sys.stderr`` at construction.
    interval : float
        Longest gap in seconds between two plain lines while the run moves.

    Examples
    --------
    >>> with ProgressBar(100, "serial", enabled=False) as bar:
    ...     for step in range(1, 101):
    ...         bar.update(step, loss=0.5)
    """

    def __init__(
        self,
        total: int,
        label: str = "",
        *,
        enabled: bool = True,
        unit: str = "step",
        initial: int = 0,
        stream=None,
        interval: float = 10.0,
    ):
        self.total = max(int(total), 1)
        self.label = label
        self.unit = unit
        self.enabled = bool(enabled)
        self.stream = stream if stream is not None else sys.stderr
        self.interval = float(interval)
        self.n = int(initial)
        self._lock = threading.Lock()
        self._start = time.perf_counter()
        self._last_line = self._start
        self._written = None  # units shown by the last plain line
        self._next_tenth = self._tenth(self.n) + 1
        self._info: dict = {}
        self._closed = not self.enabled
        self._interactive = self.enabled and _interactive(self.stream)
        self._bar = None  # drawn on entering the context or at the first update, not on bad input before

    def _show(self):
        if self._bar is None and self._interactive and not self._closed:
            self._bar = self._make_bar()
        return self._bar

    def _make_bar(self):
        with warnings.catch_warnings():
            # in a kernel without ipywidgets tqdm.auto warns and falls back to the text bar, which is fine here
            warnings.simplefilter("ignore", TqdmWarning)
            from tqdm.auto import tqdm  # imported here, inside the filter, as it may warn on import
        return tqdm(
            total=self.total,
            initial=self.n,
            desc=self.label,
            unit=self.unit,
            file=self.stream,
            dynamic_ncols=True,
            leave=True,
        )

    def start(self) -> ProgressBar:
        """Draw the bar now (at 0), rather than at the first update."""
        with self._lock:
            self._show()
        return self

    def __enter__(self) -> ProgressBar:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    def update(self, done: int, **info) -> None:
        """Set the units done to ``done``; ``info`` (e.g. ``loss=...``) is shown beside them."""
        with self._lock:
            if not self._closed:
                self._move(int(done), info)

    def advance(self, n: int = 1, **info) -> None:
        """Count ``n`` more units done (safe from callback threads)."""
        with self._lock:
            if not self._closed:
                self._move(self.n + int(n), info)

    def close(self) -> None:
        """Finish the display: close the bar, or write the last line."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if self._interactive:
                if self._bar is not None:
                    self._bar.close()
            elif self._written != self.n:
                self._line()

    def _move(self, done: int, info: dict) -> None:
        self.n = done
        self._info.update(info)
        if self._interactive:
            bar = self._show()
            bar.set_postfix(self._info, refresh=False)
            bar.update(done - bar.n)
        else:
            now = time.perf_counter()
            if self._tenth(done) >= self._next_tenth or now - self._last_line >= self.interval:
                self._line(now)
        if done >= self.total:
            self._closed = True
            if self._bar is not None:
                self._bar.close()

    def _tenth(self, done: int) -> int:
        return 10 * done // self.total

    def _line(self, now: float | None = None) -> None:
        now = time.perf_counter() if now is None else now
        self._last_line, self._written = now, self.n
        self._next_tenth = self._tenth(self.n) + 1
        extra = "".join(f", {k}={_format(v)}" for k, v in self._info.items())
        self.stream.write(
            f"{self.label}: {self.n}/{self.total} {self.unit}s ({100 * self.n / self.total:.0f}%), "
            f"{now - self._start:.1f} s{extra}\n"
        )
        self.stream.flush()


def _format(value) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _interactive(stream) -> bool:
    """Whether someone watches ``stream`` live: a terminal, or a notebook's output."""
    if _in_notebook():
        return True
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


def _in_notebook() -> bool:
    # the test tqdm.auto itself makes: an IPython kernel (not a terminal IPython)
    ipython = sys.modules.get("IPython")
    if ipython is None:
        return False
    try:
        shell = ipython.get_ipython()
    except Exception:  # an IPython too old or half imported: not worth a failed fit
        return False
    return shell is not None and "IPKernelApp" in getattr(shell, "config", {})
