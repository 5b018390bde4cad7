"""Prefix caching: replaying token lists through the engine's caches, and live runs per cache.

Two halves. ``replay`` drives the teaching engine's own ``BlockManager`` and prefix caches
(``mini_engine/prefix_cache.py``) with token lists and no model: which tokens each request
would find cached, under a pool of a given size. It is how the notebook shows the two
designs on small examples and how it sweeps the pool size without a server per size.

The live half runs the benchmark harness (``workshop/bench``) against servers and reduces
each run to one row (hit rate from the server's ``/metrics``, TTFT, throughput);
``sequential_run`` sends requests one at a time, optionally emptying the server's prefix
cache before each one (prefix caching "off" on a server that has it on), and times the
first token without counting the reset.

The figures: hit rate and TTFT per cache kind, TTFT per request, hit rate against the pool
size, and the attention time of a decode step with and without cascade attention.
"""

from __future__ import annotations

import math
import os
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

from reference_server.kv import blocks_for

CACHE_COLORS = {"none": "tab:gray", "hash": "tab:blue", "radix": "tab:green",
                "cache off": "tab:gray", "cache on": "tab:purple"}


# --------------------------------------------------------------------------- replay


@dataclass
class ReplayResult:
    """What a replay saw, per request: prompt tokens and how many were found cached."""

    kind: str
    block_size: int
    num_blocks: int
    prompt_tokens: list[int] = field(default_factory=list)
    hit_tokens: list[int] = field(default_factory=list)
    cached_blocks_after: list[int] = field(default_factory=list)   # blocks the cache holds
    cache: Any = None           # the prefix cache object, for dump() / inspection
    refused: int = 0            # requests that did not fit the pool at all

    @property
    def hit_rate(self) -> float:
        """Hit tokens / prompt tokens, the way vLLM's two counters divide."""
        total = sum(self.prompt_tokens)
        return sum(self.hit_tokens) / total if total else 0.0


def replay(requests: Iterable[tuple[Sequence[int], Sequence[int]]], kind: str, block_size: int,
           num_blocks: int, chunk: int = 512) -> ReplayResult:
    """Send (prompt ids, output ids) pairs one after another through the engine's block manager.

    Each request goes the way the engine's steps take it: look up its prompt in the prefix
    cache, prefill the rest ``chunk`` tokens per step (the engine's token budget per step),
    then decode one token per step; before each step it gets the blocks that step needs
    (evicting idle cached blocks if the pool is short), after each step its newly full blocks
    are offered to the cache, and at the end it frees its references. The last output token's
    KV is never computed, as in the engine. ``kind`` is ``none``, ``hash`` or ``radix``.
    Requests are sequential: nothing else holds blocks meanwhile.
    """
    from mini_engine.block_manager import BlockManager
    from mini_engine.prefix_cache import make_prefix_cache
    from mini_engine.sequence import SamplingParams
    from mini_engine.sequence import Sequence as Seq

    bm = BlockManager(num_blocks, block_size, max_model_len=1 << 30)
    bm.prefix_cache = make_prefix_cache(kind, bm.allocator, block_size)
    out = ReplayResult(kind, block_size, num_blocks, cache=bm.prefix_cache)

    def step(seq, n: int) -> bool:
        if not bm.allocate(seq, seq.num_computed_tokens + n):
            return False
        seq.num_computed_tokens += n
        bm.cache_full_blocks(seq)
        return True

    for prompt, output in requests:
        seq = Seq(list(prompt), SamplingParams(max_tokens=max(len(output), 1)))
        hit = bm.match_prefix(seq)
        ok = True
        while ok and seq.num_computed_tokens < len(prompt):
            ok = step(seq, min(chunk, len(prompt) - seq.num_computed_tokens))
        for j, t in enumerate(output):
            if not ok:
                break
            seq.token_ids.append(t)             # sampled; its KV is computed by the next step
            if j < len(output) - 1:
                ok = step(seq, 1)
        bm.free(seq)
        if not ok:
            out.refused += 1
            hit = 0
        out.prompt_tokens.append(len(prompt))
        out.hit_tokens.append(hit)
        out.cached_blocks_after.append(
            bm.prefix_cache.num_cached_blocks() if bm.prefix_cache is not None else 0)
    return out


def match_rows(prompts: dict[str, Sequence[int]], block_size: int,
               kinds: Sequence[str] = ("hash", "radix")) -> list[dict]:
    """A table: each named prompt, sent in order, and the tokens each cache kind reused."""
    results = {k: replay([(p, []) for p in prompts.values()], k, block_size, 1 << 12)
               for k in kinds}
    rows = []
    seen: list[Sequence[int]] = []
    for i, (name, p) in enumerate(prompts.items()):
        common = max((common_prefix(p, q) for q in seen), default=0)
        row = {"prompt": name, "tokens": len(p),
               "longest prefix shared with an earlier prompt": common}
        for k in kinds:
            row[f"{k}: tokens reused"] = results[k].hit_tokens[i]
        rows.append(row)
        seen.append(p)
    return rows


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading items ``a`` and ``b`` share."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def radix_text(tree: dict, block_size: int, indent: str = "") -> str:
    """A ``RadixPrefixCache.dump()`` as an indented outline, one edge per line."""
    lines = []
    for child in tree.get("children", []):
        lines.append(f"{indent}└─ {child['tokens']} tokens = {child['tokens'] // block_size} "
                     f"block(s) {child['blocks']}")
        sub = radix_text(child, block_size, indent + "   ")
        if sub:
            lines.append(sub)
    return "\n".join(lines) if indent else ("(root)\n" + "\n".join(lines) if lines else "(empty)")


def workload_tokens(workload) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, reply ids) of every request of a workload, as planned without a server.

    The chat template is applied as the server would. Replies are the plan's filler, cut or
    padded to exactly ``max_tokens`` ids: the harness sends ``ignore_eos``, so a server
    generates exactly that many, and in a tight pool one block more or less of reply changes
    what is evicted."""
    from workshop.bench.workloads import Tokenizer, plan

    tok = workload.tokenizer or Tokenizer()
    out = []
    for s in plan(workload):
        n = s.request.max_tokens
        reply = tok.encode(s.reply)[:n]
        out.append((tok.prompt_ids(s.request), reply + [0] * (n - len(reply))))
    return out


def pool_sweep(requests: Sequence[tuple[Sequence[int], Sequence[int]]], pools: Sequence[int],
               block_size: int, kinds: Sequence[str] = ("hash", "radix"),
               chunk: int = 512) -> list[dict]:
    """Replay the same requests for each pool size (in blocks) and cache kind."""
    rows = []
    for n in pools:
        for k in kinds:
            r = replay(requests, k, block_size, n, chunk)
            rows.append({"pool (blocks)": n, "pool (tokens)": n * block_size, "cache": k,
                         "hit rate": r.hit_rate, "requests refused": r.refused,
                         "most blocks cached": max(r.cached_blocks_after, default=0)})
    return rows


def blocks_needed(requests: Sequence[tuple[Sequence[int], Sequence[int]]], block_size: int) -> int:
    """Blocks the largest single request needs: a pool below this cannot serve it at all."""
    return max(blocks_for(len(p) + len(o), block_size) for p, o in requests)


def pool_sizes(requests: Sequence[tuple[Sequence[int], Sequence[int]]], block_size: int,
               factors: Sequence[float] = (1, 1.25, 1.5, 2, 2.5, 3, 4, 6),
               ) -> tuple[int, int, list[int]]:
    """(blocks the largest request needs, blocks all requests need with nothing shared, the
    pool sizes to replay: those multiples of the first that are below the second, and the
    second, where nothing is ever evicted)."""
    least = blocks_needed(requests, block_size)
    total = sum(blocks_for(len(p) + len(o), block_size) for p, o in requests)
    return least, total, sorted({int(least * f) for f in factors if least * f < total} | {total})


def pool_summary(rows: Sequence[dict]) -> dict:
    """A ``pool_sweep``'s hash and radix hit rates by pool size, and what the notebook words:
    the largest and smallest pool, the smallest pool where hash keeps its best hit rate, and
    the pools where radix found less than hash."""
    h = {r["pool (blocks)"]: r["hit rate"] for r in rows if r["cache"] == "hash"}
    x = {r["pool (blocks)"]: r["hit rate"] for r in rows if r["cache"] == "radix"}
    return {"hash": h, "radix": x, "largest": max(h), "smallest": min(h),
            "enough": min(p for p in h if h[p] >= h[max(h)] - 1e-9),
            "radix lower": sorted(p for p in h if p in x and x[p] < h[p] - 1e-9)}


def group_stats(workload, tokens: Sequence[tuple[Sequence[int], Sequence[int]]],
                groups: int | None = None) -> dict:
    """A shared-prefix workload's groups (``request.tag``), from its planned ``tokens``
    (``workload_tokens``), keeping the first ``groups`` of them (all when None): the indices of
    their requests, how many groups, the tokens every prompt of a group shares (the least over
    groups of two or more) and the mean prompt length."""
    tags = list(dict.fromkeys(s.request.tag for s in workload.sessions))[:groups]
    idx = [i for i, s in enumerate(workload.sessions) if s.request.tag in tags]
    by_tag: dict[str, list] = {}
    for i in idx:
        by_tag.setdefault(workload.sessions[i].request.tag, []).append(list(tokens[i][0]))
    return {"requests": idx, "groups": len(tags),
            "shared tokens": min((len(os.path.commonprefix(g)) for g in by_tag.values()
                                  if len(g) > 1), default=0),
            "mean prompt": statistics.mean(len(tokens[i][0]) for i in idx)}


# --------------------------------------------------------------------------- live runs


def bench_row(result, cache: str, workload: str) -> dict:
    """One table row from a ``BenchResult``: hit rate (server counters), TTFT, throughput."""
    s = result.summary
    done = [r for r in result.records if not r.warmup and r.ok]
    hit = [r.ttft * 1e3 for r in done if r.cached_tokens]
    miss = [r.ttft * 1e3 for r in done if not r.cached_tokens]
    return {"cache": cache, "workload": workload, "requests": s["completed"],
            "errors": s["errors"],
            "hit rate (/metrics)": s["server"].get("prefix_cache_hit_rate"),
            "hit rate (usage)": _usage_hit_rate(done),
            "median TTFT (ms)": s["ttft_ms"]["median"],
            "median TTFT, requests with a hit (ms)": statistics.median(hit) if hit else None,
            "median TTFT, requests without (ms)": statistics.median(miss) if miss else None,
            "output tok/s": s["output_throughput"],
            "wall time (s)": s["duration_s"]}


def _usage_hit_rate(records) -> float | None:
    """Cached / prompt tokens from each reply's ``usage`` (independent of ``/metrics``)."""
    recs = [r for r in records if r.cached_tokens is not None]
    total = sum(r.prompt_tokens for r in recs)
    return sum(r.cached_tokens for r in recs) / total if recs and total else None


def run_kinds(sessions: dict[str, Any], workloads: dict[str, dict], concurrency: int = 1,
              progress: Callable[[Iterable], Iterable] = lambda x: x) -> tuple[list[dict], dict]:
    """Each workload (name -> builder arguments) through each server (cache kind -> session).

    Each server answers one short request first (a fresh server's first request is slow),
    then its prefix cache is emptied and the workload runs: the run starts from an empty cache,
    which is what ``replay`` assumes. Returns the table rows and the raw ``BenchResult``s by
    (cache, workload)."""
    from workshop.bench import run_benchmark
    from workshop.bench.workloads import Request

    rows, raw, warm = [], {}, set()
    jobs = [(k, w) for w in workloads for k in sessions]
    for kind, wl in progress(jobs):
        s = sessions[kind]
        if kind not in warm:
            sequential_run(s, [Request(2, prompt="Warm-up: say hello.", tag="warmup")], False)
            warm.add(kind)
        res = run_benchmark(s.base_url, s.model, wl, concurrency=concurrency, api_key=s.api_key,
                            warmup=0, progress=False, environment=False, reset_cache=True,
                            **workloads[wl])
        raw[(kind, wl)] = res
        rows.append(bench_row(res, kind, wl))
    return rows, raw


def sequential_run(session, requests, reset_each: bool) -> list:
    """Send ``requests`` (``workshop.bench`` ``Request``s) one at a time and record each.

    With ``reset_each`` the server's prefix cache is emptied (``POST /reset_prefix_cache``)
    before every request, so no request can reuse another's KV: prefix caching "off" on a
    server that has it on. The reset happens before the clock starts, so TTFT does not
    include it. Either way the cache is emptied once before the first request. vLLM refuses a
    reset while other requests hold blocks (it answers ``{"success": false}``), so a refused
    reset is asked again (``workshop.bench.run.reset_prefix_cache``); a request's
    ``cached_tokens`` tells whether it took effect.
    Returns the harness's ``RequestRecord``s (``ttft``, ``prompt_tokens``, ``cached_tokens``,
    ...)."""
    from workshop.bench.client import OpenAIClient
    from workshop.bench.event_loop import run_sync
    from workshop.bench.request_metrics import RequestRecord
    from workshop.bench.run import reset_prefix_cache

    async def main() -> list:
        t0 = time.perf_counter()
        clock = lambda: time.perf_counter() - t0   # noqa: E731
        records = []
        async with OpenAIClient(session.base_url, session.model, session.api_key) as client:
            for i, req in enumerate(requests):
                if (reset_each or i == 0) and not await reset_prefix_cache(
                        client.session, session.base_url, client.headers):
                    raise RuntimeError(
                        f"the server did not empty its prefix cache before request {i}: it has "
                        "no /reset_prefix_cache, or refused every time (another client's "
                        "requests hold blocks)")
                rec = RequestRecord(index=i, tag=req.tag, scheduled=clock())
                await client.stream(req, rec, clock)
                records.append(rec)
        return records

    return run_sync(main())


def sequential_row(records, before: dict, after: dict, cache: str) -> dict:
    """A table row for a ``sequential_run``, hit rate from the ``/metrics`` counters' change."""
    from workshop.bench.server_metrics import ServerSamples

    server = ServerSamples(before=before, after=after).summary()
    done = [r for r in records if r.ok]
    hit = [r.ttft * 1e3 for r in done if r.cached_tokens]
    miss = [r.ttft * 1e3 for r in done if not r.cached_tokens]
    wall = (max(r.end for r in done) - min(r.sent for r in done)) if done else 0.0
    return {"cache": cache, "requests": len(done), "errors": len(records) - len(done),
            "hit rate (/metrics)": server.get("prefix_cache_hit_rate"),
            "hit rate (usage)": _usage_hit_rate(done),
            "median TTFT (ms)": statistics.median(r.ttft * 1e3 for r in done) if done else None,
            "median TTFT, requests with a hit (ms)": statistics.median(hit) if hit else None,
            "median TTFT, requests without (ms)": statistics.median(miss) if miss else None,
            "output tok/s": sum(r.output_tokens for r in done) / wall if wall > 0 else None}


# --------------------------------------------------------------------------- plots


def kinds_summary(rows: Sequence[dict]) -> dict:
    """From ``run_kinds``'s rows: the hit rate (``/metrics``) per (cache, workload) for hash and
    radix, and per workload the median TTFT without a cache over that with the hash cache."""
    row = {(r["cache"], r["workload"]): r for r in rows}
    works = list(dict.fromkeys(r["workload"] for r in rows))
    return {"hit": {(k, w): row[k, w]["hit rate (/metrics)"] for k in ("hash", "radix")
                    for w in works if (k, w) in row},
            "gain": {w: row["none", w]["median TTFT (ms)"] / row["hash", w]["median TTFT (ms)"]
                     for w in works if ("none", w) in row and ("hash", w) in row}}


def paired_hits(runs: dict[str, Sequence]) -> dict:
    """``sequential_run`` records "cache on" and "cache off" paired request by request: the
    requests that hit with the cache on and found nothing with it off, how many "off" replies
    still reported cached tokens (a reset refused), and over the pairs the median TTFT off
    (ms) and the ratio median on / median off (nan when no pair)."""
    on, off = runs["cache on"], runs["cache off"]
    hits = [i for i, (a, b) in enumerate(zip(on, off))
            if a.ok and b.ok and a.cached_tokens and not b.cached_tokens]
    off_s = statistics.median(off[i].ttft for i in hits) if hits else math.nan
    return {"hits": hits, "leaked": sum(1 for r in off if r.cached_tokens), "off ms": 1e3 * off_s,
            "ratio": statistics.median(on[i].ttft for i in hits) / off_s if hits else math.nan}


def kinds_figure(rows: Sequence[dict], metric: str, title: str, ylabel: str, scale: float = 1.0):
    """Grouped bars: one group per workload, one bar per cache kind."""
    from workshop.plots import figure

    fig, ax = figure(title, "workload", ylabel)
    workloads = list(dict.fromkeys(r["workload"] for r in rows))
    kinds = list(dict.fromkeys(r["cache"] for r in rows))
    width = 0.8 / max(len(kinds), 1)
    for j, k in enumerate(kinds):
        xs, ys = [], []
        for i, w in enumerate(workloads):
            row = next((r for r in rows if r["cache"] == k and r["workload"] == w), None)
            if row is not None:
                xs.append(i + (j - (len(kinds) - 1) / 2) * width)
                # None: the server looked nothing up (no cache), which is a hit rate of 0.
                ys.append((row[metric] or 0.0) * scale)
        bars = ax.bar(xs, ys, width, label=k, color=CACHE_COLORS.get(k))
        ax.bar_label(bars, fmt="%.0f" if scale == 1.0 and max(ys, default=0) > 10 else "%.2f",
                     fontsize=8)
    ax.set_xticks(range(len(workloads)), workloads)
    ax.legend(title="prefix cache")
    return fig


def per_request_figure(runs: dict[str, Sequence], title: str):
    """TTFT of each request in send order, one line per run; filled markers = cache hit."""
    from matplotlib.ticker import MaxNLocator

    from workshop.plots import figure

    fig, ax = figure(title, "request (in send order)", "TTFT (ms)")
    for label, records in runs.items():
        pts = [(i + 1, r.ttft * 1e3, bool(r.cached_tokens)) for i, r in enumerate(records) if r.ok]
        color = CACHE_COLORS.get(label)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], color=color, alpha=0.6, label=label)
        hits = [p for p in pts if p[2]]
        misses = [p for p in pts if not p[2]]
        ax.scatter([p[0] for p in misses], [p[1] for p in misses], s=40, facecolors="white",
                   edgecolors=color, zorder=3)
        ax.scatter([p[0] for p in hits], [p[1] for p in hits], s=40, color=color, zorder=3)
    ax.scatter([], [], s=40, facecolors="white", edgecolors="black", label="no cached tokens")
    ax.scatter([], [], s=40, color="black", label="prefix found in the cache")
    ax.set_ylim(bottom=0)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))   # requests are counted: no 1.5th
    ax.legend()
    return fig


def pool_figure(rows: Sequence[dict], live: Sequence[dict] = (), min_blocks: int | None = None):
    """Hit rate vs pool size: replay curves per cache kind, live measurements as points."""
    from workshop.plots import figure

    fig, ax = figure("Prefix-cache hit rate as the KV pool shrinks", "KV pool (blocks)",
                     "hit rate (cached / prompt tokens)")
    for k in dict.fromkeys(r["cache"] for r in rows):
        pts = sorted((r["pool (blocks)"], r["hit rate"]) for r in rows if r["cache"] == k)
        ax.plot([p for p, _ in pts], [h for _, h in pts], marker="o", ms=4,
                label=f"{k} (replay, no model)", color=CACHE_COLORS.get(k))
    if live:
        ax.scatter([r["pool (blocks)"] for r in live], [r["hit rate"] for r in live], s=90,
                   marker="*", color="black", zorder=3, label="hash, live server (/metrics)")
    if min_blocks:
        ax.axvline(min_blocks, color="tab:red", ls=":", label="largest request's blocks")
    ax.set_ylim(bottom=0)
    ax.legend()
    return fig


def cascade_figure(rows: Sequence[dict], title: str):
    """Per-sequence vs cascade attention time per step against the batch size; the batch
    sizes where the engine's rule would cascade are shaded."""
    from workshop.plots import figure

    fig, ax = figure(title, "sequences decoding together", "attention, ms per step")
    xs = [r["sequences"] for r in rows]
    for key, label, color in (("per sequence (ms/step)", "per sequence", "tab:gray"),
                              ("cascade (ms/step)", "cascade (its speed-up under each point)",
                               "tab:green")):
        ax.plot(xs, [r[key] for r in rows], marker="o", color=color, label=label)
    for r in rows:
        ax.annotate(f"{r['speed-up']:.2f}x", (r["sequences"], r["cascade (ms/step)"]),
                    textcoords="offset points", xytext=(0, -14), ha="center", fontsize=8,
                    color="tab:green")
    half = 2 ** 0.5          # half a doubling either side of a point, on the log axis
    cascading = [r["sequences"] for r in rows if r["engine would cascade"]]
    if cascading:
        ax.axvspan(min(cascading) / half, max(xs) * half, color="tab:green", alpha=0.08,
                   label="the engine's rule would cascade")
    ax.set_xscale("log", base=2)
    ax.set_xlim(min(xs) / half, max(xs) * half)
    ax.set_xticks(xs, [str(x) for x in xs])       # batch sizes are counted: ticks at each
    ax.set_ylim(bottom=0)
    ax.legend()
    return fig


# --------------------------------------------------------------------------- cascade attention


@dataclass
class CascadeBench:
    """One decode step's attention over every layer of a KV pool shaped like a model's, read
    through block tables as the teaching engine reads it (``KVCache.read_blocks``): each of up
    to ``max_batch`` sequences has ``shared`` keys in the same blocks (0, 1, ...) and ``own``
    keys of its own in blocks scattered over the rest of the pool. ``build`` fills the pool."""

    pool: Any                   # mini_engine.kv_cache.KVCache
    shared_blocks: Any          # [P / block_size] block ids
    own_blocks: Any             # [max_batch, own / block_size] block ids
    kv_heads: int
    q_per_kv: int               # query heads per KV head
    head_dim: int
    num_layers: int
    block_size: int
    shared: int                 # P, whole blocks
    own: int                    # each sequence's own keys, whole blocks
    written_out: bool = True    # eager_attention (two matmuls, float32 softmax) or SDPA

    @classmethod
    def build(cls, cfg: Any, dtype: Any, block_size: int, shared: int, own: int,
              max_batch: int, seed: int = 0) -> "CascadeBench":
        import torch

        from mini_engine.kv_cache import KVCache, KVLayout

        torch.manual_seed(seed)
        P = max(shared // block_size, 1) * block_size
        own = -(-own // block_size) * block_size
        shared_n, own_n = P // block_size, own // block_size
        pool = KVCache(KVLayout(((cfg.num_kv_heads, None, cfg.head_dim),) * 2), cfg.num_layers,
                       shared_n + max_batch * own_n + 8, block_size, dtype)
        for layer in pool.layers:
            for t in layer:
                t.normal_()     # real values, and every page of the pool touched once
        rest = shared_n + torch.randperm(pool.num_blocks - shared_n)
        return cls(pool, torch.arange(shared_n), rest[:max_batch * own_n].view(max_batch, own_n),
                   cfg.num_kv_heads, cfg.num_heads // cfg.num_kv_heads, cfg.head_dim,
                   cfg.num_layers, block_size, P, own)

    def queries(self, B: int) -> Any:
        """One decode query per sequence, as the engine lays them out:
        ``[kv_heads, B, query heads per KV head, head_dim]``."""
        import torch

        return torch.randn(self.kv_heads, B, self.q_per_kv,
                           self.head_dim).to(self.pool.layers[0][0].dtype)

    def per_sequence(self, layer: int, q: Any, B: int) -> Any:
        """Every sequence reads its whole context (shared blocks, then its own) from the pool."""
        import torch
        import torch.nn.functional as F

        from mini_engine.model import eager_attention

        blocks = torch.cat((self.shared_blocks.expand(B, -1), self.own_blocks[:B]), 1)
        k, v = (t.view(self.kv_heads, B, -1, self.head_dim)
                for t in self.pool.read_blocks(layer, blocks.reshape(-1)))
        mask = torch.ones(1, B, 1, k.shape[2], dtype=torch.bool)   # a decode query sees all keys
        if self.written_out:
            return eager_attention(q, k, v, mask)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

    def cascade(self, layer: int, q: Any, B: int) -> Any:
        """The shared blocks read once for the batch, then each sequence's own blocks."""
        import torch

        from mini_engine.model import cascade_attention

        ks, vs = (t.view(self.kv_heads, 1, self.shared, -1)
                  for t in self.pool.read_blocks(layer, self.shared_blocks))
        k, v = (t.view(self.kv_heads, B, self.own, -1)
                for t in self.pool.read_blocks(layer, self.own_blocks[:B].reshape(-1)))
        mask = torch.ones(1, B, 1, self.own, dtype=torch.bool)
        return cascade_attention(q, ks, vs, k, v, mask, self.written_out)

    def reference(self, layer: int, q: Any, B: int) -> Any:
        """float32 SDPA per sequence over its context, its slots computed from the block ids
        and picked out of the pool with plain indexing: shares nothing with the two above."""
        import torch
        import torch.nn.functional as F

        k_pool, v_pool = self.pool.layers[layer]
        out = []
        for b in range(B):
            blocks = torch.cat((self.shared_blocks, self.own_blocks[b]))
            slots = (blocks[:, None] * self.block_size + torch.arange(self.block_size)).reshape(-1)
            out.append(F.scaled_dot_product_attention(q[:, b:b + 1].float(),
                                                      k_pool[:, slots][:, None].float(),
                                                      v_pool[:, slots][:, None].float()))
        return torch.cat(out, 1)

    def errors(self, B: int) -> dict[str, float]:
        """Largest difference of each way from ``reference`` on layer 0, one batch of ``B``."""
        q = self.queries(B)
        ref = self.reference(0, q, B)
        return {name: (fn(0, q, B).float() - ref).abs().max().item()
                for name, fn in (("per sequence", self.per_sequence), ("cascade", self.cascade))}

    def time_rows(self, batches: Sequence[int], use_cascade: Callable[[int], bool],
                  progress: Callable = lambda xs, **_: xs) -> list[dict]:
        """Per batch size: keys each way reads per layer, the best time of a whole step (every
        layer, each output dropped as the engine drops it) each way, the ways taken in turn
        three times so that a slow moment hits both, and whether ``use_cascade(B)``."""
        from workshop.timing import best_time_s

        rows = []
        for B in progress(list(batches), title="batch sizes"):
            qs = [self.queries(B) for _ in range(self.num_layers)]
            t = {"per sequence": float("inf"), "cascade": float("inf")}
            for _ in range(3):
                for name, fn in (("per sequence", self.per_sequence), ("cascade", self.cascade)):
                    def step(fn=fn):
                        for i, q in enumerate(qs):
                            fn(i, q, B)
                    t[name] = min(t[name], 1e3 * best_time_s(step, repeats=3))
            rows.append({"sequences": B, "keys read per sequence way": B * (self.shared + self.own),
                         "keys read cascade": self.shared + B * self.own,
                         "per sequence (ms/step)": t["per sequence"],
                         "cascade (ms/step)": t["cascade"],
                         "speed-up": t["per sequence"] / t["cascade"],
                         "engine would cascade": use_cascade(B)})
        return rows


def decimals_to_tell_apart(a: float, b: float, at_least: int = 3, at_most: int = 15) -> int:
    """Decimals that show ``a`` and ``b`` as different numbers when they differ (``at_least``
    when they are equal or already differ there): two different hit rates must not print alike."""
    for d in range(at_least, at_most + 1):
        if a == b or f"{a:.{d}f}" != f"{b:.{d}f}":
            return d
    return at_most


__all__ = ["ReplayResult", "replay", "match_rows", "radix_text", "workload_tokens", "pool_sweep",
           "blocks_needed", "bench_row", "run_kinds", "sequential_run", "sequential_row",
           "kinds_figure", "per_request_figure", "pool_figure", "cascade_figure", "CACHE_COLORS",
           "common_prefix", "decimals_to_tell_apart", "CascadeBench", "pool_sizes",
           "pool_summary", "group_stats", "kinds_summary", "paired_hits"]
