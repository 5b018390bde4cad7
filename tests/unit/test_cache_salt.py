"""cache_salt (issue 37): prefix-cache reuse scoped per salt, in both of the teaching engine's
caches and through its block manager, and the field's validation at the server's edge.

Block size 4 throughout; A is 12 tokens = 3 full blocks.
"""

from __future__ import annotations

import asyncio

import pytest
from pydantic import ValidationError

from mini_engine.block_manager import BlockAllocator, BlockManager
from mini_engine.prefix_cache import make_prefix_cache
from mini_engine.sequence import SamplingParams, Sequence
from reference_server.config import ServerConfig
from reference_server.engines.local import EngineStats, GenerationStep, LocalEngine
from reference_server.models import ModelSpec
from reference_server.protocol import ChatCompletionRequest, CompletionRequest, unsupported_fields

BS = 4
A = list(range(100, 112))
KINDS = ["hash", "radix"]


def _cache(kind: str, num_blocks: int = 16):
    alloc = BlockAllocator(num_blocks)
    return make_prefix_cache(kind, alloc, BS), alloc


def _cached(cache, alloc, tokens: list[int], salt: str | None) -> list[int]:
    """Put ``tokens`` in the cache under ``salt`` as a finished sequence would (its own
    references dropped after the insert); return the blocks."""
    blocks = [alloc.allocate() for _ in range(len(tokens) // BS)]
    cache.insert(tokens, blocks, salt)
    for b in blocks:
        alloc.decref(b)
    return blocks


@pytest.mark.parametrize("kind", KINDS)
def test_the_same_salt_hits_another_salt_misses(kind):
    cache, alloc = _cache(kind)
    blocks = _cached(cache, alloc, A, "tenant-a")
    assert cache.match(A, "tenant-a") == blocks
    assert cache.match(A, "tenant-b") == []
    assert cache.match(A) == []                 # the unsalted namespace holds nothing yet


@pytest.mark.parametrize("kind", KINDS)
def test_no_salt_shares_with_no_salt_only(kind):
    cache, alloc = _cache(kind)
    blocks = _cached(cache, alloc, A, None)
    assert cache.match(A) == blocks and cache.match(A, None) == blocks
    assert cache.match(A, "tenant-a") == []


@pytest.mark.parametrize("kind", KINDS)
def test_each_salt_keeps_its_own_copy(kind):
    cache, alloc = _cache(kind)
    a = _cached(cache, alloc, A, "a")
    b = _cached(cache, alloc, A, "b")
    none = _cached(cache, alloc, A, None)
    assert len({*a, *b, *none}) == 9 and cache.num_cached_blocks() == 9
    assert (cache.match(A, "a"), cache.match(A, "b"), cache.match(A)) == (a, b, none)
    # a partial match stays within its salt: A's first block + other tokens
    assert cache.match(A[:4] + [1, 2, 3, 4], "b") == b[:1]
    if kind == "radix":
        cache.check_invariants()


def test_the_salt_seeds_the_first_block_of_the_hash_chain():
    # vLLM's design: the salt is in the first block's hash, and every later hash chains on
    # it, so no block of a salted prompt has the hash of an unsalted one.
    cache, _ = _cache("hash")
    salted, plain = list(cache._hashes(A, "a")), list(cache._hashes(A))
    assert len(salted) == len(plain) == 3
    assert not set(salted) & set(plain)
    assert list(cache._hashes(A, "a")) == salted        # deterministic within a process


@pytest.mark.parametrize("kind", KINDS)
def test_eviction_and_reset_reach_every_salt(kind):
    cache, alloc = _cache(kind, num_blocks=9)
    for salt in ("a", "b", None):
        _cached(cache, alloc, A, salt)
    assert alloc.num_free == 0 and cache.num_evictable() == 9
    assert cache.evict(3) >= 3
    assert cache.reset() + 3 <= 9 and cache.num_cached_blocks() == 0
    assert alloc.num_free == 9
    if kind == "radix":
        assert list(cache.roots) == [None]        # emptied tenants' trees are forgotten
        cache.check_invariants()


@pytest.mark.parametrize("kind", KINDS)
def test_the_block_manager_uses_the_sequences_salt(kind):
    bm = BlockManager(16, BS)
    bm.prefix_cache = make_prefix_cache(kind, bm.allocator, BS)     # as LLMEngine does

    def run(salt: str | None) -> int:
        seq = Sequence(A + [1], SamplingParams(max_tokens=1, cache_salt=salt))
        assert seq.cache_salt == salt
        hit = bm.match_prefix(seq)
        assert bm.allocate(seq, seq.num_tokens)
        seq.num_computed_tokens = seq.num_tokens
        bm.cache_full_blocks(seq)
        bm.free(seq)
        return hit

    assert [run("a"), run("a"), run("b"), run(None), run(None), run("b")] == \
        [0, 12, 0, 0, 12, 12]


# ---- the field at the server's edge -------------------------------------------------------

def _req(cls, **kw):
    base = {"model": "m"}
    base |= {"messages": [{"role": "user", "content": "hi"}]} if cls is ChatCompletionRequest \
        else {"prompt": "hi"}
    return cls.model_validate({**base, **kw})


@pytest.mark.parametrize("cls", [ChatCompletionRequest, CompletionRequest])
@pytest.mark.parametrize("bad, says", [
    ("", "non-empty string"), (5, "valid string"), (["a"], "valid string"),
    ("x" * 129, "at most 128"), ("a/b", "'/'"), ("a@b", "'@'"), ("a\\b", "NUL"),
    ("a\x00", "NUL")])
def test_bad_salts_are_refused_by_name(cls, bad, says):
    with pytest.raises(ValidationError) as e:
        _req(cls, cache_salt=bad)
    err = e.value.errors()[0]
    assert err["loc"] == ("cache_salt",) and says in err["msg"]


@pytest.mark.parametrize("cls", [ChatCompletionRequest, CompletionRequest])
def test_a_salt_is_a_typed_field_every_engine_accepts(cls):
    req = _req(cls, cache_salt="x" * 128)
    assert req.cache_salt == "x" * 128 and "cache_salt" not in (req.model_extra or {})
    assert _req(cls, cache_salt=None).cache_salt is None
    kind = "chat" if cls is ChatCompletionRequest else "complete"
    assert unsupported_fields(req, kind) == []     # the in-process engines take it
    # a proxied engine gets it as sent
    assert req.model_dump(exclude_unset=True)["cache_salt"] == "x" * 128


class _Recorder(LocalEngine):
    """Answers one token and keeps the sampling parameters it was given."""

    name = "recorder"
    ready = True

    def __init__(self):
        super().__init__(ServerConfig(engine="hf", device="cpu"), ModelSpec("m", "", False))
        self.tokenizer = type("T", (), {"eos_token_id": 0, "encode": lambda s, t: [1, 2],
                                        "decode": lambda s, ids, **k: "x"})()
        self.max_model_len, self.model_name, self.params = 64, "m", None

    async def generate(self, request_id, prompt_token_ids, params):
        self.params = params
        yield GenerationStep([5], finish_reason="length")

    def stats(self):
        return EngineStats()

    async def start(self): ...
    async def stop(self): ...
    def info(self): ...
    async def reset_prefix_cache(self): return False


def test_the_adapter_hands_the_salt_to_the_engine():
    engine = _Recorder()
    asyncio.run(engine.complete(_req(CompletionRequest, cache_salt="t1", max_tokens=1)))
    assert engine.params.cache_salt == "t1"
    asyncio.run(engine.complete(_req(CompletionRequest, max_tokens=1)))
    assert engine.params.cache_salt is None
