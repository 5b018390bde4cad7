"""Timing a piece of code on a shared machine: the best of a few runs."""

from __future__ import annotations

import time
from typing import Callable

from mini_engine.model_runner import keep_freed_memory


def best_time_s(fn: Callable[[], object], repeats: int = 3) -> float:
    """Fastest of ``repeats`` timed calls after one warm-up (the least disturbed by others).

    The warm-up pays for first touches (page faults, thread pool, caches) only if freed
    memory is kept for the next call, so this first asks the C allocator to keep it
    (``keep_freed_memory``, as the teaching engine does): otherwise a loop that allocates and
    frees the same few-megabyte tensors can time page faults instead of the code."""
    keep_freed_memory()
    fn()                                   # warm up: page faults, thread pool, caches
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


__all__ = [
    "best_time_s",
    "keep_freed_memory",
]
