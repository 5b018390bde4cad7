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
    app_title="15 · Sampling, structured output and tool calls: what applications send",
)


@app.cell(hide_code=True)
def _():
    import marimo as mo

    return (mo,)


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    # 15 · Sampling, structured output and tool calls: what applications send

    [![Open in Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/llm-inference-workshop/llm-inference-workshop/blob/main/notebooks/15_sampling_structured_output.ipynb)
    [![Open in molab](https://marimo.io/molab-shield.svg)](https://molab.marimo.io/github/llm-inference-workshop/llm-inference-workshop/blob/main/notebooks/15_sampling_structured_output.py)

    Applications rarely send a bare prompt. They send a temperature and a seed, a JSON schema
    the answer must follow (`response_format`), and tools the model may call. This notebook
    measures each on this machine, on the course's server and on the teaching engine:

    1. **The distribution.** The engine samples from softmax(logits / T). You compute it from
       the model's own log-probabilities, then count what the engine actually draws.
    2. **Temperature and seeds.** Entropy and variety of answers against T; a seed that
       reproduces an answer.
    3. **Structured output.** A grammar masks every token that would break the schema. How
       often are answers valid without it, and what does the mask cost per token?
    4. **Tool calls.** A small agent loop with two local tools, unchanged on every engine.
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
    The engines side by side: the session's server; SGLang, where a server is named
    (`WORKSHOP_SGLANG_BASE_URL`) or, outside quick mode, where it is installed; and the course's
    teaching engine (started here unless the session already is one). All sit behind the same
    reference server, so every request below is the same OpenAI request on each.
    """)
    return


@app.cell
def _(session, workshop):
    import json
    import math
    import statistics

    from workshop import ui
    from workshop.live import probe, sampling
    from workshop.session import sweep

    engines = {session.engine_name: session}
    if session.engine != "sglang" and (_sglang := workshop.session.beside("sglang")) is not None:
        engines[_sglang.engine_name] = _sglang
    if session.engine != "mini":
        engines["teaching engine"] = workshop.session.start("mini")
    ui.table([{"engine": name, "server": s.base_url, "model": s.model} for name, s in engines.items()])
    return engines, json, math, probe, sampling, statistics, sweep, ui


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## 1. The distribution the engine samples from

    For the first token of an answer, the model gives a logit per vocabulary entry. The server
    returns the largest `top_logprobs` of them as log-probabilities of the model itself, before
    any sampling parameter. Sampling at temperature T draws from

    $$p_T(t) = \frac{e^{\log p(t)/T}}{\sum_u e^{\log p(u)/T}}$$

    T < 1 sharpens the distribution, T > 1 flattens it, T → 0 is the argmax (greedy).
    """)
    return


@app.cell
def _(engines, math, sampling, ui):
    question = [{"role": "user", "content": "Name one colour of the rainbow."}]
    raw = {name: sampling.top_logprobs(s.openai(), s.model, question) for name, s in engines.items()}
    first_engine = next(iter(engines))
    ui.table([{"token": repr(t), "log p": lp, "p": math.exp(lp)}
              for t, lp in list(raw[first_engine].items())[:6]], floatfmt=".3f")
    return first_engine, question, raw


@app.cell
def _(ui):
    temperature = ui.slider(0.2, 2.0, 0.7, 0.1, "temperature T")
    temperature
    return (temperature,)


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    **Exercise 1 (predict, then measure).** At the temperature on the slider, what share of the
    draws will be the most likely token in the table above? Compute it from the log-probabilities
    (the formula above), write it below, then run the cell after it.
    """)
    return


@app.cell
def _():
    my_top_share = None    # your prediction, e.g. 0.8 (a share between 0 and 1)
    return (my_top_share,)


@app.cell(hide_code=True)
def _():
    from workshop.ui import reveal_button as _reveal_button

    reveal_exercise_1 = _reveal_button("Measure")
    reveal_exercise_1
    return (reveal_exercise_1,)


@app.cell
def _(
    engines,
    first_engine,
    mo,
    my_top_share,
    question,
    raw,
    reveal_exercise_1,
    sampling,
    sweep,
    temperature,
    ui,
):
    mo.stop(not reveal_exercise_1.value,
            mo.md("_Write your prediction for Exercise 1, then press **Measure** under it._"))
    draws = sweep(400, 48)
    computed = {name: sampling.softmax_at(lps, temperature.value) for name, lps in raw.items()}
    counts = {name: sampling.sample_first_tokens(
        s.openai(), s.model, question, temperature.value, draws,
        progress=lambda xs, _n=name: ui.progress(list(xs), title=f"sampling on {_n}"))
        for name, s in engines.items()}
    sampled = {name: sampling.frequencies(counts[name], computed[name]) for name in engines}
    top_token = max(raw[first_engine], key=raw[first_engine].get)
    ui.compare(my_top_share, sampled[first_engine][top_token],
               f"share of {repr(top_token)} in {draws} draws on {first_engine}")
    return computed, draws, sampled, top_token


@app.cell
def _(
    computed,
    draws,
    first_engine,
    math,
    mo,
    raw,
    reveal_exercise_1,
    sampled,
    temperature,
    top_token,
    ui,
):
    # Worked answer to Exercise 1, collapsed until opened
    mo.stop(not reveal_exercise_1.value)
    _p = computed[first_engine][top_token]
    _q = sampled[first_engine][top_token]
    _se = (_p * (1 - _p) / draws) ** 0.5
    ui.worked_answer(
        f"The most likely token {repr(top_token)} has log p = {raw[first_engine][top_token]:.3f}. "
        f"Dividing every log-probability by T = {temperature.value:g} and renormalising over the "
        f"top {len(raw[first_engine])} tokens gives **{_p:.3f}** (the mass outside them, "
        f"{1 - sum(math.exp(v) for v in raw[first_engine].values()):.4f} at T = 1, is left "
        f"out). Measured: **{_q:.3f}** in {draws} draws. A share of {draws} independent draws "
        f"has a standard error of sqrt(p(1 - p) / n) = {_se:.3f}, so the difference, "
        f"{abs(_q - _p):.3f}, is {abs(_q - _p) / _se if _se else 0:.1f} standard errors.")
    return


@app.cell
def _(computed, draws, first_engine, sampled, sampling, temperature):
    sampling.distribution_figure(computed[first_engine], sampled[first_engine], temperature.value,
                                 draws, first_engine)
    return


@app.cell
def _(computed, engines, sampled, sampling, top_token, ui):
    ui.table([{"engine": name,
               "total variation, computed vs drawn": sampling.total_variation(computed[name],
                                                                              sampled[name]),
               "top token computed": computed[name][top_token],
               "top token drawn": sampled[name].get(top_token, 0.0)} for name in engines],
             floatfmt=".3f")
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    Total variation is half the summed gap between the two distributions: 0 when the draws
    match the formula exactly. With a few hundred draws it stays a few hundredths from 0 by
    chance alone; a large value would mean the engine samples from something else than the
    softmax at T of the logits it reports.
    """)
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## 2. Temperature, variety and seeds

    Entropy (in bits) measures how spread the first token's distribution is; distinct-2 (the
    share of word pairs that are new across several answers) measures how different whole
    answers are.
    """)
    return


@app.cell
def _(first_engine, raw, sampling, session, sweep, ui):
    temperatures = sweep([0.0, 0.3, 0.7, 1.0, 1.5], [0.0, 1.0])
    answers_per_t = sweep(8, 4)
    story = [{"role": "user", "content": "Write one sentence about the sea."}]
    variety = []
    for _t in ui.progress(temperatures, title="answers per temperature"):
        # one request per answer: vLLM refuses n > 1 with greedy sampling
        _texts = [session.openai().chat.completions.create(
            model=session.model, messages=story, max_tokens=24,
            temperature=_t).choices[0].message.content for _ in range(answers_per_t)]
        variety.append({"T": _t, "first-token entropy (bits)":
                        sampling.entropy_bits(sampling.softmax_at(raw[first_engine], _t)),
                        "distinct-2 of the answers": sampling.distinct_n(_texts),
                        "different answers": len(set(_texts)), "of": len(_texts),
                        "one of them": _texts[0][:60]})
    ui.table(variety, floatfmt=".2f")
    return story, variety


@app.cell
def _(ui, variety):
    _greedy, _hot = variety[0], variety[-1]
    ui.md(f"**At T = 0 all {_greedy['of']} answers are "
          f"{'the same' if _greedy['different answers'] == 1 else 'not all the same'}** "
          f"({_greedy['different answers']} different); at T = {_hot['T']:g}, "
          f"{_hot['different answers']} of {_hot['of']} differ, distinct-2 "
          f"{_hot['distinct-2 of the answers']:.2f}.")
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    A **seed** fixes the random draws of one request, so the same request with the same seed
    gives the same answer. Asked on every engine, twice with one seed and once with another:
    """)
    return


@app.cell
def _(engines, story, ui):
    def seeded(server, seed: int) -> str:
        r = server.http(timeout=300).post("/v1/chat/completions", json={
            "model": server.model, "messages": story, "max_tokens": 24, "temperature": 1.0,
            "seed": seed})
        return r.json()["choices"][0]["message"]["content"] if r.status_code == 200 else \
            f"refused ({r.status_code}): {r.json()['error']['message'][:80]}"


    seeds = [{"engine": _n, "seed 7": seeded(_s, 7), "seed 7 again": seeded(_s, 7),
              "seed 8": seeded(_s, 8)} for _n, _s in engines.items()]
    ui.table([{**row, "same with the same seed": "refused" if row["seed 7"].startswith("refused")
               else row["seed 7"] == row["seed 7 again"]} for row in seeds])
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    What a seed promises differs by engine: vLLM and the teaching engine give each request its
    own random generator, so a seeded request draws the same random numbers whatever else is
    in its batch; SGLang 0.5 ignores `seed` unless started with
    `--enable-deterministic-inference`, so the course's server refuses it there (a 400) rather
    than pretend.
    """)
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    **Greedy, alone and in a batch.** Temperature 0 removes the draw, not the arithmetic: the
    same prompt, sent alone and then together with other requests, is computed in batches of
    different shapes. Are the two answers the same token for token?
    """)
    return


@app.cell
def _(engines, sampling, story, sweep, ui):
    batch_size = sweep(32, 8)
    fillers = [f"Count from {i} to {i + 5} in words." for i in range(batch_size - 1)]
    determinism = [{"engine": _n, **sampling.alone_and_in_a_batch(_s, story, fillers)}
                   for _n, _s in ui.progress(list(engines.items()), title="alone, then in a batch")]
    ui.table([{"engine": r["engine"], "batch": batch_size,
               "identical": r["first difference at character"] is None,
               "first difference at character": r["first difference at character"],
               "alone": r["alone"][:50], "in a batch": r["in a batch"][:50]} for r in determinism])
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    Where they differ, the reason is the order of floating-point sums: a batch of another size
    splits a matrix multiply or an attention reduction differently, the last bits of a logit
    move, and once two tokens are close the argmax flips and the answers part. Engines can
    make results batch-invariant with kernels that fix the reduction order at some cost in
    speed ("Defeating Nondeterminism in LLM Inference", Thinking Machines Lab, 2025-09;
    SGLang's `--enable-deterministic-inference`).
    """)
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## 3. Structured output: a grammar over tokens

    `response_format` with a JSON schema asks for an answer that parses and has the schema's
    shape. A grammar library (xgrammar here, as in vLLM and SGLang) compiles the schema into an
    automaton over the tokenizer's vocabulary. Before each token the engine asks it which
    token ids may come next, sets every other logit to -inf, and samples as usual.

    Walking a valid answer through the teaching engine's grammar shows how few tokens are
    allowed where the schema decides, and how many inside a free string:
    """)
    return


@app.cell
def _(json, sampling):
    schema = {"type": "object",
              "properties": {"city": {"type": "string"}, "country": {"type": "string"},
                             "continent": {"enum": ["Africa", "America", "Asia", "Europe", "Oceania"]}},
              "required": ["city", "country", "continent"]}
    response_format = {"type": "json_schema", "json_schema": {"name": "capital", "schema": schema}}
    tokenizer, grammar, vocab_size = sampling.bundled_grammar(response_format)
    example = json.dumps({"city": "Paris", "country": "France", "continent": "Europe"},
                         separators=(",", ":"))
    example_ids = tokenizer.encode(example) + [tokenizer.eos_token_id]
    allowed = sampling.allowed_per_position(grammar, example_ids, vocab_size)
    sampling.allowed_figure([tokenizer.decode([t]) for t in example_ids], allowed, vocab_size)
    return allowed, example_ids, grammar, response_format, schema, vocab_size


@app.cell
def _(allowed, example_ids, ui, vocab_size):
    ui.md(f"Of {vocab_size:,} tokens, the grammar allowed as few as **{min(allowed)}** "
          f"(where the schema fixes the next characters) and as many as **{max(allowed):,}** "
          f"(inside a free string) along this {len(example_ids)}-token answer.")
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    **Exercise 2 (predict, then measure).** The bundled model is asked, at T = 0.7, for the
    capital of France "as JSON with the keys city, country and continent". Without the
    grammar, what share of its answers will be valid against the schema? With it?
    """)
    return


@app.cell
def _():
    my_valid_share = None    # your prediction for the share valid WITHOUT the grammar, e.g. 0.5
    return (my_valid_share,)


@app.cell(hide_code=True)
def _():
    from workshop.ui import reveal_button as _reveal_button

    reveal_exercise_2 = _reveal_button("Measure")
    reveal_exercise_2
    return (reveal_exercise_2,)


@app.cell
def _(
    engines,
    mo,
    response_format,
    reveal_exercise_2,
    sampling,
    schema,
    sweep,
    ui,
):
    mo.stop(not reveal_exercise_2.value,
            mo.md("_Write your prediction for Exercise 2, then press **Measure** under it._"))
    ask_json = [{"role": "user", "content": "What is the capital of France? Answer as JSON with "
                 "the keys city, country and continent."}]
    json_answers = sweep(16, 8)
    validity = []
    for _name, _s in ui.progress(list(engines.items()), title="answers with and without the grammar"):
        for _constrained in (False, True):
            _extra = {"response_format": response_format} if _constrained else {}
            # the answers in requests of at most the server's largest n (/server_info's limits)
            _n = min(json_answers, (_s.info.get("limits") or {}).get("max_n") or json_answers)
            _choices = sampling.choices(_s.openai(), _s.model, ask_json, json_answers, _n,
                                        max_tokens=64, temperature=0.7, **_extra)
            _verdicts = [sampling.check_json(c.message.content, schema) for c in _choices]
            validity.append({"engine": _name, "grammar": "on" if _constrained else "off",
                             "valid": _verdicts.count("valid") / len(_verdicts),
                             "wrong shape": _verdicts.count("wrong shape") / len(_verdicts),
                             "not JSON": _verdicts.count("not JSON") / len(_verdicts),
                             "one answer": _choices[0].message.content[:70]})
    ui.table(validity, floatfmt=".2f")
    return ask_json, validity


@app.cell
def _(first_engine, mo, my_valid_share, reveal_exercise_2, ui, validity):
    mo.stop(not reveal_exercise_2.value,
            mo.md("_Write your prediction for Exercise 2, then press **Measure** under it._"))
    json_off = next(r for r in validity if r["engine"] == first_engine and r["grammar"] == "off")
    ui.compare(my_valid_share, json_off["valid"], f"share of valid answers without the grammar on "
               f"{first_engine}")
    return (json_off,)


@app.cell
def _(first_engine, json_off, mo, reveal_exercise_2, ui, validity):
    # Worked answer to Exercise 2, collapsed until opened
    mo.stop(not reveal_exercise_2.value)
    _on = [r for r in validity if r["grammar"] == "on"]
    ui.worked_answer(
        "Without the grammar nothing makes the model follow the schema: a 135M-parameter model "
        "asked for JSON often writes prose around it, drops a key or invents one. Measured on "
        f"{first_engine}: **{json_off['valid']:.0%}** valid, {json_off['wrong shape']:.0%} JSON of "
        f"another shape, {json_off['not JSON']:.0%} not JSON at all. With the grammar every token "
        "that would break the schema has probability 0, so an answer that ends is valid by "
        "construction: measured " + ", ".join(f"{r['engine']} {r['valid']:.0%}" for r in _on) +
        ". One that does not end within max_tokens (an endless string or number: the grammar "
        "guarantees the shape, not that the model stops) is cut, and then not JSON.")
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    **Exercise 3 (predict, then measure).** How many milliseconds per token will the grammar
    add to the teaching engine's decoding? The next cell first times the grammar alone (fill
    the mask, apply it, advance the automaton) along the answer above.
    """)
    return


@app.cell
def _(example_ids, grammar, sampling, ui, vocab_size):
    mask_ms = sampling.mask_seconds_per_token(grammar, example_ids, vocab_size) * 1e3
    ui.md(f"The grammar alone: **{mask_ms:.3f} ms** per token on this CPU, in this process.")
    return (mask_ms,)


@app.cell
def _():
    my_extra_ms = None    # your prediction: ms added per token by the grammar, e.g. 1
    return (my_extra_ms,)


@app.cell(hide_code=True)
def _():
    from workshop.ui import reveal_button as _reveal_button

    reveal_exercise_3 = _reveal_button("Measure")
    reveal_exercise_3
    return (reveal_exercise_3,)


@app.cell
def _(
    ask_json,
    engines,
    mo,
    probe,
    response_format,
    reveal_exercise_3,
    statistics,
    sweep,
    ui,
):
    mo.stop(not reveal_exercise_3.value,
            mo.md("_Write your prediction for Exercise 3, then press **Measure** under it._"))
    def per_token_ms(server, **extra) -> float:
        t = probe.stream_chat(server.openai(), server.model, ask_json, max_tokens=sweep(48, 32),
                              temperature=0, **extra)
        return 1e3 / t.decode_tokens_per_s if t.decode_tokens_per_s else float("nan")


    rounds = sweep(6, 2)
    cost = []
    for _name, _s in ui.progress(list(engines.items()), title="decode speed with and without"):
        _free, _forced = [], []
        for _ in range(rounds):         # interleaved, so a busy moment hits both alike
            _free.append(per_token_ms(_s))
            _forced.append(per_token_ms(_s, response_format=response_format))
        _free_ms, _forced_ms = statistics.median(_free), statistics.median(_forced)
        cost.append({"engine": _name, "ms/token free": _free_ms,
                     "ms/token with grammar": _forced_ms, "added (ms/token)": _forced_ms - _free_ms,
                     "spread of free runs (ms/token)": max(_free) - min(_free)})
    ui.table(cost, floatfmt=".2f")
    return cost, rounds


@app.cell
def _(cost, mo, my_extra_ms, reveal_exercise_3, ui):
    mo.stop(not reveal_exercise_3.value,
            mo.md("_Write your prediction for Exercise 3, then press **Measure** under it._"))
    mini_cost = next((r for r in cost if r["engine"] == "teaching engine"), cost[0])
    ui.compare(my_extra_ms, mini_cost["added (ms/token)"],
               f"ms added per token on {mini_cost['engine']}", "ms")
    return (mini_cost,)


@app.cell
def _(mask_ms, mini_cost, mo, reveal_exercise_3, rounds, ui, vocab_size):
    # Worked answer to Exercise 3, collapsed until opened
    mo.stop(not reveal_exercise_3.value)
    _ratio = abs(mini_cost["added (ms/token)"]) / max(mini_cost["spread of free runs (ms/token)"], 1e-9)
    ui.worked_answer(
        f"The grammar's own work per token was measured above: **{mask_ms:.3f} ms** (xgrammar "
        "precomputes, for each automaton state, which tokens the state alone decides, so a step "
        f"is mostly copying a {vocab_size:,}-bit mask). Against a decode step of "
        f"{mini_cost['ms/token free']:.1f} ms that is {mask_ms / mini_cost['ms/token free']:.2%}. "
        f"Measured through the server: **{mini_cost['added (ms/token)']:+.2f} ms** per token "
        f"({rounds} interleaved rounds, medians), while the free runs alone spread over "
        f"{mini_cost['spread of free runs (ms/token)']:.2f} ms per token: the difference is "
        f"{_ratio:.1f}x that spread. Besides the mask, a constrained request goes through the "
        "sampler instead of the batched argmax, and is never drafted.")
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## 4. Tool calls: an agent loop

    An agent sends `tools` (functions with a JSON schema for their arguments); the model
    answers with calls; the application runs them and sends the results back as `tool`
    messages; the model answers. The bundled model has no tool-call format of its own, so the
    course's server serves tools the same way on every engine: it describes them in a system
    message and constrains the answer to a JSON schema of the allowed calls (the grammar of
    section 3), then returns OpenAI's `tool_calls`. The loop below is plain `openai` code and
    runs unchanged on each engine.
    """)
    return


@app.cell
def _(engines, json, ui):
    tools = [
        {"type": "function", "function": {
            "name": "add", "description": "Add two integers.",
            "parameters": {"type": "object", "properties": {"a": {"type": "integer"},
                                                            "b": {"type": "integer"}},
                           "required": ["a", "b"]}}},
        {"type": "function", "function": {
            "name": "capital", "description": "The capital city of a country.",
            "parameters": {"type": "object", "properties": {"country": {"type": "string"}},
                           "required": ["country"]}}},
    ]
    capitals = {"France": "Paris", "Italy": "Rome", "Japan": "Tokyo"}


    def run_tool(name: str, args: dict) -> str:
        return str(args["a"] + args["b"]) if name == "add" else capitals.get(args["country"], "unknown")


    def agent(server, question: str) -> list[dict]:
        """One round of tool calls, then the answer; returns the transcript."""
        client, messages = server.openai(), [{"role": "user", "content": question}]
        reply = client.chat.completions.create(model=server.model, messages=messages, tools=tools,
                                               tool_choice="required", temperature=0, max_tokens=128)
        message = reply.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        for call in message.tool_calls or []:
            result = run_tool(call.function.name, json.loads(call.function.arguments))
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
        final = client.chat.completions.create(model=server.model, messages=messages, tools=tools,
                                               tool_choice="none", temperature=0, max_tokens=40)
        messages.append({"role": "assistant", "content": final.choices[0].message.content})
        return messages


    transcripts = {name: agent(s, "What is 2 + 3, and what is the capital of Italy?")
                   for name, s in engines.items()}
    ui.table([{"engine": name, "step": i, "role": m["role"],
               "content or call": (m.get("content") or json.dumps(
                   [c["function"] for c in m.get("tool_calls", [])]))[:90]}
              for name, msgs in transcripts.items() for i, m in enumerate(msgs)])
    return (transcripts,)


@app.cell
def _(transcripts, ui):
    _calls = {name: sum(len(m.get("tool_calls", [])) for m in msgs)
              for name, msgs in transcripts.items()}
    ui.md("Every engine completed the loop: " + ", ".join(
        f"{name} made {n} call{'s' if n != 1 else ''}" for name, n in _calls.items()) +
        ". The calls are valid by construction (the grammar); whether they are the *right* calls "
        "is the model's doing, and a 135M model often picks odd arguments.")
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## What the real engines do

    - **vLLM** applies `response_format` (and its own `structured_outputs` field: regex,
      choice, grammar) with a choice of backends, xgrammar by default, also guidance
      (llguidance) and outlines
      ([structured outputs](https://docs.vllm.ai/en/latest/features/structured_outputs.html)).
      For tools it parses the model's own call format with `--tool-call-parser` (hermes,
      llama3_json, mistral, ...) and needs `--enable-auto-tool-choice` for `tool_choice: "auto"`;
      a named or `"required"` choice is served with structured outputs
      ([tool calling docs](https://docs.vllm.ai/en/latest/features/tool_calling.html)).
    - **SGLang** has `--grammar-backend` (xgrammar by default, llguidance, outlines) and
      `--tool-call-parser`; its deterministic-inference mode (`--enable-deterministic-inference`,
      2025-09) makes results independent of batching at some speed cost.
    - **The teaching engine** masks with xgrammar in `mini_engine/grammar.py`;
      `benchmarks/grammar_backends.py` times xgrammar, llguidance and outlines-core on this
      machine. The course's server turns tools into a schema for every engine
      (`reference_server/tools.py`), because the bundled model has no call format of its own.
    """)
    return


if __name__ == "__main__":
    app.run()
