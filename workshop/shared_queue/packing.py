"""The packing policy: several small models in one worker's memory budget.

Pinned models are loaded at start and never leave. Any other model is loaded the first time
a request for it arrives (lazily) and, when the budget is full, the least recently used
unpinned models that no running request needs are evicted first, so the bytes in memory
never exceed the budget, not even for a moment. A model that cannot fit until a running
request finishes waits.

Pure logic, no model in sight: the worker (``worker.py``) asks ``admit`` what to do and then
does it; a replay (``replay``) runs the same object over a list of requests; and Che's
approximation (``che_hit_rate``) predicts an LRU cache's hit rate from the popularity alone.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np


@dataclass(frozen=True)
class Admission:
    """What a worker must do before it can run a request for ``model``."""

    model: str
    hit: bool                        # already in memory
    evict: tuple[str, ...] = ()      # unload these first, in this order


class ModelPool:
    """Which models are in memory, in least-recently-used order, under ``budget`` bytes."""

    def __init__(self, budget: int, sizes: dict[str, int], pinned: Sequence[str] = ()):
        self.budget = int(budget)
        self.sizes = dict(sizes)
        self.pinned = tuple(pinned)
        unknown = [m for m in self.pinned if m not in self.sizes]
        if unknown:
            raise ValueError(f"pinned models without a size: {unknown}")
        if sum(self.sizes[m] for m in self.pinned) > self.budget:
            raise ValueError(f"the pinned models ({sum(self.sizes[m] for m in self.pinned):,} "
                             f"bytes) do not fit the budget ({self.budget:,} bytes)")
        self.loaded: OrderedDict[str, int] = OrderedDict((m, self.sizes[m]) for m in self.pinned)
        self.hits = self.misses = 0
        self.evictions: list[str] = []

    @property
    def used(self) -> int:
        return sum(self.loaded.values())

    def can_ever_fit(self, model: str) -> bool:
        pinned = sum(self.sizes[m] for m in self.pinned)
        return model in self.pinned or pinned + self.sizes[model] <= self.budget

    def admit(self, model: str, busy: Iterable[str] = ()) -> Admission | None:
        """Make ``model`` resident and mark it most recently used.

        ``busy``: models with requests running (they cannot be evicted). Returns what to
        evict (the bookkeeping is already done: the caller unloads, then loads), or None when
        the model cannot fit until a busy model finishes. Raises ValueError for a model that
        never fits beside the pinned ones.
        """
        if model not in self.sizes:
            raise KeyError(f"unknown model {model!r}")
        if model in self.loaded:
            self.loaded.move_to_end(model)
            self.hits += 1
            return Admission(model, hit=True)
        if not self.can_ever_fit(model):
            raise ValueError(f"{model} ({self.sizes[model]:,} bytes) never fits beside the "
                             f"pinned models in a budget of {self.budget:,} bytes")
        busy = set(busy)
        need = self.used + self.sizes[model] - self.budget
        victims = []
        for m in self.loaded:                      # oldest first
            if need <= 0:
                break
            if m in self.pinned or m in busy:
                continue
            victims.append(m)
            need -= self.loaded[m]
        if need > 0:
            return None                            # wait for a busy model to finish
        for m in victims:
            del self.loaded[m]
        self.evictions += victims
        self.loaded[model] = self.sizes[model]
        self.misses += 1
        assert self.used <= self.budget
        return Admission(model, hit=False, evict=tuple(victims))

    @property
    def hit_rate(self) -> float:
        n = self.hits + self.misses
        return self.hits / n if n else 0.0


# -- popularity, replay and prediction ----------------------------------------------------------

def zipf_weights(n: int, s: float) -> np.ndarray:
    """Popularity of the models ranked 1..n: p(k) proportional to 1 / k^s (s = 0: uniform)."""
    w = 1.0 / np.arange(1, n + 1) ** s
    return w / w.sum()


def zipf_models(names: Sequence[str], s: float, n: int, rng: np.random.Generator) -> list[str]:
    """``n`` requests' models, drawn independently with Zipf(s) popularity in ``names`` order."""
    return [names[i] for i in rng.choice(len(names), size=n, p=zipf_weights(len(names), s))]


def replay(models: Sequence[str], budget: int, sizes: dict[str, int],
           pinned: Sequence[str] = ()) -> ModelPool:
    """The policy over a sequence of requests, one at a time (nothing busy)."""
    pool = ModelPool(budget, sizes, pinned)
    for m in models:
        pool.admit(m)
    return pool


def che_hit_rate(p: Sequence[float], capacity: float, pinned: int = 0) -> float:
    """Expected hit rate of an LRU cache of ``capacity`` equal-sized models, requests drawn
    independently with popularity ``p`` (Che, Tung and Wang 2002), the first ``pinned``
    models pinned (always hits; the LRU part holds ``capacity - pinned`` of the others).

    The approximation: model i stays in an LRU cache if it is asked for again within a
    "characteristic time" T, hit_i = 1 - exp(-p_i T), with T such that the cache is full on
    average: sum_i (1 - exp(-p_i T)) = capacity.
    """
    p = np.asarray(p, dtype=float)
    hot, rest = p[:pinned], p[pinned:]
    c = capacity - pinned
    if c <= 0 or rest.sum() == 0:
        return float(hot.sum())
    if c >= len(rest):
        return float(p.sum())
    q = rest / rest.sum()                        # the LRU part sees only the unpinned requests

    def filled(t):
        return float(np.sum(1 - np.exp(-q * t))) - c

    lo, hi = 0.0, 1.0
    while filled(hi) < 0:
        hi *= 2
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if filled(mid) < 0 else (lo, mid)
    return float(hot.sum() + np.sum(rest * (1 - np.exp(-q * hi))))


__all__ = ["Admission", "ModelPool", "zipf_weights", "zipf_models", "replay", "che_hit_rate"]
