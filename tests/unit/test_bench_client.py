"""The client and scheduler against the in-process mock server (no model, no timing asserts)."""

import asyncio

import pytest

from reference_server import prometheus
from workshop.bench.client import Load, OpenAIClient, Runner, arrival_times
from workshop.bench.mock_server import MockServer
from workshop.bench.request_metrics import SLO, summarize
from workshop.bench.results import BenchResult
from workshop.bench.run import arun_benchmark
from workshop.bench.server_metrics import ServerSamples
from workshop.bench.workloads import Request, Session, SingleRequest


def run(coro):
    return asyncio.run(coro)


async def with_server(fn, **kw):
    srv = MockServer(**kw)
    port = await srv.start()
    try:
        return await fn(f"http://127.0.0.1:{port}", srv)
    finally:
        await srv.close()


def test_arrival_times_mean_rate_and_shape():
    t = arrival_times(2001, rate=50.0, burstiness=1.0, seed=0)
    assert t[0] == 0.0 and all(b >= a for a, b in zip(t, t[1:]))
    assert t[-1] / 2000 == pytest.approx(1 / 50, rel=0.1)
    assert arrival_times(2001, 50.0, seed=0) == t  # seeded
    even = arrival_times(5, rate=4.0, burstiness=float("inf"))
    assert even == pytest.approx([0, 0.25, 0.5, 0.75, 1.0])
    # burstiness < 1 means more variable gaps than Poisson
    import numpy as np

    def cv(x):
        return np.std(np.diff(x)) / np.mean(np.diff(x))

    assert (cv(arrival_times(4000, 10.0, 0.25, seed=1)) > cv(arrival_times(4000, 10.0, 1.0, seed=1))
            > cv(arrival_times(4000, 10.0, 4.0, seed=1)))


@pytest.mark.parametrize("api", ["chat", "completions"])
def test_stream_records_tokens_and_usage(api):
    async def go(url, srv):
        async with OpenAIClient(url, "mock") as c:
            runner = Runner(c)
            req = (Request(5, messages=[{"role": "user", "content": "a b c"}]) if api == "chat"
                   else Request(5, prompt="a b c"))
            await runner.run([SingleRequest(req)], Load(concurrency=1))
            return runner.log
    log = run(with_server(go))
    (r,) = log.records
    assert r.ok and r.output_tokens == 5 and len(r.chunk_times) == 5
    assert r.cached_tokens == r.prompt_tokens // 2
    assert r.scheduled <= r.sent <= r.first_token <= r.chunk_times[-1] <= r.end
    assert log.sent[0].reply == " w0 w1 w2 w3 w4"


def test_errors_are_recorded():
    async def go(url, srv):
        async with OpenAIClient(url, "fail-503") as c:
            runner = Runner(c)
            await runner.run([SingleRequest(Request(3, prompt="x")) for _ in range(3)],
                             Load(concurrency=2))
        async with OpenAIClient("http://127.0.0.1:9", "mock",
                                timeout_s=2) as c:  # nothing listens there
            runner2 = Runner(c)
            await runner2.run([SingleRequest(Request(3, prompt="x"))], Load(concurrency=1))
        return runner.log.records + runner2.log.records
    recs = run(with_server(go))
    s = summarize(recs)
    assert s["completed"] == 0 and s["errors"] == 4
    assert any(k.startswith("HTTP 503") for k in s["error_kinds"])
    assert any("Connect" in k or "Error" in k for k in s["error_kinds"] if not k.startswith("HTTP"))


def test_closed_loop_never_exceeds_concurrency():
    async def go(url, srv):
        async with OpenAIClient(url, "mock") as c:
            runner = Runner(c)
            await runner.run([SingleRequest(Request(4, prompt="x")) for _ in range(12)],
                             Load(concurrency=3))
            return runner.log.records
    recs = run(with_server(go, chunk_delay_s=0.005))
    events = sorted([(r.sent, 1) for r in recs] + [(r.end, -1) for r in recs])
    level = peak = 0
    for _, d in events:
        level += d
        peak = max(peak, level)
    assert peak <= 3 and len(recs) == 12 and all(r.ok for r in recs)
    # a freed slot schedules the next request at the end of the previous one, not later
    ends = sorted(r.end for r in recs)
    assert all(any(abs(r.scheduled - e) < 1e-9 for e in ends) or r.scheduled == recs[0].scheduled
               for r in recs)


def test_dependent_requests_are_scheduled_at_previous_end():
    class TwoTurns(Session):
        def expected_requests(self):
            return 2

        async def run(self, send):
            await send(Request(3, prompt="one"))
            await send(Request(3, prompt="two"))

    async def go(url, srv):
        async with OpenAIClient(url, "mock") as c:
            runner = Runner(c)
            await runner.run([TwoTurns(), TwoTurns()], Load(request_rate=1000.0, seed=0))
            return runner.log.records
    recs = run(with_server(go))
    for s in (0, 1):
        a, b = [r for r in recs if r.session == s]
        assert b.scheduled == a.end


def test_run_benchmark_end_to_end_and_results_round_trip(tmp_path):
    async def go(url, srv):
        return await arun_benchmark(url, "mock", "shared-prefix", num_requests=8, concurrency=None,
                                    request_rate=200.0, seed=0, warmup=1, progress=False,
                                    tokenizer=None,
                                    output_dir=str(tmp_path / "res"), num_groups=2,
                                    system_prompt_len=30,
                                    question_len=5, output_len=4, slo=SLO(ttft_ms=10_000))
    res = run(with_server(go))
    s = res.summary
    assert s["completed"] == 8 and s["errors"] == 0
    assert s["total_output_tokens"] == 32
    assert s["server"]["metrics_available"] and s["server"]["peak_kv_usage"] == 0.25
    assert s["server"]["prefix_cache_hit_rate"] == pytest.approx(0.5, abs=0.05)
    assert s["workload"]["requests"] == 8 and s["workload"]["prefix_reuse_ratio"] > 0.3
    assert len([r for r in res.records if r.warmup]) == 1
    back = BenchResult.load(tmp_path / "res")
    assert back.summary["completed"] == 8 and back.summary["ttft_ms"] == s["ttft_ms"]
    assert back.records == res.records
    assert back.config["workload"] == "shared-prefix" and back.config["request_rate"] == 200.0
    assert summarize(back.records, None)["ttft_ms"] == s["ttft_ms"]
    for name in ("config.json", "environment.json", "summary.json", "requests.jsonl"):
        assert (tmp_path / "res" / name).exists()
    assert not list((tmp_path / "res").glob("*.png"))   # figures are the caller's to draw


def test_metric_totals_and_run_deltas():
    text = ('# HELP x\nvllm:prefix_cache_queries_total{engine="0"} '
            '100\nvllm:prefix_cache_queries_total{engine="1"} 50\n'
            "vllm:prefix_cache_hits_total 30\nvllm:kv_cache_usage_perc "
            "0.5\nvllm:num_preemptions_total 2\n"
            'vllm:time_to_first_token_seconds_bucket{le="+Inf"} 7\n')
    m = prometheus.totals(text)
    assert m["vllm:prefix_cache_queries_total"] == 150
    assert m["vllm:time_to_first_token_seconds_bucket"] == 7
    after = dict(m, **{"vllm:prefix_cache_queries_total": 250.0,
                       "vllm:prefix_cache_hits_total": 90.0,
                       "vllm:num_preemptions_total": 5.0, "vllm:kv_cache_usage_perc": 0.1})
    s = ServerSamples(before=m, after=after,
                      during=[(0.0, {"vllm:kv_cache_usage_perc": 0.8})]).summary()
    assert s["prefix_cache_hit_rate"] == pytest.approx(60 / 100)
    assert s["preemptions"] == 3 and s["peak_kv_usage"] == 0.8
    assert ServerSamples().summary() == {"metrics_available": False}
    sg = ServerSamples(before={"sglang:cache_hit_rate": 0.1},
                       after={"sglang:cache_hit_rate": 0.4}).summary()
    assert sg["prefix_cache_hit_rate"] == 0.4


def test_a_crashing_session_is_an_error_not_a_crash():
    class Broken(Session):
        async def run(self, send):
            await send(Request(2, prompt="fine"))
            raise RuntimeError("bug in a workload script")

    async def go(url, srv):
        async with OpenAIClient(url, "mock") as c:
            runner = Runner(c)
            await runner.run([Broken(), SingleRequest(Request(2, prompt="x"))], Load(concurrency=1))
            return runner.log
    log = run(with_server(go))
    assert len(log.records) == len(log.sent) == 3
    s = summarize(log.records)
    assert s["completed"] == 2 and s["errors"] == 1
    assert "bug in a workload script" in next(iter(s["error_kinds"]))


def test_capped_open_loop_counts_the_wait_from_arrival():
    async def go(url, srv):
        async with OpenAIClient(url, "mock") as c:
            runner = Runner(c)
            # 6 arrivals at once (rate inf-like, evenly spaced 1 ms) but only 1 slot
            await runner.run([SingleRequest(Request(3, prompt="x")) for _ in range(6)],
                             Load(concurrency=1, request_rate=1000.0, burstiness=float("inf")))
            return runner.log.records
    recs = run(with_server(go, chunk_delay_s=0.01))
    assert all(r.ok for r in recs)
    # each later request queued behind the previous: admitted at its end, scheduled at its arrival
    for a, b in zip(recs, recs[1:]):
        assert b.admitted == pytest.approx(a.end)
        assert b.scheduled < b.admitted
        assert b.ttft >= b.first_token - b.admitted
