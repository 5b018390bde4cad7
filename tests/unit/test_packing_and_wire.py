"""Notebook 12's pure parts: the packing policy (pinned + lazy load + LRU eviction under a
memory budget), its predictions, and what travels on the queue (MessagePack, base64-in-JSON)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from workshop.shared_queue import packing, wire
from workshop.shared_queue.packing import ModelPool

MB = 1 << 20


def test_lru_evicts_the_least_recently_used_unpinned_model_first():
    pool = ModelPool(3 * MB, {m: MB for m in "abcde"}, pinned=["a"])
    assert list(pool.loaded) == ["a"] and pool.used == MB          # pinned: loaded up front
    assert pool.admit("b") == packing.Admission("b", hit=False)
    assert pool.admit("c") == packing.Admission("c", hit=False)
    assert pool.admit("b").hit                                     # b is now the most recent
    assert pool.admit("a").hit                                     # a pinned, never a victim
    d = pool.admit("d")
    assert d == packing.Admission("d", hit=False, evict=("c",))    # c: least recently used
    assert pool.admit("e").evict == ("b",)
    assert pool.evictions == ["c", "b"] and "a" in pool.loaded
    assert (pool.hits, pool.misses) == (2, 4)


def test_a_big_model_evicts_as_many_small_ones_as_it_needs_oldest_first():
    sizes = {"small1": MB, "small2": MB, "small3": MB, "big": 2 * MB}
    pool = ModelPool(3 * MB, sizes)
    for m in ("small1", "small2", "small3"):
        pool.admit(m)
    assert pool.admit("big").evict == ("small1", "small2")
    assert list(pool.loaded) == ["small3", "big"] and pool.used == 3 * MB


def test_busy_models_are_not_evicted_and_the_newcomer_waits():
    pool = ModelPool(2 * MB, {m: MB for m in "abc"})
    pool.admit("a"), pool.admit("b")
    assert pool.admit("c", busy={"a", "b"}) is None                # nothing evictable: wait
    assert set(pool.loaded) == {"a", "b"} and pool.misses == 2     # and nothing changed
    assert pool.admit("c", busy={"a"}).evict == ("b",)             # b is free: evict it


def test_a_model_that_never_fits_beside_the_pinned_ones_is_refused():
    with pytest.raises(ValueError, match="do not fit"):
        ModelPool(MB, {"a": MB, "b": MB}, pinned=["a", "b"])
    pool = ModelPool(2 * MB, {"a": MB, "big": 2 * MB}, pinned=["a"])
    with pytest.raises(ValueError, match="never fits"):
        pool.admit("big")
    with pytest.raises(KeyError):
        pool.admit("unknown")


@settings(max_examples=200, deadline=None)
@given(sizes=st.lists(st.integers(1, 5), min_size=2, max_size=7),
       budget=st.integers(5, 12), pinned=st.integers(0, 2),
       requests=st.lists(st.tuples(st.integers(0, 6), st.sets(st.integers(0, 6), max_size=3)),
                         max_size=60))
def test_the_budget_is_never_exceeded_and_pinned_models_stay(sizes, budget, pinned, requests):
    names = [f"m{i}" for i in range(len(sizes))]
    size = dict(zip(names, sizes))
    pins = names[:pinned]
    if sum(size[m] for m in pins) > budget:
        return
    pool = ModelPool(budget, size, pins)
    for i, busy in requests:
        model = names[i % len(names)]
        busy = {names[b % len(names)] for b in busy} & set(pool.loaded)
        before = dict(pool.loaded)
        try:
            d = pool.admit(model, busy)
        except ValueError:
            assert not pool.can_ever_fit(model)
            continue
        assert pool.used <= budget
        assert all(m in pool.loaded for m in pins)
        if d is None:
            assert pool.loaded == before
            continue
        assert not set(d.evict) & (busy | set(pins))
        # Evicting first is enough: what stays plus the newcomer fits at every moment.
        assert sum(before[m] for m in before if m not in d.evict) + (
            0 if d.hit else size[model]) <= budget
        assert list(pool.loaded)[-1] == model                     # most recently used


def test_replay_matches_che_and_hit_rate_grows_with_skew_and_budget():
    names = [f"m{i}" for i in range(6)]
    sizes = {m: MB for m in names}
    seq = packing.zipf_models(names, 1.0, 20_000, np.random.default_rng(0))
    for budget, pinned in [(2, 0), (2, 1), (4, 1)]:
        replayed = packing.replay(seq, budget * MB, sizes, names[:pinned]).hit_rate
        assert replayed == pytest.approx(packing.che_hit_rate(packing.zipf_weights(6, 1.0),
                                                              budget, pinned), abs=0.02)
    # uniform popularity: an LRU of c out of n models hits c / n of the time
    assert packing.che_hit_rate(packing.zipf_weights(6, 0.0), 3) == pytest.approx(0.5)
    assert packing.che_hit_rate(packing.zipf_weights(6, 1.0), 6) == pytest.approx(1.0)
    rates = [packing.che_hit_rate(packing.zipf_weights(6, s), 2, 1) for s in (0, 0.5, 1, 1.5)]
    assert rates == sorted(rates)


def test_zipf_weights():
    w = packing.zipf_weights(4, 1.0)
    assert w.sum() == pytest.approx(1.0)
    assert w[0] / w[1] == pytest.approx(2.0) and w[0] / w[3] == pytest.approx(4.0)
    assert np.allclose(packing.zipf_weights(5, 0.0), 0.2)


# -- the wire ------------------------------------------------------------------------------------

def test_request_and_reply_round_trip():
    req = wire.Request("r1", "smol-a", [0, 5, 49151, 2**31 - 1], 7, sent=123.5)
    assert wire.Request.decode(req.encode()) == req
    assert req.size == 4 + 7
    rep = wire.Reply("r1", "w0", [3, 1, 4], None, delivered=2, hit=False, load_s=0.5,
                     pulled=1.0, finished=2.0)
    assert wire.Reply.decode(rep.encode()) == rep
    # token ids travel as 4 bytes each, not as text
    assert len(req.encode()) < 4 * len(req.prompt) + 80


@pytest.mark.parametrize("what", list(wire.example_payloads()))
def test_every_encoding_round_trips_every_payload_and_base64_costs_a_third(what):
    arr = wire.example_payloads()[what]
    sizes = {}
    for name, (enc, dec) in wire.encoders().items():
        blob = enc(arr)
        back = dec(blob, arr)
        assert back.dtype == arr.dtype and back.shape == arr.shape
        assert np.array_equal(back, arr)
        sizes[name] = len(blob)
    raw = arr.nbytes
    assert raw < sizes["MessagePack, bin"] < raw + 100                       # a small header
    assert sizes["JSON, base64 string"] >= wire.base64_size(raw)             # 4 chars per 3 bytes
    assert sizes["JSON, base64 string"] < wire.base64_size(raw) + 100
    assert wire.base64_size(3) == 4 and wire.base64_size(4) == 8


def test_compare_encodings_reports_every_pair():
    rows = wire.compare_encodings({"tiny": np.arange(10, dtype=np.int32)}, repeat=1,
                                  min_time=0.0)
    assert [r["encoding"] for r in rows] == list(wire.encoders())
    assert all(r["encode us"] > 0 and r["decode us"] > 0 for r in rows)
