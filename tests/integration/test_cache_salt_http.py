"""Issue 37: ``cache_salt`` over real HTTP. Requests share cached prompt blocks only with
requests of the same salt, on every engine with a prefix cache (vLLM, SGLang, the teaching
engine, and remote, whose upstream is a teaching engine); hf, with no prefix cache, accepts
the field; a bad salt is a 400 naming it on every engine, before any byte is streamed."""

from __future__ import annotations

import uuid

import httpx
import pytest

pytestmark = pytest.mark.engine

M = "smollm2-135m"
CACHING = {"vllm", "sglang", "mini", "remote"}      # hf keeps no prefix cache
WORDS = "the quick brown fox jumps over the lazy dog and "


def _post(server, body: dict) -> httpx.Response:
    return httpx.post(server.base_url + "/v1/completions", headers=server.headers,
                      json={"model": M, **body}, timeout=300)


def _cached(server, prompt: str, **extra) -> tuple[int, int]:
    """(prompt tokens, cached prompt tokens) of one 1-token completion."""
    r = _post(server, {"prompt": prompt, "max_tokens": 1, "ignore_eos": True, **extra})
    assert r.status_code == 200, r.text
    usage = r.json()["usage"]
    return usage["prompt_tokens"], (usage.get("prompt_tokens_details") or {}).get(
        "cached_tokens") or 0


def test_only_requests_with_the_same_salt_share_cached_blocks(server):
    info = httpx.get(server.base_url + "/server_info", headers=server.headers, timeout=30).json()
    block = info.get("block_size") or 16
    # a prompt of more than two blocks, new to this session: a fresh id first
    prompt = uuid.uuid4().hex + " " + WORDS * (3 * block // 10 + 2)
    # emptied first, so the unsalted request below can only miss (hf answers false: no cache)
    reset = httpx.post(server.base_url + "/reset_prefix_cache", headers=server.headers,
                       timeout=60).json()
    assert reset["success"] is (server.engine in CACHING)
    salt_a, salt_b = "tenant-a-" + uuid.uuid4().hex, "tenant-b-" + uuid.uuid4().hex
    n, first = _cached(server, prompt, cache_salt=salt_a)
    assert n >= 2 * block + 1 and first == 0
    _, again = _cached(server, prompt, cache_salt=salt_a)
    _, other = _cached(server, prompt, cache_salt=salt_b)
    _, plain = _cached(server, prompt)
    assert other == 0 and plain == 0, (other, plain)
    if server.engine in CACHING:
        assert again >= block, again        # at least the first block came from the cache
    else:
        assert again == 0                   # accepted; nothing is shared anyway
    r = httpx.post(server.base_url + "/v1/chat/completions", headers=server.headers, timeout=300,
                   json={"model": M, "messages": [{"role": "user", "content": "Hi"}],
                         "max_tokens": 1, "cache_salt": salt_a})
    assert r.status_code == 200, r.text     # chat takes it too


@pytest.mark.parametrize("salt", ["", "a/b"])
def test_a_bad_salt_is_a_400_naming_it_before_any_byte(server, salt):
    for stream in (False, True):
        r = _post(server, {"prompt": "Hello", "max_tokens": 1, "stream": stream,
                           "cache_salt": salt})
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["param"] == "cache_salt" and "cache_salt" in err["message"]
        assert err["type"] == "invalid_request_error"
