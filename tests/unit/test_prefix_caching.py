"""engine_lab.prefix_caching: replays through the engine's caches, and the rows of live runs.

Every expected number is worked out by hand in the comments (block size 4 throughout).
"""

from types import SimpleNamespace

import pytest

from reference_server import prometheus as P
from workshop.bench.request_metrics import RequestRecord
from workshop.engine_lab import prefix_caching as pc

A = list(range(100, 112))                       # 12 tokens = 3 blocks
B = list(range(100, 110)) + [7, 8, 9, 10]       # shares 10 tokens (2 blocks + 2) with A
C = A + [1, 2, 3, 4]                            # A is its prefix


@pytest.mark.parametrize("kind", ["hash", "radix"])
def test_only_full_blocks_are_reused(kind):
    r = pc.replay([(A, []), (B, []), (C, [])], kind, 4, 64)
    # B: 10 shared tokens -> 2 whole blocks = 8; C: all 3 of A's blocks = 12.
    assert r.hit_tokens == [0, 8, 12]
    assert r.prompt_tokens == [12, 14, 16]
    assert r.hit_rate == pytest.approx(20 / 42)
    assert r.refused == 0


@pytest.mark.parametrize("kind", ["hash", "radix"])
def test_the_last_prompt_token_is_always_computed(kind):
    # The same 12-token prompt twice: 3 blocks cached, but the block holding the last token
    # is withheld so the engine has a token to compute: 8 tokens, not 12.
    r = pc.replay([(A, []), (A, [])], kind, 4, 64)
    assert r.hit_tokens == [0, 8]


def test_no_cache_finds_nothing():
    r = pc.replay([(A, []), (A, [])], "none", 4, 64)
    assert r.hit_tokens == [0, 0]
    assert r.hit_rate == 0.0


def test_output_blocks_are_cached_too():
    # 5 prompt + 3 output tokens: 7 computed (the last output token never is) = 1 full
    # block; a prompt made of those 8 tokens + 1 finds that block only: 4 tokens. With
    # 2 + 7 output tokens, 8 are computed: both blocks are found.
    r = pc.replay([(list(range(5)), [5, 6, 7]), (list(range(9)), [])], "hash", 4, 64)
    assert r.hit_tokens == [0, 4]
    r = pc.replay([(list(range(2)), list(range(2, 9))), (list(range(9)), [])], "hash", 4, 64)
    assert r.hit_tokens == [0, 8]


def test_eviction_hash_drops_single_blocks_radix_whole_leaves():
    # Pool of 4 blocks. P1 and P2 (2 blocks each) fill it. P3 = P1 + 1 block: hits P1's
    # 8 tokens, needs 1 block, so 1 idle block of P2 must go. The hash cache drops P2's
    # deepest block only; the radix tree drops P2's whole leaf edge (both blocks). P4 = P2 + 1
    # token then finds 4 tokens in the hash cache and nothing in the radix tree.
    p1, p2 = list(range(1, 9)), list(range(11, 19))
    reqs = [(p1, []), (p2, []), (p1 + [9, 10, 11, 12], []), (p2 + [19], [])]
    assert pc.replay(reqs, "hash", 4, 4).hit_tokens == [0, 0, 8, 4]
    assert pc.replay(reqs, "radix", 4, 4).hit_tokens == [0, 0, 8, 0]


def test_a_request_larger_than_the_pool_is_refused():
    r = pc.replay([(list(range(20)), [])], "hash", 4, 4)    # 5 blocks > 4
    assert r.refused == 1 and r.hit_tokens == [0]


def test_blocks_needed_and_pool_sweep():
    reqs = [(list(range(8)), [1]), (list(range(5)), [])]
    assert pc.blocks_needed(reqs, 4) == 3                     # ceil(9 / 4)
    rows = pc.pool_sweep([(A, []), (A, [])], [3, 64], 4, kinds=("hash",))
    assert [r["pool (blocks)"] for r in rows] == [3, 64]
    assert [r["pool (tokens)"] for r in rows] == [12, 256]
    # 8 of 24 prompt tokens found, even in a pool of exactly one request's 3 blocks.
    assert [r["hit rate"] for r in rows] == [pytest.approx(1 / 3)] * 2


def test_match_rows():
    rows = pc.match_rows({"A": A, "B": B}, 4)
    assert rows[1] == {"prompt": "B", "tokens": 14,
                       "longest prefix shared with an earlier prompt": 10,
                       "hash: tokens reused": 8, "radix: tokens reused": 8}


def test_radix_text():
    tree = {"tokens": 0, "blocks": [], "children": [
        {"tokens": 8, "blocks": [0, 1], "children": [
            {"tokens": 4, "blocks": [2], "children": []}]}]}
    assert pc.radix_text(tree, 4) == ("(root)\n└─ 8 tokens = 2 block(s) [0, 1]\n"
                                      "   └─ 4 tokens = 1 block(s) [2]")
    assert pc.radix_text({"children": []}, 4) == "(empty)"


def _rec(i, ttft, prompt, cached, warmup=False, error=None):
    return RequestRecord(index=i, scheduled=0.0, sent=0.0, first_token=ttft, end=ttft + 1.0,
                         prompt_tokens=prompt, output_tokens=4, cached_tokens=cached,
                         warmup=warmup, error=error)


def test_bench_row_splits_hits_and_misses():
    records = [_rec(0, 9.0, 100, 0, warmup=True),          # ignored
               _rec(1, 0.300, 100, 0), _rec(2, 0.100, 100, 64), _rec(3, 0.120, 100, 64),
               _rec(4, 0.500, 100, None)]     # no usage details: not in the usage hit rate
    summary = {"completed": 4, "errors": 0, "server": {"prefix_cache_hit_rate": 0.5},
               "ttft_ms": {"median": 120.0}, "output_throughput": 7.0, "duration_s": 2.0}
    row = pc.bench_row(SimpleNamespace(summary=summary, records=records), "hash", "wl")
    assert row["hit rate (/metrics)"] == 0.5
    assert row["hit rate (usage)"] == pytest.approx(128 / 300)
    assert row["median TTFT, requests with a hit (ms)"] == pytest.approx(110.0)
    assert row["median TTFT, requests without (ms)"] == pytest.approx(400.0)


def test_sequential_row_uses_the_counters_change():
    before = {P.PREFIX_CACHE_QUERIES: 1000.0, P.PREFIX_CACHE_HITS: 200.0}
    after = {P.PREFIX_CACHE_QUERIES: 1300.0, P.PREFIX_CACHE_HITS: 328.0}
    records = [_rec(0, 0.3, 100, 0), _rec(1, 0.1, 100, 64), _rec(2, 0.1, 100, 64),
               _rec(3, 0.0, 100, 0, error="HTTP 500")]
    row = pc.sequential_row(records, before, after, "vLLM on")
    assert row["hit rate (/metrics)"] == pytest.approx(128 / 300)
    assert row["requests"] == 3 and row["errors"] == 1
    assert row["median TTFT (ms)"] == pytest.approx(100.0)
    # 12 output tokens between the first send (0 s) and the last end (1.3 s)
    assert row["output tok/s"] == pytest.approx(12 / 1.3)


class _Resp:
    def __init__(self, status, body):
        self.status, self.body = status, body

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        return False

    async def json(self, content_type=None):
        if isinstance(self.body, Exception):
            raise self.body
        return self.body


def _scripted(answers):
    """A session whose POSTs answer, per path, from a list of (status, body) in turn."""
    posts = []

    class Session:
        def post(self, url, headers=None):
            posts.append(url.removeprefix("http://x"))
            return _Resp(*answers[posts[-1]].pop(0))
    return Session(), posts


NOT_JSON = ValueError("not JSON")


@pytest.mark.parametrize("status, body, verdict", [
    (200, {"success": True}, "emptied"),
    (200, {"success": False}, "refused"),                   # vLLM with blocks still in use
    (200, {"success": False, "prefix_caching": False}, "no cache"),   # ours, cache off
    (200, None, "emptied"),                                  # 200 without a JSON body
    (400, None, "refused"),                                  # SGLang's /flush_cache, busy
    (404, None, "absent"),
])
def test_reset_verdict_reads_the_servers_answer(status, body, verdict):
    from workshop.bench.run import reset_verdict
    assert reset_verdict(status, body) == verdict


def test_reset_asks_again_after_a_refusal_and_never_counts_one_as_emptied():
    import asyncio

    from workshop.bench.run import reset_prefix_cache
    session, posts = _scripted({"/reset_prefix_cache": [(200, {"success": False})] * 2
                                + [(200, {"success": True})]})
    assert asyncio.run(reset_prefix_cache(session, "http://x", {}, pause_s=0)) == \
        "/reset_prefix_cache"
    assert posts == ["/reset_prefix_cache"] * 3
    session, posts = _scripted({"/reset_prefix_cache": [(200, {"success": False})] * 3})
    assert asyncio.run(reset_prefix_cache(session, "http://x", {}, tries=3, pause_s=0)) is None
    assert len(posts) == 3


def test_reset_falls_back_to_sglangs_flush_and_stops_at_no_cache():
    import asyncio

    from workshop.bench.run import NO_PREFIX_CACHE, reset_prefix_cache
    session, posts = _scripted({"/reset_prefix_cache": [(404, None)] * 2,
                                "/flush_cache": [(400, NOT_JSON), (200, NOT_JSON)]})
    assert asyncio.run(reset_prefix_cache(session, "http://x", {}, pause_s=0)) == "/flush_cache"
    assert posts == ["/reset_prefix_cache", "/flush_cache"] * 2
    session, posts = _scripted({"/reset_prefix_cache": [(200, {"success": False,
                                                                 "prefix_caching": False})]})
    assert asyncio.run(reset_prefix_cache(session, "http://x", {}, pause_s=0)) == \
        NO_PREFIX_CACHE
    assert posts == ["/reset_prefix_cache"]


def test_kinds_figure_draws_no_lookups_as_zero():
    rows = [{"cache": "none", "workload": "w", "hit rate (/metrics)": None},
            {"cache": "hash", "workload": "w", "hit rate (/metrics)": 0.6}]
    fig = pc.kinds_figure(rows, "hit rate (/metrics)", "t", "y")
    heights = [p.get_height() for p in fig.axes[0].patches]
    assert heights == [0.0, 0.6]



@pytest.mark.parametrize("rule", [(False, False, True), (False, False, False)])
def test_cascade_figure_shades_where_the_engine_would_cascade(rule):
    rows = [{"sequences": b, "per sequence (ms/step)": 2.0 * b, "cascade (ms/step)": 1.0 * b,
             "speed-up": 2.0, "engine would cascade": on} for b, on in zip((2, 4, 8), rule)]
    ax = pc.cascade_figure(rows, "t").axes[0]
    lines = {line.get_label(): list(line.get_ydata()) for line in ax.get_lines()}
    assert lines == {"per sequence": [4.0, 8.0, 16.0],
                     "cascade (its speed-up under each point)": [2.0, 4.0, 8.0]}
    shaded = [p.get_x() for p in ax.patches]        # axvspan: a rectangle from its first x
    assert shaded == (pytest.approx([8 / 2 ** 0.5]) if any(rule) else [])

def test_workload_tokens_replies_have_exactly_max_tokens():
    from workshop.bench.workloads import Tokenizer, shared_prefix_workload
    wl = shared_prefix_workload(Tokenizer(), num_requests=6, num_groups=2, system_prompt_len=40,
                                question_len=8, output_len=5)
    toks = pc.workload_tokens(wl)
    assert [len(o) for _, o in toks] == [5] * 6
    # Same group, same system prompt: the prompts share a start.
    by_group = {}
    for s, (p, _) in zip(wl.sessions, toks):
        by_group.setdefault(s.request.tag, []).append(p)
    assert all(g[0][:30] == g[1][:30] for g in by_group.values())


def test_workload_tokens_cuts_and_pads_replies(monkeypatch):
    from workshop.bench import workloads as W
    sent = [W.Sent(W.Request(5, prompt="a b c"), "w1 w2 w3 w4 w5 w6 w7"),
            W.Sent(W.Request(5, prompt="a b d"), "w1 w2")]
    monkeypatch.setattr(W, "plan", lambda wl: sent)
    toks = pc.workload_tokens(W.Workload("fake", [], tokenizer=W.Tokenizer()))
    assert [len(o) for _, o in toks] == [5, 5]
    assert [len(p) for p, _ in toks] == [3, 3]


def test_two_different_hit_rates_never_print_alike():
    # Notebook 8 once printed "different ones (0.753 vs 0.753)".
    a, b = 0.7531, 0.7534
    d = pc.decimals_to_tell_apart(a, b)
    assert f"{a:.{d}f}" != f"{b:.{d}f}" and d == 4
    assert pc.decimals_to_tell_apart(0.5, 0.25) == 3          # already apart at 3
    assert pc.decimals_to_tell_apart(0.753, 0.753) == 3       # equal: nothing to tell apart
    x, y = 0.1234567890123, 0.1234567890124
    d = pc.decimals_to_tell_apart(x, y)
    assert f"{x:.{d}f}" != f"{y:.{d}f}"


def test_cascade_bench_computes_the_same_attention_both_ways_and_times_them():
    import types

    import torch

    cfg = types.SimpleNamespace(num_kv_heads=2, num_heads=4, head_dim=8, num_layers=2)
    bench = pc.CascadeBench.build(cfg, torch.float32, block_size=4, shared=10, own=5, max_batch=3)
    assert (bench.shared, bench.own) == (8, 8)            # whole blocks: 10 down, 5 up
    assert bench.own_blocks.shape == (3, 2) and not set(bench.own_blocks.flatten().tolist()) & {0,
                                                                                                1}
    for written_out in (True, False):
        bench.written_out = written_out
        errors = bench.errors(3)
        assert errors["per sequence"] < 1e-5 and errors["cascade"] < 1e-5
    rows = bench.time_rows([1, 3], use_cascade=lambda b: b > 1)
    assert [(r["sequences"], r["keys read per sequence way"], r["keys read cascade"],
             r["engine would cascade"]) for r in rows] == [(1, 16, 16, False), (3, 48, 32, True)]
    assert all(r["speed-up"] > 0 for r in rows)


def test_pool_sizes():
    reqs = [(list(range(8)), [1]), (list(range(5)), []), (list(range(7)), [])]
    # largest: ceil(9 / 4) = 3; all: 3 + 2 + 2 = 7; multiples of 3 below 7: 3, 3.75, 4.5, 6.
    assert pc.pool_sizes(reqs, 4) == (3, 7, [3, 4, 6, 7])


def test_pool_summary():
    rows = [{"pool (blocks)": p, "cache": k, "hit rate": h} for p, k, h in
            [(4, "hash", 0.1), (4, "radix", 0.05), (8, "hash", 0.5), (8, "radix", 0.5),
             (16, "hash", 0.5), (16, "radix", 0.5)]]
    s = pc.pool_summary(rows)
    assert (s["largest"], s["smallest"], s["enough"], s["radix lower"]) == (16, 4, 8, [4])
    assert s["hash"][4] == 0.1 and s["radix"][4] == 0.05


def test_group_stats():
    wl = SimpleNamespace(sessions=[SimpleNamespace(request=SimpleNamespace(tag=t))
                                   for t in ("g0", "g1", "g0", "g1", "g2")])
    toks = [([1, 2, 3, 4, 9], []), ([5, 6, 7], []), ([1, 2, 3, 8], []), ([5, 6, 0, 0, 0], []),
            ([4, 4], [])]
    s = pc.group_stats(wl, toks)
    # g0 shares 3, g1 shares 2, g2 has one prompt (not counted): the least is 2.
    assert s == {"requests": [0, 1, 2, 3, 4], "groups": 3, "shared tokens": 2,
                 "mean prompt": pytest.approx(19 / 5)}
    first = pc.group_stats(wl, toks, 1)
    assert (first["requests"], first["groups"], first["shared tokens"]) == ([0, 2], 1, 3)
    assert first["mean prompt"] == pytest.approx(4.5)


def test_kinds_summary():
    rows = [{"cache": k, "workload": w, "hit rate (/metrics)": h, "median TTFT (ms)": t}
            for k, w, h, t in [("none", "a", 0.0, 300.0), ("hash", "a", 0.6, 100.0),
                               ("radix", "a", 0.6, 110.0)]]
    s = pc.kinds_summary(rows)
    assert s["hit"] == {("hash", "a"): 0.6, ("radix", "a"): 0.6}
    assert s["gain"] == {"a": pytest.approx(3.0)}


def test_paired_hits():
    on = [_rec(0, 0.5, 100, 0), _rec(1, 0.2, 100, 64), _rec(2, 0.1, 100, 64),
          _rec(3, 0.1, 100, 64)]
    off = [_rec(0, 0.5, 100, 0), _rec(1, 0.4, 100, 0), _rec(2, 0.4, 100, 0),
           _rec(3, 0.4, 100, 64)]            # request 3: the reset was refused
    s = pc.paired_hits({"cache on": on, "cache off": off})
    assert (s["hits"], s["leaked"]) == ([1, 2], 1)
    assert s["off ms"] == pytest.approx(400.0)
    assert s["ratio"] == pytest.approx(0.15 / 0.4)
    none = pc.paired_hits({"cache on": on[:1], "cache off": off[:1]})
    assert none["hits"] == [] and none["ratio"] != none["ratio"]     # nan
