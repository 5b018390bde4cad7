"""Pure logic of the reference server: schema, limits, config, OpenAI shaping of token
streams, metric parsing. (The server itself is tested over HTTP in tests/integration.)"""

from __future__ import annotations

import asyncio

import pytest
from pydantic import ValidationError

from reference_server.config import parse_args
from reference_server.engines.local import (EngineStats, GenerationStep, LocalEngine,
                                            _find_stop)
from reference_server.protocol import (ChatCompletionRequest, CompletionRequest,
                                       RequestLimits, check_limits)
from reference_server.models import ModelError, resolve_model

LIMITS = RequestLimits(max_n=4, max_logprobs=5)


def chat(**kw) -> ChatCompletionRequest:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], **kw}
    return ChatCompletionRequest.model_validate(body)   # as the server does


@pytest.mark.parametrize("kw", [
    {"temperature": 2.5}, {"top_p": 0}, {"max_tokens": 0}, {"n": 0}, {"stream": 1},
    {"stop": ["a"] * 5}, {"stop": ""}, {"messages": []}, {"top_logprobs": -1},
    {"messages": [{"role": "robot", "content": "x"}]}, {"max_tokens": 1.5},
])
def test_schema_refuses(kw):
    with pytest.raises(ValidationError):
        chat(**kw)


def test_schema_accepts_ints_for_floats_and_extra_fields():
    r = chat(temperature=1, top_p=1, min_tokens=3)
    assert r.temperature == 1.0 and r.model_extra == {"min_tokens": 3}
    assert chat(max_completion_tokens=9, max_tokens=3).effective_max_tokens == 9


def test_limits():
    assert check_limits(chat(n=5), LIMITS)[0] == "n"
    assert check_limits(chat(logprobs=True, top_logprobs=6), LIMITS)[0] == "top_logprobs"
    assert check_limits(chat(top_logprobs=2), LIMITS)[0] == "top_logprobs"   # without logprobs
    assert check_limits(chat(messages=[{"role": "user", "content": "  "}]), LIMITS)[0] == "messages"
    assert check_limits(chat(n=4, logprobs=True, top_logprobs=5), LIMITS) is None
    comp = CompletionRequest.model_validate({"model": "m", "prompt": "x", "logprobs": 6})
    assert check_limits(comp, LIMITS)[0] == "logprobs"


def test_config_passes_engine_args_through():
    cfg = parse_args(["--engine", "hf", "--port", "9", "--", "--kv-cache-dtype", "fp8"])
    assert (cfg.engine, cfg.port, cfg.engine_args) == ("hf", 9, ["--kv-cache-dtype", "fp8"])


def test_find_stop():
    assert _find_stop("hello world", ["wor"], 0) == 6
    assert _find_stop("hello world", ["xyz"], 0) is None
    # a stop string straddling what was already sent is still found
    assert _find_stop("abc STOP", ["STOP"], 6) == 4
    assert _find_stop("a.b.c", [".", "c"], 0) == 1


def test_resolve_model_errors(tmp_path):
    with pytest.raises(ModelError):
        resolve_model("no-such-thing")
    with pytest.raises(ModelError):
        resolve_model(str(tmp_path))           # a folder without config.json
    (tmp_path / "config.json").write_text("{}")
    assert resolve_model(str(tmp_path)).path == str(tmp_path.resolve())
    assert resolve_model("org/model").path == "org/model"   # left for the engine to fetch


# ---- the OpenAI adapter over a scripted token stream --------------------------------

class _CharTokenizer:
    """Token id = character code; 0 is EOS. Enough to check text shaping exactly."""

    eos_token_id = 0

    def encode(self, text):
        return [ord(c) for c in text]

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(i) for i in ids if i or not skip_special_tokens)


class ScriptedEngine(LocalEngine):
    """Emits a fixed text one character per step, then EOS; records aborts."""

    name = "scripted"

    def __init__(self, text: str):
        super().__init__()
        self.text, self.tokenizer, self.max_model_len = text, _CharTokenizer(), 64
        self.model_name, self.aborted = "m", 0

    async def generate(self, request_id, prompt_token_ids, params):
        ids = [ord(c) for c in self.text] + [0]
        try:
            for i, t in enumerate(ids[:params.max_tokens]):
                last = i + 1 == params.max_tokens
                finish = "stop" if t in params.stop_token_ids else "length" if last else None
                yield GenerationStep([t], finish_reason=finish)
                if finish:
                    return
        finally:
            self.aborted += 1

    def stats(self):
        return EngineStats()

    async def start(self): ...
    async def stop(self): ...
    ready = True
    def info(self): ...
    async def reset_prefix_cache(self): return False


def _complete(engine, **kw):
    req = CompletionRequest.model_validate({"model": "m", "prompt": "x", **kw})
    return asyncio.run(engine.complete(req))


def test_adapter_text_usage_and_finish():
    out = _complete(ScriptedEngine("Paris."), max_tokens=20)
    assert out["choices"][0]["text"] == "Paris."
    assert out["choices"][0]["finish_reason"] == "stop"
    assert out["usage"]["completion_tokens"] == 7       # six characters and EOS


def test_adapter_stop_string_and_length():
    out = _complete(ScriptedEngine("one two three"), max_tokens=20, stop=[" two"])
    assert out["choices"][0]["text"] == "one"
    assert out["choices"][0]["finish_reason"] == "stop"
    out = _complete(ScriptedEngine("one two three"), max_tokens=3)
    assert (out["choices"][0]["text"], out["choices"][0]["finish_reason"]) == ("one", "length")


def test_adapter_streams_n_choices_and_usage():
    engine = ScriptedEngine("ab")

    async def run():
        req = CompletionRequest.model_validate({"model": "m", "prompt": "x", "n": 2,
                                                "stream": True,
                                                "stream_options": {"include_usage": True}})
        return [c async for c in await engine.complete(req)]

    chunks = asyncio.run(run())
    texts = {0: "", 1: ""}
    for c in chunks[:-1]:
        texts[c["choices"][0]["index"]] += c["choices"][0]["text"]
    assert texts == {0: "ab", 1: "ab"}
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 6


def test_adapter_refuses_what_does_not_fit():
    from reference_server.engines.base import EngineError
    with pytest.raises(EngineError) as e:
        _complete(ScriptedEngine("x"), prompt="y" * 70)
    assert e.value.status_code == 400
    with pytest.raises(EngineError):
        _complete(ScriptedEngine("x"), max_tokens=64)


def test_adapter_closes_engine_stream_when_consumer_leaves():
    engine = ScriptedEngine("a long answer")

    async def run():
        req = CompletionRequest.model_validate({"model": "m", "prompt": "x", "stream": True})
        stream = await engine.complete(req)
        async for _ in stream:
            break
        await stream.aclose()

    asyncio.run(run())
    assert engine.aborted == 1


def test_adapter_reports_an_engine_error_in_one_of_n_choices():
    from reference_server.engines.base import EngineError

    class Failing(ScriptedEngine):
        async def generate(self, request_id, prompt_token_ids, params):
            yield GenerationStep([ord("a")])
            if request_id.endswith("-1"):
                raise EngineError(500, "the second choice broke")
            yield GenerationStep([0], finish_reason="stop")

    with pytest.raises(EngineError, match="second choice"):
        _complete(Failing("a"), n=2, max_tokens=5)
