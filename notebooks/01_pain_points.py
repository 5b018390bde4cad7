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
    app_title="1 · Pain points: memory, waiting, and one-at-a-time serving",
)


@app.cell(hide_code=True)
def _():
    import marimo as mo

    return (mo,)


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    # 1 · Pain points: memory, waiting, and one-at-a-time serving

    [![Open in Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/llm-inference-workshop/llm-inference-workshop/blob/main/notebooks/01_pain_points.ipynb)
    [![Open in molab](https://marimo.io/molab-shield.svg)](https://molab.marimo.io/github/llm-inference-workshop/llm-inference-workshop/blob/main/notebooks/01_pain_points.py)

    Notebook 0 timed one request on an idle server. Real servers are never that comfortable. This
    notebook measures, live, the three problems every inference engine is built around:

    1. **memory** — each token of each running conversation keeps a slice of GPU (here: CPU)
       memory busy, the *KV cache*, so memory grows with context length *and* with users;
    2. **waiting** — the whole prompt is processed before the first token appears, so time to
       first token grows with the prompt;
    3. **one at a time is slow** — a naive server answers one request after another; an engine
       that batches many requests into each model step serves far more tokens per second.

    Every number comes from requests sent in this run. `WORKSHOP_QUICK=1` makes the sweeps short.
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
    ## 1. Memory grows with context

    To produce token *n+1* the model attends to every earlier token. Recomputing their keys and
    values at every step would be wasteful, so the engine keeps them: for every token, every
    layer stores one key vector and one value vector per **KV head**. Hence

    $$\text{bytes per token} = 2 \times \text{layers} \times \text{KV heads} \times \text{head dim} \times \text{bytes per number}$$

    Models with grouped-query attention (GQA) share each KV head between several query heads,
    which is why the formula uses KV heads, not attention heads. Here are the terms for the model
    this server runs, read from its `config.json`, next to what the server itself reports.
    """)
    return


@app.cell
def _(session):
    from workshop import kvcache, pain, ui

    kv = pain.server_kv(session)
    kv_bytes = kv.formula.bytes_per_token
    ui.md(
        f"**Formula:** {kv.formula.explain()}.  \n"
        + ("**Server reports:** no bytes-per-token figure." if kv.reported_bytes_per_token is None
           else f"**Server reports:** {kv.reported_bytes_per_token:,} bytes per token"
           + (" (they agree)." if kv.reported_bytes_per_token == kv_bytes else " (they differ!)."))
        + f"  \n**Capacity:** the engine set aside room for {kv.capacity_tokens:,} tokens, i.e. "
        f"{kv.capacity_bytes / 2**30:.2f} GiB, in blocks of {kv.block_size} tokens "
        f"({kv.capacity_tokens // kv.block_size} blocks). The model has "
        f"{kv.formula.attention_heads} attention heads but {kv.formula.kv_heads} KV heads; counting "
        f"the former would overstate the cache {kv.formula.attention_heads / kv.formula.kv_heads:.0f}x."
    )
    return kv, kvcache, pain, ui


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    Now let the engine show it. We send one request at a time with a growing prompt and ask for a
    fixed number of output tokens (`ignore_eos`, so the model cannot stop early). While it runs, a
    background thread polls `/metrics` for `vllm:kv_cache_usage_perc`, the fraction of KV blocks
    in use. That gauge is momentary: once the request finishes its blocks are free again, which
    is why we sample it *during* the request and keep the peak. The prediction is the formula
    applied to whole blocks: a request holding one token more than a block fits occupies two
    blocks. (vLLM also keeps one block aside and reports usage against the rest; the prediction
    does the same.)
    """)
    return


@app.cell
def _(kv, pain, session, ui, workshop):
    maker = pain.PromptMaker(session.model, session.info.get("model_path"))
    max_len = int(session.info.get("max_model_len") or 2048)
    kv_out_tokens = 64
    context_lengths = workshop.session.sweep(
        [64, 256, 512, 1024, 1536, max_len - kv_out_tokens - 8],
        [128, 1024, max_len - kv_out_tokens - 8])
    context_rows = pain.context_sweep(session, kv, maker, context_lengths, kv_out_tokens,
                                      progress=ui.progress)
    ui.table(context_rows)
    return context_rows, kv_out_tokens, maker, max_len


@app.cell
def _(context_rows, kv, pain):
    context_plot = pain.plot_kv(context_rows, "tokens held",
                                "KV cache of one request grows with its context",
                                "tokens the request holds (prompt + generated)", kv=kv)
    context_plot
    return


@app.cell
def _(context_rows, ui):
    _last = context_rows[-1]
    ui.md(
        f"At {_last['tokens held']:,} tokens one request held **{_last['measured KV (MiB)']:.1f} MiB** "
        f"of KV cache (the formula says {_last['predicted KV (MiB)']:.1f} MiB): "
        f"{_last['measured usage (%)']:.1f}% of this engine's cache. "
        "The `samples` column counts the `/metrics` readings taken while the request ran; with zero "
        "the request was over before a reading caught it, so its measured value is 0."
    )
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## 2. Memory grows with users

    Every conversation in flight needs its own KV blocks (different prompts share nothing; prefix
    caching, later in the course, is about the prompts that do). So memory also grows with the
    number of users served at once, and when the blocks run out new requests must **wait** in the
    queue (`vllm:num_requests_waiting`).
    Choose how long each user's prompt is; the next cell sends that many tokens per user for a
    growing number of simultaneous users.
    """)
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    *Moving the slider re-runs the sweep below (it takes a little while).*
    """)
    return


@app.cell
def _(max_len, ui, workshop):
    user_prompt_tokens = ui.slider(64, max_len - 128, value=workshop.session.sweep(1024, 256),
                                   step=64, label="prompt tokens per user")
    user_prompt_tokens
    return (user_prompt_tokens,)


@app.cell
def _(
    kv,
    kv_out_tokens,
    maker,
    pain,
    session,
    ui,
    user_prompt_tokens,
    workshop,
):
    user_counts = workshop.session.sweep([1, 4, 16, 32, 48], [1, 4, 8])
    users_rows = pain.users_sweep(session, kv, maker, user_counts, user_prompt_tokens.value,
                                  kv_out_tokens, progress=ui.progress)
    ui.table(users_rows)
    return user_counts, users_rows


@app.cell
def _(kv, pain, users_rows):
    users_plot = pain.plot_kv(users_rows, "users", "KV cache grows with simultaneous users",
                              "users sending a request at the same time",
                              capacity_mib=kv.usable_bytes / 2**20)
    users_plot
    return


@app.cell
def _(
    kv,
    kv_out_tokens,
    kvcache,
    pain,
    ui,
    user_counts,
    user_prompt_tokens,
    users_rows,
):
    _per_user = user_prompt_tokens.value + kv_out_tokens
    _fit = pain.users_until_full(_per_user, kv.block_size, kv.capacity_tokens)
    _waited = max(_r["peak waiting"] for _r in users_rows)
    _llama = kvcache.load_model("llama-3.1-8b")
    _llama_bytes = kvcache.kv_bytes_per_token(_llama)
    ui.md(
        f"Each user here holds about {_per_user:,} tokens = "
        f"{pain.blocks_for(_per_user, kv.block_size)} blocks, so this engine fits **{_fit} such users "
        f"at once**. "
        + (f"In the runs above up to {_waited} requests had to wait in the queue at once (held back "
           "by KV space or by the engine's per-step token budget). " if _waited else
           f"The largest run above ({max(user_counts)} users) stayed below that, so no request "
           "had to wait. ")
        + f"The model here is tiny. The same arithmetic for Llama 3.1 8B "
        f"([config]({_llama.source})): {_llama_bytes:,.0f} bytes per token, so a single "
        f"8,192-token conversation needs {_llama_bytes * 8192 / 2**30:.2f} GiB and 100 of them "
        f"{100 * _llama_bytes * 8192 / 2**30:.0f} GiB, more than one 80 GB GPU holds besides the "
        "weights. Memory, not arithmetic, usually caps how many users a GPU serves."
    )
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## 3. Waiting grows with the prompt

    Before the first output token, the engine runs the whole prompt through the model (the
    *prefill*). A longer prompt is more work, so time to first token (TTFT) grows with it. We
    send single requests, nothing else running, with prompts up to the server's context limit,
    and reset the prefix cache before each so that nothing is reused.
    """)
    return


@app.cell
def _(maker, max_len, pain, session, ui, workshop):
    ttft_lengths = workshop.session.sweep(
        [32, 128, 256, 512, 768, 1024, 1536, max_len - 8], [128, 1024, max_len - 8])
    ttft_rows = pain.ttft_sweep(session, maker, ttft_lengths, repeats=workshop.session.sweep(2, 1),
                                progress=ui.progress)
    ttft_plot = pain.plot_ttft(ttft_rows, max_len)
    ttft_plot
    return (ttft_rows,)


@app.cell
def _(pain, ttft_rows, ui):
    _line = pain.ttft_slope(ttft_rows)
    ui.md(
        "Not enough lengths to fit a line." if _line is None else
        f"Each extra 1,000 prompt tokens cost about **{_line[0]:.0f} ms** of waiting on this machine "
        "(a straight-line fit through the points above). A chat application that "
        "resends the whole conversation every turn pays this again and again, which is what "
        "prefix caching, later in the course, avoids."
    )
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## 4. One at a time is slow — but by how much, and why?

    A widely repeated comparison says a plain Hugging Face `generate` server manages a few dozen
    tokens per second while vLLM is more than ten times faster. Such comparisons usually set a
    **sequential** baseline (one request after another) against a **concurrent** engine (many
    requests batched into each model step), so the number mixes two different effects:

    * **the engine**: better kernels, a paged KV cache, less Python per token;
    * **batching**: one pass over the weights serves every running request at once.

    To separate them we send the *same* requests (same prompts, same lengths, `ignore_eos`) four
    ways: to the Hugging Face baseline (`--engine hf`, one request at a time by design) and to
    vLLM, each first one after another, then many at once. The next cell connects to (or starts)
    the baseline server. The four runs take a few minutes without quick mode, mostly spent
    waiting for the baseline: that wait is the point.
    """)
    return


@app.cell
def _(workshop):
    hf_session = workshop.session.connect(engine="hf")
    return (hf_session,)


@app.cell
def _(hf_session, pain, session, ui, workshop):
    bench_requests = workshop.session.sweep(16, 6)
    bench_concurrency = workshop.session.sweep(16, 6)
    bench_output = workshop.session.sweep(128, 24)
    engine_rows = pain.compare_engines({"hf": hf_session, "vllm": session}, bench_requests,
                                       bench_concurrency, input_len=128, output_len=bench_output)
    ui.table(engine_rows)
    return bench_concurrency, bench_output, bench_requests, engine_rows


@app.cell
def _(engine_rows, pain):
    engines_plot = pain.plot_throughput(engine_rows)
    engines_plot
    return


@app.cell
def _(bench_concurrency, bench_output, bench_requests, engine_rows, pain, ui):
    factors = {r["comparison"]: r["speed-up (x)"] for r in pain.factor_rows(engine_rows, bench_concurrency)}
    ui.md(
        f"Measured here, {bench_requests} requests of 128 prompt + {bench_output} output tokens:\n\n"
        + ui.markdown_table([{"comparison": k, "speed-up": f"{v:.1f}x"} for k, v in factors.items()])
        + "\n\n" + " ".join(pain.explain_factors(factors, engine_rows))
    )
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## What to remember

    * KV memory = tokens held x bytes per token, summed over every request in flight; the engine's
      capacity in tokens is what bounds concurrency.
    * TTFT grows with the prompt; decode speed per user falls as more users share the machine.
    * Most of "vLLM is N x faster" is batching, which needs many requests in flight and room in
      the KV cache for all of them. The following notebooks open up each of these mechanisms.
    """)
    return


if __name__ == "__main__":
    app.run()
