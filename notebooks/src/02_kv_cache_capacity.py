# %% [markdown]
# # 2 · KV-cache capacity: how many users fit, and what a token costs
#
# [![Open in Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/{{github_repo}}/blob/main/notebooks/02_kv_cache_capacity.ipynb)
# [![Open in molab](https://marimo.io/molab-shield.svg)](https://molab.marimo.io/github/{{github_repo}}/blob/main/notebooks/02_kv_cache_capacity.py)
#
# Notebook 1 watched the KV cache fill up on a live server. This notebook turns that into
# arithmetic you can do for any model and any GPU before renting one:
#
# 1. **bytes per token** for six real models, from their published `config.json` files;
# 2. a **check against the live engine**: does our formula predict exactly how many KV blocks
#    the engine carved out of its memory?
# 3. a **capacity and cost calculator**: does a model fit on a GPU at a given precision,
#    context and number of users, how fast can it decode at best, and what does that imply
#    per million tokens?
# 4. the **other direction**: from a latency target (time per output token) to the largest
#    batch, the users per GPU and the cost per million tokens;
# 5. the same from a **time-to-first-token** target: how many prompts can be prefilled
#    together within it, hence the requests per second one GPU sustains and the cost per
#    million prompt tokens.
#
# Two mistakes are common in online calculators, and the calculator here avoids both: counting
# keys and values for every *attention* head (models with grouped-query attention store them
# only for the fewer *KV* heads), and assuming the cache has the same precision as the weights
# (4-bit weights with a 16-bit cache is the usual case).

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
# ## 1. Bytes per token, from real configs
#
# For every token in a conversation, every layer keeps what attention needs to look back at it.
# In standard and grouped-query attention (GQA) that is one key and one value vector per KV head:
#
# $$\text{bytes per token} = 2 \times \text{layers} \times \text{KV heads} \times \text{head dim} \times \text{bytes per number}$$
#
# Two newer designs change the formula:
#
# * **Multi-head latent attention** (MLA, DeepSeek-V2/V3) caches one compressed vector per layer
#   and token (`kv_lora_rank` numbers) plus one small shared positional key
#   (`qk_rope_head_dim`), and rebuilds per-head keys and values from it:
#   $\text{layers} \times (\text{kv\_lora\_rank} + \text{qk\_rope\_head\_dim}) \times \text{bytes}$
#   ([DeepSeek-V2 paper](https://arxiv.org/abs/2405.04434), section 2.1).
# * **Sliding-window layers** (gpt-oss alternates them with full layers) keep only the last
#   `sliding_window` tokens, so past that length they stop growing.
#
# The configs below ship with the course in `workshop/data/models/`, each copied from the
# linked `config.json`. "Naive" is what you get by counting every attention head at the same
# precision, the mistake to avoid.

# %%
from workshop import capacity, capacity_plots, kvcache, roofline, ui

model_table = capacity_plots.model_rows(context=32_768)
ui.table(model_table)

# %%
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

# %% [markdown]
# ## 2. Check the formula against the live engine
#
# The engine does not trust our formula; it computes its own. vLLM takes a memory budget for
# the KV cache (on CPU: `VLLM_CPU_KVCACHE_SPACE` or `--kv-cache-memory-bytes`; on GPU: what is
# left of `--gpu-memory-utilization` after the weights), cuts it into **blocks** of
# `block_size` tokens, and publishes the result in `/metrics` as `vllm:cache_config_info`.
# If our bytes per token are right, then *budget / (block size x bytes per token)*, rounded
# down, is exactly the engine's block count. The model's terms come from the `config.json` the
# server actually loaded, when it is on this machine.

# %%
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

# %% [markdown]
# **Exercise 1 (predict, then measure).** From the three numbers above, how many blocks did the engine
# make? Write your number, then run the cell after it: it shows the engine's own count.

# %%
predict_engine_blocks = None   # your prediction: a number of blocks

# %%
(ui.compare(predict_engine_blocks, check["engine_blocks"], "KV blocks the engine made", "blocks")
 if check["engine_blocks"] is not None else
 ui.md(f"This {session.engine_name} server publishes no block count (vLLM's "
       "`vllm:cache_config_info`): nothing to compare with."))

# %%
ui.table([{k: v for k, v in check.items()}])

# %%
if check.get("kv_memory_bytes") is not None:
    check_text = (
        f"The engine was given **{kvcache.human_bytes(check['kv_memory_bytes'])}** for the KV "
        f"cache and made **{check['engine_blocks']:,} blocks** of {check['block_size']} tokens. "
        f"Our formula ({served_config_from}: {check['our_bytes_per_token']:,.0f} bytes per token "
        f"at cache dtype `{check['cache_dtype']}`) predicts **{check['predicted_blocks']:,} "
        f"blocks**, i.e. {check['predicted_capacity_tokens']:,} tokens: "
        + ("**they agree exactly**." if check["agrees"] else "**they differ** - the engine "
           "stores something our formula does not count (or vice versa); investigate before "
           "trusting the calculator below.")
        + f" The server reports a capacity of {check['engine_capacity_tokens']:,} tokens.")
elif check.get("engine_blocks") is not None:
    check_text = (
        f"This engine does not publish its KV byte budget (on a GPU it is whatever memory is "
        f"left after the weights). It made {check['engine_blocks']:,} blocks of "
        f"{check['block_size']} tokens, which at {check['our_bytes_per_token']:,.0f} bytes per "
        f"token is {kvcache.human_bytes(check['implied_kv_memory_bytes'])} of KV cache.")
else:
    check_text = (f"This {session.engine_name} server publishes no block count of its own "
                  "(vLLM's `vllm:cache_config_info`), so there is no engine figure to check "
                  "against.")
ui.md(check_text)

# %% [markdown]
# ## 3. A capacity and cost calculator
#
# Pick a model, a GPU from the catalogue, the precision of the weights and, separately, of the
# KV cache, a context length per user and a number of users. (In Jupyter, re-run the cells
# after the controls once you change them; marimo does it for you.)
#
# What the calculator assumes, so you can argue with it:
#
# * the engine may use 90% of GPU memory (vLLM's default `--gpu-memory-utilization`); the
#   weights come out of that, the KV cache gets the rest; activations and fragmentation are
#   ignored;
# * one decode step reads all weights once (for mixture-of-experts models: the shared part and
#   every expert at least one user's token was routed to) plus every user's whole KV cache, and
#   produces one token per user. Its time is at least *bytes / bandwidth* and at least
#   *2 x active parameters x users / peak FLOP/s*; the larger wins. These are **bounds**: real
#   engines reach perhaps half to most of them (notebook 3 measures how close this machine
#   gets);
# * cost per million tokens = hourly price / tokens per hour at that bound, so it is a
#   **lower bound** on cost. GPU specs are vendor datasheet figures, prices are indicative list
#   prices on a given date (sources in the table at the end): put in your own.

# %%
calc_model = ui.dropdown(kvcache.list_models(), "llama-3.1-8b", "model")
calc_model

# %%
gpu_catalogue = capacity.load_gpus()
calc_gpu = ui.dropdown(list(gpu_catalogue), "L4", "GPU")
calc_gpu

# %%
calc_weights = ui.dropdown(["bf16", "fp8", "int8", "int4", "mxfp4"], "int4", "weight precision")
calc_weights

# %%
calc_kv = ui.dropdown(["bf16", "fp8"], "bf16", "KV-cache precision")
calc_kv

# %%
calc_context = ui.slider(512, 131_072, 8192, 512, "context per user (tokens)")
calc_context

# %%
calc_users = ui.slider(1, 256, 16, 1, "simultaneous users")
calc_users

# %%
calc_num_gpus = ui.slider(1, 8, 1, 1, "GPUs (tensor parallel)")
calc_num_gpus

# %%
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

# %% [markdown]
# The same question for every GPU in the catalogue:

# %%
ui.table(capacity_plots.gpu_rows(calc_cfg, gpu_catalogue, users=int(calc_users.value),
                                 **calc_deployment))

# %% [markdown]
# How many users fit as the context grows, with a 16-bit cache, an 8-bit cache, and what the
# naive calculation would tell you:

# %%
capacity_plot = capacity_plots.plot_users_vs_context(calc_cfg, gpu_catalogue[calc_gpu.value],
                                                     calc_weights.value, int(calc_num_gpus.value))
capacity_plot

# %%
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

# %%
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

# %% [markdown]
# ## 4. The other direction: from a latency target to users and cost
#
# The calculator above starts from a number of users. A service often starts from a promise
# instead: each user sees a new token at least every *TPOT* milliseconds (time per output
# token). How many users can then decode together, and what does a token cost?
#
# A decode step produces one token for every user in the batch, so the step time *is* the
# TPOT. With the same assumptions as above (the roofline model, which notebook 3 measures on
# this machine), a step for a batch of $B$ users takes at least
#
# $$\text{TPOT}(B) = \max\left(\frac{\text{weight bytes read} + B \times \text{KV bytes per user}}{\text{bandwidth}},\ \frac{B \times 2 \times \text{active parameters}}{\text{peak FLOP/s}}\right)$$
#
# The weights are read once per step whatever $B$; each extra user adds its own KV cache. For a
# dense model whose steps are memory-bound, solving $\text{TPOT}(B) \le \text{target}$ gives
#
# $$B_{\max} = \left\lfloor \frac{\text{target} \times \text{bandwidth} - \text{weight bytes}}{\text{KV bytes per user}} \right\rfloor$$
#
# The batch a deployment can serve is the smaller of $B_{\max}$ and the number of users whose
# KV cache fits in memory; it produces $B / \text{TPOT}$ tokens per second, so a million tokens
# cost $\text{price per hour} \times \text{GPUs} / (3600 \times B / \text{TPOT}) \times 10^6$.
#
# Model, GPU, precisions, context and GPU count are the controls of section 3; choose the
# target here. (In Jupyter, re-run the cells below after moving it.)

# %%
slo_tpot_ms = ui.slider(5, 200, 50, 5, "TPOT target (ms per output token)")
slo_tpot_ms

# %%
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

# %%
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

# %%
slo_plot = capacity_plots.plot_tpot_vs_batch(calc_cfg, slo_gpu, slo_target_s, **calc_deployment)
slo_plot

# %% [markdown]
# The same target on every GPU of the catalogue:

# %%
ui.table(capacity_plots.latency_rows(calc_cfg, gpu_catalogue, slo_target_s, **calc_deployment))

# %% [markdown]
# ## Predict, then compute
#
# Relax the promise: allow **twice** the TPOT target above, same model, GPU and context. How
# many users can decode together now? Write the batch you expect, then run the cell after it.

# %%
predict_batch_at_double_target = None   # your guess: the largest batch at 2 x the target

# %%
slo_double = capacity.latency_plan(calc_cfg, slo_gpu, 2 * slo_target_s, **calc_deployment)
ui.compare(predict_batch_at_double_target, slo_double.batch,
           f"largest batch at {2 * slo_tpot_ms.value} ms per token", "users", how="computed")

# %%
if slo.batch == 0 or slo_double.batch == 0:
    _reading = "Here at least one of the two serves nobody, so there is no ratio to read."
else:
    _ratio = slo_double.batch / slo.batch
    _reading = (f"Twice the target gave **{_ratio:.2f}x** the users ({slo.batch:,} -> "
                f"{slo_double.batch:,}), limited by {slo_double.limited_by}. ")
    _weights_share = (roofline.weights_read_per_step(calc_cfg, slo.batch)
                      * kvcache.WEIGHT_BYTES[calc_weights.value] / slo.step.bytes_read)
    if slo_double.limited_by == "KV-cache memory":
        _reading += ("Memory, not latency, caps it now: loosening the target further adds no "
                     "users.")
    elif _ratio > 2.005:
        _reading += (f"More than double: the weights, {_weights_share:.0%} of the bytes of a "
                     f"step at {slo.batch:,} users, take the same time in every step, so all of "
                     "the extra time goes to more users' KV caches.")
    else:
        _reading += (f"About double or less: the weights are only {_weights_share:.1%} of the "
                     f"bytes of a step at {slo.batch:,} users, so the step time grows almost in "
                     "proportion to the users"
                     + (", and these steps are compute-bound." if slo.step.bound_by == "compute"
                        else "."))
ui.md(_reading)

# %% [markdown]
# ## 5. From a time-to-first-token target to requests per second and cost
#
# The other promise a service makes: the first token arrives within *TTFT* (time to first
# token). Before it, the engine **prefills** the whole prompt, and there every prompt token
# passes through every weight: one pass over the weights serves hundreds or thousands of
# tokens, so a prefill is compute-bound already for a single prompt of a few hundred tokens
# (notebook 3 places it on the roofline). A prompt of $L$ tokens costs
#
# $$F(L) = 2L \times \text{active parameters} + 2L^2 \times \text{layers} \times \text{heads} \times \text{head dim} - 2(L-1) \times \text{LM-head parameters}$$
#
# FLOPs: 2 per active weight per token, attention over the prompt (each token looks back at
# $L/2$ tokens on average), and the output layer only for the last token, whose logits give
# the first token. $N$ prompts prefilled together take at least
#
# $$\text{TTFT}(N) = \max\left(\frac{N \times F(L)}{\text{peak FLOP/s}},\ \frac{\text{weight bytes read} + N \times \text{KV bytes}(L)}{\text{bandwidth}}\right)$$
#
# (the weights are read once for all of them, each prompt's KV cache written once). When the
# compute term wins, solving $\text{TTFT}(N) \le \text{target}$ gives
#
# $$N_{\max} = \left\lfloor \frac{\text{target} \times \text{peak FLOP/s}}{F(L)} \right\rfloor$$
#
# That many prompts fit in one step when they **arrive together**. A stream of requests is
# less lucky: a request that arrives while a prefill step runs waits for it, then for its own,
# so to keep every request within the target each step may take only **half** of it. Run back
# to back, steps of $N'$ prompts (the largest within half the target) serve
# $N' / \text{TTFT}(N')$ requests per second, and a million prompt tokens cost
# $\text{price per hour} \times \text{GPUs} / (3600 \times \text{requests/s} \times L) \times 10^6$.
# Here the GPUs only prefill: decoding the answers takes time of its own (section 4), so the
# rate is an upper bound and the cost a lower bound.
#
# Model, GPU, precisions and GPU count are the controls of section 3; choose the target and
# the prompt length here. (In Jupyter, re-run the cells below after moving them.)

# %%
slo_ttft_ms = ui.slider(50, 5000, 1000, 50, "TTFT target (ms to the first token)")
slo_ttft_ms

# %%
slo_prompt_len = ui.slider(128, 32_768, 2048, 128, "prompt length (tokens)")
slo_prompt_len

# %%
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

# %%
ui.md("$F(L)$ as the course computes it (`workshop/roofline.py`), "
      f"{ttft_flops_per_prompt:.4g} FLOPs for one prompt of {ttft_prompt:,} tokens here:\n\n"
      "```python\n" + inspect.getsource(roofline.flops_per_token)
      + "\n\n" + inspect.getsource(roofline.prefill_flops) + "```")

# %%
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

# %%
ttft_plot = capacity_plots.plot_ttft_vs_prompts(calc_cfg, slo_gpu, ttft_target_s,
                                                prompt_len=ttft_prompt, **ttft_deployment)
ttft_plot

# %% [markdown]
# The same target and prompt length on every GPU of the catalogue:

# %%
ui.table(capacity_plots.ttft_rows(calc_cfg, gpu_catalogue, ttft_target_s, prompt_len=ttft_prompt,
                                  **ttft_deployment))

# %% [markdown]
# **Predict, then compute.** Same target, same model and GPU, but prompts **twice as long**.
# How many of them can be prefilled together now? Write the number you expect, then run the
# cell after it.

# %%
predict_prompts_at_double_length = None   # your guess: prompts together at 2 x the length

# %%
ttft_double = capacity.ttft_plan(calc_cfg, slo_gpu, ttft_target_s, prompt_len=2 * ttft_prompt,
                                 **ttft_deployment)
ui.compare(predict_prompts_at_double_length, ttft_double.together,
           f"prompts of {2 * ttft_prompt:,} tokens prefilled together within "
           f"{slo_ttft_ms.value} ms", "prompts", how="computed")

# %%
if ttft.together == 0 or ttft_double.together == 0:
    _reading = "Here at least one of the two prefills nothing, so there is no ratio to read."
else:
    _flops_ratio = (roofline.prefill_flops(calc_cfg, 2 * ttft_prompt)
                    / roofline.prefill_flops(calc_cfg, ttft_prompt))
    # How many prompts' worth of time the target holds, before rounding down to whole ones.
    _worth = [ttft_target_s / capacity.prefill_step(calc_cfg, slo_gpu, 1, _n,
                                                    **ttft_deployment).seconds
              for _n in (ttft_prompt, 2 * ttft_prompt)]
    _reading = (f"Twice the prompt length gave **{ttft_double.together / ttft.together:.2f}x** "
                f"the prompts ({ttft.together:,} -> {ttft_double.together:,}), limited by "
                f"{ttft_double.limited_by}. One prompt of {2 * ttft_prompt:,} tokens costs "
                f"{_flops_ratio:.2f}x the FLOPs of one of {ttft_prompt:,}: "
                + ("more than twice, because attention grows with the square of the length. "
                   if _flops_ratio > 2.005 else "about twice: the weights' FLOPs dominate. ")
                + f"The target holds {_worth[0]:.2f} single-prompt prefills at {ttft_prompt:,} "
                f"tokens and {_worth[1]:.2f} at {2 * ttft_prompt:,}; only whole prompts count.")
ui.md(_reading)

# %% [markdown]
# ## Where the GPU numbers come from
#
# Peak figures are the vendors' dense (no 2:4 sparsity) bf16 tensor numbers and peak memory
# bandwidth; prices are one provider's on-demand list price on the date shown and move by 2x
# or more between providers and months. Memory is the usable total the driver reports
# (nvidia-smi's `memory.total`, in MiB), not the datasheet's "80 GB": that figure counts the
# chips in binary units, and the driver keeps some of them (ECC on GDDR6 parts takes 1/16).

# %%
ui.table([{"GPU": g.name, "memory (MiB, driver)": g.memory_bytes // 2**20,
           "memory (GiB)": round(g.memory_bytes / 2**30, 1),
           "bandwidth (GB/s)": round(g.bandwidth_bytes_s / 1e9),
           "bf16 TFLOP/s": round(g.flops / 1e12), "spec source": g.spec_source,
           "memory source": g.memory_source,
           "$/hour": g.price_usd_hour, "price source": g.price_source}
          for g in gpu_catalogue.values()])

# %% [markdown]
# ## What the real engines do
#
# * **Prefill and decode share the GPU.** vLLM splits long prompts into chunks (*chunked
#   prefill*, on by default in its V1 engine) and fills each step with decode tokens first, then
#   prefill chunks, up to `--max-num-batched-tokens` tokens in all: a long prompt no longer
#   stalls everybody's next token, and that budget trades TTFT against TPOT
#   ([vLLM docs: optimization and tuning](https://docs.vllm.ai/en/stable/configuration/optimization/)).
#   Sarathi-Serve's *stall-free batching* is the same idea
#   ([Agrawal et al. 2024](https://arxiv.org/abs/2403.02310)).
# * **Or they get separate GPUs.** Disaggregated serving runs prefill and decode on different
#   GPUs, so the TTFT and TPOT targets above are met, and scaled, independently: DistServe
#   ([Zhong et al. 2024](https://arxiv.org/abs/2401.09670)) and Splitwise
#   ([Patel et al. 2024](https://arxiv.org/abs/2311.18677)) move each request's KV cache from
#   the prefill GPU to the decode GPU.
# * **What the calculators here leave out.** Engines reach a fraction of these bounds
#   (notebook 3 measures how much on this machine), keep activations and CUDA graphs in the
#   memory outside the KV cache, and pay for communication under tensor parallelism; treat
#   every figure above as the best case, and measure (notebook 10) before you buy.
