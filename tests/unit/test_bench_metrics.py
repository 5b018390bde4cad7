"""Every metric of workshop.bench.request_metrics on hand-computed request timelines."""

import math

import pytest

from workshop.bench.request_metrics import (
    SLO,
    RequestRecord,
    duration,
    mean_concurrency,
    stats,
    summarize,
)


def rec(i, scheduled, sent, chunks, end, out=None, prompt=10, error=None, warmup=False,
        cached=None):
    return RequestRecord(index=i, scheduled=scheduled, sent=sent, first_token=chunks[0] if chunks
                         else None,
                         end=end, chunk_times=list(chunks), prompt_tokens=prompt,
                         output_tokens=len(chunks) if out is None else out, error=error,
                         warmup=warmup,
                         cached_tokens=cached)


# Request A: scheduled 0.0, sent 0.001, chunks at 0.2, 0.3, 0.5, end 0.5, 3 tokens.
#   TTFT 200 ms, E2E 500 ms, TPOT (500-200)/2 = 150 ms, ITL gaps 100, 200 ms.
# Request B: scheduled 1.0, sent 1.003, chunks at 1.1, 1.15 (usage says 5 tokens), stream
#   ends 1.2 (usage chunk, [DONE]). TTFT 100 ms, E2E 200 ms, TPOT (1150-1100)/4 = 12.5 ms
#   (decode time ends at the last token, like vLLM's), ITL gap 50 ms.
A = rec(0, 0.0, 0.001, [0.2, 0.3, 0.5], 0.5, prompt=10)
B = rec(1, 1.0, 1.003, [1.1, 1.15], 1.2, out=5, prompt=20)


def test_per_request_metrics():
    assert A.ttft == pytest.approx(0.2)
    assert A.e2e == pytest.approx(0.5)
    assert A.tpot == pytest.approx(0.15)
    assert A.itls == pytest.approx([0.1, 0.2])
    assert A.schedule_lag == pytest.approx(0.001)
    # TPOT divides by output tokens (from usage), not by chunks: chunks may carry several tokens
    assert B.tpot == pytest.approx(0.0125)
    assert B.itls == pytest.approx([0.05])


def test_tpot_undefined_for_one_token():
    r = rec(0, 0.0, 0.0, [0.3], 0.3)
    assert r.tpot is None and r.itls == []


def test_latency_is_measured_from_scheduled_not_sent():
    late = rec(0, scheduled=0.0, sent=0.4, chunks=[0.5], end=0.5)
    assert late.ttft == pytest.approx(0.5)
    assert late.schedule_lag == pytest.approx(0.4)


def test_stats_percentiles_match_hand_values():
    s = stats([1, 2, 3, 4], scale=1000)
    assert s["mean"] == pytest.approx(2500)
    assert s["median"] == pytest.approx(2500)
    # numpy linear interpolation: p90 of [1,2,3,4] = 1 + 0.9*3 = 3.7
    assert s["p90"] == pytest.approx(3700)
    assert s["p95"] == pytest.approx(3850)
    assert s["p99"] == pytest.approx(3970)
    assert stats([])["p99"] is None


def test_duration_and_concurrency():
    # span: first scheduled 0.0 -> last end 1.2
    assert duration([A, B]) == pytest.approx(1.2)
    # in flight: A 0.001..0.5 (0.499) + B 1.003..1.2 (0.197) over 1.2 s
    assert mean_concurrency([A, B]) == pytest.approx((0.499 + 0.197) / 1.2)


def test_summary_numbers():
    s = summarize([A, B])
    assert s["completed"] == 2 and s["errors"] == 0
    assert s["duration_s"] == pytest.approx(1.2)
    assert s["request_throughput"] == pytest.approx(2 / 1.2)
    assert s["output_throughput"] == pytest.approx((3 + 5) / 1.2)
    assert s["total_token_throughput"] == pytest.approx((3 + 5 + 10 + 20) / 1.2)
    assert s["ttft_ms"]["mean"] == pytest.approx(150)
    assert s["ttft_ms"]["median"] == pytest.approx(150)
    assert s["e2e_ms"]["mean"] == pytest.approx(350)
    # TPOT averaged over requests: (150 + 12.5) / 2
    assert s["tpot_ms"]["mean"] == pytest.approx(81.25)
    # ITL pooled over all gaps: 100, 200, 50
    assert s["itl_ms"]["mean"] == pytest.approx(350 / 3)
    assert s["itl_ms"]["median"] == pytest.approx(100)
    assert s["schedule_lag_ms"]["mean"] == pytest.approx(2.0)
    assert s["goodput"] == pytest.approx(s["request_throughput"])  # no SLO given


def test_goodput_applies_every_slo():
    both = [A, B]
    assert summarize(both, SLO(ttft_ms=150))["goodput"] == pytest.approx(1 / 1.2)   # only B
    assert summarize(both,
                     SLO(itl_ms=150))["goodput"] == pytest.approx(1 / 1.2)    # A has a 200 ms gap
    assert summarize(both,
                     SLO(tpot_ms=100))["goodput"] == pytest.approx(1 / 1.2)   # A's TPOT is 150
    assert summarize(both, SLO(e2e_ms=100))["goodput"] == 0.0
    assert summarize(both, SLO(ttft_ms=250, itl_ms=250, tpot_ms=200,
                               e2e_ms=600))["goodput"] == pytest.approx(2 / 1.2)


def test_errors_are_counted_not_dropped_and_warmup_is_excluded():
    bad = rec(2, 1.5, 1.5, [], 1.6, error="HTTP 500: boom")
    warm = rec(3, -5.0, -5.0, [-4.9], -4.8, warmup=True)
    s = summarize([warm, A, B, bad])
    assert s["completed"] == 2
    assert s["errors"] == 1
    assert s["error_kinds"] == {"HTTP 500: boom": 1}
    # the failed request still counts in the span (it ended at 1.6); the warm-up does not
    assert s["duration_s"] == pytest.approx(1.6)
    assert s["request_throughput"] == pytest.approx(2 / 1.6)


def test_client_cached_ratio():
    a = rec(0, 0, 0, [0.1, 0.2], 0.2, prompt=100, cached=60)
    b = rec(1, 0, 0, [0.1, 0.2], 0.2, prompt=100, cached=20)
    assert summarize([a, b])["client_cached_token_ratio"] == pytest.approx(0.4)
    assert summarize([A])["client_cached_token_ratio"] is None


def test_empty_run():
    s = summarize([])
    assert s["completed"] == 0 and s["request_throughput"] == 0.0 and s["ttft_ms"]["mean"] is None
    assert not math.isnan(s["mean_concurrency"])


def test_offered_rate_accounts_for_drain():
    from workshop.bench.request_metrics import offered_rate
    # 5 sessions arriving every 0.25 s, each taking 1 s: a server that keeps up. Span 2 s,
    # so plain throughput is 2.5 req/s, and the expected span is 1 s of arrivals + 1 s.
    recs = [rec(i, i * 0.25, i * 0.25, [i * 0.25 + 0.5, i * 0.25 + 1.0], i * 0.25 + 1.0)
            for i in range(5)]
    for i, r in enumerate(recs):
        r.session = i
    s = summarize(recs)
    assert offered_rate(recs) == pytest.approx(2.5)
    assert s["request_throughput"] == pytest.approx(2.5)
    assert s["arrival_span_s"] == pytest.approx(1.0) and s["session_median_s"] == pytest.approx(1.0)
    # a queue: the last request waits 2 s more, throughput falls below the offered rate
    recs[4].first_token += 2
    recs[4].chunk_times = [t + 2 for t in recs[4].chunk_times]
    recs[4].end += 2
    s = summarize(recs)
    assert offered_rate(recs) == pytest.approx(2.5)
    assert offered_rate(recs, drain_s=0.5) == pytest.approx(5 / 1.5)
    assert s["request_throughput"] == pytest.approx(5 / 4)
    # a session's later turns are part of its length, not new arrivals
    recs[4].session = 3
    # sessions start at 0, .25, .5, .75; lengths 1, 1, 1, 3.25 -> median 1
    assert offered_rate(recs) == pytest.approx(5 / (0.75 + 1.0))
    assert offered_rate(recs[:1]) is None


def test_waiting_for_a_cap_is_queueing_not_lag():
    r = rec(0, scheduled=1.0, sent=1.5005, chunks=[1.7], end=1.7)
    r.admitted = 1.5
    assert r.ttft == pytest.approx(0.7)          # from the arrival
    assert r.schedule_lag == pytest.approx(0.0005)
    assert r.queue_wait == pytest.approx(0.5)
    s = summarize([r, A])
    assert s["queue_wait_ms"]["mean"] == pytest.approx(500)
    assert s["schedule_lag_ms"]["mean"] == pytest.approx((0.5 + 1.0) / 2)


def test_warnings_name_what_to_distrust():
    late = rec(0, 0.0, 0.05, [0.2, 0.3], 0.3)
    late.max_tokens = 2
    short = rec(1, 0.0, 0.0, [0.1], 0.1, out=1)
    short.max_tokens = 8
    nousage = rec(2, 0.0, 0.0, [0.1, 0.2], 0.2)
    nousage.usage = False
    bad = rec(3, 0.0, 0.0, [], 0.1, error="HTTP 500")
    w = " | ".join(summarize([late, short, nousage, bad])["warnings"])
    assert ("schedule lag" in w and "1 of 4 requests failed" in w and "no usage" in w
            and "ignore_eos" in w)
    assert summarize([A, B])["warnings"] == []
