# %% [markdown]
# # 10 · The showdown: every engine, the same workloads, each pushed to its knee
#
# [![Open in Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/{{github_repo}}/blob/main/notebooks/10_engine_showdown.ipynb)
# [![Open in molab](https://marimo.io/molab-shield.svg)](https://molab.marimo.io/github/{{github_repo}}/blob/main/notebooks/10_engine_showdown.py)
#
# Notebooks 1 to 9 took an engine apart one mechanism at a time. This one puts whole engines
# side by side, the way you would before choosing one: the same model, the same requests, the
# same client, one engine on the machine at a time. The field on a CPU is
#
# * **vLLM** (its CPU build) and **SGLang** (its CPU build, from its own environment: see the
#   README's SGLang section), each behind the course's reference server;
# * the course's **teaching engine** twice, once with hash-chained prefix blocks (vLLM's
#   design) and once with a radix tree (SGLang's), so the two cache designs are compared with
#   everything else equal;
# * the **Hugging Face baseline**, one request at a time and no prefix cache: the floor.
#
# On a GPU the field is vLLM and SGLang, each at its defaults and "tuned" with the flags their
# documentation points to for these workloads.
#
# Three workloads: **ShareGPT** (real first turns of chats, independent of each other), an
# **agentic** one (agents that share a long system prompt with tool schemas, resend their
# growing history every turn and fork sub-agents), and **shared-prefix** (groups of users
# behind the same system prompt). Each engine is swept to its **knee**, the highest load it
# keeps up with, by the harness's method (`workshop bench sweep`, `docs/benchmarking.md`):
#
# 1. a **synchronous probe** (one request at a time) gives the unloaded speed and how long an
#    unloaded session takes;
# 2. a **throughput probe** (many requests at once, closed loop) gives the most the engine
#    can do;
# 3. **open-loop points**: Poisson arrivals at rates from the synchronous rate to 1.5 x the
#    maximum. Each point is judged over its *steady window* (after the warm-up, before the
#    drain): an engine keeps up when it completes what arrives and neither its queue, nor the
#    requests it has in flight, nor its time to first token (TTFT) grow. The knee is the last
#    point that keeps up and meets the objectives (p99 TTFT and p99 inter-token latency, ITL).
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
# where its environment is installed (`bash scripts/setup.sh --with-sglang`). The engine the
# first cell connected to, and the baseline when the course's shared one is running, are used
# as they are; the others are started here, one at a time, and stopped after their runs.

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
# Pick the contenders and the plan. The **quick** plan (what CI runs) has one workload
# (shared-prefix), short prompts and answers and two load points per engine, and by default,
# on a CPU, the two teaching-engine contenders, which start in seconds, and the engine already
# running (add `hf` for the baseline): a few minutes. Four requests per point are too few to
# judge a knee: section 5 draws such points hollow and no knee is claimed from them; the
# comparisons fall back to each engine's capacity and its lightest load. The **full** plan is
# the one `benchmarks/showdown.py` runs: three workloads, two probes and three load points, 24
# requests (or 20 agent sessions of six requests) per point; on 2 AVX2 cores (2026-12-03) vLLM
# took 27 minutes, SGLang 64, each teaching-engine variant about 23 and the baseline 32 (that
# run is `benchmarks/reference_results/showdown-cpu/`, which notebook 11 falls back to).
#
# The **objectives** (p99 TTFT and p99 ITL) are yours to state. Left at 0, an objective is
# derived from the run itself once every contender has run: the factor below times the best
# contender's unloaded latency (its synchronous probe), as section 4 computes. In Jupyter,
# re-run the cells below after changing a control; marimo re-runs them.

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
# What each workload asks for, computed from the requests themselves: sessions, requests,
# prompt and output tokens, and the **prefix reuse**: the fraction of prompt tokens that a
# perfect, unbounded prefix cache could skip because an earlier request (its prompt or its
# answer) began the same way. It is the ceiling of every engine's cache hit rate below.

# %%
from workshop.bench.tokenizer import Tokenizer
from workshop.bench.workloads import build_workload, describe

_tok = Tokenizer.load(session.model)
workload_rows = []
for _w in plan.workloads:
    _d = describe(build_workload(_w, _tok, num_requests=plan.num_requests, seed=plan.seed, **plan.kwargs_for(_w)))
    workload_rows.append({"workload": _w, "sessions": _d["sessions"], "requests": _d.get("requests"),
                          "mean prompt (tok)": _d["prompt_tokens_mean"],
                          "mean output (tok)": _d["output_tokens_mean"],
                          "prefix reuse": _d.get("prefix_reuse_ratio")})
ui.table(workload_rows)

# %% [markdown]
# **Exercise 1 (predict, then measure).** The two teaching-engine contenders differ only in
# how they find a cached prefix: hashed blocks or a radix tree. On the **shared-prefix**
# workload, what will the radix engine's **capacity** (the most output tokens/s it delivers at
# any load tried, its throughput probe included, objectives aside) be, as a multiple of the
# hash engine's? (1.0 = the same.) Write it, run the showdown, and the cell after it compares.

# %%
predict_radix_over_hash = None   # your prediction: radix capacity / hash capacity

# %% [markdown]
# ## 3. Run it
#
# Every contender in turn: start (unless already running), check its answers, sweep every
# workload, stop. The prefix cache is emptied before each load point, so no point profits from
# the one before. Progress bars show each point's requests; each line after a contender's runs
# says where its knee is and why.
#
# **Answers first.** A benchmark counts tokens, not whether they are right, so a broken
# configuration is as fast as a working one (a layer computed wrongly costs the same FLOPs)
# and can top the table. Before any sweep, each contender answers a fixed set of chat prompts
# greedily, and each answer is compared token by token with Hugging Face `transformers` in
# float32 on the same checkpoint (`workshop bench verify`; `workshop/bench/verify.py`): short
# prompts sent three times (the repeats come from the prefix cache, where a cache bug shows),
# questions behind one long system prompt, and ShareGPT first turns. A contender that answers
# wrongly is recorded and not swept.

# %%
showdown_root = showdown.new_root()
showdown.run_showdown(showdown_root, contenders, plan, model=session.model, mode=plan_choice.value,
                      command="notebook 10")
showdown_results = decision.load(showdown_root)
showdown_sweeps = showdown_results.sweeps()
ui.md(f"Results in `{showdown_root}`; notebook 11 draws the decision chart from this folder.")

# %% [markdown]
# What ran, and whether it answered right: each contender's effective configuration as its
# server reported it (`/server_info`), next to the gate's verdict. Every number below belongs
# to the row of this table it came from.

# %%
ui.table(decision.setup_rows(showdown_results))

# %% [markdown]
# Where an answer departed from the reference, the table below says where and by how much.
# Not every departure is an error. Two correct engines that add the same numbers in another
# order (bf16 rounding, another kernel) can flip a **near tie**: a token the reference itself
# scored almost as high as its own choice (within the gate's margin, in logits). A departure
# far below the reference's choice is **wrong**.

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
# "What is the capital of France?", computed here. Where its top two are close, an engine in
# another dtype may well begin with the second, and a check that only looks for "Paris" would
# call a correct engine broken.

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
      f"**{first_token_gap:.3f} logits** apart, against the gate's margin of "
      f"{verify.TIE_MARGIN:g}: "
      + ("a near tie, where the dtype decides." if first_token_gap <= verify.TIE_MARGIN
         else "a clear choice: an engine that begins otherwise is wrong."))

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
# An objective you did not state is derived from that table. For the TTFT objective, take
# each engine's unloaded p99 TTFT; for the ITL objective, its unloaded p99 ITL **plus** its
# p99 TTFT: a continuous batcher prefills a newcomer's prompt in the same step as everybody's
# next token, so the longest gap of an answer that overlaps another request is about one
# decode step plus one prefill, however light the load. On each workload keep the best
# (lowest) engine's value, take the highest of those over the workloads, and multiply by the
# factor you set. The cell below computes it from the table, next to what the run recorded
# in `showdown.json`, which judged every knee and goodput below.

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
# Top row: the throughput each engine achieved against the load it was offered, both in
# requests per second over each point's steady window (sessions per second times requests
# per session for the agentic workload). On the dashed line an engine keeps up; where its
# curve bends away it saturates. The star is its knee; a hollow point held too few requests for
# a shortfall to show, so it is not judged either way. Bottom row: p99 TTFT at each load, on a
# log scale, with the objective dotted: queueing shows up here before throughput flattens.

# %%
from workshop.bench.plots import plot_showdown

plot_showdown(showdown_sweeps, "ttft_ms")

# %% [markdown]
# And the p99 inter-token latency: how smooth the answer scrolls once it started. Batching
# more sequences into each step makes every step slower, so ITL grows with load even while
# throughput still rises.

# %%
plot_showdown(showdown_sweeps, "itl_ms")

# %% [markdown]
# ## 6. At the knee
#
# One row per engine and workload, read at the knee point: the load it sustained, the output
# tokens per second, the latency percentiles, the **goodput** (requests per second that met
# both objectives), the prefix-cache hit rate the server reported and its peak KV-cache use;
# and, knee or not, its **capacity**: the most output tokens per second it delivered at any
# load tried (its throughput probe included), objectives aside.
# A dash means the server does not report that figure (the baseline has no cache) or the
# engine has no knee; the note says why. `workshop/decision.py` holds the rules (its
# docstring); notebook 11 draws the decision chart from the same rows.

# %%
knee_rows = decision.knee_table(showdown_results)
ui.table(decision.display_rows(knee_rows))

# %%
def row_of(workload, engine):
    """The row of ``engine`` on ``workload`` (None when it did not run there)."""
    return next((r for r in knee_rows if r["workload"] == workload and r["engine"] == engine), None)


def capacity_of(workload, engine):
    """The most output tok/s ``engine`` delivered on ``workload`` at any load tried."""
    r = row_of(workload, engine)
    return r["capacity_tps"] if r else None


_r = capacity_of("shared-prefix", "mini-radix")
_h = capacity_of("shared-prefix", "mini-hash")
radix_over_hash = _r / _h if _r and _h else None
(ui.compare(predict_radix_over_hash, radix_over_hash, "radix / hash capacity (output tok/s), shared-prefix")
 if radix_over_hash else ui.md("Exercise 1 needs both teaching-engine contenders to finish the shared-prefix "
                               "workload (see the notes in the table)."))

# %% [markdown]
# Our radix tree matches **whole blocks**, like the hash chain (notebook 8), so on the same
# requests both find the same cached tokens; what is left to differ is the cost of the lookup
# and of eviction, small next to a model step. A ratio near 1 is what that predicts; SGLang's
# own tree matches token by token (page size 1), which is where a radix cache can find more.

# %% [markdown]
# **Exercise 2 (predict, then measure).** Every sweep starts with a synchronous probe: one
# request at a time, which is how the baseline always serves. On the **shared-prefix**
# workload, how many times its own one-at-a-time output tokens/s will the contender with the
# most capacity deliver at its capacity? That ratio is what batching buys that engine here.

# %%
predict_batching_gain = None   # your prediction: capacity / one-at-a-time output tok/s

# %%
_caps = {r["engine"]: r for r in knee_rows
         if r["workload"] == "shared-prefix" and r["capacity_tps"] and r["synchronous_tps"]}
best_engine = max(_caps, key=lambda e: _caps[e]["capacity_tps"]) if _caps else None
batching_gain = (_caps[best_engine]["capacity_tps"] / _caps[best_engine]["synchronous_tps"]
                 if best_engine else None)
(ui.compare(predict_batching_gain, batching_gain,
            f"{best_engine}'s capacity / its one-at-a-time output tok/s, shared-prefix")
 if batching_gain else ui.md("Exercise 2 needs a contender that finished the shared-prefix workload "
                             "with its synchronous probe."))

# %% [markdown]
# **Exercise 3 (predict, then measure).** Look at the workload table in section 2: the
# prefix reuse of the shared-prefix workload is the most any cache could find. What hit rate
# will the engine you connected to in the first cell report on that workload, at its knee (or,
# without one, at the lightest load tried)? If that engine is not among the contenders (you
# took it out in section 1), the question is about the first contender.

# %%
predict_hit_rate = None   # your prediction, 0-1

# %%
# The contender running the connected engine (for the teaching engine: its first label, hash),
# else the first contender.
_label = next((c.label for c in contenders if c.engine == session.engine),
              contenders[0].label if contenders else None)
_row = row_of("shared-prefix", _label) if _label else None
_at, _hit = None, None
if _row and _row["points"]:
    _at, _hit = (("its knee", _row["prefix_hit_rate"]) if not _row["no_knee"] else
                 (f"its lightest load ({_row['points'][0]['offered']:.3g} req/s; no knee)",
                  _row["points"][0]["prefix_hit_rate"]))
shared_prefix_reuse = next((r["prefix reuse"] for r in workload_rows if r["workload"] == "shared-prefix"), None)
(ui.compare(predict_hit_rate, _hit, f"{_label} prefix hit rate at {_at}, shared-prefix")
 if _at and _hit is not None else
 ui.md(f"{_label or session.engine_name} reported no prefix-cache hit rate on the shared-prefix workload "
       "in this run (no cache, or not in the run)."))

# %%
ui.md(f"The workload's prefix reuse (the ceiling) was **{shared_prefix_reuse:.3f}**."
      if shared_prefix_reuse is not None else "")

# %% [markdown]
# ## 7. What this run shows, and what it does not
#
# Computed from the table above (margins under 10 % count as ties: see `decision.TIE_WITHIN`):

# %%
_lines = []
for _w in dict.fromkeys(r["workload"] for r in knee_rows):
    _v = decision.decide(knee_rows, _w, "throughput")
    if _v.ignores_objectives:
        _lines.append(f"* **{_w}**: no contender kept up within the objectives at any load, so this "
                      "ranks **capacity alone** (the most output tokens/s at any load tried) and "
                      "ignores the latency objectives: "
                      + ", ".join(f"{_e} {_x:.3g} tok/s" for _e, _x in
                                  sorted(_v.values.items(), key=lambda kv: -kv[1]))
                      + (f"; {_v.winner} {_v.margin:.2f}x {_v.runner_up}." if _v.outcome == "win" else
                         f"; a tie within the noise band between {', '.join(_v.tied)}." if _v.outcome == "tie"
                         else "."))
    elif _v.outcome == "win":
        _lines.append(f"* **{_w}**: the most output tokens/s at the knee came from **{_v.winner}** "
                      f"({_v.values[_v.winner]:.0f} tok/s), {_v.margin_text} the next best "
                      f"({_v.runner_up}).")
    elif _v.outcome == "tie":
        _lines.append(f"* **{_w}**: a tie within the noise band between {', '.join(_v.tied)}.")
    elif _v.outcome == "only":
        _lines.append(f"* **{_w}**: only **{_v.winner}** had a knee.")
    else:
        _lines.append(f"* **{_w}**: no contender has a knee to compare:")
    for _e, _why in _v.excluded.items():
        _lines.append(f"  * {_e}: {_why}")
ui.md("\n".join(_lines) or "No contender finished a sweep in this run.")

# %% [markdown]
# What it does **not** show. This is a 135M-parameter model on a laptop-class CPU; an
# H100 serving an 8B or 70B model differs in ways that change the ranking:
#
# * **Kernels.** Here each engine runs its CPU kernels (vLLM's and SGLang's CPU attention,
#   oneDNN matmuls; the teaching engine's plain PyTorch). On a GPU both production engines run
#   FlashAttention/FlashInfer-class kernels and CUDA graphs, and per-step overheads that
#   dominate a tiny model here shrink relative to the matmuls of a big one. Speed differences
#   measured here mostly say how good each CPU path is.
# * **What carries over** is mechanism: batching versus one at a time (the baseline's gap
#   grows with model size), whether a prefix cache finds the shared prompt (hit rates are
#   properties of the workload and the cache design, not of the hardware), and how queueing
#   builds up past the knee.
# * **Noise.** Two cores shared with the client: a point can fall behind because the client
#   was late (the sweep flags such points as client-limited and retries them once). Run the
#   full plan on a quiet machine before you believe a difference under about 10 %.

# %% [markdown]
# ## 8. Inside the teaching engine: what each speed switch buys here
#
# Section 7's first caveat says a speed difference on a CPU mostly measures how good each
# engine's CPU path is. For one engine you can take that path apart: the teaching engine keeps
# a switch for each technique that made it faster, the same flags its server takes.
#
# * `--no-prepack`: the linear layers' weights stay as loaded, instead of being reordered once
#   into the blocked layout oneDNN's bf16/fp16 kernels read; left as loaded, oneDNN reorders
#   them at every call. Float32 is never packed.
# * `--kv-read slot`: each sequence's keys and values are copied out of the pool token by token
#   instead of block by block (notebook 7, section 7).
# * `--decode-attention sdpa`: PyTorch's SDPA kernel for every batch, where `auto` writes
#   attention out (two matmuls and a softmax) for big bf16/fp16 decode batches.
# * `--no-cascade-attention`: each sequence reads the shared system prompt's keys itself,
#   instead of the batch reading them once (notebook 8, section 4).
#
# Below, one engine per variant (the defaults, then each switch off on its own) holds the same
# batch: sequences behind one system prompt, the radix cache on, so they share its blocks. The
# engines then take decode steps in turn, round-robin, so a slow moment of the machine falls
# on all of them alike. This runs the bundled model in this process, in the dtype the
# course's server computes in on this machine (bf16 where the CPU has native bf16, float32
# otherwise: `reference_server.dtypes`); the dropdown changes it.

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
# variants run the defaults' code, and their ratios show how far two identical engines drift
# apart on this machine.

# %%
predict_worst_ratio = None      # your prediction: the slowest variant's step time / the defaults'

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
_same_code = [r for r in switch_rows[1:] if not r["applies here"]]
_noise = [r["slower than defaults"] for r in _same_code]
_slot = next(r for r in switch_rows if r["variant"] == "--kv-read slot")
_differ = [r["variant"] for r in switch_applied if not r["same tokens"]]
# A ratio counts only outside the noise: 5 %, or wider where this run's identical engines
# drifted further apart.
_hi, _lo = max([1.05, *_noise]), min([0.95, *_noise])
_lines = [
    f"* `{r['variant']}`: **{r['slower than defaults']:.2f}x** the defaults' step time "
    + ("(slower without it: the technique pays here)." if r["slower than defaults"] > _hi else
       "(faster without it: at these settings the technique costs more than it saves on this "
       "machine)." if r["slower than defaults"] < _lo else
       f"(inside {_lo:.2f}-{_hi:.2f}x, this run's noise: no clear effect at these settings).")
    for r in switch_applied]
ui.md("\n".join(_lines or ["No switch changes the code for this batch in this dtype."])
      + ("\n\nVariants that ran the defaults' code here ("
         + ", ".join(f"`{r['variant']}`" for r in _same_code)
         + f") came out at {min(_noise):.2f}-{max(_noise):.2f}x: a difference inside that band "
         "is this machine's noise, not a technique's." if _same_code else "")
      + "\n\nReading the pool slot by slot copies the same numbers as block by block, so its "
      + ("tokens matched the defaults' exactly (checked)." if _slot["same tokens"] else
         "tokens should have matched the defaults' exactly, and **did not: a bug**.")
      + (" Tokens that differed from the defaults': " + ", ".join(f"`{v}`" for v in _differ)
         + " (these sum in another order, and in bf16 a near tie can flip)." if _differ else
         " Every variant wrote the defaults' tokens."))

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
