"""A small text progress bar for long single-process loops."""

from __future__ import annotations

import sys
import time


class ProgressBar:
    """Progress on stderr, redrawn at most ten times a second."""

    def __init__(self, total: int, label: str = "", *, enabled: bool = True, stream=None):
        self.total = max(int(total), 1)
        self.label = label
        self.enabled = enabled
        self.stream = stream or sys.stderr
        self._last = 0.0
        self._start = time.perf_counter()

    def update(self, done: int, **info) -> None:
        if not self.enabled:
            return
        now = time.perf_counter()
        if done < self.total and now - self._last < 0.1:
            return
        self._last = now
        width = 30
        filled = int(width * done / self.total)
        extra = " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in info.items())
        line = f"\r{self.label} [{'#' * filled}{'.' * (width - filled)}] {done}/{self.total} {now - self._start:.1f}s {extra}"
        self.stream.write(line)
        if done >= self.total:
            self.stream.write("\n")
        self.stream.flush()
