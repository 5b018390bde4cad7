# %% [markdown]
# # 11 · The decision chart: which engine, for which job, on your data
#
# [![Open in Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/{{github_repo}}/blob/main/notebooks/11_decision_chart.ipynb)
# [![Open in molab](https://marimo.io/molab-shield.svg)](https://molab.marimo.io/github/{{github_repo}}/blob/main/notebooks/11_decision_chart.py)
#
# Notebook 10 swept every engine to its knee and wrote a **showdown folder**. This notebook
# sends no load: it reads those folders and answers *which engine should I use?* in the only
# honest form, **for which workload and under which constraint**.
#
# | section | what it does |
# |---|---|
# | 1 | finds your showdown folders (`results/showdown-*`, and any in `WORKSHOP_SHOWDOWN_DIRS`), else the committed reference run, and says whose numbers you see |
# | 2-4 | every engine at its knee, a winner with its margin per workload and constraint, the chart; the objectives and the engines compared are yours to change |
# | 5 | what carries over to other hardware, and the two committed reference runs side by side |
# | 6-7 | what was **not measured here**: features, hardware, engines you cannot run, the engines' own published figures, each with its source and date |
#
# The rules are in `workshop/finale/decision.py` (its docstring); the figure in
# `workshop/finale/decision_chart.py`.

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
# ## 1. Whose numbers are these?
#
# A showdown folder holds `showdown.json` (the command, the machine, the date, the engines
# with their server arguments, the objectives) and one load sweep per engine and workload.
# Several folders are merged: per engine and workload a finished run wins over a failed one,
# and between two finished ones the newer folder wins.

# %%
from workshop import ui
from workshop.finale import decision, decision_chart

showdown_roots, showdown_source = decision.choose_roots()
showdown = decision.load(*showdown_roots)
_where = ", ".join(f"`{p}`" for p in decision.default_places())
ui.md({"yours": f"**Your showdown data**: {len(showdown.roots)} folder(s) found in {_where}.",
       "reference": "## ⚠ These are not your measurements\n\nNo showdown folder of yours was found in "
                    f"{_where}: everything below is drawn from **the project's committed reference run**. "
                    "Run notebook 10 (or `python benchmarks/showdown.py`) to draw it from your machine.",
       "none": f"## ⚠ No showdown data\n\nNo showdown folder was found in {_where}, and this installation "
               "has no reference run. Run notebook 10 or `python benchmarks/showdown.py` first; the cited "
               "facts in sections 6 and 7 still work."}[showdown_source])

# %%
ui.table([{"folder": r.path.name, "mode": r.mode, "model": r.manifest.get("model", "?"), "machine": r.machine,
           "created (UTC)": r.created[:16].replace("T", " "), "objectives": r.objectives}
          for r in showdown.roots]) if showdown.roots else ui.md("")

# %%
ui.md("\n".join([f"- ⚠ {w}" for w in showdown.warnings]
                + [f"- {old.engine} / {old.workload}: the run in `{new.root.path.name}` replaces the one in "
                   f"`{old.root.path.name}` ({old.status})" for old, new in showdown.replaced]))

# %% [markdown]
# The exercises need a workload where at least two engines have a knee. A quick run (four
# requests per point) has none, so they then read the committed reference runs, each at the
# objectives it was judged with; the cell below says which.

# %%
reference_stage_runs = {_name: decision.load(_path) for _name, _path in decision.reference_stages().items()}


def knee_counts(results):
    """The knee table of ``results`` and, per workload, how many engines have a knee there."""
    rows = decision.knee_table(results)
    return rows, {w: sum(1 for r in rows if r["workload"] == w and not r["no_knee"]) for w in results.workloads}


_sources = ([(("your data" if showdown_source == "yours" else "the committed reference run"), showdown)]
            + [(f"the committed reference run on the {_name}", _r) for _name, _r in reference_stage_runs.items()])
exercise_source, exercise_data, exercise_rows, exercise_workload = None, None, [], None
for _label, _data in _sources:
    _rows, _counts = knee_counts(_data)
    if _counts and max(_counts.values()) >= 2:
        exercise_source, exercise_data, exercise_rows = _label, _data, _rows
        exercise_workload = max(_counts, key=_counts.get)
        break
exercise_slo = decision.slo_of(**exercise_data.slo) if exercise_data else None
ui.md(f"Exercises 1 and 2 read **{exercise_source}** (`{exercise_data.newest.path.name}`), workload "
      f"**{exercise_workload}**, objectives p99 TTFT ≤ {exercise_slo.ttft_ms:,.0f} ms and p99 ITL ≤ "
      f"{exercise_slo.itl_ms:,.0f} ms." if exercise_data else
      "No showdown data has two engines with a knee on one workload: exercises 1 and 2 have nothing to read.")

# %% [markdown]
# **Exercise 1 (predict, then compute).** Before looking at any table: on that workload, by
# what factor will the fastest engine's output tokens/s at its knee beat the second fastest's?
# Think about notebooks 7, 8 and 10: continuous batching, paged KV, prefix caching, one request
# at a time against many.

# %%
my_throughput_margin = None    # your prediction: fastest / second fastest, e.g. 2.0

# %%
exercise_throughput = (decision.decide(exercise_rows, exercise_workload, "throughput")
                       if exercise_workload else None)
_ok = exercise_throughput is not None and exercise_throughput.margin is not None
_first = (exercise_throughput.winner or exercise_throughput.tied[0]) if _ok else None
(ui.compare(my_throughput_margin, exercise_throughput.margin,
            f"throughput margin on {exercise_workload} ({_first} over {exercise_throughput.runner_up}"
            + (", capacity alone: no engine met the objectives at any load"
               if exercise_throughput.ignores_objectives else "") + ")", "x", how="computed")
 if _ok else ui.md("Fewer than two engines kept up at any load on this workload: there is no margin to predict."))

# %%
# Worked answer to Exercise 1, collapsed until opened
_v = exercise_throughput
_pair = ([_v.winner or _v.tied[0], _v.runner_up] if _v is not None and _v.margin is not None else [])
_by = {r["engine"]: r for r in exercise_rows if r["workload"] == exercise_workload}
_pair_rows = [{"engine": _e, "one at a time (tok/s)": _by[_e]["synchronous_tps"],
               "at its knee (tok/s)": _v.values[_e],
               "knee (req/s)": _by[_e]["knee_offered"],
               "gain from batching": _v.values[_e] / _by[_e]["synchronous_tps"]}
              for _e in _pair if _by[_e]["synchronous_tps"]]
_unloaded = (_pair_rows[0]["one at a time (tok/s)"] / _pair_rows[1]["one at a time (tok/s)"]
             if len(_pair_rows) == 2 else None)
ui.worked_answer(
    "Both engines serve the same requests, so the tokens per request are equal and the margin "
    "is a ratio of speeds. One request at a time, an engine's speed is its unloaded step time; "
    "at its knee, that speed times what batching bought it (notebook 10, exercise 2):\n\n"
    + ui.markdown_table(_pair_rows, floatfmt=".3g")
    + f"\n\nIf both gained the same from batching, the margin would be their unloaded ratio, "
      f"{_pair_rows[0]['one at a time (tok/s)']:.1f} / {_pair_rows[1]['one at a time (tok/s)']:.1f} = "
      f"**{_unloaded:.2f}x**. Computed at the knees: **{_v.margin:.2f}x**"
    + (f", {_v.margin / _unloaded:.2f}x the unloaded ratio: {_pair[0]} gained "
       f"{_pair_rows[0]['gain from batching']:.1f}x from batching and {_pair[1]} "
       f"{_pair_rows[1]['gain from batching']:.1f}x, and {_pair[0]} kept up at "
       f"{_pair_rows[0]['knee (req/s)'] / _pair_rows[1]['knee (req/s)']:.2f}x {_pair[1]}'s load within "
       "the same objectives." if _pair_rows[0]["knee (req/s)"] and _pair_rows[1]["knee (req/s)"] else ".")
    if _unloaded else "There is no pair of engines with a knee and a synchronous probe to compare.")

# %% [markdown]
# ## 2. Your objectives, your engines
#
# A knee is the highest load an engine kept up with *and* met the objectives at (p99 TTFT and
# p99 ITL within them); goodput counts the requests whose first token and every gap met them.
# Both are recomputed from the stored per-request timelines when you move the objectives:
# nothing runs again. The sliders start at the newest folder's objectives; 0 means none. The
# tie band is the margin below which two engines are called even. Type engine or workload
# labels, comma-separated, to compare a subset (`all` for everything). In Jupyter, re-run the
# cells below after changing a control; marimo re-runs them.

# %%
# the newest folder's objectives (rounded to the ms), with room above them to loosen
slo_start = {k: round(showdown.slo[k] or 0) for k in ("ttft_ms", "itl_ms")}
slo_ttft = ui.slider(0, max(30000, 3 * slo_start["ttft_ms"]), slo_start["ttft_ms"], 1,
                     "TTFT objective, p99 (ms; 0: none)")
slo_ttft

# %%
slo_itl = ui.slider(0, max(5000, 3 * slo_start["itl_ms"]), slo_start["itl_ms"], 1, "ITL objective (ms; 0: none)")
slo_itl

# %%
tie_band = ui.slider(0, 50, int(round(100 * decision.TIE_WITHIN)), 1, "tie band (%)")
tie_band

# %%
engine_choice = ui.text("all", f"engines (of: {', '.join(showdown.engines) or 'none'})")
engine_choice

# %%
workload_choice = ui.text("all", f"workloads (of: {', '.join(showdown.workloads) or 'none'})")
workload_choice


# %%
def _pick(text, known):
    wanted = [t.strip() for t in str(text).split(",") if t.strip()]
    return known if not wanted or wanted == ["all"] else [t for t in wanted if t in known]


chosen_engines = _pick(engine_choice.value, showdown.engines)
chosen_workloads = _pick(workload_choice.value, showdown.workloads)
chosen = showdown.select(chosen_engines, chosen_workloads)
chosen_slo = decision.slo_of(slo_ttft.value or None, slo_itl.value or None)
knee_rows = decision.knee_table(chosen, chosen_slo)
verdicts = decision.decisions(knee_rows, tie_within=tie_band.value / 100)
_objectives = " and ".join(f"{name} ≤ {value:g} ms" if value else f"no {name} objective"
                           for name, value in (("TTFT", chosen_slo.ttft_ms), ("ITL", chosen_slo.itl_ms)))
ui.md(f"Comparing **{', '.join(chosen_engines) or 'no engine'}** on **{', '.join(chosen_workloads) or 'no workload'}**, "
      f"objectives {_objectives}, ties within {tie_band.value} %.")

# %% [markdown]
# ## 3. Every engine at its knee
#
# One row per engine and workload.
#
# | column | meaning |
# |---|---|
# | knee sessions/s (asked) | the rate the client was told to start sessions at (a session: one request on ShareGPT and shared-prefix, a whole conversation on agentic) |
# | knee req/s (offered) | the requests/s it really sent over the point's steady window (`+`: the knee is the highest load tried, the limit is higher) |
# | output tok/s | the steady request rate times the mean output tokens per request |
# | TTFT, ITL | at that load |
# | SLO met | the share of requests that met both objectives |
# | prefix hits, peak KV | the server's own gauges (`-` where the engine does not report them) |

# %%
ui.table(decision.display_rows(knee_rows))

# %% [markdown]
# What ran: each engine's configuration as its server reported it, and whether it passed the
# correctness gate (notebook 10, section 3) before its sweep. An engine that answered wrongly
# has no knee and is ranked nowhere; *not checked* marks runs made before the gate existed
# (the committed reference run among them).

# %%
ui.table(decision.setup_rows(chosen))

# %%
_best = {}
for _r in knee_rows:
    if not _r["no_knee"] and _r["output_tps"] and _r["output_tps"] > _best.get(_r["workload"], (None, 0))[1]:
        _best[_r["workload"]] = (_r["engine"], _r["output_tps"], _r["knee_offered"])
ui.md("**Highest throughput at a knee**: "
      + "; ".join(f"{_w}: {_e}, {_t:.0f} tok/s at {_k:.3g} req/s" for _w, (_e, _t, _k) in _best.items()) + "."
      if _best else "**No engine has a knee in this data** (the table's notes say why).")

# %% [markdown]
# ## 4. The chart
#
# Each cell names the winner on a workload under a constraint, with its margin (best /
# runner-up; ≥ marks a knee at the highest load tried, where the margin is a lower bound), in
# the winner's colour (darker: a margin of at least 1.5). **Latency and KV memory are compared
# at one common load per workload, the lowest of the engines' knees**, which every engine
# compared kept up at: at each engine's own knee, the engine pushed harder would look slower.
# Below the chart, each engine's throughput at its knee; the table under it gives every
# verdict's values, what was left out and set-up differences that can favour one engine.

# %%
decision_chart.plot_decision(verdicts, knee_rows, decision_chart.title_for(chosen), engines=chosen_engines)

# %%
ui.table(decision.verdict_rows(verdicts))

# %%
_lines = [f"- **{_w}**: " + "; ".join(f"{decision.CONSTRAINTS[_v.constraint][0]}: {_v.label}"
                                     for _v in verdicts if _v.workload == _w) + "."
          for _w in chosen_workloads]
_n_single = sum(1 for _v in verdicts if _v.outcome in ("win", "only"))
ui.md(f"**{_n_single} of {len(verdicts)} verdicts name a single winner** (the others are ties, or too few "
      "engines qualify: the table says why):\n\n" + "\n".join(_lines))

# %% [markdown]
# **Exercise 2 (predict, then compute).** Goodput depends on the objective you bring. Take the
# engine that wins goodput on the exercise workload (the most requests/s meeting both
# objectives, at any load tried) and tighten its TTFT objective to the **median** TTFT it had
# at its best load (the cell below computes it): about half the requests there now miss. At
# best, over all its loads, how many requests/s will still meet the objectives?

# %%
_gv = decision.decide(exercise_rows, exercise_workload, "goodput") if exercise_workload else None
goodput_winner = (_gv.winner or (_gv.tied[0] if _gv.tied else None)) if _gv else None
goodput_run = exercise_data.runs[(goodput_winner, exercise_workload)] if goodput_winner else None
goodput_row = decision.knee_row(goodput_run, exercise_slo) if goodput_run else None
goodput_best_point = (next(p for p in goodput_row["points"] if p["offered"] == goodput_row["best_goodput_at"])
               if goodput_row and goodput_row["best_goodput_at"] is not None else None)
tight_slo = decision.slo_of(goodput_best_point["ttft_p50"], exercise_slo.itl_ms) if goodput_best_point else None
ui.md(f"{goodput_winner} wins goodput on {exercise_workload} with **{goodput_row['best_goodput']:.3g} req/s** "
      f"at {goodput_best_point['offered']:.3g} req/s offered, where its median TTFT was "
      f"**{tight_slo.ttft_ms:,.0f} ms**: the tightened TTFT objective (ITL objective unchanged)."
      if tight_slo else "No engine has goodput on the exercise workload.")

# %%
my_goodput_tight = None    # your prediction in req/s, e.g. 1.0

# %%
exercise_goodput = decision.knee_row(goodput_run, tight_slo)["best_goodput"] if tight_slo else None
(ui.compare(my_goodput_tight, exercise_goodput,
            f"best goodput of {goodput_winner} on {exercise_workload} with p99 TTFT ≤ "
            f"{tight_slo.ttft_ms:,.0f} ms", "req/s", how="computed")
 if exercise_goodput is not None else ui.md("No engine has goodput on the exercise workload."))

# %%
# Worked answer to Exercise 2, collapsed until opened
_old = goodput_row["points"] if tight_slo else []
_new = decision.knee_row(goodput_run, tight_slo)["points"] if tight_slo else []
_point_rows = [{"offered (req/s)": _a["offered"], "completed (req/s)": _a["achieved"],
                "median TTFT (ms)": _a["ttft_p50"],
                "met before": _a["slo_met"], "met after": _b["slo_met"],
                "goodput before (req/s)": _a["goodput"], "goodput after (req/s)": _b["goodput"]}
               for _a, _b in zip(_old, _new) if not _a["client_limited"]]
_at = max(_point_rows, key=lambda r: r["goodput after (req/s)"]) if _point_rows else None
ui.worked_answer(
    "Goodput at a load is the requests/s completed times the share that met the objectives. "
    "At the old best load about half the requests now miss (the objective is their median "
    "TTFT), so there goodput about halves. Every other load keeps the share of its own requests "
    f"whose first token came in time. {goodput_winner}'s loads on {exercise_workload}, under the objectives "
    f"before (TTFT ≤ {exercise_slo.ttft_ms:,.0f} ms) and after (≤ {tight_slo.ttft_ms:,.0f} ms):\n\n"
    + ui.markdown_table(_point_rows, floatfmt=".3g")
    + f"\n\nThe best after: {_at['completed (req/s)']:.3g} req/s completed x {_at['met after']:.0%} met "
      f"= **{exercise_goodput:.3g} req/s**, at {_at['offered (req/s)']:.3g} req/s offered, "
      f"{exercise_goodput / goodput_row['best_goodput']:.0%} of the {goodput_row['best_goodput']:.3g} "
      "before"
    + (f"; the best load moved from {goodput_best_point['offered']:.3g} to {_at['offered (req/s)']:.3g} "
       "req/s, where fewer requests queued behind each other. "
       if _at["offered (req/s)"] != goodput_best_point["offered"] else
       ", at the same load: the lighter loads' first tokens were no faster (median "
       + ", ".join(f"{r['median TTFT (ms)']:.0f}" for r in _point_rows if r["offered (req/s)"] < _at["offered (req/s)"])
       + f" ms against {_at['median TTFT (ms)']:.0f}), so none kept more. "
       if all(r["median TTFT (ms)"] >= _at["median TTFT (ms)"] for r in _point_rows) else
       ", at the same load: the lighter loads kept a larger share of fewer requests/s. ")
    + "A goodput verdict holds for the objective it was computed with."
    if _at and exercise_goodput is not None else "No engine has goodput on the exercise workload.")

# %% [markdown]
# ## 5. What these results show, and what they do not
#
# * **What carries over** to other hardware: which design wins on which workload. Prefix
#   caching on the shared-prefix and agentic workloads (the saving is prefill the engine does
#   not redo, on any hardware), continuous batching over one-request-at-a-time serving.
# * **What does not**: the absolute numbers, the size of each margin, and close calls inside
#   the tie band. A 135M-parameter model on a few CPU cores is not a 70B model on an H100: the
#   GPU kernels (FlashAttention, CUDA graphs, FP8) do not run, and the CPU builds exercise
#   their schedulers, KV managers and prefix caches more than their kernels. A GPU shifts the
#   balance between prefill, decode and scheduler: vLLM's own 2024 profiling of Llama 3 8B on
#   one H100 found only 38 % of the time on the GPU, the rest in its HTTP server and scheduler
#   ([vLLM blog, 2024-09-05](https://blog.vllm.ai/2024/09/05/perf-update.html)).
# * **A quick run** sends four requests per load point: its p99s are the slowest of a few
#   requests, and it judges no knee.

# %%
_newest = showdown.newest
_shifted = [_w for _w in chosen_workloads
            if len({_v.winner for _v in verdicts if _v.workload == _w and _v.outcome == "win"}) > 1]
ui.md((f"These numbers come from **{_newest.manifest.get('model', '?')}** on **{_newest.machine}**, in a "
       f"**{_newest.mode}** run. " if _newest else "**No showdown data.** ")
      + (f"The winner changes with the constraint on {', '.join(_shifted)}." if _shifted else
         "No workload's winner changes with the constraint here."))

# %% [markdown]
# ### The committed reference runs: two CPUs, two stages
#
# The project keeps a full showdown from two kinds of CPU. On a Xeon with AMX both production
# engines run the kernels their CPU documentation describes: vLLM's AMX attention in bf16 and
# SGLang's `intel_amx` backend. On an EPYC with AVX2 only, SGLang's CPU engine runs outside
# the CPUs it supports (no AMX, no float32), and the course's server computes in float32
# where bf16 would be emulated.
#
# **Exercise 3 (predict, then compute).** The teaching engine ran on both. One request at a
# time, on the **shared-prefix** workload, how many times its output tokens/s on the EPYC
# will mini-hash deliver on the Xeon? Each run's dtype, from its `/server_info`:

# %%
stage_engine, stage_workload = "mini-hash", "shared-prefix"
stage_setups = {_name: (_r.runs.get((stage_engine, stage_workload)).setup
                         if _r.runs.get((stage_engine, stage_workload)) else None)
                 for _name, _r in reference_stage_runs.items()}
ui.table([{"stage": _name, "engine": stage_engine, "dtype": (_s or {}).get("dtype") or "not run",
           "CPU features": (_s or {}).get("CPU") or "-"} for _name, _s in stage_setups.items()])

# %%
my_stage_ratio = None    # your prediction: Xeon tok/s / EPYC tok/s, one at a time, e.g. 2.0

# %%
stage_names = list(reference_stage_runs)
stage_sync = {_name: next((r["synchronous_tps"] for r in decision.knee_table(_r)
                           if r["engine"] == stage_engine and r["workload"] == stage_workload), None)
              for _name, _r in reference_stage_runs.items()}
stage_ratio = (stage_sync[stage_names[0]] / stage_sync[stage_names[1]]
               if len(stage_names) == 2 and all(stage_sync.values()) else None)
(ui.compare(my_stage_ratio, stage_ratio, f"{stage_engine} one at a time on {stage_workload}, "
            f"{stage_names[0]} / {stage_names[1]}", "x", how="computed")
 if stage_ratio else ui.md("Both reference runs, with the teaching engine on shared-prefix, are needed here."))

# %%
# Worked answer to Exercise 3, collapsed until opened
_bytes = {_name: {"bfloat16": 2, "float16": 2, "float32": 4}.get((_s or {}).get("dtype")) for _name, _s in stage_setups.items()}
stage_expected = _bytes[stage_names[1]] / _bytes[stage_names[0]] if stage_ratio and all(_bytes.values()) else None
ui.worked_answer(
    "One request at a time, every decode step reads all the model's weights once to make one "
    "token (notebook 3: a decode step of batch 1 is bound by memory traffic). So tokens/s "
    "follow the bytes per weight, if the two machines' memory delivers bytes at the same rate:\n\n"
    + ui.markdown_table([{"stage": _name, "dtype": stage_setups[_name]["dtype"], "bytes per weight": _bytes[_name],
                          "one at a time (tok/s)": stage_sync[_name]} for _name in stage_names], floatfmt=".3g")
    + f"\n\nExpected: {_bytes[stage_names[1]]} / {_bytes[stage_names[0]]} = **{stage_expected:.2f}x**. "
      f"Computed from the runs: **{stage_ratio:.2f}x**, {stage_ratio / stage_expected:.2f}x the bytes' "
      "prediction. The rest is what the two machines differ in beyond the bytes: their memory "
      "bandwidth, and each request's prefill, which is arithmetic (AMX against AVX2), not traffic."
    if stage_expected else "Both reference runs, with the teaching engine's dtype, are needed here.")

# %% [markdown]
# Whether each run is a **fair stage** for vLLM against SGLang, computed from what ran: both
# answers checked and right, neither outside its supported hardware, and equal limits (dtype,
# prefix cache on, requests at once, KV tokens). Compiled or eager and the attention kernel may
# differ: each is the engine's own documented choice.

# %%
ui.table([{"stage": _name, "run": _r.newest.describe(), **decision.stage_fairness(_r)}
          for _name, _r in reference_stage_runs.items()]) if reference_stage_runs else ui.md(
    "This installation has no committed reference run.")

# %% [markdown]
# The same question on both stages: who wins each workload under each constraint, and does
# the winner change with the CPU?

# %%
stage_rows = decision.compare_stages(reference_stage_runs) if len(reference_stage_runs) > 1 else []
ui.table(stage_rows) if stage_rows else ui.md("Only one reference stage is installed: nothing to set side by side.")

# %%
_fair = [_n for _n, _r in reference_stage_runs.items() if decision.stage_fairness(_r)["fair"]]
_changed = [_row for _row in stage_rows if _row["same winner"] == "no"]
ui.md((f"**Fair stage for vLLM against SGLang: {', '.join(_fair)}.** " if _fair else
       "**Neither stage is fair for vLLM against SGLang** (see the table above). ")
      + (f"The winner changes with the CPU in {len(_changed)} of {len(stage_rows)} cells (the "
         "table's *same winner* column)." if stage_rows else ""))

# %% [markdown]
# ## 6. Not measured here: operational needs and engines you cannot run
#
# Everything in this section comes from the engines' own documents
# (`workshop/data/engines_cited.json`, one source per cell), **not from any measurement on this
# machine**. *via backend* means a serving layer that inherits the feature from the engine it
# runs; *partial* and *untested* are explained in the file's notes.

# %%
_measured_kinds = [chosen.kind(e) for e in chosen_engines]
cited = decision.load_cited()
ui.md(f"> {cited['note']}\n\n"
      + ui.markdown_table(decision.feature_rows(cited=cited, measured=_measured_kinds)))

# %% [markdown]
# Which engines meet *your* operational needs? Type the features you cannot do without
# (`structured_output`, `multi_lora`, `speculative_decoding`, `prefix_caching`) and the hardware
# you have (`nvidia`, `amd`, `cpu`, `apple`), comma-separated.

# %%
needs_choice = ui.text("structured_output, multi_lora, nvidia", "needs")
needs_choice

# %%
_needs = [n.strip() for n in str(needs_choice.value).split(",")
          if n.strip() in decision.FEATURES + decision.HARDWARE]
_unmet = decision.supporting(_needs, [e["id"] for e in cited["engines"]], cited)
_names = {e["id"]: e["name"] for e in cited["engines"]}
ui.md(f"Needs: {', '.join(_needs) or 'none recognised'}.\n\n"
      + "\n".join(f"- **{_names[k]}**: " + ("meets all of them (as documented)" if not miss else
                                             "not documented as fully supported: " + ", ".join(miss))
                  for k, miss in _unmet.items())
      + "\n\nAn engine you measured that fails a need is out, whatever the chart says.")

# %% [markdown]
# ### Published figures (the engines' own reports)
#
# Each engine publishes benchmarks where it wins: on its chosen hardware, model, workload and
# baseline versions. They are worth knowing and worth reading critically, and they are **not
# comparable with each other or with the measurements above**.

# %%
ui.md("> **Not measured here.** Figures as published, with their setting and date.\n\n"
      + ui.markdown_table(decision.figure_rows(cited)))

# %% [markdown]
# ## 7. What the real engines do
#
# | engine | when teams pick it | what to know |
# |---|---|---|
# | vLLM | a broad default: many models and hardware targets, OpenAI-compatible server, LoRA, structured output, speculative decoding | paged KV with hash-chained prefix blocks (notebooks 7 and 8); what you measured is its CPU build |
# | SGLang | shared prefixes and agents (RadixAttention), structured output, large-scale deployments | a radix tree of cached KV (notebook 8); its CPU backend targets Xeon with AMX, here built from source |
# | TensorRT-LLM | NVIDIA GPUs only; NVIDIA's own kernels and quantization (FP8, FP4 on Blackwell) | its LLM API integrates with Triton Inference Server and Dynamo |
# | NVIDIA Dynamo | many GPUs and nodes | not an engine: runs TensorRT-LLM, vLLM or SGLang and adds disaggregated prefill/decode, KV-aware routing and KV offloading |
# | TGI | existing deployments | in maintenance mode since December 2025; Hugging Face points new users to vLLM, SGLang, llama.cpp or MLX |
# | llama.cpp / Ollama | laptops, Apple silicon, CPUs, edge devices | GGUF weights quantized to 1.5-8 bits, Metal/CUDA/HIP/Vulkan backends, minimal setup; `llama-server` batches continuously too |
#
# Sources are the rows of `workshop/data/engines_cited.json` above. Three habits of real
# evaluations this notebook shares: **sweep to the knee** instead of quoting one load (a single
# number hides where the engine falls over); **state the objectives** (goodput, the requests per
# second that meet a TTFT and ITL target, is what a service is paid for: vLLM's `vllm bench
# serve` reports it as `request_goodput`, NVIDIA's
# [AIPerf](https://docs.nvidia.com/aiperf/tutorials/metrics-analysis/benchmark-goodput-with-ai-perf)
# with `--goodput`); and
# **compare latency at a load every contender sustains**. Two it cannot: real teams benchmark on
# *their* traffic (prompt and answer lengths, prefix sharing, arrival bursts) on *their*
# hardware, and they weigh operations (upgrades, observability, the features in section 6) as
# heavily as speed. The chart is a way to ask the question, not its answer for your service.
