"""Is a load point keeping up? Offered vs asked load, the steady window, and the verdict.

Why not simply "completed / duration"? A run's duration ends when its *last* reply ends, so
with long answers it is dominated by the drain after the last arrival (and by the ramp-up
before the server holds its usual number of requests): an idle server then looks as if it
fell behind. Following GuideLLM (which leaves a warm-up and a cool-down out of each
benchmark), a point is judged over its **steady window**: from a warm-up after the first
arrival (at least the 90th percentile of an unloaded session's length, so the number of
requests in the system has reached its usual level) to the last arrival (the drain is left
out). Over that window, by flow balance, completions = arrivals - growth of the number in
the system, so

    achieved = session ends in the window / window,   offered = arrivals in the window / window.

A server that keeps up has achieved ~= offered; one that does not piles requests up. By flow
balance, arrivals - ends in the window is the growth of the number in the system across it; for
a server that keeps up it is noise, with a standard deviation of sqrt(2 x rate x mean(min(S, w)))
(S a session's length, w the window: exact for independent sessions, and at most sqrt(2 x
arrivals) however long the sessions grow) plus one (the last arrival, still in the system when
the window closes). The noise is taken from the offered rate and the sessions' lengths, not from
the number in the system, which an overload inflates: the old estimate, sqrt(2 x mean in the
system), grew with the very backlog it was meant to detect. A shortfall counts when the achieved
rate is below ``tolerance`` (0.9) x offered and the shortfall exceeds ``z`` times that noise.

Overload shows in other ways as well, and each is a sign of its own:

- the work in flight grows (``in_flight_grows``): the requests on their way and not finished
  (the client's own records, so every server shows it, whether it queues requests or, as vLLM
  does, admits them all and slows every token), sampled across the steady window; its
  least-squares trend times the window's length exceeds ``z`` times the noise above, computed
  over requests. A server that admits everything at once shows overload here, never as waiting
  requests or a rising TTFT;
- the server's own waiting queue (``vllm:num_requests_waiting``, sampled every 0.5 s) grows
  over the window: its mean over the second half exceeds the first half's by more than
  max(2, Z x sqrt(mean waiting)) (a stable queue fluctuates by about the square root of its
  length);
- TTFT grows: the median TTFT of the window's last third of arrivals exceeds the first
  third's by more than one unloaded session length (an overloaded queue adds waiting with
  every arrival; a stable one only fluctuates);
- and the client itself (``client_limited``: the point cannot vouch for the server either
  way): it sent fewer arrivals per second than scheduled, or its schedule lag grew across the
  window (a queue inside the client), or its p99 lag exceeds two mean gaps between arrivals
  (a stall that sent the arrivals it held back as one burst). A steady few milliseconds of
  lag, the operating system's scheduling noise, does not change the load.

``z`` is ``Z`` (2.5) unless the sweep measured a limit below the point: when the offered rate
exceeds ``ceiling`` (the maximum throughput of the sweep's closed-loop probe), the point achieved
no more than that maximum, and its window is long enough to judge (below), a shortfall or a
growth counts beyond one noise (``Z_ABOVE_CEILING``). With tens of requests per point and long
answers, a real overload is often only one or two noises deep, and there the sweep's own
measurement says to expect one: such a point must show that it kept up. A point that achieved
more than the probe's maximum has shown that maximum is no limit, and is judged as any other.
Above the maximum, a point that keeps up says how (``kept_up``: "achieved 0.5 of 0.51/s
offered (at least 0.9 x), in flight steady (...), above the 0.34/s the throughput probe
sustained").

A point can be too short to judge: the shortfall can never exceed its noise when the window
holds no more arrivals than ``Z`` x the noise (arrivals - ends is at most the arrivals), and
a verdict of "keeps up" claims that throughput tracked the offered load, which only that test
checks (the other signs can add overload, never rule it out). Such a point, with no
sign of overload, is **not judged** (``judged``): neither kept up nor overloaded. With four
requests per point (notebook 10's quick plan) the window holds two or three arrivals against
a threshold of at least 2.5 x (sqrt(2) + 1) ~= 6. The bar is ``Z``'s above the ceiling too.

Sessions (not requests) are the unit of arrival: for multi-turn workloads the rates are
sessions per second, as ``request_rate`` is.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Sequence

import numpy as np

from .request_metrics import RequestRecord

WARMUP_FRACTION = 0.1   # the window never starts earlier than this fraction of the arrival span
MAX_WARMUP_FRACTION = 0.6  # ... nor later: a shorter window is flagged ``short`` instead
Z = 2.5  # a shortfall or a queue's growth must exceed Z x its noise in a stable system
Z_ABOVE_CEILING = 1.0  # ... or one noise, where the load exceeds the throughput probe's maximum and
                        # the point achieved no more than it


@dataclass
class Baseline:
    """What an unloaded server looks like; sets the warm-up and the TTFT-growth threshold.

    From a synchronous probe (one request at a time) when the sweep ran one, else from a
    run's first sessions (they meet a nearly idle server).
    """

    session_p90_s: float
    session_median_s: float
    ttft_median_s: float | None = None
    source: str = "first sessions"

    @classmethod
    def from_records(cls, records: Sequence[RequestRecord], source: str,
                     first: int | None = None) -> "Baseline | None":
        """From every session of ``records`` (a synchronous probe), or the ``first`` to arrive."""
        table = sorted(_sessions(records), key=lambda s: s[0])[:first]
        if not table:
            return None
        lengths = [e - a for a, e, _, _ in table]
        ttfts = [r.ttft for _, _, _, r in table if r.ok]
        return cls(float(np.percentile(lengths, 90)), float(np.median(lengths)),
                   float(np.median(ttfts)) if ttfts else None, source)


def _arrival(r: RequestRecord) -> float:
    """When the session's first request was actually on its way: the schedule plus the
    client's lag (a wait for a concurrency cap is queueing, and does not move the arrival)."""
    return r.scheduled + max(r.schedule_lag, 0.0)


def _sessions(records: Sequence[RequestRecord]) -> list[tuple[float, float, bool, RequestRecord]]:
    by: dict[int, list[RequestRecord]] = {}
    for r in records:
        if not r.warmup:
            by.setdefault(r.session, []).append(r)
    out = []
    for rs in by.values():
        first = min(rs, key=lambda r: r.scheduled)
        end = max((r.end if r.end is not None else r.sent) for r in rs)
        out.append((_arrival(first), end, all(r.ok for r in rs), first))
    return out


def sessions(records: Sequence[RequestRecord]) -> list[tuple[float, float, bool]]:
    """(arrival, end, ok) per measured session: its first request's arrival, its last end."""
    return [(a, e, ok) for a, e, ok, _ in _sessions(records)]


def offered_vs_asked(records: Sequence[RequestRecord], asked_rate: float | None,
                     burstiness: float = 1.0) -> dict[str, Any]:
    """The load as asked, as scheduled and as offered (sessions/s), and why they differ.

    ``scheduled_rate``: (n - 1) / span of the arrival schedule the seed drew; a renewal
    process with n arrivals realises its rate only to within ``sampling_band_95`` (the 95%
    range of (n - 1) / span for gamma gaps of shape ``burstiness``), so with few requests it
    differs from the asked rate by chance. ``offered_rate``: the same over the times the
    arrivals actually went out; below ``scheduled_rate`` when the client was late.
    """
    table = _sessions(records)
    sched = sorted(r.scheduled for _, _, _, r in table)
    sent = sorted(a for a, _, _, _ in table)
    n = len(sched)
    out: dict[str, Any] = {"asked_rate": asked_rate, "arrivals": n,
                           "arrival_window_s": (sent[-1] - sent[0]) if n else 0.0,
                           "scheduled_rate": None, "offered_rate": None, "offered_vs_asked": None,
                           "sampling_band_95": None}
    if n >= 2 and sched[-1] > sched[0]:
        out["scheduled_rate"] = (n - 1) / (sched[-1] - sched[0])
    if n >= 2 and sent[-1] > sent[0]:
        out["offered_rate"] = (n - 1) / (sent[-1] - sent[0])
    if asked_rate and math.isfinite(asked_rate) and out["offered_rate"] is not None:
        out["offered_vs_asked"] = out["offered_rate"] / asked_rate
        if n >= 2:
            lo, hi = sampling_band(n, burstiness)
            out["sampling_band_95"] = [lo * asked_rate, hi * asked_rate]
    return out


def sampling_band(n: int, burstiness: float = 1.0, q: float = 0.95) -> tuple[float, float]:
    """Central ``q`` range of (n - 1) / span, relative to the asked rate, for n arrivals with
    Gamma(shape = burstiness) gaps: the span is Gamma(shape = b(n - 1)), relative sd
    1/sqrt(b(n-1))."""
    if not math.isfinite(burstiness):
        return 1.0, 1.0
    k = burstiness * (n - 1)
    draws = np.random.default_rng(0).gamma(k, 1.0 / k, 20000)  # mean gap / asked mean gap
    a, b = np.percentile(draws, [50 * (1 - q), 50 * (1 + q)])
    return float(1.0 / b), float(1.0 / a)


def steady_window(records: Sequence[RequestRecord], warmup_s: float = 0.0,
                  warmup_fraction: float = WARMUP_FRACTION) -> dict[str, Any] | None:
    """Arrivals, session ends and the number in the system over the steady window (see the
    module docstring). None with fewer than 3 sessions."""
    sess = sessions(records)
    if len(sess) < 3:
        return None
    arr = np.array(sorted(a for a, _, _ in sess))
    t0, t_end = float(arr[0]), float(arr[-1])
    span = t_end - t0
    warm = max(warmup_fraction * span, warmup_s)
    short = warm > MAX_WARMUP_FRACTION * span
    warm = min(warm, MAX_WARMUP_FRACTION * span)
    ta = t0 + warm
    w = t_end - ta
    if w <= 0:
        return None
    arrivals = int(sum(1 for a, _, _ in sess if ta < a <= t_end))
    ends = int(sum(1 for _, e, _ in sess if ta < e <= t_end))
    busy = sum(max(0.0, min(e, t_end) - max(a, ta)) for a, e, _ in sess)
    at = lambda t: int(sum(1 for a, e, _ in sess if a <= t < e))  # noqa: E731
    return {"start_s": ta, "end_s": t_end, "seconds": w, "warmup_s": warm, "short": short,
            "arrivals": arrivals, "completions": ends, "offered_rate": arrivals / w,
            "achieved_rate": ends / w,
            "mean_in_system": busy / w, "in_system_start": at(ta), "in_system_end": at(t_end)}


def _ttft_growth(records: Sequence[RequestRecord], ta: float, tb: float) -> float | None:
    """Median TTFT of the window's last third of arrivals minus its first third's (s)."""
    rs = sorted((r for r in records if not r.warmup and r.ok and ta < r.scheduled <= tb),
                key=lambda r: r.scheduled)
    if len(rs) < 6:
        return None
    k = len(rs) // 3
    return float(np.median([r.ttft for r in rs[-k:]]) - np.median([r.ttft for r in rs[:k]]))


def _halves(series: dict[str, list] | None, key: str, ta: float,
            tb: float) -> tuple[float, float, float] | None:
    """(first-half mean, second-half mean, peak) of a sampled gauge within [ta, tb]."""
    if not series or not series.get(key):
        return None
    pts = [(t, v) for t, v in zip(series["t"], series[key]) if v is not None and ta <= t <= tb]
    if len(pts) < 4:
        return None
    mid = (ta + tb) / 2
    first = [v for t, v in pts if t < mid]
    second = [v for t, v in pts if t >= mid]
    if not first or not second:
        return None
    return float(np.mean(first)), float(np.mean(second)), float(max(v for _, v in pts))


def stable_noise(rate: float, lengths: Sequence[float], window_s: float) -> float:
    """Standard deviation, plus one, of arrivals - ends over a window of ``window_s`` for a
    server that keeps up: sqrt(2 x rate x mean(min(length, window))) (independent sessions of
    the given lengths arriving at ``rate``; at least sqrt(2)) + 1 (the last arrival)."""
    held = float(np.mean(np.minimum(lengths, window_s))) if len(lengths) else 0.0
    return math.sqrt(2 * max(rate * held, 1.0)) + 1


def in_flight(records: Sequence[RequestRecord], times: Sequence[float]) -> np.ndarray:
    """The work in flight at each of ``times``: measured requests on their way and not finished
    (from its arrival, so a request the client's concurrency cap held back counts too, to its
    end; a failed request without an end counts until it was sent)."""
    rs = [r for r in records if not r.warmup]
    start = np.sort([_arrival(r) for r in rs])
    stop = np.sort([max(_arrival(r), r.end if r.end is not None else r.sent) for r in rs])
    t = np.asarray(times, dtype=float)
    return (np.searchsorted(start, t, side="right") - np.searchsorted(stop, t,
                                                                      side="right")).astype(float)


def _in_flight_trend(records: Sequence[RequestRecord], ta: float, tb: float,
                     samples: int = 101) -> tuple[float, float, float, float] | None:
    """(fitted in flight at ``ta``, at ``tb``, growth = trend x window, its noise): the
    least-squares line through the work in flight sampled across [ta, tb]."""
    w = tb - ta
    rs = [r for r in records if not r.warmup]
    if w <= 0 or len(rs) < 3:
        return None
    ts = np.linspace(ta, tb, samples)
    slope, at_a = np.polyfit(ts - ta, in_flight(rs, ts), 1)
    arrived = [_arrival(r) for r in rs]
    lengths = [max(0.0, (r.end if r.end is not None else r.sent) - a) for r, a in zip(rs, arrived)]
    rate = sum(1 for a in arrived if ta < a <= tb) / w
    return float(at_a), float(at_a + slope * w), float(slope * w), stable_noise(rate, lengths, w)


@dataclass
class Verdict:
    """Whether one point kept up, and the evidence. ``overloaded`` is any of the four server
    signs; ``client_limited`` means the client could not offer the load (lag). ``kept_up``:
    for a point that kept up, how (achieved of offered, the work in flight)."""

    overloaded: bool
    client_limited: bool
    reasons: list[str]
    falls_behind: bool
    queue_grows: bool | None      # None: the server reports no waiting queue
    ttft_grows: bool | None       # None: too few requests in the window
    throughput_ratio: float | None
    shortfall: int | None         # arrivals - session ends in the window
    shortfall_noise: float | None
    ttft_growth_s: float | None
    waiting_first_half: float | None
    waiting_second_half: float | None
    waiting_peak: float | None
    window: dict[str, Any] | None
    baseline: dict[str, Any] | None
    tolerance: float
    in_flight_grows: bool | None = None    # None: no steady window
    in_flight_start: float | None = None   # the least-squares line at the window's start and end
    in_flight_end: float | None = None
    in_flight_growth: float | None = None  # end - start
    in_flight_noise: float | None = None
    ceiling: float | None = None           # the throughput probe's maximum (sessions/s), if any
    above_ceiling: bool = False
    z: float = Z                           # a shortfall or a growth counts beyond z x its noise
    kept_up: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def judge(records: Sequence[RequestRecord], series: dict[str, list] | None = None,
          baseline: Baseline | None = None, tolerance: float = 0.9,
          ceiling: float | None = None) -> Verdict:
    """The verdict on one open-loop run (see the module docstring for each test). ``ceiling``:
    the maximum throughput (sessions/s) the sweep's closed-loop probe measured; a point offered
    more and achieving no more has its shortfall or growth of the work in flight count beyond
    one noise (``Z_ABOVE_CEILING``), not ``Z``."""
    if baseline is None:
        baseline = Baseline.from_records(records, "first sessions", first=5)
    win = steady_window(records, baseline.session_p90_s if baseline else 0.0)
    reasons: list[str] = []
    ratio = shortfall = noise = growth = None
    falls = False
    q_grows = t_grows = f_grows = None
    w1 = w2 = wpeak = None
    trend = None
    above = False
    z = Z
    if win is not None:
        ratio = win["achieved_rate"] / win["offered_rate"] if win["offered_rate"] > 0 else None
        shortfall = win["arrivals"] - win["completions"]
        lengths = [e - a for a, e, _ in sessions(records)]
        noise = stable_noise(win["offered_rate"], lengths, win["seconds"])
        above = bool(ceiling and win["offered_rate"] > ceiling)
        # Offered more than the probe's maximum and achieved no more than it: the probe's maximum
        # stands, and the bar drops to one noise (for a point long enough to judge at all: a
        # window too short for a shortfall to show stays not judged, as below the maximum).
        if above and win["achieved_rate"] <= ceiling and _could_fall_behind(win, noise):
            z = Z_ABOVE_CEILING
        falls = ratio is not None and ratio < tolerance and shortfall > z * noise
        if falls:
            reasons.append(f"throughput falls behind: {win['achieved_rate']:.3g} of "
                           f"{win['offered_rate']:.3g}/s offered over the steady window "
                           f"({shortfall} more arrivals than completions, noise {noise:.1f})")
        trend = _in_flight_trend(records, win["start_s"], win["end_s"])
        if trend is not None:
            f_grows = trend[2] > z * trend[3]
            if f_grows:
                reasons.append(f"work in flight grows: {trend[0]:.1f} -> {trend[1]:.1f} requests "
                               "across the steady "
                               f"window (least-squares trend, noise {trend[3]:.1f})")
        if (falls or f_grows) and z < Z:
            reasons.append(f"offered above the {ceiling:.3g}/s the throughput probe sustained, and "
                           "achieved no "
                           f"more: a shortfall or a growth counts beyond {z:g} x noise, not {Z:g}")
        h = _halves(series, "waiting", win["start_s"], win["end_s"])
        if h is not None:
            w1, w2, wpeak = h
            # a stable queue fluctuates by about sqrt(its length); growth must exceed Z times that
            q_grows = w2 - w1 > max(2.0, Z * math.sqrt(max((w1 + w2) / 2, 1.0)))
            if q_grows:
                reasons.append(f"server queue grows: {w1:.1f} -> {w2:.1f} waiting (window halves)")
        growth = _ttft_growth(records, win["start_s"], win["end_s"])
        if growth is not None and baseline is not None:
            t_grows = growth > baseline.session_median_s
            if t_grows:
                reasons.append(f"TTFT grows by {growth:.3g} s across the window (more than one "
                               "unloaded "
                               f"session, {baseline.session_median_s:.3g} s)")
    overloaded = bool(falls or f_grows or q_grows or t_grows)
    client = _client_limited(records, win)
    if client:
        reasons.append(client)
    kept = None
    if not overloaded and not _could_fall_behind(win, noise):
        reasons.append("not judged: too few arrivals in the steady window for a shortfall to show "
                       + (f"({win['arrivals']}, noise {noise:.1f}: a shortfall counts beyond "
                          f"{Z * noise:.1f})"
                          if win else "(no steady window: fewer than 3 sessions)"))
    elif not overloaded and win is not None:
        within = ratio is not None and ratio < tolerance
        kept = (f"achieved {win['achieved_rate']:.3g} of {win['offered_rate']:.3g}/s offered "
                + (f"(shortfall {shortfall} within {z:g} x noise {noise:.1f})" if within
                   else f"(at least {tolerance:g} x)"))
        if trend is not None:
            a, b, g, n = trend
            kept += (f", in flight steady ({a:.1f} -> {b:.1f}, noise {n:.1f})" if g <= n
                     else f", in flight {a:.1f} -> {b:.1f} (within {z:g} x noise {n:.1f})")
        if above:
            kept += (f", above the {ceiling:.3g}/s the throughput probe sustained"
                     + ("" if z < Z else " (achieved more: the probe's maximum is no limit)"))
    return Verdict(overloaded=overloaded, client_limited=bool(client), reasons=reasons,
                   falls_behind=falls, queue_grows=q_grows, ttft_grows=t_grows,
                   throughput_ratio=ratio,
                   shortfall=shortfall, shortfall_noise=noise, ttft_growth_s=growth,
                   waiting_first_half=w1,
                   waiting_second_half=w2, waiting_peak=wpeak, window=win,
                   baseline=asdict(baseline) if baseline else None, tolerance=tolerance,
                   in_flight_grows=f_grows, in_flight_start=trend[0] if trend else None,
                   in_flight_end=trend[1] if trend else None, in_flight_growth=trend[2] if trend
                   else None,
                   in_flight_noise=trend[3] if trend else None, ceiling=ceiling,
                   above_ceiling=above, z=z,
                   kept_up=kept)


def _could_fall_behind(win: dict[str, Any] | None, noise: float | None) -> bool:
    """Whether the throughput test could have failed: arrivals - ends, at most the arrivals,
    must be able to exceed ``Z`` x the noise."""
    return win is not None and noise is not None and win["arrivals"] > Z * noise


def judged(verdict: dict[str, Any] | None) -> bool | None:
    """Whether a stored verdict (``Verdict.to_dict()``, as in a point's ``summary["saturation"]``)
    says anything about the server: overloaded, or long enough that its throughput test could
    have failed (the module docstring). Computed from the stored evidence, so folders written
    before this rule read the same. None for no verdict (closed-loop points)."""
    if not verdict:
        return None
    return bool(verdict.get("overloaded")) or _could_fall_behind(verdict.get("window"),
                                                                 verdict.get("shortfall_noise"))


def _client_limited(records: Sequence[RequestRecord], win: dict[str, Any] | None) -> str | None:
    """Why the client did not offer the load as scheduled, or None.

    A steady lag (the machine's scheduling noise) delays arrivals without changing the rate;
    what spoils the load is a lag that *accumulates* (the offered rate falls short of the
    scheduled one, or the lag grows across the window: a queue inside the client) or a stall
    long enough to bunch arrivals (p99 lag over two mean gaps).
    """
    ld = offered_vs_asked(records, None)
    if (ld["scheduled_rate"] and ld["offered_rate"]
        and ld["offered_rate"] < 0.95 * ld["scheduled_rate"]):
        return (f"client-bound: it sent {ld['offered_rate']:.3g}/s of the "
                f"{ld['scheduled_rate']:.3g}/s "
                "scheduled")
    lag = [r.schedule_lag for r in records if not r.warmup]
    lag99 = float(np.percentile(lag, 99)) if lag else 0.0
    if ld["offered_rate"] and lag99 > max(0.005, 2.0 / ld["offered_rate"]):
        # a stall of two mean gaps sends the arrivals it held back as one burst
        return (f"client-bound: schedule lag p99 {1e3 * lag99:.0f} ms, more than two mean gaps "
                "between arrivals (the client or its machine stalled)")
    if win is None:
        return None
    rs = sorted((r for r in records if not r.warmup
                 and win["start_s"] < r.scheduled <= win["end_s"]),
                key=lambda r: r.scheduled)
    if len(rs) < 6:
        return None
    k = len(rs) // 3
    growth = float(np.median([r.schedule_lag for r in rs[-k:]]) - np.median([r.schedule_lag
                                                                             for r in rs[:k]]))
    ttft = [r.ttft for r in rs if r.ok]
    limit = max(0.005, 0.1 * (float(np.median(ttft)) if ttft else 0.0))
    if growth > limit:
        return f"client-bound: its schedule lag grew by {1e3 * growth:.1f} ms across the window"
    return None


def closed_loop_throughput(records: Sequence[RequestRecord], warmup_s: float = 0.0) -> float | None:
    """Sessions per second of a closed loop while every slot was busy, by Little's law:
    mean number in the system over the steady window (warm-up to the last session start) /
    mean length of the sessions that started in it. Counting completions instead would be
    quantised: a server with a concurrency limit finishes its requests in waves. None when
    every session started at once (no steady window)."""
    win = steady_window(records, warmup_s)
    if win is None or win["arrivals"] < 2:
        return None
    lengths = [e - a for a, e, _ in sessions(records) if win["start_s"] < a <= win["end_s"]]
    mean = float(np.mean(lengths))
    return win["mean_in_system"] / mean if mean > 0 else None
