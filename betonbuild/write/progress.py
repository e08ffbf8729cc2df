"""Readable progress for log files: one line every few seconds, no carriage returns."""

from __future__ import annotations

import sys
import time
from datetime import timedelta


class Progress:
    def __init__(self, label: str, total: int, stream=None, every_seconds: float = 5.0):
        self.label, self.total = label, total
        self.stream = stream or sys.stderr
        self.every = every_seconds
        self.start = self.last_print = time.monotonic()
        self.done = 0

    def update(self, done: int) -> None:
        self.done = done
        now = time.monotonic()
        if now - self.last_print >= self.every:
            self.last_print = now
            self._print(now)

    def close(self) -> None:
        self._print(time.monotonic(), final=True)

    def _print(self, now: float, final: bool = False) -> None:
        elapsed = max(now - self.start, 1e-9)
        rate = self.done / elapsed
        eta = timedelta(seconds=round((self.total - self.done) / rate)) if rate > 0 and not final else None
        pct = 100.0 * self.done / self.total if self.total else 100.0
        line = f"{self.label}: {self.done}/{self.total} samples ({pct:.1f}%), {rate:,.0f} samples/s"
        line += f", elapsed {timedelta(seconds=round(elapsed))}" if final else f", ETA {eta}" if eta else ""
        print(line, file=self.stream, flush=True)
