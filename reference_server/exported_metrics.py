"""Prometheus metrics under vLLM's names, so one dashboard reads every engine.

``EngineMetrics`` is what an in-process engine exports (a proxied vLLM exports its own).
``ServerMetrics`` counts what the HTTP layer itself sees, for every engine.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from reference_server import prometheus as P

if TYPE_CHECKING:
    from reference_server.engines.local import EngineStats

# vLLM's bucket edges, so histograms from different engines can be compared bucket by bucket.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
               7.5, 10.0, 20.0, 40.0, 80.0)
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
               60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)


class _StatsCollector:
    """Turns the engine's current ``EngineStats`` into gauges and counters at scrape time."""

    def __init__(self) -> None:
        self.stats: EngineStats | None = None
        self.model_name = ""

    def collect(self):
        s = self.stats
        if s is None:
            return
        labels = ["model_name"]
        values = [self.model_name]
        for name, doc, value in [
            (P.NUM_REQUESTS_RUNNING, "Requests in the running batch.", s.num_running),
            (P.NUM_REQUESTS_WAITING, "Requests waiting to be scheduled.", s.num_waiting),
            (P.KV_CACHE_USAGE, "KV-cache usage, 0 to 1.", s.kv_cache_usage),
        ]:
            g = GaugeMetricFamily(name, doc, labels=labels)
            g.add_metric(values, float(value))
            yield g
        for name, doc, value in [
            (P.PREFIX_CACHE_QUERIES, "Prompt tokens looked up in the prefix cache.",
             s.prefix_cache_queries),
            (P.PREFIX_CACHE_HITS, "Prompt tokens found in the prefix cache.",
             s.prefix_cache_hits),
            (P.NUM_PREEMPTIONS, "Requests preempted for lack of KV blocks.",
             s.num_preemptions),
        ]:
            c = CounterMetricFamily(name, doc, labels=labels)
            c.add_metric(values, float(value))
            yield c


class EngineMetrics:
    """Latency histograms and token counters an in-process engine updates as it streams."""

    def __init__(self, model_name: str = "") -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self._stats = _StatsCollector()
        self._stats.model_name = model_name
        r.register(self._stats)
        self.ttft = Histogram(P.TIME_TO_FIRST_TOKEN, "Time to first token.",
                              buckets=TTFT_BUCKETS, registry=r)
        self.itl = Histogram(P.INTER_TOKEN_LATENCY, "Time between output tokens.",
                             buckets=ITL_BUCKETS, registry=r)
        self.e2e = Histogram(P.E2E_REQUEST_LATENCY, "Request latency, end to end.",
                             buckets=E2E_BUCKETS, registry=r)
        self.prompt_tokens = Counter(P.PROMPT_TOKENS, "Prompt tokens processed.",
                                     registry=r)
        self.generation_tokens = Counter(P.GENERATION_TOKENS, "Tokens generated.",
                                         registry=r)
        self.requests_success = Counter(P.REQUEST_SUCCESS, "Finished requests.",
                                        ["finished_reason"], registry=r)

    def set_model_name(self, name: str) -> None:
        self._stats.model_name = name

    def render(self, stats: EngineStats) -> str:
        self._stats.stats = stats
        return generate_latest(self.registry).decode()


class _RestartsCollector:
    """The engine's own count of restarts, read at scrape time: one count, never two that
    could disagree."""

    def __init__(self, count: Callable[[], int]) -> None:
        self.count = count

    def collect(self):
        c = CounterMetricFamily(P.SERVER_ENGINE_RESTARTS,
                                "Engine processes started again after one died or hung.")
        c.add_metric([], float(self.count()))
        yield c


class ServerMetrics:
    """The HTTP layer's own view: requests by endpoint and status, in flight, errors, and
    the engine's restarts (``restarts``: how to read their count)."""

    def __init__(self, restarts: Callable[[], int] = lambda: 0) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        r.register(_RestartsCollector(restarts))
        self.requests = Counter(P.SERVER_REQUESTS, "HTTP requests answered.",
                                ["endpoint", "status"], registry=r)
        self.in_flight = Gauge(P.SERVER_IN_FLIGHT,
                               "Generation requests being served.", registry=r)
        self.disconnects = Counter(P.SERVER_CLIENT_DISCONNECTS,
                                   "Streams the client closed before the end.", registry=r)
        self.stream_failures = Counter(P.SERVER_STREAM_FAILURES,
                                       "Streams that ended with an error event (the status, "
                                       "200, was already sent).", registry=r)
        self.engine_up = Gauge(P.SERVER_ENGINE_UP, "1 while the engine serves.",
                               registry=r)

    def render(self) -> str:
        return generate_latest(self.registry).decode()
