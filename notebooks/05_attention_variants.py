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
    app_title="5 · Attention variants: MHA, GQA, MQA, MLA and sliding windows",
)


@app.cell(hide_code=True)
def _():
    import marimo as mo

    return (mo,)


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    # 5 · Attention variants: MHA, GQA, MQA, MLA and sliding windows

    [![Open in Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/llm-inference-workshop/llm-inference-workshop/blob/main/notebooks/05_attention_variants.ipynb)
    [![Open in molab](https://marimo.io/molab-shield.svg)](https://molab.marimo.io/github/llm-inference-workshop/llm-inference-workshop/blob/main/notebooks/05_attention_variants.py)

    During decode every new token reads its conversation's whole KV cache, and the cache decides
    how many conversations fit in memory (notebook 2). The attention design decides how big that
    cache is. Four designs are in use:

    * **MHA** (multi-head attention, the original Transformer): every query head has its own
      key and value head.
    * **GQA** (grouped-query attention, Ainslie et al. 2023,
      [arXiv:2305.13245](https://arxiv.org/abs/2305.13245)): groups of query heads share one KV
      head. Llama 3, Mistral, Qwen2 and the course's SmolLM2 use it.
    * **MQA** (multi-query attention, Shazeer 2019,
      [arXiv:1911.02150](https://arxiv.org/abs/1911.02150)): all query heads share one KV head.
    * **MLA** (multi-head latent attention, DeepSeek-V2,
      [arXiv:2405.04434](https://arxiv.org/abs/2405.04434)): the cache holds one compressed
      vector per layer and token, from which keys and values for every head are rebuilt.

    A **sliding window** is a separate idea: some or all layers only look at the last W tokens,
    so their cache stops growing.

    This notebook (1) computes the cache per token of real models under each design, and why
    DeepSeek's MLA looks huge against MHA and modest against GQA; (2) serves the course's model
    **live** as GQA (as shipped), MQA and MLA, checking each server's cache size against the
    formula, and what each costs in quality; (3) times decode attention on this machine as the
    number of KV heads changes; (4) works out what a sliding window does to capacity.
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
    return (workshop,)


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## 1. What each design caches, for real models

    Per layer and token, a GQA layer caches a key and a value for each of its KV heads; MHA and
    MQA are the two ends of the same formula (KV heads = query heads, or 1). MLA caches a latent
    of `kv_lora_rank` numbers plus one shared positional (RoPE) key of `qk_rope_head_dim`
    numbers, with no factor 2: keys and values are both rebuilt from the latent. The code below
    is `reference_server/kv.py`, the one formula the course's server also reports with:
    """)
    return


@app.cell
def _():
    import inspect

    from reference_server import kv as kv_formula

    print(inspect.getsource(kv_formula.kv_values_per_token_per_layer))
    print(inspect.getsource(kv_formula.kv_bytes_per_token))
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    **Exercise 1 (predict, then compute).** DeepSeek-V3 (MLA) has 61 layers and caches a latent
    of 512 numbers plus a RoPE key of 64 per layer and token; Llama 3.1 70B (GQA) has 80 layers
    with 8 KV heads of 128. How many times more cache per token does Llama 3.1 70B need than
    DeepSeek-V3?
    """)
    return


@app.cell
def _():
    predict_70b_over_dsv3 = None    # your prediction, e.g. 10
    return (predict_70b_over_dsv3,)


@app.cell(hide_code=True)
def _():
    from workshop.ui import reveal_button as _reveal_button

    reveal_exercise_1 = _reveal_button("Compute")
    reveal_exercise_1
    return (reveal_exercise_1,)


@app.cell
def _(mo, predict_70b_over_dsv3, reveal_exercise_1):
    mo.stop(not reveal_exercise_1.value,
            mo.md("_Write your prediction for Exercise 1, then press **Compute** under it._"))
    from workshop.compute import attention_variants as av
    from workshop import ui
    from workshop.sizing import kvcache

    dsv3 = kvcache.load_model("deepseek-v3")
    llama70 = kvcache.load_model("llama-3.1-70b")
    exercise_70b_over_dsv3 = (kvcache.kv_bytes_per_token(llama70, "bf16")
                              / kvcache.kv_bytes_per_token(dsv3, "bf16"))
    ui.compare(predict_70b_over_dsv3, exercise_70b_over_dsv3,
               f"{llama70.name} cache per token / {dsv3.name}'s", "x", how="computed")
    return av, dsv3, exercise_70b_over_dsv3, kvcache, llama70, ui


@app.cell
def _(
    dsv3,
    exercise_70b_over_dsv3,
    kvcache,
    llama70,
    mo,
    reveal_exercise_1,
    ui,
):
    # Worked answer to Exercise 1, collapsed until opened
    mo.stop(not reveal_exercise_1.value)
    _gqa_layer = kvcache.kv_values_per_token_per_layer(llama70)
    _mla_layer = kvcache.kv_values_per_token_per_layer(dsv3)
    ui.worked_answer(
        f"Per layer and token, GQA caches a key and a value per KV head: 2 x "
        f"{llama70.num_kv_heads} x {llama70.head_dim} = **{_gqa_layer:,}** numbers. MLA caches the "
        f"latent and the RoPE key, with no factor 2 (keys and values are both rebuilt from the "
        f"latent): {dsv3.kv_lora_rank} + {dsv3.qk_rope_head_dim} = **{_mla_layer:,}**. Per layer "
        f"that is {_gqa_layer / _mla_layer:.2f}x; the layers multiply it by {llama70.num_layers} / "
        f"{dsv3.num_layers} = {llama70.num_layers / dsv3.num_layers:.2f}: "
        f"**{_gqa_layer / _mla_layer * llama70.num_layers / dsv3.num_layers:.2f}x** in all (the "
        f"bytes per number, 2 in bf16, cancel). The formula above, on the two configs, gives "
        f"{exercise_70b_over_dsv3:.2f}x: the same count."
    )
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    Each shipped config (`workshop/data/models/`, copied from the model's published
    `config.json`, link in the table) is then re-counted as if it used each design, keeping its
    layers, heads and head size: "as shipped" is what the model really caches.
    """)
    return


@app.cell
def _(av, kvcache, ui):
    def variant_bytes(arch):
        """KV bytes per token (bf16) of one model under each design."""
        per_token = kvcache.kv_bytes_per_token
        return {"MHA (KV heads = query heads)": per_token(av.variant_arch(arch, "mha"), "bf16"),
                "as shipped": per_token(arch, "bf16"),
                "MQA (1 KV head)": per_token(av.variant_arch(arch, "mqa"), "bf16")}


    catalogue = [kvcache.load_model(_k) for _k in kvcache.list_models()]
    ui.table([{**av.config_columns(_a), **{k: round(v) for k, v in variant_bytes(_a).items()}}
              for _a in catalogue])
    return catalogue, variant_bytes


@app.cell
def _(av, catalogue, variant_bytes):
    av.bytes_figure([{"model": _a.name, **variant_bytes(_a)} for _a in catalogue])
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ### DeepSeek's MLA: against MHA, and against GQA

    The DeepSeek-V2 paper reports that MLA cut the KV cache by 93.3% against DeepSeek 67B (a
    dense model of theirs) and that its cache equals GQA with only 2.25 groups (abstract and
    table 1 of [arXiv:2405.04434](https://arxiv.org/abs/2405.04434)). Which baseline a saving is
    measured against matters a lot. Pick the GQA model to compare DeepSeek-V3 with (in Jupyter,
    re-run the cells below after changing it; marimo re-runs them):
    """)
    return


@app.cell
def _(kvcache, ui):
    gqa_choice = ui.dropdown([k for k in kvcache.list_models()
                              if kvcache.load_model(k).attention != "mla"], "llama-3.1-70b",
                             "GQA model to compare DeepSeek-V3 with")
    gqa_choice
    return (gqa_choice,)


@app.cell
def _(av, dsv3, gqa_choice, kvcache, ui):
    gqa_model = kvcache.load_model(gqa_choice.value)
    mla_bytes = kvcache.kv_bytes_per_token(dsv3, "bf16")      # the formula, on the catalogue's config
    # By hand, from the papers rather than the config file: MLA caches d_c + d_h^R = 4 d_h + d_h / 2
    # = 9/2 d_h numbers per layer (DeepSeek-V2, table 1); DeepSeek-V3 has d_h = 128 and 61 layers
    # (arXiv:2412.19437, section 4.2); 2 bytes each in bf16.
    mla_bytes_by_hand = 9 / 2 * 128 * 61 * 2
    mha_equivalent = kvcache.kv_bytes_per_token(av.variant_arch(dsv3, "mha"), "bf16")
    gqa_bytes = kvcache.kv_bytes_per_token(gqa_model, "bf16")
    _mha_wide = (dsv3.num_layers * dsv3.num_heads
                 * (dsv3.head_dim + dsv3.qk_rope_head_dim + dsv3.head_dim) * 2)
    ui.table([{"cache per token, bf16": _what, "bytes": round(_bytes),
               "x DeepSeek-V3's MLA": _bytes / mla_bytes} for _what, _bytes in [
        ("DeepSeek-V3, MLA: the formula on the catalogue's config", mla_bytes),
        ("DeepSeek-V3, MLA: by hand from the papers (9/2 x 128 numbers, 61 layers, 2 bytes)",
         mla_bytes_by_hand),
        (f"DeepSeek-V3 as MHA with the same heads ({dsv3.num_heads} x {dsv3.head_dim}, keys and "
         "values)", mha_equivalent),
        (f"DeepSeek-V3 as MHA with its real widths (keys {dsv3.head_dim} + "
         f"{dsv3.qk_rope_head_dim}, values {dsv3.head_dim})", _mha_wide),
        (f"{gqa_model.name}, GQA ({gqa_model.num_kv_heads} KV heads x {gqa_model.head_dim}, "
         f"{gqa_model.num_layers} layers)", gqa_bytes)]], floatfmt=".1f")
    return gqa_bytes, gqa_model, mha_equivalent, mla_bytes, mla_bytes_by_hand


@app.cell
def _(
    av,
    dsv3,
    gqa_bytes,
    gqa_model,
    mha_equivalent,
    mla_bytes,
    mla_bytes_by_hand,
    ui,
):
    ui.md(
        f"**Against MHA with its own heads** DeepSeek-V3's MLA caches "
        f"**{mha_equivalent / mla_bytes:.1f}x** less. This is where figures of about 57x come from. "
        f"**Against a GQA model** ({gqa_model.name}, {gqa_model.num_kv_heads} KV heads x "
        f"{gqa_model.head_dim}, {gqa_model.num_layers} layers) the GQA model caches "
        f"**{gqa_bytes / mla_bytes:.1f}x** DeepSeek-V3's. Quote a saving with its baseline. In GQA "
        f"terms the latent caches as much as **{av.equivalent_kv_heads(dsv3):.2f} KV heads** of "
        f"{dsv3.head_dim}: the paper's \"2.25 groups\", recomputed from the config. The formula on "
        f"the config and the count from the papers "
        f"**{'agree' if mla_bytes == mla_bytes_by_hand else 'differ (check the config)'}**."
    )
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## 2. Live: one model served as GQA, MQA and MLA

    The teaching engine can convert the course's model (SmolLM2-135M: 9 query heads share 3 KV
    heads of 64, 30 layers) at load time:

    * `--attention gqa`: as shipped;
    * `--attention mqa`: the 3 KV heads' projection weights averaged into 1, the conversion the
      GQA paper starts from (it then *retrains* briefly; we do not, so expect a quality drop);
    * `--attention mla --mla-rank R`: the stacked key and value projections factored by SVD
      into a rank-R "down" matrix (its output, R numbers, is all that is cached) and an "up"
      matrix that rebuilds keys and values at every step. Unlike DeepSeek's MLA it keeps no
      separate RoPE key (RoPE is applied after rebuilding) and was never trained for, so again
      quality can only drop. At R = 384 = 2 x 3 x 64 the factorisation is exact.

    Each variant is its own server (`workshop.session.start`), started, measured and stopped in
    turn. The formula predicts its cache size from the config alone; the server reports what it
    allocated (its pool's bytes / its token slots): two independent numbers.

    Which MLA ranks to serve (a server start each, several seconds; quick mode serves one)? Rank
    128 caches as much as MQA (2 x 64 numbers per layer), side by side at equal memory; rank 384
    as much as GQA.
    """)
    return


@app.cell
def _(ui):
    from workshop.session import sweep

    mla_ranks_text = ui.text(sweep("64, 128, 192, 256, 320, 384", "256"), "MLA ranks (comma-separated)")
    mla_ranks_text
    return mla_ranks_text, sweep


@app.cell
def _(kvcache, mla_ranks_text, ui):
    mla_ranks = sorted({int(_r) for _r in mla_ranks_text.value.split(",") if _r.strip()}) or [256]
    exercise_rank = 256 if 256 in mla_ranks else mla_ranks[-1]      # the rank exercise 2 asks about
    live_variants = [("gqa", 0), ("mqa", 0)] + [("mla", _r) for _r in mla_ranks]
    smol = kvcache.load_model("smollm2-135m")
    _names = ", ".join(a + (f" r={r}" if r else "") for a, r in live_variants)
    ui.md(f"Variants to serve: {_names}. "
          f"SmolLM2 caches {kvcache.kv_values_per_token_per_layer(smol)} numbers per layer and "
          f"token as shipped. Exercise 2 asks about **MLA rank {exercise_rank}**.")
    return exercise_rank, live_variants, smol


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    **Exercise 2 (predict, then measure).** The servers below keep their cache in bf16 (2 bytes)
    on GPUs and on CPUs that compute in bf16, in fp32 (4 bytes) on other CPUs. What will the MLA
    server of the rank printed above report as its KV bytes per token? (SmolLM2 has 30 layers;
    this MLA caches the latent and nothing else.)
    """)
    return


@app.cell
def _():
    predict_mla_bytes = None    # your prediction in bytes, e.g. 10000
    return (predict_mla_bytes,)


@app.cell(hide_code=True)
def _():
    from workshop.ui import reveal_button as _reveal_button

    reveal_exercise_2 = _reveal_button("Measure")
    reveal_exercise_2
    return (reveal_exercise_2,)


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    Quality. A perplexity needs the probability of every token of a given text: the server must
    score the prompt (vLLM's `prompt_logprobs`, or `echo` with `logprobs` in the legacy
    completions API). The teaching engine refuses both (the next cell shows its answer), but it
    gives its greedy next token after any prefix exactly, so we measure:

    * **next-token accuracy**: over the positions of a held-out ShareGPT reply, the share where
      the greedy token is the text's actual next token (teacher forcing: every prefix is the true
      text, so one mistake does not derail the rest). Like perplexity it scores the model
      against real text; unlike perplexity it ignores how confident the model was;
    * **agreement with GQA**: at the same positions, the share where the variant picks the
      shipped model's token;
    * **greedy answers**: the share of the GQA server's greedy answer tokens to a few chat
      questions that the variant reproduces at the same place (one divergence shifts the rest:
      the harsh, user-visible measure).
    """)
    return


@app.cell
def _(av, live_variants, mo, reveal_exercise_2, sweep, ui, workshop):
    mo.stop(not reveal_exercise_2.value,
            mo.md("_Write your prediction for Exercise 2, then press **Measure** under it._"))
    from transformers import AutoTokenizer

    from workshop.precision import model_quality

    kv_pool_gib = 1                         # each server's KV pool (the server's --kv-cache-gib)
    n_positions = sweep(128, 16)            # teacher-forced positions of the held-out text
    questions = model_quality.QUESTIONS[:sweep(6, 2)]
    answer_tokens = sweep(32, 8)
    heldout_text = model_quality.heldout_texts(1)[0]

    live_results = []                       # one dict per served variant, GQA first
    echo_refusal = ""
    for _attention, _rank in ui.progress(live_variants, title="variant servers"):
        _knobs = ["--attention", _attention] + (["--mla-rank", str(_rank)] if _rank else [])
        with workshop.session.start("mini", ["--kv-cache-gib", str(kv_pool_gib), "--", *_knobs],
                                    verbose=False) as _srv:
            if not live_results:
                # The tokenizer the servers use, from the model folder they loaded.
                _tok = AutoTokenizer.from_pretrained(_srv.info["model_path"])
                heldout_ids = _tok(heldout_text)["input_ids"]
                heldout_positions = list(range(8, min(8 + n_positions, len(heldout_ids))))
                heldout_targets = [_tok.decode([heldout_ids[_p]]) for _p in heldout_positions]
                with _srv.http() as _http:
                    _r = _http.post(f"{_srv.v1}/completions", json={
                        "model": _srv.model, "prompt": "Hello", "max_tokens": 1, "echo": True,
                        "logprobs": 1})
                echo_refusal = f"HTTP {_r.status_code}: {_r.json().get('error', _r.json())}"
            live_results.append({
                "attention": _attention, "rank": _rank, "info": _srv.info,
                "next": av.next_tokens(_srv, heldout_ids, heldout_positions),
                "answers": av.greedy_tokens(_srv, questions, answer_tokens)})
    ui.md(f"Asking the teaching engine to score a prompt (`echo` with `logprobs`): `{echo_refusal}`")
    return (
        answer_tokens,
        heldout_positions,
        heldout_targets,
        kv_pool_gib,
        live_results,
        questions,
    )


@app.cell
def _(
    exercise_rank,
    live_results,
    mo,
    predict_mla_bytes,
    reveal_exercise_2,
    ui,
):
    mo.stop(not reveal_exercise_2.value,
            mo.md("_Write your prediction for Exercise 2, then press **Measure** under it._"))
    exercise_mla_info = next(r["info"] for r in live_results
                             if r["attention"] == "mla" and r["rank"] == exercise_rank)
    ui.compare(predict_mla_bytes, exercise_mla_info["kv_bytes_per_token"],
               f"KV bytes per token reported by the MLA rank-{exercise_rank} server", "bytes")
    return (exercise_mla_info,)


@app.cell
def _(
    exercise_mla_info,
    exercise_rank,
    kvcache,
    mo,
    reveal_exercise_2,
    smol,
    ui,
):
    # Worked answer to Exercise 2, collapsed until opened
    mo.stop(not reveal_exercise_2.value)
    from reference_server import dtypes

    _dtype = exercise_mla_info["dtype"]
    _bytes_each = dtypes.bytes_per_element(_dtype, smol.torch_dtype)
    _forecast = smol.num_layers * exercise_rank * _bytes_each
    _reported = exercise_mla_info["kv_bytes_per_token"]
    ui.worked_answer(
        f"MLA caches one latent of R numbers per layer and token, with no factor 2: keys and values "
        f"are both rebuilt from it. So {smol.num_layers} layers x {exercise_rank} numbers = "
        f"{smol.num_layers * exercise_rank:,} numbers per token. This server reports dtype "
        f"`{_dtype}`, {_bytes_each:g} bytes a number: **{_forecast:,.0f} bytes**. (MQA, 1 KV head of "
        f"{smol.head_dim}, caches 2 x {smol.head_dim} = {2 * smol.head_dim} numbers per layer; GQA "
        f"as shipped {kvcache.kv_values_per_token_per_layer(smol)}.) Reported, counted by the server "
        f"from the pool it allocated: **{_reported:,}**, {_reported / _forecast:.2f} x the forecast "
        f"(the table below checks every variant)."
    )
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    The table puts each server's own report next to the formula's prediction from the config
    (the variant's architecture, `av.variant_arch`, counted by `reference_server/kv.py` at the
    dtype the server says it uses), and the capacity its KV pool (1 GiB) should then hold in
    whole blocks:
    """)
    return


@app.cell
def _(av, heldout_targets, kv_pool_gib, kvcache, live_results, smol, ui):
    live_rows = []
    _ref = live_results[0]
    for _res in live_results:
        _info = _res["info"]
        _arch = av.variant_arch(smol, _res["attention"], _res["rank"])
        _predicted = kvcache.kv_bytes_per_token(_arch, _info["dtype"])
        live_rows.append({
            "variant": _res["attention"] + (f" r={_res['rank']}" if _res["rank"] else ""),
            "dtype": _info["dtype"],
            "KV B/token predicted": round(_predicted),
            "KV B/token reported": _info["kv_bytes_per_token"],
            "capacity predicted (tokens)": kvcache.engine_capacity_tokens(
                kv_pool_gib * 2**30, _predicted, _info["block_size"]),
            "capacity reported (tokens)": _info["kv_capacity_tokens"],
            "next-token accuracy": av.match_share(_res["next"], heldout_targets),
            "agreement with GQA": av.match_share(_res["next"], _ref["next"]),
            "greedy answer tokens as GQA": av.greedy_token_share(_ref["answers"], _res["answers"]),
        })
    ui.table(live_rows)
    return (live_rows,)


@app.cell
def _(answer_tokens, heldout_positions, live_rows, questions, ui):
    live_checks_agree = all(r["KV B/token predicted"] == r["KV B/token reported"]
                            and r["capacity predicted (tokens)"] == r["capacity reported (tokens)"]
                            for r in live_rows)
    _verdict = ("every server allocated exactly the bytes per token and the capacity the formula "
                "predicts" if live_checks_agree else "at least one server disagrees with the formula "
                "(see the table): check its dtype and `/server_info` before trusting either number")
    ui.md(f"Prediction vs report: **{_verdict}.** Held-out text: {len(heldout_positions)} positions "
          f"of one ShareGPT reply; {len(questions)} chat questions of up to {answer_tokens} tokens.")
    return (live_checks_agree,)


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    What those shares look like: each server's greedy answer to the first question.
    """)
    return


@app.cell
def _(live_results, live_rows, questions, ui):
    ui.table([{"variant": _row["variant"],
               f"answer to: {questions[0]}":
                   "".join(_res["answers"][0]).replace("<|im_end|>", " [end]")
                   .replace("\n", " ").replace("|", "/")}
              for _row, _res in zip(live_rows, live_results)])
    return


@app.cell
def _(av, live_rows):
    av.quality_figure(live_rows, "KV B/token reported",
                      ["next-token accuracy", "agreement with GQA", "greedy answer tokens as GQA"])
    return


@app.cell
def _(live_rows, ui):
    gqa_row, mqa_row = live_rows[0], next(r for r in live_rows if r["variant"] == "mqa")
    _B = "KV B/token reported"
    _lines = [f"* **{_r['variant']}** caches {gqa_row[_B] / _r[_B]:.2g}x less than GQA ({_r[_B]:,} "
              f"bytes per token); untrained, its next-token accuracy is "
              f"{_r['next-token accuracy']:.0%} (GQA {gqa_row['next-token accuracy']:.0%}) and it "
              f"picked GQA's token at {_r['agreement with GQA']:.0%} of the positions."
              for _r in live_rows[1:]]
    _twin = next((r for r in live_rows if r["variant"].startswith("mla") and r[_B] == mqa_row[_B]),
                 None)
    if _twin:
        _lines.append(
            f"* At the **same cache size** ({_twin[_B]:,} bytes per token) {_twin['variant']} agreed "
            f"with GQA at {_twin['agreement with GQA']:.0%} of positions and MQA at "
            f"{mqa_row['agreement with GQA']:.0%}. An SVD keeps the directions of the keys and values "
            f"that matter most; averaging heads throws away whatever the heads did not share.")
    _lines.append(
        "* Both conversions here are untrained. The GQA paper converts checkpoints the same way, "
        "then \"uptrains\" them with about 5% of the original pre-training compute, which it reports "
        "brings GQA close to multi-head quality ([arXiv:2305.13245](https://arxiv.org/abs/2305.13245));"
        " DeepSeek trains with MLA from the start. So the quality columns are the cost of a "
        "conversion without training; the bytes columns are what each design saves, either way.")
    ui.md("\n".join(_lines))
    return gqa_row, mqa_row


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## 3. Decode attention time vs the number of KV heads

    At decode, each new token's queries are compared with every cached key and weigh every
    cached value: attention reads the whole cache and does little arithmetic on each number
    read (2 multiply-adds per number per query head sharing it). If reading is what limits it,
    fewer KV heads should mean proportionally less time. Here is one decode step written out,
    with the query heads of a group reading their shared KV head together:
    """)
    return


@app.cell
def _():
    import math

    import torch


    def decode_attention(q, k, v):
        """q [B, Hq, d] (one new token per user) against the cache k, v [B, Hkv, C, d]."""
        b, hq, d = q.shape
        hkv = k.shape[1]
        qg = q.view(b, hkv, hq // hkv, d)                     # the query heads sharing each KV head
        scores = qg @ k.transpose(-1, -2) / math.sqrt(d)      # [B, Hkv, group, C]
        return (scores.softmax(-1) @ v).reshape(b, hq, d)

    return (decode_attention,)


@app.cell
def _(av, decode_attention, ui):
    _q, _k, _v = av.decode_inputs(batch=2, q_heads=9, kv_heads=3, context=100, head_dim=64)
    decode_check_error = (decode_attention(_q, _k, _v)
                          - av.reference_decode(_q, _k, _v)).abs().max().item()
    ui.md(f"Max abs difference from PyTorch SDPA with the KV heads copied to every query head: "
          f"{decode_check_error:.1e} (fp32).")
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    SmolLM2's shape: 9 query heads of 64, with 9 (MHA), 3 (GQA, as shipped) or 1 (MQA) KV heads,
    one user, one layer, fp32, each timing the best of 10 after a warm-up
    (`workshop.timing.best_time_s`), on **one** CPU thread: with several, any thread that
    other work on the machine preempts stalls the rest, and on a shared machine the timings
    then measure the load rather than the cache.

    **Exercise 3 (predict, then measure).** At the longest context printed below, how many times
    longer does a decode step take with 9 KV heads than with 1? (The cache it reads is 9x larger.)
    """)
    return


@app.cell
def _(sweep, ui):
    attn_contexts = sweep([1024, 4096, 16384, 65536], [2048, 32768])
    ui.md(f"Contexts timed: {', '.join(f'{_c:,}' for _c in attn_contexts)} tokens.")
    return (attn_contexts,)


@app.cell
def _():
    predict_time_ratio = None    # your prediction, e.g. 5
    return (predict_time_ratio,)


@app.cell(hide_code=True)
def _():
    from workshop.ui import reveal_button as _reveal_button

    reveal_exercise_3 = _reveal_button("Measure")
    reveal_exercise_3
    return (reveal_exercise_3,)


@app.cell
def _(
    attn_contexts,
    av,
    decode_attention,
    mo,
    predict_time_ratio,
    reveal_exercise_3,
    ui,
):
    mo.stop(not reveal_exercise_3.value,
            mo.md("_Write your prediction for Exercise 3, then press **Measure** under it._"))
    attn_rows = av.attention_time_rows(decode_attention, kv_heads=[1, 3, 9], contexts=attn_contexts,
                                       q_heads=9, head_dim=64, progress=ui.progress)
    attn_long_rows = [r for r in attn_rows if r["context"] == max(attn_contexts)]
    attn_ratio_long = attn_long_rows[-1]["time (ms)"] / attn_long_rows[0]["time (ms)"]
    ui.compare(predict_time_ratio, attn_ratio_long,
               f"time with 9 KV heads / 1 KV head at context {max(attn_contexts):,}", "x")
    return attn_long_rows, attn_ratio_long, attn_rows


@app.cell
def _(
    attn_contexts,
    attn_long_rows,
    attn_ratio_long,
    av,
    mo,
    reveal_exercise_3,
    ui,
):
    # Worked answer to Exercise 3, collapsed until opened
    mo.stop(not reveal_exercise_3.value)
    from workshop.compute import flash_attention as fa

    _one, _nine = attn_long_rows[0], attn_long_rows[-1]
    _bytes_ratio = _nine["KV read (MiB)"] / _one["KV read (MiB)"]
    _fit = av.cache_fit([_one["KV read (MiB)"], _nine["KV read (MiB)"]], fa.cpu_caches())
    _where = (f"This CPU's largest cache, {_fit['cache']}, holds {_fit['MiB']:.0f} MiB: the 1-head "
              f"cache {'fits' if _fit['fits'][0] else 'does not fit'}, the 9-head cache "
              f"{'fits' if _fit['fits'][1] else 'does not'}." if _fit else
              "This machine's cache sizes are not readable.")
    ui.worked_answer(
        f"Every query head scores every cached token whatever the number of KV heads: 9 x "
        f"{max(attn_contexts):,} x 64 multiply-adds for the scores and as many for the values, the "
        f"same arithmetic for 1 KV head or 9. What changes is the bytes read: "
        f"{_nine['KV read (MiB)']:.0f} MiB against {_one['KV read (MiB)']:.0f} MiB, "
        f"**{_bytes_ratio:.0f}x**. If reading the cache sets the time, the forecast is "
        f"{_bytes_ratio:.0f}x; if arithmetic did, 1x. Measured: **{attn_ratio_long:.1f}x**. Time "
        f"is bytes / read rate, and the read rates were {_one['GB/s']:.1f} GB/s with 1 KV head and "
        f"{_nine['GB/s']:.1f} GB/s with 9, so the measurement is {_bytes_ratio:.0f} x "
        f"{_one['GB/s']:.1f} / {_nine['GB/s']:.1f} = {attn_ratio_long:.1f}x. {_where}"
    )
    return


@app.cell
def _(attn_rows, ui):
    ui.table(attn_rows)
    return


@app.cell
def _(attn_rows, av):
    av.time_figure(attn_rows, q_heads=9)
    return


@app.cell
def _(attn_contexts, attn_long_rows, attn_ratio_long, attn_rows, ui):
    _short = [r for r in attn_rows if r["context"] == min(attn_contexts)]
    attn_ratio_short = _short[-1]["time (ms)"] / _short[0]["time (ms)"]
    ui.md(
        f"**With 9 KV heads instead of 1 (9x the bytes), a decode step took {attn_ratio_long:.1f}x "
        f"as long at {max(attn_contexts):,} tokens and {attn_ratio_short:.1f}x at "
        f"{min(attn_contexts):,} tokens.** The effective read rate at the long context was "
        f"{min(r['GB/s'] for r in attn_long_rows):.1f} to {max(r['GB/s'] for r in attn_long_rows):.1f}"
        f" GB/s (notebook 3 measures this machine's memory bandwidth). A serving engine multiplies "
        f"this by layers and users: at batch 64 and 30 layers one step reads {64 * 30:,} such caches."
    )
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## 4. Sliding windows: capacity that stops growing

    A layer with a window of W tokens needs only the last W tokens' keys and values, so a
    user's cache in that layer stops growing at W. Mistral 7B v0.1 used a 4,096-token window on
    every layer (its `config.json` has `sliding_window: 4096`; v0.3, shipped here, dropped it);
    gpt-oss-120b alternates 128-token windows with full layers (18 of its 36 layers). Gemma 2
    and 3 mix local and global layers the same way. Pick a context and a KV budget:
    """)
    return


@app.cell
def _(ui):
    window_context = ui.slider(1024, 131072, 32768, 1024, "context per user (tokens)")
    window_context
    return (window_context,)


@app.cell
def _(ui):
    kv_budget_gib = ui.slider(1, 160, 40, 1, "KV-cache budget (GiB)")
    kv_budget_gib
    return (kv_budget_gib,)


@app.cell
def _(av, kv_budget_gib, kvcache, ui, window_context):
    mistral = kvcache.load_model("mistral-7b")
    mistral_window = av.with_window(mistral, 4096)          # v0.1 style: every layer, 4,096 tokens
    oss = kvcache.load_model("gpt-oss-120b")                # as shipped: 18 layers with 128 tokens
    oss_full = av.with_window(oss, 0, 0)
    _contexts = sorted({1024, 4096, 16384, 65536, 131072, window_context.value})
    _budget = kv_budget_gib.value * 2**30
    window_rows_mistral = av.window_rows(mistral, mistral_window, _contexts, _budget)
    window_rows_oss = av.window_rows(oss_full, oss, _contexts, _budget)
    ui.table([{"model": f"{mistral.name} + 4,096 window", **r} for r in window_rows_mistral]
             + [{"model": f"{oss.name} (as shipped)", **r} for r in window_rows_oss])
    return mistral, oss, window_rows_mistral, window_rows_oss


@app.cell
def _(av, mistral, oss, window_rows_mistral, window_rows_oss):
    av.window_figure({mistral.name: window_rows_mistral, oss.name: window_rows_oss},
                     {mistral.name: "4,096 window on every layer",
                      oss.name: (f"as shipped ({oss.num_sliding_layers} layers window "
                                 f"{oss.sliding_window})")})
    return


@app.cell
def _(
    kv_budget_gib,
    mistral,
    ui,
    window_context,
    window_rows_mistral,
    window_rows_oss,
):
    chosen_context = window_context.value
    mistral_at_context = next(r for r in window_rows_mistral if r["context (tokens)"] == chosen_context)
    _c, _m = chosen_context, mistral_at_context
    _o = next(r for r in window_rows_oss if r["context (tokens)"] == _c)
    ui.md(
        f"At {_c:,} tokens per user and a {kv_budget_gib.value} GiB KV budget: "
        f"{mistral.name} fits **{_m['users that fit, full']:,}** users with full attention and "
        f"**{_m['users that fit, window']:,}** with a 4,096-token window on every layer "
        f"({_m['saving (x)']:.1f}x); gpt-oss-120b's alternating layers give "
        f"{_o['saving (x)']:.2f}x ({_o['users that fit, full']:,} vs {_o['users that fit, window']:,} "
        f"users), never more than 2x, because half its layers still keep everything. Below the "
        f"window length a window saves nothing; the cost is that those layers cannot see "
        f"further back, which the model must be trained for."
    )
    return chosen_context, mistral_at_context


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## What to take away
    """)
    return


@app.cell
def _(
    attn_contexts,
    attn_ratio_long,
    chosen_context,
    gqa_bytes,
    gqa_model,
    gqa_row,
    live_checks_agree,
    mha_equivalent,
    mistral_at_context,
    mla_bytes,
    mqa_row,
    ui,
):
    ui.md(
        f"* The cache per token is layers x (numbers cached per layer) x bytes. MHA, GQA and MQA "
        f"change the number of KV heads; MLA replaces them by a latent. Against MHA with its own "
        f"heads DeepSeek-V3's MLA caches {mha_equivalent / mla_bytes:.0f}x less; against "
        f"{gqa_model.name}'s GQA {gqa_bytes / mla_bytes:.1f}x less. Quote savings with their "
        f"baseline.\n"
        f"* Live, the servers' own KV bytes per token and capacities "
        f"{'matched the formula exactly' if live_checks_agree else 'did NOT all match the formula'}; "
        f"MQA held {mqa_row['capacity reported (tokens)'] / gqa_row['capacity reported (tokens)']:.1f}x"
        f" as many tokens in the same 1 GiB, and its untrained conversion agreed with GQA's next "
        f"token at {mqa_row['agreement with GQA']:.0%} of positions.\n"
        f"* Decode attention with 9 KV heads took {attn_ratio_long:.1f}x the time of 1 KV head at "
        f"{max(attn_contexts):,} tokens on this machine.\n"
        f"* Sliding windows cap the per-user cache of the windowed layers: "
        f"{mistral_at_context['saving (x)']:.1f}x more users at {chosen_context:,} tokens for a "
        f"4,096 window on every layer."
    )
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## What the real engines do

    * **GQA and MQA need nothing special.** vLLM and SGLang read `num_key_value_heads` from the
      model's config, size the paged cache for that many KV heads, and their attention kernels
      (FlashAttention, FlashInfer, vLLM's CPU kernel, ...) let a group of query heads read the
      same KV head without copying it, as `decode_attention` above does. Converting a model
      from one to the other is a training question, not a serving one.
    * **MLA has its own kernels.** vLLM serves DeepSeek-V2/V3 with dedicated MLA attention
      backends (`FLASHMLA`, `CUTLASS_MLA`, `FLASHINFER_MLA`, `TRITON_MLA` and others on GPUs;
      `CPU_MLA` and `AMX_MLA` on CPUs), caching only the latent and the RoPE key per token. For
      decode they use the "data-movement friendly" form: the "up" projection of the keys is
      absorbed into the query (and that of the values into the output), so attention runs
      over the cached latents directly and per-head keys and values are never rebuilt; for
      prefill, where compute dominates, they rebuild them (the docstring of
      `vllm/model_executor/layers/attention/mla_attention.py` explains both). The teaching
      engine here always rebuilds, which is simpler and costs more arithmetic per step. SGLang
      has MLA backends too (FlashInfer MLA, FlashMLA, Triton and others, chosen with
      `--attention-backend`).
    * **Sliding windows** are honoured by both engines when the config declares them
      (`sliding_window`, `layer_types`). In vLLM, windowed layers get their own KV-cache group
      and blocks that fall out of the window are freed as a request advances
      (`SlidingWindowManager.remove_skipped_blocks` in
      `vllm/v1/core/single_type_kv_cache_manager.py`).
    * The **KV cache dtype** multiplies with all of this (`--kv-cache-dtype fp8` in vLLM halves
      every number above; notebook 4).

    Sources: the backend names are those in `vllm/v1/attention/backends/registry.py` and the
    files named above, as installed with this course (vLLM 0.32); SGLang's from its server
    arguments documentation.
    """)
    return


if __name__ == "__main__":
    app.run()
