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
    app_title="10 · The showdown: every engine, the same workloads, each pushed to its knee",
)


@app.cell(hide_code=True)
def _():
    import marimo as mo

    return (mo,)


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    # 10 · The showdown: every engine, the same workloads, each pushed to its knee

    [![Open in Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/llm-inference-workshop/llm-inference-workshop/blob/main/notebooks/10_engine_showdown.ipynb)
    [![Open in molab](https://marimo.io/molab-shield.svg)](https://molab.marimo.io/github/llm-inference-workshop/llm-inference-workshop/blob/main/notebooks/10_engine_showdown.py)

    Notebooks 1 to 9 took an engine apart one mechanism at a time. This one runs whole engines
    side by side, as you would before choosing one: the same model, requests and client, one
    engine on the machine at a time.

    | contender | what it is |
    |---|---|
    | **vLLM**, **SGLang** | their CPU builds behind the course's reference server (SGLang from its own environment: README, SGLang section) |
    | **mini-hash**, **mini-radix** | the course's teaching engine, with hash-chained prefix blocks (vLLM's design) or a radix tree (SGLang's), all else equal |
    | **hf** | Hugging Face `transformers`, one request at a time, no prefix cache: the floor |
    | on a GPU | vLLM and SGLang, each at its defaults and "tuned" with the flags their documentation points to for these workloads |

    | workload | what it sends |
    |---|---|
    | **ShareGPT** | real first turns of chats, independent of each other |
    | **agentic** | agents behind one long system prompt with tool schemas, resending their growing history every turn, forking sub-agents |
    | **shared-prefix** | groups of users behind the same system prompt |

    Each engine is swept to its **knee**, the highest load it keeps up with (`workshop bench
    sweep`, `docs/benchmarking.md`): a **synchronous probe**, one request at a time (the unloaded
    speed); a **throughput probe**, many at once (the most it can do); then **open-loop points**,
    Poisson arrivals from the synchronous rate to 1.5x the maximum. A point keeps up when, over
    its steady window, the engine completes what arrives and neither its queue, its requests in
    flight nor its time to first token (TTFT) grow. The knee is the last point that keeps up and
    meets the objectives (p99 TTFT and p99 inter-token latency, ITL).

    The results go to a folder under `results/` that notebook 11 turns into a decision chart;
    the same run, larger, is `python benchmarks/showdown.py`.
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
    ## 1. The field on this machine

    Which contenders this machine can run, and with which server arguments (SGLang only where
    `bash scripts/setup.sh --with-sglang` installed it). Engines already running are used as
    they are; the others are started here one at a time and stopped after their runs.
    """)
    return


@app.cell
def _(session, workshop):
    import os

    from workshop import ui
    from workshop.finale import decision
    from workshop.bench import showdown

    running_servers = {session.engine: session}
    if os.environ.get("WORKSHOP_HF_BASE_URL"):
        running_servers["hf"] = workshop.session.connect("hf", verbose=False)
    field_all = showdown.default_field(running=running_servers)
    ui.table(showdown.field_rows(field_all, running_servers))
    return decision, field_all, running_servers, showdown, ui


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    Pick the contenders, the plan and the objectives.

    | plan | workloads | requests per point | load points | contenders by default | time here |
    |---|---|---|---|---|---|
    | **quick** (CI) | shared-prefix | 4 | 2 | the two teaching engines and the engine already running | a few minutes |
    | **full** (`benchmarks/showdown.py`) | all three | 24 (agentic: 20 sessions of 6) | 3 | all | sweeps on 2 AVX2 cores (bf16 emulated, 2026-12-03): vLLM 27 min, SGLang 64, each teaching engine 23, hf 32; on 2 AVX-512 cores with native bf16 (2026-12-07): 7, 21, 7 and 19, the whole notebook 65 min |

    Four requests per point are too few to judge a knee: the comparisons then fall back to
    capacity and the lightest load. Full runs are committed in `benchmarks/reference_results/`:
    `showdown-amx/` (a Xeon with AMX, every engine as documented, every answer checked) and
    `showdown-cpu/` (AVX2 only).

    The **objectives** are yours to state; left at 0, one is derived from the run (section 4).
    In Jupyter, re-run the cells below after changing a control; marimo re-runs them.
    """)
    return


@app.cell
def _(field_all, running_servers, showdown, ui, workshop):
    # Quick mode (CI): the teaching engines (they start in seconds) and the engine already up; not the
    # baseline (the slowest to sweep), nor vLLM or SGLang started afresh (a minute or more each).
    _quick_field = [c.label for c in field_all
                    if c.engine == "mini" or (c.label in running_servers and c.engine != "hf")]
    engines_text = ui.text(",".join(workshop.session.sweep([c.label for c in field_all], _quick_field)),
                           "contenders (comma-separated labels from the table)")
    plan_choice = ui.dropdown(["quick", "full"], workshop.session.sweep("full", "quick"), "plan")
    slo_ttft = ui.slider(0, 10000, 0, 1, "objective: p99 TTFT (ms; 0: derive it from the run)")
    slo_itl = ui.slider(0, 2000, 0, 1, "objective: p99 ITL (ms; 0: derive it from the run)")
    slo_factor = ui.slider(1.5, 10, showdown.Plan().slo_factor, 0.5,
                           "a derived objective: x the best unloaded latency")
    return engines_text, plan_choice, slo_factor, slo_itl, slo_ttft


@app.cell
def _(engines_text):
    engines_text
    return


@app.cell
def _(plan_choice):
    plan_choice
    return


@app.cell
def _(slo_ttft):
    slo_ttft
    return


@app.cell
def _(slo_itl):
    slo_itl
    return


@app.cell
def _(slo_factor):
    slo_factor
    return


@app.cell
def _(
    engines_text,
    plan_choice,
    running_servers,
    showdown,
    slo_factor,
    slo_itl,
    slo_ttft,
    ui,
):
    from dataclasses import replace

    from workshop.bench.request_metrics import SLO

    _known = showdown.known_contenders()
    chosen = [_known[x.strip()] for x in engines_text.value.split(",") if x.strip() in _known]
    plan = replace(showdown.Plan.quick() if plan_choice.value == "quick" else showdown.Plan.full(),
                   slo=SLO(ttft_ms=float(slo_ttft.value) or None, itl_ms=float(slo_itl.value) or None),
                   slo_factor=float(slo_factor.value))
    contenders = showdown.with_servers(chosen, running_servers)
    _objective = {key: f"p99 {name} ≤ {getattr(plan.slo, key):.0f} ms" if getattr(plan.slo, key)
                  else f"p99 {name} derived from the run" for key, name in showdown.OBJECTIVES}
    ui.md(f"**{len(contenders)} contenders** ({', '.join(c.label for c in contenders)}) x "
          f"**{len(plan.workloads)} workloads** ({', '.join(plan.workloads)}), the {plan_choice.value} plan; "
          f"objectives: {', '.join(_objective.values())}.")
    return contenders, plan


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## 2. The workloads, before any engine sees them

    **Prefix reuse**, computed from the requests: the share of prompt tokens a perfect prefix
    cache could skip (an earlier prompt or answer began the same way), every hit rate's ceiling.
    """)
    return


@app.cell
def _(plan, session, showdown, ui):
    from workshop.bench.tokenizer import Tokenizer
    from workshop.bench.workloads import prefix_reuse_ratio

    workload_rows, workload_sequences = showdown.describe_workloads(plan, Tokenizer.load(session.model))
    _most = max(workload_rows, key=lambda r: r["prefix reuse"] or 0)
    _skip, _prompt = _most["prefix reuse"], _most["mean prompt (tok)"]
    ui.md(ui.markdown_table(workload_rows) + f"\n\n**On {_most['workload']}, a perfect cache could skip {_skip:.0%} "
          f"of the prompt tokens** ({_skip * _prompt:.0f} of {_prompt:.0f} per request on average).")
    return prefix_reuse_ratio, workload_rows, workload_sequences


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    **Exercise 1 (predict, then measure).** The two teaching-engine contenders differ only
    in how they find a cached prefix: hashed blocks or a radix tree. On the **shared-prefix**
    workload, what will the radix engine's **capacity** (the most output tokens/s it delivers at
    any load tried, its throughput probe included, objectives aside) be, as a multiple of the
    hash engine's? (1.0 = the same.) Write it, run the showdown; section 6 compares.
    """)
    return


@app.cell
def _():
    predict_radix_over_hash = None   # your prediction: radix capacity / hash capacity, e.g. 1.0
    return (predict_radix_over_hash,)


@app.cell(hide_code=True)
def _():
    from workshop.ui import reveal_button as _reveal_button

    reveal_exercise_1 = _reveal_button("Measure")
    reveal_exercise_1
    return (reveal_exercise_1,)


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## 3. Run it

    Every contender in turn: start (unless running), check its answers, sweep every workload,
    stop. The prefix cache is emptied before each load point; a line says where each knee is.

    **Answers first.** A benchmark counts tokens, not whether they are right: a wrong layer
    costs the same FLOPs, so a broken configuration can top the table. Before its sweep, each
    contender answers fixed chat prompts greedily (short ones sent three times, so the repeats
    come from the prefix cache; questions behind one long system prompt; ShareGPT first turns),
    compared token by token with Hugging Face `transformers` in float32 on the same checkpoint
    (`workshop bench verify`). A contender that answers wrongly is recorded and not swept.
    """)
    return


@app.cell
def _(
    contenders,
    decision,
    mo,
    plan,
    plan_choice,
    reveal_exercise_1,
    session,
    showdown,
    ui,
):
    mo.stop(not reveal_exercise_1.value,
            mo.md("_Write your prediction for Exercise 1, then press **Measure** under it._"))
    showdown_root = showdown.new_root()
    showdown.run_showdown(showdown_root, contenders, plan, model=session.model, mode=plan_choice.value,
                          command="notebook 10")
    showdown_results = decision.load(showdown_root)
    showdown_sweeps = showdown_results.sweeps()
    ui.md(f"Results in `{showdown_root}`; notebook 11 draws the decision chart from this folder.")
    return showdown_results, showdown_sweeps


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    What ran (each server's `/server_info`) and whether it answered right (the gate). Every
    number below belongs to a row of this table.
    """)
    return


@app.cell
def _(decision, showdown_results, ui):
    ui.table(decision.setup_rows(showdown_results))
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    Where an answer departed from the reference. Two correct engines that add in another order
    (bf16 rounding, another kernel) can flip a **near tie**: a token the reference scored within
    the gate's margin (in logits) of its own choice. A departure far below that is **wrong**.
    """)
    return


@app.cell
def _(decision, showdown_results, ui):
    from workshop.bench import verify

    departure_rows = decision.departure_rows(showdown_results)
    ui.table(departure_rows, floatfmt=".3f") if departure_rows else ui.md(
        "Every answer of every contender matched the reference token for token.")
    return (verify,)


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    Why the margin matters: the reference's own scores for the first token of its answer to
    "What is the capital of France?", computed here.
    """)
    return


@app.cell
def _(session, ui, verify):
    from reference_server.models import resolve_model

    _ref = verify.reference_for(resolve_model(session.model, prepare=False).path)
    _ids, _logits = _ref.generate((("user", "What is the capital of France?"),), 8)
    _top = _logits[0].topk(3)
    first_token_gap = float(_top.values[0] - _top.values[1])
    reference_answer = _ref.text(_ids)
    ui.md(ui.markdown_table([{"rank": _i + 1, "token": repr(_ref.tok.decode([_t])), "logit": _v}
                              for _i, (_t, _v) in enumerate(zip(_top.indices.tolist(), _top.values.tolist()))],
                             floatfmt=".3f")
          + f"\n\nThe reference answers {reference_answer!r}; its top two first tokens are "
          f"**{first_token_gap:.3f} logits** apart, against the gate's margin of {verify.TIE_MARGIN:g}: "
          + ("**a near tie**: an engine in another dtype may begin with the second token and still be "
             "right, and a check that only looked for the reference's words would fail it."
             if first_token_gap <= verify.TIE_MARGIN else
             "**a clear choice**: an engine that begins otherwise is wrong."))
    return (resolve_model,)


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## 4. The objectives

    Each engine's **unloaded** latency: the p99 TTFT and p99 ITL of its synchronous probe, one
    request at a time, on each workload.
    """)
    return


@app.cell
def _(showdown, showdown_sweeps, ui):
    unloaded_rows = showdown.unloaded_latency(showdown_sweeps)
    ui.table([{"workload": _r["workload"], "engine": _r["engine"], "unloaded p99 TTFT (ms)": _r["ttft_ms"],
               "unloaded p99 ITL (ms)": _r["itl_ms"]} for _r in unloaded_rows], floatfmt=",.0f")
    return (unloaded_rows,)


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    An objective you did not state is derived from that table, times the factor you set: for
    **TTFT** the unloaded p99 TTFT; for **ITL** the unloaded p99 ITL **plus** the p99 TTFT (a
    continuous batcher prefills a newcomer's prompt in the same step as everybody's next token,
    so under load an answer's longest gap is about one decode step plus one prefill). Take the
    best (lowest) engine on each workload, then the highest workload
    (`showdown.derive_objectives`). Derived here, next to what the run recorded in
    `showdown.json` and judged every knee below with:
    """)
    return


@app.cell
def _(plan, showdown, showdown_results, ui, unloaded_rows):
    derived_here = showdown.derive_objectives(unloaded_rows, plan.slo_factor)
    objectives_used = showdown_results.newest.manifest["slo"]
    ui.md(ui.markdown_table([{"objective": f"p99 {_name} (ms)",
                               "derived here": (derived_here[_key] or {}).get("ms"),
                               "used by the run": objectives_used[_key],
                               "how": "stated" if objectives_used["how"][_key].get("stated") else "derived"}
                              for _key, _name in showdown.OBJECTIVES], floatfmt=",.0f")
          + f"\n\nObjectives of this run: {showdown_results.newest.objectives}.")
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## 5. The curves

    Top row: throughput achieved against load offered (requests/s over each point's steady
    window): on the dashed line an engine keeps up, where its curve bends away it saturates; a
    star is a knee, a hollow point held too few requests to judge. Bottom row: p99 TTFT against
    load (log scale), the objective dotted: queueing shows here before throughput flattens.
    """)
    return


@app.cell
def _(showdown_sweeps):
    from workshop.bench.plots import plot_showdown

    plot_showdown(showdown_sweeps, "ttft_ms")
    return (plot_showdown,)


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    The same loads against p99 ITL, how smoothly an answer scrolls once it started. A bigger
    batch makes every step slower, so ITL grows with load even while throughput still rises.
    """)
    return


@app.cell
def _(plot_showdown, showdown_sweeps):
    plot_showdown(showdown_sweeps, "itl_ms")
    return


@app.cell
def _(decision, showdown_sweeps, ui):
    ttft_growth = decision.ttft_growth(showdown_sweeps)
    _g = max(ttft_growth, key=lambda r: r["growth"] or 0, default=None)
    ui.md(f"**From its lightest load to its heaviest, {_g['engine']}'s p99 TTFT on {_g['workload']} grew "
          f"{_g['growth']:.1f}x** ({_g['p99 TTFT, lightest load (ms)']:,.0f} to "
          f"{_g['p99 TTFT, heaviest load (ms)']:,.0f} ms), the most of any engine here."
          if _g and _g["growth"] else "No engine completed a load point in this run.")
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## 6. At the knee

    One row per engine and workload, read at its knee: the load it sustained, output tokens/s,
    latency percentiles, **goodput** (requests/s that met both objectives), the server's prefix
    hit rate and peak KV use; and, knee or not, its **capacity**: the most output tokens/s at
    any load tried (throughput probe included), objectives aside. The rules are in
    `workshop/finale/decision.py`'s docstring; notebook 11 charts them. Three exercises read it first.
    """)
    return


@app.cell
def _(
    decision,
    mo,
    predict_radix_over_hash,
    reveal_exercise_1,
    showdown_results,
    ui,
):
    mo.stop(not reveal_exercise_1.value,
            mo.md("_Write your prediction for Exercise 1, then press **Measure** under it._"))
    knee_rows = decision.knee_table(showdown_results)
    _r, _h = (decision.row_of(knee_rows, "shared-prefix", _e) for _e in ("mini-radix", "mini-hash"))
    radix_over_hash = (_r["capacity_tps"] / _h["capacity_tps"]
                       if _r and _h and _r["capacity_tps"] and _h["capacity_tps"] else None)
    (ui.compare(predict_radix_over_hash, radix_over_hash, "radix / hash capacity (output tok/s), shared-prefix")
     if radix_over_hash else ui.md("Exercise 1 needs both teaching-engine contenders to finish the shared-prefix "
                                   "workload (see the notes in the table)."))
    return knee_rows, radix_over_hash


@app.cell
def _(
    decision,
    knee_rows,
    mo,
    radix_over_hash,
    reveal_exercise_1,
    ui,
    workload_rows,
):
    # Worked answer to Exercise 1, collapsed until opened
    mo.stop(not reveal_exercise_1.value)
    _shared = next(r for r in workload_rows if r["workload"] == "shared-prefix") if radix_over_hash else None
    _cache_rows = (decision.cache_work_rows(knee_rows, "shared-prefix", ("mini-hash", "mini-radix"),
                                            _shared["mean prompt (tok)"]) if _shared else [])
    _out = _shared["mean output (tok)"] if _shared else 0   # work per request: uncached prompt + output
    _hash, _radix = ([r["prompt tokens computed per request"] for r in _cache_rows] if _cache_rows else (0, 0))
    expected_radix_over_hash = (_hash + _out) / (_radix + _out) if _cache_rows else None
    _off = radix_over_hash and abs(radix_over_hash / expected_radix_over_hash - 1) >= decision.TIE_WITHIN
    _sync = [r["one-at-a-time tok/s"] or 0 for r in _cache_rows] or [0, 0]
    ui.worked_answer(
        "Our radix tree matches **whole blocks**, like the hash chain (notebook 8): both find the same "
        "cached tokens and run the same model code. Capacity is output tokens per second of work; the "
        "work per request is the uncached prompt tokens plus the output:\n\n" + ui.markdown_table(_cache_rows)
        + f"\n\nExpected: ({_hash:.0f} + {_out:.0f}) / ({_radix:.0f} + {_out:.0f}) = "
          f"**{expected_radix_over_hash:.2f}** (hash's work over radix's). Measured: **{radix_over_hash:.2f}**, "
        + (f"outside the {decision.TIE_WITHIN:.0%} tie band: the cached tokens do not explain it. One at a time, "
           f"on the same cached tokens, radix delivered {_sync[1] / max(_sync[0], 1e-9):.2f}x hash's tok/s"
           + (": the machine differed between the runs" if abs(_sync[1] / max(_sync[0], 1e-9) - 1)
              >= decision.TIE_WITHIN else "") + ". Each capacity is one measurement ("
           + "; ".join(dict.fromkeys(r["capacity at"] for r in _cache_rows)) + "): one run cannot "
           "tell a gap this size from run-to-run variation; sweep both again to see whether it holds."
           if _off else
           f"inside the {decision.TIE_WITHIN:.0%} tie band: the lookup costs little next to a model step. "
           "SGLang's tree matches token by token (page size 1), where a radix cache can find more.")
        if radix_over_hash else "Both teaching-engine contenders must finish the shared-prefix workload.")
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    **Exercise 2 (predict, then measure).** Every sweep starts with a synchronous probe, one
    request at a time, which is how the baseline always serves. On the **shared-prefix**
    workload, how many times its own one-at-a-time output tokens/s will the contender with the
    most capacity deliver at its capacity? That ratio is what batching buys it here.
    """)
    return


@app.cell
def _():
    predict_batching_gain = None   # your prediction: capacity / one-at-a-time output tok/s, e.g. 4
    return (predict_batching_gain,)


@app.cell(hide_code=True)
def _():
    from workshop.ui import reveal_button as _reveal_button

    reveal_exercise_2 = _reveal_button("Measure")
    reveal_exercise_2
    return (reveal_exercise_2,)


@app.cell
def _(knee_rows, mo, predict_batching_gain, reveal_exercise_2, ui):
    mo.stop(not reveal_exercise_2.value,
            mo.md("_Write your prediction for Exercise 2, then press **Measure** under it._"))
    batching_rows = {r["engine"]: r for r in knee_rows
                     if r["workload"] == "shared-prefix" and r["capacity_tps"] and r["synchronous_tps"]}
    best_engine = max(batching_rows, key=lambda e: batching_rows[e]["capacity_tps"]) if batching_rows else None
    batching_gain = (batching_rows[best_engine]["capacity_tps"] / batching_rows[best_engine]["synchronous_tps"]
                     if best_engine else None)
    (ui.compare(predict_batching_gain, batching_gain,
                f"{best_engine}'s capacity / its one-at-a-time output tok/s, shared-prefix")
     if batching_gain else ui.md("Exercise 2 needs a contender that finished the shared-prefix workload "
                                 "with its synchronous probe."))
    return batching_gain, batching_rows, best_engine


@app.cell
def _(
    batching_gain,
    batching_rows,
    best_engine,
    decision,
    mo,
    reveal_exercise_2,
    showdown_sweeps,
    ui,
):
    # Worked answer to Exercise 2, collapsed until opened
    mo.stop(not reveal_exercise_2.value)
    _best_row = batching_rows.get(best_engine)
    batching_in_flight = decision.in_flight_at_capacity(
        showdown_sweeps["shared-prefix"].get(best_engine) if best_engine else None, _best_row)
    ui.worked_answer(
        "One at a time, every decode step serves one sequence; a batcher serves every request in "
        "flight in one step, reading all the weights once whatever the batch (notebook 3). If a step "
        f"of N cost what a step of one costs, batching would buy N. At its capacity "
        f"({_best_row['capacity_at']}) {best_engine} had **{batching_in_flight:.1f} requests in flight** on "
        f"average: expected **at most {batching_in_flight:.1f}x**. Measured: {_best_row['synchronous_tps']:.1f} "
        f"tok/s one at a time, {_best_row['capacity_tps']:.1f} at capacity, **{batching_gain:.2f}x**"
        + (f": a step of {batching_in_flight:.1f} sequences took {batching_in_flight / batching_gain:.2f}x a step of "
           "one (on a CPU the matmuls' arithmetic grows with the batch, and newcomers' prefills join steps)."
           if batching_gain <= batching_in_flight else
           ", more than the requests in flight: each request's work was cheaper under load than alone.")
        if batching_gain and batching_in_flight else
        "Needs a contender with a capacity and a synchronous probe on shared-prefix.")
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    **Exercise 3 (predict, then measure).** The workload table in section 2 gives the most any
    cache could skip on **shared-prefix**. What hit rate will the engine you connected to in the
    first cell report there, at its knee (or, without one, at its lightest load)? If that engine
    is not among the contenders, the question is about the first contender. Its block size is in
    section 3's table.
    """)
    return


@app.cell
def _():
    predict_hit_rate = None   # your prediction, 0-1, e.g. 0.4
    return (predict_hit_rate,)


@app.cell(hide_code=True)
def _():
    from workshop.ui import reveal_button as _reveal_button

    reveal_exercise_3 = _reveal_button("Measure")
    reveal_exercise_3
    return (reveal_exercise_3,)


@app.cell
def _(
    contenders,
    decision,
    knee_rows,
    mo,
    predict_hit_rate,
    reveal_exercise_3,
    session,
    ui,
):
    # The contender running the connected engine (the teaching engine: mini-hash), else the first.
    mo.stop(not reveal_exercise_3.value,
            mo.md("_Write your prediction for Exercise 3, then press **Measure** under it._"))
    hit_label = next((c.label for c in contenders if c.engine == session.engine),
                     contenders[0].label if contenders else None)
    _knee, _offered, hit_measured = decision.hit_rate_reading(decision.row_of(knee_rows, "shared-prefix", hit_label))
    hit_at = None if _knee is None else "its knee" if _knee else f"its lightest load ({_offered:.3g} req/s; no knee)"
    (ui.compare(predict_hit_rate, hit_measured, f"{hit_label} prefix hit rate at {hit_at}, shared-prefix")
     if hit_at and hit_measured is not None else
     ui.md(f"{hit_label or session.engine_name} reported no prefix-cache hit rate on the shared-prefix workload "
           "in this run (no cache, or not in the run)."))
    return hit_at, hit_label, hit_measured


@app.cell
def _(
    hit_at,
    hit_label,
    hit_measured,
    mo,
    prefix_reuse_ratio,
    reveal_exercise_3,
    showdown_results,
    ui,
    workload_sequences,
):
    # Worked answer to Exercise 3, collapsed until opened
    mo.stop(not reveal_exercise_3.value)
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
    # prompt tokens whole blocks allow to skip, less those the engine skipped
    _gap = (reuse_blocks - hit_measured) * _prompts if hit_measured is not None else 0
    ui.md(sanity.report(hit_violations)) if hit_violations else ui.worked_answer(
        f"The workload's prefix reuse (the ceiling) was **{reuse_tokens:.3f}**, for a cache matching "
        f"token by token. {hit_label} stores whole blocks of **{hit_block} tokens** and recomputes the "
        f"part of a shared prefix past its last whole block: over these {len(_seqs)} requests "
        f"({_prompts:,} prompt tokens) it can skip **{reuse_blocks:.3f}** (`prefix_reuse_ratio(..., "
        f"block={hit_block})`). Measured at {hit_at}: **{hit_measured:.3f}**, "
        + ("every whole block it could find." if abs(_gap) < 1 else
           f"{_gap:,.0f} prompt tokens short: a request that arrived while an earlier one with its "
           "prefix was still being prefilled found those blocks not yet written." if _gap > 0 else
           f"{-_gap:,.0f} prompt tokens over: the server counts more than this workload's prompts.")
        if hit_measured is not None else f"{hit_label} reported no hit rate.")
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    The whole table:
    """)
    return


@app.cell
def _(decision, knee_rows, ui):
    capacity_leaders = decision.capacity_leaders(knee_rows)
    _leads = "; ".join(f"{_c['workload']}: {_c['engine']}, {_c['capacity tok/s']:.0f} tok/s"
                       + (f", {_c['x runner-up']:.2f}x {_c['runner-up']}" if _c["runner-up"] else "") for _c in capacity_leaders)
    ui.md(ui.markdown_table(decision.display_rows(knee_rows)) + "\n\n**The most capacity** (output tok/s at any load "
          f"tried): {_leads or 'none in this run'}.")
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## 7. What this run shows, and what it does not

    Each workload's throughput verdict (margins under 10 % are ties: `decision.TIE_WITHIN`).
    Where no contender kept up within the objectives at any load, it ranks **capacity alone**.
    """)
    return


@app.cell
def _(decision, knee_rows, ui):
    run_verdicts = [decision.decide(knee_rows, _w, "throughput") for _w in dict.fromkeys(r["workload"] for r in knee_rows)]
    _wins = [v for v in run_verdicts if v.outcome == "win"]
    ui.md(ui.markdown_table([{_k: _row[_k] for _k in ("workload", "result", "values", "measured", "left out")}
                             for _row in decision.verdict_rows(run_verdicts)]) + "\n\n"
          + (("**" + "; ".join(f"{v.workload}: {v.winner}, {v.margin_text} {v.runner_up}"
                               + (" (capacity, objectives ignored)" if v.ignores_objectives else "")
                               for v in _wins) + ".**")
             if _wins else "**No workload has a winner in this run**: "
             + "; ".join(f"on {v.workload}, {len(v.excluded)} of {len(v.excluded) + len(v.values)} "
                         "contenders left out" + (f", a tie between {', '.join(v.tied)}" if v.tied else "")
                         for v in run_verdicts) + " (the table says why).")
          if run_verdicts else "No contender finished a sweep in this run.")
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    What it does **not** show. A 135M-parameter model on a laptop-class CPU differs from an
    H100 serving an 8B or 70B model in ways that change the ranking:

    * **Kernels.** Here each engine runs CPU kernels; on a GPU the production engines run
      FlashAttention-class kernels and CUDA graphs, and the per-step overheads that dominate a
      tiny model shrink next to a big one's matmuls. A speed difference here mostly says how
      good each CPU path is.
    * **What carries over** is mechanism: batching against one at a time, whether a prefix cache
      finds the shared prompt (workload and cache design, not hardware), how queues build.
    * **A shared machine.** Two cores shared with the client: a point can fall behind because
      the client was late (flagged client-limited, retried once). Run the full plan on a quiet
      machine before you believe a difference under about 10 %.
    """)
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## 8. Inside the teaching engine: what each speed switch buys here

    For one engine you can take its CPU path apart: the teaching engine keeps a switch for each
    technique that made it faster, the same flags its server takes.

    | switch | what it turns off |
    |---|---|
    | `--no-prepack` | weights reordered once into oneDNN's blocked bf16/fp16 layout; left as loaded, oneDNN reorders them at every call (float32 is never packed) |
    | `--kv-read slot` | reading each sequence's keys and values block by block; they are copied token by token instead (notebook 7, section 7) |
    | `--decode-attention sdpa` | attention written out (two matmuls and a softmax) for big bf16/fp16 decode batches; PyTorch's SDPA kernel runs for every batch |
    | `--no-cascade-attention` | the batch reading the shared system prompt's keys once; each sequence reads them itself (notebook 8, section 4) |

    One engine per variant (the defaults, then each switch off alone), in this process, holds
    the same batch behind one system prompt (radix cache: its blocks shared), in the server's dtype
    here (bf16 where the CPU has it); they step round-robin, so a slow moment falls on all alike.
    """)
    return


@app.cell
def _(ui):
    switch_seqs = ui.slider(1, 16, 8, 1, "sequences decoding together")
    switch_seqs
    return (switch_seqs,)


@app.cell
def _(ui):
    switch_shared = ui.slider(0, 1024, 640, 64, "system prompt tokens (shared)")
    switch_shared
    return (switch_shared,)


@app.cell
def _(ui, workshop):
    switch_own = ui.slider(16, 1024, workshop.session.sweep(256, 64), 16, "each sequence's own tokens")
    switch_own
    return (switch_own,)


@app.cell
def _(ui, workshop):
    switch_rounds = ui.slider(4, 40, workshop.session.sweep(12, 6), 2,
                              "decode steps per engine (more: a narrower noise band, a longer wait)")
    switch_rounds
    return (switch_rounds,)


@app.cell
def _(ui):
    from workshop.finale import engine_switches

    switch_device, _dtype = engine_switches.engine_dtype()
    switch_dtype = ui.dropdown(["bfloat16", "float32"], _dtype,
                               "dtype" + (" (bf16 is emulated on this CPU: slower)"
                                          if switch_device == "cpu" and _dtype == "float32" else ""))
    switch_dtype
    return engine_switches, switch_device, switch_dtype


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    **Exercise 4 (predict, then measure).** At the settings above, take the switch whose
    technique matters most: how many times the defaults' time will a decode step take with it
    off? Some switches change nothing for some batches or dtypes (the table says which); those
    variants run the defaults' code.
    """)
    return


@app.cell
def _():
    predict_worst_ratio = None      # your prediction: the slowest variant's step time / the defaults', e.g. 1.5
    return (predict_worst_ratio,)


@app.cell(hide_code=True)
def _():
    from workshop.ui import reveal_button as _reveal_button

    reveal_exercise_4 = _reveal_button("Measure")
    reveal_exercise_4
    return (reveal_exercise_4,)


@app.cell
def _(
    engine_switches,
    mo,
    resolve_model,
    reveal_exercise_4,
    switch_device,
    switch_dtype,
    switch_own,
    switch_rounds,
    switch_seqs,
    switch_shared,
    ui,
):
    mo.stop(not reveal_exercise_4.value,
            mo.md("_Write your prediction for Exercise 4, then press **Measure** under it._"))
    switch_rows, switch_step_ms = engine_switches.decode_step_rows(
        resolve_model("smollm2-135m").path, dtype=switch_dtype.value, device=switch_device,
        batch=int(switch_seqs.value), shared_tokens=int(switch_shared.value),
        own_tokens=int(switch_own.value), rounds=int(switch_rounds.value),
        progress=lambda names: ui.progress(names, title="engines"))
    ui.table(switch_rows)
    return switch_rows, switch_step_ms


@app.cell
def _(
    engine_switches,
    switch_device,
    switch_dtype,
    switch_own,
    switch_rows,
    switch_seqs,
    switch_shared,
    switch_step_ms,
):
    engine_switches.switches_figure(
        switch_rows, switch_step_ms,
        f"Decode steps of {int(switch_seqs.value)} sequences ({int(switch_shared.value)} shared + "
        f"{int(switch_own.value)} own tokens), {switch_dtype.value}, {switch_device}")
    return


@app.cell
def _(mo, predict_worst_ratio, reveal_exercise_4, switch_rows, ui):
    mo.stop(not reveal_exercise_4.value,
            mo.md("_Write your prediction for Exercise 4, then press **Measure** under it._"))
    switch_applied = [r for r in switch_rows[1:] if r["applies here"]]
    switch_worst = max(switch_applied, key=lambda r: r["slower than defaults"], default=None)
    (ui.compare(predict_worst_ratio, switch_worst["slower than defaults"],
                f"step time without `{switch_worst['variant']}`'s technique / the defaults'", "x")
     if switch_worst else ui.md("No switch changes the code for this batch in this dtype: move the "
                                "sliders (more sequences, a longer shared prompt, or bf16)."))
    return switch_applied, switch_worst


@app.cell
def _(
    engine_switches,
    mo,
    reveal_exercise_4,
    switch_dtype,
    switch_own,
    switch_rounds,
    switch_rows,
    switch_seqs,
    switch_shared,
    ui,
):
    # Worked answer to Exercise 4, collapsed until opened
    mo.stop(not reveal_exercise_4.value)
    from workshop.sizing import kvcache

    _cfg = kvcache.load_model("smollm2-135m")
    _weights = _cfg.params * (2 if switch_dtype.value == "bfloat16" else 4)
    _kv_token = kvcache.kv_bytes_per_token(_cfg, switch_dtype.value)
    _b, _sh, _own = int(switch_seqs.value), int(switch_shared.value), int(switch_own.value) + int(switch_rounds.value) // 2
    switch_bytes = engine_switches.bytes_rows(switch_rows, weight_bytes=_weights, kv_bytes_per_token=_kv_token,
                                              batch=_b, shared=_sh, own=_own)
    switch_expected_worst = max(switch_bytes[1:], key=lambda r: r["bytes / defaults'"])
    _expected_worst = switch_expected_worst["bytes / defaults'"]
    _defaults_mb, _defaults_ms = switch_bytes[0]["MB moved per step"], switch_rows[0]["ms per step"]
    ui.worked_answer(
        "Notebook 3's roofline: a small batch's decode step is bound by memory traffic: every weight "
        "once (three times without prepacking: the reorder reads and writes each first) and each "
        "sequence's keys and values (the shared prompt's once per batch with cascade attention). "
        f"Here {_weights / 1e6:,.0f} MB of {switch_dtype.value} weights, {_kv_token:,.0f} bytes of KV per "
        f"token, {_b} sequences of {_sh} shared + {_own} own tokens (halfway through the timed steps):"
        "\n\n" + ui.markdown_table(switch_bytes, floatfmt=".3g")
        + f"\n\nBy bytes, **`{switch_expected_worst['variant']}`** would matter most, **{_expected_worst:.2f}x**; "
          "slot reads and SDPA move the defaults' bytes (in smaller copies, another kernel). The defaults "
          f"moved {_defaults_mb / 1e3:.2f} GB in {_defaults_ms:.1f} ms, **{_defaults_mb / _defaults_ms:.1f} "
          "GB/s**: where a measured ratio departs from the bytes, a step is more than memory traffic "
          "(per-call overheads, arithmetic that grows with the batch).")
    return


@app.cell
def _(switch_applied, switch_rows, switch_worst, ui):
    _same_code = [r["slower than defaults"] for r in switch_rows[1:] if not r["applies here"]]
    _differ = ", ".join(f"`{r['variant']}`" for r in switch_applied if not r["same tokens"])
    _slot = next(r for r in switch_rows if r["variant"] == "--kv-read slot")
    ui.md((f"**Without `{switch_worst['variant']}`'s technique a step took {switch_worst['slower than defaults']:.2f}x "
           f"the defaults' time**, the most of {len(switch_applied)} switches that change the code here."
           if switch_worst else "**No switch changes the code at these settings.**")
          + (f" Variants running the defaults' code: {min(_same_code):.2f}-{max(_same_code):.2f}x, this run's noise."
             if _same_code else "")
          + (" Slot-by-slot reads wrote the defaults' tokens exactly (checked)." if _slot["same tokens"] else
             " **Slot-by-slot reads copy the same numbers, yet their tokens differed: a bug.**")
          + (f" Tokens differed for {_differ}: another order of sums can flip a bf16 near tie." if _differ else ""))
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## What the real engines do

    * **Their own benchmark clients.** vLLM ships `vllm bench serve` (datasets `sharegpt`, `random`,
      `prefix_repetition`; `--request-rate`, `--max-concurrency`, `--goodput` with SLOs), SGLang
      `python -m sglang.bench_serving` (`--dataset-name sharegpt`, `generated-shared-prefix`). Each
      engine's published comparisons use its own client and workloads, one reason they disagree.
    * **Sweeps to a knee.** GuideLLM (`guidellm benchmark --profile sweep`) runs this notebook's
      three phases (synchronous, throughput, rates in between) and leaves a warm-up and a
      cool-down out of each measurement.
    * **Tuning for a workload.** vLLM: `--max-num-seqs` and `--max-num-batched-tokens` (batch
      size, prefill chunk), prefix caching on by default in V1. SGLang: `--schedule-policy lpm`
      (the longest cached prefix first), `--chunked-prefill-size`, `--max-running-requests`.
      Production comparisons report their flags; one without them is not reproducible.
    * **Switching their speed techniques off, one at a time** (section 8). vLLM's guide "How to
      debug the vLLM-torch.compile integration"
      ([docs.vllm.ai](https://docs.vllm.ai/en/stable/design/debug_vllm_compile/)) gives a flag
      per piece: `--enforce-eager` turns off torch.compile and CUDA graphs, `-cc.mode=0` only
      torch.compile, `-cc.cudagraph_mode=NONE` only CUDA graphs, `-cc.backend=eager` only
      TorchInductor (torch.compile generates optimized kernels; CUDA graphs eliminate CPU
      overhead, a step replayed as one launch). SGLang has `--disable-cuda-graph` and
      `--disable-radix-cache`. The teaching engine has neither compiler nor graphs (on this
      course's CPUs torch.compile made its steps slower: `docs/runs/mini_engine_speed.md`).
    """)
    return


if __name__ == "__main__":
    app.run()
