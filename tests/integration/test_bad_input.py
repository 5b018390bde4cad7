"""Bad input gets a 4xx with an OpenAI-style error body: never a crash, never a hang."""

from __future__ import annotations

import httpx
import pytest
from conftest import launch, stop, wait_ready

pytestmark = pytest.mark.engine

M = "smollm2-135m"
MSG = [{"role": "user", "content": "hi"}]
LONG = "word " * 3000          # ~3000 tokens, over the 2048-token context

CHAT_CASES = {
    "not json": b"{not json",
    "not utf-8": b'{"model": "\xff\xfe", "messages": []}',
    "json array": b"[1, 2, 3]",
    "empty body": b"",
    "missing messages": {"model": M},
    "messages not a list": {"model": M, "messages": "hello"},
    "empty messages": {"model": M, "messages": []},
    "message without role": {"model": M, "messages": [{"content": "hi"}]},
    "unknown role": {"model": M, "messages": [{"role": "wizard", "content": "hi"}]},
    "content wrong type": {"model": M, "messages": [{"role": "user", "content": 42}]},
    "only empty content": {"model": M, "messages": [{"role": "user", "content": ""}]},
    "max_tokens string": {"model": M, "messages": MSG, "max_tokens": "10"},
    "max_tokens zero": {"model": M, "messages": MSG, "max_tokens": 0},
    "max_tokens negative": {"model": M, "messages": MSG, "max_tokens": -5},
    "max_tokens beyond context": {"model": M, "messages": MSG, "max_tokens": 100000},
    "temperature too high": {"model": M, "messages": MSG, "temperature": 5},
    "temperature negative": {"model": M, "messages": MSG, "temperature": -1},
    "temperature string": {"model": M, "messages": MSG, "temperature": "hot"},
    "top_p zero": {"model": M, "messages": MSG, "top_p": 0},
    "top_p above one": {"model": M, "messages": MSG, "top_p": 1.5},
    "n zero": {"model": M, "messages": MSG, "n": 0},
    "absurd n": {"model": M, "messages": MSG, "n": 100000},
    "absurd top_logprobs": {"model": M, "messages": MSG, "logprobs": True, "top_logprobs": 5000},
    "stream not bool": {"model": M, "messages": MSG, "stream": "yes"},
    "too many stops": {"model": M, "messages": MSG, "stop": ["a", "b", "c", "d", "e"]},
    "unknown model": {"model": "gpt-9", "messages": MSG},
    "model missing": {"messages": MSG},
    "prompt longer than context": {"model": M, "messages": [{"role": "user", "content": LONG}]},
}
COMPLETION_CASES = {
    "empty prompt list": {"model": M, "prompt": []},
    "prompt wrong type": {"model": M, "prompt": {"text": "hi"}},
    "negative token id": {"model": M, "prompt": [1, -2, 3]},
    "absurd logprobs": {"model": M, "prompt": "hi", "logprobs": 1000},
    "completion longer than context": {"model": M, "prompt": LONG, "max_tokens": 10},
    "max_tokens beyond context": {"model": M, "prompt": "hi", "max_tokens": 5000},
    # vLLM refuses these three with a 400; they once killed mini (first) or gave a 500 on hf
    "token id out of vocabulary": {"model": M, "prompt": [999999, 5], "max_tokens": 2},
    "seed above 64 bits": {"model": M, "prompt": "hi", "max_tokens": 2, "seed": 2**64},
    "huge negative seed": {"model": M, "prompt": "hi", "max_tokens": 2, "seed": -2**70},
}
# OpenAI parameters the in-process engines do not implement: refused by name, never ignored.
# (vLLM implements them and answers for itself. The penalties, top_k, min_p and logit_bias
# every engine implements: tests/integration/test_sampling_fields.py.)
UNSUPPORTED = {
    "tools": {"tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]},
    "echo": {"echo": True},
    "frobnicate": {"frobnicate": 1},          # not an OpenAI parameter at all
}


def _post(server, path: str, body) -> httpx.Response:
    content = body if isinstance(body, bytes) else httpx.Request("POST", "/", json=body).content
    return httpx.post(server.base_url + path, content=content, timeout=60,
                      headers={**server.headers, "Content-Type": "application/json"})


def _assert_openai_error(r: httpx.Response, status: int | None = None) -> None:
    assert 400 <= r.status_code < 500, (r.status_code, r.text)
    if status:
        assert r.status_code == status, r.text
    err = r.json()["error"]
    assert isinstance(err["message"], str) and err["message"]
    assert "type" in err


@pytest.mark.parametrize("case", list(CHAT_CASES))
def test_bad_chat_request(server, case):
    r = _post(server, "/v1/chat/completions", CHAT_CASES[case])
    _assert_openai_error(r, 404 if case == "unknown model" else None)


@pytest.mark.parametrize("case", list(COMPLETION_CASES))
def test_bad_completion_request(server, case):
    _assert_openai_error(_post(server, "/v1/completions", COMPLETION_CASES[case]))


def test_oversized_body(server):
    big = {"model": M, "prompt": "x" * (5 * 1024 * 1024)}
    _assert_openai_error(_post(server, "/v1/completions", big), 413)


def test_oversized_chunked_body(server):
    # No Content-Length: the cap must hold while reading, too.
    def chunks():
        yield b'{"model": "smollm2-135m", "prompt": "'
        for _ in range(80):
            yield b"x" * 65536
        yield b'"}'
    r = httpx.post(server.base_url + "/v1/completions", content=chunks(), timeout=60,
                   headers={**server.headers, "Content-Type": "application/json"})
    _assert_openai_error(r, 413)


def test_unknown_route_and_method(server):
    r = httpx.get(server.base_url + "/v1/nothing-here", headers=server.headers)
    _assert_openai_error(r, 404)
    r = httpx.get(server.base_url + "/v1/chat/completions", headers=server.headers)
    _assert_openai_error(r, 405)


def test_server_still_serves_after_bad_input(server):
    for body in list(CHAT_CASES.values())[:6]:
        _post(server, "/v1/chat/completions", body)
    r = _post(server, "/v1/chat/completions", {"model": M, "messages": MSG, "max_tokens": 3})
    assert r.status_code == 200


def test_deeply_nested_json_is_a_400(server):
    depth = 100_000
    body = b'{"model": "smollm2-135m", "prompt": ' + b"[" * depth + b"]" * depth + b"}"
    _assert_openai_error(_post(server, "/v1/completions", body), 400)


@pytest.mark.parametrize("param", list(UNSUPPORTED))
@pytest.mark.parametrize("engine", ["hf", "mini"])
def test_local_engine_refuses_what_it_does_not_implement(request, engine, param):
    server = request.getfixturevalue(f"{engine}_server")
    r = _post(server, "/v1/completions",
              {"model": M, "prompt": "hi", "max_tokens": 2, **UNSUPPORTED[param]})
    _assert_openai_error(r, 400)
    assert param in r.json()["error"]["message"]
    assert r.json()["error"]["param"] == param


@pytest.mark.parametrize("engine", ["hf", "mini"])
def test_local_engine_refuses_message_fields_and_ignores_only_user(request, engine):
    # a message's name or tool calls never reach these engines' prompt: refused, by name;
    # "user" (an end-user id for abuse monitoring) is the one field accepted and ignored
    server = request.getfixturevalue(f"{engine}_server")
    for extra, param in [({"name": "bob"}, "messages[0].name"),
                         ({"tool_calls": [{"id": "c1", "type": "function"}]},
                          "messages[0].tool_calls")]:
        r = _post(server, "/v1/chat/completions",
                  {"model": M, "max_tokens": 2, "messages": [{**MSG[0], **extra}]})
        _assert_openai_error(r, 400)
        assert r.json()["error"]["param"] == param
    r = _post(server, "/v1/chat/completions",
              {"model": M, "max_tokens": 2, "messages": MSG, "user": "end-user-1"})
    assert r.status_code == 200, r.text


def test_neutral_values_of_unimplemented_parameters_are_accepted(server):
    # client libraries that always send them must keep working
    r = _post(server, "/v1/completions", {"model": M, "prompt": "hi", "max_tokens": 2,
                                          "presence_penalty": 0, "frequency_penalty": 0.0,
                                          "repetition_penalty": 1.0, "logit_bias": {},
                                          "echo": False})
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_child_engine_answers_its_own_parameters(request, engine):
    r = _post(request.getfixturevalue(f"{engine}_server"), "/v1/completions",
              {"model": M, "prompt": "hi", "max_tokens": 2, "presence_penalty": 0.5,
               "logit_bias": {"5": 10}})
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("body", [
    {"prompt": [999999, 5]}, {"prompt": "hi", "seed": 2**64}, {"prompt": "hi", "n": 0}])
def test_bad_stream_request_is_refused_before_the_first_byte(server, body):
    r = _post(server, "/v1/completions", {"model": M, "max_tokens": 2, "stream": True, **body})
    _assert_openai_error(r, 400)
    assert r.headers["content-type"].startswith("application/json")


def test_engine_keeps_serving_after_requests_that_once_broke_it(server):
    """Isolation: each of these once killed mini for good (503 engine_died ever after) or
    gave a 500 on hf. Now the bad ones get a 400, the odd ones an answer, and the engine
    serves the next request."""
    assert _post(server, "/v1/completions",
                 {"model": M, "prompt": [999999, 5], "max_tokens": 2}).status_code == 400
    # a temperature so small that logits / T overflow: greedy, as vLLM treats it
    tiny = _post(server, "/v1/completions", {"model": M, "prompt": "The sky is",
                                             "max_tokens": 4, "temperature": 1e-40,
                                             "ignore_eos": True})
    assert tiny.status_code == 200, tiny.text
    greedy = _post(server, "/v1/completions", {"model": M, "prompt": "The sky is",
                                               "max_tokens": 4, "temperature": 0,
                                               "ignore_eos": True})
    if server.engine != "vllm":   # vLLM 0.32 samples at 0.01 instead (sampling_params.py)
        assert tiny.json()["choices"][0]["text"] == greedy.json()["choices"][0]["text"]
    assert httpx.get(server.base_url + "/health").status_code == 200
    r = _post(server, "/v1/chat/completions", {"model": M, "messages": MSG, "max_tokens": 3})
    assert r.status_code == 200, r.text


# ---- one request cannot stall an engine: prompts x n is capped ---------------------------

def _limits(server) -> dict:
    return httpx.get(server.base_url + "/server_info", headers=server.headers,
                     timeout=30).json()["limits"]


def _assert_too_many_sequences(r: httpx.Response, param: str, cap: int) -> None:
    _assert_openai_error(r, 400)
    err = r.json()["error"]
    # the server's own refusal (it states the cap), not an engine's
    assert err["param"] == param and f"at most {cap} per request" in err["message"], err


def test_too_many_sequences_are_refused_before_the_engine(server):
    """A completion with 10,000 prompts once kept SGLang busy for minutes while every other
    request timed out. Prompts x n over ``--max-sequences-per-request`` is a 400 naming the
    param, from the server itself, whatever the engine; one list of token ids is one prompt."""
    limits = _limits(server)
    cap, max_n = limits["max_sequences_per_request"], limits["max_n"]
    assert cap == 64 and cap // max_n + 1 <= cap      # the default; the "n" case needs it
    many = {"model": M, "prompt": ["hi"] * 10_000, "max_tokens": 1}
    _assert_too_many_sequences(_post(server, "/v1/completions", many), "prompt", cap)
    r = _post(server, "/v1/completions", {**many, "stream": True})
    _assert_too_many_sequences(r, "prompt", cap)
    assert r.headers["content-type"].startswith("application/json")
    # few enough prompts, but n multiplies them past the cap (9 x 8 = 72 > 64)
    r = _post(server, "/v1/completions", {"model": M, "prompt": ["hi"] * (cap // max_n + 1),
                                          "n": max_n, "max_tokens": 1})
    _assert_too_many_sequences(r, "n", cap)
    # 9 token ids are one prompt: 1 x 8 sequences, served (72 if each id counted)
    r = _post(server, "/v1/completions", {"model": M, "prompt": list(range(100, 100 + max_n + 1)),
                                          "n": max_n, "max_tokens": 1})
    assert r.status_code == 200, r.text
    assert len(r.json()["choices"]) == max_n


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_a_prompt_list_at_the_sequence_cap_is_served(request, engine):
    # the engines that take a list of prompts run one at the cap: 8 prompts x n=8 = 64
    server = request.getfixturevalue(f"{engine}_server")
    limits = _limits(server)
    cap, max_n = limits["max_sequences_per_request"], limits["max_n"]
    r = _post(server, "/v1/completions", {"model": M, "prompt": ["hi"] * (cap // max_n),
                                          "n": max_n, "max_tokens": 1})
    assert r.status_code == 200, r.text
    assert len(r.json()["choices"]) == cap


def test_the_sequence_cap_is_a_server_setting():
    # a teaching-engine server of its own, capped at 4 sequences: n=4 is served, n=5 (within
    # --max-n 8) and 5 prompts are refused by the server, before the engine
    from reference_server.models import resolve_model
    resolve_model(M)
    server = wait_ready(launch("mini", "--max-sequences-per-request", "4"))
    try:
        assert _limits(server)["max_sequences_per_request"] == 4
        ok = _post(server, "/v1/completions", {"model": M, "prompt": "hi", "n": 4,
                                               "max_tokens": 1})
        assert ok.status_code == 200, ok.text
        assert len(ok.json()["choices"]) == 4
        r = _post(server, "/v1/chat/completions", {"model": M, "messages": MSG, "n": 5,
                                                   "max_tokens": 1})
        _assert_too_many_sequences(r, "n", 4)
        r = _post(server, "/v1/completions", {"model": M, "prompt": ["hi"] * 5, "max_tokens": 1})
        _assert_too_many_sequences(r, "prompt", 4)
    finally:
        stop(server)
