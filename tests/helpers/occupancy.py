"""Counting how many threads are inside a section at once, for tests of concurrency limits."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager


class Occupancy:
    """`with occupancy.inside(seconds):` marks a thread as inside for that long; `peak` is the most at once."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._current = 0
        self.peak = 0

    @contextmanager
    def inside(self, seconds: float = 0.0) -> Iterator[None]:
        with self._lock:
            self._current += 1
            self.peak = max(self.peak, self._current)
        try:
            time.sleep(seconds)
            yield
        finally:
            with self._lock:
                self._current -= 1
