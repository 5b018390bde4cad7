# %% [markdown]
# # 10 · The showdown: every engine, the same workloads, each pushed to its knee
#
# [![Open in Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/{{github_repo}}/blob/main/notebooks/10_engine_showdown.ipynb)
# [![Open in molab](https://marimo.io/molab-shield.svg)](https://molab.marimo.io/github/{{github_repo}}/blob/main/notebooks/10_engine_showdown.py)
#
# Notebooks 1 to 9 took an engine apart one mechanism at a time. This one runs whole engines
# side by side, as you would before choosing one: the same model, the same requests, the same
# client, one engine on the machine at a time.
#
# | contender | what it is |
# |---|---|
# | **vLLM**, **SGLang** | their CPU builds behind the course's reference server (SGLang from its own environment: README, SGLang section) |
# | **mini-hash**, **mini-radix** | the course's teaching engine, with hash-chained prefix blocks (vLLM's design) or a radix tree (SGLang's), all else equal |
# | **hf** | Hugging Face `transformers`, one request at a time, no prefix cache: the floor |
#
# On a GPU the field is vLLM and SGLang, each at its defaults and "tuned" with the flags their
# documentation points to for these workloads.
#
# | workload | what it sends |
# |---|---|
# | **ShareGPT** | real first turns of chats, independent of each other |
# | **agentic** | agents behind one long system prompt with tool schemas, resending their growing history every turn, forking sub-agents |
# | **shared-prefix** | groups of users behind the same system prompt |
#
# Each engine is swept to its **knee**, the highest load it keeps up with, as `workshop bench
# sweep` does (`docs/benchmarking.md`):
#
# 1. a **synchronous probe**, one request at a time: the unloaded speed;
# 2. a **throughput probe**, many requests at once: the most the engine can do;
# 3. **open-loop points**, Poisson arrivals from the synchronous rate to 1.5x the maximum. A
#    point keeps up when, over its steady window, the engine completes what arrives and
#    neither its queue, its requests in flight nor its time to first token (TTFT) grow. The
#    knee is the last point that keeps up and meets the objectives (p99 TTFT and p99
#    inter-token latency, ITL).
#
# The results go to a folder under `results/` that notebook 11 turns into a decision chart.
# The same run, larger, is one command: `python benchmarks/showdown.py`.

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
# ## 1. The field on this machine
#
# Which contenders this machine can run, and with which server arguments. SGLang appears only
# where its environment is installed (`bash scripts/setup.sh --with-sglang`). Engines already
# running are used as they are; the others are started here one at a time and stopped after
# their runs.

# %%
import os

from workshop import decision, ui
from workshop.bench import showdown

running_servers = {session.engine: session}
if os.environ.get("WORKSHOP_HF_BASE_URL"):
    running_servers["hf"] = workshop.session.connect("hf", verbose=False)
field_all = showdown.default_field(running=running_servers)
ui.table([{"label": c.label, "engine": c.engine, "server args": " ".join(c.server_args) or "(defaults)",
           "server": "already running" if c.label in running_servers else "started here",
           "note": c.note} for c in field_all])

# %% [markdown]
# Pick the contenders, the plan and the objectives.
#
# | plan | workloads | requests per point | load points | contenders by default | time here |
# |---|---|---|---|---|---|
# | **quick** (CI) | shared-prefix | 4 | 2 | the two teaching engines and the engine already running | a few minutes |
# | **full** (`benchmarks/showdown.py`) | all three | 24 (agentic: 20 sessions of 6) | 3 | all | vLLM 27 min, SGLang 64, each teaching engine 23, hf 32 (2 AVX2 cores, 2026-12-03) |
#
# Four requests per point are too few to judge a knee: section 5 draws such points hollow,
# and the comparisons fall back to each engine's capacity and its lightest load. The full run
# above is committed as `benchmarks/reference_results/showdown-cpu/`.
#
# The **objectives** are yours to state. Left at 0, an objective is derived from the run (the
# factor below times the best unloaded latency, section 4). In Jupyter, re-run the cells below
# after changing a control; marimo re-runs them.

# %%
# Quick mode (CI) runs the two teaching-engine contenders, which start in seconds, and the
# engine already up (not the baseline): starting vLLM or SGLang afresh takes a minute or more
# each, and the baseline, one request at a time, is the slowest to sweep. vLLM was left out
# while it emulated bf16 on CI's 2 AVX2 cores (its quick sweep alone took five minutes); in
# float32 its quick sweep took 22 s there, and the whole notebook 149 s with it and without
# it (2026-12-02, the machine shared with other jobs).
_quick_field = [c.label for c in field_all
                if c.engine == "mini" or (c.label in running_servers and c.engine != "hf")]
engines_text = ui.text(",".join(workshop.session.sweep([c.label for c in field_all], _quick_field)),
                       "contenders (comma-separated labels from the table)")
plan_choice = ui.dropdown(["quick", "full"], workshop.session.sweep("full", "quick"), "plan")
slo_ttft = ui.slider(0, 10000, 0, 1, "objective: p99 TTFT (ms; 0: derive it from the run)")
slo_itl = ui.slider(0, 2000, 0, 1, "objective: p99 ITL (ms; 0: derive it from the run)")
slo_factor = ui.slider(1.5, 10, showdown.Plan().slo_factor, 0.5,
                       "a derived objective: x the best unloaded latency")
ui.md("Set the contenders, the plan and the objectives:")

# %%
engines_text

# %%
plan_choice

# %%
slo_ttft

# %%
slo_itl

# %%
slo_factor

# %%
from dataclasses import replace

_known = showdown.known_contenders()
chosen = [_known[x.strip()] for x in engines_text.value.split(",") if x.strip() in _known]
plan = replace(showdown.Plan.quick() if plan_choice.value == "quick" else showdown.Plan.full(),
               slo_ttft_ms=float(slo_ttft.value) or None, slo_itl_ms=float(slo_itl.value) or None,
               slo_factor=float(slo_factor.value))
contenders = showdown.with_servers(chosen, running_servers)
_objective = {key: f"p99 {name} ≤ {getattr(plan, 'slo_' + key):.0f} ms" if getattr(plan, "slo_" + key)
              else f"p99 {name} derived from the run" for key, name in showdown.OBJECTIVES}
ui.md(f"**{len(contenders)} contenders** ({', '.join(c.label for c in contenders)}) x "
      f"**{len(plan.workloads)} workloads** ({', '.join(plan.workloads)}), the {plan_choice.value} plan; "
      f"objectives: {', '.join(_objective.values())}.")

# %% [markdown]
# ## 2. The workloads, before any engine sees them
#
# Computed from the requests themselves. **Prefix reuse** is the fraction of prompt tokens a
# perfect, unbounded prefix cache could skip, because an earlier request (its prompt or its
# answer) began the same way: the ceiling of every engine's cache hit rate below.

# %%
from workshop.bench.tokenizer import Tokenizer
from workshop.bench.workloads import build_workload, describe, prefix_reuse_ratio
from workshop.bench.workloads import plan as planned_requests

_tok = Tokenizer.load(session.model)
workload_rows = []
workload_sequences = {}   # workload -> (prompt ids, reply ids) of each request, in send order
for _w in plan.workloads:
    _wl = build_workload(_w, _tok, num_requests=plan.num_requests, seed=plan.seed, **plan.kwargs_for(_w))
    _d = describe(_wl)
    workload_sequences[_w] = [(_tok.prompt_ids(_s.request), _tok.encode(_s.reply))
                              for _s in planned_requests(_wl)]
    workload_rows.append({"workload": _w, "sessions": _d["sessions"], "requests": _d.get("requests"),
                          "mean prompt (tok)": _d["prompt_tokens_mean"],
                          "mean output (tok)": _d["output_tokens_mean"],
                          "prefix reuse": _d.get("prefix_reuse_ratio")})
ui.table(workload_rows)

# %%
_most = max(workload_rows, key=lambda r: r["prefix reuse"] or 0)
ui.md(f"**On {_most['workload']}, a perfect cache could skip {_most['prefix reuse']:.0%} of the "
      f"prompt tokens** ({_most['prefix reuse'] * _most['mean prompt (tok)']:.0f} of "
      f"{_most['mean prompt (tok)']:.0f} per request on average).")

# %% [markdown]
# **Exercise 1 (predict, then measure).** The two teaching-engine contenders differ only
# in how they find a cached prefix: hashed blocks or a radix tree. On the **shared-prefix**
# workload, what will the radix engine's **capacity** (the most output tokens/s it delivers at
# any load tried, its throughput probe included, objectives aside) be, as a multiple of the
# hash engine's? (1.0 = the same.) Write it, run the showdown; section 6 compares.

# %%
predict_radix_over_hash = None   # your prediction: radix capacity / hash capacity, e.g. 1.0

# %% [markdown]
# ## 3. Run it
#
# Every contender in turn: start (unless already running), check its answers, sweep every
# workload, stop. The prefix cache is emptied before each load point, so no point profits from
# the one before. After each contender a line says where its knee is and why.
#
# **Answers first.** A benchmark counts tokens, not whether they are right: a layer computed
# wrongly costs the same FLOPs, so a broken configuration can top the table. Before its sweep,
# each contender answers a fixed set of chat prompts greedily (short prompts sent three times,
# so the repeats come from the prefix cache; questions behind one long system prompt; ShareGPT
# first turns), compared token by token with Hugging Face `transformers` in float32 on the
# same checkpoint (`workshop bench verify`). A contender that answers wrongly is recorded and
# not swept.

# %%
showdown_root = showdown.new_root()
showdown.run_showdown(showdown_root, contenders, plan, model=session.model, mode=plan_choice.value,
                      command="notebook 10")
showdown_results = decision.load(showdown_root)
showdown_sweeps = showdown_results.sweeps()
ui.md(f"Results in `{showdown_root}`; notebook 11 draws the decision chart from this folder.")

# %% [markdown]
# What ran, and whether it answered right: each contender's configuration as its server
# reported it (`/server_info`), next to the gate's verdict. Every number below belongs to a
# row of this table.

# %%
ui.table(decision.setup_rows(showdown_results))

# %% [markdown]
# Where an answer departed from the reference. Two correct engines that add the same numbers
# in another order (bf16 rounding, another kernel) can flip a **near tie**: a token the
# reference scored within the gate's margin (in logits) of its own choice. A departure far
# below the reference's choice is **wrong**.

# %%
from workshop.bench import verify

departure_rows = [{"engine": _e, "prompt": _c["kind"] + (f" (repeat {_c['repeat']})" if _c["repeat"] else ""),
                   "question": _c["question"][:50], "verdict": _c["verdict"], "at token": _c["departed_at"],
                   "gap (logits)": _c["gap"], "reference's top two": " / ".join(map(repr, _c["reference_top2"])),
                   "got": (_c["got"] or "")[:60]}
                  for _e in showdown_results.engines
                  for _c in ((showdown_results.first_run(_e).gate or {}).get("checks") or [])
                  if _c["verdict"] not in ("agree",)]
ui.table(departure_rows, floatfmt=".3f") if departure_rows else ui.md(
    "Every answer of every contender matched the reference token for token.")

# %% [markdown]
# Why the margin matters: the reference's own scores for the first token of its answer to
# "What is the capital of France?", computed here.

# %%
from reference_server.models import resolve_model

_ref = verify.reference_for(resolve_model(session.model, prepare=False).path)
_ids, _logits = _ref.generate((("user", "What is the capital of France?"),), 8)
_top = _logits[0].topk(3)
first_token_gap = float(_top.values[0] - _top.values[1])
reference_answer = _ref.text(_ids)
ui.table([{"rank": _i + 1, "token": repr(_ref.tok.decode([_t])), "logit": _v}
          for _i, (_t, _v) in enumerate(zip(_top.indices.tolist(), _top.values.tolist()))], floatfmt=".3f")

# %%
ui.md(f"The reference answers {reference_answer!r}; its top two first tokens are "
      f"**{first_token_gap:.3f} logits** apart, against the gate's margin of {verify.TIE_MARGIN:g}: "
      + ("**a near tie**: an engine in another dtype may begin with the second token and still be "
         "right, and a check that only looked for the reference's words would fail it."
         if first_token_gap <= verify.TIE_MARGIN else
         "**a clear choice**: an engine that begins otherwise is wrong."))

# %% [markdown]
# ## 4. The objectives
#
# Each engine's **unloaded** latency: the p99 TTFT and p99 ITL of its synchronous probe, one
# request at a time, on each workload.

# %%
unloaded_rows = showdown.unloaded_latency(showdown_sweeps)
ui.table([{"workload": _r["workload"], "engine": _r["engine"], "unloaded p99 TTFT (ms)": _r["ttft_ms"],
           "unloaded p99 ITL (ms)": _r["itl_ms"]} for _r in unloaded_rows], floatfmt=",.0f")

# %% [markdown]
# An objective you did not state is derived from that table, times the factor you set:
#
# * **TTFT**: the unloaded p99 TTFT;
# * **ITL**: the unloaded p99 ITL **plus** the p99 TTFT. A continuous batcher prefills a
#   newcomer's prompt in the same step as everybody's next token, so under any load the
#   longest gap of an answer is about one decode step plus one prefill.
#
# On each workload take the best (lowest) engine's value, then the highest over the
# workloads. Computed here, next to what the run recorded in `showdown.json` (which judged
# every knee below):

# %%
derived_here = {}
for _key, _terms in showdown.DERIVED_FROM.items():   # ttft_ms: (ttft_ms,); itl_ms: (itl_ms, ttft_ms)
    _best = {}
    for _r in unloaded_rows:
        if all(_r[_t] is not None for _t in _terms):
            _best[_r["workload"]] = min(_best.get(_r["workload"], float("inf")), sum(_r[_t] for _t in _terms))
    derived_here[_key] = plan.slo_factor * max(_best.values()) if _best else None
objectives_used = showdown_results.newest.manifest["slo"]
ui.table([{"objective": f"p99 {_name} (ms)",
           "derived here": derived_here[_key],
           "used by the run": objectives_used[_key],
           "how": "stated" if objectives_used["how"][_key].get("stated") else "derived"}
          for _key, _name in showdown.OBJECTIVES], floatfmt=",.0f")

# %%
ui.md(f"Objectives of this run: {showdown_results.newest.objectives}.")

# %% [markdown]
# ## 5. The curves
#
# Top row: throughput achieved against load offered, in requests/s over each point's steady
# window. On the dashed line an engine keeps up; where its curve bends away it saturates. A
# star is a knee; a hollow point held too few requests to judge. Bottom row: p99 TTFT against
# load (log scale), the objective dotted: queueing shows here before throughput flattens.

# %%
from workshop.bench.plots import plot_showdown

plot_showdown(showdown_sweeps, "ttft_ms")

# %% [markdown]
# The same loads against p99 ITL, how smoothly an answer scrolls once it started. A bigger
# batch makes every step slower, so ITL grows with load even while throughput still rises.

# %%
plot_showdown(showdown_sweeps, "itl_ms")

# %%
ttft_growth = [{"workload": _w, "engine": _e,
                "p99 TTFT, lightest load (ms)": _sw.points[0].summary["ttft_ms"]["p99"],
                "p99 TTFT, heaviest load (ms)": _sw.points[-1].summary["ttft_ms"]["p99"]}
               for _w, _per in showdown_sweeps.items() for _e, _sw in _per.items() if _sw.points]
_g = max(ttft_growth, key=lambda r: r["p99 TTFT, heaviest load (ms)"] / r["p99 TTFT, lightest load (ms)"],
         default=None)
ui.md(f"**From its lightest load to its heaviest, {_g['engine']}'s p99 TTFT on {_g['workload']} grew "
      f"{_g['p99 TTFT, heaviest load (ms)'] / _g['p99 TTFT, lightest load (ms)']:.1f}x** "
      f"({_g['p99 TTFT, lightest load (ms)']:,.0f} to {_g['p99 TTFT, heaviest load (ms)']:,.0f} ms), "
      "the most of any engine here." if _g else "No engine completed a load point in this run.")

# %% [markdown]
# ## 6. At the knee
#
# One row per engine and workload, read at its knee: the load it sustained, output tokens/s,
# latency percentiles, **goodput** (requests/s that met both objectives), the server's prefix
# hit rate and peak KV use; and, knee or not, its **capacity**: the most output tokens/s at
# any load tried (throughput probe included), objectives aside. The rules are in
# `workshop/decision.py`'s docstring; notebook 11 charts the same rows.
#
# Three exercises read this table: the cell below computes it, and it is shown after them.

# %%
knee_rows = decision.knee_table(showdown_results)


def row_of(workload, engine):
    """The row of ``engine`` on ``workload`` (None when it did not run there)."""
    return next((r for r in knee_rows if r["workload"] == workload and r["engine"] == engine), None)


def capacity_of(workload, engine):
    """The most output tok/s ``engine`` delivered on ``workload`` at any load tried."""
    r = row_of(workload, engine)
    return r["capacity_tps"] if r else None


def hit_rate_of(workload, engine):
    """The mean prefix hit rate ``engine``'s server reported over its load points (None: none)."""
    r = row_of(workload, engine)
    rates = [p["prefix_hit_rate"] for p in (r["points"] if r else []) if p["prefix_hit_rate"] is not None]
    return sum(rates) / len(rates) if rates else None


ui.md(f"{len(knee_rows)} rows computed.")

# %%
_r = capacity_of("shared-prefix", "mini-radix")
_h = capacity_of("shared-prefix", "mini-hash")
radix_over_hash = _r / _h if _r and _h else None
(ui.compare(predict_radix_over_hash, radix_over_hash, "radix / hash capacity (output tok/s), shared-prefix")
 if radix_over_hash else ui.md("Exercise 1 needs both teaching-engine contenders to finish the shared-prefix "
                               "workload (see the notes in the table)."))

# %%
# Worked answer to Exercise 1, collapsed until opened
_prompt = next((r["mean prompt (tok)"] for r in workload_rows if r["workload"] == "shared-prefix"), None)
_output = next((r["mean output (tok)"] for r in workload_rows if r["workload"] == "shared-prefix"), None)
_cache_rows = [{"engine": _e, "prefix hit rate": hit_rate_of("shared-prefix", _e),
                "prompt tokens computed per request": _prompt * (1 - (hit_rate_of("shared-prefix", _e) or 0)),
                "one-at-a-time tok/s": row_of("shared-prefix", _e)["synchronous_tps"],
                "capacity tok/s": capacity_of("shared-prefix", _e),
                "capacity at": row_of("shared-prefix", _e)["capacity_at"]}
               for _e in ("mini-hash", "mini-radix")] if radix_over_hash else []
# Work per request: the prompt tokens the cache did not skip, plus the output tokens.
expected_radix_over_hash = ((_cache_rows[0]["prompt tokens computed per request"] + _output)
                            / (_cache_rows[1]["prompt tokens computed per request"] + _output)
                            if _cache_rows else None)
_sync_ratio = (_cache_rows[1]["one-at-a-time tok/s"] / _cache_rows[0]["one-at-a-time tok/s"]
               if _cache_rows and all(r["one-at-a-time tok/s"] for r in _cache_rows) else None)
_off = radix_over_hash and abs(radix_over_hash / expected_radix_over_hash - 1) >= decision.TIE_WITHIN
ui.worked_answer(
    "Our radix tree matches **whole blocks**, like the hash chain (notebook 8), so on the same "
    "requests both find the same cached tokens, and both engines run the same model code. "
    "Capacity is output tokens per second of work, and the work per request is the prompt "
    "tokens the cache did not skip plus the output tokens:\n\n"
    + ui.markdown_table(_cache_rows, floatfmt=".3g")
    + f"\n\nExpected: ({_cache_rows[0]['prompt tokens computed per request']:.0f} + {_output:.0f}) / "
      f"({_cache_rows[1]['prompt tokens computed per request']:.0f} + {_output:.0f}) = "
      f"**{expected_radix_over_hash:.2f}** (hash's work over radix's). Measured: "
      f"**{radix_over_hash:.2f}**. "
    + (f"Outside the {decision.TIE_WITHIN:.0%} tie band around the expected ratio: the cached "
       "tokens do not account for this gap. "
       + (f"One at a time, where the two run the same code on the same cached tokens, the radix "
          f"engine delivered {_sync_ratio:.2f}x the hash engine's tok/s"
          + (": the machine was not the same for the two runs, so this run "
             "cannot rank the cache designs. " if abs(_sync_ratio - 1) >= decision.TIE_WITHIN else ". ")
          if _sync_ratio else "")
       + f"Each capacity above is the best of one throughput probe and {plan.sweep_points} load "
       f"points of {plan.num_requests} requests each"
       + (": the quick plan's, too few to read a winner into." if plan_choice.value == "quick" else ".")
       if _off else
       f"Inside the {decision.TIE_WITHIN:.0%} tie band, as the mechanism predicts: the lookup and "
       "eviction cost little next to a model step. SGLang's own tree matches token by token "
       "(page size 1), which is where a radix cache can find more than whole blocks.")
    if radix_over_hash else "Both teaching-engine contenders must finish the shared-prefix workload.")

# %% [markdown]
# **Exercise 2 (predict, then measure).** Every sweep starts with a synchronous probe, one
# request at a time, which is how the baseline always serves. On the **shared-prefix**
# workload, how many times its own one-at-a-time output tokens/s will the contender with the
# most capacity deliver at its capacity? That ratio is what batching buys it here.

# %%
predict_batching_gain = None   # your prediction: capacity / one-at-a-time output tok/s, e.g. 4

# %%
batching_rows = {r["engine"]: r for r in knee_rows
         if r["workload"] == "shared-prefix" and r["capacity_tps"] and r["synchronous_tps"]}
best_engine = max(batching_rows, key=lambda e: batching_rows[e]["capacity_tps"]) if batching_rows else None
batching_gain = (batching_rows[best_engine]["capacity_tps"] / batching_rows[best_engine]["synchronous_tps"]
                 if best_engine else None)
(ui.compare(predict_batching_gain, batching_gain,
            f"{best_engine}'s capacity / its one-at-a-time output tok/s, shared-prefix")
 if batching_gain else ui.md("Exercise 2 needs a contender that finished the shared-prefix workload "
                             "with its synchronous probe."))

# %%
# Worked answer to Exercise 2, collapsed until opened
# Requests in flight (the client's mean) where the capacity was reached: the throughput probe
# or the open-loop point that delivered the most.
_best_row = batching_rows.get(best_engine)
_sweep = showdown_sweeps["shared-prefix"][best_engine] if best_engine else None
_at_probe = bool(_best_row) and _best_row["capacity_at"] == "throughput probe"
_at_point = next((_sweep.points[_i] for _i, _p in enumerate(_best_row["points"])
                  if _p["output_tps"] == _best_row["capacity_tps"]), None) if _best_row and not _at_probe else None
_at = _sweep.probes["throughput"] if _at_probe else _at_point
batching_in_flight = (_at.summary.get("mean_concurrency") if _at is not None else None)
ui.worked_answer(
    "One at a time, every decode step serves one sequence. A batcher serves every request in "
    "flight in one step, and a decode step reads all the weights once whatever the batch "
    "(notebook 3). If a step of N sequences cost what a step of one costs, batching would buy "
    f"N. At its capacity ({_best_row['capacity_at']}) {best_engine} had **{batching_in_flight:.1f} "
    f"requests in flight** on average: expected **at most {batching_in_flight:.1f}x**.\n\n"
    f"Measured: {_best_row['synchronous_tps']:.1f} tok/s one at a time, "
    f"{_best_row['capacity_tps']:.1f} tok/s at capacity, **{batching_gain:.2f}x**. "
    + (f"So a step of {batching_in_flight:.1f} sequences took about "
       f"{batching_in_flight / batching_gain:.2f}x as long as a step of one: on a CPU the "
       "matmuls' arithmetic grows with the batch, and each newcomer's prefill joins a step."
       if batching_gain <= batching_in_flight else
       "More than the requests in flight: each request's own work was cheaper under load than "
       "alone, which one step per batch does not explain.")
    if batching_gain and batching_in_flight else
    "Needs a contender with a capacity and a synchronous probe on shared-prefix.")

# %% [markdown]
# **Exercise 3 (predict, then measure).** The workload table in section 2 gives the most any
# cache could skip on **shared-prefix**. What hit rate will the engine you connected to in the
# first cell report there, at its knee (or, without one, at its lightest load)? If that engine
# is not among the contenders, the question is about the first contender. Its block size is in
# section 3's table.

# %%
predict_hit_rate = None   # your prediction, 0-1, e.g. 0.4

# %%
# The contender running the connected engine (for the teaching engine: its first label, hash),
# else the first contender.
hit_label = next((c.label for c in contenders if c.engine == session.engine),
                 contenders[0].label if contenders else None)
_row = row_of("shared-prefix", hit_label) if hit_label else None
hit_at, hit_measured = None, None
if _row and _row["points"]:
    hit_at, hit_measured = (("its knee", _row["prefix_hit_rate"]) if not _row["no_knee"] else
                            (f"its lightest load ({_row['points'][0]['offered']:.3g} req/s; no knee)",
                             _row["points"][0]["prefix_hit_rate"]))
(ui.compare(predict_hit_rate, hit_measured, f"{hit_label} prefix hit rate at {hit_at}, shared-prefix")
 if hit_at and hit_measured is not None else
 ui.md(f"{hit_label or session.engine_name} reported no prefix-cache hit rate on the shared-prefix workload "
       "in this run (no cache, or not in the run)."))

# %%
# Worked answer to Exercise 3, collapsed until opened
from workshop import sanity

_seqs = workload_sequences.get("shared-prefix") or []
hit_block = ((showdown_results.first_run(hit_label).server_info.get("block_size") or 1)
             if hit_label in showdown_results.engines else 1)
reuse_tokens = prefix_reuse_ratio(_seqs)
reuse_blocks = prefix_reuse_ratio(_seqs, block=hit_block)
hit_violations = (sanity.within(f"{hit_label}'s prefix hit rate", hit_measured, reuse_tokens, "",
                                "above the workload's prefix reuse", ("count", "cache"))
                  if hit_measured is not None else [])
_prompts = sum(len(_p) for _p, _ in _seqs)
_gap = (reuse_blocks - hit_measured) * _prompts if hit_measured is not None else 0
ui.md(sanity.report(hit_violations)) if hit_violations else ui.worked_answer(
    f"The workload's prefix reuse (the ceiling) was **{reuse_tokens:.3f}**: a cache skips at most "
    f"that share of the prompt tokens, and only if it matches token by token. {hit_label} stores whole blocks of "
    f"**{hit_block} tokens**, so of each request's shared prefix it finds only the whole blocks: "
    f"the part past the last block boundary is computed again. Over this workload's "
    f"{len(_seqs)} requests ({_prompts:,} prompt tokens) that is **{reuse_blocks:.3f}** "
    f"(`prefix_reuse_ratio(..., block={hit_block})`). Measured at {hit_at}: **{hit_measured:.3f}**. "
    + ("The engine found every whole block it could."
       if abs(_gap) < 1 else
       f"{_gap:,.0f} prompt tokens fewer than whole blocks allow: requests that arrived while an "
       "earlier one with the same prefix was still being prefilled found its blocks not yet "
       "written, and computed them too." if _gap > 0 else
       f"{-_gap:,.0f} prompt tokens more than whole blocks allow: the server counts something "
       "other than this workload's prompts in its hit rate.")
    if hit_measured is not None else f"{hit_label} reported no hit rate.")

# %% [markdown]
# The whole table:

# %%
ui.table(decision.display_rows(knee_rows))

# %%
_tops = []
for _w in dict.fromkeys(r["workload"] for r in knee_rows):
    _by = sorted([r for r in knee_rows if r["workload"] == _w and r["capacity_tps"]], key=lambda r: -r["capacity_tps"])
    if _by:
        _tops.append(f"{_w}: {_by[0]['engine']}, {_by[0]['capacity_tps']:.0f} tok/s"
                     + (f", {_by[0]['capacity_tps'] / _by[1]['capacity_tps']:.2f}x {_by[1]['engine']}"
                        if len(_by) > 1 else ""))
ui.md("**The most capacity** (output tok/s at any load tried): " + "; ".join(_tops) + "."
      if _tops else "No engine delivered any output in this run.")

# %% [markdown]
# ## 7. What this run shows, and what it does not
#
# Each workload's throughput verdict, from the table above (margins under 10 % are ties:
# `decision.TIE_WITHIN`). Where no contender kept up within the objectives at any load, the
# verdict ranks **capacity alone** and says so.

# %%
run_verdicts = [decision.decide(knee_rows, _w, "throughput") for _w in dict.fromkeys(r["workload"] for r in knee_rows)]
ui.table([{_k: _row[_k] for _k in ("workload", "result", "values", "measured", "left out")}
          for _row in decision.verdict_rows(run_verdicts)]) if run_verdicts else ui.md(
    "No contender finished a sweep in this run.")

# %%
_wins = [v for v in run_verdicts if v.outcome == "win"]
ui.md(("**" + "; ".join(f"{v.workload}: {v.winner}, {v.margin_text} {v.runner_up}"
                        + (" (capacity, objectives ignored)" if v.ignores_objectives else "")
                        for v in _wins) + ".**")
      if _wins else "**No workload has a winner in this run**: "
      + "; ".join(f"on {v.workload}, {len(v.excluded)} of {len(v.excluded) + len(v.values)} "
                  "contenders left out" + (f", a tie between {', '.join(v.tied)}" if v.tied else "")
                  for v in run_verdicts) + " (the table says why).")

# %% [markdown]
# What it does **not** show. This is a 135M-parameter model on a laptop-class CPU; an H100
# serving an 8B or 70B model differs in ways that change the ranking:
#
# * **Kernels.** Here each engine runs its CPU kernels (vLLM's and SGLang's CPU attention,
#   oneDNN matmuls; the teaching engine's plain PyTorch). On a GPU both production engines run
#   FlashAttention/FlashInfer-class kernels and CUDA graphs, and the per-step overheads that
#   dominate a tiny model here shrink next to a big one's matmuls. A speed difference here
#   mostly says how good each CPU path is.
# * **What carries over** is mechanism: batching against one at a time (the baseline's gap
#   grows with model size), whether a prefix cache finds the shared prompt (a property of the
#   workload and the cache design, not of the hardware), and how queues build past the knee.
# * **A shared machine.** Two cores shared with the client: a point can fall behind because
#   the client was late (the sweep flags such points as client-limited and retries them once).
#   Run the full plan on a quiet machine before you believe a difference under about 10 %.

# %% [markdown]
# ## 8. Inside the teaching engine: what each speed switch buys here
#
# A speed difference on a CPU mostly measures how good each engine's CPU path is (section 7).
# For one engine you can take that path apart: the teaching engine keeps a switch for each
# technique that made it faster, the same flags its server takes.
#
# | switch | what it turns off |
# |---|---|
# | `--no-prepack` | weights reordered once into oneDNN's blocked bf16/fp16 layout; left as loaded, oneDNN reorders them at every call (float32 is never packed) |
# | `--kv-read slot` | reading each sequence's keys and values block by block; they are copied token by token instead (notebook 7, section 7) |
# | `--decode-attention sdpa` | attention written out (two matmuls and a softmax) for big bf16/fp16 decode batches; PyTorch's SDPA kernel runs for every batch |
# | `--no-cascade-attention` | the batch reading the shared system prompt's keys once; each sequence reads them itself (notebook 8, section 4) |
#
# One engine per variant (the defaults, then each switch off on its own) holds the same batch:
# sequences behind one system prompt, radix cache on, so they share its blocks. The engines
# take decode steps in turn, round-robin, so a slow moment of the machine falls on all of them
# alike. The bundled model runs in this process, in the dtype the course's server computes in
# here (bf16 where the CPU has native bf16, float32 otherwise); the dropdown changes it.

# %%
switch_seqs = ui.slider(1, 16, 8, 1, "sequences decoding together")
switch_seqs

# %%
switch_shared = ui.slider(0, 1024, 640, 64, "system prompt tokens (shared)")
switch_shared

# %%
switch_own = ui.slider(16, 1024, workshop.session.sweep(256, 64), 16, "each sequence's own tokens")
switch_own

# %%
switch_rounds = ui.slider(4, 40, workshop.session.sweep(12, 6), 2,
                          "decode steps per engine (more: a narrower noise band, a longer wait)")
switch_rounds

# %%
from workshop import engine_switches

switch_device, _dtype = engine_switches.engine_dtype()
switch_dtype = ui.dropdown(["bfloat16", "float32"], _dtype,
                           "dtype" + (" (bf16 is emulated on this CPU: slower)"
                                      if switch_device == "cpu" and _dtype == "float32" else ""))
switch_dtype

# %% [markdown]
# **Exercise 4 (predict, then measure).** At the settings above, take the switch whose
# technique matters most: how many times the defaults' time will a decode step take with it
# off? Some switches change nothing for some batches or dtypes (the table says which); those
# variants run the defaults' code.

# %%
predict_worst_ratio = None      # your prediction: the slowest variant's step time / the defaults', e.g. 1.5

# %%
switch_rows, switch_step_ms = engine_switches.decode_step_rows(
    resolve_model("smollm2-135m").path, dtype=switch_dtype.value, device=switch_device,
    batch=int(switch_seqs.value), shared_tokens=int(switch_shared.value),
    own_tokens=int(switch_own.value), rounds=int(switch_rounds.value),
    progress=lambda names: ui.progress(names, title="engines"))
ui.table(switch_rows)

# %%
engine_switches.switches_figure(
    switch_rows, switch_step_ms,
    f"Decode steps of {int(switch_seqs.value)} sequences ({int(switch_shared.value)} shared + "
    f"{int(switch_own.value)} own tokens), {switch_dtype.value}, {switch_device}")

# %%
switch_applied = [r for r in switch_rows[1:] if r["applies here"]]
switch_worst = max(switch_applied, key=lambda r: r["slower than defaults"], default=None)
(ui.compare(predict_worst_ratio, switch_worst["slower than defaults"],
            f"step time without `{switch_worst['variant']}`'s technique / the defaults'", "x")
 if switch_worst else ui.md("No switch changes the code for this batch in this dtype: move the "
                            "sliders (more sequences, a longer shared prompt, or bf16)."))

# %%
# Worked answer to Exercise 4, collapsed until opened
from workshop import kvcache

# Bytes a decode step moves, by variant: every weight once (3 times without prepacking: the
# reorder reads and writes each weight before the matmul reads it), and the keys and values of
# each sequence's context (the shared prompt's once per batch with cascade attention).
_cfg = kvcache.load_model("smollm2-135m")
_dtype_bytes = 2 if switch_dtype.value == "bfloat16" else 4
_weights = _cfg.params * _dtype_bytes
_kv_token = kvcache.kv_bytes_per_token(_cfg, switch_dtype.value)
_b, _sh, _own = int(switch_seqs.value), int(switch_shared.value), int(switch_own.value) + int(switch_rounds.value) // 2
_applies = {r["variant"]: r["applies here"] for r in switch_rows}
_kv_each = _b * (_sh + _own) * _kv_token
_kv_cascade = (_sh + _b * _own) * _kv_token if _applies["--no-cascade-attention"] else _kv_each
switch_bytes = {"defaults": _weights + _kv_cascade,
                "--no-prepack": (3 if _applies["--no-prepack"] else 1) * _weights + _kv_cascade,
                "--kv-read slot": _weights + _kv_cascade,
                "--decode-attention sdpa": _weights + _kv_cascade,
                "--no-cascade-attention": _weights + _kv_each}
_byte_rows = [{"variant": r["variant"], "MB moved per step": switch_bytes[r["variant"]] / 1e6,
               "expected (bytes / defaults' bytes)": switch_bytes[r["variant"]] / switch_bytes["defaults"],
               "measured (time / defaults' time)": r["slower than defaults"]} for r in switch_rows]
switch_expected_worst = max(_byte_rows[1:], key=lambda r: r["expected (bytes / defaults' bytes)"])
_expected_worst_ratio = switch_expected_worst["expected (bytes / defaults' bytes)"]
_defaults_gbs = switch_bytes["defaults"] / (switch_rows[0]["ms per step"] / 1e3) / 1e9
ui.worked_answer(
    "Notebook 3's roofline: a decode step of a small batch is bound by memory traffic. It reads "
    "every weight once, and every sequence's keys and values. If its time were those bytes, "
    "each variant's ratio would be its bytes over the defaults' bytes. At these settings "
    f"({_weights / 1e6:,.0f} MB of {switch_dtype.value} weights, {_kv_token:,.0f} bytes of KV "
    f"per token, {_b} sequences of {_sh} shared + {_own} own tokens halfway through the timed "
    "steps):\n\n" + ui.markdown_table(_byte_rows, floatfmt=".3g")
    + f"\n\nBy bytes, **`{switch_expected_worst['variant']}`** would matter most, "
      f"**{_expected_worst_ratio:.2f}x**; `--kv-read slot` "
      "and `--decode-attention sdpa` move the same bytes as the defaults (in more, smaller "
      "copies, or through another kernel), so bytes predict 1.00x for them. "
    + (f"Measured, `{switch_worst['variant']}` mattered most, **{switch_worst['slower than defaults']:.2f}x**. "
       if switch_worst else "")
    + f"The defaults moved {switch_bytes['defaults'] / 1e9:.2f} GB in "
      f"{switch_rows[0]['ms per step']:.1f} ms, **{_defaults_gbs:.1f} GB/s**: where a measured "
      "ratio departs from the bytes, a step here is not memory traffic alone (per-call "
      "overheads of many small copies and kernels, arithmetic that grows with the batch).")

# %%
_same_code = [r for r in switch_rows[1:] if not r["applies here"]]
_noise = [r["slower than defaults"] for r in _same_code]
_slot = next(r for r in switch_rows if r["variant"] == "--kv-read slot")
_differ = ", ".join(f"`{r['variant']}`" for r in switch_applied if not r["same tokens"])
_same_names = ", ".join(f"`{r['variant']}`" for r in _same_code)
ui.md((f"**Without `{switch_worst['variant']}`'s technique a decode step took "
       f"{switch_worst['slower than defaults']:.2f}x the defaults' time**, the most of the "
       f"{len(switch_applied)} switches that change the code here." if switch_worst else
       "**No switch changes the code at these settings.**")
      + (f" The variants that ran the defaults' code ({_same_names}) "
         f"came out at {min(_noise):.2f}-{max(_noise):.2f}x: the spread of two identical engines "
         "on this machine in this run." if _same_code else "")
      + (" Slot-by-slot reads wrote the defaults' tokens exactly (checked)." if _slot["same tokens"] else
         " **Slot-by-slot reads copy the same numbers, yet their tokens differed from the defaults': "
         "a bug.**")
      + (f" Tokens differed from the defaults' for {_differ}: these sum "
         "in another order, and in bf16 a near tie can flip." if _differ else ""))

# %% [markdown]
# ## What the real engines do
#
# * **Their own benchmark clients.** vLLM ships `vllm bench serve` (datasets `sharegpt`,
#   `random`, `prefix_repetition`; `--request-rate`, `--max-concurrency`, `--goodput` with
#   SLOs) and SGLang `python -m sglang.bench_serving` (`--dataset-name sharegpt`,
#   `generated-shared-prefix`). Each engine's published comparisons are made with its own
#   client and its own workloads, which is one reason they disagree; notebook 11 cites some
#   beside yours, separately.
# * **Sweeps to a knee.** GuideLLM (`guidellm benchmark --profile sweep`) runs the same
#   three phases as this notebook: synchronous, throughput, then rates in between, and leaves
#   a warm-up and a cool-down out of each measurement.
# * **Tuning for a workload.** vLLM: `--max-num-seqs` and `--max-num-batched-tokens` (batch
#   size and prefill chunk), prefix caching on by default in its V1 engine. SGLang:
#   `--schedule-policy lpm` (serve the request with the longest cached prefix first),
#   `--chunked-prefill-size`, `--max-running-requests`. Production comparisons (e.g. the
#   engines' own release posts) report the flags they used; a comparison without them is not
#   reproducible.
# * **Switching their speed techniques off, one at a time** (section 8 did it for the teaching
#   engine). vLLM documents a flag per piece of its compilation stack, for debugging: in its
#   guide "How to debug the vLLM-torch.compile integration"
#   ([docs.vllm.ai](https://docs.vllm.ai/en/stable/design/debug_vllm_compile/)),
#   `--enforce-eager` turns off both torch.compile and CUDA graphs, `-cc.mode=0` only
#   torch.compile, `-cc.cudagraph_mode=NONE` only CUDA graphs and `-cc.backend=eager` only
#   TorchInductor; the same guide gives their roles: torch.compile generates optimized
#   kernels, CUDA graphs eliminate CPU overhead (a step replayed as one launch). SGLang has
#   `--disable-cuda-graph` and `--disable-radix-cache`. The teaching engine has neither
#   compiler nor graphs (on this course's CPUs torch.compile made its steps slower:
#   `docs/mini_engine.md`, "What is left").
