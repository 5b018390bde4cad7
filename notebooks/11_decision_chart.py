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
    app_title="11 · The decision chart: which engine, for which job, on your data",
)


@app.cell(hide_code=True)
def _():
    import marimo as mo

    return (mo,)


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    # 11 · The decision chart: which engine, for which job, on your data

    [![Open in Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/llm-inference-workshop/llm-inference-workshop/blob/main/notebooks/11_decision_chart.ipynb)
    [![Open in molab](https://marimo.io/molab-shield.svg)](https://molab.marimo.io/github/llm-inference-workshop/llm-inference-workshop/blob/main/notebooks/11_decision_chart.py)

    Notebook 10 swept every engine to its knee on three workloads and wrote a **showdown
    folder**. This notebook sends no load at all: it reads those folders and answers the question
    people actually ask, *which engine should I use?*, in the only honest form, **for which
    workload and under which constraint**:

    1. finds your showdown folders (`results/showdown-*`, and any folder named in
       `WORKSHOP_SHOWDOWN_DIRS`), or, when there is none, the project's committed reference run,
       and says which one you are looking at;
    2. tabulates every engine at its knee: load, throughput, time to first token (TTFT), gaps
       between tokens (ITL), goodput, prefix-cache hits, KV cache use;
    3. names a winner, with its margin, for each workload and constraint, and draws the chart;
       the objectives (SLO) and the engines compared are yours to change;
    4. puts beside it what was **not measured here**: features such as structured output or
       multi-LoRA, hardware support, engines you cannot run on this machine (TensorRT-LLM, NVIDIA
       Dynamo, TGI, llama.cpp / Ollama) and the figures the engines publish about themselves,
       each with its source and date.

    The helpers live in `workshop/decision.py` (its docstring states every rule used below) and
    `workshop/decision_chart.py` (the figure).
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
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## 1. Whose numbers are these?

    A showdown folder holds `showdown.json` (the command, the machine, the date, the engines with
    their server arguments, the objectives) and one load sweep per engine and workload. Several
    folders are merged: for each engine and workload the run that finished wins over one that
    failed, and between two that finished the newer folder wins. Any subset of engines and
    workloads works; a run that failed is shown with its reason.
    """)
    return


@app.cell
def _():
    from workshop import decision, decision_chart, ui

    showdown_roots, showdown_source = decision.choose_roots()
    showdown = decision.load(*showdown_roots)
    _where = ", ".join(f"`{p}`" for p in decision.default_places())
    if showdown_source == "yours":
        _head = (f"**Your showdown data**: {len(showdown.roots)} folder(s) found in {_where}.")
    elif showdown_source == "reference":
        _head = ("## ⚠ These are not your measurements\n\nNo showdown folder of yours was found in "
                 f"{_where}, so everything below is drawn from **the project's committed reference "
                 "run**. Run notebook 10 (or `python benchmarks/showdown.py`) to draw it from your "
                 "own machine.")
    else:
        _head = (f"## ⚠ No showdown data\n\nNo showdown folder was found in {_where}, and this "
                 "installation has no reference run. Run notebook 10 or `python benchmarks/showdown.py` "
                 "first; the sections on cited facts below still work.")
    ui.md(_head + "\n\n" + "\n".join(f"- {r.describe()}; objectives: {r.objectives}" for r in showdown.roots)
          + "".join(f"\n- ⚠ {w}" for w in showdown.warnings)
          + "".join(f"\n- {old.engine} / {old.workload} from `{old.root.path.name}` ({old.status}) "
                    f"replaced by the run in `{new.root.path.name}`" for old, new in showdown.replaced))
    return decision, decision_chart, showdown, ui


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    **Exercise 1 (predict, then compute).** Before looking at any table: on the workload below
    (the one with the most engines that kept up at some load), by what factor do you expect the
    fastest engine's throughput at its knee to beat the second fastest's? Think about what you
    saw in notebooks 7 and 8: continuous batching, paged KV, prefix caching, a one-request-at-a-time
    baseline.
    """)
    return


@app.cell
def _(showdown, ui):
    _counts = {w: sum(1 for (e, w2), r in showdown.runs.items() if w2 == w and r.ok) for w in showdown.workloads}
    exercise_workload = max(_counts, key=_counts.get) if _counts else None
    ui.md(f"The workload for the exercises: **{exercise_workload}** "
          f"({_counts.get(exercise_workload, 0)} engines with a finished sweep)." if exercise_workload
          else "No workload to predict on: there is no showdown data.")
    return (exercise_workload,)


@app.cell
def _():
    my_throughput_margin = None    # your prediction: fastest / second fastest, e.g. 2.0
    return (my_throughput_margin,)


@app.cell
def _(decision, exercise_workload, my_throughput_margin, showdown, ui):
    _default_rows = decision.knee_table(showdown)
    exercise_throughput = (decision.decide(_default_rows, exercise_workload, "throughput")
                           if exercise_workload else None)
    if exercise_throughput is not None and exercise_throughput.margin is not None:
        exercise_1 = ui.compare(my_throughput_margin, exercise_throughput.margin,
                                f"throughput margin on {exercise_workload} "
                                f"({exercise_throughput.winner or exercise_throughput.tied[0]} over "
                                f"{exercise_throughput.runner_up}"
                                + ("; no engine met the objectives at any load, so this is capacity alone, "
                                   "objectives ignored" if exercise_throughput.ignores_objectives else "")
                                + ")", "x", how="computed")
    else:
        exercise_1 = ui.md("Fewer than two engines kept up at any load on this workload: there is no margin to predict.")
    exercise_1
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## 2. Your objectives, your engines

    The knee of each sweep is the highest load the engine kept up with *and* met the objectives
    at (its p99 TTFT and p99 ITL within them); goodput counts the requests whose first token and
    every gap between tokens met them. Both are recomputed from the stored per-request timelines
    when you move the objectives: nothing is run again. The sliders start at the objectives of
    the newest folder (stated in notebook 10, or derived from its run: see section 1); 0 means
    no objective. The tie
    band is the margin below which two engines are called even. Type engine or workload labels,
    comma-separated, to compare a subset (`all` for everything). In Jupyter, re-run the cells
    below after changing a control; marimo re-runs them.
    """)
    return


@app.cell
def _(showdown, ui):
    # the newest folder's objectives (rounded to the ms), with room above them to loosen
    slo_start = {k: round(showdown.slo[k] or 0) for k in ("ttft_ms", "itl_ms")}
    slo_ttft = ui.slider(0, max(30000, 3 * slo_start["ttft_ms"]), slo_start["ttft_ms"], 1,
                         "TTFT objective, p99 (ms; 0: none)")
    slo_ttft
    return slo_start, slo_ttft


@app.cell
def _(slo_start, ui):
    slo_itl = ui.slider(0, max(5000, 3 * slo_start["itl_ms"]), slo_start["itl_ms"], 1, "ITL objective (ms; 0: none)")
    slo_itl
    return (slo_itl,)


@app.cell
def _(decision, ui):
    tie_band = ui.slider(0, 50, int(round(100 * decision.TIE_WITHIN)), 1, "tie band (%)")
    tie_band
    return (tie_band,)


@app.cell
def _(showdown, ui):
    engine_choice = ui.text("all", f"engines (of: {', '.join(showdown.engines) or 'none'})")
    engine_choice
    return (engine_choice,)


@app.cell
def _(showdown, ui):
    workload_choice = ui.text("all", f"workloads (of: {', '.join(showdown.workloads) or 'none'})")
    workload_choice
    return (workload_choice,)


@app.cell
def _(
    decision,
    engine_choice,
    showdown,
    slo_itl,
    slo_ttft,
    tie_band,
    ui,
    workload_choice,
):
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
    return (
        chosen,
        chosen_engines,
        chosen_slo,
        chosen_workloads,
        knee_rows,
        verdicts,
    )


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## 3. Every engine at its knee

    One row per engine and workload. *Knee sessions/s (asked)* is the rate the client was told to
    start sessions at (a session is one request on ShareGPT and shared-prefix, a whole multi-turn
    conversation on agentic); *offered* is the requests per second it really sent over the
    point's steady window (a `+` marks a knee at the highest load tried: the engine's limit is
    higher). Throughput is the steady request rate times
    the mean output tokens per request. TTFT and ITL are at that load; *SLO met* is the share of
    requests that met both objectives; *prefix hits* and *peak KV* are the server's own gauges
    (a `-` where the engine does not report them).
    """)
    return


@app.cell
def _(decision, knee_rows, ui):
    ui.table(decision.display_rows(knee_rows))
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    And what ran: each engine's configuration as its server reported it, and whether it passed
    the correctness gate (notebook 10, section 3) before it was swept. An engine that answered
    wrongly has no knee and is ranked nowhere. *not checked* marks runs made before the gate
    existed (the committed reference run among them). The chart's legend repeats each line, and a
    verdict between engines whose set-ups differ in a way that can favour one says how, in the
    table under the chart.
    """)
    return


@app.cell
def _(chosen, decision, ui):
    ui.table(decision.setup_rows(chosen))
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## 4. The chart

    Each cell names the winner on that workload under that constraint and its margin (best /
    runner-up; ≥ marks a knee at the highest load tried, where the margin is a lower bound), in
    the winner's colour (darker: a margin of at least 1.5). **Latency and KV memory are compared at
    one common load per workload, the lowest of the engines' knees**: every engine compared kept
    up there. Comparing each engine at its own knee would make the engine that was pushed harder
    look slower. Below, each engine's throughput at its knee.
    """)
    return


@app.cell
def _(chosen, chosen_engines, decision_chart, knee_rows, verdicts):
    decision_chart.plot_decision(verdicts, knee_rows, decision_chart.title_for(chosen), engines=chosen_engines)
    return


@app.cell
def _(decision, ui, verdicts):
    ui.table(decision.verdict_rows(verdicts))
    return


@app.cell
def _(chosen_workloads, decision, knee_rows, tie_band, ui, verdicts):
    _lines = []
    for _w in chosen_workloads:
        _vs = {v.constraint: v for v in verdicts if v.workload == _w}
        _parts = []
        for _c, _v in _vs.items():
            _name = decision.CONSTRAINTS[_c][0]
            if _v.ignores_objectives:
                _name += (" (no engine met the objectives at any load: capacity alone, the most at any "
                          "load tried, objectives ignored)")
            if _v.outcome == "win":
                _parts.append(f"{_name}: **{_v.winner}**, {_v.margin_text} {_v.runner_up}")
            elif _v.outcome == "tie":
                _parts.append(f"{_name}: a tie between {', '.join(_v.tied)} (within {tie_band.value} %)"
                              + _v.lead_text)
            elif _v.outcome == "only":
                _parts.append(f"{_name}: only {_v.winner} qualifies")
            else:
                _parts.append(f"{_name}: no engine qualifies")
        _common = decision.common_load(knee_rows, _w)
        _lines.append(f"- **{_w}**" + (f" (common load {_common:.3g} req/s)" if _common else "") + ": "
                      + "; ".join(_parts) + ".")
    _excluded = sorted({f"{e} on {v.workload}: {why}" for v in verdicts for e, why in v.excluded.items()})
    ui.md("On this data:\n\n" + "\n".join(_lines)
          + ("\n\nLeft out of some comparisons: " + "; ".join(_excluded) + "." if _excluded else ""))
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    **Exercise 2 (predict, then compute).** Halve the TTFT objective. The goodput of the engine
    that wins goodput on the exercise workload counts only the requests whose first token came
    within the objective: how many requests per second will it keep under the halved one?
    """)
    return


@app.cell
def _():
    my_goodput_half = None    # your prediction in req/s
    return (my_goodput_half,)


@app.cell
def _(
    chosen,
    chosen_slo,
    decision,
    exercise_workload,
    my_goodput_half,
    ui,
    verdicts,
):
    _gv = next((v for v in verdicts if v.workload == exercise_workload and v.constraint == "goodput"), None)
    goodput_winner = (_gv.winner or (_gv.tied[0] if _gv.tied else None)) if _gv else None
    goodput_full = _gv.values[goodput_winner] if goodput_winner else None
    half_slo = decision.slo_of(chosen_slo.ttft_ms / 2 if chosen_slo.ttft_ms else None, chosen_slo.itl_ms)
    exercise_goodput = (decision.knee_row(chosen.runs[(goodput_winner, exercise_workload)], half_slo)["best_goodput"]
                        if goodput_winner and half_slo.ttft_ms else None)
    if exercise_goodput is not None:
        exercise_2 = ui.compare(my_goodput_half, exercise_goodput,
                                f"best goodput of {goodput_winner} on {exercise_workload} with p99 TTFT ≤ "
                                f"{half_slo.ttft_ms:g} ms", "req/s", how="computed")
    else:
        exercise_2 = ui.md("No engine has goodput on the exercise workload with these choices."
                           if chosen_slo.ttft_ms else "There is no TTFT objective to halve (set one above).")
    exercise_2
    return exercise_goodput, goodput_full, goodput_winner


@app.cell
def _(exercise_goodput, goodput_full, goodput_winner, ui):
    if exercise_goodput is not None:
        exercise_2_text = ui.md(
            f"Under the objectives above {goodput_winner} served {goodput_full:.3g} good req/s at best; with "
            f"the TTFT objective halved it keeps {exercise_goodput:.3g} "
            + (f"({exercise_goodput / goodput_full:.0%} of it). " if goodput_full else ". ")
            + "Goodput falls only when first tokens actually land between the two objectives: "
              "an engine whose p99 TTFT sits far below both loses nothing, one close to the old "
              "objective loses most. This is why a benchmark's verdict depends on the SLO you bring.")
    else:
        exercise_2_text = ui.md("")
    exercise_2_text
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    **Exercise 3 (predict, then compute).** The common load is set by the slowest engine that
    kept up somewhere. Drop that engine: at what load (req/s) will the latency comparison on the
    exercise workload then run?
    """)
    return


@app.cell
def _():
    my_common_load = None    # your prediction in req/s
    return (my_common_load,)


@app.cell
def _(decision, exercise_workload, knee_rows, my_common_load, ui):
    _ex_rows = [r for r in knee_rows if r["workload"] == exercise_workload]
    exercise_common = decision.common_load(knee_rows, exercise_workload) if exercise_workload else None
    _setter = next((r["engine"] for r in _ex_rows if not r["no_knee"] and r["knee_offered"] == exercise_common), None)
    _without = [r for r in _ex_rows if r["engine"] != _setter]
    exercise_common_after = decision.common_load(_without, exercise_workload) if _setter else None
    if exercise_common_after is not None:
        exercise_3 = ui.compare(my_common_load, exercise_common_after,
                                f"common load on {exercise_workload} without {_setter} "
                                f"(with it: {exercise_common:.3g} req/s)", "req/s", how="computed")
    else:
        exercise_3 = ui.md("Fewer than two engines have a knee on the exercise workload: no common load to move.")
    exercise_3
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    Dropping the slowest engine raises the load at which the others are compared, where their
    queues and batch sizes are larger, and can change which one wins on latency. Try it with the
    engine control above: a latency verdict is always a verdict *at a load*.
    """)
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## 5. What these results show, and what they do not
    """)
    return


@app.cell
def _(chosen_workloads, showdown, ui, verdicts):
    _machine = showdown.newest.machine if showdown.newest else "no machine"
    _model = showdown.newest.manifest.get("model", "?") if showdown.newest else "?"
    _mode = showdown.newest.mode if showdown.newest else "?"
    _gpu = bool(showdown.newest and (showdown.newest.manifest.get("machine") or {}).get("gpu"))
    _shifted = [_w for _w in chosen_workloads
                if len({_v.winner for _v in verdicts if _v.workload == _w and _v.outcome == "win"}) > 1]
    ui.md(
        f"These numbers come from **{_model}** on **{_machine}**, in a **{_mode}** run. "
        + ("A quick run sends a handful of requests per load point: its p99s are the few slowest "
           "requests, and a knee is only resolved to a few load steps. Treat its margins as the shape "
           "of an answer, not the answer. " if _mode == "quick" else "")
        + ("" if _gpu else
           "A 135M-parameter model on a few CPU cores is not a 70B model on an H100: the engines' "
           "GPU kernels (FlashAttention, CUDA graphs, FP8) do not run at all, and the CPU builds "
           "exercise their schedulers, KV managers and prefix caches, not their kernels. ")
        + "What is expected to carry over: **which design wins on which workload**: prefix caching "
          "on the shared-prefix and agentic workloads (the saving is prefill the engine does not "
          "redo, on any hardware), continuous batching over one-request-at-a-time serving"
        + (f", and that the winner depends on the constraint (in this run it changed with the "
           f"constraint on {', '.join(_shifted)}). " if _shifted else
           " (in this run no workload's winner changed with the constraint). ")
        + "What is not: the absolute numbers, the "
          "size of each margin (a GPU shifts the balance between prefill, decode and scheduler "
          "overhead: vLLM's own 2024 profiling of Llama 3 8B on one H100 found only 38 % of the time "
          "on the GPU, the rest in its HTTP server and scheduler, "
          "[vLLM blog, 2024-09-05](https://blog.vllm.ai/2024/09/05/perf-update.html)), and close "
          "calls inside the tie band.")
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ### The committed reference runs: two CPUs, two stages

    The project keeps a full showdown from two kinds of CPU. On a Xeon with AMX both production
    engines run the kernels their CPU documentation describes: vLLM's AMX attention in bf16 and
    SGLang's `intel_amx` backend. On an EPYC with AVX2 only, SGLang's CPU engine runs outside
    the CPUs it supports (no AMX, no float32), so its numbers there say more about that than
    about SGLang. Whether each run is a **fair stage** for vLLM against SGLang is computed
    below from what ran: both answers checked and right, neither outside its supported
    hardware, and equal limits (dtype, prefix cache on, requests at once, KV tokens). Compiled
    or eager and the attention kernel may differ: each is the engine's own documented choice.
    """)
    return


@app.cell
def _(decision, ui):
    reference_stage_runs = {_name: decision.load(_path) for _name, _path in decision.reference_stages().items()}
    ui.table([{"stage": _name, "run": _r.newest.describe(), **decision.stage_fairness(_r)}
              for _name, _r in reference_stage_runs.items()]) if reference_stage_runs else ui.md(
        "This installation has no committed reference run.")
    return (reference_stage_runs,)


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    The same question on both stages: who wins each workload under each constraint, and does
    the winner change with the CPU?
    """)
    return


@app.cell
def _(decision, reference_stage_runs, ui):
    stage_rows = decision.compare_stages(reference_stage_runs) if len(reference_stage_runs) > 1 else []
    ui.table(stage_rows) if stage_rows else ui.md("Only one reference stage is installed: nothing to set side by side.")
    return (stage_rows,)


@app.cell
def _(decision, reference_stage_runs, stage_rows, ui):
    _fair = [_n for _n, _r in reference_stage_runs.items() if decision.stage_fairness(_r)["fair"]]
    _changed = [f"{_row['workload']} / {_row['constraint']}" for _row in stage_rows if _row["same winner"] == "no"]
    ui.md((f"**Fair stage for vLLM against SGLang: {', '.join(_fair)}.** " if _fair else
           "**Neither stage is fair for vLLM against SGLang** (see the table above). ")
          + (f"The winner changes with the CPU in {len(_changed)} of {len(stage_rows)} cells: "
             + ", ".join(_changed) + "." if _changed else
             "The winner is the same on both CPUs in every cell." if stage_rows else ""))
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## 6. Not measured here: operational needs and engines you cannot run

    Everything in this section comes from the engines' own documents
    (`workshop/data/engines_cited.json`, one source per cell), **not from any measurement on this
    machine**. *via backend* means a serving layer that inherits the feature from the engine it
    runs; *partial* and *untested* are explained in the file's notes.
    """)
    return


@app.cell
def _(chosen, chosen_engines, decision, ui):
    _measured_kinds = [chosen.kind(e) for e in chosen_engines]
    cited = decision.load_cited()
    ui.md(f"> {cited['note']}\n\n"
          + ui.markdown_table(decision.feature_rows(cited=cited, measured=_measured_kinds)))
    return (cited,)


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    Which engines meet *your* operational needs? Type the features you cannot do without
    (`structured_output`, `multi_lora`, `speculative_decoding`, `prefix_caching`) and the hardware
    you have (`nvidia`, `amd`, `cpu`, `apple`), comma-separated.
    """)
    return


@app.cell
def _(ui):
    needs_choice = ui.text("structured_output, multi_lora, nvidia", "needs")
    needs_choice
    return (needs_choice,)


@app.cell
def _(cited, decision, needs_choice, ui):
    _needs = [n.strip() for n in str(needs_choice.value).split(",")
              if n.strip() in decision.FEATURES + decision.HARDWARE]
    _unmet = decision.supporting(_needs, [e["id"] for e in cited["engines"]], cited)
    _names = {e["id"]: e["name"] for e in cited["engines"]}
    ui.md(f"Needs: {', '.join(_needs) or 'none recognised'}.\n\n"
          + "\n".join(f"- **{_names[k]}**: " + ("meets all of them (as documented)" if not miss else
                                                 "not documented as fully supported: " + ", ".join(miss))
                      for k, miss in _unmet.items())
          + "\n\nAn engine you measured that fails a need is out, whatever the chart says.")
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ### Published figures (the engines' own reports)

    Each engine publishes benchmarks where it wins: on its chosen hardware, model, workload and
    baseline versions. They are worth knowing and worth reading critically, and they are **not
    comparable with each other or with the measurements above**.
    """)
    return


@app.cell
def _(cited, decision, ui):
    ui.md("> **Not measured here.** Figures as published, with their setting and date.\n\n"
          + ui.markdown_table(decision.figure_rows(cited)))
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## 7. What the real engines do

    | engine | when teams pick it | what to know |
    |---|---|---|
    | vLLM | a broad default: many models and hardware targets, OpenAI-compatible server, LoRA, structured output, speculative decoding | paged KV with hash-chained prefix blocks (notebooks 7 and 8); what you measured is its CPU build |
    | SGLang | shared prefixes and agents (RadixAttention), structured output, large-scale deployments | a radix tree of cached KV (notebook 8); its CPU backend targets Xeon with AMX, here built from source |
    | TensorRT-LLM | NVIDIA GPUs only; NVIDIA's own kernels and quantization (FP8, FP4 on Blackwell) | its LLM API integrates with Triton Inference Server and Dynamo |
    | NVIDIA Dynamo | many GPUs and nodes | not an engine: runs TensorRT-LLM, vLLM or SGLang and adds disaggregated prefill/decode, KV-aware routing and KV offloading |
    | TGI | existing deployments | in maintenance mode since December 2025; Hugging Face points new users to vLLM, SGLang, llama.cpp or MLX |
    | llama.cpp / Ollama | laptops, Apple silicon, CPUs, edge devices | GGUF weights quantized to 1.5-8 bits, Metal/CUDA/HIP/Vulkan backends, minimal setup; `llama-server` batches continuously too |

    Sources are the rows of `workshop/data/engines_cited.json` above. Three habits of real
    evaluations this notebook shares: **sweep to the knee** instead of quoting one load (a single
    number hides where the engine falls over); **state the objectives** (goodput, the requests per
    second that meet a TTFT and ITL target, is what a service is paid for: vLLM's `vllm bench
    serve` reports it as `request_goodput`, NVIDIA's
    [AIPerf](https://docs.nvidia.com/aiperf/tutorials/metrics-analysis/benchmark-goodput-with-ai-perf)
    with `--goodput`); and
    **compare latency at a load every contender sustains**. Two it cannot: real teams benchmark on
    *their* traffic (prompt and answer lengths, prefix sharing, arrival bursts) on *their*
    hardware, and they weigh operations (upgrades, observability, the features in section 6) as
    heavily as speed. The chart is a way to ask the question, not its answer for your service.
    """)
    return


if __name__ == "__main__":
    app.run()
