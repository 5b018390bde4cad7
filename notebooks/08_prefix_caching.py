# /// script
# requires-python = ">=3.10"
# dependencies = [
#     "marimo",
#     "matplotlib",
#     "openai",
#     "httpx",
#     "tqdm",
#     "numpy",
# ]
# ///

import marimo

__generated_with = "0.25.2"
app = marimo.App(
    width="medium",
    app_title="8 · Prefix caching: reusing the KV of prompts you have seen before",
)


@app.cell(hide_code=True)
def _():
    import marimo as mo

    return (mo,)


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    # 8 · Prefix caching: reusing the KV of prompts you have seen before

    [![Open in Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/llm-inference-workshop/llm-inference-workshop/blob/main/notebooks/08_prefix_caching.ipynb)
    [![Open in molab](https://marimo.io/molab-shield.svg)](https://molab.marimo.io/github/llm-inference-workshop/llm-inference-workshop/blob/main/notebooks/08_prefix_caching.py)

    Many requests start the same way: a chat product's system prompt, an agent's instructions
    and tool schemas, the growing history of a conversation that is resent at every turn. The
    keys and values of those tokens depend only on the tokens before them, so an engine that
    kept them from an earlier request can skip that part of the prefill. This is **prefix
    caching**. This notebook:

    1. reads the two designs in the course's teaching engine (`mini_engine/prefix_cache.py`):
       **hash-chained blocks** (vLLM's) and a **radix tree** (SGLang's), and runs both on small
       token lists, a partial-block overlap included;
    2. runs a shared-prefix workload and an agentic-branching workload through the teaching
       engine with no cache, the hash cache and the radix cache, and reads the hit rate, time to
       first token (TTFT) and throughput from the server;
    3. shrinks the KV pool until the cache must evict, and watches the hit rate fall;
    4. times what a hit does *not* save, the decode steps' reads of the shared keys, and
       **cascade attention**, which reads them once per batch instead of once per sequence;
    5. turns vLLM's own prefix caching "off" on the shared server (by emptying its cache before
       every request) and compares with "on".
    """)
    return


@app.cell
def _():
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
                     "llm-inference-workshop @ git+https://github.com/llm-inference-workshop/llm-inference-workshop"], check=True)
            _il.invalidate_caches()
            import workshop.session
            workshop.session.install_runtime()

    import workshop.session

    session = workshop.session.connect()
    return session, workshop


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## 1. Two ways to find a prefix you have seen

    Both designs work on the paged KV cache of notebook 7: the pool is cut into **blocks** of
    `block_size` tokens, and a request's block table lists the blocks that hold its keys and
    values. Reusing a prefix means pointing a new request's block table at blocks an earlier
    request filled, and taking a reference on them so they are not freed under it.

    **Hash-chained blocks (vLLM).** A full block is named by a hash of *its parent block's
    hash* and *its own tokens*. Because each hash folds in the one before it, equal hashes mean
    equal prefixes from the first token, not just equal blocks. Looking up a prompt is a walk
    over its blocks in a dictionary, stopping at the first miss. The teaching engine's version:
    """)
    return


@app.cell
def _():
    import inspect

    from mini_engine.prefix_cache import HashPrefixCache, RadixPrefixCache
    from workshop import ui

    ui.md("```python\n" + inspect.getsource(HashPrefixCache._hashes)
          + "\n" + inspect.getsource(HashPrefixCache.match) + "```")
    return RadixPrefixCache, inspect, ui


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    **A radix tree (SGLang).** The cache is a tree whose edges are runs of tokens; two prompts
    that share a start share the path from the root, and an edge is split where they part.
    Looking up a prompt walks down the tree comparing tokens. SGLang's tree
    ([Zheng et al. 2023, arXiv:2312.07104](https://arxiv.org/abs/2312.07104), "RadixAttention")
    can match token by token; the teaching engine's tree compares **whole blocks**, because its
    KV lives in blocks and a block is shared whole or not at all:
    """)
    return


@app.cell
def _(RadixPrefixCache, inspect, ui):
    ui.md("```python\n" + inspect.getsource(RadixPrefixCache._common_blocks)
          + "\n" + inspect.getsource(RadixPrefixCache._walk) + "```")
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ### Both on a few token lists

    No model is needed to see what each cache matches: `prefix_caching.replay` sends token lists
    through the engine's own block manager and cache, one request after another (look up,
    allocate, offer the full blocks to the cache, finish). The prompts below are made of token
    ids; **B** shares its first 10 tokens with **A**, then differs.

    Pick a block size (in Jupyter, re-run the cells below after moving it; marimo re-runs them).
    """)
    return


@app.cell
def _(ui):
    demo_block = ui.slider(2, 8, 4, 1, "block size (tokens) for the token-list demo")
    demo_block
    return (demo_block,)


@app.cell
def _(demo_block, ui):
    demo_prompts = {
        "A": list(range(100, 112)),                                   # 12 tokens
        "B = A[:10] + 4 new": list(range(100, 110)) + [7, 8, 9, 10],  # shares 10 with A
        "C = A + 4 new": list(range(100, 112)) + [1, 2, 3, 4],        # A is its prefix
        "D = A[:8] + 5 new": list(range(100, 108)) + [50, 51, 52, 53, 54],
    }
    ui.md(f"Block size **{demo_block.value}**. Prompt B shares 10 tokens with A: that is "
          f"{10 // demo_block.value} full block(s) and {10 % demo_block.value} token(s) of the next.")
    return (demo_prompts,)


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    **Exercise 1 (predict, then compute).** With the block size above, how many of B's tokens
    will the **radix** cache find, after A has been served? Write your number, then run the
    cell after it.
    """)
    return


@app.cell
def _():
    predict_radix_tokens = None   # your prediction: tokens of B found in the radix cache
    return (predict_radix_tokens,)


@app.cell
def _(demo_block, demo_prompts, predict_radix_tokens, ui):
    from workshop import prefix_caching

    demo_rows = prefix_caching.match_rows(demo_prompts, demo_block.value)
    ui.compare(predict_radix_tokens, demo_rows[1]["radix: tokens reused"],
               "tokens of B the radix cache reused", "tokens", how="computed")
    return demo_rows, prefix_caching


@app.cell
def _(demo_rows, ui):
    ui.table(demo_rows)
    return


@app.cell
def _(demo_block, demo_rows, ui):
    _b = demo_rows[1]
    _partial = 10 % demo_block.value
    ui.md(
        f"Of the 10 tokens B shares with A, the hash cache reused **{_b['hash: tokens reused']}** "
        f"and the radix cache **{_b['radix: tokens reused']}**: "
        + ("the same number, the full blocks only. " if _b["hash: tokens reused"] ==
           _b["radix: tokens reused"] else "different numbers. ")
        + (f"The {_partial} shared token(s) in B's next block are recomputed by both: in this "
           f"engine a block is shared whole or not at all, so the radix tree here is a radix tree "
           f"*of blocks*. SGLang's tree can end a match mid-block because its KV pool is allocated "
           f"per token (a page size of 1 by default). "
           if _partial else "B's overlap ends on a block boundary with this block size, so "
           "nothing is lost to rounding: try a block size that does not divide 10. ")
        + "Both caches never hand out the block holding a prompt's last token (here C's last "
          "block, if the prompt ends on a boundary), because the engine needs at least one token "
          "to compute to get the next token's logits."
    )
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    The radix tree after the four prompts (each line an edge, with the blocks it owns). A shared
    start is stored once; where prompts part, the edge was split:
    """)
    return


@app.cell
def _(demo_block, demo_prompts, prefix_caching, ui):
    demo_tree = prefix_caching.replay([(p, []) for p in demo_prompts.values()], "radix",
                                      demo_block.value, 64).cache
    ui.md("```text\n" + prefix_caching.radix_text(demo_tree.dump(), demo_block.value) + "\n```")
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    What differs beyond lookup is **eviction**, when the pool runs out of free blocks and the
    cache must give some back. The hash cache can drop any block that no running request holds,
    least recently used first (deepest first among equals, as vLLM's free-block queue does).
    The radix tree drops whole **leaf edges**, least recently used first, so a parent is only
    dropped after its children: a shared start outlives the tails that hang off it. Section 3
    measures what that does to the hit rate.
    """)
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## 2. The teaching engine: no cache, hash, radix

    Three teaching-engine servers, identical except for the prefix cache (`--no-prefix-caching`,
    `-- --prefix-cache hash`, `-- --prefix-cache radix`), each run two workloads from the
    benchmark harness (`workshop/bench/workloads.py`):

    * **shared prefix**: requests spread over a few groups, each group sharing a long system
      prompt, followed by a short question of its own (like SGLang's generated-shared-prefix
      benchmark);
    * **agentic**: an agent with a long system prompt (instructions and tool schemas) takes
      turns, resending its whole history each time; after its first turn it forks sub-agents
      (branches) that inherit that history, then merges their reports.

    Sessions go one at a time (a closed loop of 1), so the shared-prefix workload's hit rate
    depends only on the order of its requests; two or more sub-agents send their requests at
    the same moment, so there timing plays a part too (quick mode forks one). The controls set
    the workloads' shape (in Jupyter, re-run the cells from the one that starts the servers on
    after moving one; marimo re-runs them).
    That cell starts the three servers side by side and builds the workloads; the servers are
    stopped once this section is done, and started again by the next re-run.
    """)
    return


@app.cell
def _(ui, workshop):
    prefix_len = ui.slider(64, 1536, workshop.session.sweep(512, 128), 64,
                           "shared system prompt (tokens)")
    prefix_len
    return (prefix_len,)


@app.cell
def _(ui, workshop):
    prefix_groups = ui.slider(1, 8, workshop.session.sweep(4, 2), 1,
                              "groups (distinct system prompts)")
    prefix_groups
    return (prefix_groups,)


@app.cell
def _(ui, workshop):
    agent_branches = ui.slider(1, 6, workshop.session.sweep(2, 1), 1, "sub-agents forked by the agent (branches)")
    agent_branches
    return (agent_branches,)


@app.cell
def _(agent_branches, prefix_caching, prefix_groups, prefix_len, workshop):
    from workshop.bench.workloads import Tokenizer, agentic_workload, shared_prefix_workload

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
                      num_tools=workshop.session.sweep(None, 1), main_turns=workshop.session.sweep(3, 1), fork_at=(0,),
                      branches=agent_branches.value, branch_turns=workshop.session.sweep(1, 0),
                      turn_output=workshop.session.sweep((16, 32), (4, 8)),
                      tool_result_len=(20, 40), summary_output=workshop.session.sweep(24, 4),
                      final_output=workshop.session.sweep(24, 4))
    shared_wl = shared_prefix_workload(mini_tok, **shared_args)
    shared_tokens = prefix_caching.workload_tokens(shared_wl)
    return agent_args, mini, mini_info, shared_args, shared_tokens, shared_wl


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    **Exercise 2 (predict, then measure).** Before running anything: what hit rate (cached
    prompt tokens / all prompt tokens) will the **hash** cache report for the shared-prefix
    workload? The numbers you need are printed below. Hint: the first request of each group
    finds nothing; every later one finds the shared tokens, rounded *down* to whole blocks.
    """)
    return


@app.cell
def _(mini_info, shared_args, shared_tokens, shared_wl, ui):
    import os
    import statistics

    shared_groups: dict[str, list] = {}
    for _s, (_p, _o) in zip(shared_wl.sessions, shared_tokens):
        shared_groups.setdefault(_s.request.tag, []).append(_p)
    # Tokens every prompt of a group shares (chat template + system prompt + the user turn's start).
    shared_prefix_tokens = min((len(os.path.commonprefix(g)) for g in shared_groups.values()
                                if len(g) > 1), default=0)
    mean_prompt_tokens = statistics.mean(len(p) for p, _ in shared_tokens)
    ui.md(f"{shared_args['num_requests']} requests in {len(shared_groups)} groups; a prompt has "
          f"**{mean_prompt_tokens:.0f} tokens** on average (chat template applied), of which "
          f"the first **{shared_prefix_tokens}** are the same for every request of its group; "
          f"the engine's block size is **{mini_info['block_size']} tokens**.")
    return mean_prompt_tokens, shared_groups, shared_prefix_tokens, statistics


@app.cell
def _():
    predict_hit_rate = None   # your prediction, a fraction between 0 and 1
    return (predict_hit_rate,)


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    The formula the hint describes, computed:
    """)
    return


@app.cell
def _(
    mean_prompt_tokens,
    mini_info,
    shared_args,
    shared_groups: dict[str, list],
    shared_prefix_tokens,
    ui,
):
    _n, _g, _bs = shared_args["num_requests"], len(shared_groups), mini_info["block_size"]
    formula_hit_rate = (_n - _g) * (shared_prefix_tokens // _bs * _bs) / (_n * mean_prompt_tokens)
    ui.md(f"(requests − groups) × ⌊shared / block⌋ × block / (requests × mean prompt) = "
          f"({_n} − {_g}) × {shared_prefix_tokens // _bs * _bs} / ({_n} × {mean_prompt_tokens:.0f}) "
          f"= **{formula_hit_rate:.3f}**")
    return (formula_hit_rate,)


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    Now the two workloads through the three servers (each server's cache is emptied first):
    """)
    return


@app.cell
def _(agent_args, mini, predict_hit_rate, prefix_caching, shared_args, ui):
    kinds_rows, kinds_raw = prefix_caching.run_kinds(
        mini, {"shared-prefix": shared_args, "agentic": agent_args},
        progress=lambda jobs: ui.progress(jobs, title="workload x cache"))
    measured_hit_rate = next(r["hit rate (/metrics)"] for r in kinds_rows
                             if r["cache"] == "hash" and r["workload"] == "shared-prefix")
    ui.compare(predict_hit_rate, measured_hit_rate, "hash-cache hit rate, shared-prefix workload")
    return kinds_raw, kinds_rows, measured_hit_rate


@app.cell
def _(kinds_rows, ui):
    ui.table(kinds_rows)
    return


@app.cell
def _(kinds_rows, prefix_caching):
    prefix_caching.kinds_figure(kinds_rows, "hit rate (/metrics)",
                                "Prefix-cache hit rate per cache kind (teaching engine)",
                                "hit rate (cached / prompt tokens)")
    return


@app.cell
def _(kinds_rows, prefix_caching):
    prefix_caching.kinds_figure(kinds_rows, "median TTFT (ms)",
                                "Time to first token per cache kind (teaching engine)",
                                "median TTFT (ms)")
    return


@app.cell
def _(
    agent_branches,
    formula_hit_rate,
    kinds_raw,
    kinds_rows,
    measured_hit_rate,
    prefix_caching,
    ui,
):
    _row = {(r["cache"], r["workload"]): r for r in kinds_rows}
    _w_sp, _w_ag = "shared-prefix", "agentic"
    _none_sp, _hash_sp, _radix_sp = (_row[(k, _w_sp)] for k in ("none", "hash", "radix"))
    _none_ag, _hash_ag, _radix_ag = (_row[(k, _w_ag)] for k in ("none", "hash", "radix"))
    _speed_sp = _none_sp["median TTFT (ms)"] / _hash_sp["median TTFT (ms)"]
    _speed_ag = _none_ag["median TTFT (ms)"] / _hash_ag["median TTFT (ms)"]
    _tput_sp = _hash_sp["output tok/s"] / _none_sp["output tok/s"]
    _same_sp, _same_ag = (abs(_row[("hash", w)]["hit rate (/metrics)"]
                              - _row[("radix", w)]["hit rate (/metrics)"]) < 1e-9 for w in (_w_sp, _w_ag))
    _same = _same_sp and _same_ag
    # Enough decimals that two different hit rates never print as the same number.
    _d_sp, _d_ag = (prefix_caching.decimals_to_tell_apart(_row[("hash", w)]["hit rate (/metrics)"],
                                                          _row[("radix", w)]["hit rate (/metrics)"])
                    for w in (_w_sp, _w_ag))
    _ag_prompt_tokens = {k: sorted(r.prompt_tokens for r in kinds_raw[(k, _w_ag)].records)
                         for k in ("hash", "radix")}
    kinds_same_tokens, ttft_gain_shared = _same_sp, _speed_sp     # for the summary at the end
    _agree = abs(measured_hit_rate - formula_hit_rate) < 0.01
    ui.md(
        f"The formula gave **{formula_hit_rate:.3f}** and the hash server's counters "
        f"(`vllm:prefix_cache_hits_total` / `vllm:prefix_cache_queries_total`, differenced over the "
        f"run) **{measured_hit_rate:.3f}**"
        + (": they agree. " if _agree else
           ": they differ, so something besides whole shared blocks was reused or missed (the "
           "groups' first requests may not come first, or a reply's blocks were matched too). ")
        + f"The server with `--no-prefix-caching` reported "
        + (f"a hit rate of {_none_sp['hit rate (/metrics)']:.3f}. "
           if _none_sp["hit rate (/metrics)"] is not None else "no lookups at all (no cache). ")
        + ("Hash and radix found exactly the same tokens in both workloads: at block granularity, "
           "with requests one at a time and a pool that never fills, the two designs differ in how "
           "they find a prefix, not in what they find; so the difference between their TTFTs "
           f"(shared prefix {_hash_sp['median TTFT (ms)']:.0f} vs "
           f"{_radix_sp['median TTFT (ms)']:.0f} ms) is mostly run-to-run variation on this "
           "machine, not the data structure. " if _same else
           f"Hash and radix found {'the same' if _same_sp else 'different'} amounts on the "
           f"shared-prefix workload ({_hash_sp['hit rate (/metrics)']:.{_d_sp}f} vs "
           f"{_radix_sp['hit rate (/metrics)']:.{_d_sp}f}) and {'the same' if _same_ag else 'different'} "
           f"ones on the agentic workload ({_hash_ag['hit rate (/metrics)']:.{_d_ag}f} vs "
           f"{_radix_ag['hit rate (/metrics)']:.{_d_ag}f}). "
           + ("" if _same_ag or _ag_prompt_tokens["hash"] == _ag_prompt_tokens["radix"] else
              f"The two servers were not sent the same agentic prompts ({sum(_ag_prompt_tokens['hash'])} "
              f"vs {sum(_ag_prompt_tokens['radix'])} prompt tokens in all): each turn resends the "
              "replies the model wrote, and the two servers' replies differed. ")
           + ("" if _same_ag or agent_branches.value < 2 else
              "The agent's sub-agents send their requests at the same moment, so how much of a "
              "sibling's freshly computed history one of them finds depends on which the scheduler "
              "admitted first and how far it had got, not only on the cache's design. ")
           + ("" if _same_sp else
              "The shared-prefix requests go one at a time, so that difference is the design's. "))
        + f"Median TTFT without a cache / with the hash cache: **{_speed_sp:.2f}x** on the "
        f"shared-prefix workload, **{_speed_ag:.2f}x** on the agentic one; output throughput "
        f"changed **{_tput_sp:.2f}x** on the shared-prefix workload. "
        + ("Skipping most of the prefill shows up clearly in TTFT on this machine. "
           if min(_speed_sp, _speed_ag) > 1.3 else
           "The gain is small here: with prompts of a few hundred tokens, prefill on this machine "
           "costs little next to the fixed costs of a request (HTTP, tokenising, scheduling, one "
           "decode step), so skipping most of it saves little in absolute terms. Try a longer "
           "shared prompt. " if max(_speed_sp, _speed_ag) < 1.3 else
           "The gain differs between the workloads: compare their prompt lengths and hit rates. ")
        + "Requests with a hit and without are split in the table, which is the cleaner comparison "
          "within one server."
    )
    return kinds_same_tokens, ttft_gain_shared


@app.cell
def _(kinds_rows, kinds_same_tokens, mini):
    # Section 3 replays without servers: stop the three (after the cells that use them).
    _used = (kinds_rows, kinds_same_tokens)
    for _s in mini.values():
        _s.stop()
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## 3. Eviction: when the pool is too small to keep everything

    A prefix cache lives in the same pool as the running requests' KV. Cached blocks that no
    request holds count as free: when a request needs blocks and none are free, the cache gives
    some back (eviction), and a later request that would have found them recomputes them. So
    the hit rate depends on the **pool size**, not only on the workload.

    Starting a server per pool size would cost several seconds each, so the curve below replays
    the shared-prefix workload's exact token lists (as planned, chat template applied) through
    the engine's block manager and both caches, for a range of pool sizes: one request after
    another like the live runs, and step by step like the engine (the prompt in chunks of the
    server's token budget per step, then one output token per step), because when blocks are
    allocated and offered decides what gets evicted. Below the largest request's own size (red
    line) a request cannot run at all.
    """)
    return


@app.cell
def _(mini_info, prefix_caching, shared_tokens, ui):
    pool_min_blocks = prefix_caching.blocks_needed(shared_tokens, mini_info["block_size"])
    _all_blocks = sum(-(-(len(p) + len(o)) // mini_info["block_size"]) for p, o in shared_tokens)
    pool_sizes = sorted({int(pool_min_blocks * f) for f in (1, 1.25, 1.5, 2, 2.5, 3, 4, 6)
                         if pool_min_blocks * f < _all_blocks} | {_all_blocks})
    pool_chunk = int(mini_info.get("extra", {}).get("max_num_batched_tokens") or 512)
    pool_rows = prefix_caching.pool_sweep(shared_tokens, pool_sizes, mini_info["block_size"],
                                          chunk=pool_chunk)
    ui.md(f"The largest request needs **{pool_min_blocks} blocks**; all requests together, with "
          f"nothing shared, would need {_all_blocks}. Pools swept: {pool_sizes} blocks.")
    return pool_chunk, pool_min_blocks, pool_rows


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    Is the replay faithful to the engine? At the largest pool it must give the hit rate the live
    hash server reported in section 2 (same requests, same order):
    """)
    return


@app.cell
def _(measured_hit_rate, pool_rows, ui):
    _big = max(r["pool (blocks)"] for r in pool_rows)
    replay_big_hit = next(r["hit rate"] for r in pool_rows
                          if r["pool (blocks)"] == _big and r["cache"] == "hash")
    ui.md(f"Replay at {_big} blocks: **{replay_big_hit:.4f}**; live hash server: "
          f"**{measured_hit_rate:.4f}**"
          + (" — identical." if abs(replay_big_hit - measured_hit_rate) < 1e-6 else
             " — they differ, so the replay misses something the engine does; treat the curve "
             "below as an approximation."))
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    A live check of the curve: one more teaching-engine server with a small pool
    (`-- --num-blocks N`), running the same workload. Pick its size (in blocks); the default is
    1.5 x the largest request. This costs one more server start, so quick mode (CI) skips it.
    """)
    return


@app.cell
def _(ui):
    live_pool = ui.slider(0, 256, 0, 1, "live small pool (blocks; 0 = 1.5 x the largest request)")
    live_pool
    return (live_pool,)


@app.cell
def _(
    live_pool,
    mini_info,
    pool_chunk,
    pool_min_blocks,
    prefix_caching,
    shared_args,
    shared_tokens,
    ui,
    workshop,
):
    pool_live_rows = []
    if not workshop.session.quick():
        _blocks = live_pool.value or int(1.5 * pool_min_blocks)
        _blocks = max(_blocks, pool_min_blocks)
        with workshop.session.start("mini", ["--", "--prefix-cache", "hash", "--num-blocks",
                                             str(_blocks)], verbose=False) as _small:
            _rows, _ = prefix_caching.run_kinds({"hash": _small}, {"shared-prefix": shared_args})
        pool_live_rows = [{"pool (blocks)": _blocks, "hit rate": _rows[0]["hit rate (/metrics)"],
                           "median TTFT (ms)": _rows[0]["median TTFT (ms)"]}]
        _replayed = prefix_caching.pool_sweep(shared_tokens, [_blocks], mini_info["block_size"],
                                              kinds=("hash",), chunk=pool_chunk)[0]["hit rate"]
        pool_live_rows[0]["replay hit rate"] = _replayed
    ui.table(pool_live_rows) if pool_live_rows else ui.md(
        "Quick mode: no live small-pool server (the replay curve below is computed, not measured).")
    return (pool_live_rows,)


@app.cell
def _(pool_live_rows, pool_min_blocks, pool_rows, prefix_caching):
    prefix_caching.pool_figure(pool_rows, pool_live_rows, pool_min_blocks)
    return


@app.cell
def _(pool_rows, ui):
    ui.table(pool_rows)
    return


@app.cell
def _(pool_live_rows, pool_rows, ui):
    _h = {r["pool (blocks)"]: r["hit rate"] for r in pool_rows if r["cache"] == "hash"}
    _r = {r["pool (blocks)"]: r["hit rate"] for r in pool_rows if r["cache"] == "radix"}
    _smallest, _largest = min(_h), max(_h)
    _full = _h[_largest]
    _enough = min(p for p in _h if _h[p] >= _full - 1e-9)
    _radix_lower = [p for p in _h if _r[p] < _h[p] - 1e-9]
    ui.md(
        f"With a pool of {_largest} blocks the hash cache found **{_full:.1%}** of the prompt "
        f"tokens; it needs **{_enough} blocks** to keep all of that, and at {_smallest} blocks "
        f"(just the largest request) it finds **{_h[_smallest]:.1%}**. "
        + ("The hit rate falls as the pool shrinks: the shared system prompts are evicted to make "
           "room for the running request, and the next request of that group recomputes them. "
           if _h[_smallest] < _full - 1e-9 else
           "The hit rate did not fall over this range: the workload's shared prompts fit even in "
           "the smallest pool. Try more groups or a longer prompt. ")
        + (f"At {len(_radix_lower)} of the pool sizes the radix cache found less than the hash "
           f"cache (e.g. {min(_radix_lower)} blocks: radix {_r[min(_radix_lower)]:.1%}, hash "
           f"{_h[min(_radix_lower)]:.1%}). The radix tree evicts whole leaf edges, and a group's "
           f"first request leaves one edge holding its system prompt *and* its own question and "
           f"reply; until a second request of the group splits that edge, evicting the tail evicts "
           f"the system prompt with it. The hash cache gives back only as many blocks as it must, "
           f"the deepest (least likely shared) first. "
           if _radix_lower else "The radix cache matched the hash cache at every pool size. ")
        + ("The live small-pool server found "
           f"**{pool_live_rows[0]['hit rate']:.2%}** where the replay predicts "
           f"{pool_live_rows[0]['replay hit rate']:.2%}"
           + (": the replay is the engine's eviction, block for block."
              if abs(pool_live_rows[0]["hit rate"] - pool_live_rows[0]["replay hit rate"]) < 1e-6
              else ": close, not identical, so the engine did something the replay does not "
                   "model (another request in flight, a preemption).")
           if pool_live_rows else "")
    )
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## 4. After the hit: reading a shared prefix once (cascade attention)

    A hit saves the shared prompt's *prefill*, once per request. The *decode* steps after it
    still pay for the prefix: the sequences' block tables point at the same blocks, and at
    every step, in every layer, attention reads those keys and values once **per sequence**.
    Eight agents on one 600-token system prompt read the same 600 keys eight times a layer, for
    every token they write.

    **Cascade attention** reads them once. Split each sequence's keys in two: the shared prefix
    (`P` keys, the same blocks for everyone) and the sequence's own keys after it. The queries
    of the whole batch, stacked, meet the shared keys in *one* matmul; each sequence's queries
    meet its own keys in a second, batched one. One softmax over both sets of scores, and the
    two weighted sums of values added, give exactly attention over the whole context: the
    softmax runs over each query's full row of scores either way, so it cannot tell that they
    were computed in two pieces.

    A fused kernel such as PyTorch's SDPA cannot share one softmax between two calls. It can
    say, for each query, the log of its softmax's denominator (the **log-sum-exp** of its
    scores), and that is enough: attention over the shared keys and attention over the own
    keys, each weighted by its share of the whole denominator, is attention over both. It is
    the rescaling FlashAttention's online softmax does tile by tile (notebook 6); FlashInfer
    calls it merging attention states. The teaching engine's version (`mini_engine/model.py`)
    does it written out, or with SDPA and `merge_attention`:
    """)
    return


@app.cell
def _(inspect, ui):
    from mini_engine import model as mini_model

    ui.md("```python\n" + inspect.getsource(mini_model.cascade_attention) + "\n\n"
          + inspect.getsource(mini_model.merge_attention) + "```")
    return (mini_model,)


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    Below, one decode step's attention over all the model's layers, both ways, from a KV pool
    shaped like the served model's (its layers, KV heads and head size, in the servers' dtype).
    Each way reads its keys out of the pool through block tables, as the engine does
    (`KVCache.read_blocks`): **per sequence** reads every sequence's whole context; **cascade**
    reads the shared blocks once and each sequence's own blocks. The own blocks are scattered
    over the pool, as after some traffic. Set the shape (in Jupyter, re-run the cells below after
    moving a slider):
    """)
    return


@app.cell
def _(ui, workshop):
    cascade_shared = ui.slider(64, 2048, workshop.session.sweep(640, 256), 64, "shared prefix (keys)")
    cascade_shared
    return (cascade_shared,)


@app.cell
def _(ui, workshop):
    cascade_own = ui.slider(16, 1024, workshop.session.sweep(256, 64), 16, "each sequence's own keys")
    cascade_own
    return (cascade_own,)


@app.cell
def _(ui):
    cascade_seqs = ui.slider(2, 32, 8, 1, "sequences decoding together")
    cascade_seqs
    return (cascade_seqs,)


@app.cell
def _(cascade_own, cascade_seqs, cascade_shared, mini_info, ui):
    import torch
    import torch.nn.functional as F

    from mini_engine.config import DTYPES
    from mini_engine.kv_cache import KVCache, KVLayout
    from mini_engine.loader import ModelConfig

    cascade_cfg = ModelConfig.from_hf(mini_info["model_path"])
    cascade_dtype = DTYPES.get(str(mini_info.get("dtype")), torch.float32)
    cascade_bs = mini_info["block_size"]
    cascade_kvh = cascade_cfg.num_kv_heads
    cascade_grp = cascade_cfg.num_heads // cascade_kvh        # query heads per KV head
    cascade_P = max(cascade_shared.value // cascade_bs, 1) * cascade_bs             # whole blocks
    cascade_own_len = -(-cascade_own.value // cascade_bs) * cascade_bs
    # The batch sizes timed: doubling up to the slider's, which is always one of them.
    cascade_batches = sorted({b for b in (2, 4, 8, 16, 32) if b < cascade_seqs.value}
                             | {int(cascade_seqs.value)})
    _max_b = max(cascade_batches)
    _own_blocks = cascade_own_len // cascade_bs
    # The engine's pool layout for K and V: [kv_heads, slots, head_dim] per layer.
    cascade_pool = KVCache(KVLayout(((cascade_kvh, None, cascade_cfg.head_dim),) * 2),
                           cascade_cfg.num_layers, cascade_P // cascade_bs + _max_b * _own_blocks + 8,
                           cascade_bs, cascade_dtype)
    for _layer in cascade_pool.layers:
        for _t in _layer:
            _t.normal_()            # real values, and every page of the pool touched once
    # Blocks 0 .. P/bs - 1 hold the shared prefix; every sequence's own blocks come at random
    # from the rest of the pool.
    cascade_shared_blocks = torch.arange(cascade_P // cascade_bs)
    _rest = cascade_P // cascade_bs + torch.randperm(cascade_pool.num_blocks - cascade_P // cascade_bs)
    cascade_own_blocks = _rest[:_max_b * _own_blocks].view(_max_b, _own_blocks)
    ui.md(f"Model: {cascade_cfg.num_layers} layers, {cascade_cfg.num_heads} query heads sharing "
          f"{cascade_kvh} KV heads of {cascade_cfg.head_dim}, `{str(cascade_dtype).removeprefix('torch.')}`; "
          f"blocks of {cascade_bs} tokens. Each sequence: **{cascade_P} shared + {cascade_own_len} "
          f"own keys**. Batches timed: {cascade_batches} sequences.")
    return (
        F,
        cascade_P,
        cascade_batches,
        cascade_bs,
        cascade_cfg,
        cascade_dtype,
        cascade_grp,
        cascade_kvh,
        cascade_own_blocks,
        cascade_own_len,
        cascade_pool,
        cascade_shared_blocks,
        torch,
    )


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    The two ways of one decode step, written with the engine's pieces, in either attention form:
    **written out** (`eager_attention`, two matmuls and a float32 softmax) or **SDPA**
    (PyTorch's kernel; for cascade, two calls merged). The form starts at the one the engine
    would pick for the slider's batch in this dtype (`use_eager`); try the other. Queries are
    laid out as the engine lays them out, the query heads that share a KV head folded into the
    query axis: `[kv_heads, sequences, query heads per KV head, head_dim]`.
    """)
    return


@app.cell
def _(cascade_P, cascade_dtype, cascade_own_len, cascade_seqs, mini_model, ui):
    cascade_form = ui.dropdown(
        ["written out", "SDPA"],
        "written out" if mini_model.use_eager("auto", cascade_dtype, int(cascade_seqs.value),
                                              cascade_P + cascade_own_len) else "SDPA",
        "attention form")
    cascade_form
    return (cascade_form,)


@app.cell
def _(
    F,
    cascade_P,
    cascade_cfg,
    cascade_form,
    cascade_kvh,
    cascade_own_blocks,
    cascade_own_len,
    cascade_pool,
    cascade_shared_blocks,
    mini_model,
    torch,
):
    cascade_written_out = cascade_form.value == "written out"


    def attend_per_sequence(layer, q, B):
        """Every sequence reads its whole context (shared blocks, then its own) from the pool."""
        blocks = torch.cat((cascade_shared_blocks.expand(B, -1), cascade_own_blocks[:B]), 1)
        k, v = (t.view(cascade_kvh, B, -1, cascade_cfg.head_dim)
                for t in cascade_pool.read_blocks(layer, blocks.reshape(-1)))
        mask = torch.ones(1, B, 1, k.shape[2], dtype=torch.bool)   # a decode query sees every key
        if cascade_written_out:
            return mini_model.eager_attention(q, k, v, mask)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


    def attend_cascade(layer, q, B):
        """The shared blocks read once for the batch, then each sequence's own blocks."""
        ks, vs = (t.view(cascade_kvh, 1, cascade_P, -1)
                  for t in cascade_pool.read_blocks(layer, cascade_shared_blocks))
        k, v = (t.view(cascade_kvh, B, cascade_own_len, -1)
                for t in cascade_pool.read_blocks(layer, cascade_own_blocks[:B].reshape(-1)))
        mask = torch.ones(1, B, 1, cascade_own_len, dtype=torch.bool)
        return mini_model.cascade_attention(q, ks, vs, k, v, mask, cascade_written_out)


    def attention_step(attend, queries):
        """One decode step's attention: every layer, each layer's output dropped as the engine
        drops it."""
        for _li, _q in enumerate(queries):
            attend(_li, _q, _q.shape[1])

    return attend_cascade, attend_per_sequence, attention_step


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    First, are they the same attention? Both against a third computation that shares nothing
    with them: PyTorch's `scaled_dot_product_attention` in float32, each sequence's keys picked
    out of the pool slot by slot with plain indexing, one sequence at a time.
    """)
    return


@app.cell
def _(
    F,
    attend_cascade,
    attend_per_sequence,
    cascade_bs,
    cascade_cfg,
    cascade_dtype,
    cascade_grp,
    cascade_kvh,
    cascade_own_blocks,
    cascade_pool,
    cascade_seqs,
    cascade_shared_blocks,
    torch,
    ui,
):
    def reference_attention(layer, q, B):
        """float32 SDPA per sequence over its context, the slots computed from the block ids."""
        k_pool, v_pool = cascade_pool.layers[layer]
        out = []
        for _b in range(B):
            _blocks = torch.cat((cascade_shared_blocks, cascade_own_blocks[_b]))
            _slots = (_blocks[:, None] * cascade_bs + torch.arange(cascade_bs)).reshape(-1)
            out.append(F.scaled_dot_product_attention(q[:, _b:_b + 1].float(),
                                                      k_pool[:, _slots][:, None].float(),
                                                      v_pool[:, _slots][:, None].float()))
        return torch.cat(out, 1)


    _B = int(cascade_seqs.value)
    _q = torch.randn(cascade_kvh, _B, cascade_grp, cascade_cfg.head_dim).to(cascade_dtype)
    _ref = reference_attention(0, _q, _B)
    cascade_errors = {"per sequence": (attend_per_sequence(0, _q, _B).float() - _ref).abs().max().item(),
                      "cascade": (attend_cascade(0, _q, _B).float() - _ref).abs().max().item()}
    # Both ways round in the pool's dtype; cascade may differ from the reference by about as much
    # as the per-sequence way does, not more.
    cascade_agrees = cascade_errors["cascade"] <= 2 * cascade_errors["per sequence"] + 1e-5
    ui.md(f"Largest difference from the float32 reference, {_B} sequences, layer 0: per sequence "
          f"**{cascade_errors['per sequence']:.2e}**, cascade **{cascade_errors['cascade']:.2e}**"
          + (" — the same attention, to the rounding of the dtype." if cascade_agrees else
             " — **cascade is further off than the dtype's rounding explains: a bug**."))
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    **Exercise 3 (predict, then measure).** At the slider's batch, how many times faster will
    the cascade step be than the per-sequence step? Count the keys each way reads: per sequence
    `B x (P + own)`, cascade `P + B x own`. Is the time all reading?
    """)
    return


@app.cell
def _():
    predict_cascade_speedup = None   # your prediction: per-sequence time / cascade time
    return (predict_cascade_speedup,)


@app.cell
def _(
    attend_cascade,
    attend_per_sequence,
    attention_step,
    cascade_P,
    cascade_batches,
    cascade_cfg,
    cascade_dtype,
    cascade_grp,
    cascade_kvh,
    cascade_own_len,
    cascade_seqs,
    mini_model,
    predict_cascade_speedup,
    torch,
    ui,
):
    from workshop.timing import best_time_s

    cascade_rows = []
    for _B in ui.progress(cascade_batches, title="batch sizes"):
        _queries = [torch.randn(cascade_kvh, _B, cascade_grp, cascade_cfg.head_dim).to(cascade_dtype)
                    for _ in range(cascade_cfg.num_layers)]
        _t = {"per sequence": float("inf"), "cascade": float("inf")}
        for _round in range(3):       # the two ways in turn, best of each: a slow moment hits both
            for _name, _fn in (("per sequence", attend_per_sequence), ("cascade", attend_cascade)):
                _t[_name] = min(_t[_name], 1e3 * best_time_s(lambda: attention_step(_fn, _queries),
                                                             repeats=3))
        cascade_rows.append({
            "sequences": _B, "keys read per sequence way": _B * (cascade_P + cascade_own_len),
            "keys read cascade": cascade_P + _B * cascade_own_len,
            "per sequence (ms/step)": _t["per sequence"], "cascade (ms/step)": _t["cascade"],
            "speed-up": _t["per sequence"] / _t["cascade"],
            "engine would cascade": mini_model.use_cascade(True, _B, cascade_P)})
    cascade_speedup = next(r["speed-up"] for r in cascade_rows if r["sequences"] == cascade_seqs.value)
    ui.compare(predict_cascade_speedup, cascade_speedup,
               f"cascade speed-up at {cascade_seqs.value} sequences", "x")
    return cascade_rows, cascade_speedup


@app.cell
def _(cascade_rows, ui):
    ui.table(cascade_rows)
    return


@app.cell
def _(cascade_P, cascade_cfg, cascade_own_len, cascade_rows, prefix_caching):
    prefix_caching.cascade_figure(
        cascade_rows, f"One decode step's attention, {cascade_cfg.num_layers} layers: "
        f"{cascade_P} shared + {cascade_own_len} own keys per sequence")
    return


@app.cell
def _(cascade_dtype, cascade_form, cascade_rows, mini_model, ui):
    _wins = [r["sequences"] for r in cascade_rows if r["speed-up"] > 1.05]
    # "from N on" only if it paid at every batch size from the first win up
    _from = min(_wins) if _wins and _wins == [r["sequences"] for r in cascade_rows
                                              if r["sequences"] >= min(_wins)] else None
    _engine = [r["sequences"] for r in cascade_rows if r["engine would cascade"]]
    _top = cascade_rows[-1]
    _bytes_ratio = _top["keys read per sequence way"] / _top["keys read cascade"]
    cascade_text = ui.md(
        f"At {_top['sequences']} sequences the cascade step read **{_bytes_ratio:.1f}x fewer keys** "
        f"and was **{_top['speed-up']:.2f}x** as fast"
        + (" (less than the keys alone would say: the scores, the softmax and the own keys cost "
           "the same both ways, and on this machine they are a large part of the step). "
           if _top["speed-up"] < 0.8 * _bytes_ratio else ". ")
        + (f"It paid (over 1.05x) from **{_from} sequences** on at this prefix. " if _from else
           f"It paid (over 1.05x) at {', '.join(map(str, _wins))} sequences but not at every size "
           "above: steps this short scatter from run to run; a longer prefix or more sequences "
           "give a clearer answer. " if _wins else
           "It never paid by more than 5 % at these sizes: try a longer shared "
           "prefix or more sequences. ")
        + (f"The engine's rule (`use_cascade`: at least {mini_model.CASCADE_MIN_SAVED_KEYS:,} keys "
           f"saved, measured on two CPUs, AVX-512 in bf16 and AVX2 in float32) would cascade from "
           f"{min(_engine)} sequences here. " if _engine else
           f"The engine's rule (`use_cascade`: at least {mini_model.CASCADE_MIN_SAVED_KEYS:,} keys "
           f"saved) would not cascade at any of these sizes. ")
        + ("This run agrees with that rule. " if (_from and _engine and _from == min(_engine))
           or (not _wins and not _engine) else
           "This run disagrees with that rule: the break-even point depends on the machine and "
           "the dtype, which is why the engine keeps it a measured constant and a switch "
           "(`--no-cascade-attention`). ")
        + (f"This was the {cascade_form.value} form; the engine cascades in either, in the form "
           f"`decode_attention auto` picks for the batch (written out for bf16 and fp16 decode "
           f"batches over {mini_model.eager_min_keys():,} keys on this CPU, else SDPA), and "
           f"these servers compute in `{str(cascade_dtype).removeprefix('torch.')}`."))
    cascade_text
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## 5. The course server's own prefix cache, on and off

    The course's shared server (vLLM unless `WORKSHOP_ENGINE` names another engine) runs with
    its prefix cache **on**, vLLM's and SGLang's default. Starting a second server with it off
    would cost a minute and a second copy of the model, so instead we empty its prefix cache
    (`POST /reset_prefix_cache`, which the reference server passes on to vLLM's own reset and
    to SGLang's `/flush_cache`) before **every** request: then no request can find another's
    blocks, which is what "off" means for TTFT. The reset itself happens before each request's
    clock starts. We send the same shared-prefix requests (quick mode: those of the first group),
    one at a time, both ways. An engine without a prefix cache (the Hugging Face baseline) has
    nothing to turn off: there this section says so and skips.

    The engine's block size is read from `/server_info` (vLLM's CPU backend uses larger blocks
    than the GPU default of 16; SGLang's default page is one token), and hits are whole blocks,
    so it matters:
    """)
    return


@app.cell
def _(
    session,
    shared_groups: dict[str, list],
    shared_prefix_tokens,
    shared_tokens,
    shared_wl,
    statistics,
    ui,
    workshop,
):
    server_name = session.engine_name
    server_block = session.info.get("block_size")
    # Quick mode (CI) sends the first group's requests only: on CI's 2 CPU cores vLLM took 10 to
    # 20 s to prefill a prompt longer than one of its 128-token blocks (2026-12-02), and a hit
    # needs a prompt that long.
    _server_tags = list(dict.fromkeys(_s.request.tag for _s in shared_wl.sessions))
    _server_tags = _server_tags[:workshop.session.sweep(len(_server_tags), 1)]
    _server_idx = [i for i, _s in enumerate(shared_wl.sessions) if _s.request.tag in _server_tags]
    server_requests = [shared_wl.sessions[i].request for i in _server_idx]
    server_groups = len(_server_tags)
    server_mean_prompt = statistics.mean(len(shared_tokens[i][0]) for i in _server_idx)
    server_has_cache = bool(session.info.get("prefix_caching"))
    _why_not = (session.info.get("extra") or {}).get("prefix_cache_note")
    ui.md(f"The course's server: **{server_name} {session.info.get('engine_version', '')}**, "
          + (f"block size **{server_block} tokens**, " if server_block else "no block size reported, ")
          + f"prefix caching **{'on' if server_has_cache else 'off'}**"
          + ("." if server_has_cache else
             f": this section needs a prefix cache, so it is skipped on this server"
             + (f" ({_why_not})" if _why_not else "") + ".")
          + (f" The {len(server_requests)} requests"
             + (f" (those of {server_groups} of the {len(shared_groups)} groups, quick mode)"
                if server_groups < len(shared_groups) else "")
             + f" share {shared_prefix_tokens} tokens per group: "
             + (f"{shared_prefix_tokens // server_block} whole block(s) of {server_block}, "
                f"{shared_prefix_tokens // server_block * server_block} tokens reusable per hit."
                if server_block else "block size unknown.") if server_has_cache else ""))
    return (
        server_block,
        server_groups,
        server_has_cache,
        server_mean_prompt,
        server_name,
        server_requests,
    )


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    **Exercise 4 (predict, then measure).** For requests that find their group's system prompt
    cached, what will the ratio *median TTFT with the cache / median TTFT without* be on the
    course's server? (1.0 = no gain, 0.5 = twice as fast.) Think about what share of the prompt
    is skipped and what else a request's first token costs.
    """)
    return


@app.cell
def _():
    predict_ttft_ratio = None   # your prediction, e.g. 0.5
    return (predict_ttft_ratio,)


@app.cell
def _(
    predict_ttft_ratio,
    prefix_caching,
    server_has_cache,
    server_name,
    server_requests,
    session,
    statistics,
    ui,
):
    server_runs = {}
    server_rows = []
    server_hit_requests, server_leaked, server_ttft_ratio = [], 0, float("nan")
    if server_has_cache:
        for _label, _reset in ui.progress([("cache off", True), ("cache on", False)], title=f"{server_name} runs"):
            _before = session.metrics()
            server_runs[_label] = prefix_caching.sequential_run(session, server_requests, reset_each=_reset)
            server_rows.append(prefix_caching.sequential_row(server_runs[_label], _before, session.metrics(),
                                                             _label))
        # Pair the same requests: those that hit with the cache on and found nothing with it "off".
        server_hit_requests = [i for i, (_a, _b) in enumerate(zip(server_runs["cache on"], server_runs["cache off"]))
                               if _a.ok and _b.ok and _a.cached_tokens and not _b.cached_tokens]
        server_leaked = sum(1 for r in server_runs["cache off"] if r.cached_tokens)
        if server_hit_requests:
            server_ttft_ratio = (statistics.median(server_runs["cache on"][i].ttft for i in server_hit_requests)
                                 / statistics.median(server_runs["cache off"][i].ttft for i in server_hit_requests))
    (ui.compare(predict_ttft_ratio, server_ttft_ratio,
                f"TTFT with / without the server's prefix cache ({server_name}; requests that hit)")
     if server_has_cache else
     ui.md(f"Skipped: the server ({server_name}) has no prefix cache on, so there is nothing to compare."))
    return (
        server_hit_requests,
        server_leaked,
        server_rows,
        server_runs,
        server_ttft_ratio,
    )


@app.cell
def _(server_rows, ui):
    ui.table(server_rows) if server_rows else ui.md("_(skipped: no prefix cache on this server)_")
    return


@app.cell
def _(prefix_caching, server_name, server_runs, ui):
    (prefix_caching.per_request_figure(server_runs, f"{server_name}: time to first token of each request, "
                                       "prefix cache off vs on")
     if server_runs else ui.md("_(skipped: no prefix cache on this server)_"))
    return


@app.cell
def _(
    mini_info,
    server_block,
    server_groups,
    server_hit_requests,
    server_leaked,
    server_mean_prompt,
    server_requests,
    server_rows,
    server_ttft_ratio,
    shared_prefix_tokens,
    ui,
):
    if server_rows:
        _on = server_rows[1]
        _reusable = shared_prefix_tokens // server_block * server_block if server_block else 0

        def _formula(bs):
            """Section 2's formula, on the requests sent here, with blocks of ``bs`` tokens."""
            return ((len(server_requests) - server_groups) * (shared_prefix_tokens // bs * bs)
                    / (len(server_requests) * server_mean_prompt))

        _server_formula = _formula(server_block) if server_block else None
        _other_traffic = (_on["hit rate (/metrics)"] is not None and _on["hit rate (usage)"] is not None
                          and abs(_on["hit rate (/metrics)"] - _on["hit rate (usage)"]) > 0.02)
        _parts = [f"With the cache on, the replies' own `usage` (`prompt_tokens_details.cached_tokens`) "
                  f"give a hit rate of **{(_on['hit rate (usage)'] or 0):.3f}** and the server's counters "
                  f"**{(_on['hit rate (/metrics)'] or 0):.3f}**"
                  + (" (the counters are server-wide, so other clients' requests during the run count "
                     "too; the per-reply numbers do not)." if _other_traffic else ".")]
        if _server_formula is not None:
            _parts.append(
                f"Section 2's formula with the server's {server_block}-token blocks predicts "
                f"**{_server_formula:.3f}**; with the teaching engine's {mini_info['block_size']}-token "
                f"blocks it gives {_formula(mini_info['block_size']):.3f}"
                + (": the shared prefix rounds down to the same number of tokens with both block "
                   "sizes here (try a prefix length that is not a multiple of 128)."
                   if abs(_server_formula - _formula(mini_info["block_size"])) < 1e-9 else
                   f": the server's larger blocks leave more of each shared prefix to recompute "
                   f"({shared_prefix_tokens - _reusable} of {shared_prefix_tokens} tokens here)."
                   if server_block > mini_info["block_size"] else
                   f": the server's smaller blocks reuse more of each shared prefix "
                   f"({_reusable} of {shared_prefix_tokens} tokens here)."))
        _parts.append(
            "With a reset before every request no reply reported a cached token: \"off\" really "
            "found nothing." if server_leaked == 0 else
            f"With a reset before every request, {server_leaked} of {len(server_requests)} replies still "
            f"reported cached tokens: the engine refuses to empty its cache while other requests hold "
            f"blocks (this server is shared with other clients), so those resets did not take "
            f"effect; those requests are left out of the comparison.")
        if server_hit_requests:
            _parts.append(
                f"{len(server_hit_requests)} request{'s' if len(server_hit_requests) != 1 else ''} "
                "hit with the cache and found nothing without it; "
                f"with the cache their median TTFT was **{server_ttft_ratio:.2f}x** what it was without"
                + (", a clear gain even on this CPU." if server_ttft_ratio < 0.7 else
                   f", a modest gain: at a few hundred tokens the server's prefill on this machine is "
                   "short next to the rest of a request's path to its first token."
                   if server_ttft_ratio < 0.95
                   else ": no measurable gain here; at this prompt length prefill is a small part of "
                   "the time to the first token on this machine."))
            if server_block:
                _parts.append(
                    f"The share of the prompt skipped bounds the gain: if TTFT were all prefill, a "
                    f"request that hits would take about {1 - _reusable / server_mean_prompt:.2f}x.")
        else:
            _parts.append("No request hit with the cache on and missed with it off, so there is no "
                          "TTFT comparison in this run (is the shared prefix shorter than one block?).")
        server_cache_text = ui.md(" ".join(_parts))
    else:
        server_cache_text = ui.md("")
    server_cache_text
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## 6. What the real engines do

    * **vLLM: automatic prefix caching** (on by default in the V1 engine; `--enable-prefix-caching`
      / `--no-enable-prefix-caching`). Each full block is identified by a hash of its parent
      block's hash, its tokens and any extra keys (LoRA adapter, multimodal inputs, a per-request
      `cache_salt`); the hash function is chosen by `--prefix-caching-hash-algo` (what the server
      above uses is printed after this list). Blocks no request holds stay
      in a free queue in least-recently-used order and are evicted from its front when a new
      block is needed, so, as in our hash cache, any single idle block can go; a finished
      request's blocks enter that queue tail first, so its deepest blocks are evicted first
      (`free` in `vllm/v1/core/single_type_kv_cache_manager.py`). Only full blocks are cached.
      Design doc: [Automatic Prefix Caching](https://docs.vllm.ai/en/latest/design/prefix_caching.html).
      `POST /reset_prefix_cache` (used above) empties it, and refuses (returns false) while any
      request still holds blocks (`BlockPool.reset_prefix_cache` in `vllm/v1/core/block_pool.py`);
      source references are to vLLM 0.32 as installed with this course.
    * **SGLang: RadixAttention** ([Zheng et al. 2023, arXiv:2312.07104](https://arxiv.org/abs/2312.07104)).
      The KV cache is indexed by a radix tree over token sequences, with LRU eviction of leaves
      and a cache-aware scheduler that serves requests sharing long prefixes together; on by
      default, `--disable-radix-cache` turns it off. Its default page size of 1 lets a match end
      at any token; larger `--page-size` values round matches to pages, as blocks do here.
    * **Hit rate in tokens.** vLLM exports `vllm:prefix_cache_queries` and
      `vllm:prefix_cache_hits` (prompt tokens looked up / found), the counters read in this
      notebook; the teaching engine and the reference server export the same names
      (`reference_server/prometheus.py`). SGLang reports a running cache hit rate instead.
    * **Cascade attention.** vLLM's V1 engine had it in its FlashAttention backend (GPU): a
      batch whose requests shared a common prefix of at least 256 tokens, with at least 8
      requests, attended to that prefix once, when a rough cost model against FlashDecoding
      agreed (`use_cascade_attention` in `vllm/v1/attention/backends/flash_attn.py`): two
      FlashAttention calls, each returning its log-sum-exp, merged by `merge_attn_states`, the
      teaching engine's SDPA form. By 0.32,
      the version installed here, it is gone: `--disable-cascade-attn` is kept as a deprecated
      flag that "has no effect since cascade attention has been removed"
      (`vllm/engine/arg_utils.py`). FlashInfer keeps a multi-level form
      (`MultiLevelCascadeAttentionWrapper`: a system prompt shared by all, a conversation shared
      by its branches, each branch's own tail), and Hydragen
      ([Juravsky et al. 2024, arXiv:2402.05099](https://arxiv.org/abs/2402.05099)) studies the
      same decomposition for large batches on one prompt; FlashInfer's `merge_state` is the
      merge above. The teaching engine's is one level.
    """)
    return


@app.cell
def _(session, ui):
    from workshop import kvcache

    vllm_cache_config = kvcache.engine_cache_config(session.metrics_text())
    ui.md(
        "The shared server's own `vllm:cache_config_info` (read now from its `/metrics`): "
        + ", ".join(f"`{k}` = `{vllm_cache_config[k]}`" for k in
                    ("enable_prefix_caching", "prefix_caching_hash_algo", "block_size",
                     "num_gpu_blocks") if k in vllm_cache_config)
        + "." if vllm_cache_config else
        f"This server publishes no `vllm:cache_config_info` (it runs `{session.engine}`, not vLLM)."
    )
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ### What this run showed
    """)
    return


@app.cell
def _(
    cascade_P,
    cascade_seqs,
    cascade_speedup,
    formula_hit_rate,
    kinds_same_tokens,
    measured_hit_rate,
    pool_rows,
    server_hit_requests,
    server_name,
    server_rows,
    server_ttft_ratio,
    ttft_gain_shared,
    ui,
):
    _pool_h = {r["pool (blocks)"]: r["hit rate"] for r in pool_rows if r["cache"] == "hash"}
    ui.md(
        f"* **The hit rate is arithmetic.** Shared tokens rounded down to whole blocks, over all "
        f"prompt tokens: the formula gave {formula_hit_rate:.3f}, the hash server's counters "
        f"{measured_hit_rate:.3f}"
        + (f", the course's server's replies ({server_name}) {server_rows[1]['hit rate (usage)']:.3f}"
           if server_rows and server_rows[1]["hit rate (usage)"] is not None else "") + ".\n"
        f"* **Hash vs radix** found "
        + ("the same tokens" if kinds_same_tokens else "different numbers of tokens")
        + f" on the shared-prefix workload with a pool large enough; as the pool shrank, the "
          f"replay's hit rate fell from "
        f"{_pool_h[max(_pool_h)]:.1%} ({max(_pool_h)} blocks) to {_pool_h[min(_pool_h)]:.1%} "
        f"({min(_pool_h)} blocks) for the hash cache.\n"
        f"* **What a hit saves** is the prefill of the skipped tokens: on this machine the teaching "
        f"engine's median TTFT was {ttft_gain_shared:.1f}x lower with the hash cache than without on "
        f"the shared-prefix workload"
        + (f", and the course's server's ({server_name}) {1 / server_ttft_ratio:.1f}x lower for requests "
           "that hit"
           if server_hit_requests else "")
        + ". The gain grows with the share of the prompt that is shared and with the cost of "
          "prefill (longer prompts, larger models).\n"
        f"* **After the hit**, decode still read the shared keys once per sequence; reading them "
        f"once per batch (cascade attention) ran one step's attention "
        f"{cascade_speedup:.2f}x as fast at {cascade_seqs.value} sequences x {cascade_P} shared keys "
        f"on this machine."
    )
    return


if __name__ == "__main__":
    app.run()
