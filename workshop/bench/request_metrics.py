"""Latency and throughput metrics, as pure functions of per-request timelines.

Definitions (written down in docs/benchmarking.md; tools disagree, see the table there):

- every latency is measured from the request's *scheduled* send time, not from when the
  client got round to sending it, so a late client cannot hide a slow server;
- TTFT: scheduled -> first chunk carrying generated text;
- E2E: scheduled -> last byte of the stream;
- TPOT (vLLM's definition): per request (last token - first token) / (output_tokens - 1),
  i.e. vLLM's (latency - TTFT) / (n - 1) where its latency ends at the last token chunk (the
  usage chunk and [DONE] that follow are not decode time); requests with a single output
  token have none; the summary averages over requests;
- ITL: every gap between consecutive text-carrying chunks, pooled over all requests (a chunk
  may carry several tokens, so ITL and TPOT differ when a server batches its stream);
- schedule lag: sent - scheduled (or - admitted, after waiting for a concurrency cap), the
  client's own lateness.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Sequence

import numpy as np

PERCENTILES = (50, 90, 95, 99)


@dataclass
class RequestRecord:
    """What one request did. Times are seconds on the client's monotonic clock."""

    index: int                      # position in send order (warm-up requests included)
    session: int = 0                # requests of one session depend on each other
    tag: str = ""                   # workload's label for the request ("turn-2", "branch-1/0", ...)
    scheduled: float = 0.0          # when the harness meant to send it
    sent: float = 0.0               # when the HTTP request actually started
    admitted: float | None = None   # capped open loop: when a slot freed up (after ``scheduled``)
    first_token: float | None = None
    end: float | None = None
    chunk_times: list[float] = field(default_factory=list)  # arrival of each text-carrying chunk
    prompt_tokens: int = 0          # from the server's usage when given, else the client's count
    output_tokens: int = 0          # from the server's usage when given, else number of chunks
    cached_tokens: int | None = None  # usage.prompt_tokens_details.cached_tokens, if reported
    max_tokens: int = 0
    error: str | None = None
    warmup: bool = False
    usage: bool = True              # False: the server sent no usage chunk, tokens = chunks

    @property
    def ok(self) -> bool:
        return self.error is None and self.end is not None and self.first_token is not None

    @property
    def ttft(self) -> float | None:
        return None if self.first_token is None else self.first_token - self.scheduled

    @property
    def e2e(self) -> float | None:
        return None if self.end is None else self.end - self.scheduled

    @property
    def tpot(self) -> float | None:
        if not self.ok or self.output_tokens < 2:
            return None
        return (self.chunk_times[-1] - self.first_token) / (self.output_tokens - 1)

    @property
    def itls(self) -> list[float]:
        t = self.chunk_times
        return [b - a for a, b in zip(t, t[1:])]

    @property
    def schedule_lag(self) -> float:
        """The client's own lateness; a wait for a concurrency cap is queueing, not lag."""
        return self.sent - (self.admitted if self.admitted is not None else self.scheduled)

    @property
    def queue_wait(self) -> float:
        return 0.0 if self.admitted is None else self.admitted - self.scheduled


def percentile(values: Iterable[float], q: float) -> float:
    """The project's one percentile: the ``q``-th, interpolated linearly between the two
    nearest ranks (numpy's default "linear" method, the one vLLM's benchmark uses).

    Infinite values are allowed (a caller may count a request that never came back as
    infinitely slow): a rank that draws any weight from an infinite value is infinite,
    where numpy would give nan. An empty input gives nan.
    """
    arr = np.sort(np.asarray(list(values), dtype=float))
    if arr.size == 0:
        return float("nan")
    rank = q / 100 * (arr.size - 1)
    lo, hi = int(np.floor(rank)), int(np.ceil(rank))
    frac = rank - lo
    if frac == 0 or arr[lo] == arr[hi]:
        return float(arr[lo])
    if np.isinf(arr[hi]):
        return float(arr[hi])
    return float(np.percentile(arr, q))


def stats(values: Iterable[float], scale: float = 1.0) -> dict[str, float | None]:
    """mean, median, p90, p95, p99 (``percentile``: linear interpolation, like vLLM), times
    ``scale``.

    An empty input gives ``None`` everywhere rather than a misleading 0.
    """
    arr = np.asarray(list(values), dtype=float) * scale
    out: dict[str, float | None] = {"mean": None, "median": None}
    out.update({f"p{p}": None for p in PERCENTILES if p != 50})
    if arr.size == 0:
        return out
    out["mean"] = float(arr.mean())
    out["median"] = percentile(arr, 50)
    for p in PERCENTILES:
        if p != 50:
            out[f"p{p}"] = percentile(arr, p)
    return out


@dataclass(frozen=True)
class SLO:
    """Service-level objectives in milliseconds; ``None`` means not checked.

    A request meets the ITL objective when every one of its chunk gaps is within it, and the
    TPOT objective when its own TPOT is (vLLM's goodput uses TPOT).
    """

    ttft_ms: float | None = None
    itl_ms: float | None = None
    tpot_ms: float | None = None
    e2e_ms: float | None = None

    def met_by(self, r: RequestRecord) -> bool:
        if not r.ok:
            return False
        if self.ttft_ms is not None and r.ttft * 1e3 > self.ttft_ms:
            return False
        if self.e2e_ms is not None and r.e2e * 1e3 > self.e2e_ms:
            return False
        if self.tpot_ms is not None and (r.tpot or 0.0) * 1e3 > self.tpot_ms:
            return False
        if self.itl_ms is not None and any(g * 1e3 > self.itl_ms for g in r.itls):
            return False
        return True


def duration(records: Sequence[RequestRecord]) -> float:
    """Measured span: earliest scheduled time -> latest end (or send, for failed requests)."""
    if not records:
        return 0.0
    start = min(r.scheduled for r in records)
    stop = max((r.end if r.end is not None else r.sent) for r in records)
    return max(stop - start, 0.0)


def mean_concurrency(records: Sequence[RequestRecord]) -> float:
    """Time-averaged number of requests in flight (sent -> end), by Little's law."""
    span = duration(records)
    if span <= 0:
        return 0.0
    busy = sum((r.end - r.sent) for r in records if r.end is not None)
    return busy / span


def sessions_of(records: Sequence[RequestRecord]) -> list[tuple[float, float]]:
    """(start, end) of each session: its first scheduled time, its last end."""
    spans: dict[int, list[float]] = {}
    for r in records:
        end = r.end if r.end is not None else r.sent
        s = spans.setdefault(r.session, [r.scheduled, end])
        s[0] = min(s[0], r.scheduled)
        s[1] = max(s[1], end)
    return [(a, b) for a, b in spans.values()]


def offered_rate(records: Sequence[RequestRecord], drain_s: float | None = None) -> float | None:
    """Requests/s the schedule offered, as realized, with ramp-up and drain accounted for.

    A server that keeps up finishes the run about one unloaded session length (``drain_s``)
    after the last session arrived, so ``n / (arrival span + drain_s)`` is the throughput it
    would show; ``request_throughput`` falls below it when a queue builds up. A sweep passes
    the median session length of its lightest point as ``drain_s``; by default the run's own
    median is used, which understates the offered rate once the server saturates. (A bare
    n / arrival span would make every short run look saturated, because of the drain.)
    """
    spans = sessions_of(records)
    if len(spans) < 2:
        return None
    starts = sorted(a for a, _ in spans)
    if drain_s is None:
        drain_s = float(np.median([b - a for a, b in spans]))
    expected = (starts[-1] - starts[0]) + drain_s
    return len(records) / expected if expected > 0 else None


def summarize(records: Sequence[RequestRecord], slo: SLO | None = None) -> dict:
    """The summary dictionary of a run. Warm-up records are ignored; failed ones are counted.

    Throughputs divide by ``duration(measured)``; token throughputs count only completed
    requests. ``goodput`` is completed requests per second meeting every objective in ``slo``
    (equal to request throughput when no objective is given).
    """
    measured = [r for r in records if not r.warmup]
    done = [r for r in measured if r.ok]
    failed = [r for r in measured if not r.ok]
    span = duration(measured)
    per_s = (lambda n: n / span) if span > 0 else (lambda n: 0.0)
    slo = slo or SLO()
    out_tokens = sum(r.output_tokens for r in done)
    in_tokens = sum(r.prompt_tokens for r in done)
    itls = [g for r in done for g in r.itls]
    cached = [r.cached_tokens for r in done if r.cached_tokens is not None]
    error_kinds: dict[str, int] = {}
    for r in failed:
        key = (r.error or "no response")[:200]
        error_kinds[key] = error_kinds.get(key, 0) + 1
    warnings = []
    lag99 = stats((r.schedule_lag for r in measured), 1e3)["p99"]
    ttft50 = stats((r.ttft for r in done), 1e3)["median"]
    if lag99 is not None and lag99 > max(5.0, 0.1 * (ttft50 or 0.0)):
        warnings.append(f"client schedule lag p99 {lag99:.1f} ms: the client (or its machine) was "
                        "late, so the load offered was lower than asked")
    if failed:
        warnings.append(f"{len(failed)} of {len(measured)} requests failed (see error_kinds)")
    no_usage = sum(1 for r in done if not r.usage)
    if no_usage:
        warnings.append(f"{no_usage} responses had no usage chunk: their output tokens are counted "
                        "as chunks (a lower bound)")
    short = sum(1 for r in done if r.usage and r.max_tokens and r.output_tokens < r.max_tokens)
    if short:
        warnings.append(f"{short} responses stopped before max_tokens (does the server honour "
                        "ignore_eos?)")
    return {
        "warnings": warnings,
        "completed": len(done),
        "errors": len(failed),
        "error_kinds": error_kinds,
        "duration_s": span,
        "total_input_tokens": in_tokens,
        "total_output_tokens": out_tokens,
        "request_throughput": per_s(len(done)),
        "output_throughput": per_s(out_tokens),
        "total_token_throughput": per_s(in_tokens + out_tokens),
        "goodput": per_s(sum(1 for r in done if slo.met_by(r))),
        "num_sessions": len(sessions_of(measured)),
        "arrival_span_s": (max(a for a, _ in sessions_of(measured))
                           - min(a for a, _ in sessions_of(measured)) if measured else 0.0),
        "session_median_s": (float(np.median([b - a for a, b in sessions_of(measured)])) if measured
                             else None),
        "slo": {k: v for k, v in vars(slo).items() if v is not None},
        "mean_concurrency": mean_concurrency(measured),
        "ttft_ms": stats((r.ttft for r in done), 1e3),
        "tpot_ms": stats((r.tpot for r in done if r.tpot is not None), 1e3),
        "itl_ms": stats(itls, 1e3),
        "e2e_ms": stats((r.e2e for r in done), 1e3),
        "schedule_lag_ms": stats((r.schedule_lag for r in measured), 1e3),
        # time arrivals waited for a free slot under a concurrency cap (open loop only)
        "queue_wait_ms": stats((r.queue_wait for r in measured if r.admitted is not None), 1e3),
        # Prefix-cache hits as the server reported them per request, when it does.
        "client_cached_token_ratio": (sum(cached) / max(sum(r.prompt_tokens for r in done
                                                            if r.cached_tokens is not None), 1)
                                      if cached else None),
    }
