"""Read a server's Prometheus ``/metrics`` text, and sample it while requests run.

The notebooks only need plain numbers (a gauge's value now, a counter's total), so the parser
sums every label set of a sample name: ``vllm:num_requests_running{model_name="a"} 2`` and
``{model_name="b"} 1`` read as 3. Histograms keep their ``_bucket``/``_sum``/``_count``
sample names, so ``vllm:time_to_first_token_seconds_sum`` is a number too.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass, field
from typing import Callable


def parse_prometheus(text: str) -> dict[str, float]:
    """Map each sample name to the sum of its values over all label sets."""
    out: dict[str, float] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if "{" in line:
            name = line[:line.index("{")]
            rest = line[line.rindex("}") + 1:].split()
        else:
            name, *rest = line.split()
        if not rest:
            continue
        try:
            value = float(rest[0])   # "+Inf", "NaN" parse too; a timestamp may follow
        except ValueError:
            continue
        if math.isnan(value):
            continue
        out[name] = out.get(name, 0.0) + value
    return out


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
