# %% [markdown]
# # 3 · Prefill, decode and the roofline
#
# [![Open in Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/{{github_repo}}/blob/main/notebooks/03_prefill_decode_roofline.ipynb)
# [![Open in molab](https://marimo.io/molab-shield.svg)](https://molab.marimo.io/github/{{github_repo}}/blob/main/notebooks/03_prefill_decode_roofline.py)
#
# An inference request has two phases that stress the hardware in opposite ways:
#
# * **prefill** runs the whole prompt through the model at once: every weight read from memory
#   is used for hundreds of tokens, so the arithmetic units are the limit;
# * **decode** produces one token per step per request: every weight is read again for one
#   token (or one per request in the batch), so memory bandwidth is the limit.
#
# The **roofline model** makes this precise. We measure this machine's memory bandwidth and
# matrix-multiply speed, draw its roofline, and place prefill and decode measured on the live
# server on it. Then we draw the same picture for common GPUs from their datasheets.

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
# ## 1. Measure this machine
#
# Two numbers define a roofline:
#
# * **memory bandwidth** W: we sum a float32 buffer several times larger than the CPU's caches
#   (one addition per 4 bytes is far below what the cores can compute, so the time is the
#   time to stream the bytes in);
# * **peak compute** P: we time square matrix products (2n³ FLOPs each) of a few sizes, laid
#   out as a linear layer computes them (`x @ W.T`, the kernel an engine's linear layers use),
#   in bf16 and in float32, and keep the best. The kernel and the dtype matter: a CPU without
#   bf16 instructions runs bf16 far below its float32 peak, so the bf16 figure is drawn as a
#   lower, dashed *ceiling*: an engine serving bf16 weights cannot rise above it.
#
# A kernel that does F FLOPs while moving B bytes has **arithmetic intensity** I = F/B and
# runs at most at min(P, W x I). Below the **ridge point** I = P/W it waits for memory; above
# it, for arithmetic. On a GPU the server runs on the GPU, so we measure that instead.

# %%
import numpy as np

from reference_server import dtypes
from workshop import sanity, timing, ui
from workshop.compute import roofline, roofline_measure, roofline_plots
from workshop.sizing import capacity, kvcache
from workshop.session import sweep

on_gpu = str(session.info.get("device", "cpu")).startswith("cuda")


def measure_roof():
    timing.let_servers_rest()     # a server's threads spin a while after its last request
    if on_gpu:
        return roofline_measure.measure_cuda_machine()   # the server runs on this GPU
    return roofline_measure.measure_machine("this CPU", mib=sweep(512, 256),
                                            sizes=sweep((512, 1024, 2048), (512, 1024)),
                                            repeats=5)


machine = measure_roof()
ui.md(
    f"**{machine.name}**: memory bandwidth **{machine.bandwidth / 1e9:,.1f} GB/s**, peak "
    f"**{machine.flops / 1e9:,.1f} GFLOP/s** ("
    + ", ".join(f"{_dt}: {_f / 1e9:,.1f} GFLOP/s" for _dt, _f in machine.ceilings)
    + f"; {machine.source}). Ridge point: "
    f"**{machine.ridge:,.1f} FLOP per byte** - a kernel must do that much arithmetic per byte it "
    "reads to keep the arithmetic units busy. (On a shared machine these numbers move from run "
    "to run; re-run the cell and compare.)"
)

# %% [markdown]
# ## 2. Where prefill and decode should land
#
# Every weight is used for 2 FLOPs (a multiply and an add) per token that passes through it.
# At bf16 a weight is 2 bytes, so:
#
# * a decode step for **one** sequence does about 2 FLOPs per 2 bytes read: intensity ~1, deep
#   in the memory-bound region. Its speed limit is *bandwidth / bytes of weights*;
# * a decode step for a **batch of B** sequences reads the weights once for B tokens: intensity
#   ~B, until each sequence's own KV cache (read for that sequence alone) dominates;
# * a **prefill** of T prompt tokens reads the weights once for T tokens: intensity ~T. Only
#   the last prompt token needs logits (the next-token distribution), so engines run the LM
#   head (hidden size x vocabulary weights) once per prompt, not T times;
# * a **mixture-of-experts** model routes each token to a few experts, so a decode step reads
#   only the shared weights and the experts its tokens chose: *active*, not total, parameters.
#
# In code (the FLOP counts every helper below uses):

# %%
import inspect

print(inspect.getsource(roofline.flops_per_token))
print(inspect.getsource(roofline.prefill_flops))

# %% [markdown]
# Here is that arithmetic for the model this server runs.

# %%
model_path = str(session.info.get("model_path") or session.model)
# The served model's own config.json and weight count when its folder is on this machine.
model_cfg = kvcache.served_model_config(model_path, name=session.model)
# The dtype the server computes in ("auto": the checkpoint's own): weights and KV are read in it.
served_dtype = dtypes.canonical(str(session.info.get("dtype") or "auto").replace("torch.", ""),
                                model_cfg.torch_dtype, "bfloat16")
served_short = dtypes.lookup(served_dtype).short      # the weight tables' key: "bf16", "fp32"
weight_bytes = kvcache.weight_bytes(model_cfg, served_short)
bound_b1 = roofline.decode_bound_tokens_per_s(model_cfg, machine, batch=1, context=128,
                                              weight_dtype=served_short)
_dt = (served_short, served_short)     # weights and KV cache
ui.table([{"phase": ph, "tokens per weight read": n,
           "intensity (FLOP/byte)": round(i, 1),
           "bound on this machine": ("memory" if i < machine.ridge else "compute")}
          for ph, n, i in (
              ("decode, batch 1", 1, roofline.decode_intensity(model_cfg, 1, 128, *_dt)),
              ("decode, batch 8", 8, roofline.decode_intensity(model_cfg, 8, 128, *_dt)),
              ("decode, batch 64", 64, roofline.decode_intensity(model_cfg, 64, 128, *_dt)),
              ("prefill, 512-token prompt", 512,
               roofline.prefill_intensity(model_cfg, 512, *_dt)))])

# %% [markdown]
# ## 3. Decode must use the KV cache
#
# A decode step is only cheap because the keys and values of earlier tokens are *cached*: the
# step runs the newest token alone. A frequent benchmarking mistake is to "decode" by running
# the whole sequence again for every new token: that is a prefill each time, its cost grows
# with the context, and it says nothing about decode speed. We time both ways in this process
# with the Hugging Face implementation of the same model.

# %%
import torch
from transformers import AutoModelForCausalLM
from reference_server.models import resolve_model

# The served folder when it is local; a hub id (Colab on a GPU) downloads the same weights.
# In the dtype the server computes in (float32 where the CPU would emulate bf16).
_hf_model = AutoModelForCausalLM.from_pretrained(
    resolve_model(model_path).path, dtype=getattr(torch, served_dtype)).eval()
if str(session.info.get("device", "cpu")).startswith("cuda"):
    _hf_model = _hf_model.cuda()             # time it where the server runs
weights_stream_s = roofline_measure.time_weight_stream(_hf_model, repeats=sweep(5, 3))
leaf_modules = sum(1 for _m in _hf_model.modules() if not list(_m.children()))
decode_contexts = sweep([64, 256, 512, 1024, 2048], [64, 256])
decode_rows = []
for _ctx in ui.progress(decode_contexts, title="timing decode steps"):
    _cached = roofline_measure.time_decode_step(_hf_model, _ctx, use_cache=True,
                                                repeats=sweep(5, 3))
    _full = roofline_measure.time_decode_step(_hf_model, _ctx, use_cache=False,
                                              repeats=sweep(3, 1))
    decode_rows.append({"context (tokens)": _ctx, "KV-cached step (ms)": _cached * 1e3,
                        "re-run everything (ms)": _full * 1e3, "ratio": _full / _cached})
del _hf_model          # free it before the server sweep below competes for the same cores
ui.table(decode_rows)

# %%
_first, _last = decode_rows[0], decode_rows[-1]
ui.md(
    f"From {_first['context (tokens)']:,} to {_last['context (tokens)']:,} tokens of context "
    f"the cached step went from {_first['KV-cached step (ms)']:.1f} to "
    f"{_last['KV-cached step (ms)']:.1f} ms, while re-running everything went from "
    f"{_first['re-run everything (ms)']:.1f} to {_last['re-run everything (ms)']:.1f} ms "
    f"({_last['ratio']:.0f}x the cached step). Bandwidth alone would allow a cached batch-1 "
    f"step in {1e3 / bound_b1:.1f} ms on this machine ({kvcache.human_bytes(weight_bytes)} "
    f"of weights / {machine.bandwidth / 1e9:,.1f} GB/s), and simply reading each of the "
    f"model's weight tensors once took **{weights_stream_s * 1e3:.1f} ms** (measured). The "
    f"rest of the cached step is not bandwidth: it is the fixed cost of running the model's "
    f"{leaf_modules} modules (each one or more small operators) one after another in eager "
    f"PyTorch, a cost that does not shrink with the model."
)

# %% [markdown]
# **Exercise 1 (predict, then measure).** Section 4 is about to time the server decoding one
# request alone. How many tokens per second will it make? You have the bandwidth bound
# (section 2) and the KV-cached step measured in this process (section 3); the server adds an
# HTTP stream, a scheduler and sampling to every step. Write your number before running on.

# %%
predict_batch1_tok_s = None      # your prediction in tokens/s, e.g. 20.0

# %% [markdown]
# ## 4. Measure the live server
#
# Now the engine itself, through the course's benchmark harness. **Decode**: B requests start
# together, each asks for a fixed number of tokens (`ignore_eos`), and the median time per
# output token (TPOT) gives B / TPOT tokens per second for the whole batch. **Prefill**: one
# request at a time with a long, *cold* prompt (words this server has not seen, its prefix
# cache emptied first) and one output token; prompt tokens / time to first token is the
# prefill rate (it includes the HTTP round trip, which long prompts make small).

# %%
decode_batches = sweep([1, 2, 4, 8, 16, 32, 64], [1, 2, 4])
decode_input, decode_output = 128, sweep(64, 16)
serve_decode_rows = [roofline_measure.serve_decode(session, _b, decode_input, decode_output)
                     for _b in ui.progress(decode_batches, title="decode sweep")]
prefill_lengths = sweep([128, 512, 1024, 1536], [128, 512])
serve_prefill_rows = [roofline_measure.cold_prefill(session, _t, repeats=sweep(3, 2))
                      for _t in ui.progress(prefill_lengths, title="prefill sweep")]
ui.table(serve_decode_rows)

# %%
ui.table(serve_prefill_rows)

# %%
served_b1 = serve_decode_rows[0]["tok/s total"]
inprocess_b1 = 1e3 / decode_rows[0]["KV-cached step (ms)"]
ui.compare(predict_batch1_tok_s, served_b1, "batch-1 decode rate through the server", "tokens/s")

# %%
# Worked answer to Exercise 1, collapsed until opened
ui.worked_answer(
    f"The roof bounds batch-1 decode at **{bound_b1:,.0f} tokens/s**: every token streams "
    f"{kvcache.human_bytes(weight_bytes)} of weights at {machine.bandwidth / 1e9:,.1f} GB/s. "
    f"Section 3 timed the same model's KV-cached step in this process at "
    f"{decode_rows[0]['KV-cached step (ms)']:.1f} ms, which makes **{inprocess_b1:,.1f} "
    f"tokens/s** the closer forecast: the fixed cost of running {leaf_modules} modules is paid "
    f"every step, whatever the bandwidth. The server made **{served_b1:,.1f} tokens/s**, "
    f"{served_b1 / inprocess_b1:.2f}x the in-process rate ("
    + ("its step costs less than eager Hugging Face's, serving stack included" if
       served_b1 > inprocess_b1 else "the serving stack costs more than it saves")
    + f") and {served_b1 / bound_b1:.0%} of the bound."
)

# %%
measured_points = (
    [roofline.decode_point(model_cfg, r["batch"], r["context"], r["tok/s total"],
                           weight_dtype=served_short)
     for r in serve_decode_rows]
    + [roofline.prefill_point(model_cfg, r["prompt tokens"], r["prefill tok/s"],
                              weight_dtype=served_short)
       for r in serve_prefill_rows])
# The roof again, now the server has worked: another process disturbing a measurement only
# ever makes it lower, so the roof is the best this machine showed in the run.
roof = roofline.best_of(machine, measure_roof(), measure_roof())
roofline_plots.roofline_figure(f"{session.model} on {roof.name}: measured on the live server",
                               [roof], {roof.name: measured_points}, (0.3, 3000))

# %% [markdown]
# **A check the picture must pass.** No kernel runs faster than the machine allows, so every
# measured point must lie on or below its roof: the ceiling of the dtype the server computes
# in. A point above it would mean a wrong FLOP count, a wrong byte count, a roof measured
# with a slower kernel than the engine's, or a prefill served from the prefix cache (so the
# prefill helper sends prompts new to the server and leaves out any request whose usage reports
# cached tokens). We allow the stated measurement error (`sanity.MEASUREMENT_ERROR`) for
# run-to-run noise; beyond it the cell prints a line marked *implausible* and the conclusions
# wait.

# %%
roof_check = [{"point": _p.label, "attained (GFLOP/s)": _p.flops / 1e9,
               f"{served_dtype} roof there (GFLOP/s)":
                   roofline.roof_at(roof, _p, served_dtype) / 1e9,
               "attained / roof": roofline.roof_ratio(roof, _p, served_dtype)}
              for _p in measured_points]
roof_violations = (roofline.roof_violations(roof, measured_points, served_dtype)
                   + sanity.completed_some("the prefill sweep",
                                           sum(r["completed"] for r in serve_prefill_rows),
                                           len(serve_prefill_rows))
                   + sanity.grows_with("time to first token (ms) against prompt tokens",
                                       [r["prompt tokens"] for r in serve_prefill_rows],
                                       [r["TTFT ms (median)"] for r in serve_prefill_rows]))
ui.md(f"Roof: the best of section 1's measurement and two taken after the server's points: "
      f"**{roof.bandwidth / 1e9:,.1f} GB/s** (then {machine.bandwidth / 1e9:,.1f}), "
      f"**{roof.ceiling(served_dtype) / 1e9:,.1f} GFLOP/s** in {served_dtype} "
      f"(then {machine.ceiling(served_dtype) / 1e9:,.1f}).\n\n"
      + ui.markdown_table(roof_check) + "\n\n" + (
    f"**Every point is under its roof** (within {sanity.MEASUREMENT_ERROR:.0%}); "
    f"{sum(r['cached (dropped)'] for r in serve_prefill_rows)} prefill request(s) reported "
    "cached prompt tokens and were left out."
    if not roof_violations else sanity.report(roof_violations)))

# %%
_b1 = serve_decode_rows[0]
_bmax = serve_decode_rows[-1]
_best_prefill = max(serve_prefill_rows, key=lambda r: r["prefill tok/s"])
_b1_bound = roofline.decode_bound_tokens_per_s(model_cfg, roof, 1, _b1["context"],
                                               weight_dtype=served_short)
ui.md(sanity.WITHHELD if roof_violations else
    f"**Batch 1** decoded at {_b1['tok/s total']:,.1f} tokens/s; the bandwidth bound "
    f"(weights / bandwidth) is {_b1_bound:,.0f} tokens/s, so the engine reached "
    f"**{_b1['tok/s total'] / _b1_bound:.0%} of it**. "
    f"**Batch {_bmax['batch']}** made {_bmax['tok/s total']:,.0f} tokens/s in total, "
    f"{_bmax['tok/s total'] / _b1['tok/s total']:.1f}x batch 1, while each request got "
    f"{_bmax['tok/s per request']:,.1f} tokens/s: batching moves the point right (more FLOPs "
    f"per byte) and up. **Prefill** of {_best_prefill['prompt tokens']:,} tokens ran at "
    f"{_best_prefill['prefill tok/s']:,.0f} tokens/s, "
    f"{_best_prefill['prefill tok/s'] / _b1['tok/s total']:.0f}x the batch-1 decode rate, "
    f"because each weight read serves every prompt token."
)

# %% [markdown]
# **Reading the gap.** On a GPU running a 7B model, batch-1 decode is usually reported close
# to the bandwidth roof: the weights are gigabytes, and streaming them dominates the step. With
# a small model on a CPU the weights stream in a few milliseconds, so the fixed cost of a step
# (launching ~30 layers x a dozen operators, the scheduler, sampling, streaming the token
# back) can be comparable or larger. What this run measured:

# %%
_bound = roofline.decode_bound_tokens_per_s(model_cfg, roof, 1,
                                            serve_decode_rows[0]["context"],
                                            weight_dtype=served_short)
_frac = serve_decode_rows[0]["tok/s total"] / _bound
_weights_ms = 1e3 / _bound
ui.md(sanity.WITHHELD if roof_violations else
    f"Batch-1 decode through the server reached **{_frac:.0%}** of the bandwidth bound; streaming "
    f"the weights and KV once takes {_weights_ms:.1f} ms at the measured bandwidth, and a served "
    f"token took {1e3 / serve_decode_rows[0]['tok/s total']:.1f} ms. "
    + ("So most of each step here is not weight streaming: it is the fixed per-step cost above "
       "(compare the in-process KV-cached step in section 2 to see how much of it is the model "
       "code and how much the serving stack)." if _frac < 0.5 else
       "So this run is close to the GPU picture: weight streaming is most of each step, and the "
       "fixed per-step cost is a minor part.")
    + (" Prefill points well below the compute roof at high intensity mean the same for prefill: "
       "the matmuls are not the only work."))

# %% [markdown]
# ## 5. The same picture for common GPUs
#
# No GPU is measured here: the roofs come from datasheet peaks (dense bf16 tensor FLOP/s and
# memory bandwidth, sources in `workshop/data/gpus.json` and at the end of notebook 2), and the
# points are the roofline's *predictions* for the model you pick, in bf16 - the attainable
# speed at each intensity, not a measurement. (In Jupyter, re-run the cells below after
# changing the model.)

# %%
gpu_model_choice = ui.dropdown(kvcache.list_models(), "llama-3.1-8b", "model")
gpu_model_choice

# %%
gpu_catalogue = capacity.load_gpus()
gpu_names = ["L4", "A100-80GB", "H100-SXM", "MI300X"]
gpu_machines = [roofline.Machine(n, gpu_catalogue[n].bandwidth_bytes_s, gpu_catalogue[n].flops,
                                 "datasheet") for n in gpu_names]
gpu_cfg = kvcache.load_model(gpu_model_choice.value)
gpu_points = {}
for _m in gpu_machines:
    _pts = []
    for _b in (1, 8, 64, 256):
        _i = roofline.decode_intensity(gpu_cfg, _b, 1024)
        _pts.append(roofline.Point(f"decode b={_b}", _i,
                                   float(roofline.attainable_flops(_i, _m.flops, _m.bandwidth)), 0.0))
    _i = roofline.prefill_intensity(gpu_cfg, 2048)
    _pts.append(roofline.Point("prefill 2048", _i,
                               float(roofline.attainable_flops(_i, _m.flops, _m.bandwidth)), 0.0))
    gpu_points[_m.name] = _pts
roofline_plots.roofline_figure(
    f"{gpu_cfg.name}, bf16, 1,024-token context: predicted (datasheet roofs)",
    gpu_machines + [roof], gpu_points, (0.3, 3000))

# %%
ui.table([{"GPU": _m.name, "ridge (FLOP/byte)": round(_m.ridge),
           "batch-1 decode bound (tok/s)": round(
               roofline.decode_bound_tokens_per_s(gpu_cfg, _m, 1, 1024), 1),
           "batch-64 decode bound (tok/s, total)": round(
               roofline.decode_bound_tokens_per_s(gpu_cfg, _m, 64, 1024)),
           **{f"compute-bound from batch ({_c:,}-token context)": next(
               (b for b in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048)
                if roofline.decode_intensity(gpu_cfg, b, _c) >= _m.ridge),
               "never: KV reads dominate") for _c in (128, 4096)}}
          for _m in gpu_machines])

# %%
_h100 = next(_m for _m in gpu_machines if _m.name == "H100-SXM")
_bf16_bound = roofline.decode_bound_tokens_per_s(gpu_cfg, _h100, 1, 1024, "bf16")
_int4_bound = roofline.decode_bound_tokens_per_s(gpu_cfg, _h100, 1, 1024, "int4")
_ridges = [_m.ridge for _m in gpu_machines]
ui.md(
    f"For {gpu_cfg.name}, GPU ridge points sit between {min(_ridges):,.0f} and "
    f"{max(_ridges):,.0f} FLOP per byte, so (table above) decoding stays memory-bound until "
    f"the batch reaches the listed size, and with long contexts the per-sequence KV reads "
    f"(which batching does not share) can keep it memory-bound at any batch size. That is why "
    f"serving engines batch as many requests as the KV cache allows (notebook 2). The same "
    f"arithmetic says int4 weights would raise the batch-1 decode **bound** on an H100 from "
    f"{_bf16_bound:,.0f} to {_int4_bound:,.0f} tokens/s ({_int4_bound / _bf16_bound:.1f}x): a "
    f"bound, reached only by kernels that compute on the packed weights. Notebook 4 measures "
    f"what quantization does to speed on this machine."
)

# %% [markdown]
# ## Predict, then measure
#
# **Exercise 2 (predict, then measure).** The decode sweep stopped at the batch printed below.
# How many tokens per second **in total** will the server make with **twice** that many
# requests decoding together? Reason from how the step time (TPOT) grew across the sweep.

# %%
exercise_batch = 2 * decode_batches[-1]
ui.md(f"Twice the sweep's largest batch: **{exercise_batch} requests** at once.")

# %%
predict_batch_tok_s = None       # your prediction in tokens/s (all requests), e.g. 120.0

# %%
exercise_decode = roofline_measure.serve_decode(session, exercise_batch, decode_input,
                                                decode_output)
ui.compare(predict_batch_tok_s, exercise_decode["tok/s total"],
           f"decode rate at batch {exercise_batch} (all requests)", "tokens/s")

# %%
# Worked answer to Exercise 2, collapsed until opened
# A step costs a fixed part plus a part per sequence in it: fit step = fixed + per x batch.
_per, _fixed = np.polyfit([r["batch"] for r in serve_decode_rows],
                          [r["TPOT ms (median)"] for r in serve_decode_rows], 1)
_step = _fixed + _per * exercise_batch
_line_rate = exercise_batch * 1e3 / _step
_bound = roofline.decode_bound_tokens_per_s(model_cfg, roof, exercise_batch,
                                            serve_decode_rows[0]["context"],
                                            weight_dtype=served_short)
_got = exercise_decode["tok/s total"]
ui.worked_answer(
    f"A decode step serves every request in the batch at once, so its time (TPOT) is the "
    f"whole step. A straight line through the sweep's step times, **{_fixed:.1f} ms + "
    f"{_per:.2f} ms per request**"
    + ("" if _fixed >= 0 and _per >= 0 else
       " (a negative part is impossible: the sweep's points were disturbed, re-run it)")
    + f", predicts {_step:.1f} ms at {exercise_batch} requests: "
    f"{exercise_batch} x 1000 / {_step:.1f} = **{_line_rate:,.0f} tokens/s**. The roof allows "
    f"at most {_bound:,.0f} at that batch. Measured: **{_got:,.0f} tokens/s**, "
    f"{_got / _line_rate:.2f}x the line's forecast"
    + (": the line held beyond the sweep." if abs(_got / _line_rate - 1) <= sanity.MEASUREMENT_ERROR
       else f": beyond the sweep the step time did not follow the line "
            f"({exercise_decode['TPOT ms (median)']:.1f} ms measured against {_step:.1f}), so "
            "the per-request cost changes with the batch here; a sweep with more points "
            "(full mode) fits it better.")
)

# %% [markdown]
# **Exercise 3 (predict, then measure).** From the prefill sweep above: how long (ms) will the
# first token of a **768-token** prompt take, one request alone, cold?

# %%
predict_ttft_768_ms = None       # your prediction in milliseconds

# %%
exercise_prefill = roofline_measure.cold_prefill(session, 768, repeats=sweep(2, 1))
ui.compare(predict_ttft_768_ms, exercise_prefill["TTFT ms (median)"],
           "time to first token, 768-token prompt", "ms")

# %%
# Worked answer to Exercise 3, collapsed until opened
_per_token, _fixed_ms = np.polyfit([r["prompt tokens"] for r in serve_prefill_rows],
                                   [r["TTFT ms (median)"] for r in serve_prefill_rows], 1)
_line_ms = _fixed_ms + _per_token * 768
_best = max(serve_prefill_rows, key=lambda r: r["prefill tok/s"])
_got_ms = exercise_prefill["TTFT ms (median)"]
# FLOPs per prompt token at 768 against the sweep's best prompt: attention grows with the prompt
_flops_ratio = ((roofline.prefill_flops(model_cfg, 768) / 768)
                / (roofline.prefill_flops(model_cfg, _best["prompt tokens"]) / _best["prompt tokens"]))
ui.worked_answer(
    f"Dividing by the best prefill rate alone, 768 / {_best['prefill tok/s']:,.0f} tokens/s = "
    f"{768e3 / _best['prefill tok/s']:.0f} ms, treats the whole TTFT as proportional to the "
    f"prompt. A straight line through the sweep separates the parts: **{_fixed_ms:.0f} ms + "
    f"{_per_token:.2f} ms per token**, so {_line_ms:.0f} ms at 768 tokens"
    + (". " if _fixed_ms >= 0 else
       f" - but no request has a negative fixed part, so this run's sweep points were disturbed "
       f"and the line is not to be trusted; re-run the sweep. ")
    + f"Attention adds a "
    f"little more per token as the prompt grows ({_flops_ratio:.2f}x "
    f"the FLOPs per token of the {_best['prompt tokens']}-token prompt). Measured: "
    f"**{_got_ms:.0f} ms**, {_got_ms / _line_ms:.2f}x the line."
)

# %% [markdown]
# ## What the real engines do
#
# * They compute logits only where a token will be sampled (the last prompt position), and
#   fuse small operators so that a decode step is a handful of large kernels rather than
#   hundreds of small ones; vLLM captures CUDA graphs on GPUs to cut the launch cost of each step.
# * They split long prompts into chunks (*chunked prefill*) and schedule them in the same step
#   as other requests' decode tokens, so the memory-bound decode and the compute-bound prefill
#   share each pass over the weights.
# * On CPUs, vLLM routes linear layers to oneDNN where the hardware supports the dtype (AMX or
#   AVX-512 bf16) and falls back to PyTorch's kernels otherwise; the roof of this notebook is
#   measured with the kernel the dtype actually gets.
