"""The OpenAI API of the reference server, over real HTTP, against every engine."""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx
import openai
import pytest

from reference_server import dtypes
from reference_server import prometheus as P

pytestmark = pytest.mark.engine

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


def judged(answer: str, max_tokens: int):
    """The correctness gate's verdict on an answer to QUESTION: "agree" with Hugging Face
    float32, a "near tie" (the model's own second choice: docs/near_ties.md), or "wrong"."""
    from reference_server.models import resolve_model
    from workshop.bench.verify import Probe, compare, reference_for
    probe = Probe("short", tuple((m["role"], m["content"]) for m in QUESTION))
    return compare(reference_for(resolve_model("smollm2-135m").path), probe, answer, max_tokens)


def test_health_ready_and_models(server):
    assert httpx.get(server.base_url + "/health").json() == {"status": "ok"}
    assert httpx.get(server.base_url + "/ready").status_code == 200
    models = server.openai().models.list().data
    assert [m.id for m in models] == [server.model]
    assert models[0].root  # where the weights came from


def test_server_info_describes_engine(server):
    info = httpx.get(server.base_url + "/server_info", headers=server.headers).json()
    assert info["engine"] == server.engine
    assert info["model"] == server.model
    assert info["max_model_len"] == 2048
    # 2 (K,V) x 30 layers x 3 KV heads x 64 dims x the served dtype's bytes (bf16, or fp32 on
    # CPUs without native bf16: dtypes.cpu_compute_dtype); "auto" is the checkpoint's bf16
    assert info["kv_bytes_per_token"] == 2 * 30 * 3 * 64 * dtypes.bytes_per_element(
        info["dtype"], "bfloat16")
    assert info["kv_capacity_tokens"] >= 2048
    assert isinstance(info["prefix_caching"], bool)
    # what a comparison shows beside the numbers (the remote server repeats its upstream's)
    assert info["attention"] and isinstance(info["compiled"], bool)
    assert bool(info["prefix_cache"]) == info["prefix_caching"]
    assert info["limits"]["max_running"] >= 1


def test_chat_greedy_answer_and_usage(server):
    r = server.openai().chat.completions.create(model=server.model, messages=QUESTION,
                                                max_tokens=20, temperature=0)
    check = judged(r.choices[0].message.content, 20)
    assert check.verdict in ("agree", "near tie"), check.line()
    if check.verdict == "agree":     # the reference's answer ends within 20 tokens
        assert r.choices[0].finish_reason == "stop"
    assert r.usage.prompt_tokens > 5
    assert 0 < r.usage.completion_tokens <= 20
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_completion_length_limit(server):
    r = server.openai().completions.create(model=server.model, prompt="Once upon a time",
                                           max_tokens=7, temperature=0,
                                           extra_body={"ignore_eos": True})
    assert r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 7
    assert r.choices[0].text


def test_chat_stream_with_usage(server):
    stream = server.openai().chat.completions.create(
        model=server.model, messages=QUESTION, max_tokens=16, temperature=0, stream=True,
        stream_options={"include_usage": True})
    text, usage, finish = "", None, None
    for chunk in stream:
        if chunk.usage:
            usage = chunk.usage
        for c in chunk.choices:
            text += c.delta.content or ""
            finish = c.finish_reason or finish
    check = judged(text, 16)
    assert check.verdict in ("agree", "near tie"), check.line()
    if check.verdict == "agree":
        assert finish == "stop"
    assert usage is not None and usage.completion_tokens > 0


def test_continuous_usage_stats_count_in_every_chunk(server):
    """vLLM's ``stream_options.continuous_usage_stats`` (GuideLLM sends it with every
    request): with ``include_usage``, each chunk carries the counts so far; the last one the
    totals. Refused once by the local engines, which failed every GuideLLM request."""
    r = httpx.post(server.base_url + "/v1/completions", headers=server.headers, timeout=120,
                   json={"model": server.model, "prompt": "Count: one, two,", "max_tokens": 8,
                         "ignore_eos": True, "stream": True,
                         "stream_options": {"include_usage": True,
                                            "continuous_usage_stats": True}})
    assert r.status_code == 200, r.text
    chunks = [json.loads(line[6:]) for line in r.text.splitlines()
              if line.startswith("data: ") and line != "data: [DONE]"]
    with_text = [c for c in chunks if c["choices"] and c["choices"][0]["text"]]
    assert with_text and all(c.get("usage") for c in with_text), chunks[:3]
    counts = [c["usage"]["completion_tokens"] for c in with_text]
    assert counts == sorted(counts) and counts[-1] <= 8, counts
    assert chunks[-1]["usage"]["completion_tokens"] == 8, chunks[-1]


def test_completion_stream_matches_non_stream(server):
    client = server.openai()
    kw = dict(model=server.model, prompt="The three primary colors are", max_tokens=12,
              temperature=0, extra_body={"ignore_eos": True})
    whole = client.completions.create(**kw).choices[0].text
    streamed = "".join(c.choices[0].text for c in client.completions.create(stream=True, **kw)
                       if c.choices)
    assert streamed == whole


def test_seed_makes_sampling_reproducible(server):
    client = server.openai()
    kw = dict(model=server.model, prompt="My favourite animal is", max_tokens=12,
              temperature=1.0, top_p=0.9, seed=1234, extra_body={"ignore_eos": True})
    if server.engine == "sglang":
        # SGLang 0.5.18 uses "seed" only with --enable-deterministic-inference; the fleet
        # runs it without, so a seed must be refused rather than silently ignored.
        r = httpx.post(server.base_url + "/v1/completions", headers=server.headers,
                       json={"model": server.model, "prompt": "hi", "max_tokens": 2, "seed": 1})
        assert r.status_code == 400 and r.json()["error"]["param"] == "seed"
        return
    assert client.completions.create(**kw).choices[0].text == \
        client.completions.create(**kw).choices[0].text


def test_stop_string_cuts_output(server):
    r = server.openai().completions.create(model=server.model, prompt="1, 2, 3, 4,",
                                           max_tokens=30, temperature=0, stop=[" 7"],
                                           extra_body={"ignore_eos": True})
    assert r.choices[0].finish_reason == "stop"
    assert " 7" not in r.choices[0].text
    assert "6" in r.choices[0].text


def test_logprobs(server):
    r = server.openai().chat.completions.create(model=server.model, messages=QUESTION,
                                                max_tokens=4, temperature=0, logprobs=True,
                                                top_logprobs=3)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens
    for entry in content:
        assert entry.logprob <= 0
        assert len(entry.top_logprobs) == 3
        # greedy: the chosen token is the most likely one
        assert entry.logprob == pytest.approx(entry.top_logprobs[0].logprob, abs=1e-3)


def test_n_choices(server):
    r = server.openai().completions.create(model=server.model, prompt="A colour:", n=3,
                                           max_tokens=5, temperature=1.0,
                                           extra_body={"ignore_eos": True})
    assert sorted(c.index for c in r.choices) == [0, 1, 2]
    assert r.usage.completion_tokens == 15


def test_metrics_move(server):
    before_gen = server.metric(P.GENERATION_TOKENS)
    before_prompt = server.metric(P.PROMPT_TOKENS)
    before_ttft = server.metric(P.TIME_TO_FIRST_TOKEN + "_count")
    server.openai().completions.create(model=server.model, prompt="Hello", max_tokens=5,
                                       extra_body={"ignore_eos": True})
    m = server.metrics()
    names = {s.name for s in m}
    for name in (P.NUM_REQUESTS_RUNNING, P.NUM_REQUESTS_WAITING, P.KV_CACHE_USAGE,
                 P.PREFIX_CACHE_QUERIES, P.PREFIX_CACHE_HITS, P.INTER_TOKEN_LATENCY + "_bucket",
                 P.E2E_REQUEST_LATENCY + "_bucket", P.SERVER_REQUESTS):
        assert name in names, name
    assert server.metric(P.GENERATION_TOKENS) >= before_gen + 5
    assert server.metric(P.PROMPT_TOKENS) > before_prompt
    assert server.metric(P.TIME_TO_FIRST_TOKEN + "_count") >= before_ttft + 1
    ok = sum(s.value for s in m if s.name == P.SERVER_REQUESTS and s.labels.get("status") == "200")
    assert ok >= 1


def test_prefix_cache_reset(server):
    r = httpx.post(server.base_url + "/reset_prefix_cache", headers=server.headers)
    assert r.status_code == 200
    # hf keeps no prefix cache; vLLM's is reached without its dev mode (see engines/vllm.py);
    # SGLang's through its /flush_cache; remote's is its upstream's (mini's)
    assert r.json()["success"] is (server.engine in ("vllm", "sglang", "mini", "remote"))
    # which tells a client that a refusal is final (no cache) or worth asking again
    assert r.json()["prefix_caching"] is (server.engine != "hf")
    # the harness's reset reads that answer: emptied on every engine with a cache; hf has none
    import aiohttp

    from workshop.bench.event_loop import run_sync
    from workshop.bench.run import reset_prefix_cache

    async def reset():
        async with aiohttp.ClientSession() as session:
            return await reset_prefix_cache(session, server.base_url, server.headers, tries=3)
    assert run_sync(reset()) == ("no prefix cache" if server.engine == "hf"
                                 else "/reset_prefix_cache")


# ---- authentication -------------------------------------------------------------------

def test_requests_without_key_are_refused(server):
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": server.api_key}):
        r = httpx.post(server.base_url + "/v1/chat/completions", headers=headers,
                       json={"model": server.model, "messages": QUESTION})
        assert r.status_code == 401
        assert r.json()["error"]["type"] == "authentication_error"
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=server.base_url + "/v1", api_key="nope",
                      max_retries=0).models.list()


# The policy under --api-key: only the liveness and readiness probes are open.
GUARDED = [("GET", "/server_info"), ("GET", "/metrics"), ("POST", "/reset_prefix_cache"),
           ("GET", "/docs"), ("GET", "/openapi.json"), ("GET", "/v1/models")]


def test_trust_boundary_policy(server):
    for method, path in GUARDED:
        r = httpx.request(method, server.base_url + path)
        assert r.status_code == 401, (path, r.status_code)
        assert r.json()["error"]["type"] == "authentication_error"
        r = httpx.request(method, server.base_url + path, headers=server.headers, timeout=30)
        assert r.status_code == 200, (path, r.status_code)
    for path in ("/health", "/ready"):
        assert httpx.get(server.base_url + path).status_code == 200


def _descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        for task in Path(f"/proc/{p}/task").iterdir():
            kids = (task / "children").read_text().split()
            out += [int(k) for k in kids]
            todo += [int(k) for k in kids]
    return out


def _cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
    except OSError:
        return []


def test_no_secret_in_server_info_logs_or_ps(server):
    text = httpx.get(server.base_url + "/server_info", headers=server.headers).text
    assert server.api_key not in text and "upstream" not in text and "127.0.0.1:" not in text
    assert server.api_key not in server.log_path.read_text(errors="replace")
    for pid in [server.proc.pid, *_descendants(server.proc.pid)]:
        cmd = _cmdline(pid)
        assert server.api_key not in " ".join(cmd), pid
        assert not any("api-key" in a or "api_key" in a for a in cmd), cmd


def _vllm_child_port(server) -> int:
    for pid in _descendants(server.proc.pid):
        cmd = _cmdline(pid)
        if "vllm.entrypoints.openai.api_server" in cmd:
            assert cmd[cmd.index("--host") + 1] == "127.0.0.1"     # loopback only
            return int(cmd[cmd.index("--port") + 1])
    raise AssertionError("no vLLM child found")


# What a local process could ask of a child engine without its key: generation, tokenizing,
# scoring, scaling, metrics, docs. vLLM's own key check covers /v1, /v2, /inference and
# /cohere only; SGLang's skips /health* and /metrics*. The child's key guards every path.
def _child_needs_its_key(child: str, server) -> None:
    prompt = {"model": server.model, "prompt": "hi"}
    for key in (None, server.api_key):      # our key is not the child's
        h = {"Authorization": f"Bearer {key}"} if key else {}
        for method, path, body in [
                ("GET", "/v1/models", None), ("POST", "/v1/completions", prompt),
                ("POST", "/invocations", prompt), ("POST", "/tokenize", prompt),
                ("POST", "/detokenize", {"model": server.model, "tokens": [1]}),
                ("POST", "/generative_scoring", prompt),
                ("POST", "/scale_elastic_ep", {}),
                ("GET", "/metrics", None), ("GET", "/docs", None),
                ("GET", "/openapi.json", None), ("GET", "/health", None),
                ("GET", "/health_generate", None), ("GET", "/version", None)]:
            r = httpx.request(method, child + path, headers=h, json=body)
            assert r.status_code == 401, (path, key, r.status_code, r.text[:200])
        # a WebSocket (SGLang's /v1/realtime) is closed before it is accepted (403), or
        # refused as plain HTTP where the child's server lacks WebSocket support; never a 101
        upgrade = {**h, "Connection": "Upgrade", "Upgrade": "websocket",
                   "Sec-WebSocket-Version": "13", "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ=="}
        assert httpx.get(child + "/v1/realtime", headers=upgrade).status_code in (401, 403)


def test_vllm_child_cannot_be_used_to_skip_our_key(vllm_server):
    child = f"http://127.0.0.1:{_vllm_child_port(vllm_server)}"
    _child_needs_its_key(child, vllm_server)
    for key in (None, vllm_server.api_key):
        h = {"Authorization": f"Bearer {key}"} if key else {}
        assert httpx.post(child + "/reset_prefix_cache", headers=h).status_code == 401
    # vLLM's development endpoints (dev mode is off as well: VLLM_SERVER_DEV_MODE=0, see the
    # unit tests) are behind the child's key like every other path
    for path in ("/collective_rpc", "/sleep", "/server_info", "/is_sleeping"):
        r = httpx.request("POST" if path != "/server_info" else "GET", child + path)
        assert r.status_code == 401, (path, r.status_code)


def _child(server, module: str) -> tuple[int, list[str]]:
    for pid in _descendants(server.proc.pid):
        cmd = _cmdline(pid)
        if module in cmd:
            assert cmd[cmd.index("--host") + 1] == "127.0.0.1"     # loopback only
            return int(cmd[cmd.index("--port") + 1]), cmd
    raise AssertionError(f"no {module} child found")


def test_sglang_child_cannot_be_used_to_skip_our_key(sglang_server):
    port, cmd = _child(sglang_server, "reference_server.engines.sglang_launch")
    child = f"http://127.0.0.1:{port}"
    _child_needs_its_key(child, sglang_server)
    for key in (None, sglang_server.api_key):
        h = {"Authorization": f"Bearer {key}"} if key else {}
        assert httpx.post(child + "/flush_cache", headers=h).status_code == 401
        # SGLang's own server info lists its key: it must be as closed as generation
        assert httpx.get(child + "/server_info", headers=h).status_code == 401
    # The key travelled in a --config file that is gone now; SGLang logs its settings, key
    # included, only at info level, which the child does not use.
    config = cmd[cmd.index("--config") + 1]
    assert not Path(config).exists()
    assert not re.search(r"sgl-[A-Za-z0-9_-]{40}",
                         sglang_server.log_path.read_text(errors="replace"))
