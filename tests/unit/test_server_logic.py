"""Pure logic of the reference server: schema, limits, config, OpenAI shaping of token
streams, metric parsing. (The server itself is tested over HTTP in tests/integration.)"""

from __future__ import annotations

import asyncio

import pytest
from pydantic import ValidationError

from reference_server.config import ServerConfig, parse_args, redact_args
from reference_server.engines.base import EngineError
from reference_server.engines.local import (
    EngineStats,
    GenerationStep,
    IncrementalDetokenizer,
    LocalEngine,
    _find_stop,
)
from reference_server.models import ModelError, ModelSpec, resolve_model
from reference_server.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    RequestLimits,
    check_limits,
    unsupported_fields,
)

LIMITS = RequestLimits(max_n=4, max_logprobs=5, max_sequences_per_request=6)


def chat(**kw) -> ChatCompletionRequest:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], **kw}
    return ChatCompletionRequest.model_validate(body)   # as the server does


@pytest.mark.parametrize("kw", [
    {"temperature": 2.5}, {"top_p": 0}, {"max_tokens": 0}, {"n": 0}, {"stream": 1},
    {"stop": ["a"] * 5}, {"stop": ""}, {"messages": []}, {"top_logprobs": -1},
    {"messages": [{"role": "robot", "content": "x"}]}, {"max_tokens": 1.5},
    {"seed": 2**63}, {"seed": -2**63 - 1},           # vLLM's range: a C long
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


def completion(prompt, **kw) -> CompletionRequest:
    return CompletionRequest.model_validate({"model": "m", "prompt": prompt, **kw})


@pytest.mark.parametrize("prompt, count", [
    ("one", 1), ([5, 6, 7], 1),                  # a list of token ids is ONE prompt
    (["a"], 1), (["a", "b", "c"], 3), (["x"] * 10_000, 10_000),
])
def test_prompts_are_counted(prompt, count):
    assert completion(prompt).num_prompts == count
    assert chat().num_prompts == 1                # a conversation is one prompt


def test_sequences_per_request_are_capped():
    # LIMITS: at most 6 sequences (prompts x n), n at most 4
    assert check_limits(completion(["x"] * 10_000), LIMITS)[0] == "prompt"
    assert check_limits(completion(["x"] * 7), LIMITS)[0] == "prompt"
    param, message = check_limits(completion(["a", "b"], n=4), LIMITS)   # 8 > 6: n's doing
    assert param == "n" and "8 sequences" in message and "at most 6" in message
    assert check_limits(completion(["x"] * 6), LIMITS) is None             # at the cap
    assert check_limits(completion(["a", "b", "c"], n=2), LIMITS) is None  # 3 x 2 = 6
    assert check_limits(completion(list(range(50)), n=4), LIMITS) is None  # one id prompt x 4
    tight = LIMITS.model_copy(update={"max_sequences_per_request": 3})
    assert check_limits(chat(n=4), tight)[0] == "n"        # under max_n, over the cap
    assert check_limits(chat(n=3), tight) is None
    assert check_limits(completion([1, 2, 3, 4], n=3), tight) is None


def test_sequences_cap_is_a_setting():
    assert ServerConfig().max_sequences_per_request == 64
    assert parse_args(["--max-sequences-per-request", "9"]).max_sequences_per_request == 9
    with pytest.raises(SystemExit):
        parse_args(["--max-sequences-per-request", "0"])


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
    """Emits a fixed text one character per step, then EOS; records the requests it was
    told to abort (closed before their last step) and the parameters it got."""

    name = "scripted"

    def __init__(self, text: str, tokenizer=None):
        super().__init__(ServerConfig(engine="hf", device="cpu"), ModelSpec("m", "", False))
        self.text, self.tokenizer, self.max_model_len = text, tokenizer or _CharTokenizer(), 64
        self.model_name, self.aborted, self.params = "m", 0, None
        self.vocab_size = 0x110000

    async def generate(self, request_id, prompt_token_ids, params):
        self.params = params
        ids = self.tokenizer.encode(self.text) + [0]
        finish = None
        try:
            for i, t in enumerate(ids[:params.max_tokens]):
                last = i + 1 == params.max_tokens
                finish = "stop" if t in params.stop_token_ids else "length" if last else None
                yield GenerationStep([t], finish_reason=finish)
                if finish:
                    return
        finally:
            if not finish:
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


def test_adapter_counts_usage_in_every_chunk_when_asked():
    """vLLM's continuous_usage_stats: with include_usage, every chunk the counts so far; on
    its own (vLLM would ignore it) a 400 that names it."""
    from reference_server.engines.base import EngineError
    engine = ScriptedEngine("abc")

    async def run(options):
        req = CompletionRequest.model_validate({"model": "m", "prompt": "x", "stream": True,
                                                "stream_options": options})
        return [c async for c in await engine.complete(req)]

    chunks = asyncio.run(run({"include_usage": True, "continuous_usage_stats": True}))
    counts = [c["usage"]["completion_tokens"] for c in chunks]   # "abc" and the EOS step
    assert counts == [1, 2, 3, 4, 4] and chunks[-1]["choices"] == [], counts
    with pytest.raises(EngineError) as e:
        asyncio.run(run({"continuous_usage_stats": True}))
    assert e.value.status_code == 400 and "continuous_usage_stats" in str(e.value)


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
        # checked here, before asyncio.run's own clean-up would close the engine's stream
        # whether or not the adapter forwarded the close
        return engine.aborted

    assert asyncio.run(run()) == 1


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


def test_adapter_refuses_unimplemented_parameters_by_name():
    for extra, name in [({"echo": True}, "echo"), ({"foo": 1}, "foo"),
                        ({"tools": [{"type": "function"}]}, "tools")]:
        with pytest.raises(EngineError) as e:
            _complete(ScriptedEngine("x"), **extra)
        assert e.value.status_code == 400 and e.value.param == name
    # neutral values ask for nothing; penalties and logit_bias are implemented (issue 39,
    # tests/unit/test_sampler_params.py)
    _complete(ScriptedEngine("x"), presence_penalty=0, logit_bias={}, echo=False,
              repetition_penalty=1.0)
    _complete(ScriptedEngine("x"), presence_penalty=1, logit_bias={"1": 5})
    assert unsupported_fields(chat(top_logprobs=2, logprobs=True, max_completion_tokens=3),
                              "chat") == []


def test_adapter_refuses_message_fields_it_would_not_pass_on_and_ignores_user():
    class Templating(_CharTokenizer):
        def apply_chat_template(self, messages, **kw):
            self.seen = messages
            return {"input_ids": self.encode("".join(m.get("content", "") for m in messages))}

    engine = ScriptedEngine("x", Templating())
    for extra, param in [({"name": "bob"}, "messages[0].name"),
                         ({"tool_calls": [{"id": "c1"}]}, "messages[0].tool_calls"),
                         ({"tool_call_id": "c1"}, "messages[0].tool_call_id")]:
        with pytest.raises(EngineError) as e:
            asyncio.run(engine.chat(chat(messages=[{"role": "user", "content": "hi", **extra}])))
        assert e.value.status_code == 400 and e.value.param == param
        assert param in e.value.message
    # null asks for nothing; "user" is accepted and has no effect (README: the one such field)
    asyncio.run(engine.chat(chat(messages=[{"role": "user", "content": "hi", "name": None}],
                                 user="end-user-1")))
    assert engine.tokenizer.seen == [{"role": "user", "content": "hi"}]


def test_adapter_refuses_out_of_vocabulary_ids_and_treats_tiny_temperature_as_greedy():
    engine = ScriptedEngine("ab")
    with pytest.raises(EngineError) as e:
        _complete(engine, prompt=[5, 0x110000])
    assert e.value.status_code == 400 and "vocabulary" in e.value.message
    _complete(engine, temperature=1e-40, max_tokens=2)
    assert engine.params.temperature == 0.0 and engine.params.greedy
    _complete(engine, temperature=0.5, max_tokens=2)
    assert engine.params.temperature == 0.5


def test_adapter_turns_an_engine_bug_into_a_500_engine_error():
    class Buggy(ScriptedEngine):
        async def generate(self, request_id, prompt_token_ids, params):
            yield GenerationStep([ord("a")])
            raise RuntimeError("probabilities are NaN")

    with pytest.raises(EngineError) as e:
        _complete(Buggy("a"), max_tokens=5)
    assert e.value.status_code == 500 and e.value.type == "engine_error"


def test_redact_args():
    assert redact_args(["--kv-cache-dtype", "fp8", "--api-key", "s3cret", "--hf-token=abc",
                        "--max-num-seqs", "4"]) == \
        ["--kv-cache-dtype", "fp8", "--api-key", "***", "--hf-token=***", "--max-num-seqs", "4"]
    # vLLM's --api-key takes several keys: every one is hidden, up to the next flag
    assert redact_args(["--api-key", "a1", "b2", "--max-num-seqs", "4"]) == \
        ["--api-key", "***", "***", "--max-num-seqs", "4"]


def _proxy_engine(kind: str, tmp_path, *engine_args):
    """A vLLM or SGLang engine object, never started (no child process)."""
    from reference_server.engines.sglang import SGLangEngine
    from reference_server.engines.vllm import VLLMEngine
    from reference_server.models import ModelSpec
    cfg = ServerConfig(engine=kind, device="cpu", engine_python=__import__("sys").executable)
    cfg.engine_args = list(engine_args)
    return {"vllm": VLLMEngine, "sglang": SGLangEngine}[kind](cfg, ModelSpec("m", str(tmp_path),
                                                                            False))


@pytest.mark.parametrize("kind", ["vllm", "sglang"])
def test_server_info_never_shows_a_secret_engine_argument(kind, tmp_path):
    import json
    e = _proxy_engine(kind, tmp_path, "--hf-token=hf_s3cret", "--ssl-keyfile-password", "pw1",
                      "--admin-api-key", "adm1", "adm2", "--max-num-seqs", "4")
    text = json.dumps(e.info().to_dict())
    for secret in ("hf_s3cret", "pw1", "adm1", "adm2", e.child_key, str(e.port)):
        assert secret not in text, secret
    assert e.info().extra["engine_args"][-2:] == ["--max-num-seqs", "4"]


@pytest.mark.parametrize("kind,args,flag", [
    ("vllm", ["--api-key", "X"], "--api-key"), ("vllm", ["--api_key=X"], "--api-key"),
    ("vllm", ["--host", "0.0.0.0"], "--host"), ("vllm", ["--hos=0.0.0.0"], "--host"),
    ("vllm", ["--port", "80"], "--port"), ("vllm", ["--uds", "/tmp/s"], "--uds"),
    ("sglang", ["--api-key", "X"], "--api-key"), ("sglang", ["--host", "0.0.0.0"], "--host"),
    ("sglang", ["--port=80"], "--port"), ("sglang", ["--config", "my.yaml"], "--config"),
    ("sglang", ["--tokenizer-worker-num", "2"], "--tokenizer-worker-num"),
])
def test_engine_args_may_not_set_the_childs_address_or_key(kind, args, flag, tmp_path):
    with pytest.raises(ValueError, match=f"would set {flag} ") as e:
        _proxy_engine(kind, tmp_path, "--max-num-seqs", "4", *args)
    assert "X" not in str(e.value).replace("WORKSHOP_API_KEY", "")   # never the value
    _proxy_engine(kind, tmp_path, "--max-num-seqs", "4", "--tokenizer-mode", "auto")   # others pass


# ---- incremental detokenizing ----------------------------------------------------------

class _ByteTokenizer:
    """Token id = one UTF-8 byte (+1; 0 is EOS): multi-byte characters span tokens."""

    eos_token_id = 0

    def encode(self, text):
        return [b + 1 for b in text.encode()]

    def decode(self, ids, skip_special_tokens=True):
        return bytes(i - 1 for i in ids if i).decode("utf-8", errors="replace")


def test_detokenizer_never_splits_a_character_and_matches_a_full_decode():
    tok = _ByteTokenizer()
    text = "héllo wörld 🙂 日本語 ok"
    ids = tok.encode(text)
    detok = IncrementalDetokenizer(tok, tok.encode("prompt"))
    pieces = [detok.add([t]) for t in ids]
    assert "".join(pieces) == text
    assert not any("\ufffd" in p for p in pieces)
    # the window stays short: no step decodes more than a few tokens
    assert detok.read - detok.prefix <= 4


def test_detokenizer_with_the_real_tokenizer():
    try:
        spec = resolve_model("smollm2-135m", prepare=False)
    except ModelError as exc:
        pytest.skip(f"bundled model not prepared: {exc}")
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(spec.path)
    text = "Größe: 5 µm — “quoted” 🙂🙂 日本語のテキスト, done."
    ids = tok.encode(text)
    detok = IncrementalDetokenizer(tok, tok.encode("Say:"))
    pieces = [detok.add([t]) for t in ids]
    pieces.append(detok.add([], final=True))
    assert "".join(pieces) == tok.decode(ids, skip_special_tokens=True)
    assert not any("\ufffd" in p for p in pieces)


def test_adapter_streams_multibyte_text_whole_and_cuts_stop_strings():
    tok = _ByteTokenizer()
    engine = ScriptedEngine("año 🙂 fin STOP más", tokenizer=tok)

    async def run():
        req = CompletionRequest.model_validate({"model": "m", "prompt": "x", "stream": True,
                                                "stop": [" STOP"], "max_tokens": 60})
        return [c["choices"][0]["text"] async for c in await engine.complete(req)]

    pieces = asyncio.run(run())
    assert "".join(pieces) == "año 🙂 fin"
    assert not any("\ufffd" in p for p in pieces)


def test_a_refusal_by_the_engine_comes_before_the_stream_starts():
    class Refusing(ScriptedEngine):
        async def generate(self, request_id, prompt_token_ids, params):
            raise EngineError(400, "needs more KV blocks than the pool holds")
            yield

    req = CompletionRequest.model_validate({"model": "m", "prompt": "x", "stream": True})
    with pytest.raises(EngineError) as e:     # raised by complete(), not by the stream
        asyncio.run(Refusing("x").complete(req))
    assert e.value.status_code == 400


def test_vllm_runs_compiled_where_the_cpu_computes_bfloat16_and_eager_elsewhere():
    # compiled is vLLM's default; eager elsewhere on a CPU keeps a start a third as long
    from reference_server.engines.vllm import runs_eager, served_dtype
    assert served_dtype("bfloat16", "cpu", []) == "bfloat16"
    assert served_dtype("auto", "cpu", [], model_dtype="bfloat16") == "auto"
    # compiled where bf16 is native (AMX, or AVX-512 bf16: the gate passes on both, and
    # compiled served 6-11 % more on the EPYC, docs/measured_here.md); eager where emulated
    assert runs_eager("cpu", "bfloat16", native_bf16=True, engine_args=[]) is False
    assert runs_eager("cpu", "bfloat16", native_bf16=True, engine_args=["--enforce-eager"]) is True
    assert runs_eager("cpu", "bfloat16", native_bf16=False, engine_args=[]) is True
    assert runs_eager("cpu", "float32", native_bf16=True, engine_args=[]) is True
    assert runs_eager("cuda", "bfloat16", native_bf16=True, engine_args=[]) is False


def test_vllm_command_follows_the_eager_rule(monkeypatch, tmp_path):
    from reference_server import dtypes
    from reference_server.config import ServerConfig
    from reference_server.engines.vllm import VLLMEngine
    from reference_server.models import ModelSpec
    (tmp_path / "config.json").write_text('{"torch_dtype": "bfloat16", "num_hidden_layers": 2, '
                                          '"num_attention_heads": 2, "hidden_size": 8}')
    model = ModelSpec("m", str(tmp_path), True)
    # (native bf16, AMX) -> eager, attention: compiled wherever bf16 is native; float32 eager
    for bf16, amx, eager, attention in ((True, True, False, "CPU_ATTN (AMX)"),
                                        (True, False, False, "CPU_ATTN (vector)"),
                                        (False, False, True, "CPU_ATTN (vector)")):
        monkeypatch.setattr(dtypes, "cpu_has_bf16", lambda bf16=bf16: bf16)
        monkeypatch.setattr(dtypes, "cpu_has_amx", lambda amx=amx: amx)
        e = VLLMEngine(ServerConfig(engine="vllm", device="cpu"), model)
        assert ("--enforce-eager" in e.command()) is eager
        assert e.dtype == ("bfloat16" if bf16 else "float32")
        assert (e.compile_note is None) is eager
        # "auto" is the checkpoint's bf16: served as above, its attention named as such
        auto = VLLMEngine(ServerConfig(engine="vllm", device="cpu", dtype="auto"), model)
        assert auto.eager is eager and auto.attention == attention


def test_vllm_serves_float32_for_bfloat16_where_the_cpu_would_emulate_it():
    from reference_server.engines.vllm import DTYPE_NOTES, served_dtype
    assert served_dtype("bfloat16", "cpu", [], native_bf16=False) == "float32"
    assert served_dtype("auto", "cpu", [], model_dtype="bfloat16", native_bf16=False) == "float32"
    assert served_dtype("bfloat16", "cpu", [], native_bf16=True) == "bfloat16"
    assert served_dtype("float16", "cpu", [], native_bf16=False) == "float16"
    assert served_dtype("bfloat16", "cuda", [], native_bf16=False) == "bfloat16"
    assert served_dtype("bfloat16", "cpu", ["--dtype", "bfloat16"], native_bf16=False) == "bfloat16"
    assert set(DTYPE_NOTES) == {"float32"}   # every substitute explains itself


def test_help_engine_lists_the_teaching_engines_knobs(capsys):
    from reference_server.config import parse_args
    with pytest.raises(SystemExit) as done:
        parse_args(["--help-engine"])
    assert done.value.code == 0
    assert "--kv-layout" in capsys.readouterr().out



def test_vllm_child_runs_without_dev_mode_and_with_its_own_key(tmp_path):
    # Dev mode mounts unauthenticated routes (/collective_rpc, /sleep, ...); the child's key
    # travels by environment, never on the command line (ps).
    e = _proxy_engine("vllm", tmp_path)
    env = e.env()
    assert env["VLLM_SERVER_DEV_MODE"] == "0"
    assert env["VLLM_API_KEY"] == e.child_key and e.child_key not in " ".join(e.command())


def test_compiled_vllm_on_a_cpu_reuses_its_compile_cache(tmp_path, monkeypatch):
    # Its AOT cache does not load back on a CPU (vLLM 0.32), so a start would compile again.
    e = _proxy_engine("vllm", tmp_path)
    e.device, e.eager = "cpu", False
    assert e.env()["VLLM_USE_AOT_COMPILE"] == "0"
    monkeypatch.setenv("VLLM_USE_AOT_COMPILE", "1")       # a user's own choice wins
    assert e.env()["VLLM_USE_AOT_COMPILE"] == "1"
    monkeypatch.delenv("VLLM_USE_AOT_COMPILE")
    e.eager = True                                        # nothing compiled, nothing to cache
    assert "VLLM_USE_AOT_COMPILE" not in e.env()


def test_concurrent_preparations_convert_once(tmp_path, monkeypatch):
    """Setup, a notebook and a test session preparing the model at once: one converts, the
    others wait and find it prepared (two conversions used to delete each other's folder)."""
    import threading
    import time

    from reference_server import models

    calls = []

    def convert(folder, progress):
        calls.append(folder)
        time.sleep(0.3)             # long enough for the other caller to arrive meanwhile
        folder.mkdir()
        (folder / "config.json").write_text("{}")
        (folder / models._MARKER).write_text('{"files": ["config.json"]}')

    monkeypatch.setattr(models, "_convert", convert)
    folder = tmp_path / "model"
    errors = []

    def prepare():
        try:
            assert models.prepare_model(folder) == folder
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=prepare) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(calls) == 1 and models.is_prepared(folder)


@pytest.mark.parametrize("url,origin,prefix", [
    ("http://h:8000/v1", "http://h:8000", ""), ("http://h:8000", "http://h:8000", ""),
    ("http://h:8000/v1/", "http://h:8000", ""), ("https://h/openai/v1", "https://h", "/openai"),
    ("https://h/prefix", "https://h", "/prefix")])
def test_upstream_url_is_split_into_origin_and_route_prefix(url, origin, prefix):
    from reference_server.engines.remote import split_upstream
    assert split_upstream(url) == (origin, prefix)


@pytest.mark.parametrize("url,why", [
    ("h:8000", "http"), ("ftp://h/v1", "http"), ("http://user:pw@h/v1", "credentials"),
    ("http://h/v1?key=x", "query")])
def test_upstream_url_refused(url, why):
    from reference_server.engines.remote import split_upstream
    with pytest.raises(ValueError, match=why):
        split_upstream(url)


def test_remote_engine_flags(monkeypatch, capsys):
    monkeypatch.setenv("WORKSHOP_UPSTREAM_API_KEY", "up-key")
    c = parse_args(["--engine", "remote", "--upstream", "http://h:1/v1"])
    assert (c.upstream, c.upstream_api_key) == ("http://h:1/v1", "up-key")
    for argv in (["--engine", "remote"], ["--engine", "mini", "--upstream", "http://h:1"]):
        with pytest.raises(SystemExit):
            parse_args(argv)
    assert "--upstream" in capsys.readouterr().err
    from reference_server.engines.remote import RemoteEngine
    with pytest.raises(ValueError, match="starts none"):
        RemoteEngine(ServerConfig(engine="remote", upstream="http://h:1", engine_args=["--x"]))
    engine = RemoteEngine(c)
    assert (engine.url, engine.child_key, engine.port) == ("http://h:1", "up-key", None)
