"""Notebook 14's gateway in front of a real teaching-engine server, over real HTTP.

The server is the session's ``mini`` one; where a test needs two replicas it is listed
twice: the routing policies read only the gateway's own counts, so which replica a request
went to shows in ``/gateway/stats`` and in the log whether the two are one process or two.
"""

from __future__ import annotations

import uuid
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from conftest import DONE, sse_events

from workshop.api_gateway import launch as gateway

pytestmark = pytest.mark.engine

ADMIN = {"name": "ops", "key": "sk-gw-admin", "requests_per_minute": 6000, "burst": 100,
         "admin": True}
SLOW = {"name": "slow", "key": "sk-gw-slow", "requests_per_minute": 1, "burst": 2}
METERED = {"name": "metered", "key": "sk-gw-metered", "requests_per_minute": 600, "burst": 50,
           "quota_tokens": 20, "quota_window_s": 3600}
STREAMER = {"name": "streamer", "key": "sk-gw-streamer", "requests_per_minute": 600,
            "burst": 50}


def auth(key: dict) -> dict:
    return {"Authorization": f"Bearer {key['key']}"}


def chat(gw, key: dict, text: str = "Hello", max_tokens: int = 4, **extra) -> httpx.Response:
    return httpx.post(gw.base_url + "/v1/chat/completions", headers=auth(key), timeout=120,
                      json={"model": gw.model, "max_tokens": max_tokens,
                            "messages": [{"role": "user", "content": text}], **extra})


def stream_events(gw, key: dict, max_tokens: int = 4, **extra) -> list:
    with httpx.stream("POST", gw.base_url + "/v1/chat/completions", headers=auth(key),
                      timeout=120, json={"model": gw.model, "max_tokens": max_tokens,
                                         "stream": True, "ignore_eos": True,
                                         "messages": [{"role": "user", "content": "Hi"}],
                                         **extra}) as r:
        assert r.status_code == 200
        return sse_events(r.read())


def served(gw) -> list[int]:
    return [r["served"] for r in gw.stats()["replicas"]]


def start(mini_server, policy: str = "spread", replicas: int = 2, **kw):
    gw = gateway.start([(mini_server.base_url, mini_server.api_key)] * replicas,
                       [ADMIN, SLOW, METERED, STREAMER], policy=policy, **kw)
    gw.model = mini_server.model
    return gw


@pytest.fixture(scope="module")
def gw(mini_server):
    g = start(mini_server)
    yield g
    g.stop()


def test_no_key_or_an_unknown_key_is_refused_before_any_replica_sees_it(gw):
    before = served(gw)
    for headers in ({}, {"Authorization": "Bearer sk-not-a-key"}, {"Authorization": "sk-gw-admin"}):
        r = httpx.post(gw.base_url + "/v1/chat/completions", headers=headers, timeout=30,
                       json={"model": gw.model, "messages": [{"role": "user", "content": "x"}]})
        assert r.status_code == 401
        assert r.json()["error"]["type"] == "authentication_error"
    assert served(gw) == before
    assert httpx.get(gw.base_url + "/gateway/stats", headers=auth(SLOW)).status_code == 403
    assert httpx.get(gw.base_url + "/v1/models", headers=auth(SLOW)).json()["data"]


def test_over_the_rate_is_a_429_with_retry_after_and_nothing_sent_upstream(gw):
    assert [chat(gw, SLOW).status_code for _ in range(2)] == [200, 200]    # the burst
    before = served(gw)
    r = chat(gw, SLOW)
    assert r.status_code == 429
    assert r.json()["error"]["type"] == "rate_limit_exceeded"
    # one request a minute: the next token is due about 60 s after the burst began
    assert 1 <= int(r.headers["Retry-After"]) <= 60
    assert served(gw) == before
    assert gw.stats()["keys"]["slow"]["rejected_rate"] == 1


def test_a_spent_quota_is_a_429_insufficient_quota_until_the_window_ends(gw):
    first = chat(gw, METERED, max_tokens=8)
    assert first.status_code == 200
    usage = first.json()["usage"]
    spent = usage["prompt_tokens"] + usage["completion_tokens"]
    assert spent >= METERED["quota_tokens"]        # the chat template alone is longer
    k = gw.stats()["keys"]["metered"]
    assert k["prompt_tokens"] + k["completion_tokens"] == spent
    assert k["quota_used"] == spent and k["quota_remaining"] == 0
    before = served(gw)
    r = chat(gw, METERED)
    assert r.status_code == 429
    assert r.json()["error"]["type"] == "insufficient_quota"
    assert 3500 <= int(r.headers["Retry-After"]) <= 3600
    assert served(gw) == before
    assert chat(gw, STREAMER).status_code == 200   # other keys are unaffected


def test_stream_usage_is_counted_but_not_passed_to_a_client_that_did_not_ask(gw):
    def tokens():
        k = gw.stats()["keys"]["streamer"]
        return k["prompt_tokens"] + k["completion_tokens"]

    t0 = tokens()
    plain = stream_events(gw, STREAMER, max_tokens=5)
    t1 = tokens()
    assert plain[-1] == DONE
    chunks = plain[:-1]
    assert all("usage" not in c for c in chunks) and all(c["choices"] for c in chunks)
    asked = stream_events(gw, STREAMER, max_tokens=5,
                          stream_options={"include_usage": True})
    usage = [c["usage"] for c in asked[:-1] if c.get("usage")]
    assert len(usage) == 1 and not asked[-2]["choices"]
    # the same request twice: the plain one was charged what the asking one was told
    assert t1 - t0 == usage[0]["prompt_tokens"] + usage[0]["completion_tokens"] > 5
    assert tokens() - t1 == t1 - t0


def test_spread_takes_turns_and_concentrate_fills_the_first_replica(mini_server):
    with start(mini_server, "spread") as spread, \
            start(mini_server, "concentrate", max_per_replica=8) as packed:
        for g in (spread, packed):
            for _ in range(4):
                assert chat(g, ADMIN, max_tokens=2).status_code == 200
        assert served(spread) == [2, 2]
        assert served(packed) == [4, 0]


def test_concentrate_overflows_to_the_next_replica_when_the_first_is_full(mini_server):
    with start(mini_server, "concentrate", max_per_replica=1) as g:
        with ThreadPoolExecutor(2) as pool:
            replies = list(pool.map(lambda _: chat(g, ADMIN, max_tokens=16, ignore_eos=True),
                                    range(2)))
        assert [r.status_code for r in replies] == [200, 200]
        assert served(g) == [1, 1]
        assert sorted(line["replica"] for line in g.log()) == [0, 1]


def test_the_log_has_one_line_per_request_and_no_text(mini_server):
    marker = f"MARKER-{uuid.uuid4().hex}"
    with start(mini_server, "spread") as g:
        assert chat(g, ADMIN, text=f"Repeat after me: {marker}", max_tokens=24).status_code == 200
        stream_events(g, ADMIN)
        chat(g, {"key": "sk-wrong"})
        raw = g.log_path.read_text()
        lines = g.log()
    assert marker not in raw and "Repeat after me" not in raw
    assert not any(k["key"] in raw for k in (ADMIN, SLOW, METERED, STREAMER))
    assert [(x["key"], x["status"], x["stream"]) for x in lines] == [
        ("ops", 200, False), ("ops", 200, True), (None, 401, False)]
    assert lines[0]["completion_tokens"] > 0 and lines[1]["ttft_s"] > 0


def test_a_busy_replica_s_retry_after_reaches_the_client(busy_upstream):
    # A replica that refuses (its own 429 with an OpenAI body, or a 503 in plain text) says
    # when to come back; the gateway passes that on, streaming or not, in OpenAI's shape.
    gw = gateway.start([(busy_upstream, None)], [ADMIN, STREAMER])
    gw.model = "busy"
    try:
        for stream in (False, True):
            r = httpx.post(gw.base_url + "/v1/completions", headers=auth(STREAMER), timeout=30,
                           json={"model": "busy", "prompt": "hi", "max_tokens": 2,
                                 "stream": stream})
            assert r.status_code == 429 and r.headers.get("retry-after") == "7", (r.headers, r.text)
            assert r.json()["error"]["type"] == "rate_limit_error"
        r = chat(gw, STREAMER)
        assert r.status_code == 503 and r.headers.get("retry-after") == "30", (r.headers, r.text)
        assert r.json()["error"]["type"] == "engine_unavailable"      # its plain text, wrapped
        assert gw.stats()["replicas"][0]["errors"] == 3
    finally:
        gw.stop()
