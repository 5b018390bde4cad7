"""Timing pieces of code on a shared machine: the best of a few runs, and for pieces whose
times are compared, rounds that run each of them in turn."""

from __future__ import annotations

import time
from typing import Callable

from mini_engine.model_runner import keep_freed_memory

# vLLM's worker busy-polls its shared-memory queue for 1 s after its last read
# (vllm/distributed/device_communicators/shm_broadcast.py, SpinCondition's busy_loop_s), and
# OpenMP threads spin briefly too: on 2 cores that spin takes a core from whatever runs next.
SERVER_REST_S = 2.0


def let_servers_rest(seconds: float = SERVER_REST_S) -> None:
    """Wait until the servers' threads have stopped spinning after their last request, before
    timing anything else on this machine (another server's run, a roof)."""
    time.sleep(seconds)


def best_time_s(fn: Callable[[], object], repeats: int = 3) -> float:
    """Fastest of ``repeats`` timed calls after one warm-up (the least disturbed by others).

    The warm-up pays for first touches (page faults, thread pool, caches) only if freed
    memory is kept for the next call, so this first asks the C allocator to keep it
    (``keep_freed_memory``, as the teaching engine does): otherwise a loop that allocates and
    frees the same few-megabyte tensors can time page faults instead of the code."""
    return interleaved_times({"fn": fn}, repeats)["fn"]


def interleaved_times(fns: dict[str, Callable[[], object]], rounds: int = 3) -> dict[str, float]:
    """The best time of each of ``fns`` over ``rounds`` rounds, every round calling each once in
    turn, after one warm-up call each (and freed memory kept, as ``best_time_s`` says). Timed
    one after another (each its own best of a few), two candidates meet different moments of a
    shared machine, and a burst of other work during one of them makes a ratio of the two
    anything; interleaved, the burst slows all of them."""
    keep_freed_memory()
    for fn in fns.values():
        fn()                               # warm up: page faults, thread pool, caches
    best = {name: float("inf") for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            best[name] = min(best[name], time.perf_counter() - t0)
    return best


__all__ = [
    "best_time_s",
    "interleaved_times",
    "keep_freed_memory",
    "let_servers_rest",
]
