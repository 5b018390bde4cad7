"""Server-side numbers, read from the engine's Prometheus ``/metrics`` endpoint.

Scraped before and after the run (counters are differenced) and sampled during it (gauges:
the peak is what matters). Knows vLLM's and SGLang's metric names; a server without
``/metrics`` (or with other names) simply yields ``None`` values, never an error.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from reference_server import prometheus as P
from reference_server.prometheus import first as _first

# The same quantity under each engine's (and vLLM version's) name. vLLM counters are in
# tokens; SGLang exports a running hit-rate gauge instead.
PREFIX_QUERIES = (P.PREFIX_CACHE_QUERIES, P.OLD_PREFIX_CACHE_QUERIES)
PREFIX_HITS = (P.PREFIX_CACHE_HITS, P.OLD_PREFIX_CACHE_HITS)
KV_USAGE = (P.KV_CACHE_USAGE, P.OLD_KV_CACHE_USAGE, P.SGLANG_TOKEN_USAGE)
PREEMPTIONS = (P.NUM_PREEMPTIONS,)
SGLANG_HIT_RATE = (P.SGLANG_CACHE_HIT_RATE,)
RUNNING = (P.NUM_REQUESTS_RUNNING, P.SGLANG_NUM_RUNNING)
WAITING = (P.NUM_REQUESTS_WAITING, P.SGLANG_NUM_QUEUED)


def _delta(before: dict[str, float], after: dict[str, float],
           names: tuple[str, ...]) -> float | None:
    a, b = _first(after, names), _first(before, names)
    return None if a is None or b is None else a - b


@dataclass
class ServerSamples:
    """Scrapes of one run: before, during (gauges) and after."""

    before: dict[str, float] | None = None
    after: dict[str, float] | None = None
    during: list[tuple[float, dict[str, float]]] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        """prefix_cache_hit_rate (0-1, over this run), peak_kv_usage (0-1), preemptions, ..."""
        out: dict[str, Any] = {"metrics_available": self.before is not None
                               and self.after is not None}
        if not out["metrics_available"]:
            return out
        b, a = self.before, self.after
        queries, hits = _delta(b, a, PREFIX_QUERIES), _delta(b, a, PREFIX_HITS)
        if queries is not None and hits is not None:
            out["prefix_cache_queries"] = queries
            out["prefix_cache_hits"] = hits
            out["prefix_cache_hit_rate"] = hits / queries if queries > 0 else None
        elif _first(a, SGLANG_HIT_RATE) is not None:
            # SGLang's gauge is a running rate, not per run: report it as the server gives it.
            out["prefix_cache_hit_rate"] = _first(a, SGLANG_HIT_RATE)
        preempt = _delta(b, a, PREEMPTIONS)
        if preempt is not None:
            out["preemptions"] = preempt
        gauges = [m for _, m in self.during] + [a]
        kv = [v for v in (_first(m, KV_USAGE) for m in gauges) if v is not None]
        if kv:
            out["peak_kv_usage"] = max(kv)
        running = [v for v in (_first(m, RUNNING) for m in gauges) if v is not None]
        waiting = [v for v in (_first(m, WAITING) for m in gauges) if v is not None]
        if running:
            out["peak_running"] = max(running)
        if waiting:
            out["peak_waiting"] = max(waiting)
        out["samples"] = len(self.during)
        out["series"] = self.series()
        return out

    def series(self) -> dict[str, list]:
        """The gauges sampled during the run, on the run's clock (s): what the saturation
        verdict reads (the waiting queue over the steady window). ``None`` where not reported."""
        return {"t": [t for t, _ in self.during],
                "running": [_first(m, RUNNING) for _, m in self.during],
                "waiting": [_first(m, WAITING) for _, m in self.during],
                "kv_usage": [_first(m, KV_USAGE) for _, m in self.during]}


class MetricsScraper:
    """Reads ``<base_url>/metrics`` with the client's aiohttp session."""

    def __init__(self, session: Any, base_url: str, headers: dict[str, str] | None = None):
        self.session = session
        self.url = base_url.rstrip("/") + "/metrics"
        self.headers = headers or {}
        self.samples = ServerSamples()
        self.available = True

    async def scrape(self) -> dict[str, float] | None:
        if not self.available:
            return None
        try:
            async with self.session.get(self.url, headers=self.headers) as resp:
                if resp.status != 200:
                    self.available = False
                    return None
                return P.totals(await resp.text())
        except Exception:
            self.available = False
            return None

    async def sample_until(self, stop: asyncio.Event, clock, interval_s: float = 0.5) -> None:
        """Sample gauges every ``interval_s`` until ``stop`` is set (cheap: one GET each)."""
        while not stop.is_set() and self.available:
            m = await self.scrape()
            if m is not None:
                self.samples.during.append((clock(), m))
            try:
                await asyncio.wait_for(stop.wait(), interval_s)
            except asyncio.TimeoutError:
                pass
