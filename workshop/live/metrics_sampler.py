"""Sample a server's Prometheus ``/metrics`` while requests run.

Parsing and the metric names live in ``reference_server.prometheus``; the notebooks read plain
numbers through ``prometheus.totals`` (each sample name summed over its label sets).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Callable


@dataclass
class Samples:
    """Time series of a few metrics, sampled by ``MetricsSampler``."""

    names: tuple[str, ...]
    times: list[float] = field(default_factory=list)       # seconds since the sampler started
    values: dict[str, list[float]] = field(default_factory=dict)
    errors: int = 0

    def peak(self, name: str) -> float:
        series = self.values.get(name, [])
        return max(series) if series else 0.0


class MetricsSampler:
    """Poll a ``/metrics`` reader in a background thread: ``with MetricsSampler(read, names):``.

    A gauge such as ``vllm:kv_cache_usage_perc`` is a momentary value: it is only non-zero
    while requests hold KV blocks, so it must be read *while* they run, not afterwards.
    """

    def __init__(self, read: Callable[[], dict[str, float]], names: tuple[str, ...],
                 interval: float = 0.1) -> None:
        self.read = read
        self.samples = Samples(names=names, values={n: [] for n in names})
        self.interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._t0 = 0.0

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                m = self.read()
            except Exception:   # a slow or failed poll must not kill the measurement
                self.samples.errors += 1
            else:
                self.samples.times.append(time.monotonic() - self._t0)
                for n in self.samples.names:
                    self.samples.values[n].append(m.get(n, 0.0))
            self._stop.wait(self.interval)

    def __enter__(self) -> "MetricsSampler":
        self._t0 = time.monotonic()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
