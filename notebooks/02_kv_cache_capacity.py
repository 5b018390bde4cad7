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
    app_title="2 · KV-cache capacity: how many users fit, and what a token costs",
)


@app.cell(hide_code=True)
def _():
    import marimo as mo

    return (mo,)


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    # 2 · KV-cache capacity: how many users fit, and what a token costs

    [![Open in Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/llm-inference-workshop/llm-inference-workshop/blob/main/notebooks/02_kv_cache_capacity.ipynb)
    [![Open in molab](https://marimo.io/molab-shield.svg)](https://molab.marimo.io/github/llm-inference-workshop/llm-inference-workshop/blob/main/notebooks/02_kv_cache_capacity.py)

    Notebook 1 watched the KV cache fill up on a live server. This notebook turns that into
    arithmetic you can do for any model and GPU before renting one:

    1. **bytes per token** of six real models, from their `config.json` files;
    2. a **check against the live engine**: does the formula predict its block count exactly?
    3. a **capacity and cost calculator**: users that fit, best-case decode speed, cost per
       million tokens;
    4. the other direction, from a **time-per-output-token** target to batch, users and cost;
    5. the same from a **time-to-first-token** target to requests per second and cost.

    Online calculators often make two mistakes, avoided here: counting keys and values for every
    *attention* head (grouped-query attention stores them only for the fewer *KV* heads), and
    giving the cache the weights' precision (4-bit weights with a 16-bit cache is usual).
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
    return (session,)


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## 1. Bytes per token, from real configs

    For every token, every layer keeps what attention needs to look back at it; in standard and
    grouped-query attention (GQA), one key and one value vector per KV head:

    $$\text{bytes per token} = 2 \times \text{layers} \times \text{KV heads} \times \text{head dim} \times \text{bytes per number}$$

    Two newer designs change the formula:

    * **Multi-head latent attention** (MLA, DeepSeek-V2/V3) caches per layer and token one
      compressed vector (`kv_lora_rank`) and a shared positional key (`qk_rope_head_dim`):
      $\text{layers} \times (\text{kv\_lora\_rank} + \text{qk\_rope\_head\_dim}) \times \text{bytes}$
      ([DeepSeek-V2 paper](https://arxiv.org/abs/2405.04434), section 2.1).
    * **Sliding-window layers** (gpt-oss alternates them with full layers) keep only the last
      `sliding_window` tokens, so past that length they stop growing.

    Configs: `workshop/data/models/`, copied from the linked `config.json` files. "Naive" counts
    every attention head at the weights' precision: the mistake to avoid.
    """)
    return


@app.cell
def _():
    from workshop import ui
    from workshop.compute import roofline
    from workshop.sizing import capacity, capacity_plots, kvcache

    model_table = capacity_plots.model_rows(context=32_768)
    ui.table(model_table)
    return capacity, capacity_plots, kvcache, roofline, ui


@app.cell
def _(kvcache, ui):
    _llama = kvcache.load_model("llama-3.1-8b")
    _dsv3 = kvcache.load_model("deepseek-v3")
    _oss = kvcache.load_model("gpt-oss-120b")
    _oss_ctx = 32_768
    ui.md(
        f"Llama 3.1 8B has {_llama.num_heads} attention heads but only {_llama.num_kv_heads} KV "
        f"heads: counting all heads overstates its cache "
        f"{kvcache.naive_kv_bytes_per_token(_llama) / kvcache.kv_bytes_per_token(_llama):.0f}x. "
        f"DeepSeek-V3's config says `num_key_value_heads = {_dsv3.num_kv_heads}`, yet with MLA it "
        f"caches {kvcache.kv_bytes_per_token(_dsv3):,.0f} bytes per token, "
        f"{kvcache.naive_kv_bytes_per_token(_dsv3) / kvcache.kv_bytes_per_token(_dsv3):.0f}x less than "
        f"per-head keys and values would need. gpt-oss-120b at {_oss_ctx:,} tokens averages "
        f"{kvcache.kv_bytes_per_sequence(_oss, _oss_ctx) / _oss_ctx:,.0f} bytes per token instead of "
        f"{kvcache.kv_bytes_per_token(_oss):,.0f}, because half of its layers keep only "
        f"{_oss.sliding_window} tokens."
    )
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## 2. Check the formula against the live engine

    vLLM takes a KV budget in bytes (CPU: `VLLM_CPU_KVCACHE_SPACE` or `--kv-cache-memory-bytes`;
    GPU: what `--gpu-memory-utilization` leaves after the weights), cuts it into **blocks** of
    `block_size` tokens and publishes both in `/metrics` (`vllm:cache_config_info`). The model's
    terms come from the `config.json` the server loaded, when it is on this machine.
    """)
    return


@app.cell
def _(kvcache, session, ui):
    import pathlib

    _path = pathlib.Path(str(session.info.get("model_path", "")))
    served_config = kvcache.served_model_config(str(session.info.get("model_path") or session.model),
                                                name=session.model)
    served_config_from = (f"`{_path / 'config.json'}`" if (_path / "config.json").exists() else
                          f"the shipped config ([source]({served_config.source}))")
    engine_cache = kvcache.engine_cache_config(session.metrics_text())
    check = kvcache.engine_check(served_config, engine_cache, session.info)
    ui.md(
        f"Our formula gives **{check['our_bytes_per_token']:,.0f} bytes per token** at cache dtype "
        f"`{check['cache_dtype']}`; the engine cuts its budget into blocks of "
        f"**{check['block_size']} tokens**"
        + (f" and was given **{check['kv_memory_bytes']:,} bytes** for the KV cache."
           if check.get("kv_memory_bytes") is not None else
           ", but does not publish the budget it was given (on a GPU: what is left after the "
           "weights), so the prediction below has nothing to start from here.")
    )
    return check, served_config_from


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    **Exercise 1 (predict, then measure).** From the three numbers above, how many blocks did the
    engine make? The cell after your prediction shows the engine's own count.
    """)
    return


@app.cell
def _():
    predict_engine_blocks = None   # your prediction: a number of blocks
    return (predict_engine_blocks,)


@app.cell(hide_code=True)
def _():
    from workshop.ui import reveal_button as _reveal_button

    reveal_exercise_1 = _reveal_button("Measure")
    reveal_exercise_1
    return (reveal_exercise_1,)


@app.cell
def _(check, mo, predict_engine_blocks, reveal_exercise_1, session, ui):
    mo.stop(not reveal_exercise_1.value,
            mo.md("_Write your prediction for Exercise 1, then press **Measure** under it._"))
    (ui.compare(predict_engine_blocks, check["engine_blocks"], "KV blocks the engine made", "blocks")
     if check["engine_blocks"] is not None else
     ui.md(f"This {session.engine_name} server publishes no block count (vLLM's "
           "`vllm:cache_config_info`): nothing to compare with."))
    return


@app.cell
def _(check, kvcache, mo, reveal_exercise_1, served_config_from, session, ui):
    # Worked answer to Exercise 1, collapsed until opened
    mo.stop(not reveal_exercise_1.value)
    _block_bytes = check["block_size"] * check["our_bytes_per_token"]
    if check.get("kv_memory_bytes") is not None:
        check_text = (
            f"One block holds {check['block_size']} tokens x {check['our_bytes_per_token']:,} bytes "
            f"= {_block_bytes:,} bytes (the bytes per token from {served_config_from}), so the "
            f"budget makes {check['kv_memory_bytes']:,} / {_block_bytes:,} = "
            f"{check['kv_memory_bytes'] / _block_bytes:,.2f}, rounded down **"
            f"{check['predicted_blocks']:,} blocks** ({check['predicted_capacity_tokens']:,} "
            f"tokens). The engine made **{check['engine_blocks']:,}**: "
            + ("they agree exactly, so the formula counts what the engine stores." if check["agrees"]
               else f"{check['engine_blocks'] - check['predicted_blocks']:+,} blocks: the engine "
               "stores something the formula does not count, or vice versa; investigate before "
               "trusting the calculator below.")
            + f" The server reports a capacity of {check['engine_capacity_tokens']:,} tokens.")
    elif check.get("engine_blocks") is not None:
        check_text = (
            f"This engine does not publish its KV byte budget, so there is nothing to predict "
            f"from. Its {check['engine_blocks']:,} blocks of {_block_bytes:,} bytes mean "
            f"{kvcache.human_bytes(check['implied_kv_memory_bytes'])} of KV cache by the formula.")
    else:
        check_text = (f"This {session.engine_name} server publishes no block count of its own "
                      "(vLLM's `vllm:cache_config_info`): nothing to check against.")
    ui.worked_answer(check_text)
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## 3. A capacity and cost calculator

    Pick a model, a GPU, the precision of the weights and of the KV cache, a context per user and
    a number of users (in Jupyter, re-run the cells below after changing them). Its assumptions:

    * the engine may use 90% of GPU memory (vLLM's default `--gpu-memory-utilization`): weights
      first, KV cache the rest; activations and fragmentation are ignored;
    * a decode step reads all weights once (mixture of experts: the shared part and every expert
      some user's token reached) plus every user's KV cache, makes one token per user, and takes
      at least *bytes / bandwidth* and *2 x active parameters x users / peak FLOP/s*: **bounds**,
      which notebook 3 measures against; cost per million tokens is therefore a **lower bound**
      (datasheet specs, indicative list prices: sources at the end).
    """)
    return


@app.cell
def _(kvcache, ui):
    calc_model = ui.dropdown(kvcache.list_models(), "llama-3.1-8b", "model")
    calc_model
    return (calc_model,)


@app.cell
def _(capacity, ui):
    gpu_catalogue = capacity.load_gpus()
    calc_gpu = ui.dropdown(list(gpu_catalogue), "L4", "GPU")
    calc_gpu
    return calc_gpu, gpu_catalogue


@app.cell
def _(ui):
    calc_weights = ui.dropdown(["bf16", "fp8", "int8", "int4", "mxfp4"], "int4", "weight precision")
    calc_weights
    return (calc_weights,)


@app.cell
def _(ui):
    calc_kv = ui.dropdown(["bf16", "fp8"], "bf16", "KV-cache precision")
    calc_kv
    return (calc_kv,)


@app.cell
def _(ui):
    calc_context = ui.slider(512, 131_072, 8192, 512, "context per user (tokens)")
    calc_context
    return (calc_context,)


@app.cell
def _(ui):
    calc_users = ui.slider(1, 256, 16, 1, "simultaneous users")
    calc_users
    return (calc_users,)


@app.cell
def _(ui):
    calc_num_gpus = ui.slider(1, 8, 1, 1, "GPUs (tensor parallel)")
    calc_num_gpus
    return (calc_num_gpus,)


@app.cell
def _(
    calc_context,
    calc_gpu,
    calc_kv,
    calc_model,
    calc_num_gpus,
    calc_users,
    calc_weights,
    capacity,
    gpu_catalogue,
    kvcache,
    ui,
):
    calc_cfg = kvcache.load_model(calc_model.value)
    # The deployment the controls describe, passed whole to every calculation below.
    calc_deployment = dict(weight_dtype=calc_weights.value, kv_dtype=calc_kv.value,
                           context=int(calc_context.value), num_gpus=int(calc_num_gpus.value))
    calc_plan = capacity.plan(calc_cfg, gpu_catalogue[calc_gpu.value], users=int(calc_users.value),
                              **calc_deployment)
    _p = calc_plan
    ui.md(
        f"**{_p.model}** on {_p.num_gpus} x {_p.gpu}, weights {_p.weight_dtype}, KV cache "
        f"{_p.kv_dtype}: the weights take {kvcache.human_bytes(_p.weight_bytes)}, one user at "
        f"{_p.context:,} tokens {kvcache.human_bytes(_p.kv_bytes_per_user)} of KV cache "
        f"({_p.kv_bytes_per_token:,.0f} bytes per token), and "
        f"{kvcache.human_bytes(max(_p.memory_for_kv, 0))} are left for the cache: "
        + (f"**{_p.users} users fit**" if _p.fits else f"**{_p.users} users do not fit**")
        + f" (at most {_p.max_users:,} users at this context, or {_p.max_context:,} tokens each "
        f"for {_p.users} users). "
        + (f"Decoding runs at best at {_p.decode_tok_s_per_user:,.1f} tokens/s per user, "
           f"{_p.decode_tok_s_total:,.0f} tokens/s in all ({_p.bound_by}-bound)"
           + (f", so a million output tokens cost at least **${_p.usd_per_million_tokens:,.3f}**."
              if _p.usd_per_million_tokens is not None else ".")
           if _p.fits else "")
    )
    return calc_cfg, calc_deployment, calc_plan


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    The same question for every GPU in the catalogue:
    """)
    return


@app.cell
def _(
    calc_cfg,
    calc_deployment,
    calc_users,
    capacity_plots,
    gpu_catalogue,
    ui,
):
    ui.table(capacity_plots.gpu_rows(calc_cfg, gpu_catalogue, users=int(calc_users.value),
                                     **calc_deployment))
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    How many users fit as the context grows, with a 16-bit cache, an 8-bit cache, and what the
    naive calculation would tell you:
    """)
    return


@app.cell
def _(
    calc_cfg,
    calc_gpu,
    calc_num_gpus,
    calc_weights,
    capacity_plots,
    gpu_catalogue,
):
    capacity_plot = capacity_plots.plot_users_vs_context(calc_cfg, gpu_catalogue[calc_gpu.value],
                                                         calc_weights.value, int(calc_num_gpus.value))
    capacity_plot
    return


@app.cell
def _(calc_cfg, calc_context, calc_kv, calc_plan, calc_weights, kvcache, ui):
    _room = max(calc_plan.memory_for_kv, 0)
    _ctx = int(calc_context.value)
    _gqa_only = calc_plan.kv_bytes_per_token
    _all_heads = _gqa_only * calc_cfg.num_heads / max(calc_cfg.num_kv_heads, 1) \
        if calc_cfg.attention == "gqa" else kvcache.naive_kv_bytes_per_token(calc_cfg, calc_kv.value)
    _weight_prec = _gqa_only * kvcache.WEIGHT_BYTES[calc_weights.value] / kvcache.KV_BYTES[calc_kv.value]
    _naive = kvcache.naive_kv_bytes_per_token(calc_cfg, calc_weights.value)
    # how far off each way of counting is, for the next cell's text
    mistake_factors = {"every head": _all_heads / _gqa_only, "both": _naive / _gqa_only}
    ui.table([{"how the cache is counted": _how, "bytes per token": round(_b),
               f"users that fit at {_ctx:,} tokens": int(_room // (_b * _ctx))}
              for _how, _b in (
                  (f"right: KV heads, {calc_kv.value} cache (sliding window averaged in)", _gqa_only),
                  ("mistake 1: every attention head", _all_heads),
                  (f"mistake 2: cache at the weight precision ({calc_weights.value})", _weight_prec),
                  ("both mistakes", _naive))])
    return (mistake_factors,)


@app.cell
def _(calc_plan, kvcache, mistake_factors, ui):
    mistakes_cancel = (abs(mistake_factors["both"] - 1) < 0.1
                       and abs(mistake_factors["every head"] - 1) >= 0.1)
    ui.md(
        f"At {calc_plan.users} users the decode step is **{calc_plan.bound_by}-bound** "
        f"({kvcache.human_bytes(calc_plan.step_bytes)} read per step). The weights are read once "
        f"per step for everybody, but each user's KV cache is read for that user alone: past some "
        f"batch size, more users stop amortising anything and only add bytes. "
        + (f"In the table, the two mistakes together land within "
           f"{abs(mistake_factors['both'] - 1):.0%} of the right figure although the first alone "
           f"is {mistake_factors['every head']:.1f}x off: they cancel, which is how a wrong "
           "calculator can look right on one example." if mistakes_cancel else
           f"In the table, both mistakes together give {mistake_factors['both']:.2f}x the right "
           "figure.")
    )
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## 4. The other direction: from a latency target to users and cost

    A service often starts from a promise instead: each user sees a new token at least every
    *TPOT* ms (time per output token). How many users can decode together, at what cost? A
    decode step makes one token per user, so the step time *is* the TPOT; with the assumptions
    above (the roofline, measured in notebook 3) a step for $B$ users takes at least

    $$\text{TPOT}(B) = \max\left(\frac{\text{weight bytes read} + B \times \text{KV bytes per user}}{\text{bandwidth}},\ \frac{B \times 2 \times \text{active parameters}}{\text{peak FLOP/s}}\right)$$

    The weights are read once per step whatever $B$; each extra user adds its own KV cache. For a
    dense model whose steps are memory-bound, solving $\text{TPOT}(B) \le \text{target}$ gives

    $$B_{\max} = \left\lfloor \frac{\text{target} \times \text{bandwidth} - \text{weight bytes}}{\text{KV bytes per user}} \right\rfloor$$

    The batch a deployment can serve is the smaller of $B_{\max}$ and the number of users whose
    KV cache fits in memory; it produces $B / \text{TPOT}$ tokens per second, so a million tokens
    cost $\text{price per hour} \times \text{GPUs} / (3600 \times B / \text{TPOT}) \times 10^6$.

    Section 3's controls apply; choose the target here (in Jupyter, re-run the cells below).
    """)
    return


@app.cell
def _(ui):
    slo_tpot_ms = ui.slider(5, 200, 50, 5, "TPOT target (ms per output token)")
    slo_tpot_ms
    return (slo_tpot_ms,)


@app.cell
def _(
    calc_cfg,
    calc_context,
    calc_deployment,
    calc_gpu,
    calc_kv,
    calc_num_gpus,
    calc_weights,
    capacity,
    gpu_catalogue,
    kvcache,
    slo_tpot_ms,
    ui,
):
    import inspect
    import math

    slo_gpu = gpu_catalogue[calc_gpu.value]
    slo_target_s = slo_tpot_ms.value / 1000
    # The closed form above, written out. For a mixture-of-experts model, one token reads only
    # its active parameters: the closed form is then the optimistic case of a batch of one.
    slo_bandwidth = slo_gpu.bandwidth_bytes_s * int(calc_num_gpus.value)
    slo_weight_bytes = calc_cfg.active_params * kvcache.WEIGHT_BYTES[calc_weights.value]
    slo_kv_per_user = kvcache.kv_bytes_per_sequence(calc_cfg, int(calc_context.value), calc_kv.value)
    slo_closed_form = max(math.floor((slo_target_s * slo_bandwidth - slo_weight_bytes)
                                     / slo_kv_per_user), 0)

    # The whole calculation: the compute bound too, the experts a batch touches, and memory.
    slo = capacity.latency_plan(calc_cfg, slo_gpu, slo_target_s, **calc_deployment)
    ui.table([{"": "closed form (memory-bound, active weights)", "batch": slo_closed_form},
              {"": "latency alone (full TPOT formula)", "batch": slo.max_batch_latency},
              {"": "KV-cache memory alone", "batch": slo.max_batch_memory},
              {"": f"served at {slo_tpot_ms.value} ms ({slo.limited_by})", "batch": slo.batch}])
    return (
        inspect,
        math,
        slo,
        slo_bandwidth,
        slo_closed_form,
        slo_gpu,
        slo_kv_per_user,
        slo_target_s,
        slo_weight_bytes,
    )


@app.cell
def _(
    calc_cfg,
    calc_deployment,
    calc_num_gpus,
    calc_plan,
    capacity,
    kvcache,
    slo,
    slo_closed_form,
    slo_gpu,
    slo_tpot_ms,
    ui,
):
    if slo.batch == 0:
        _one = capacity.decode_step(calc_cfg, slo_gpu, 1, **calc_deployment)
        _why = (f"The weights alone ({kvcache.human_bytes(calc_plan.weight_bytes)}) leave no room "
                "for a KV cache." if slo.max_batch_memory == 0 else
                f"One user alone already takes {_one.seconds * 1e3:.1f} ms per token.")
    elif slo.max_batch_latency == slo_closed_form:
        _why = "The full formula agrees with the closed form: these steps are memory-bound."
    elif slo.max_batch_latency < slo_closed_form and calc_cfg.num_experts:
        _why = (f"The full formula allows fewer users than the closed form: with "
                f"{slo.max_batch_latency:,} users in a step, their tokens are routed to more "
                f"of the {calc_cfg.num_experts} experts than one token is, so a step reads more "
                "than the active weights.")
    elif slo.step is not None and slo.step.bound_by == "compute":
        _why = "The full formula allows fewer users than the closed form: the step is compute-bound."
    else:
        _why = (f"The full formula allows {slo.max_batch_latency:,} users against the closed "
                f"form's {slo_closed_form:,}.")
    ui.md(
        f"At a {slo_tpot_ms.value} ms target, {calc_cfg.name} on {int(calc_num_gpus.value)} x "
        f"{slo_gpu.name} serves **{slo.batch:,} users at once** "
        f"({slo.users_per_gpu:,.1f} per GPU), limited by **{slo.limited_by}**. {_why}"
        + (f" At that batch a step takes {slo.tpot_s * 1e3:.1f} ms and reads "
           f"{kvcache.human_bytes(slo.step.bytes_read)}; the GPUs produce "
           f"{slo.tokens_per_s_total:,.0f} tokens/s, so a million tokens cost at least "
           f"**${slo.usd_per_million_tokens:,.3f}** at ${slo_gpu.price_usd_hour}/hour per GPU."
           if slo.step is not None and slo.usd_per_million_tokens is not None else "")
        + (f" Section 3's plan, {calc_plan.users} users, decodes at "
           f"{1000 / calc_plan.decode_tok_s_per_user:.1f} ms per token for "
           f"${calc_plan.usd_per_million_tokens:,.3f} per million tokens"
           + ("; a token served at the target costs "
              f"{slo.usd_per_million_tokens / calc_plan.usd_per_million_tokens:.2f}x as much."
              if slo.usd_per_million_tokens is not None else ".")
           if calc_plan.usd_per_million_tokens is not None else "")
    )
    return


@app.cell
def _(calc_cfg, calc_deployment, capacity_plots, slo_gpu, slo_target_s):
    slo_plot = capacity_plots.plot_tpot_vs_batch(calc_cfg, slo_gpu, slo_target_s, **calc_deployment)
    slo_plot
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    The same target on every GPU of the catalogue:
    """)
    return


@app.cell
def _(
    calc_cfg,
    calc_deployment,
    capacity_plots,
    gpu_catalogue,
    slo_target_s,
    ui,
):
    ui.table(capacity_plots.latency_rows(calc_cfg, gpu_catalogue, slo_target_s, **calc_deployment))
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    **Exercise 2 (predict, then compute).** Relax the promise: allow **twice** the TPOT target
    above, same model, GPU and context. How many users can decode together now?
    """)
    return


@app.cell
def _():
    my_batch_at_double_target = None    # your prediction: users, e.g. 100
    return (my_batch_at_double_target,)


@app.cell(hide_code=True)
def _():
    from workshop.ui import reveal_button as _reveal_button

    reveal_exercise_2 = _reveal_button("Compute")
    reveal_exercise_2
    return (reveal_exercise_2,)


@app.cell
def _(
    calc_cfg,
    calc_deployment,
    capacity,
    mo,
    my_batch_at_double_target,
    reveal_exercise_2,
    slo_gpu,
    slo_target_s,
    slo_tpot_ms,
    ui,
):
    mo.stop(not reveal_exercise_2.value,
            mo.md("_Write your prediction for Exercise 2, then press **Compute** under it._"))
    slo_double = capacity.latency_plan(calc_cfg, slo_gpu, 2 * slo_target_s, **calc_deployment)
    ui.compare(my_batch_at_double_target, slo_double.batch,
               f"largest batch at {2 * slo_tpot_ms.value} ms per token", "users", how="computed")
    return (slo_double,)


@app.cell
def _(
    calc_cfg,
    math,
    mo,
    reveal_exercise_2,
    slo_bandwidth,
    slo_closed_form,
    slo_double,
    slo_kv_per_user,
    slo_tpot_ms,
    slo_weight_bytes,
    ui,
):
    # Worked answer to Exercise 2, collapsed until opened
    # The closed form's two terms as times: the weights (any batch) and one user's KV cache.
    mo.stop(not reveal_exercise_2.value)
    _weights_ms = slo_weight_bytes / slo_bandwidth * 1e3
    _user_ms = slo_kv_per_user / slo_bandwidth * 1e3
    _double_ms = 2 * slo_tpot_ms.value
    _closed_double = max(math.floor((_double_ms - _weights_ms) / _user_ms), 0)
    if slo_double.limited_by == "KV-cache memory":
        _full_why = ": more users' KV caches do not fit, so a looser target adds none."
    elif slo_double.limited_by != "latency target":
        _full_why = "."
    elif slo_double.batch == _closed_double:
        _full_why = ", the same as the closed form."
    elif slo_double.step is not None and slo_double.step.bound_by == "compute":
        _full_why = ": its steps are compute-bound, slower than their bytes alone."
    elif calc_cfg.num_experts:
        _full_why = (f": a batch's tokens reach more of the {calc_cfg.num_experts} experts than "
                     "one token does, so a step reads more than the active weights.")
    else:
        _full_why = "."
    ui.worked_answer(
        f"A memory-bound step reads the weights once, {_weights_ms:.2f} ms whatever the batch, plus "
        f"{_user_ms:.3f} ms per user's KV cache. Within {_double_ms} ms that leaves "
        f"{max(_double_ms - _weights_ms, 0):.2f} ms for users: ⌊{max(_double_ms - _weights_ms, 0):.2f}"
        f" / {_user_ms:.3f}⌋ = **{_closed_double:,} users**, against {slo_closed_form:,} at "
        f"{slo_tpot_ms.value} ms"
        + (f": {_closed_double / slo_closed_form:.2f}x, more than twice, because doubling the step "
           "does not double the weights' time." if slo_closed_form and _weights_ms > 0 else ".")
        + f" The full calculation (compute bound, experts touched, memory) gives "
        f"**{slo_double.batch:,}**, limited by {slo_double.limited_by}{_full_why}"
    )
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## 5. From a time-to-first-token target to requests per second and cost

    The other promise: the first token within *TTFT* (time to first token). First the engine
    **prefills** the prompt; one pass over the weights serves all its tokens, so a prefill of a
    few hundred tokens is already compute-bound (notebook 3). A prompt of $L$ tokens costs

    $$F(L) = 2L \times \text{active parameters} + 2L^2 \times \text{layers} \times \text{heads} \times \text{head dim} - 2(L-1) \times \text{LM-head parameters}$$

    FLOPs: 2 per active weight per token, attention over the prompt (each token looks back at
    $L/2$ tokens on average), and the output layer only for the last token, whose logits give
    the first token. $N$ prompts prefilled together take at least

    $$\text{TTFT}(N) = \max\left(\frac{N \times F(L)}{\text{peak FLOP/s}},\ \frac{\text{weight bytes read} + N \times \text{KV bytes}(L)}{\text{bandwidth}}\right)$$

    (the weights are read once for all of them, each prompt's KV cache written once). When the
    compute term wins, solving $\text{TTFT}(N) \le \text{target}$ gives

    $$N_{\max} = \left\lfloor \frac{\text{target} \times \text{peak FLOP/s}}{F(L)} \right\rfloor$$

    That many prompts fit in one step when they **arrive together**. In a stream, a request
    arriving during a step waits for it, then for its own, so each step may take only **half**
    the target. Back to back, steps of $N'$ prompts (the largest within half the target) serve
    $N' / \text{TTFT}(N')$ requests per second; a million prompt tokens cost
    $\text{price per hour} \times \text{GPUs} / (3600 \times \text{requests/s} \times L) \times 10^6$.
    The GPUs here only prefill (decoding takes time of its own): the rate is an upper bound, the
    cost a lower bound. Section 3's controls apply; choose the target and prompt length here.
    """)
    return


@app.cell
def _(ui):
    slo_ttft_ms = ui.slider(50, 5000, 1000, 50, "TTFT target (ms to the first token)")
    slo_ttft_ms
    return (slo_ttft_ms,)


@app.cell
def _(ui):
    slo_prompt_len = ui.slider(128, 32_768, 2048, 128, "prompt length (tokens)")
    slo_prompt_len
    return (slo_prompt_len,)


@app.cell
def _(
    calc_cfg,
    calc_deployment,
    calc_num_gpus,
    capacity,
    math,
    roofline,
    slo_gpu,
    slo_prompt_len,
    slo_ttft_ms,
    ui,
):
    ttft_target_s = slo_ttft_ms.value / 1000
    ttft_prompt = int(slo_prompt_len.value)
    ttft_deployment = {k: v for k, v in calc_deployment.items() if k != "context"}
    # F(L) is roofline.prefill_flops (source below): a count of the work from the config, not a
    # measurement, and nothing here measures a GPU's FLOPs to check it against.
    ttft_flops_per_prompt = roofline.prefill_flops(calc_cfg, ttft_prompt)
    ttft_peak = slo_gpu.flops * int(calc_num_gpus.value)
    ttft_closed_form = math.floor(ttft_target_s * ttft_peak / ttft_flops_per_prompt)

    # The whole calculation: the memory term too, the experts a batch touches, KV memory, and
    # half the target for a stream.
    ttft = capacity.ttft_plan(calc_cfg, slo_gpu, ttft_target_s, prompt_len=ttft_prompt,
                              **ttft_deployment)
    ui.table([{"": "closed form (compute-bound)", "prompts": ttft_closed_form},
              {"": "latency alone (full TTFT formula)", "prompts": ttft.max_prompts_latency},
              {"": "KV-cache memory alone", "prompts": ttft.max_prompts_memory},
              {"": f"together within {slo_ttft_ms.value} ms ({ttft.limited_by})",
               "prompts": ttft.together},
              {"": f"a stream: per step within {slo_ttft_ms.value / 2:g} ms", "prompts": ttft.stream}])
    return (
        ttft,
        ttft_closed_form,
        ttft_deployment,
        ttft_flops_per_prompt,
        ttft_peak,
        ttft_prompt,
        ttft_target_s,
    )


@app.cell
def _(inspect, roofline, ttft_flops_per_prompt, ttft_prompt, ui):
    ui.md("$F(L)$ as the course computes it (`workshop/compute/roofline.py`), "
          f"{ttft_flops_per_prompt:.4g} FLOPs for one prompt of {ttft_prompt:,} tokens here:\n\n"
          "```python\n" + inspect.getsource(roofline.flops_per_token)
          + "\n\n" + inspect.getsource(roofline.prefill_flops) + "```")
    return


@app.cell
def _(
    calc_cfg,
    calc_num_gpus,
    calc_plan,
    capacity,
    kvcache,
    slo,
    slo_gpu,
    slo_ttft_ms,
    ttft,
    ttft_closed_form,
    ttft_deployment,
    ttft_prompt,
    ui,
):
    if ttft.together == 0:
        _one = capacity.prefill_step(calc_cfg, slo_gpu, 1, ttft_prompt, **ttft_deployment)
        _why = ("The prompt is longer than the model's context." if ttft.limited_by.startswith(
            "context") else f"The weights alone ({kvcache.human_bytes(calc_plan.weight_bytes)}) "
                "leave no room for a KV cache." if ttft.max_prompts_memory == 0 else
                f"One prompt alone already takes {_one.seconds * 1e3:,.1f} ms to prefill.")
    elif ttft.max_prompts_latency == ttft_closed_form:
        _why = "The full formula agrees with the closed form: these prefills are compute-bound."
    elif ttft.max_prompts_latency < ttft_closed_form:
        _why = (f"The full formula allows fewer prompts than the closed form: at "
                f"{ttft.max_prompts_latency + 1:,} prompts the bytes to read (weights once, "
                "each prompt's KV cache) would take longer than the FLOPs.")
    else:
        _why = (f"The full formula allows {ttft.max_prompts_latency:,} prompts against the closed "
                f"form's {ttft_closed_form:,}.")
    ui.md(
        f"At a {slo_ttft_ms.value} ms target, {calc_cfg.name} on {int(calc_num_gpus.value)} x "
        f"{slo_gpu.name} prefills **{ttft.together:,} prompt{'' if ttft.together == 1 else 's'} "
        f"of {ttft_prompt:,} tokens together**, limited by **{ttft.limited_by}**. {_why}"
        + (f" For a stream of requests, steps of {ttft.stream:,} "
           f"prompt{'' if ttft.stream == 1 else 's'} take "
           f"{ttft.stream_step.seconds * 1e3:,.1f} ms each (within half the target), so the GPUs "
           f"sustain **{ttft.requests_per_s:,.1f} requests/s** "
           f"({ttft.requests_per_s_per_gpu:,.1f} per GPU, {ttft.prompt_tokens_per_s:,.0f} prompt "
           "tokens/s)" if ttft.stream_step is not None else
           " Half the target is too short for even one prompt, so a stream of requests cannot be "
           "promised it at any rate")
        + (f", and a million prompt tokens cost at least "
           f"**${ttft.usd_per_million_prompt_tokens:,.4f}**." if
           ttft.usd_per_million_prompt_tokens is not None else ".")
        + (f" Section 4's batch decodes output tokens for at least "
           f"${slo.usd_per_million_tokens:,.3f} per million: a prompt token costs "
           f"{ttft.usd_per_million_prompt_tokens / slo.usd_per_million_tokens:.2g}x an output "
           "token here, because one pass over the weights prefills many tokens but decodes only "
           "one per user."
           if ttft.usd_per_million_prompt_tokens is not None
           and slo.usd_per_million_tokens is not None else "")
    )
    return


@app.cell
def _(
    calc_cfg,
    capacity_plots,
    slo_gpu,
    ttft_deployment,
    ttft_prompt,
    ttft_target_s,
):
    ttft_plot = capacity_plots.plot_ttft_vs_prompts(calc_cfg, slo_gpu, ttft_target_s,
                                                    prompt_len=ttft_prompt, **ttft_deployment)
    ttft_plot
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    The same target and prompt length on every GPU of the catalogue:
    """)
    return


@app.cell
def _(
    calc_cfg,
    capacity_plots,
    gpu_catalogue,
    ttft_deployment,
    ttft_prompt,
    ttft_target_s,
    ui,
):
    ui.table(capacity_plots.ttft_rows(calc_cfg, gpu_catalogue, ttft_target_s, prompt_len=ttft_prompt,
                                      **ttft_deployment))
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    **Exercise 3 (predict, then compute).** Same target, model and GPU, but prompts **twice as
    long**. How many of them can be prefilled together now?
    """)
    return


@app.cell
def _():
    my_prompts_at_double_length = None    # your prediction: prompts, e.g. 4
    return (my_prompts_at_double_length,)


@app.cell(hide_code=True)
def _():
    from workshop.ui import reveal_button as _reveal_button

    reveal_exercise_3 = _reveal_button("Compute")
    reveal_exercise_3
    return (reveal_exercise_3,)


@app.cell
def _(
    calc_cfg,
    capacity,
    mo,
    my_prompts_at_double_length,
    reveal_exercise_3,
    slo_gpu,
    slo_ttft_ms,
    ttft_deployment,
    ttft_prompt,
    ttft_target_s,
    ui,
):
    mo.stop(not reveal_exercise_3.value,
            mo.md("_Write your prediction for Exercise 3, then press **Compute** under it._"))
    ttft_double = capacity.ttft_plan(calc_cfg, slo_gpu, ttft_target_s, prompt_len=2 * ttft_prompt,
                                     **ttft_deployment)
    ui.compare(my_prompts_at_double_length, ttft_double.together,
               f"prompts of {2 * ttft_prompt:,} tokens prefilled together within "
               f"{slo_ttft_ms.value} ms", "prompts", how="computed")
    return (ttft_double,)


@app.cell
def _(
    calc_cfg,
    math,
    mo,
    reveal_exercise_3,
    roofline,
    ttft_closed_form,
    ttft_double,
    ttft_flops_per_prompt,
    ttft_peak,
    ttft_prompt,
    ttft_target_s,
    ui,
):
    # Worked answer to Exercise 3, collapsed until opened
    mo.stop(not reveal_exercise_3.value)
    _flops_double = roofline.prefill_flops(calc_cfg, 2 * ttft_prompt)
    _budget = ttft_target_s * ttft_peak
    _closed_double = math.floor(_budget / _flops_double)
    _full_why = "."
    if ttft_double.limited_by == "latency target" and ttft_double.together == _closed_double:
        _full_why = ", the same as the closed form: these prefills are compute-bound."
    elif ttft_double.limited_by == "latency target" and ttft_double.together < _closed_double:
        _full_why = (": fewer, because reading the weights and writing the prompts' KV caches "
                     "takes longer than their FLOPs.")
    ui.worked_answer(
        f"A compute-bound prefill gets target x peak = {_budget:.3g} FLOPs. F(L) is "
        f"{ttft_flops_per_prompt:.3g} FLOPs at {ttft_prompt:,} tokens and {_flops_double:.3g} at "
        f"{2 * ttft_prompt:,}, **{_flops_double / ttft_flops_per_prompt:.2f}x**: "
        + ("more than twice, because attention grows with the square of the length"
           if _flops_double > 2.01 * ttft_flops_per_prompt else
           "about twice: the weights' FLOPs dominate at these lengths")
        + f". So ⌊{_budget:.3g} / {_flops_double:.3g}⌋ = **{_closed_double:,} "
        f"prompt{'' if _closed_double == 1 else 's'}**, against {ttft_closed_form:,} at "
        f"{ttft_prompt:,} tokens. The full calculation (memory term, KV memory, context) gives "
        f"**{ttft_double.together:,}**, limited by {ttft_double.limited_by}{_full_why}"
    )
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## Where the GPU numbers come from

    Peaks are the vendors' dense bf16 tensor figures and memory bandwidth; prices are one
    provider's on-demand list price on the date shown (they move 2x between providers). Memory
    is what the driver reports (`nvidia-smi`), not the datasheet's "80 GB" (ECC on GDDR6 takes 1/16).
    """)
    return


@app.cell
def _(gpu_catalogue, ui):
    ui.table([{"GPU": g.name, "memory (MiB, driver)": g.memory_bytes // 2**20,
               "memory (GiB)": round(g.memory_bytes / 2**30, 1), "bandwidth (GB/s)":
               round(g.bandwidth_bytes_s / 1e9), "bf16 TFLOP/s": round(g.flops / 1e12),
               "spec source": g.spec_source, "memory source": g.memory_source,
               "$/hour": g.price_usd_hour, "price source": g.price_source}
              for g in gpu_catalogue.values()])
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## What the real engines do

    * **Prefill and decode share the GPU.** vLLM splits long prompts into chunks (*chunked
      prefill*, default in V1) and fills each step with decode tokens first, then prefill
      chunks, up to `--max-num-batched-tokens`: that budget trades TTFT against TPOT
      ([vLLM docs](https://docs.vllm.ai/en/stable/configuration/optimization/); Sarathi-Serve's
      *stall-free batching*, [Agrawal et al. 2024](https://arxiv.org/abs/2403.02310)).
    * **Or they get separate GPUs.** Disaggregated serving prefills and decodes on different
      GPUs, so the TTFT and TPOT targets are met and scaled independently, moving each request's
      KV cache between them: DistServe ([Zhong et al. 2024](https://arxiv.org/abs/2401.09670)),
      Splitwise ([Patel et al. 2024](https://arxiv.org/abs/2311.18677)).
    * **What the calculators leave out.** Engines reach a fraction of these bounds (notebook 3
      measures it), keep activations and CUDA graphs outside the KV cache, and pay for
      communication under tensor parallelism: every figure above is a best case; measure
      (notebook 10) before you buy.
    """)
    return


if __name__ == "__main__":
    app.run()
