"""Block allocator, prefix caches and scheduler of the teaching engine, without a model.

A fake forward pass moves ``num_computed_tokens`` and appends random tokens, so thousands of
requests, aborts and preemptions run in a second; after each step the reference counts must
equal (sequences holding the block) + (1 if the prefix cache holds it).
"""

from __future__ import annotations

import random
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mini_engine.block_manager import BlockAllocator, BlockManager
from mini_engine.config import EngineConfig
from mini_engine.prefix_cache import HashPrefixCache, RadixPrefixCache, make_prefix_cache
from mini_engine.scheduler import ContinuousScheduler, Scheduler, StaticScheduler, make_scheduler
from mini_engine.sequence import SamplingParams, SeqStatus, Sequence


def make(num_blocks=64, block_size=4, prefix=None, mode="paged", **sched):
    bm = BlockManager(num_blocks, block_size, mode=mode, max_model_len=256)
    bm.prefix_cache = make_prefix_cache(prefix, bm.allocator, block_size)
    config = EngineConfig(block_size=block_size, max_model_len=256, **sched)
    return bm, make_scheduler(config, bm)


def fake_step(sched: Scheduler, rng: random.Random, vocab=6):
    """What the engine does after a forward, minus the model."""
    out = sched.schedule()
    finished = []
    for s in out.scheduled:
        seq = s.seq
        seq.num_computed_tokens += s.num_tokens
        if seq.num_computed_tokens == seq.num_tokens:
            if seq.append_token(rng.randrange(vocab), 256):
                finished.append(seq)
        sched.bm.cache_full_blocks(seq)
    for seq in finished:
        sched.finish(seq)
    return out


def check_refcounts(sched: Scheduler):
    bm = sched.bm
    held = Counter(b for s in list(sched.running) + list(sched.waiting) for b in s.block_table)
    pc = bm.prefix_cache
    cached = set()
    if isinstance(pc, HashPrefixCache):
        cached = set(pc.meta)
    elif isinstance(pc, RadixPrefixCache):
        pc.check_invariants()
        cached = {b for n in pc._nodes() for b in n.blocks}
    for b in range(bm.num_blocks):
        assert bm.allocator.ref_count[b] == held[b] + (b in cached), b
    assert bm.allocator.num_free == sum(1 for r in bm.allocator.ref_count if r == 0)
    for s in sched.running:   # every running sequence's tokens fit its table
        assert len(s.block_table) * bm.block_size >= s.num_computed_tokens


@pytest.mark.parametrize("prefix", [None, "hash", "radix"])
@pytest.mark.parametrize("mode", ["paged", "contiguous"])
def test_no_leak_after_thousands_of_requests_and_aborts(prefix, mode):
    if mode == "contiguous" and prefix:
        pytest.skip("contiguous reservation is the no-sharing baseline")
    rng = random.Random(hash((prefix, mode)) & 0xFFFF)
    bm, sched = make(num_blocks=256 if mode == "contiguous" else 48, prefix=prefix, mode=mode,
                     max_num_seqs=8, max_num_batched_tokens=32)
    live: list[Sequence] = []
    shared = [rng.randrange(6) for _ in range(12)]       # a common prefix, for cache hits
    total = 0
    for step in range(3000):
        if rng.random() < 0.6 and total < 2000:
            prompt = (shared[:rng.randrange(13)]
                      + [rng.randrange(6) for _ in range(rng.randrange(1, 20))])
            seq = Sequence(prompt, SamplingParams(max_tokens=rng.randrange(1, 24)))
            sched.add(seq)
            live.append(seq)
            total += 1
        if live and rng.random() < 0.1:                   # a client goes away
            victim = live.pop(rng.randrange(len(live)))
            if not victim.finished:
                sched.finish(victim)
        fake_step(sched, rng)
        live = [s for s in live if not s.finished]
        check_refcounts(sched)
    while sched.has_unfinished():
        fake_step(sched, rng)
    check_refcounts(sched)
    if bm.prefix_cache is not None:
        assert bm.prefix_hits > 0
        bm.prefix_cache.reset()
    assert bm.allocator.num_free == bm.num_blocks
    assert all(r == 0 for r in bm.allocator.ref_count)
    assert total >= 1000


def test_contiguous_reserves_max_len_and_fragments():
    bm, sched = make(num_blocks=256, mode="contiguous")
    sched.add(Sequence([1, 2, 3], SamplingParams(max_tokens=4)))
    sched.schedule()
    seq = sched.running[0]
    assert len(seq.block_table) == 256 // 4                  # max_model_len / block_size
    assert BlockManager.fragmentation([seq], 4) > 0.95
    bm2, sched2 = make(num_blocks=256)
    sched2.add(Sequence([1, 2, 3], SamplingParams(max_tokens=4)))
    sched2.schedule()
    assert len(sched2.running[0].block_table) == 1


def test_token_budget_and_seq_cap_respected():
    rng = random.Random(1)
    bm, sched = make(num_blocks=400, max_num_seqs=5, max_num_batched_tokens=16)
    for _ in range(40):
        sched.add(Sequence([rng.randrange(50) for _ in range(rng.randrange(1, 40))],
                           SamplingParams(max_tokens=rng.randrange(1, 10))))
    while sched.has_unfinished():
        out = fake_step(sched, rng)
        assert out.num_batched_tokens <= 16
        assert len(out.scheduled) <= 5 and len(sched.running) <= 5


def test_chunked_prefill_splits_long_prompt_and_decodes_keep_going():
    rng = random.Random(2)
    bm, sched = make(num_blocks=400, max_num_batched_tokens=8)
    short = Sequence([1, 2], SamplingParams(max_tokens=30))
    sched.add(short)
    fake_step(sched, rng)
    long = Sequence(list(range(100)), SamplingParams(max_tokens=1))
    sched.add(long)
    steps_with_both = 0
    while not long.finished:
        out = fake_step(sched, rng)
        ids = {s.seq.seq_id for s in out.scheduled}
        steps_with_both += short.seq_id in ids and long.seq_id in ids
    assert steps_with_both >= 10      # the decode was never stalled by the 100-token prefill


def test_no_starvation_fcfs_under_memory_pressure():
    """With memory for ~2 sequences and a stream of arrivals, every request finishes, and
    requests get their first token in arrival order (FCFS; preempted ones go first)."""
    rng = random.Random(3)
    bm, sched = make(num_blocks=12, block_size=4, max_num_batched_tokens=64)
    seqs = []
    first_token_step = {}
    for step in range(2000):
        if step % 3 == 0 and len(seqs) < 60:
            s = Sequence([rng.randrange(9) for _ in range(rng.randrange(2, 12))],
                         SamplingParams(max_tokens=rng.randrange(2, 14)))
            seqs.append(s)
            sched.add(s)
        fake_step(sched, rng)
        for s in seqs:
            if s.num_output_tokens and s.seq_id not in first_token_step:
                first_token_step[s.seq_id] = step
        if len(seqs) == 60 and not sched.has_unfinished():
            break
    assert all(s.finished for s in seqs)
    assert sched.num_preemptions > 0
    order = sorted(first_token_step, key=lambda i: (first_token_step[i], i))
    assert order == sorted(order)


def test_preempted_sequence_is_recomputed_from_scratch():
    rng = random.Random(4)
    bm, sched = make(num_blocks=6, block_size=4, max_num_batched_tokens=64)
    a = Sequence([1] * 8, SamplingParams(max_tokens=12))
    b = Sequence([2] * 8, SamplingParams(max_tokens=12))
    sched.add(a)
    sched.add(b)
    saw_preempt = False
    while sched.has_unfinished():
        out = fake_step(sched, rng)
        for p in out.preempted:
            saw_preempt = True
            assert p.block_table == [] and p.num_computed_tokens == 0
            assert p.status is SeqStatus.WAITING and sched.waiting[0] is p
    assert saw_preempt and a.finished and b.finished
    assert a.num_output_tokens == 12 and b.num_output_tokens == 12


def test_static_batching_waits_for_whole_batch():
    rng = random.Random(5)
    bm, sched = make(num_blocks=400, scheduler="static", max_num_seqs=4)
    assert isinstance(sched, StaticScheduler)
    seqs = [Sequence([1, 2, 3], SamplingParams(max_tokens=m)) for m in (1, 20, 1, 1, 1, 1)]
    for s in seqs:
        sched.add(s)
    fake_step(sched, rng)
    assert {s.seq_id for s in sched.running} == {seqs[1].seq_id}   # 3 finished at once
    for _ in range(10):
        fake_step(sched, rng)
        assert seqs[4].status is SeqStatus.WAITING               # seats stay empty
    while sched.has_unfinished():
        fake_step(sched, rng)
    assert all(s.finished for s in seqs)


def test_continuous_refills_seats_as_soon_as_they_free():
    """The same workload as above under continuous batching: the seats of the three short
    requests are refilled at the next step."""
    rng = random.Random(5)
    bm, sched = make(num_blocks=400, max_num_seqs=4)
    assert isinstance(sched, ContinuousScheduler)
    seqs = [Sequence([1, 2, 3], SamplingParams(max_tokens=m)) for m in (1, 20, 1, 1, 1, 1)]
    for s in seqs:
        sched.add(s)
    fake_step(sched, rng)
    fake_step(sched, rng)
    assert seqs[4].status is not SeqStatus.WAITING and seqs[5].status is not SeqStatus.WAITING


def test_offers_to_the_prefix_cache_are_tracked_by_the_block_manager():
    """Each full block is offered once; freeing a sequence (finish or preemption) resets
    the count, so a recomputed sequence offers its new blocks again. The scheduler leaves
    this bookkeeping alone."""
    bm, sched = make(num_blocks=8, block_size=4, prefix="hash")
    seq = Sequence(list(range(9)), SamplingParams(max_tokens=4))
    sched.add(seq)
    out = sched.schedule()
    seq.num_computed_tokens += out.scheduled[0].num_tokens
    bm.cache_full_blocks(seq)
    assert seq.num_blocks_offered == 2 and bm.prefix_cache.num_cached_blocks() == 2
    bm.cache_full_blocks(seq)                      # nothing new: no second offer
    assert seq.num_blocks_offered == 2
    sched._preempt(type(out)())
    assert seq.num_blocks_offered == 0 and seq.block_table == []


# -- prefix caches ---------------------------------------------------------------------------

BS = 2
token_lists = st.lists(st.integers(0, 2), min_size=0, max_size=14)


@settings(max_examples=150, deadline=None)
@given(ops=st.lists(st.tuples(st.sampled_from(["insert", "match", "evict", "release"]),
                              token_lists, st.integers(1, 6)), max_size=40),
       kind=st.sampled_from(["radix", "hash"]))
def test_prefix_cache_invariants(ops, kind):
    """Random inserts, lookups, evictions and releases: a match returns blocks whose
    recorded content equals the query, references stay consistent, eviction frees only
    blocks nobody else holds, and reset returns every idle block."""
    alloc = BlockAllocator(200)
    cache = RadixPrefixCache(alloc, BS) if kind == "radix" else HashPrefixCache(alloc, BS)
    content: dict[int, tuple] = {}       # block -> the tokens of the whole prefix it ends
    holders: list[list[int]] = []        # block lists "sequences" still hold
    for op, toks, n in ops:
        full = len(toks) // BS * BS
        toks = toks[:full]
        if op == "insert" and toks:
            if alloc.num_free < len(toks) // BS:
                continue
            blocks = [alloc.allocate() for _ in range(len(toks) // BS)]
            for i, b in enumerate(blocks):
                content[b] = tuple(toks[:(i + 1) * BS])
            cache.insert(toks, blocks)
            holders.append(blocks)
        elif op == "match":
            got = cache.match(toks)
            for i, b in enumerate(got):
                assert content[b] == tuple(toks[:(i + 1) * BS])
            for b in got:
                alloc.incref(b)
            holders.append(got)
        elif op == "evict":
            before = alloc.num_free
            evictable = cache.num_evictable()
            freed = cache.evict(n)
            assert alloc.num_free - before == freed
            if kind == "hash":
                assert freed == min(n, evictable)
        elif op == "release" and holders:
            for b in holders.pop(n % len(holders)):
                alloc.decref(b)
        if kind == "radix":
            cache.check_invariants()
        in_use = Counter(b for h in holders for b in h)
        cached = cache.num_cached_blocks()
        assert sum(1 for r in alloc.ref_count if r) == len(set(in_use) | _cached_set(cache))
        assert cached == len(_cached_set(cache))
    for h in holders:
        for b in h:
            alloc.decref(b)
    cache.reset()
    assert alloc.num_free == 200 and cache.num_cached_blocks() == 0


def _cached_set(cache) -> set[int]:
    if isinstance(cache, HashPrefixCache):
        return set(cache.meta)
    return {b for n in cache._nodes() for b in n.blocks}


def test_radix_splits_on_partial_match_and_evicts_lru_leaf_first():
    alloc = BlockAllocator(10)
    cache = RadixPrefixCache(alloc, 2)
    a = [alloc.allocate() for _ in range(3)]
    cache.insert([1, 1, 2, 2, 3, 3], a)
    got = cache.match([1, 1, 2, 2, 9, 9])          # shares two blocks: the edge splits
    assert got == a[:2]
    for b in got:
        alloc.incref(b)                              # the caller takes its references
    tree = cache.dump()
    assert len(tree["children"]) == 1 and tree["children"][0]["tokens"] == 4
    for b in a:
        alloc.decref(b)                              # the inserting sequence finishes
    # the match still holds a[:2]: only the unshared tail a[2] can go
    assert cache.evict(5) == 1 and alloc.ref_count[a[2]] == 0
    for b in got:
        alloc.decref(b)
    assert cache.evict(5) == 2 and cache.num_cached_blocks() == 0


def test_lowest_order_hands_out_consecutive_blocks_after_traffic():
    """After blocks come back in a scrambled order, ``lowest`` still gives a new prompt a run
    of consecutive blocks (its keys are then read back in long stretches); the ``fifo``
    queue gives it the blocks in the order they were freed."""
    tables = {}
    for order in ("lowest", "fifo"):
        alloc = BlockAllocator(64, order)
        held = [alloc.allocate() for _ in range(64)]
        for b in held[::2] + held[1::2][::-1]:          # freed out of order, as traffic does
            alloc.decref(b)
        tables[order] = [alloc.allocate() for _ in range(8)]
        assert alloc.num_free == 56 and len(set(tables[order])) == 8
    assert tables["lowest"] == list(range(8))
    assert tables["fifo"] == [0, 2, 4, 6, 8, 10, 12, 14]
    with pytest.raises(ValueError):
        BlockAllocator(4, "random")
