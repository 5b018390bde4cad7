"""Which replica gets the next request: spread the load, or concentrate it.

Both read only the gateway's own count of outstanding requests per replica (sent, reply not
finished), which the gateway keeps exactly, with no call to the replicas.

* ``spread``: the replica with the fewest outstanding requests; ties go round robin, so an
  idle fleet is used in turn (the rule of vLLM's data-parallel balancer, which counts
  requests, and of most proxies' "least connections").
* ``concentrate``: the first replica in the list until it holds ``max_per_replica``, then the
  next: load piles onto few replicas, which run bigger batches, and the last ones stay idle
  while demand allows: replicas that could be released. When every replica is full, the one
  with the fewest outstanding takes the overflow.
"""

from __future__ import annotations

from typing import Sequence

POLICIES = ("spread", "concentrate")


class Spread:
    name = "spread"

    def __init__(self) -> None:
        self._next = 0          # where the round robin among tied replicas resumes

    def choose(self, outstanding: Sequence[int]) -> int:
        n = len(outstanding)
        least = min(outstanding)
        for step in range(n):
            i = (self._next + step) % n
            if outstanding[i] == least:
                self._next = (i + 1) % n
                return i
        raise AssertionError("unreachable")


class Concentrate:
    name = "concentrate"

    def __init__(self, max_per_replica: int) -> None:
        if max_per_replica < 1:
            raise ValueError("max_per_replica must be >= 1")
        self.max_per_replica = max_per_replica

    def choose(self, outstanding: Sequence[int]) -> int:
        for i, k in enumerate(outstanding):
            if k < self.max_per_replica:
                return i
        return min(range(len(outstanding)), key=lambda i: outstanding[i])


def make_policy(name: str, max_per_replica: int = 8) -> Spread | Concentrate:
    if name == "spread":
        return Spread()
    if name == "concentrate":
        return Concentrate(max_per_replica)
    raise ValueError(f"unknown policy {name!r}; choose from {POLICIES}")
