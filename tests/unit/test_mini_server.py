"""``MiniEngine``: the teaching engine behind the reference server's LocalEngine contract."""

from __future__ import annotations

import asyncio

import pytest
import torch

from reference_server.config import ServerConfig
from reference_server.engines.local import SamplingParams
from reference_server.models import ModelError, resolve_model


@pytest.fixture(scope="module")
def engine():
    try:
        spec = resolve_model("smollm2-135m", prepare=False)
    except ModelError as exc:
        pytest.skip(f"bundled model not prepared: {exc}")
    torch.set_num_threads(1)
    from reference_server.engines.mini import MiniEngine
    cfg = ServerConfig(engine="mini", device="cpu", kv_cache_gib=0.05,
                       engine_args=["--prefix-cache", "radix", "--spec", "ngram", "--threads", "1"])
    eng = MiniEngine(cfg, spec)
    loop = asyncio.new_event_loop()
    loop.run_until_complete(eng.start())
    yield eng, loop
    loop.run_until_complete(eng.stop())
    loop.close()


def test_engine_args_parsed(engine):
    eng, _ = engine
    info = eng.info()
    assert info.engine == "mini" and info.prefix_caching and info.block_size == 16
    assert info.extra["spec"] == "ngram" and info.extra["prefix_cache"] == "radix"
    assert info.kv_capacity_tokens > 0


def test_stream_abort_frees_blocks_and_metrics(engine):
    eng, loop = engine
    prompt = eng.tokenizer.encode("One two three four five six seven eight nine ten. " * 4)

    async def run():
        full = []
        async for step in eng.generate("a", prompt, SamplingParams(max_tokens=12, temperature=0,
                                                                   ignore_eos=True)):
            full += step.token_ids
        assert len(full) == 12 and step.finish_reason == "length"
        gen = eng.generate("b", prompt, SamplingParams(max_tokens=200, temperature=0,
                                                       ignore_eos=True))
        first = await gen.__anext__()
        assert first.cached_tokens > 0            # the prompt's full blocks were cached by "a"
        await gen.aclose()                        # the client goes away
        for _ in range(200):
            await asyncio.sleep(0.02)
            if eng.stats().num_running == 0 and eng.stats().kv_cache_usage == 0:
                break
        return full

    loop.run_until_complete(run())
    s = eng.stats()
    assert s.num_running == 0 and s.num_waiting == 0 and s.kv_cache_usage == 0
    assert s.prefix_cache_hits > 0
    text = loop.run_until_complete(eng.metrics_text())
    assert "vllm:num_requests_running" in text and "vllm:spec_decode_num_draft_tokens" in text


def test_bad_engine_args_rejected():
    from reference_server.engines.mini import _engine_config
    with pytest.raises(ValueError):
        _engine_config(ServerConfig(engine="mini"), "cpu", ["--spec", "medusa"])
