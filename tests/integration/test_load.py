"""Concurrency and cancellation: many streams finish; a client that leaves frees its KV."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import httpx
import pytest

from reference_server import prometheus as P
from workshop.live.metrics_sampler import MetricsSampler, Samples

ENGINES = ["vllm", "sglang", "hf", "mini", "remote"]     # the fleet (tests/conftest.py)

pytestmark = pytest.mark.engine


def _wait_idle(server, timeout: float = 60.0) -> float:
    """Seconds until the engine reports no running request and an empty KV cache (generous:
    SGLang refreshes the figures behind its gauges only now and then while idle)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if (server.metric(P.NUM_REQUESTS_RUNNING) == 0
                and server.metric(P.KV_CACHE_USAGE) == 0):
            return time.monotonic() - t0
        time.sleep(0.25)
    raise AssertionError(f"engine still busy after {timeout} s: running="
                         f"{server.metric(P.NUM_REQUESTS_RUNNING)} kv="
                         f"{server.metric(P.KV_CACHE_USAGE)}")


def _eventually(condition, timeout: float = 5.0) -> bool:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if condition():
            return True
        time.sleep(0.1)
    return False


def test_64_concurrent_streams_with_clients_leaving(server):
    """64 streams at once, every fifth client (13, 20 %) hanging up after two chunks: every
    kept stream completes, and the engine ends with nothing running and an empty KV cache."""
    if server.engine == "remote":
        pytest.skip("remote relays with vLLM's and SGLang's code (ProxyEngine), tested here "
                    "already, to mini's engine, tested here already: 40 s of CI for nothing new")
    _wait_idle(server)
    tokens = 12 if server.engine != "hf" else 6       # hf runs them one at a time
    leavers = {i for i in range(64) if i % 5 == 0}
    # A leaver asks for far more than it reads, so it is still streaming when it hangs up on
    # any machine: a short one could finish first on a fast CPU and count no disconnect.
    leaver_tokens = 512
    left_before = server.metric(P.SERVER_CLIENT_DISCONNECTS)

    async def one(http: httpx.AsyncClient, i: int) -> int | None:
        body = {"model": server.model, "prompt": f"Request {i}: count to ten.",
                "max_tokens": leaver_tokens if i in leavers else tokens, "temperature": 0.8,
                "stream": True,
                "stream_options": {"include_usage": True}, "ignore_eos": True}
        usage, chunks = None, 0
        async with http.stream("POST", server.base_url + "/v1/completions", json=body,
                               headers=server.headers) as r:
            assert r.status_code == 200, await r.aread()
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                assert "error" not in chunk, chunk
                chunks += 1
                usage = chunk.get("usage") or usage
                if i in leavers and chunks == 2:
                    return None          # leaves the block: the connection is dropped
        return usage["completion_tokens"]

    async def all_of_them():
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=0)
        async with httpx.AsyncClient(timeout=600, limits=limits) as http:
            return await asyncio.gather(*(one(http, i) for i in range(64)))

    failed_before = server.metric(P.SERVER_STREAM_FAILURES)
    t0 = time.monotonic()
    results = asyncio.run(all_of_them())
    ran = time.monotonic() - t0
    assert [r for i, r in enumerate(results) if i not in leavers] == [tokens] * (64 - len(leavers))
    idle = _wait_idle(server, timeout=60)
    left = lambda: server.metric(P.SERVER_CLIENT_DISCONNECTS) - left_before  # noqa: E731
    # What a failure needs to be read (CI, 2026-12-06, vLLM: the count fell short once and
    # the test took 36 s, as if the leavers' 512 tokens were generated to the end)
    assert _eventually(lambda: left() >= len(leavers)), (
        f"{left():.0f} of {len(leavers)} leavers counted as disconnects, "
        f"{server.metric(P.SERVER_STREAM_FAILURES) - failed_before:.0f} streams failed; the "
        f"streams took {ran:.1f} s and the engine was idle {idle:.1f} s later\n"
        f"{server.log_tail(30)}")


def test_full_queue_is_refused_with_retry_after(server):
    """The engine holds at most what it runs plus --max-queued-requests; the next request
    gets a 429 with Retry-After at once, and the held ones are released when they leave."""
    _wait_idle(server)
    limits = httpx.get(server.base_url + "/server_info", headers=server.headers).json()["limits"]
    capacity = limits["max_running"] + limits["max_queued_requests"]
    assert capacity <= 80    # the fleet's settings (tests/conftest.py FLEET_ARGS)
    body = {"model": server.model, "prompt": "Tell me a story.", "max_tokens": 400,
            "ignore_eos": True, "stream": True}

    async def main():
        async with httpx.AsyncClient(timeout=120,
                                     limits=httpx.Limits(max_connections=None)) as http:
            async def hold():    # a client that waits as long as it is let
                async with http.stream("POST", server.base_url + "/v1/completions", json=body,
                                       headers=server.headers):
                    await asyncio.Event().wait()

            async def admitted() -> float:
                r = await http.get(server.base_url + "/metrics", headers=server.headers)
                return sum(float(line.rsplit(" ", 1)[1]) for line in r.text.splitlines()
                           if line.startswith("reference_server_requests_in_flight"))

            held = [asyncio.create_task(hold()) for _ in range(capacity)]
            try:
                t0 = time.monotonic()
                while await admitted() < capacity:
                    assert time.monotonic() - t0 < 60, await admitted()
                    await asyncio.sleep(0.2)
                extra = await http.post(server.base_url + "/v1/completions", json=body,
                                        headers=server.headers)
                assert extra.status_code == 429, extra.text
                assert extra.headers["retry-after"] == "1"
                assert extra.json()["error"]["code"] == "queue_full"
            finally:
                for t in held:
                    t.cancel()
                await asyncio.gather(*held, return_exceptions=True)

    asyncio.run(main())
    _wait_idle(server, timeout=60)
    t0 = time.monotonic()      # the slots come back as the server notices the hang-ups
    while (r := httpx.post(server.base_url + "/v1/completions", headers=server.headers,
                           timeout=60, json={"model": server.model, "prompt": "hi",
                                             "max_tokens": 2})).status_code == 429:
        assert time.monotonic() - t0 < 30
        time.sleep(0.5)
    assert r.status_code == 200, r.text


def test_hf_baseline_serves_concurrent_requests_one_at_a_time(hf_server):
    client = hf_server.async_openai()
    peak_running = []

    async def one(i: int) -> int:
        r = await client.completions.create(model=hf_server.model, prompt=f"Item {i}:",
                                            max_tokens=4, extra_body={"ignore_eos": True})
        return r.usage.completion_tokens

    async def watch(done: asyncio.Event):
        async with httpx.AsyncClient() as http:
            while not done.is_set():
                text = (await http.get(hf_server.base_url + "/metrics",
                                       headers=hf_server.headers)).text
                peak_running.append(P.totals(text).get(P.NUM_REQUESTS_RUNNING, 0.0))
                await asyncio.sleep(0.05)

    async def main():
        done = asyncio.Event()
        watcher = asyncio.create_task(watch(done))
        results = await asyncio.gather(*(one(i) for i in range(6)))
        done.set()
        await watcher
        return results

    assert asyncio.run(main()) == [4] * 6
    assert max(peak_running) == 1   # the lock: never two at once


GAUGES = (P.NUM_REQUESTS_RUNNING, P.KV_CACHE_USAGE)


def _showed_a_request(samples: Samples) -> bool:
    """The gauges, sampled while a request streamed, showed it running with KV in use."""
    return samples.peak(P.NUM_REQUESTS_RUNNING) >= 1 and samples.peak(P.KV_CACHE_USAGE) > 0


def _describe(samples: Samples) -> str:
    """What a failed wait should show; a long gap between samples is a slow (starved) scrape."""
    gaps = [b - a for a, b in zip(samples.times, samples.times[1:])]
    return (f"most running seen {samples.peak(P.NUM_REQUESTS_RUNNING)}, most KV in use "
            f"{samples.peak(P.KV_CACHE_USAGE)}; {len(samples.times)} scrapes ({samples.errors} "
            f"failed), longest gap {max(gaps, default=0.0):.1f} s")


@pytest.mark.parametrize("engine", ENGINES)
def test_disconnect_mid_stream_frees_kv(request, engine):
    """A client that hangs up mid-stream: the engine stops generating for it and frees its KV.

    The client leaves only once the gauges have shown its request running and holding KV, so
    the test also proves they are live; the request asks for as many tokens as the context
    holds, and a run in which it still finished first is inconclusive and tried once more
    (vLLM can stream 1500 tokens in under half a minute on a quiet 2-core machine, and in CI,
    2026-12-03, the gauges were never seen at 1 while one did).
    """
    server = request.getfixturevalue(f"{engine}_server")
    max_tokens = 2000       # the fleet's context is 2048 (tests/conftest.py)

    def read() -> dict[str, float]:
        return P.totals(httpx.get(server.base_url + "/metrics", headers=server.headers,
                                  timeout=30).text)

    for attempt in range(2):
        _wait_idle(server)
        produced_before = server.metric(P.GENERATION_TOKENS)
        finished, hang_up, status = threading.Event(), threading.Event(), []
        body = {"model": server.model, "prompt": "Tell me a very long story.",
                "max_tokens": max_tokens, "stream": True, "ignore_eos": True}

        def client() -> None:
            # keeps reading (a paused reader would stall the stream by back-pressure), then
            # drops the connection without reading to the end
            with httpx.Client(timeout=60) as http:
                with http.stream("POST", server.base_url + "/v1/completions", json=body,
                                 headers=server.headers) as r:
                    status.append(r.status_code)
                    for line in r.iter_lines():
                        if hang_up.is_set():
                            return
                        if line == "data: [DONE]":
                            finished.set()

        reader = threading.Thread(target=client)
        with MetricsSampler(read, GAUGES) as sampler:
            reader.start()
            seen = sampler.samples
            try:
                t0 = time.monotonic()
                while not (_showed_a_request(seen) or finished.is_set() or not reader.is_alive()):
                    assert time.monotonic() - t0 < 180, \
                        f"no sign of the request in 180 s: {_describe(seen)}"
                    time.sleep(0.1)
            finally:
                hang_up.set()
                reader.join(60)
        assert status == [200], status
        if _showed_a_request(seen) and not finished.is_set():
            break
        print(f"attempt {attempt + 1} inconclusive: the stream "
              f"{'finished' if finished.is_set() else 'ended'} first ({_describe(seen)})")
    assert _showed_a_request(seen), (f"the gauges never showed the request: {_describe(seen)}\n"
                                     f"{server.log_tail(30)}")
    assert not finished.is_set(), \
        f"the request finished before its client could leave: {_describe(seen)}"
    _wait_idle(server, timeout=30)
    produced = server.metric(P.GENERATION_TOKENS)
    assert produced - produced_before < max_tokens      # cut short, not finished
    time.sleep(1.0)
    assert server.metric(P.GENERATION_TOKENS) == produced


@pytest.mark.parametrize("engine", ENGINES)
def test_disconnect_non_streaming_frees_kv(request, engine):
    server = request.getfixturevalue(f"{engine}_server")
    _wait_idle(server)
    body = {"model": server.model, "prompt": "Write an essay.", "max_tokens": 1500,
            "ignore_eos": True}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(server.base_url + "/v1/completions", json=body, headers=server.headers,
                   timeout=httpx.Timeout(3.0, connect=5.0))
    _wait_idle(server, timeout=20)
