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
    app_title="9 · Speculative decoding: guess cheaply, verify in one pass",
)


@app.cell(hide_code=True)
def _():
    import marimo as mo

    return (mo,)


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    # 9 · Speculative decoding: guess cheaply, verify in one pass

    [![Open in Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/llm-inference-workshop/llm-inference-workshop/blob/main/notebooks/09_speculative_decoding.ipynb)
    [![Open in molab](https://marimo.io/molab-shield.svg)](https://molab.marimo.io/github/llm-inference-workshop/llm-inference-workshop/blob/main/notebooks/09_speculative_decoding.py)

    Decoding produces one token per forward pass of the whole model, and (notebook 3) a decode
    step on a GPU is limited by reading the weights, not by arithmetic: scoring 5 tokens in one
    pass costs little more than scoring 1. **Speculative decoding** (Leviathan, Kalman and
    Matias 2023, [arXiv:2211.17192](https://arxiv.org/abs/2211.17192); Chen et al. 2023,
    [arXiv:2302.01318](https://arxiv.org/abs/2302.01318)) uses that spare capacity: something
    cheap *drafts* the next k tokens, the model *verifies* them all in one forward pass and keeps
    every draft token it would have produced anyway. With greedy decoding the output is
    **identical** to plain decoding, token for token; only the number of forward passes changes.

    This notebook (1) writes the draft/verify loop on the bundled model, in this process, with
    the teaching engine's acceptance rule and drafters, and checks its token ids against plain
    decoding; (2) measures acceptance and speed-up against the draft length k, next to the
    expected speed-up of Leviathan et al.; (3) sends an editing and an open-chat workload through
    the teaching engine's server with n-gram drafts (prompt lookup), reading its counters on
    `/metrics`; (4) does the same with vLLM's own n-gram speculation; (5) ends with what the real
    engines offer.
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
    ## 1. The draft/verify loop

    We load the bundled model into this process with the teaching engine's model runner
    (`mini_engine/model_runner.py`), with a paged KV cache this notebook owns whole. One function
    gives the loop all it needs from the model: run new tokens at positions `start, start+1, ...`
    (their keys and values go into the cache; attention reads the earlier ones from it) and
    return the model's **greedy choice after each of the last `num_logits` tokens**.
    """)
    return


@app.cell
def _():
    import inspect

    from reference_server.models import resolve_model
    from transformers import AutoTokenizer

    from mini_engine.attention_metadata import Chunk
    from mini_engine.config import EngineConfig
    from mini_engine.model_runner import ModelRunner
    from mini_engine.spec_decode import NgramProposer, accept_greedy
    from workshop.engine_lab import spec_decoding as sd
    from workshop import ui
    from workshop.session import sweep

    model_path = resolve_model("smollm2-135m").path
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    runner = ModelRunner(model_path, EngineConfig(dtype="float32", num_blocks=64))
    cache_blocks = list(range(runner.num_blocks))    # one sequence at a time: the whole pool is ours


    def forward(start, token_ids, num_logits, num_layers=None):
        """The model's greedy next token after each of the last ``num_logits`` of ``token_ids``
        (placed at positions start, start+1, ...). ``num_layers``: stop after that many layers."""
        logits = runner.forward([Chunk(cache_blocks, start, token_ids, num_logits)], num_layers)
        return logits.argmax(-1).tolist()


    ui.md(f"Loaded `{model_path}`: {runner.cfg.num_layers} layers, a KV cache of "
          f"{runner.num_blocks * runner.block_size:,} token slots, fp32.")
    return (
        NgramProposer,
        accept_greedy,
        forward,
        inspect,
        runner,
        sd,
        sweep,
        tokenizer,
        ui,
    )


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    **The acceptance rule.** The verify pass feeds the last known token and the k drafts, and
    gets back k + 1 greedy choices. Draft i is kept if it equals the model's choice at its
    position; everything after the first mismatch is dropped, and the model's choice there (or
    after the last draft: a *bonus* token) is emitted too. So a step emits at least one token,
    the one plain decoding would have produced. The engine's code, `mini_engine/spec_decode.py`:
    """)
    return


@app.cell
def _(accept_greedy, inspect, ui):
    ui.md("```python\n" + inspect.getsource(accept_greedy) + "```")
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    **Two drafters.** *Prompt lookup* (n-gram) finds the latest earlier place where the last few
    tokens occurred and proposes what followed them there: no model call, and right whenever the
    answer copies the prompt. *Self-draft* (LayerSkip-style, Elhoushi et al. 2024,
    [arXiv:2404.16710](https://arxiv.org/abs/2404.16710)) runs only the first `draft layers` of
    the same model, then its final norm and output layer, sharing the model's KV cache for those
    layers (section 2 measures its cost); it is right when the early layers already know the
    answer. The engine's n-gram proposer:
    """)
    return


@app.cell
def _(NgramProposer, inspect, ui):
    ui.md("```python\n" + inspect.getsource(NgramProposer.propose_one) + "```")
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    Pick the workload, the drafter and its size. In Jupyter, re-run the cells below after
    changing a control; marimo re-runs them for you.
    """)
    return


@app.cell
def _(sd, ui):
    workload = ui.dropdown(list(sd.WORKLOADS), list(sd.WORKLOADS)[0], "workload")
    workload
    return (workload,)


@app.cell
def _(ui):
    drafter = ui.dropdown(["n-gram (prompt lookup)", "self-draft (first layers)"],
                          "n-gram (prompt lookup)", "drafter for the sweep of section 2")
    drafter
    return (drafter,)


@app.cell
def _(runner, ui):
    draft_layers = ui.slider(1, runner.cfg.num_layers - 1, 8, 1, "self-draft: layers it runs")
    draft_layers
    return (draft_layers,)


@app.cell
def _(sweep, ui):
    max_new_tokens = ui.slider(8, 256, sweep(64, 24), 8, "tokens to generate")
    max_new_tokens
    return (max_new_tokens,)


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    Now the loop. `tokens` is the prompt plus everything emitted so far; the cache holds the keys
    and values of all tokens but the last. One step: draft, verify all drafts in **one** forward,
    keep the matching prefix plus the model's own token. Keys and values written for rejected
    drafts need no undo: they sit beyond the last kept token, and the next step overwrites them.
    With k = 0 this is plain greedy decoding, one forward per token: the baseline, same code.
    """)
    return


@app.cell
def _(NgramProposer, accept_greedy, draft_layers, forward):
    ngram = NgramProposer(max_n=3)


    def ngram_draft(tokens, k):
        return ngram.propose_one(tokens, k)


    def self_draft(tokens, k):
        drafts = []
        for i in range(k):        # k cheap forwards, one token each, through the first layers
            last = drafts[-1] if drafts else tokens[-1]
            drafts += forward(len(tokens) - 1 + i, [last], 1, num_layers=draft_layers.value)
        return drafts


    def speculative_decode(prompt_ids, max_new, k, draft):
        """Greedy decoding with k draft tokens per step; returns (new ids, [(drafted, accepted)])."""
        tokens = list(prompt_ids)
        forward(0, tokens[:-1], 0)                   # prefill: the cache holds all but the last
        steps = []
        while len(tokens) - len(prompt_ids) < max_new:
            drafts = draft(tokens, k) if k else []
            # one target forward scores the last token and every draft: k + 1 greedy choices
            target = forward(len(tokens) - 1, [tokens[-1]] + drafts, 1 + len(drafts))
            new = accept_greedy(drafts, target)      # accepted drafts + the model's own token
            tokens += new
            steps.append((len(drafts), len(new) - 1))
        return tokens[len(prompt_ids):][:max_new], steps

    return ngram, ngram_draft, self_draft, speculative_decode


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    Three runs on the chosen workload's first prompt, sent through the model's chat template as
    the servers of sections 3 and 4 will send it: plain decoding, prompt lookup and the
    self-draft, both with k = 4.
    """)
    return


@app.cell
def _(
    draft_layers,
    max_new_tokens,
    ngram_draft,
    sd,
    self_draft,
    speculative_decode,
    tokenizer,
    ui,
    workload,
):
    def chat_ids(prompt):
        """The prompt as the chat template sends it to the model (the servers do the same)."""
        return list(tokenizer.apply_chat_template([{"role": "user", "content": prompt}],
                                                  add_generation_prompt=True, tokenize=True,
                                                  return_dict=True)["input_ids"])


    demo_prompt = chat_ids(sd.WORKLOADS[workload.value][0])
    demo_runs = {name: speculative_decode(demo_prompt, max_new_tokens.value, k, fn)
                 for name, k, fn in [("plain (k = 0)", 0, None),
                                     ("n-gram, k = 4", 4, ngram_draft),
                                     (f"self-draft ({draft_layers.value} layers), k = 4", 4,
                                      self_draft)]}
    demo_plain = demo_runs["plain (k = 0)"][0]
    ui.table(sd.demo_rows(demo_runs))     # the first run, plain decoding, is the baseline
    return chat_ids, demo_plain, demo_prompt, demo_runs


@app.cell
def _(demo_plain, demo_runs, draft_layers, sd, tokenizer, ui, workload):
    _fewest = min(demo_runs, key=lambda name: len(demo_runs[name][1]))
    _self_rate = sd.acceptance_rate(demo_runs[f"self-draft ({draft_layers.value} layers), k = 4"][1])
    ui.md(
        f"The prompt: *{sd.WORKLOADS[workload.value][0][:90]}...* The model's answer starts: "
        f"*{tokenizer.decode(demo_plain[:40])}...*\n\n"
        + (f"All three runs produced **the same {len(demo_plain)} token ids**: verification only "
           "keeps what plain greedy decoding would have chosen. "
           if all(ids == demo_plain for ids, _ in demo_runs.values()) else
           "**The runs did not all produce the same token ids.** In exact arithmetic they must; a "
           "verify forward computes a position in another batch shape than plain decoding, which "
           "can flip a near-tie (docs/near_ties.md), but this run does not check that it did. ")
        + f"The fewest target forwards: **{_fewest}**, {len(demo_runs[_fewest][1])} forwards for "
        f"{len(demo_runs[_fewest][0])} tokens, against {len(demo_plain)} for plain decoding. The "
        f"self-draft's first {draft_layers.value} layers agreed with the full model on "
        f"{_self_rate:.0%} of its draft tokens"
        + (": this model was not trained to exit early (LayerSkip trains for it), so its early "
           "layers rarely know the final answer." if _self_rate < 0.3 else ".")
    )
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## 2. How much faster? The expected speed-up, then the measurement

    Leviathan et al. (section 3 of the paper) model each draft token as accepted with
    probability α, independently. Verification stops at the first rejection, so a step with k
    drafts emits 1 + α + α² + ... + αᵏ tokens on average, and costs one target forward plus k
    draft forwards at c each (c: a draft forward's cost relative to the target's). The paper
    takes a verify forward of k + 1 tokens to cost a one-token decode, true while decoding is
    memory-bound; we keep that as a parameter, `verify_cost` (1 in the paper), because on a CPU
    it may not hold. From `workshop/engine_lab/spec_decoding.py`:
    """)
    return


@app.cell
def _(inspect, sd, ui):
    ui.md("```python\n" + inspect.getsource(sd.expected_tokens_per_step)
          + "\n\n" + inspect.getsource(sd.expected_speedup) + "```")
    return


@app.cell
def _(sd, ui):
    ui.md(f"What the formula says before measuring anything: with free drafts (c = 0, like prompt "
          f"lookup), α = 0.8 and k = 4, a step emits (1 − 0.8⁵) / (1 − 0.8) = "
          f"**{sd.expected_tokens_per_step(0.8, 4):.2f}** tokens for one target forward. With "
          f"α = 0 a step still emits one token but pays for k drafts: at c = 0.1 and k = 4 the "
          f"'speed-up' is {sd.expected_speedup(0.0, 4, 0.1):.2f}x. The curves below are the formula "
          f"at c = 0.1 (no measurement).")
    return


@app.cell
def _(sd):
    sd.formula_figure([0.0, 0.5, 0.7, 0.8, 0.9], c=0.1, k_max=10)
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    **Measuring c and the verify cost.** At the demo's context we time a one-token forward of
    the full model, a self-draft forward, an n-gram proposal and verify forwards of k + 1 tokens,
    interleaved (`timing.interleaved_times`: each once per round, the best round kept) so that a
    shared machine's other work does not land on one of them alone. Then the arithmetic checks
    them (`spec_decoding.cost_violations`): a self-draft does a full forward's work minus the
    skipped layers, so it costs between its layers' share k / L and the whole forward; a verify
    forward of k + 1 tokens costs at most k + 1 one-token forwards and at least one. Between two
    verify sizes there is no rule: the matmul kernels split the work by shape, and on some CPUs
    3 tokens take longer than 5. The last column is the draft's share of the FLOPs (`spec_decoding.draft_share`),
    the output layer included: compare it with the time.
    """)
    return


@app.cell
def _(
    demo_plain,
    demo_prompt,
    draft_layers,
    forward,
    ngram,
    runner,
    sd,
    sweep,
    ui,
):
    from workshop import sanity, timing

    sweep_ks = sweep([1, 2, 3, 4, 6, 8], [2, 4])
    _ctx = len(demo_prompt) + len(demo_plain) - 1
    _history = list(demo_prompt) + list(demo_plain)
    _times = timing.interleaved_times(
        {"decode": lambda: forward(_ctx, [demo_plain[-1]], 1),
         "self-draft": lambda: forward(_ctx, [demo_plain[-1]], 1, num_layers=draft_layers.value),
         "n-gram": lambda: ngram.propose_one(_history, 4),
         **{k: (lambda k=k: forward(_ctx, demo_plain[-k - 1:], k + 1)) for k in sweep_ks}},
        rounds=sweep(7, 5))
    decode_s, self_draft_s, ngram_s = _times["decode"], _times["self-draft"], _times["n-gram"]
    verify_s = {k: _times[k] for k in sweep_ks}
    costs = {"n-gram (prompt lookup)": ngram_s / decode_s,
             "self-draft (first layers)": self_draft_s / decode_s}
    verify_costs = {k: s / decode_s for k, s in verify_s.items()}
    # The share is of FLOPs: the draft runs its layers and, like the full model, the output layer.
    self_draft_share = sd.draft_share(runner.cfg, draft_layers.value, _ctx)
    _layers = f"{draft_layers.value} of {runner.cfg.num_layers} layers"
    cost_violations = sd.cost_violations(f"a self-draft forward ({_layers})",
                                         costs["self-draft (first layers)"],
                                         draft_layers.value / runner.cfg.num_layers, verify_costs)
    ui.table(sd.cost_rows(decode_s, {
        f"one self-draft forward ({_layers})": (self_draft_s, self_draft_share),
        "one n-gram proposal of 4 tokens (NumPy, no model)": (ngram_s, 0.0)}, verify_s))
    return (
        cost_violations,
        costs,
        decode_s,
        sanity,
        self_draft_share,
        sweep_ks,
        verify_costs,
    )


@app.cell
def _(
    cost_violations,
    costs,
    draft_layers,
    runner,
    sanity,
    self_draft_share,
    ui,
    verify_costs,
):
    _k = max(verify_costs)
    ui.md(sanity.report(cost_violations) + "\n\n" + sanity.WITHHELD if cost_violations else
          f"The self-draft costs c = **{costs['self-draft (first layers)']:.2f}** of a full forward, "
          f"for {self_draft_share:.2f} of its FLOPs ({draft_layers.value} of "
          f"{runner.cfg.num_layers} layers and the output layer); a proposal by prompt lookup "
          f"c = **{costs['n-gram (prompt lookup)']:.3f}**. Verifying {_k + 1} tokens in one forward "
          f"took **{verify_costs[_k]:.2f}x** a one-token decode: "
          + ("close to the paper's assumption of 1: the extra tokens rode along almost for free."
             if verify_costs[_k] < 1.3 else
             "well above the paper's assumption of 1: here a forward's time grew with its tokens, "
             "so the formula with verify cost 1 will overestimate the speed-up."))
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    **Exercise 1 (predict, then compute).** In the demo above, the n-gram drafter at k = 4
    accepted the fraction of draft tokens printed below (counted per compared token, the α of
    the formula). With its measured c, what speed-up does the formula predict at k = 4?
    """)
    return


@app.cell
def _(costs, demo_runs, sd, ui):
    exercise_alpha = sd.alpha_from_steps(demo_runs["n-gram, k = 4"][1])
    ui.md(f"Measured α (n-gram, k = 4, this workload): **{exercise_alpha:.2f}**; "
          f"c = {costs['n-gram (prompt lookup)']:.3f}.")
    return (exercise_alpha,)


@app.cell
def _():
    my_formula_speedup = None    # your prediction, e.g. 2.0
    return (my_formula_speedup,)


@app.cell(hide_code=True)
def _():
    from workshop.ui import reveal_button as _reveal_button

    reveal_exercise_1 = _reveal_button("Compute")
    reveal_exercise_1
    return (reveal_exercise_1,)


@app.cell
def _(
    costs,
    exercise_alpha,
    mo,
    my_formula_speedup,
    reveal_exercise_1,
    sd,
    ui,
):
    mo.stop(not reveal_exercise_1.value,
            mo.md("_Write your prediction for Exercise 1, then press **Compute** under it._"))
    exercise_formula = sd.expected_speedup(exercise_alpha, 4, costs["n-gram (prompt lookup)"])
    ui.compare(my_formula_speedup, exercise_formula, "formula speed-up at k = 4", "x",
               how="computed")
    return (exercise_formula,)


@app.cell
def _(
    costs,
    demo_runs,
    exercise_alpha,
    exercise_formula,
    mo,
    reveal_exercise_1,
    sd,
    ui,
):
    # Worked answer to Exercise 1, collapsed until opened
    mo.stop(not reveal_exercise_1.value)
    _c = costs["n-gram (prompt lookup)"]
    _per_step = sd.expected_tokens_per_step(exercise_alpha, 4)
    ui.worked_answer(
        "A step emits 1 + α + α² + α³ + α⁴ tokens on average (each draft counts only if all "
        f"before it were kept): with α = {exercise_alpha:.2f}, (1 - α⁵) / (1 - α) gives "
        f"**{_per_step:.2f}** tokens per target forward. A step costs that forward plus 4 drafts "
        f"at c = {_c:.3f}: 1 + 4 x {_c:.3f} = {1 + 4 * _c:.3f} target forwards. Speed-up: "
        f"{_per_step:.2f} / {1 + 4 * _c:.3f} = **{exercise_formula:.2f}x**. The demo itself "
        f"emitted {sd.tokens_per_step(demo_runs['n-gram, k = 4'][1]):.2f} tokens per target "
        f"forward; the formula's {_per_step:.2f} assumes every draft is accepted with the same "
        "chance α, independently."
    )
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    **Exercise 2 (predict, then measure).** Now the real thing: the sweep below times the loop
    for each k with the drafter you chose, against k = 0 on the same prompt. What speed-up will
    it *measure* at k = 4, on this machine? (Each run is timed from the prompt to its last
    token, so the prefill, the same for every k, is included.)
    """)
    return


@app.cell
def _():
    my_measured_speedup = None    # your prediction, e.g. 1.5
    return (my_measured_speedup,)


@app.cell(hide_code=True)
def _():
    from workshop.ui import reveal_button as _reveal_button

    reveal_exercise_2 = _reveal_button("Measure")
    reveal_exercise_2
    return (reveal_exercise_2,)


@app.cell
def _(
    costs,
    demo_prompt,
    drafter,
    max_new_tokens,
    mo,
    my_measured_speedup,
    ngram_draft,
    reveal_exercise_2,
    sd,
    self_draft,
    speculative_decode,
    sweep,
    sweep_ks,
    ui,
    verify_costs,
):
    mo.stop(not reveal_exercise_2.value,
            mo.md("_Write your prediction for Exercise 2, then press **Measure** under it._"))
    sweep_draft = ngram_draft if drafter.value.startswith("n-gram") else self_draft
    sweep_rows = sd.draft_length_sweep(
        lambda k: speculative_decode(demo_prompt, max_new_tokens.value, k, sweep_draft),
        sweep_ks, costs[drafter.value], verify_costs,
        progress=lambda ks: ui.progress(ks, title="draft length sweep"), rounds=sweep(3, 2))
    sweep_at_4 = next(r for r in sweep_rows if r["k"] == 4)
    sweep_violations = sd.sweep_violations(sweep_rows)
    ui.compare(my_measured_speedup, sweep_at_4["measured speed-up"],
               f"speed-up at k = 4 ({drafter.value})", "x")
    return sweep_at_4, sweep_rows, sweep_violations


@app.cell
def _(
    cost_violations,
    costs,
    decode_s,
    demo_runs,
    drafter,
    mo,
    reveal_exercise_2,
    sanity,
    sweep_at_4,
    sweep_rows,
    sweep_violations,
    ui,
    verify_costs,
):
    # Worked answer to Exercise 2, collapsed until opened
    # The same prompt, drafter and k ran in section 1's demo: its steps are the sweep's k = 4 run.
    mo.stop(not reveal_exercise_2.value)
    _demo = next(name for name in demo_runs if name.startswith(drafter.value.split(" (")[0]))
    _ids, _steps = demo_runs[_demo]
    _c, _v = costs[drafter.value], verify_costs[4]
    _plain_s, _spec_s = len(_ids) * decode_s, len(_steps) * (_v + 4 * _c) * decode_s
    _measured = sweep_at_4["measured speed-up"]
    ui.worked_answer(
        f"Count forwards. Plain decoding made {len(_ids)} one-token forwards; the demo's k = 4 run "
        f"({_demo}) made **{len(_steps)} steps**, each a verify forward of up to 5 tokens "
        f"({_v:.2f}x a one-token forward, measured in section 2) and 4 drafts at c = {_c:.3f}. "
        f"Forecast: {len(_ids)} / ({len(_steps)} x ({_v:.2f} + 4 x {_c:.3f})) = "
        f"**{_plain_s / _spec_s:.2f}x**. "
        + (f"Measured: {_measured:.2f}x, but the costs or the sweep failed a sanity check:\n\n"
           + sanity.report(cost_violations + sweep_violations) + "\n\n" + sanity.WITHHELD
           if cost_violations or sweep_violations else
           f"Measured: **{_measured:.2f}x**, {_measured * _spec_s / _plain_s:.2f}x the forecast. "
           "The timed runs also include what speculation does not shorten, the same for every k "
           "(the prefill, the loop's own work), which pulls a measured speed-up towards 1: k = 0 "
           f"took {sweep_rows[0]['seconds']:.2f} s, of which its {len(_ids)} forwards at "
           f"section 2's {decode_s * 1e3:.1f} ms account for {_plain_s:.2f} s.")
    )
    return


@app.cell
def _(sweep_rows, ui):
    ui.table(sweep_rows, floatfmt=".3g")
    return


@app.cell
def _(costs, drafter, sd, sweep_rows):
    sd.sweep_figure(sweep_rows, drafter.value, costs[drafter.value])
    return


@app.cell
def _(cost_violations, drafter, sanity, sd, sweep_rows, sweep_violations, ui):
    _s = sd.sweep_summary(sweep_rows, sanity.MEASUREMENT_ERROR)
    _gap = {"matches": "The formula with the measured verify cost matches the measurement within "
                       f"{sanity.MEASUREMENT_ERROR:.0%}. ",
            "explained": "The measured verify cost explains most of the paper formula's gap: a "
                         "forward of k + 1 tokens cost more than a forward of one here. ",
            "unexplained": "The measured verify cost does not explain the gap, and this run "
                           "measures nothing else that would: it cannot say where the rest comes "
                           "from. "}[_s["gap"]]
    ui.md(
        sanity.report(cost_violations + sweep_violations) + "\n\n" + sanity.WITHHELD
        if cost_violations or sweep_violations else
        f"With the {drafter.value} drafter, acceptance ranged from {_s['acceptance'][0]:.0%} to "
        f"{_s['acceptance'][1]:.0%} of draft tokens over k = {_s['ks']}. The best measured "
        f"speed-up was **{_s['best speed-up']:.2f}x at k = {_s['best k']}** (speculation "
        + ("paid off" if _s["best speed-up"] > 1.05 else "did not pay off") + " on this machine). "
        f"On average the paper's formula predicted {_s['formula / measured']:.2f}x what was "
        f"measured, the formula with the measured verify cost "
        f"{_s['with verify cost / measured']:.2f}x. " + _gap
        + ("Acceptance fell as k grew: the later a draft token, the more chances that an earlier "
           "one was already wrong. " if _s["acceptance fell"] else "")
        + ("All runs returned the same token ids as k = 0." if _s["same ids"] else
           "**Not every run returned the same token ids as k = 0** (see the table).")
    )
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    Try the other drafter and another number of self-draft layers: more layers draft better
    (higher α) but cost more (higher c), and the formula says which of the two wins.

    ## 3. n-gram drafts through the teaching engine's server

    Prompt lookup needs the answer to repeat something already in the context. We send two
    workloads, greedy, one request at a time: **editing a given text** (the answer copies most
    of the prompt) and **open chat** (nothing to copy but what the model repeats of itself), to
    two teaching-engine servers, one with `--spec ngram --num-spec-tokens 4` and a baseline
    without. Before and after each workload we read vLLM's counters, which the server exports on
    `/metrics` (`reference_server/prometheus.py`): `vllm:spec_decode_num_drafts_total`,
    `vllm:spec_decode_num_draft_tokens_total`, `vllm:spec_decode_num_accepted_tokens_total`.
    """)
    return


@app.cell
def _(sd, sweep, ui, workshop):
    server_tokens = sweep(96, 24)
    server_prompts = {name: prompts[:sweep(2, 1)] for name, prompts in sd.WORKLOADS.items()}
    # A small KV pool is plenty for one request at a time, and leaves memory to the rest.
    _minis = workshop.session.start_many("mini", {
        "base": ["--kv-cache-gib", "0.25"],
        "ngram": ["--kv-cache-gib", "0.25", "--", "--spec", "ngram", "--num-spec-tokens", "4"]})
    mini_base, mini_ngram = _minis["base"], _minis["ngram"]
    _extra = mini_ngram.info.get("extra", {})
    ui.md(f"Started two teaching-engine servers: {mini_base.base_url} (no speculation) and "
          f"{mini_ngram.base_url} (its `/server_info` says `spec={_extra.get('spec')}`, "
          f"`num_spec_tokens={_extra.get('num_spec_tokens')}`), dtype {mini_ngram.info.get('dtype')}.")
    return mini_base, mini_ngram, server_prompts, server_tokens


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    **Exercise 3 (predict, then measure).** What fraction of the n-gram draft tokens will the
    teaching engine accept on **open chat**? (Section 1's demo and section 2's sweep measured
    this drafter on the workload you chose.)
    """)
    return


@app.cell
def _():
    my_chat_acceptance = None    # your prediction, a fraction, e.g. 0.1
    return (my_chat_acceptance,)


@app.cell(hide_code=True)
def _():
    from workshop.ui import reveal_button as _reveal_button

    reveal_exercise_3 = _reveal_button("Measure")
    reveal_exercise_3
    return (reveal_exercise_3,)


@app.cell
def _(
    mini_base,
    mini_ngram,
    mo,
    my_chat_acceptance,
    reveal_exercise_3,
    sd,
    server_prompts,
    server_tokens,
    ui,
):
    mo.stop(not reveal_exercise_3.value,
            mo.md("_Write your prediction for Exercise 3, then press **Measure** under it._"))
    mini_runs = []
    for _name, _prompts in ui.progress(list(server_prompts.items()), title="teaching engine"):
        mini_runs.append(sd.run_workload(mini_base, _prompts, server_tokens, "mini, no spec", _name))
        mini_runs.append(sd.run_workload(mini_ngram, _prompts, server_tokens, "mini, n-gram k=4",
                                         _name))
    mini_rows = sd.speedup_rows(*sd.split_runs(mini_runs, "mini, no spec"))
    mini_chat_row = next(r for r in mini_rows if r["workload"] == "open chat")
    ui.compare(my_chat_acceptance, mini_chat_row["acceptance rate"] or 0.0,
               "n-gram acceptance rate on open chat (teaching engine)")
    return mini_chat_row, mini_rows, mini_runs


@app.cell
def _(
    chat_ids,
    mini_chat_row,
    mini_ngram,
    mini_runs,
    mo,
    ngram_draft,
    reveal_exercise_3,
    sd,
    server_prompts,
    server_tokens,
    speculative_decode,
    tokenizer,
    ui,
):
    # Worked answer to Exercise 3, collapsed until opened
    # The mechanism, in this process: section 1's loop with the same drafter (prompt lookup, up to
    # 3-grams, k = 4) on the same open-chat prompts, as many tokens as the servers generate.
    mo.stop(not reveal_exercise_3.value)
    _runs = [speculative_decode(chat_ids(_p), server_tokens, 4, ngram_draft)
             for _p in server_prompts["open chat"]]
    _n = sd.step_counts([_st for _, _st_list in _runs for _st in _st_list])
    chat_loop_acceptance = _n["acceptance rate"]
    _texts = sd.texts_until_eos(tokenizer, [_ids for _ids, _ in _runs])
    _same = _texts == next(r["texts"] for r in mini_runs
                           if r["server"] == "mini, n-gram k=4" and r["workload"] == "open chat")
    ui.worked_answer(
        "Prompt lookup proposes only when the last 1 to 3 tokens occurred earlier in the context, "
        "and then proposes what followed them there. An open-chat answer copies little of its "
        "prompt, so few steps find a match. Section 1's loop, run here on the same "
        + ("prompt" if len(_runs) == 1 else f"{len(_runs)} prompts") + " with the same drafter and "
        f"k, proposed draft tokens in {_n['drafting steps']} of {_n['steps']} steps, "
        f"{_n['draft tokens']} in all, of which {_n['accepted']} accepted: "
        f"**{chat_loop_acceptance:.0%}**. The server "
        f"measured **{mini_chat_row['acceptance rate'] or 0.0:.0%}** of "
        f"{mini_chat_row['draft tokens']} draft tokens (its `/metrics` counters). Its answers were "
        + ("the same texts as this loop's. One difference remains in how drafts are made: the "
           "server drafts only within the room left before `max_tokens` "
           "(`_lookahead` in `mini_engine/scheduler.py`), where this loop always drafts 4."
           if _same else
           f"not the same texts as this loop's (the server computes in "
           f"{mini_ngram.info.get('dtype')}, this loop in float32), so the two matched different "
           "contexts.")
    )
    return


@app.cell
def _(mini_runs, sd, ui):
    ui.table(sd.without_texts(mini_runs))
    return


@app.cell
def _(mini_rows, ui):
    ui.table(mini_rows)
    return


@app.cell
def _(mini_base, mini_chat_row, mini_ngram, mini_rows, sd, ui):
    mini_base.stop()
    mini_ngram.stop()
    _rep = next(r for r in mini_rows if r["workload"] != "open chat")
    ui.md(
        "Teaching engine, n-gram k = 4: on the editing workload " + sd.acceptance_text(_rep)
        + f" and decoding ran **{_rep['speed-up']:.2f}x** the baseline's speed; on open chat "
        + sd.acceptance_text(mini_chat_row) + f", **{mini_chat_row['speed-up']:.2f}x**. "
        + ("Prompt lookup helped most where the answer copies the prompt, as expected. "
           if _rep["speed-up"] > mini_chat_row["speed-up"] else
           "Here prompt lookup did not help more on the editing workload than on chat. ")
        + (f"Open chat ran slower than the baseline, with "
           f"{mini_chat_row['draft tokens'] - mini_chat_row['accepted']} of "
           f"{mini_chat_row['draft tokens']} draft tokens rejected. "
           if mini_chat_row["speed-up"] < 0.95 and mini_chat_row["draft tokens"] else "")
        + sd.noise_note(mini_chat_row)
        + ("Both servers produced the same texts for every request."
           if all(r["same text as baseline"] for r in mini_rows) else
           "**Some texts differed from the baseline's** (the servers compute in "
           f"{mini_ngram.info.get('dtype')}; a verify forward over several tokens can round a "
           "near-tie differently from a one-token decode).")
    )
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## 4. vLLM's own n-gram speculative decoding

    vLLM configures speculative decoding with one JSON argument, `--speculative-config`
    (`vllm/config/speculative.py`): `method` `"ngram"` with `num_speculative_tokens` and
    `prompt_lookup_max` / `prompt_lookup_min` (the longest and shortest n-gram it matches). One
    extra vLLM server runs with it (slow to start on a CPU), against the course's shared vLLM
    server without speculation, on the same workloads and counters. On another engine
    (`WORKSHOP_ENGINE`) this section says so and skips: the comparison would mix two engines.
    """)
    return


@app.cell
def _(session, ui, workshop):
    import json

    vllm_spec_config = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3}
    vllm_spec, vllm_spec_error = None, None
    if session.engine != "vllm":
        vllm_spec_error = (f"skipped: the course's server runs {session.engine}, not vLLM, so there "
                           "is no vLLM without speculation to compare with")
    else:
        try:
            vllm_spec = workshop.session.start(
                "vllm", ["--kv-cache-gib", "0.25", "--", "--speculative-config",
                         json.dumps(vllm_spec_config)], verbose=False)
        except Exception as _exc:      # shown, not hidden: a refusal is a result too
            vllm_spec_error = "did not start: `" + f"{type(_exc).__name__}: {_exc}"[-600:] + "`"
    ui.md(f"vLLM with `--speculative-config '{json.dumps(vllm_spec_config)}'`: "
          + (f"started at {vllm_spec.base_url} ({vllm_spec.info.get('engine')} "
             f"{vllm_spec.info.get('engine_version', '')}, {vllm_spec.info.get('dtype')})."
             if vllm_spec else f"**{vllm_spec_error}**."))
    return vllm_spec, vllm_spec_error


@app.cell
def _(sd, server_prompts, server_tokens, session, ui, vllm_spec):
    vllm_runs = []
    if vllm_spec is not None:
        for _name, _prompts in ui.progress(list(server_prompts.items()), title="vLLM"):
            vllm_runs.append(sd.run_workload(session, _prompts, server_tokens, "vLLM, no spec",
                                             _name))
            vllm_runs.append(sd.run_workload(vllm_spec, _prompts, server_tokens,
                                             "vLLM, n-gram k=4", _name))
    vllm_rows = sd.speedup_rows(*sd.split_runs(vllm_runs, "vLLM, no spec"))
    vllm_log_warnings = (sd.log_warnings(vllm_spec.log_path, "speculative")
                         if vllm_spec is not None and vllm_spec.log_path else [])
    ui.table(vllm_rows) if vllm_rows else ui.md("_(no vLLM runs)_")
    return vllm_log_warnings, vllm_rows


@app.cell
def _(
    sd,
    session,
    ui,
    vllm_log_warnings,
    vllm_rows,
    vllm_spec,
    vllm_spec_error,
):
    if vllm_spec is not None:
        vllm_spec.stop()
    if vllm_rows:
        _vr = next(r for r in vllm_rows if r["workload"] != "open chat")
        _vc = next(r for r in vllm_rows if r["workload"] == "open chat")
        vllm_summary = ui.md(
            "vLLM, n-gram k = 4: editing workload " + sd.acceptance_text(_vr)
            + f", decode **{_vr['speed-up']:.2f}x** the shared server's; open chat "
            + sd.acceptance_text(_vc) + f", **{_vc['speed-up']:.2f}x**. " + sd.noise_note(_vc)
            + ("Same texts as the server without speculation. "
               if all(r["same text as baseline"] for r in vllm_rows) else
               "Some texts differed from the server without speculation (vLLM computes in "
               f"{session.info.get('dtype')} here; vLLM's documentation says speculative decoding "
               "is lossless up to floating-point precision and batch shape). ")
            + (("vLLM warned in its log: " + " / ".join(f"*{w}*" for w in vllm_log_warnings[:3]))
               if vllm_log_warnings else ""))
    else:
        vllm_summary = ui.md(f"vLLM's n-gram speculative decoding could not be measured here: "
                             f"{vllm_spec_error}.")
    vllm_summary
    return


@app.cell
def _(mini_rows, sd, vllm_rows):
    sd.workload_figure(mini_rows + vllm_rows)
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## 5. What the real engines do

    | engine | how to turn it on | drafters |
    |---|---|---|
    | vLLM | `--speculative-config '{"method": ..., "num_speculative_tokens": k, ...}'` | `ngram` (prompt lookup, `prompt_lookup_max/min`), `draft_model` (a smaller model of the same tokenizer, `"model": ...`), `eagle` / `eagle3` (a small head trained on the target's hidden states), `mtp` (a model's own multi-token-prediction layers, e.g. DeepSeek-V3), `medusa`, `mlp_speculator`, `suffix` (suffix-tree lookup) and others |
    | SGLang | `--speculative-algorithm EAGLE` / `EAGLE3` / `STANDALONE` / `NGRAM`, with `--speculative-draft-model-path`, `--speculative-num-steps`, `--speculative-eagle-topk`, `--speculative-num-draft-tokens` | EAGLE-2/3 (tree drafts), MTP, a standalone draft model, n-gram (CUDA only) |
    | this course's `mini_engine` | `--engine mini -- --spec ngram` or `--spec self --draft-layers L`, `--num-spec-tokens k` | prompt lookup; the model's first L layers |

    Sources: vLLM's method names are the `SpeculativeMethod` values in
    `vllm/config/speculative.py` as installed with this course (vLLM 0.32); SGLang's flags are
    from its speculative decoding documentation
    ([docs.sglang.io](https://docs.sglang.io/docs/advanced_features/speculative_decoding)).

    Three things the real engines add to this notebook's loop: **sampling** (with temperature >
    0 a draft token is accepted with probability min(1, p/q) and a rejection resamples from the
    residual distribution, which keeps the output distribution exactly the target's: Leviathan
    et al. section 2; our teaching engine speculates for greedy requests only); **trees** of
    drafts (EAGLE, SGLang's `eagle-topk`) verified in one pass with a tree attention mask, so one
    wrong token does not discard every alternative; and **batching**: the spare compute that
    makes verification nearly free at batch 1 on a GPU is spent on other requests at large
    batches, so engines speculate less, or not at all, under heavy load. Where a forward's time
    grows with its tokens, the verify pass is not free and only cheap, well-aimed drafts pay off:
    section 2's verify costs say how much it grew on this machine.
    """)
    return


if __name__ == "__main__":
    app.run()
