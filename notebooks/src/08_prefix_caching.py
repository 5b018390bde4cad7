# %% [markdown]
# # 8 · Prefix caching: reusing the KV of prompts you have seen before
#
# [![Open in Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/{{github_repo}}/blob/main/notebooks/08_prefix_caching.ipynb)
# [![Open in molab](https://marimo.io/molab-shield.svg)](https://molab.marimo.io/github/{{github_repo}}/blob/main/notebooks/08_prefix_caching.py)
#
# Many requests start the same way: a system prompt, an agent's tool schemas, a conversation
# resent at every turn. Those tokens' keys and values depend only on the tokens before them, so
# an engine that kept them from an earlier request can skip that prefill: **prefix caching**.
#
# | § | what | seen in |
# |---|---|---|
# | 1 | two designs: **hash-chained blocks** (vLLM) and a **radix tree** (SGLang) | `mini_engine/prefix_cache.py` on small token lists |
# | 2 | hit rate, time to first token (TTFT) and throughput, no cache vs hash vs radix | three teaching-engine servers, two workloads |
# | 3 | eviction: the hit rate as the KV pool shrinks | a replay of the engine's cache |
# | 4 | what a hit does *not* save: decode re-reads the shared keys; **cascade attention** | one decode step, timed |
# | 5 | the course server's own cache, on and "off" (emptied before every request) | vLLM unless `WORKSHOP_ENGINE` says otherwise |

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
# ## 1. Two ways to find a prefix you have seen
#
# Both work on notebook 7's paged KV cache: reusing a prefix means pointing a new request's
# block table at blocks an earlier request filled, and taking a reference on them.
#
# **Hash-chained blocks (vLLM).** A full block is named by a hash of *its parent's hash* and
# *its own tokens*, so equal hashes mean equal prefixes; a lookup walks the prompt's blocks
# through a dictionary to the first miss. **A radix tree (SGLang,**
# [arXiv:2312.07104](https://arxiv.org/abs/2312.07104)**)**: edges are runs of tokens, shared
# starts share the path from the root, an edge splits where prompts part. The teaching engine's
# tree compares **whole blocks** (a block is shared whole or not at all). Both, as it has them:

# %%
import inspect

from mini_engine.prefix_cache import HashPrefixCache, RadixPrefixCache
from workshop import ui
from workshop.engine_lab import prefix_caching

ui.md("```python\n" + "\n".join(inspect.getsource(_f) for _f in (
    HashPrefixCache._hashes, HashPrefixCache.match, RadixPrefixCache._common_blocks,
    RadixPrefixCache._walk)) + "```")

# %% [markdown]
# No model needed: `prefix_caching.replay` sends token lists through the engine's own block
# manager and cache, one request after another. **B** shares its first 10 tokens with **A**.
# Pick a block size (in Jupyter, re-run the cells below after moving it).

# %%
demo_block = ui.slider(2, 8, 4, 1, "block size (tokens) for the token-list demo")
demo_block

# %%
demo_prompts = {
    "A": list(range(100, 112)),                                   # 12 tokens
    "B = A[:10] + 4 new": list(range(100, 110)) + [7, 8, 9, 10],  # shares 10 with A
    "C = A + 4 new": list(range(100, 112)) + [1, 2, 3, 4],        # A is its prefix
    "D = A[:8] + 5 new": list(range(100, 108)) + [50, 51, 52, 53, 54],
}
ui.md(f"Block size **{demo_block.value}**; the prompts' lengths: "
      + ", ".join(f"{_k.split(' ')[0]} {len(_v)}" for _k, _v in demo_prompts.items()) + " tokens.")

# %% [markdown]
# **Exercise 1 (predict, then compute).** With this block size, how many of B's tokens will the
# **radix** cache find, after A has been served?

# %%
predict_radix_tokens = None   # your prediction: tokens of B found in the radix cache

# %%
demo_rows = prefix_caching.match_rows(demo_prompts, demo_block.value)
ui.compare(predict_radix_tokens, demo_rows[1]["radix: tokens reused"],
           "tokens of B the radix cache reused", "tokens", how="computed")

# %%
# Worked answer to Exercise 1, collapsed until opened
_b, _bs = demo_rows[1], demo_block.value
ui.worked_answer(
    f"The teaching engine's tree compares whole blocks of {_bs}. B shares 10 tokens with A: "
    f"⌊10 / {_bs}⌋ = {10 // _bs} full block(s), **{10 // _bs * _bs} tokens**"
    + (f"; the {10 % _bs} shared token(s) in the next block are recomputed, because that block "
       "also holds tokens A does not have." if 10 % _bs else ", nothing lost to rounding.")
    + f" Computed: radix **{_b['radix: tokens reused']}**, hash {_b['hash: tokens reused']}"
    + (": at block granularity both find the same prefix." if _b["radix: tokens reused"]
       == _b["hash: tokens reused"] else ".")
    + " SGLang's tree, with a page of one token, would find all 10.")

# %% [markdown]
# Every prompt through both caches, and the radix tree after the four (an edge per line: a
# shared start is stored once). Neither cache hands out the block holding a prompt's last token
# (C's, on a boundary): the engine must compute one token to get the next token's logits.

# %%
demo_tree = prefix_caching.replay([(p, []) for p in demo_prompts.values()], "radix",
                                  demo_block.value, 64).cache
ui.md(ui.markdown_table(demo_rows) + "\n\n```text\n"
      + prefix_caching.radix_text(demo_tree.dump(), demo_block.value) + "\n```")

# %% [markdown]
# They also differ in **eviction**. The hash cache drops any block no running request holds,
# least recently used (deepest) first, like vLLM's free-block queue; the radix tree drops whole
# **leaf edges**, so a shared start outlives its tails. Section 3 measures the effect.
#
# ## 2. The teaching engine: no cache, hash, radix
#
# Three teaching-engine servers, identical but for the prefix cache (`--no-prefix-caching`,
# `-- --prefix-cache hash`, `-- --prefix-cache radix`), run two harness workloads
# (`workshop/bench/workloads.py`), one session at a time:
#
# * **shared prefix**: a few groups, each sharing a long system prompt before a short question
#   of its own (like SGLang's generated-shared-prefix benchmark);
# * **agentic**: an agent resends its whole history each turn, forks sub-agents that inherit it
#   (they send at the same moment, so timing plays a part), then merges their reports.
#
# In Jupyter, re-run from the cell that starts the servers after moving a control.

# %%
prefix_len = ui.slider(64, 1536, workshop.session.sweep(512, 128), 64,
                       "shared system prompt (tokens)")
prefix_len

# %%
prefix_groups = ui.slider(1, 8, workshop.session.sweep(4, 2), 1,
                          "groups (distinct system prompts)")
prefix_groups

# %%
agent_branches = ui.slider(1, 6, workshop.session.sweep(2, 1), 1,
                           "sub-agents forked by the agent (branches)")
agent_branches

# %%
from workshop.bench.workloads import Tokenizer, shared_prefix_workload

cache_flags = {"none": ["--no-prefix-caching"], "hash": ["--", "--prefix-cache", "hash"],
               "radix": ["--", "--prefix-cache", "radix"]}
mini = workshop.session.start_many("mini", {_k: ["--kv-cache-gib", "0.25", *_v]
                                            for _k, _v in cache_flags.items()})
mini_info = mini["hash"].info
print("\n\n".join(f"[{k}] {s.describe()}" for k, s in mini.items()))

mini_tok = Tokenizer.load(mini_info["model"], mini_info.get("model_path"))
shared_args = dict(num_requests=workshop.session.sweep(16, 4), num_groups=prefix_groups.value,
                   system_prompt_len=prefix_len.value, question_len=workshop.session.sweep(32, 16),
                   output_len=workshop.session.sweep(16, 4))
# Quick mode (CI, 2 slow cores) keeps one of the agent's five tool schemas: its system prompt
# is then about 220 tokens instead of 630, and a request without a cache costs about half.
agent_args = dict(num_sessions=1, system_prompt_len=prefix_len.value,
                  num_tools=workshop.session.sweep(None, 1), main_turns=workshop.session.sweep(3, 1),
                  fork_at=(0,), branches=agent_branches.value,
                  branch_turns=workshop.session.sweep(1, 0),
                  turn_output=workshop.session.sweep((16, 32), (4, 8)),
                  tool_result_len=(20, 40), summary_output=workshop.session.sweep(24, 4),
                  final_output=workshop.session.sweep(24, 4))
shared_wl = shared_prefix_workload(mini_tok, **shared_args)
shared_tokens = prefix_caching.workload_tokens(shared_wl)
# Tokens every prompt of a group shares (chat template + system prompt + the user turn's start).
shared_stats = prefix_caching.group_stats(shared_wl, shared_tokens)
shared_prefix_tokens, mean_prompt_tokens = shared_stats["shared tokens"], shared_stats["mean prompt"]
ui.md(f"The shared-prefix workload: {shared_args['num_requests']} requests in "
      f"{shared_stats['groups']} groups; a prompt has **{mean_prompt_tokens:.0f} tokens** on "
      f"average (chat template applied), the first **{shared_prefix_tokens}** the same across its "
      f"group; the engine's block size is **{mini_info['block_size']} tokens**.")

# %% [markdown]
# **Exercise 2 (predict, then measure).** What hit rate (cached prompt tokens / all prompt
# tokens) will the **hash** cache report for the shared-prefix workload? Hint: the first
# request of each group finds nothing; every later one finds the shared tokens, rounded
# *down* to whole blocks.

# %%
predict_hit_rate = None   # your prediction, a fraction between 0 and 1

# %%
kinds_rows, kinds_raw = prefix_caching.run_kinds(
    mini, {"shared-prefix": shared_args, "agentic": agent_args},
    progress=lambda jobs: ui.progress(jobs, title="workload x cache"))
measured_hit_rate = next(r["hit rate (/metrics)"] for r in kinds_rows
                         if r["cache"] == "hash" and r["workload"] == "shared-prefix")
ui.compare(predict_hit_rate, measured_hit_rate, "hash-cache hit rate, shared-prefix workload")

# %%
# Worked answer to Exercise 2, collapsed until opened
_n, _g, _bs = shared_args["num_requests"], shared_stats["groups"], mini_info["block_size"]
_reused = shared_prefix_tokens // _bs * _bs
formula_hit_rate = (_n - _g) * _reused / (_n * mean_prompt_tokens)
ui.worked_answer(
    f"{_n - _g} of the {_n} requests (all but each group's first) find their group's "
    f"{shared_prefix_tokens} shared tokens, rounded down to blocks of {_bs}: {_reused} tokens. "
    f"Over all prompt tokens:\n\n"
    f"(requests − groups) × ⌊shared / block⌋ × block / (requests × mean prompt) = "
    f"({_n} − {_g}) × {_reused} / ({_n} × {mean_prompt_tokens:.0f}) = **{formula_hit_rate:.3f}**"
    f"\n\nMeasured, the hash server's counters (`vllm:prefix_cache_hits_total` / "
    f"`vllm:prefix_cache_queries_total`, differenced over the run): **{measured_hit_rate:.3f}**"
    + (", the formula to three decimals." if abs(measured_hit_rate - formula_hit_rate) < 5e-4 else
       f", {measured_hit_rate - formula_hit_rate:+.3f} from the formula, which takes every "
       "group's shared start to be the shortest group's and each group's first request to come "
       "first."))

# %%
ui.table(kinds_rows)

# %%
prefix_caching.kinds_figure(kinds_rows, "hit rate (/metrics)",
                            "Prefix-cache hit rate per cache kind (teaching engine)",
                            "hit rate (cached / prompt tokens)")

# %%
prefix_caching.kinds_figure(kinds_rows, "median TTFT (ms)",
                            "Time to first token per cache kind (teaching engine)",
                            "median TTFT (ms)")

# %%
_hit, _gain = (prefix_caching.kinds_summary(kinds_rows)[_k] for _k in ("hit", "gain"))
kinds_same_tokens = _hit["hash", "shared-prefix"] == _hit["radix", "shared-prefix"]
_d = prefix_caching.decimals_to_tell_apart(_hit["hash", "agentic"], _hit["radix", "agentic"])
ui.md(f"**Median TTFT without a cache / with the hash cache: {_gain['shared-prefix']:.2f}x on the "
      f"shared-prefix workload, {_gain['agentic']:.2f}x on the agentic one.** Hash and radix "
      f"found {'the same' if kinds_same_tokens else 'different'} shares of the shared-prefix "
      f"prompts ({_hit['hash', 'shared-prefix']:.3f} and {_hit['radix', 'shared-prefix']:.3f}) "
      f"and {_hit['hash', 'agentic']:.{_d}f} and {_hit['radix', 'agentic']:.{_d}f} of the "
      f"agentic ones, whose prompts carry each server's own replies. The table splits requests "
      f"with a hit from those without, the cleaner comparison within one server.")

# %%
_used = (kinds_rows, kinds_same_tokens)   # marimo: after the cells that use the three servers
for _s in mini.values():   # section 3 replays without them
    _s.stop()

# %% [markdown]
# ## 3. Eviction: when the pool is too small to keep everything
#
# Cached blocks no request holds count as free: a request that needs blocks takes some back,
# and a later one recomputes them, so the hit rate depends on the **pool size**. The curve
# replays the shared-prefix token lists through the engine's block manager and both caches,
# step by step like the engine; below the largest request's size (red line) none can run.

# %%
pool_min_blocks, _all_blocks, pool_sizes = prefix_caching.pool_sizes(shared_tokens,
                                                                      mini_info["block_size"])
pool_chunk = int(mini_info.get("extra", {}).get("max_num_batched_tokens") or 512)
pool_rows = prefix_caching.pool_sweep(shared_tokens, pool_sizes, mini_info["block_size"],
                                      chunk=pool_chunk)
replay_big_hit = prefix_caching.pool_summary(pool_rows)["hash"][_all_blocks]
# At the largest pool nothing is evicted: the replay must count what the live server counted.
ui.md(f"The largest request needs **{pool_min_blocks} blocks**; all of them together, nothing "
      f"shared, {_all_blocks}. Pools replayed: {pool_sizes} blocks. At {_all_blocks} the replay "
      f"finds **{replay_big_hit:.4f}** of the prompt tokens, the live hash server counted "
      f"**{measured_hit_rate:.4f}**"
      + (": the same requests in the same order, the same hits." if abs(
          replay_big_hit - measured_hit_rate) < 1e-6 else ": the replay misses something the "
         "engine does; the curve is an approximation."))

# %% [markdown]
# A live check: a teaching-engine server with a small pool (`-- --num-blocks N`, default 1.5 x
# the largest request) runs the same workload (a server start: quick mode skips it).

# %%
live_pool = ui.slider(0, 256, 0, 1, "live small pool (blocks; 0 = 1.5 x the largest request)")
live_pool

# %%
pool_live_rows = []
if not workshop.session.quick():
    _blocks = max(live_pool.value or int(1.5 * pool_min_blocks), pool_min_blocks)
    with workshop.session.start("mini", ["--", "--prefix-cache", "hash", "--num-blocks",
                                         str(_blocks)], verbose=False) as _small:
        _rows, _ = prefix_caching.run_kinds({"hash": _small}, {"shared-prefix": shared_args})
    pool_live_rows = [{"pool (blocks)": _blocks, "hit rate": _rows[0]["hit rate (/metrics)"],
                       "median TTFT (ms)": _rows[0]["median TTFT (ms)"],
                       "replay hit rate": prefix_caching.pool_sweep(
                           shared_tokens, [_blocks], mini_info["block_size"], kinds=("hash",),
                           chunk=pool_chunk)[0]["hit rate"]}]
ui.table(pool_live_rows) if pool_live_rows else ui.md(
    "Quick mode: no live small-pool server (the replay curve below is computed, not measured).")

# %%
prefix_caching.pool_figure(pool_rows, pool_live_rows, pool_min_blocks)

# %%
ui.table(pool_rows)

# %%
_s = prefix_caching.pool_summary(pool_rows)
_h, _r, _lo, _big, _small = (_s[k] for k in ("hash", "radix", "radix lower", "largest", "smallest"))
ui.md(
    f"**The hash cache found {_h[_big]:.1%} of the prompt tokens with {_big} blocks, needed "
    f"{_s['enough']} blocks to keep all of it, and found {_h[_small]:.1%} with {_small}.** "
    + (f"The radix cache found less at {len(_lo)} of the pool sizes (at {_lo[0]} blocks: "
       f"{_r[_lo[0]]:.1%} against {_h[_lo[0]]:.1%}): a group's first request leaves one leaf edge "
       "holding the system prompt *and* its own question and reply, and until a second request "
       "splits it, evicting the leaf evicts the system prompt too. The hash cache gives back "
       "only the blocks it must, deepest first. "
       if _lo else "The radix cache found as much as the hash cache at every size. ")
    + (f"The live small-pool server found {pool_live_rows[0]['hit rate']:.2%}, the replay "
       f"{pool_live_rows[0]['replay hit rate']:.2%}." if pool_live_rows else ""))

# %% [markdown]
# ## 4. After the hit: reading a shared prefix once (cascade attention)
#
# A hit saves the shared prompt's *prefill*, once. Every *decode* step after it still reads the
# shared keys and values once **per sequence**: eight agents on one system prompt read it 8 times.
#
# **Cascade attention** reads them once: the batch's queries meet the `P` shared keys in *one*
# matmul, each sequence's queries its own keys in a second, and one softmax over both is
# attention over the whole context. SDPA cannot share a softmax between two calls, but it
# returns each query's **log-sum-exp**, and two partial results weighted by their share of the
# denominator make the whole (FlashAttention's online-softmax rescaling, notebook 6):

# %%
from mini_engine import model as mini_model

ui.md("```python\n" + inspect.getsource(mini_model.cascade_attention) + "\n\n"
      + inspect.getsource(mini_model.merge_attention) + "```")

# %% [markdown]
# Below, one decode step's attention over all layers, both ways, from a KV pool shaped like the
# served model's, read through block tables (`KVCache.read_blocks`): **per sequence** reads each
# whole context, **cascade** the shared blocks once, then each sequence's own. The form:
# **written out** (`eager_attention`) or **SDPA** (two calls merged), starting at the engine's
# pick (`use_eager`); in Jupyter, re-run the cells below after moving a control.

# %%
cascade_shared = ui.slider(64, 2048, workshop.session.sweep(640, 256), 64, "shared prefix (keys)")
cascade_shared

# %%
cascade_own = ui.slider(16, 1024, workshop.session.sweep(256, 64), 16, "each sequence's own keys")
cascade_own

# %%
cascade_seqs = ui.slider(2, 32, 8, 1, "sequences decoding together")
cascade_seqs

# %%
import torch

from mini_engine.config import DTYPES
from mini_engine.loader import ModelConfig

cascade_cfg = ModelConfig.from_hf(mini_info["model_path"])
cascade_dtype = DTYPES.get(str(mini_info.get("dtype")), torch.float32)
# The batch sizes timed: doubling up to the slider's, which is always one of them.
cascade_batches = sorted({b for b in (2, 4, 8, 16, 32) if b < cascade_seqs.value}
                         | {int(cascade_seqs.value)})
cascade = prefix_caching.CascadeBench.build(cascade_cfg, cascade_dtype, mini_info["block_size"],
                                            cascade_shared.value, cascade_own.value,
                                            max(cascade_batches))
cascade_P, cascade_own_len = cascade.shared, cascade.own       # rounded to whole blocks
cascade_form = ui.dropdown(
    ["written out", "SDPA"],
    "written out" if mini_model.use_eager("auto", cascade_dtype, int(cascade_seqs.value),
                                          cascade_P + cascade_own_len) else "SDPA",
    "attention form")
cascade_form

# %%
cascade_written_out = cascade_form.value == "written out"
cascade.written_out = cascade_written_out
# Both against float32 SDPA per sequence, its keys picked out slot by slot: both ways round in
# the pool's dtype, so cascade may differ from it by about as much as per sequence, not more.
cascade_errors = cascade.errors(int(cascade_seqs.value))
cascade_agrees = cascade_errors["cascade"] <= 2 * cascade_errors["per sequence"] + 1e-5
ui.md("```python\n" + inspect.getsource(prefix_caching.CascadeBench.per_sequence)
      + inspect.getsource(prefix_caching.CascadeBench.cascade) + "```\n\n"
      f"Model: {cascade_cfg.num_layers} layers, {cascade_cfg.num_heads} query heads sharing "
      f"{cascade.kv_heads} KV heads of {cascade.head_dim}, "
      f"`{str(cascade_dtype).removeprefix('torch.')}`, blocks of {cascade.block_size}; each "
      f"sequence **{cascade_P} shared + {cascade_own_len} own keys**. Largest difference from "
      f"the float32 reference at {cascade_seqs.value} sequences, layer 0: per sequence "
      f"{cascade_errors['per sequence']:.2e}, cascade {cascade_errors['cascade']:.2e}"
      + (": the same attention, to the dtype's rounding." if cascade_agrees else
         ": **cascade is further off than the dtype's rounding explains: a bug**."))

# %% [markdown]
# **Exercise 3 (predict, then measure).** At the slider's batch, how many times faster will
# the cascade step be than the per-sequence step? Count the keys each way reads: per sequence
# `B x (P + own)`, cascade `P + B x own`. Is the time all reading?

# %%
predict_cascade_speedup = None   # your prediction: per-sequence time / cascade time

# %%
cascade.written_out = cascade_written_out     # the form picked above (marimo re-runs this)
cascade_rows = cascade.time_rows(cascade_batches,
                                 lambda b: mini_model.use_cascade(True, b, cascade_P),
                                 progress=ui.progress)
cascade_speedup = next(r["speed-up"] for r in cascade_rows if r["sequences"] == cascade_seqs.value)
ui.compare(predict_cascade_speedup, cascade_speedup,
           f"cascade speed-up at {cascade_seqs.value} sequences", "x")

# %%
# Worked answer to Exercise 3, collapsed until opened
_at = next(r for r in cascade_rows if r["sequences"] == cascade_seqs.value)
_one = cascade_rows[0]
_keys_ratio, _one_ratio = (_r["keys read per sequence way"] / _r["keys read cascade"]
                           for _r in (_at, _one))
ui.worked_answer(
    f"Per sequence, {_at['sequences']} sequences read {_at['sequences']} x ({cascade_P} + "
    f"{cascade_own_len}) = {_at['keys read per sequence way']:,} keys (and as many values) per "
    f"layer; cascade reads {cascade_P} + {_at['sequences']} x {cascade_own_len} = "
    f"{_at['keys read cascade']:,}. If the step were all reading, cascade would be "
    f"**{_keys_ratio:.2f}x** as fast. Measured: **{cascade_speedup:.2f}x**. What the key count "
    f"leaves out costs the same both ways: a query still scores all {cascade_P + cascade_own_len} "
    f"keys and takes one softmax over them, and cascade adds a merge. At "
    f"{_one['sequences']} sequences the count says {_one_ratio:.2f}x and the step ran "
    f"{_one['speed-up']:.2f}x.")

# %%
ui.table(cascade_rows)

# %%
prefix_caching.cascade_figure(
    cascade_rows, f"One decode step's attention, {cascade_cfg.num_layers} layers: "
    f"{cascade_P} shared + {cascade_own_len} own keys per sequence")

# %%
_wins = [r["sequences"] for r in cascade_rows if r["speed-up"] > 1.05]
_engine = [r["sequences"] for r in cascade_rows if r["engine would cascade"]]
cascade_text = ui.md(
    f"**Cascade paid (over 1.05x) at {_wins or 'none'} of {[r['sequences'] for r in cascade_rows]} "
    f"sequences; the engine's rule (`use_cascade`: at least "
    f"{mini_model.CASCADE_MIN_SAVED_KEYS:,} keys saved, measured on two CPUs) would cascade at "
    f"{_engine or 'none'}.** The break-even depends on the machine and the dtype, which is why "
    f"the engine keeps it a measured constant and a switch (`--no-cascade-attention`). This "
    f"was the {cascade_form.value} form; `decode_attention auto` writes attention out for bf16 "
    f"and fp16 decode batches over {mini_model.eager_min_keys():,} keys on this CPU, else uses "
    f"SDPA, and these servers compute in `{str(cascade_dtype).removeprefix('torch.')}`.")
cascade_text

# %% [markdown]
# ## 5. The course server's own prefix cache, on and off
#
# The course's server runs with its prefix cache **on** (vLLM's and SGLang's default). For
# "off", we empty it (`POST /reset_prefix_cache` or SGLang's `/flush_cache`) before **every**
# request, before its clock starts. The same shared-prefix requests go one at a time, after a
# first pass that is not compared (quick mode: the first group's only); an engine without a
# prefix cache (the Hugging Face baseline) skips this. Hits are whole blocks of:

# %%
server_name = session.engine_name
server_block = session.info.get("block_size")
# Quick mode (CI) sends the first group's requests only: slow CPUs take seconds per prefill.
_sel = prefix_caching.group_stats(shared_wl, shared_tokens, workshop.session.sweep(None, 1))
server_requests = [shared_wl.sessions[i].request for i in _sel["requests"]]
server_mean_prompt = _sel["mean prompt"]
server_has_cache = bool(session.info.get("prefix_caching"))
server_reusable = shared_prefix_tokens // server_block * server_block if server_block else 0
_why_not = (session.info.get("extra") or {}).get("prefix_cache_note")
ui.md(f"The course's server: **{server_name} {session.info.get('engine_version', '')}**, "
      + (f"block size **{server_block} tokens**, " if server_block else "no block size reported, ")
      + f"prefix caching **{'on' if server_has_cache else 'off'}**"
      + (f". {len(server_requests)} requests, {shared_prefix_tokens} tokens shared per group: "
         + (f"{server_reusable} reusable per hit." if server_block else "block size unknown.")
         if server_has_cache else
         ": this section is skipped" + (f" ({_why_not})." if _why_not else ".")))

# %% [markdown]
# **Exercise 4 (predict, then measure).** For requests that find their group's system prompt
# cached, what will the ratio *median TTFT with the cache / median TTFT without* be on the
# course's server? (1.0 = no gain, 0.5 = twice as fast.) What share of the prompt is skipped,
# and what else does a first token cost?

# %%
predict_ttft_ratio = None   # your prediction, e.g. 0.5

# %%
from workshop import sanity

server_runs, server_rows = {}, []
server_pairs = {"hits": [], "leaked": 0, "off ms": float("nan"), "ratio": float("nan")}
if server_has_cache:
    # A first pass, not compared (the table's first row): a side timed first on a fresh server
    # could pay its warm-up; this row shows whether it does.
    for _label, _reset in ui.progress([("first pass (off), not compared", True),
                                       ("cache off", True), ("cache on", False)],
                                      title=f"{server_name} runs"):
        _before = session.metrics()
        _run = prefix_caching.sequential_run(session, server_requests, reset_each=_reset)
        server_rows.append(prefix_caching.sequential_row(_run, _before, session.metrics(),
                                                         _label))
        if "not compared" not in _label:
            server_runs[_label] = _run
    # Pair the same requests: those that hit with the cache on and found nothing with it "off".
    server_pairs = prefix_caching.paired_hits(server_runs)
hit_gate = sanity.hit_within_floor(server_name, server_pairs["ratio"],
                                  server_reusable / server_mean_prompt)
(ui.md(sanity.report(hit_gate)) if hit_gate else
 ui.compare(predict_ttft_ratio, server_pairs["ratio"],
            f"TTFT with / without the server's prefix cache ({server_name}; requests that hit)")
 if server_has_cache else
 ui.md(f"Skipped: the server ({server_name}) has no prefix cache on, so there is nothing to compare."))

# %%
# Worked answer to Exercise 4, collapsed until opened
_p, _skip = server_pairs, server_reusable / server_mean_prompt
_off_ms, _ok = _p["off ms"], server_has_cache and bool(_p["hits"]) and _skip > 0
# off = fixed + prefill, on = fixed + prefill x (1 - skipped share): the fixed part they imply
_fixed_ms = _off_ms * (_p["ratio"] - (1 - _skip)) / _skip if _ok else 0
_reading = (sanity.WITHHELD if hit_gate else
            f"Read as *fixed + prefill*, that puts **{_fixed_ms:,.0f} ms** of the {_off_ms:,.0f} "
            "outside the prefill (HTTP, tokenising, scheduling, and what a forward pass costs "
            "whatever its length, such as reading the weights), which no cache saves."
            if _fixed_ms < _off_ms else "The first token came no sooner with the cache: the "
            f"prefill of {server_reusable} tokens is too short to show next to the rest.")
ui.worked_answer(
    f"A hit skips the prefill of {server_reusable} of a prompt's {server_mean_prompt:.0f} tokens "
    f"on average ({_skip:.0%}). If the first token cost nothing but prefill, in proportion to "
    f"the tokens computed, the ratio would be 1 − {_skip:.2f} = **{1 - _skip:.2f}**. Measured "
    f"over the {len(_p['hits'])} request(s) that hit: **{_p['ratio']:.2f}**, from "
    f"{_off_ms:,.0f} ms without the cache. " + _reading if _ok else
    f"No request hit with the cache on and missed with it off ({_p['leaked']} of "
    f"{len(server_requests)} replies reported cached tokens after a reset): no ratio to work out."
    if server_has_cache else f"Skipped: {server_name} has no prefix cache on.")

# %%
ui.table(server_rows) if server_rows else ui.md("_(skipped: no prefix cache on this server)_")

# %%
(prefix_caching.per_request_figure(server_runs, f"{server_name}: time to first token of each "
                                   "request, prefix cache off vs on")
 if server_runs else ui.md("_(skipped: no prefix cache on this server)_"))

# %%
_on = next((r for r in server_rows if r["cache"] == "cache on"), {})
_u, _m, _leak = _on.get("hit rate (usage)"), _on.get("hit rate (/metrics)"), server_pairs["leaked"]
server_cache_text = ui.md(
    f"**With the cache on, the replies' own `usage` (`prompt_tokens_details.cached_tokens`) give "
    f"a hit rate of {(_u or 0):.3f}, the server's counters {(_m or 0):.3f}**"
    + (" (the counters are server-wide: other clients' requests count too)."
       if _u is not None and _m is not None and abs(_u - _m) > 0.02 else ".")
    + (f" {_leak} of {len(server_requests)} replies still reported cached tokens after a reset "
       "(refused while other requests hold blocks): left out of the comparison." if _leak else
       " With a reset before every request, no reply reported a cached token.")
    if server_rows else "_(skipped: no prefix cache on this server)_")
server_cache_text

# %% [markdown]
# ## 6. What the real engines do
#
# | | vLLM: automatic prefix caching | SGLang: RadixAttention |
# |---|---|---|
# | on by default; off with | `--no-enable-prefix-caching` | `--disable-radix-cache` |
# | what is cached | full blocks, each hashed with its parent's hash, its tokens and extra keys (LoRA adapter, multimodal inputs, a per-request `cache_salt`; `--prefix-caching-hash-algo`) | a radix tree over token sequences; a page of 1 token by default, so a match can end anywhere (`--page-size` rounds it to pages) |
# | eviction | idle blocks wait in an LRU free queue, a finished request's deepest blocks first (`free` in `vllm/v1/core/single_type_kv_cache_manager.py`) | LRU leaves; a cache-aware scheduler serves requests sharing long prefixes together |
# | hit rate | `vllm:prefix_cache_queries` and `vllm:prefix_cache_hits`, in prompt tokens (the teaching engine and the reference server export them too) | a running cache hit rate |
# | emptying it | `POST /reset_prefix_cache`, refused while a request holds blocks (`BlockPool.reset_prefix_cache`) | `/flush_cache` |
#
# **Cascade attention** was in vLLM's V1 FlashAttention backend (GPU: shared prefix >= 256
# tokens, batch >= 8, when a cost model agreed; `merge_attn_states`); 0.32, installed here,
# removed it (`--disable-cascade-attn` "has no effect", `vllm/engine/arg_utils.py`). FlashInfer
# keeps a multi-level form (`MultiLevelCascadeAttentionWrapper`); Hydragen
# ([arXiv:2402.05099](https://arxiv.org/abs/2402.05099)) studies the same decomposition. Sources:
# vLLM's [design doc](https://docs.vllm.ai/en/latest/design/prefix_caching.html) and 0.32
# source; SGLang, [arXiv:2312.07104](https://arxiv.org/abs/2312.07104).

# %%
from workshop.sizing import kvcache

vllm_cache_config = kvcache.engine_cache_config(session.metrics_text())
ui.md(
    "The shared server's own `vllm:cache_config_info` (read now from its `/metrics`): "
    + ", ".join(f"`{k}` = `{vllm_cache_config[k]}`" for k in
                ("enable_prefix_caching", "prefix_caching_hash_algo", "block_size",
                 "num_gpu_blocks") if k in vllm_cache_config)
    + "." if vllm_cache_config else
    f"This server publishes no `vllm:cache_config_info` (it runs `{session.engine}`, not vLLM)."
)
