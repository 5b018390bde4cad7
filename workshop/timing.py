"""Timing a piece of code on a shared machine: the best of a few runs."""

from __future__ import annotations

import time
from typing import Callable


def best_time_s(fn: Callable[[], object], repeats: int = 3) -> float:
    """Fastest of ``repeats`` timed calls after one warm-up (the least disturbed by others)."""
    fn()                                   # warm up: page faults, thread pool, caches
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


__all__ = [
    "best_time_s",
]
