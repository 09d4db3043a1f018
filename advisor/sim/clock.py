"""The emulated server's clock: the system's by default, or a ManualClock that tests (and the advisor under
test, through `Advisor(wall_clock=clock.time)`) share and step explicitly, so end-to-end runs need no sleeps."""

from __future__ import annotations

import threading
import time


class SystemClock:
    def monotonic(self) -> float:
        return time.monotonic()

    def time(self) -> float:
        return time.time()


class ManualClock:
    """A clock that moves only when told to; `time()` starts at a fixed epoch so runs are reproducible."""

    def __init__(self, start: float = 1_800_000_000.0) -> None:
        self._lock = threading.Lock()
        self._elapsed = 0.0
        self._start = start

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError(f"a clock does not go back ({seconds} s)")
        with self._lock:
            self._elapsed += seconds

    def monotonic(self) -> float:
        with self._lock:
            return self._elapsed

    def time(self) -> float:
        with self._lock:
            return self._start + self._elapsed
