"""Concurrency and cancellation: many streams finish; a client that leaves frees its KV."""

from __future__ import annotations

import asyncio
import threading
import time

import httpx
import pytest

from reference_server import prometheus as P

pytestmark = pytest.mark.engine


def _wait_idle(server, timeout: float = 30.0) -> float:
    """Seconds until the engine reports no running request and an empty KV cache."""
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


def test_64_concurrent_streams_all_complete(vllm_server):
    client = vllm_server.async_openai()

    async def one(i: int) -> int:
        stream = await client.completions.create(
            model=vllm_server.model, prompt=f"Request {i}: count to ten.", max_tokens=16,
            temperature=0.8, seed=i, stream=True, stream_options={"include_usage": True},
            extra_body={"ignore_eos": True})
        usage = None
        async for chunk in stream:
            usage = chunk.usage or usage
        return usage.completion_tokens

    async def all_of_them():
        return await asyncio.gather(*(one(i) for i in range(64)))

    assert asyncio.run(all_of_them()) == [16] * 64
    _wait_idle(vllm_server)


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
                text = (await http.get(hf_server.base_url + "/metrics")).text
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


@pytest.mark.parametrize("engine", ["vllm", "hf"])
def test_disconnect_mid_stream_frees_kv(request, engine):
    server = request.getfixturevalue(f"{engine}_server")
    _wait_idle(server)
    body = {"model": server.model, "prompt": "Tell me a very long story.", "max_tokens": 1500,
            "stream": True, "ignore_eos": True}
    streaming, hang_up = threading.Event(), threading.Event()

    def client() -> None:
        # keeps reading (a paused reader would stall the stream by back-pressure), then
        # drops the connection without reading to the end
        with httpx.Client(timeout=60) as http:
            with http.stream("POST", server.base_url + "/v1/completions", json=body,
                             headers=server.headers) as r:
                assert r.status_code == 200
                for i, _ in enumerate(r.iter_lines()):
                    if i >= 6:
                        streaming.set()
                    if hang_up.is_set():
                        return

    reader = threading.Thread(target=client)
    reader.start()
    try:
        assert streaming.wait(60)
        # gauges are refreshed by the engine loop: give them a moment
        assert _eventually(lambda: server.metric(P.NUM_REQUESTS_RUNNING) == 1)
        assert _eventually(lambda: server.metric(P.KV_CACHE_USAGE) > 0)
    finally:
        hang_up.set()
        reader.join(30)
    # 1500 tokens would take far longer than this at CPU speed: the request was aborted
    _wait_idle(server, timeout=20)
    produced = server.metric(P.GENERATION_TOKENS)
    time.sleep(1.0)
    assert server.metric(P.GENERATION_TOKENS) == produced


@pytest.mark.parametrize("engine", ["vllm", "hf"])
def test_disconnect_non_streaming_frees_kv(request, engine):
    server = request.getfixturevalue(f"{engine}_server")
    _wait_idle(server)
    body = {"model": server.model, "prompt": "Write an essay.", "max_tokens": 1500,
            "ignore_eos": True}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(server.base_url + "/v1/completions", json=body, headers=server.headers,
                   timeout=httpx.Timeout(3.0, connect=5.0))
    _wait_idle(server, timeout=20)
