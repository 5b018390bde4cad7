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
app = marimo.App(width="medium", app_title="0 · Set-up and your first request")


@app.cell(hide_code=True)
def _():
    import marimo as mo

    return (mo,)


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    # 0 · Set-up and your first request

    [![Open in Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/llm-inference-workshop/llm-inference-workshop/blob/main/notebooks/00_setup_first_request.ipynb)
    [![Open in molab](https://marimo.io/molab-shield.svg)](https://molab.marimo.io/github/llm-inference-workshop/llm-inference-workshop/blob/main/notebooks/00_setup_first_request.py)

    Every notebook in this course talks to a real inference server over HTTP, exactly as an
    application would. This one checks that the server is there, asks it what it is, sends one
    chat request, and then times a streamed answer with a stopwatch of our own: **time to first
    token** (how long the user stares at nothing) and **tokens per second** (how fast the answer
    then scrolls). Every number below is measured on the machine you are running on.

    The first cell finds a server: the one named by `WORKSHOP_BASE_URL`, else one already running
    on `http://127.0.0.1:8000`, else it starts the course's reference server (vLLM with the small
    bundled model, SmolLM2-135M). On Colab it installs what is missing first, and on a GPU runtime
    it serves the Hugging Face model named by `WORKSHOP_MODEL`.
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
    ## Is it up, and what is it?

    An OpenAI-compatible server answers a few plain `GET` endpoints besides the API itself.
    `/health` says the process is alive, `/ready` that the engine has loaded the model and
    accepts work, `/v1/models` lists what you may put in the `"model"` field, and the reference
    server's `/server_info` describes the engine: its dtype, its maximum context, and how many
    tokens of KV cache it has room for (notebook 1 explains why that last number matters).
    """)
    return


@app.cell
def _(session):
    from workshop import probe, ui

    ui.table(probe.check_endpoints(session))
    return probe, ui


@app.cell
def _(probe, session, ui):
    ui.table(probe.info_rows(session.info))
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## A chat request

    The `openai` Python client works with any OpenAI-compatible server: point its `base_url` at
    the server's `/v1`. The request is a list of messages; the answer carries the generated
    message and a `usage` block that counts tokens. SmolLM2-135M is tiny, so expect short, plain
    answers: this course is about serving, not about the model's wit.
    """)
    return


@app.cell
def _(session):
    client = session.openai()
    reply = client.chat.completions.create(
        model=session.model,
        messages=[{"role": "user", "content": "What is the capital of France? Answer in one sentence."}],
        max_tokens=48,
        temperature=0.0,
    )
    print(reply.choices[0].message.content)
    print(reply.usage)
    return (client,)


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## Streaming, timed by hand

    With `stream=True` the server sends the answer as it is generated, a few characters per
    chunk. Two numbers describe what a user feels:

    * **TTFT**, time to first token: from sending the request to the first chunk with text. The
      server must read the whole prompt first (the *prefill*), so TTFT grows with the prompt.
    * **decode speed**: tokens per second after the first one. Each new token needs one more pass
      through the model (the *decode* step), so this is roughly constant for one request.

    Type your own prompt and pick a length; the next cell sends it.
    """)
    return


@app.cell
def _(ui):
    prompt = ui.text("Explain in three sentences why the sky is blue.", label="prompt")
    prompt
    return (prompt,)


@app.cell
def _(ui, workshop):
    max_tokens = ui.slider(16, 256, value=workshop.session.sweep(128, 32), step=16,
                           label="max_tokens")
    max_tokens
    return (max_tokens,)


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    The stopwatch is short enough to read in full: note the time of each chunk that carries text,
    and take the token count from the final `usage` chunk that `stream_options` asks for.
    """)
    return


@app.cell
def _(client, max_tokens, prompt, session):
    import time

    stream_start = time.perf_counter()
    chunk_times = []
    pieces = []
    usage = None
    for chunk in client.chat.completions.create(
        model=session.model,
        messages=[{"role": "user", "content": prompt.value}],
        max_tokens=max_tokens.value,
        stream=True,
        stream_options={"include_usage": True},
    ):
        if chunk.usage is not None:
            usage = chunk.usage
        if chunk.choices and chunk.choices[0].delta.content:
            chunk_times.append(time.perf_counter() - stream_start)
            pieces.append(chunk.choices[0].delta.content)
            print(chunk.choices[0].delta.content, end="", flush=True)
    stream_end = time.perf_counter() - stream_start
    print()
    return chunk_times, pieces, stream_end, usage


@app.cell
def _(chunk_times, probe, stream_end, ui, usage):
    first_token_ms = chunk_times[0] * 1000
    n_tokens = usage.completion_tokens if usage else len(chunk_times)
    tokens_per_s = probe.decode_rate(chunk_times, n_tokens, stream_end)
    ui.md(
        f"**Measured here:** first token after **{first_token_ms:.0f} ms**; then "
        f"{n_tokens} tokens in {stream_end:.2f} s, i.e. "
        + (f"**{tokens_per_s:.1f} tokens/s** after the first one " if tokens_per_s else
           "too few tokens to measure a speed (ask for a longer answer) ")
        + f"({n_tokens / stream_end:.1f} tokens/s counting the wait for the first). "
        f"The prompt was {usage.prompt_tokens if usage else '?'} tokens."
    )
    return (n_tokens,)


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    The same measurement as a picture: each step is a chunk arriving. The gap before the first
    step is TTFT; the slope after it is the decode speed.
    """)
    return


@app.cell
def _(chunk_times, n_tokens, pieces, probe, stream_end):
    stream_plot = probe.plot_stream(
        probe.StreamTiming(text="".join(pieces), chunk_times=chunk_times, end=stream_end,
                           completion_tokens=n_tokens))
    stream_plot
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## One measurement is not a measurement

    A single run is noisy: the first request after start-up is often slower, and on a laptop other
    programs compete for the cores. Repeat the same request a few times and look at the spread.
    `workshop.probe.stream_chat` is the stopwatch above, packaged. The repeats set `ignore_eos`, a
    vLLM extension that keeps generating past the model's end-of-text token, so every run produces
    exactly `max_tokens` tokens and the runs compare like for like.
    """)
    return


@app.cell
def _(client, max_tokens, probe, prompt, session, ui, workshop):
    repeat_runs = [
        probe.stream_chat(client, session.model,
                          [{"role": "user", "content": prompt.value}], max_tokens=max_tokens.value,
                          extra_body={"ignore_eos": True})
        for _ in ui.progress(range(workshop.session.sweep(8, 3)), title="repeating the request")
    ]
    repeat_summary = probe.summarize(repeat_runs)
    ui.table([{"run": _i + 1, "TTFT (ms)": _r.ttft * 1000, "output tokens": _r.tokens,
               "decode tokens/s": _r.decode_tokens_per_s, "total time (s)": _r.end}
              for _i, _r in enumerate(repeat_runs)], floatfmt=".1f")
    return repeat_runs, repeat_summary


@app.cell
def _(repeat_runs, repeat_summary, ui):
    ui.md(
        f"Over {len(repeat_runs)} runs the time to first token ranged from "
        f"{repeat_summary['ttft_ms_min']:.0f} to {repeat_summary['ttft_ms_max']:.0f} ms "
        f"(median {repeat_summary['ttft_ms_median']:.0f} ms) and the decode speed from "
        f"{repeat_summary['decode_tok_s_min']:.1f} to {repeat_summary['decode_tok_s_max']:.1f} "
        f"tokens/s. At the median speed a 300-token answer takes about "
        f"{300 / repeat_summary['decode_tok_s_median']:.0f} s to stream. Notebook 1 asks what "
        "happens to these numbers when prompts get long and when many users arrive at once."
    )
    return


if __name__ == "__main__":
    app.run()
