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
    app_title="7 · Paged attention and continuous batching",
)


@app.cell(hide_code=True)
def _():
    import marimo as mo

    return (mo,)


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    # 7 · Paged attention and continuous batching

    [![Open in Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/llm-inference-workshop/llm-inference-workshop/blob/main/notebooks/07_paged_attention_batching.ipynb)
    [![Open in molab](https://marimo.io/molab-shield.svg)](https://molab.marimo.io/github/llm-inference-workshop/llm-inference-workshop/blob/main/notebooks/07_paged_attention_batching.py)

    Notebooks 1 and 2 counted what the KV cache costs. This one is about how an engine *hands it
    out* and *whom it runs*, the two ideas behind vLLM:

    | § | idea | seen in |
    |---|---|---|
    | 1 | **paged KV memory** (PagedAttention, Kwon et al., SOSP 2023, [arXiv:2309.06180](https://arxiv.org/abs/2309.06180)) | ShareGPT lengths, computed |
    | 2, 3 | contiguous vs paged in an engine; **preemption** when blocks run out | the teaching engine's `/metrics` |
    | 4, 5 | **static vs continuous batching** (Orca, OSDI 2022); **chunked prefill** | the engine's step trace, the servers |
    | 6 | the same gauges on the course's server (vLLM unless `WORKSHOP_ENGINE` says otherwise) | its `/metrics` |
    | 7 | what paging costs attention: reading scattered blocks back | a pool shaped like the model's |
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
    ## 1. Three ways to hand out KV memory, on real conversation lengths

    A request of $t$ tokens (prompt + answer) needs $t$ KV slots in the end, but the engine
    sets memory aside when it *admits* the request, before it knows the answer's length:

    | layout | a request holds | at the end |
    |---|---|---|
    | **contiguous** (servers before vLLM; `--kv-layout contiguous`) | the longest sequence allowed, in one piece | `max_len` slots |
    | **exact** (the best case for one piece: the answer's length known up front) | its own length, in one piece | $t$ slots |
    | **paged** | blocks of $B$ slots anywhere in the pool, one more as tokens arrive | $\lceil t / B \rceil \times B$ slots |

    Reserved slots that never hold a token are **internal fragmentation** (with paging, under
    $B$ per request); free memory in holes too small for the next request is **external
    fragmentation**, and blocks have none: any free block serves anyone. The lengths are first
    turns of ShareGPT conversations, counted with the served model's tokenizer (chat template
    included) and filtered as vLLM's benchmark does. In Jupyter, re-run the cells after moving
    a control; marimo does it for you.
    """)
    return


@app.cell
def _():
    from workshop import sanity, ui
    from workshop.engine_lab import batching
    from workshop.live import kv_usage, live_requests
    from workshop.bench.tokenizer import Tokenizer

    mem_budget = ui.slider(4096, 65536, 16384, 1024, "KV pool (tokens)")
    mem_budget
    return Tokenizer, batching, kv_usage, live_requests, mem_budget, sanity, ui


@app.cell
def _(ui):
    mem_block = ui.dropdown(["1", "8", "16", "32", "128"], "16", "block size (tokens)")
    mem_block
    return (mem_block,)


@app.cell
def _(ui):
    mem_max_len = ui.dropdown(["1024", "2048", "4096"], "2048", "max_len (longest sequence)")
    mem_max_len
    return (mem_max_len,)


@app.cell
def _(ui, workshop):
    mem_requests = ui.slider(50, 1000, workshop.session.sweep(500, 200), 50, "ShareGPT requests")
    mem_requests
    return (mem_requests,)


@app.cell
def _(Tokenizer, batching, mem_max_len, mem_requests, session, ui):
    import pathlib
    import statistics

    _path = str(session.info.get("model_path") or "")
    tok = Tokenizer.load(session.model, _path if pathlib.Path(_path).is_dir() else None)
    sharegpt = batching.sharegpt_lengths(tok, int(mem_requests.value), max_len=int(mem_max_len.value))
    sharegpt_totals = [p + o for p, o in sharegpt]
    _len = batching.length_summary(sharegpt_totals)
    ui.md(f"{len(sharegpt):,} ShareGPT requests (tokenizer: `{pathlib.Path(tok.name).name}`"
          + ("" if tok.hf is not None else ", a whitespace stand-in: counts are approximate")
          + f"): prompt + answer is **{_len['mean']:,.0f} tokens on average**, median {_len['median']:,.0f}, "
          f"90th percentile {_len['p90']:,}, longest {_len['longest']:,}.")
    return sharegpt, sharegpt_totals, statistics


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    **Exercise 1 (predict, then compute).** Take the requests in order and put each in the pool
    at its full length until the next one does not fit: how many fit at once with paging?
    """)
    return


@app.cell
def _():
    predict_paged_fit = None   # your prediction: a number of requests
    return (predict_paged_fit,)


@app.cell(hide_code=True)
def _():
    from workshop.ui import reveal_button as _reveal_button

    reveal_exercise_1 = _reveal_button("Compute")
    reveal_exercise_1
    return (reveal_exercise_1,)


@app.cell
def _(
    batching,
    mem_block,
    mem_budget,
    mem_max_len,
    mo,
    predict_paged_fit,
    reveal_exercise_1,
    sharegpt_totals,
    ui,
):
    mo.stop(not reveal_exercise_1.value,
            mo.md("_Write your prediction for Exercise 1, then press **Compute** under it._"))
    mem_B, mem_L, mem_C = int(mem_block.value), int(mem_max_len.value), int(mem_budget.value)
    paged_fit = batching.fit_count(sharegpt_totals, mem_C, "paged", mem_B, mem_L)
    ui.compare(predict_paged_fit, paged_fit, "ShareGPT requests that fit at once, paged", "requests",
               how="computed")
    return mem_B, mem_C, mem_L, paged_fit


@app.cell
def _(
    batching,
    mem_B,
    mem_C,
    mem_L,
    mo,
    paged_fit,
    reveal_exercise_1,
    sharegpt_totals,
    statistics,
    ui,
):
    # Worked answer to Exercise 1, collapsed until opened
    mo.stop(not reveal_exercise_1.value)
    _paged_each = statistics.mean(batching.reserved_slots(_t, "paged", mem_B, mem_L) for _t in sharegpt_totals)
    _first_each = statistics.mean([batching.reserved_slots(_t, "paged", mem_B, mem_L)
                                   for _t in sharegpt_totals[:paged_fit]] or [0])
    _contig_each = batching.reserved_slots(0, "contiguous", mem_B, mem_L)
    _contig_fit = batching.fit_count(sharegpt_totals, mem_C, "contiguous", mem_B, mem_L)
    ui.worked_answer(
        f"Paging holds ⌈t / {mem_B}⌉ × {mem_B} slots per request: **{_paged_each:,.0f} on average** "
        f"(the mean length plus the unused tail of the last block), so {mem_C:,} slots hold about "
        f"**{mem_C / _paged_each:.1f}** average requests. In order, **{paged_fit}** fit: those hold "
        f"{_first_each:,.0f} slots on average, and the next did not fit in what they left. Max-length "
        f"reservations take {_contig_each:,} slots whatever $t$: ⌊{mem_C:,} / {_contig_each:,}⌋ = "
        f"{_contig_fit} requests, {paged_fit / max(_contig_fit, 1):.1f}x fewer.")
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    What each layout reserves for these requests at full length (`batching.reserved_slots`),
    and the share of it that never holds a token:
    """)
    return


@app.cell
def _(batching, mem_B, mem_C, mem_L, sharegpt_totals, ui):
    waste_rows = [{"layout": _layout, **batching.internal_waste(sharegpt_totals, _layout, mem_B, mem_L),
                   "fit at once in the pool": batching.fit_count(sharegpt_totals, mem_C, _layout,
                                                                 mem_B, mem_L)}
                  for _layout in batching.LAYOUTS]
    ui.table(waste_rows)
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    In an engine requests come and go: each step every running request adds a token, finished
    ones free their memory, waiting ones are admitted first come, first served
    (`batching.simulate`, per layout). A paged pool with no free block **preempts** the latest
    request (freed, recomputed later), as vLLM does. The bars: the pool's mean state while some
    request waited.
    """)
    return


@app.cell
def _(batching, mem_B, mem_C, mem_L, sharegpt):
    sim_results = [batching.simulate(sharegpt, mem_C, _layout, mem_B, mem_L)
                   for _layout in batching.LAYOUTS]
    sim_plot = batching.plot_pool_shares(
        sim_results, f"{len(sharegpt)} ShareGPT requests through a pool of {mem_C:,} tokens")
    sim_plot
    return (sim_results,)


@app.cell
def _(batching, sharegpt, sim_results, ui):
    _c, _e, _p = sim_results
    ui.md(ui.markdown_table(batching.sim_rows(sim_results)) + "\n\n"
          f"**Paging ran {_p.mean_running / max(_c.mean_running, 1e-9):.1f}x as many requests at "
          f"once as max-length reservations and served all {len(sharegpt)} in {len(_p.steps):,} "
          f"steps instead of {len(_c.steps):,}**, for {_p.preemptions} preemptions: the price of "
          f"admitting a request before its answer's length is known.")
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    The PagedAttention paper measured the same on real systems: 20.4% to 38.2% of the KV memory
    held tokens in earlier servers, 96.3% in vLLM (its Figure 2). Try a block size of 128
    (vLLM's CPU default) or 1 (SGLang's page) and watch the internal waste.

    ## 2. Observed in the teaching engine

    The teaching engine (`mini_engine`, `--engine mini`) implements both layouts on one data
    path. Three small servers get **the same KV pool** (`--num-blocks`) and context limit and
    differ from the default (paged, continuous batching) in one knob each: `paged` (none),
    `contiguous` (`--kv-layout contiguous`), `static` (`--scheduler static`, section 4); a tiny
    pool shows the limits with a handful of requests. A burst (fixed lengths, `ignore_eos`) goes
    to the paged and the contiguous server while a thread samples `/metrics`:
    `vllm:num_requests_running`, `..._waiting`, `vllm:kv_cache_usage_perc` (vLLM's names, which
    the reference server exports for every engine).
    """)
    return


@app.cell
def _(batching, ui, workshop):
    srv_blocks = workshop.session.sweep(64, 32)
    srv_max_len = workshop.session.sweep(512, 256)
    # One torch thread per engine: torch threads of several engines competing for this machine's
    # cores can slow every step down manyfold.
    _common = ["--max-model-len", str(srv_max_len), "--", "--num-blocks", str(srv_blocks),
               "--threads", "1"]
    _knobs = {"paged": [], "contiguous": ["--kv-layout", "contiguous"],
              "static": ["--scheduler", "static"]}
    servers = workshop.session.start_many("mini", {_k: _common + _v for _k, _v in _knobs.items()})
    burst_n, burst_prompt, burst_out = workshop.session.sweep(12, 4), 40, workshop.session.sweep(16, 8)
    ui.md(f"The burst: **{burst_n} requests at once**, prompts of about {burst_prompt} tokens, "
          f"answers of {burst_out}. The servers:\n\n" + ui.markdown_table(batching.server_rows(servers)))
    return burst_n, burst_out, burst_prompt, servers


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    **Exercise 2 (predict, then measure).** With the contiguous layout, how many of the burst's
    requests will run at once?
    """)
    return


@app.cell
def _():
    predict_contiguous_running = None   # your prediction: a number of requests
    return (predict_contiguous_running,)


@app.cell(hide_code=True)
def _():
    from workshop.ui import reveal_button as _reveal_button

    reveal_exercise_2 = _reveal_button("Measure")
    reveal_exercise_2
    return (reveal_exercise_2,)


@app.cell
def _(
    batching,
    burst_n,
    burst_out,
    burst_prompt,
    kv_usage,
    live_requests,
    mo,
    predict_contiguous_running,
    reveal_exercise_2,
    servers,
    ui,
):
    mo.stop(not reveal_exercise_2.value,
            mo.md("_Write your prediction for Exercise 2, then press **Measure** under it._"))
    maker = live_requests.PromptMaker(servers["paged"].model, servers["paged"].info.get("model_path"))
    burst_prompts = [maker.make(burst_prompt) for _ in range(burst_n)]
    burst_runs = {_name: kv_usage.measure_kv(servers[_name], burst_prompts, burst_out)
                  for _name in ("paged", "contiguous")}
    burst_rows = [batching.burst_row(_name, _run, servers[_name].info, _name, burst_prompt,
                                     burst_out) for _name, _run in burst_runs.items()]
    ui.compare(predict_contiguous_running, burst_rows[1]["peak running"],
               "peak requests running at once, contiguous", "requests")
    return burst_rows, maker


@app.cell
def _(batching, burst_n, burst_rows, mo, reveal_exercise_2, servers, ui):
    # Worked answer to Exercise 2, collapsed until opened
    mo.stop(not reveal_exercise_2.value)
    _pg, _ct = burst_rows
    _info = servers["contiguous"].info
    _B, _L, _cap = int(_info["block_size"]), int(_info["max_model_len"]), int(_info["kv_capacity_tokens"])
    _each = batching.reserved_slots(_ct["tokens stored per request"], "contiguous", _B, _L)
    ui.worked_answer(
        f"A contiguous request reserves `max_model_len` = {_L} slots at admission, in whole blocks "
        f"of {_B}: **{_each} slots**, to store {_ct['tokens stored per request']} tokens. The pool "
        f"has {_cap:,}: ⌊{_cap:,} / {_each}⌋ = {_cap // _each}, so **{_ct['predicted running']}** of "
        f"the {burst_n} run at once. Measured: **{_ct['peak running']}** at the peak of the gauge"
        + (", as the arithmetic says." if _ct["peak running"] == _ct["predicted running"] else
           ": read every 50 ms, it missed the moment when most ran.")
        + f" Paged, a request holds {batching.reserved_slots(_pg['tokens stored per request'], 'paged', _B, _L)} "
        f"slots: {_pg['predicted running']} fit (measured peak: {_pg['peak running']}).")
    return


@app.cell
def _(burst_n, burst_rows, sanity, ui):
    # Nothing runs beyond what the pool holds; conclusions need finished requests.
    _pg, _ct = burst_rows
    burst_violations = [_v for _r in burst_rows for _v in sanity.completed_some(
        f"the burst to the {_r['server']} server", _r["completed"], burst_n) + sanity.within(
        f"requests running at once on the {_r['server']} server", _r["peak running"],
        _r["predicted running"], "requests", "more running than the pool holds", ("count",), 0)]
    ui.md(ui.markdown_table(burst_rows) + "\n\n" + (
        sanity.report(burst_violations) + "\n\n" + sanity.WITHHELD if burst_violations else
        f"**Same pool, same requests: the last first token came after {_ct['latest first token (s)']:.1f} s "
        f"on the contiguous server, {_pg['latest first token (s)']:.1f} s on the paged one** (up to "
        f"{_ct['peak waiting']} requests waiting on the contiguous server, {_pg['peak waiting']} on the paged one)."))
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## 3. Preemption: when the promised blocks run out

    A paged engine admits a request when its *prompt* fits. If the answers then outgrow the
    pool, the teaching engine, like vLLM, **preempts** the latest request: frees its blocks and
    queues it again, to be recomputed (prompt + what it had generated). A burst whose answers do
    not fit together goes to the paged server; the table compares the engine's
    `vllm:num_preemptions_total` with section 1's simulation of the same requests and pool.
    """)
    return


@app.cell
def _(batching, kv_usage, maker, sanity, servers, ui, workshop):
    pressure_n, pressure_prompt = workshop.session.sweep(8, 4), 112
    pressure_out = workshop.session.sweep(120, 24)
    _before = servers["paged"].metrics().get(batching.PREEMPTIONS, 0.0)
    pressure_run = kv_usage.measure_kv(servers["paged"], [maker.make(pressure_prompt) for _ in range(pressure_n)],
                                       pressure_out)
    pressure_preemptions = servers["paged"].metrics().get(batching.PREEMPTIONS, 0.0) - _before
    _p_info = servers["paged"].info
    _p_tokens = pressure_run.requests[0].prompt_tokens or pressure_prompt
    _cap, _B, _L = (int(_p_info[_k]) for _k in ("kv_capacity_tokens", "block_size", "max_model_len"))
    pressure_sim = batching.simulate([(_p_tokens, pressure_out)] * pressure_n, _cap, "paged", _B, _L)
    _need = pressure_n * batching.reserved_slots(_p_tokens + pressure_out - 1, "paged", _B, _L)
    _completed = sum(_r.error is None for _r in pressure_run.requests)
    pressure_violations = sanity.completed_some("the preemption burst", _completed, pressure_n)
    ui.md(ui.markdown_table([
        {"": "simulation", "preemptions": pressure_sim.preemptions, "peak running": pressure_sim.peak_running,
         "completed": pressure_n},
        {"": "paged server", "preemptions": int(pressure_preemptions), "peak running": pressure_run.peak_running,
         "completed": _completed}]) + "\n\n"
        + (sanity.report(pressure_violations) + "\n\n" + sanity.WITHHELD if pressure_violations else
           f"{pressure_n} requests of {_p_tokens} + {pressure_out} tokens need **{_need:,} slots**; the pool has "
           f"{_cap:,}. **The engine preempted {pressure_preemptions:.0f} time(s) and {_completed} of "
           f"{pressure_n} requests completed**: a preemption costs time (tokens computed again), not an answer."))
    return (pressure_preemptions,)


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## 4. Static vs continuous batching

    A **static** batcher admits nobody until *every* request of its batch has finished: a short
    answer's seat stays empty while the longest one runs. **Continuous** batching (Orca's
    iteration-level scheduling) decides at every step: a finished request leaves, a waiting one
    takes its seat at the next step. To see the steps, the teaching engine runs in this process:
    `LLMEngine.history` keeps one `StepRecord` per step (who ran, how many tokens, prefill or
    decode, how long); `batching.drive` below is a serving engine's main loop minus the HTTP, and
    `batching.reschedule` gives the loaded engine another scheduler.
    """)
    return


@app.cell
def _(batching, servers, ui):
    import inspect
    import random

    from mini_engine import LLMEngine

    # The model folder the teaching servers loaded; one small pool for both experiments below.
    engine = LLMEngine(servers["paged"].info["model_path"], num_blocks=128, max_model_len=2048,
                       num_threads=1)   # like the servers above: one torch thread
    ui.md("```python\n" + inspect.getsource(batching.drive) + "```")
    return engine, inspect, random


@app.cell
def _(batching, engine, random, workshop):
    _rng = random.Random(0)
    batch_outputs = workshop.session.sweep([32, 6, 12, 24, 6, 18], [10, 2, 4, 8, 2, 6])
    batch_requests = [([_rng.randrange(1000, 20000) for _ in range(12)], _m) for _m in batch_outputs]
    timeline_runs = {}
    for _policy in ("static", "continuous"):
        batching.reschedule(engine, scheduler=_policy, max_num_seqs=3)   # same model, new policy
        timeline_runs[f"{_policy}, max_num_seqs=3"] = batching.drive(engine, batch_requests)
    timeline_plot = batching.plot_timeline(
        timeline_runs, f"{len(batch_requests)} requests (answers of {batch_outputs} tokens), 3 seats")
    timeline_plot
    return batch_outputs, timeline_runs


@app.cell
def _(batch_outputs, batching, timeline_runs, ui):
    timeline_rows = batching.step_cost_rows(timeline_runs, sum(batch_outputs))
    _s, _c = timeline_rows
    _prefill_cost = _s["mean prefill step (ms)"] / max(_s["mean decode step (ms)"], 1e-9)
    ui.md(ui.markdown_table(timeline_rows) + "\n\n"
          f"**For the same {sum(batch_outputs)} tokens the static batcher took {_s['steps']} steps, "
          f"the continuous one {_c['steps']}**: seats freed by short answers were refilled at the "
          f"next step. A step with a prefill cost {_prefill_cost:.1f}x a decode-only one here, and "
          "continuous batching runs one per request that joins; the last columns price each run's "
          "steps at those means.")
    return (timeline_rows,)


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    The same comparison through the servers, as users see it: a closed loop of a few concurrent
    users (each sends its next request when its answer is complete), equal prompts and answers
    of mixed lengths, to the `paged` (continuous) and `static` servers, with the course's
    benchmark harness (`workshop.bench`).

    **Exercise 3 (predict, then measure).** What share of the continuous server's output
    throughput (tokens/s) will the static one reach? Write a percentage.
    """)
    return


@app.cell
def _():
    predict_static_share_pct = None   # your prediction in percent
    return (predict_static_share_pct,)


@app.cell(hide_code=True)
def _():
    from workshop.ui import reveal_button as _reveal_button

    reveal_exercise_3 = _reveal_button("Measure")
    reveal_exercise_3
    return (reveal_exercise_3,)


@app.cell
def _(
    batching,
    mo,
    predict_static_share_pct,
    reveal_exercise_3,
    servers,
    ui,
    workshop,
):
    mo.stop(not reveal_exercise_3.value,
            mo.md("_Write your prediction for Exercise 3, then press **Measure** under it._"))
    from workshop.bench import run_benchmark

    bench_n, bench_conc = workshop.session.sweep(24, 6), workshop.session.sweep(6, 3)
    bench_runs = {_name: run_benchmark(servers[_name].base_url, servers[_name].model, "random",
                                       num_requests=bench_n, concurrency=bench_conc,
                                       api_key=servers[_name].api_key, warmup=0, progress=False,
                                       input_len=32, output_len=workshop.session.sweep(48, 8),
                                       range_ratio=0.8, seed=1)
                  for _name in ("paged", "static")}
    bench_rows = [batching.bench_row(servers[_name].info["extra"]["scheduler"], _r) for _name, _r in bench_runs.items()]
    static_share_pct = 100 * bench_rows[1]["output tokens/s"] / bench_rows[0]["output tokens/s"]
    ui.compare(predict_static_share_pct, static_share_pct,
               "static throughput as a share of continuous", "%")
    return bench_conc, bench_rows, bench_runs, static_share_pct


@app.cell
def _(
    batching,
    bench_conc,
    bench_runs,
    mo,
    reveal_exercise_3,
    static_share_pct,
    timeline_rows,
    ui,
):
    # Worked answer to Exercise 3, collapsed until opened
    # The answers' lengths, in the order the static server's users sent them.
    mo.stop(not reveal_exercise_3.value)
    _outs = [_r.output_tokens for _r in sorted(bench_runs["static"].records, key=lambda _r: _r.index)
             if _r.ok and not _r.warmup]
    _pf, _dc = (timeline_rows[0][f"mean {_k} step (ms)"] for _k in ("prefill", "decode"))
    _f = batching.closed_loop_forecast(_outs, bench_conc, _pf, _dc)
    ui.worked_answer(
        f"Count steps. The {len(_outs)} answers were {min(_outs, default=0)} to {max(_outs, default=0)} tokens, "
        f"{sum(_outs)} in all, over {bench_conc} seats. By tokens per step alone static reaches "
        f"{_f['steps_share_pct']:.0f}% (a static batch lasts as long as its longest answer). But a step with a "
        f"prefill cost {_pf:.0f} ms in section 4 against {_dc:.0f} ms for a decode step, and continuous batching "
        "runs one per request that joins, static one per batch (`batching.closed_loop_forecast`):\n\n"
        + ui.markdown_table([{"batching": "continuous", "prefill steps": _f["joins"], "time (s)": _f["continuous_s"]},
                             {"batching": "static", "prefill steps": _f["batches"], "time (s)": _f["static_s"]}])
        + f"\n\nSo static reaches **{_f['forecast_pct']:.0f}%**. Measured: **{static_share_pct:.0f}%**, "
        f"{static_share_pct / _f['forecast_pct']:.2f}x the forecast. The closed loop adds two effects. "
        "Between a request's last token and its user's next request a continuous seat sits empty, "
        "while a static batch's remaining steps overlap that wait: that favours static. The user whose "
        "answer ends a static batch sends its next request after the next batch started, which then "
        "runs a seat short: that favours continuous.")
    return


@app.cell
def _(bench_rows, ui):
    _cont, _stat = bench_rows
    ui.md(ui.markdown_table(bench_rows) + "\n\n"
          f"**The static server's median time to first token was {_stat['median TTFT (ms)']:,.0f} ms "
          f"against {_cont['median TTFT (ms)']:,.0f} ms** with continuous batching: a new request to "
          f"it waits for the whole batch in front of it to finish.")
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## 5. Chunked prefill: one long prompt vs everybody's next token

    Continuous batching puts a newly admitted prompt into the running decodes' step: a long
    prompt makes that step long, and every running request waits for it. **Chunked prefill**
    cuts the prompt into pieces within a per-step token budget (`max_num_batched_tokens`): steps
    stay short, the long prompt's first token comes a little later. Below, three short requests
    are decoding when a long prompt arrives (in this process; unchunked, the budget holds it all).
    """)
    return


@app.cell
def _(ui):
    chunk_budget = ui.slider(16, 512, 64, 16, "chunked: token budget per step")
    chunk_budget
    return (chunk_budget,)


@app.cell
def _(ui, workshop):
    chunk_long = ui.slider(128, 1536, workshop.session.sweep(1024, 256), 128, "long prompt (tokens)")
    chunk_long
    return (chunk_long,)


@app.cell
def _(batching, chunk_budget, chunk_long, engine, random, ui, workshop):
    _rng_chunk = random.Random(1)
    _short_out = workshop.session.sweep(48, 12)
    _long_ids = [_rng_chunk.randrange(1000, 20000) for _ in range(int(chunk_long.value))]
    chunk_requests = ([([_rng_chunk.randrange(1000, 20000) for _ in range(12)], _short_out)] * 3
                      + [(_long_ids, 4)])
    chunk_runs = {}
    for _label, _knobs_chunk in {
            "no chunking": dict(chunked_prefill=False,
                                max_num_batched_tokens=max(512, int(chunk_long.value) + 16)),
            f"chunked, budget {int(chunk_budget.value)}": dict(
                chunked_prefill=True, max_num_batched_tokens=int(chunk_budget.value))}.items():
        batching.reschedule(engine, scheduler="continuous", max_num_seqs=64, **_knobs_chunk)
        chunk_runs[_label] = batching.drive(engine, chunk_requests, [0, 0, 0, 4])   # r3 arrives at step 4
    chunk_rows = [batching.chunk_row(_label, _h, ["r0", "r1", "r2"], "r3", 4) for _label, _h in chunk_runs.items()]
    ui.table(chunk_rows)
    return chunk_rows, chunk_runs


@app.cell
def _(batching, chunk_long, chunk_runs):
    chunk_plot = batching.plot_timeline(chunk_runs, f"3 decoding requests and a "
                                        f"{int(chunk_long.value)}-token prompt arriving (r3)")
    chunk_plot
    return


@app.cell
def _(chunk_budget, chunk_long, chunk_rows, ui):
    _nc, _ch = chunk_rows
    _gap_key, _ttft_key = list(_nc)[1:3]
    ui.md(f"**Chunks of at most {int(chunk_budget.value)} tokens held the short requests up for at "
          f"most {_ch[_gap_key]:,.0f} ms between two tokens, against {_nc[_gap_key]:,.0f} ms with "
          f"the {int(chunk_long.value)}-token prompt in one piece.** The long prompt's own first "
          f"token came {_ch[_ttft_key]:,.0f} ms after it arrived, against {_nc[_ttft_key]:,.0f} ms.")
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## 6. The same gauges on the course's server

    Everything above has a counterpart in vLLM's `/metrics`, which the reference server exports
    whatever engine it fronts. A burst goes to the course's server while a thread samples its
    running and waiting gauges and its KV usage (other notebooks' requests to the same server
    show up there too).
    """)
    return


@app.cell
def _(batching, kv_usage, live_requests, session, workshop):
    vllm_n, vllm_out = workshop.session.sweep(48, 6), workshop.session.sweep(96, 8)
    _vllm_maker = live_requests.PromptMaker(session.model, session.info.get("model_path"), seed=7)
    vllm_run = kv_usage.measure_kv(session, [_vllm_maker.make(64) for _ in range(vllm_n)], vllm_out,
                                   interval=0.1)
    vllm_plot = batching.plot_gauges(
        vllm_run.samples, kv_usage.RUNNING, kv_usage.WAITING, kv_usage.KV_USAGE,
        f"{session.engine_name}: {vllm_n} requests of 64 + {vllm_out} tokens at once")
    vllm_plot
    return vllm_n, vllm_out, vllm_run


@app.cell
def _(kv_usage, sanity, session, ui, vllm_n, vllm_out, vllm_run):
    vllm_row = kv_usage.gauge_row(session, vllm_run, 64, vllm_out)
    vllm_errors = sorted({_r.error for _r in vllm_run.requests if _r.error})
    # A burst that completed drew the gauges off zero while it ran, or the samples say nothing.
    vllm_violations = (
        sanity.completed_some(f"the burst to {session.engine_name}", vllm_row["completed"], vllm_n)
        + sanity.nonzero("the running-requests gauge during the burst", vllm_run.samples.values[kv_usage.RUNNING])
        + sanity.nonzero("the KV-usage gauge during the burst", vllm_run.samples.values[kv_usage.KV_USAGE]))
    _why = ("Raise the burst (`vllm_n`, `vllm_out`) until requests wait: the engine admits only what its "
            "limits allow per step (sequences, free KV blocks, tokens per step)." if vllm_row["peak waiting"] == 0
            else "The waiting ones were over its per-step limits (sequences, free KV blocks, tokens).")
    # source: decode_log_interval in sglang/srt/server_args.py (0.5.18)
    _sglang = (" SGLang refreshes these gauges every `--decode-log-interval` decode steps (40 by default; the "
               "reference server starts it with 1)." if session.engine == "sglang" else "")
    ui.md(ui.markdown_table([vllm_row]) + "\n\n" + (
        sanity.report(vllm_violations) + "\n\n" + sanity.WITHHELD
        + (f"\n\nThe failed requests said: `{' / '.join(vllm_errors)[:600]}`" if vllm_errors else "")
        if vllm_violations else
        f"**{session.engine_name} ran up to {vllm_row['peak running']:.0f} of the {vllm_n} requests at once, "
        f"{vllm_row['peak waiting']:.0f} at most waited in the samples, and {vllm_row['completed']} completed.** "
        + _why + _sglang))
    return


@app.cell
def _(bench_rows, burst_rows, pressure_preemptions, servers):
    _done_with = (burst_rows, pressure_preemptions, bench_rows)   # stop only after their last use
    for _s in servers.values():   # this notebook's own servers; the course's shared ones stay
        _s.stop()
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## 7. What paging costs attention: reading the blocks back

    Paging puts a sequence's keys and values wherever free blocks were. Attention wants them
    side by side, so at every layer the teaching engine copies each context out through its
    block table (vLLM's paged-attention kernel reads the blocks where they lie instead). One
    layer's pool holds K as `[kv_heads, slots, head_dim]`, slot = block x block size + offset:

    | read | one `index_select` row per | bytes per row (bf16) |
    |---|---|---|
    | **slot by slot** (`batching.gather_by_slot`) | token and KV head | head_dim x 2 |
    | **block by block** (`batching.gather_by_block`, the engine's `KVCache.read_blocks`) | block and KV head | block size x head_dim x 2 |

    The same bytes, in `block_size` times fewer and larger pieces. We time both over a pool
    shaped like the loaded model's (every layer's K and V), with each sequence's blocks side by
    side (a fresh pool) and scattered (after some traffic), on one thread and on two.
    """)
    return


@app.cell
def _(ui, workshop):
    gather_seqs = ui.slider(1, 16, workshop.session.sweep(8, 4), 1, "sequences in the batch")
    gather_seqs
    return (gather_seqs,)


@app.cell
def _(ui, workshop):
    gather_context = ui.slider(64, 2048, workshop.session.sweep(1024, 512), 64, "keys per sequence")
    gather_context
    return (gather_context,)


@app.cell
def _(batching, engine, gather_context, gather_seqs, inspect, ui):
    import os

    import torch

    from mini_engine.kv_cache import KVCache

    gather_bs = engine.block_manager.block_size
    gather_blocks = int(gather_seqs.value) * -(-int(gather_context.value) // gather_bs)
    # The loaded model's KV layout and layer count, in bf16 (how the servers decode on a CPU that
    # has it; the copies are the same in any dtype, only twice as large in float32).
    gather_pool = KVCache(engine.runner.model.kv_layout(), engine.runner.cfg.num_layers,
                          gather_blocks + 64, gather_bs, torch.bfloat16)
    for _layer in gather_pool.layers:
        for _t in _layer:
            _t.normal_()            # real values, and every page of the pool touched once
    gather_placements = {"side by side": torch.arange(gather_blocks),
                         "scattered": torch.randperm(gather_pool.num_blocks)[:gather_blocks]}
    _blocks, _k = gather_placements["scattered"], gather_pool.layers[0][0]
    _by_block = batching.gather_by_block(_k, _blocks, gather_bs)
    gather_agree = (torch.equal(batching.gather_by_slot(_k, _blocks, gather_bs), _by_block)
                    and torch.equal(_by_block, gather_pool.read_blocks(0, _blocks)[0]))
    gather_shape = {"KV heads": _k.shape[0], "head_dim": _k.shape[2], "block size": gather_bs,
                    "layers": engine.runner.cfg.num_layers, "blocks read per layer": gather_blocks}
    ui.md("```python\n" + inspect.getsource(batching.gather_by_slot)
          + inspect.getsource(batching.gather_by_block) + "```\n\n"
          + ("Both return the same tensor as the engine's `read_blocks`. " if gather_agree else
             "**The reads differ: a bug.** ")
          + ", ".join(f"{_key}: {_v}" for _key, _v in gather_shape.items()) + ".")
    return (
        gather_blocks,
        gather_bs,
        gather_placements,
        gather_pool,
        gather_shape,
        os,
    )


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    **Exercise 4 (predict, then measure).** On *scattered* blocks, with two threads (one on a
    one-core machine), how many times faster is reading block by block than slot by slot?
    """)
    return


@app.cell
def _():
    predict_block_speedup = None   # your prediction: slot-by-slot time / block-by-block time
    return (predict_block_speedup,)


@app.cell(hide_code=True)
def _():
    from workshop.ui import reveal_button as _reveal_button

    reveal_exercise_4 = _reveal_button("Measure")
    reveal_exercise_4
    return (reveal_exercise_4,)


@app.cell
def _(
    batching,
    gather_bs,
    gather_placements,
    gather_pool,
    mo,
    os,
    predict_block_speedup,
    reveal_exercise_4,
    ui,
):
    # One torch thread, then two (if this machine has them: the servers decode a batch on two).
    mo.stop(not reveal_exercise_4.value,
            mo.md("_Write your prediction for Exercise 4, then press **Measure** under it._"))
    gather_rows = batching.time_gathers(gather_pool.layers, gather_placements, gather_bs,
                                        sorted({1, min(2, os.cpu_count() or 1)}))
    gather_threads = max(_r["threads"] for _r in gather_rows)
    # the same times by (blocks, read, threads), for the cells below
    gather_ms = {(_r["blocks"], _r["read"], _r["threads"]): _r[batching.GATHER_MS] for _r in gather_rows}
    gather_speedup = (gather_ms["scattered", "slot by slot", gather_threads]
                      / gather_ms["scattered", "block by block", gather_threads])
    ui.compare(predict_block_speedup, gather_speedup,
               "block-by-block speed-up on scattered blocks", "x")
    return gather_ms, gather_rows, gather_speedup, gather_threads


@app.cell
def _(
    gather_blocks,
    gather_bs,
    gather_ms,
    gather_shape,
    gather_speedup,
    gather_threads,
    mo,
    reveal_exercise_4,
    ui,
):
    # Worked answer to Exercise 4, collapsed until opened
    mo.stop(not reveal_exercise_4.value)
    _n = gather_threads
    _rows_block = 2 * gather_shape["layers"] * gather_shape["KV heads"] * gather_blocks   # K and V
    _rows_slot, _row_bytes = _rows_block * gather_bs, gather_shape["head_dim"] * 2
    _ms_slot, _ms_block = (gather_ms["scattered", _read, _n] for _read in ("slot by slot", "block by block"))
    _one = gather_ms["scattered", "slot by slot", 1] / gather_ms["scattered", "block by block", 1]
    ui.worked_answer(
        f"Both reads copy the same {_rows_slot * _row_bytes / 2**20:,.1f} MiB per step, in rows of different "
        f"sizes (scattered blocks, {_n} thread(s)):\n\n" + ui.markdown_table([
            {"read": _read, "rows per step": _rows, "bytes per row": _bytes, "ms per step": _ms,
             "ns per row": 1e6 * _ms / _rows} for _read, _rows, _bytes, _ms in (
                ("slot by slot", _rows_slot, _row_bytes, _ms_slot),
                ("block by block", _rows_block, gather_bs * _row_bytes, _ms_block))])
        + f"\n\nSo the speed-up lies between **1x** (the copy all bytes, at memory bandwidth) and "
        f"**{gather_bs}x** (every row costing the same whatever its size). Measured: **{gather_speedup:.2f}x** "
        f"({_one:.2f}x with one thread); block by block ran at "
        f"{_rows_slot * _row_bytes / (1e-3 * _ms_block) / 1e9:.1f} GB/s. "
        + (f"If the block read is all bytes, the slot read spent {1 - _ms_block / _ms_slot:.0%} of its time "
           f"on its {gather_bs}x more rows." if _ms_block < _ms_slot else
           "The slot read was not slower here: its extra rows cost nothing measurable."))
    return


@app.cell
def _(batching, engine, gather_context, gather_rows, gather_seqs):
    gather_plot = batching.plot_gather_times(
        gather_rows, f"K/V gather, {int(gather_seqs.value)} sequences x {int(gather_context.value)} "
        f"keys, {engine.runner.cfg.num_layers} layers, bf16")
    gather_plot
    return


@app.cell
def _(gather_context, gather_ms, gather_rows, gather_seqs, gather_threads, ui):
    _n = gather_threads
    _slot_cost = gather_ms["scattered", "slot by slot", _n] / gather_ms["side by side", "slot by slot", _n]
    _block_cost = gather_ms["scattered", "block by block", _n] / gather_ms["side by side", "block by block", _n]
    ui.md(ui.markdown_table(gather_rows) + "\n\n"
          f"**{gather_ms['scattered', 'block by block', _n]:.1f} ms of every decode step goes to "
          f"copies that a kernel reading the blocks in place would not make** "
          f"({int(gather_seqs.value)} sequences x {int(gather_context.value)} keys, {_n} thread(s)). "
          f"Scattering the blocks made the slot-by-slot read {_slot_cost:.2f}x as slow as side by "
          f"side, the block-by-block read {_block_cost:.2f}x.")
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## 8. What the real engines do

    | | vLLM | SGLang | this course's `mini_engine` |
    |---|---|---|---|
    | KV memory | PagedAttention: fixed-size blocks, `--block-size` (16 tokens on NVIDIA GPUs; the CPU build uses larger blocks, see `/server_info` above) | token-level paging (`--page-size`, default 1) under RadixAttention's prefix tree | blocks (`--block-size`, 16), or `--kv-layout contiguous` |
    | how many run at once | `--max-num-seqs`, and the KV blocks left | `--max-running-requests`, and the KV tokens left (`--mem-fraction-static`) | `--max-num-seqs` (64), and the blocks left |
    | tokens per step | `--max-num-batched-tokens` | `--chunked-prefill-size` (a prefill budget) | `--max-num-batched-tokens` (512) |
    | chunked prefill | on by default in the V1 engine | `--chunked-prefill-size` tokens per chunk | on; `--no-chunked-prefill` |
    | out of KV memory | preempts requests and recomputes them later (`PreemptionMode.RECOMPUTE` in its log); `vllm:num_preemptions_total` | retracts running requests back to the queue | preempts the latest by recompute; `vllm:num_preemptions_total` |
    | reading the KV blocks in attention | its attention kernels take the block table and read each block in place (on CPU, `torch.ops._C.cpu_attention_with_kv_cache`) | its attention backends read KV through the request-to-token index, in place | gathers each context into a copy every layer, block by block (`KVCache.read_blocks`; `--kv-read slot`: token by token) |
    | gauges | `vllm:num_requests_running`, `vllm:num_requests_waiting`, `vllm:kv_cache_usage_perc` | `sglang:num_running_reqs`, `sglang:num_queue_reqs`, `sglang:token_usage` | the vLLM names |

    Sources: vLLM (Kwon et al., SOSP 2023, [arXiv:2309.06180](https://arxiv.org/abs/2309.06180));
    Orca (Yu et al., OSDI 2022); Sarathi-Serve (Agrawal et al., OSDI 2024,
    [arXiv:2403.02310](https://arxiv.org/abs/2403.02310)); SGLang (Zheng et al.,
    [arXiv:2312.07104](https://arxiv.org/abs/2312.07104)); vLLM's
    [optimization guide](https://docs.vllm.ai/en/stable/configuration/optimization/) and SGLang's
    [server arguments](https://docs.sglang.io/docs/advanced_features/server_arguments) for the
    flags and defaults; `reference_server/prometheus.py` for the metric names.
    """)
    return


if __name__ == "__main__":
    app.run()
