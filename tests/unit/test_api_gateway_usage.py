"""What the gateway counts and what it logs: usage taken from a stream without leaking the
usage chunk to a client that did not ask, the keys file, and a log line without text."""

from __future__ import annotations

import json

import pytest

from workshop.api_gateway import request_log
from workshop.api_gateway.keys import bearer_secret, digest, load_keys, parse_keys
from workshop.api_gateway.usage import UsageFilter, tokens_of, wants_usage, with_usage

# What an OpenAI-compatible server streams when asked for include_usage: "usage": null in
# every chunk, then a chunk with no choices and the totals.
CHUNKS = [
    {"id": "c1", "choices": [{"index": 0, "delta": {"content": "Hel"}}], "usage": None},
    {"id": "c1", "choices": [{"index": 0, "delta": {"content": "lo"}}], "usage": None},
    {"id": "c1", "choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 2,
                                          "total_tokens": 9}},
]


def sse(objs) -> bytes:
    return b"".join(b"data: " + json.dumps(o).encode() + b"\n\n" for o in objs) \
        + b"data: [DONE]\n\n"


def events(data: bytes) -> list:
    return [json.loads(e[6:]) if e != b"data: [DONE]" else "[DONE]"
            for e in data.split(b"\n\n") if e]


def test_the_request_upstream_always_asks_for_usage_and_keeps_other_options():
    body = {"model": "m", "stream": True, "stream_options": {"continuous_usage_stats": False}}
    assert with_usage(body)["stream_options"] == {"continuous_usage_stats": False,
                                                  "include_usage": True}
    assert "stream_options" not in body or body["stream_options"].get("include_usage") is None
    assert with_usage({"model": "m"}) == {"model": "m"}        # not a stream: unchanged
    assert wants_usage({"stream_options": {"include_usage": True}})
    assert not wants_usage({"stream": True})


def test_usage_is_counted_and_not_passed_on_when_not_asked_even_split_anywhere():
    raw = sse(CHUNKS)
    for cut in range(1, len(raw)):                 # every split point of the byte stream
        f = UsageFilter(pass_usage=False)
        out = f.feed(raw[:cut]) + f.feed(raw[cut:]) + f.flush()
        assert tokens_of(f.usage) == (7, 2)
        got = events(out)
        assert got[-1] == "[DONE]" and len(got) == 3          # the usage chunk is gone
        assert all("usage" not in e for e in got[:-1])        # and so is "usage": null
        assert [e["choices"][0]["delta"]["content"] for e in got[:-1]] == ["Hel", "lo"]
        assert f.first_token_seen


def test_the_first_token_is_the_first_text_not_a_role_only_chunk():
    f = UsageFilter(pass_usage=True)
    f.feed(sse([{"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}]))
    assert not f.first_token_seen
    f.feed(sse(CHUNKS[:1]))
    assert f.first_token_seen
    g = UsageFilter(pass_usage=True)
    g.feed(sse([{"choices": [{"index": 0, "text": " the"}]}]))          # /v1/completions
    assert g.first_token_seen


def test_usage_is_relayed_byte_for_byte_when_the_client_asked():
    raw = sse(CHUNKS)
    f = UsageFilter(pass_usage=True)
    assert f.feed(raw) + f.flush() == raw
    assert tokens_of(f.usage) == (7, 2)


def test_a_stream_without_usage_counts_nothing_and_relays_errors_as_they_are():
    err = b'data: {"error": {"message": "boom", "type": "server_error"}}\n\n'
    f = UsageFilter(pass_usage=False)
    assert f.feed(err) == err and f.usage is None and tokens_of(f.usage) == (0, 0)
    assert f.feed(b": keep-alive\n\n") == b": keep-alive\n\n"


def test_keys_are_kept_as_digests_and_looked_up_by_bearer(tmp_path):
    path = tmp_path / "keys.json"
    path.write_text(json.dumps({"keys": [
        {"name": "team-a", "key": "sk-aaa", "requests_per_minute": 60, "burst": 5,
         "quota_tokens": 1000, "quota_window_s": 60, "admin": True},
        {"name": "team-b", "key": "sk-bbb", "requests_per_minute": 12}]}))
    keys = load_keys(path)
    a = keys[digest("sk-aaa")]
    assert (a.name, a.burst, a.quota_tokens, a.admin) == ("team-a", 5, 1000, True)
    b = keys[digest(bearer_secret("Bearer sk-bbb"))]
    assert (b.name, b.burst, b.quota_tokens, b.admin) == ("team-b", 2, None, False)
    assert "sk-aaa" not in repr(keys) and "sk-bbb" not in repr(keys)
    assert bearer_secret("Basic sk-aaa") is None and bearer_secret(None) is None
    assert bearer_secret("Bearer ") is None


def test_a_toml_keys_file(tmp_path):
    path = tmp_path / "keys.toml"
    path.write_text('[[keys]]\nname = "t"\nkey = "sk-t"\nrequests_per_minute = 6\n')
    assert load_keys(path)[digest("sk-t")].name == "t"


@pytest.mark.parametrize("entries", [
    [],
    [{"name": "a", "key": "k"}],                                           # no rate
    [{"name": "a", "key": "k", "requests_per_minute": 1},
     {"name": "a", "key": "j", "requests_per_minute": 1}],                 # same name
    [{"name": "a", "key": "k", "requests_per_minute": 1},
     {"name": "b", "key": "k", "requests_per_minute": 1}],                 # same secret
])
def test_bad_keys_files_are_refused(entries):
    with pytest.raises(ValueError):
        parse_keys(entries)


def test_a_log_line_has_exactly_the_named_fields():
    rec = json.loads(request_log.line(key="team-a", model="m", replica=1, status=200,
                                      prompt_tokens=7, completion_tokens=2, latency_s=0.5,
                                      ttft_s=0.1, stream=True, at=100.0))
    assert rec == {"time": 100.0, "key": "team-a", "model": "m", "replica": 1,
                   "status": 200, "stream": True, "prompt_tokens": 7,
                   "completion_tokens": 2, "latency_s": 0.5, "ttft_s": 0.1, "error": None}
    with pytest.raises(TypeError):          # no way to hand it the request's text
        request_log.line(key="a", model="m", replica=0, status=200, latency_s=0.1,
                         messages=[{"role": "user", "content": "secret"}])
