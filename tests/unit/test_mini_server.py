"""``MiniEngine``: the teaching engine behind the reference server's LocalEngine contract."""

from __future__ import annotations

import asyncio

import pytest
import torch

import mini_engine.linear as mini_linear
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
    # A pool smaller than the context (about 1.2k tokens in bf16, 0.6k in fp32): one valid
    # prompt can need more blocks than the pool holds, on any CPU's compute dtype.
    cfg = ServerConfig(engine="mini", device="cpu", kv_cache_gib=0.025,
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


def test_served_lone_decodes_leave_a_core_to_the_server(monkeypatch):
    from reference_server.engines.mini import _engine_config
    monkeypatch.setattr(torch, "get_num_threads", lambda: 4)
    # a CPU whose oneDNN has no bf16 (CI's): packing only when float32's is asked for
    monkeypatch.setattr(mini_linear, "can_prepack", lambda dtype, device, fp32=False: fp32)
    served = ServerConfig(engine="mini")
    cfg = _engine_config(served, "cpu", [])
    assert (cfg.num_threads, cfg.solo_threads) == (None, 3)
    assert _engine_config(served, "cpu", ["--threads", "2"]).solo_threads == 1
    assert _engine_config(served, "cpu", ["--solo-threads", "4"]).solo_threads == 4  # flag wins
    assert _engine_config(served, "cuda", []).solo_threads is None
    # float32 weights packed for oneDNN: every core (the packed kernel gains from the second)
    packed = ["--compute-dtype", "float32", "--prepack-fp32"]
    assert _engine_config(served, "cpu", packed).solo_threads == 4
    assert _engine_config(served, "cpu", packed + ["--threads", "2"]).solo_threads == 2
    assert _engine_config(served, "cpu", packed + ["--no-prepack"]).solo_threads == 3
    assert _engine_config(served, "cpu", packed + ["--quant", "int8"]).solo_threads == 3
    # bf16 weights are packed by default, where this CPU's oneDNN computes bf16
    monkeypatch.setattr(mini_linear, "can_prepack", lambda dtype, device, fp32=False: True)
    bf16 = ["--compute-dtype", "bf16"]
    assert _engine_config(served, "cpu", bf16).solo_threads == 4
    assert _engine_config(served, "cpu", bf16 + ["--no-prepack"]).solo_threads == 3
    monkeypatch.setattr(mini_linear, "can_prepack", lambda dtype, device, fp32=False: fp32)
    assert _engine_config(served, "cpu", bf16).solo_threads == 3   # no bf16 oneDNN: F.linear
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
    assert _engine_config(served, "cpu", []).solo_threads == 1


def test_bad_engine_args_rejected():
    from reference_server.engines.mini import _engine_config
    with pytest.raises(ValueError):
        _engine_config(ServerConfig(engine="mini"), "cpu", ["--spec", "medusa"])


def _drain(eng, rid, prompt, n=4):
    async def run():
        out = []
        async for step in eng.generate(rid, prompt, SamplingParams(max_tokens=n, temperature=0,
                                                                   ignore_eos=True)):
            out += step.token_ids
        return out
    return run()


def _wait_idle(eng, loop):
    async def wait():
        for _ in range(200):
            s = eng.stats()
            if s.num_running == 0 and s.num_waiting == 0 and s.kv_cache_usage == 0:
                return
            await asyncio.sleep(0.02)
    loop.run_until_complete(wait())
    s = eng.stats()
    assert s.num_running == 0 and s.kv_cache_usage == 0


def test_step_failure_fails_its_requests_and_the_loop_goes_on(engine):
    from reference_server.engines.base import EngineError
    eng, loop = engine
    prompt = eng.tokenizer.encode("The quick brown fox")
    calls = []

    def flaky():
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("NaN in the sampler")
        return type(eng.engine).step(eng.engine)

    eng.engine.step = flaky
    try:
        with pytest.raises(EngineError) as e:
            loop.run_until_complete(_drain(eng, "boom", prompt))
        assert e.value.status_code == 500 and e.value.type == "engine_error"
        assert "NaN in the sampler" in e.value.message
        _wait_idle(eng, loop)                    # aborted: its KV blocks are free
        eng.check()                              # not an engine death
        assert len(loop.run_until_complete(_drain(eng, "after", prompt))) == 4
    finally:
        del eng.engine.step


def test_a_sequence_error_fails_that_request_alone(engine):
    from reference_server.engines.base import EngineError
    eng, loop = engine
    prompt = eng.tokenizer.encode("Once upon a time")

    def with_error():
        outs = type(eng.engine).step(eng.engine)
        for o in outs:
            if o.request_id == "bad":
                o.error = "post-processing failed"    # the field mini_engine reports with
        return outs

    eng.engine.step = with_error
    try:
        async def both():
            return await asyncio.gather(_drain(eng, "bad", prompt), _drain(eng, "good", prompt),
                                        return_exceptions=True)
        bad, good = loop.run_until_complete(both())
    finally:
        del eng.engine.step
    assert isinstance(bad, EngineError) and bad.status_code == 500
    assert "post-processing failed" in bad.message
    assert len(good) == 4
    _wait_idle(eng, loop)
    eng.check()


def test_bad_requests_get_a_400_and_break_nothing(engine):
    from reference_server.engines.base import EngineError
    eng, loop = engine
    huge = list(range(5, 2000))               # within the context, beyond the KV pool
    bm = eng.engine.block_manager
    assert len(huge) > bm.num_blocks * bm.block_size
    with pytest.raises(EngineError) as e:
        loop.run_until_complete(_drain(eng, "huge", huge, n=40))
    assert e.value.status_code == 400
    eng.check()
    assert len(loop.run_until_complete(_drain(eng, "fine", [5, 6, 7]))) == 4
