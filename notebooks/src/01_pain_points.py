# %% [markdown]
# # 1 · Pain points: memory, waiting, and one-at-a-time serving
#
# [![Open in Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/{{github_repo}}/blob/main/notebooks/01_pain_points.ipynb)
# [![Open in molab](https://marimo.io/molab-shield.svg)](https://molab.marimo.io/github/{{github_repo}}/blob/main/notebooks/01_pain_points.py)
#
# Notebook 0 timed one request on an idle server. Real servers are never that comfortable. This
# notebook measures, live, the three problems every inference engine is built around:
#
# 1. **memory** — each token of each running conversation keeps a slice of GPU (here: CPU)
#    memory busy, the *KV cache*, so memory grows with context length *and* with users;
# 2. **waiting** — the whole prompt is processed before the first token appears, so time to
#    first token grows with the prompt;
# 3. **one at a time is slow** — a naive server answers one request after another; an engine
#    that batches many requests into each model step serves far more tokens per second.
#
# Every number comes from requests sent in this run. `WORKSHOP_QUICK=1` makes the sweeps short.

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
# ## 1. Memory grows with context
#
# To produce token *n+1* the model attends to every earlier token. Recomputing their keys and
# values at every step would be wasteful, so the engine keeps them: for every token, every
# layer stores one key vector and one value vector per **KV head**. Hence
#
# $$\text{bytes per token} = 2 \times \text{layers} \times \text{KV heads} \times \text{head dim} \times \text{bytes per number}$$
#
# Models with grouped-query attention (GQA) share each KV head between several query heads,
# which is why the formula uses KV heads, not attention heads. Here are the terms for the model
# this server runs, read from its `config.json`:

# %%
from workshop import ui
from workshop.live import engine_comparison, kv_usage, live_requests, prompt_latency
from workshop.sizing import capacity, kvcache

kv = kv_usage.server_kv(session)
_a = kv.arch
kv_bytes = 2 * _a.num_layers * _a.num_kv_heads * _a.head_dim * kv.dtype_bytes   # the formula above
ui.md(f"2 (K and V) x {_a.num_layers} layers x {_a.num_kv_heads} KV heads x {_a.head_dim} dims x "
      f"{kv.dtype_bytes:g} bytes ({kv.dtype}) = **{kv_bytes:,.0f} bytes per token**. The model "
      f"has {_a.num_heads} attention heads but {_a.num_kv_heads} KV heads; counting the "
      f"former would overstate the cache {_a.num_heads / _a.num_kv_heads:.0f}x.")

# %% [markdown]
# **Is the formula right?** The server's own bytes-per-token figure uses this same formula, so
# agreeing with it proves nothing. vLLM gives an independent check: it cuts a KV budget in
# bytes into whole blocks sized from its own tensor shapes, and publishes both in `/metrics`
# (`vllm:cache_config_info`). If the formula is right, *budget / (block size x bytes per
# token)*, rounded down, is its block count. (SGLang publishes no such figure: no check.)

# %%
engine_cache = kvcache.engine_cache_config(session.metrics_text())
kv_check = kvcache.engine_check(kv.arch, engine_cache, session.info)
if kv_check.get("kv_memory_bytes") is not None:
    _engine_bytes = kv_check["kv_memory_bytes"] / (kv_check["engine_blocks"] * kv_check["block_size"])
    kv_check_text = (
        f"The engine was given **{kv_check['kv_memory_bytes']:,} bytes** and made "
        f"**{kv_check['engine_blocks']:,} blocks** of {kv_check['block_size']} tokens "
        f"({_engine_bytes:,.1f} bytes per token of budget, the remainder of the last block "
        f"included). The formula predicts **{kv_check['predicted_blocks']:,} blocks**: "
        + ("**they agree exactly**." if kv_check["agrees"] else
           f"**they differ** by {kv_check['engine_blocks'] - kv_check['predicted_blocks']:+,} "
           "blocks: the engine stores something the formula does not count, or vice versa."))
elif kv_check.get("engine_blocks") is not None:
    kv_check_text = (
        f"This engine made {kv_check['engine_blocks']:,} blocks of {kv_check['block_size']} "
        "tokens but does not publish the byte budget it cut them from (on a GPU: what is left "
        "after the weights), so there is no independent figure to check the formula against.")
else:
    kv_check_text = (
        f"This {session.engine_name} server publishes no block count or KV byte budget of its "
        "own (`vllm:cache_config_info`), so there is no engine figure to check the formula "
        "against: check skipped.")
ui.md(kv_check_text + f" Capacity: {kv.capacity_tokens:,} tokens in blocks of "
      f"{kv.block_size} token{'s' if kv.block_size != 1 else ''}.")

# %% [markdown]
# Now let the engine show it: one request at a time, a growing prompt, a fixed number of output
# tokens (`ignore_eos`, so the model cannot stop early). A background thread polls `/metrics`
# for `vllm:kv_cache_usage_perc`, the fraction of KV blocks in use, *during* the request (its
# blocks are free again once it ends) and keeps the peak. The prediction counts whole blocks:
# one token more than a block holds takes two blocks. vLLM keeps one block aside and reports
# usage against the rest, and so does the prediction. The MiB column is **derived** from the
# gauge, so compare the usage columns.

# %%
maker = live_requests.PromptMaker(session.model, session.info.get("model_path"))
max_len = int(session.info.get("max_model_len") or 2048)
kv_out_tokens = workshop.session.sweep(64, 32)
context_lengths = workshop.session.sweep(
    [64, 256, 512, 1024, 1536, max_len - kv_out_tokens - 8], [128, 384, 768])
context_rows = kv_usage.context_sweep(session, kv, maker, context_lengths, kv_out_tokens,
                                      progress=ui.progress)
ui.table(context_rows)

# %%
context_plot = kv_usage.plot_kv(context_rows, "tokens held",
                                "KV cache of one request grows with its context",
                                "tokens the request holds (prompt + generated)", kv=kv)
context_plot

# %%
_last = context_rows[-1]
# How many tokens each reading fell short of the prediction (the gauge in tokens).
_gauge_tokens = kv_usage.usable_blocks(kv.capacity_tokens, kv.block_size) * kv.block_size
_short = [(_r["predicted usage (%)"] - _r["measured usage (%)"]) / 100 * _gauge_tokens
          for _r in context_rows if _r["samples"]]
_trail = min(_short) if _short else 0.0
ui.md(
    f"At {_last['tokens held']:,} tokens one request occupied "
    f"**{_last['measured usage (%)']:.2f}%** of this engine's cache by its own gauge (the "
    f"formula predicts {_last['predicted usage (%)']:.2f}%), i.e. about "
    f"{_last['KV in use (MiB, derived)']:.1f} MiB. "
    "The `samples` column counts the `/metrics` readings taken while the request ran; with zero "
    "the request was over before a reading caught it, so its measured value is 0."
    + (f" Every peak here is at least **{_trail:.0f} tokens** short of the prediction. "
       + ("SGLang refreshes its gauges at each prefill and every `--decode-log-interval` decode "
          "steps (40 by default, 1 as the reference server starts it), so a request's last "
          "tokens can go uncounted before it ends; this run does not check that this is the "
          "shortfall." if session.engine == "sglang" else
          "This run does not measure why.")
       if _trail >= 2 * kv.block_size else "")
)

# %% [markdown]
# ## 2. Memory grows with users
#
# Every conversation in flight needs its own KV blocks (different prompts share nothing; prefix
# caching, later in the course, is about the prompts that do). So memory also grows with the
# number of users served at once, and when the blocks run out new requests must **wait** in the
# queue (`vllm:num_requests_waiting`).
#
# **Exercise 1 (predict, then measure).** Three users at once, each with a **300-token** prompt
# and the same number of output tokens as in section 1 (printed below): what peak share (%) of
# this engine's KV cache will the usage gauge show? Count blocks, not tokens.

# %%
ui.md(f"Output tokens per user: **{kv_out_tokens}**; blocks of **{kv.block_size} tokens**; "
      f"capacity **{kv.capacity_tokens:,} tokens**.")

# %%
my_three_users_pct = None    # your prediction in percent, e.g. 5

# %%
exercise_users = kv_usage.users_sweep(session, kv, maker, [3], 300, kv_out_tokens)
ui.compare(my_three_users_pct, exercise_users[0]["measured usage (%)"],
           f"peak KV usage, 3 users x (300 + {kv_out_tokens}) tokens", "%")

# %%
# Worked answer to Exercise 1, collapsed until opened
_per_user = 300 + kv_out_tokens
_blocks = kv_usage.blocks_for(_per_user, kv.block_size)
_usable = kv_usage.usable_blocks(kv.capacity_tokens, kv.block_size)
_row = exercise_users[0]
_seen = _row["measured usage (%)"] / 100 * _usable
ui.worked_answer(
    f"Each user holds 300 + {kv_out_tokens} = {_per_user} tokens at its end, "
    f"⌈{_per_user} / {kv.block_size}⌉ = {_blocks} blocks; three users {3 * _blocks} blocks, "
    f"out of {kv.capacity_tokens:,} / {kv.block_size} − 1 = {_usable:,} usable blocks: "
    f"**{100 * 3 * _blocks / _usable:.2f}%**. The prompts the server counted held "
    f"{_row['tokens held']:,} tokens in all (prediction from them: "
    f"{_row['predicted usage (%)']:.2f}%). The gauge peaked at "
    f"**{_row['measured usage (%)']:.2f}%**, {_seen:.0f} blocks, read {_row['samples']} times "
    "while the requests ran"
    + (": the formula's count to within a block." if abs(_seen - 3 * _blocks) <= 1.5 else
       f": {3 * _blocks - _seen:.0f} blocks short. A reading sees the blocks held at that "
       f"moment, and no reading, 50 ms apart, caught all {3 * _blocks} held at once."
       if _seen < 3 * _blocks else
       f": {_seen - 3 * _blocks:.0f} blocks more than the formula counts; this run does not "
       "show what they held.")
)

# %% [markdown]
# Now a growing number of users. Choose how long each user's prompt is; the next cell sends
# that many tokens per user for each number of simultaneous users.

# %% [markdown] tags=["jupyter-only"]
# *In Jupyter, moving the slider re-runs nothing by itself: run the cell after the slider again.*

# %% [markdown] tags=["marimo-only"]
# *Moving the slider re-runs the sweep below (it takes a little while).*

# %%
user_prompt_tokens = ui.slider(64, max_len - 128, value=workshop.session.sweep(1024, 128),
                               step=64, label="prompt tokens per user")
user_prompt_tokens

# %%
user_counts = workshop.session.sweep([1, 4, 16, 32, 48], [1, 2, 4])
users_rows = kv_usage.users_sweep(session, kv, maker, user_counts, user_prompt_tokens.value,
                                  kv_out_tokens, progress=ui.progress)
ui.table(users_rows)

# %%
users_plot = kv_usage.plot_kv(users_rows, "users", "KV cache grows with simultaneous users",
                              "users sending a request at the same time",
                              capacity_mib=kv.usable_bytes / 2**20)
users_plot

# %%
_per_user = user_prompt_tokens.value + kv_out_tokens
_fit = kv_usage.users_until_full(_per_user, kv.block_size, kv.capacity_tokens)
_waited = max(_r["peak waiting"] for _r in users_rows)
_llama = kvcache.load_model("llama-3.1-8b")
_llama_bytes = kvcache.kv_bytes_per_token(_llama)
_h100 = capacity.load_gpus()["H100-SXM"]
_hundred = 100 * _llama_bytes * 8192
_room = _h100.memory_bytes - kvcache.weight_bytes(_llama, "bf16")
if _waited:
    _queue = (f"In the runs above up to {_waited} requests had to wait in the queue at once (held "
              "back by KV space or by the engine's per-step token budget). ")
elif max(user_counts) <= _fit:
    _queue = (f"The largest run above ({max(user_counts)} users) fits, and no request was seen "
              "waiting. ")
else:
    _queue = (f"The largest run above ({max(user_counts)} users) is more than that, yet no "
              "sample caught a request waiting: look at the `samples` column. ")
ui.md(
    f"Each user here holds about {_per_user:,} tokens = "
    f"{kv_usage.blocks_for(_per_user, kv.block_size)} blocks, so this engine fits **{_fit} such "
    f"users at once**. " + _queue
    + f"The model here is tiny. The same arithmetic for Llama 3.1 8B "
    f"([config]({_llama.source})): {_llama_bytes:,.0f} bytes per token, so a single "
    f"8,192-token conversation needs {_llama_bytes * 8192 / 2**30:.2f} GiB and 100 of them "
    f"{_hundred / 2**30:.0f} GiB, against {_room / 2**30:.0f} GiB left on an {_h100.name} "
    f"({_h100.memory_bytes / 2**30:.0f} GiB, [datasheet]({_h100.spec_source.split()[0]})) "
    f"after its bf16 weights: "
    + ("they do not fit on one GPU." if _hundred > _room else "they fit on one GPU.")
)

# %% [markdown]
# ## 3. Waiting grows with the prompt
#
# Before the first output token, the engine runs the whole prompt through the model (the
# *prefill*). A longer prompt is more work, so time to first token (TTFT) grows with it. We
# send single requests, nothing else running, with prompts up to the server's context limit,
# and reset the prefix cache before each so that nothing is reused. A request whose answer
# still reports prompt tokens served from the cache (`usage.prompt_tokens_details`) was not
# cold: it is left out and counted. The sweep is then checked (`workshop/sanity.py`): a longer
# prompt's first token must not come markedly sooner than a shorter one's.

# %%
from workshop import sanity

ttft_lengths = workshop.session.sweep(
    [32, 128, 256, 512, 768, 1024, 1536, max_len - 8], [64, 256, 512])
ttft_rows = prompt_latency.ttft_sweep(session, maker, ttft_lengths,
                                      repeats=workshop.session.sweep(2, 1), progress=ui.progress)
ttft_medians = prompt_latency.median_by_length(ttft_rows)
ttft_violations = (
    sanity.completed_some("cold requests of the prompt length sweep",
                          len(prompt_latency.cold(ttft_rows)), len(ttft_rows))
    + sanity.grows_with("time to first token (ms, median) against prompt tokens",
                        [_n for _n, _ in ttft_medians], [_ms for _, _ms in ttft_medians]))
ttft_plot = prompt_latency.plot_ttft(ttft_rows, max_len)
ttft_plot

# %%
_line = prompt_latency.ttft_slope(ttft_rows)
_cached = prompt_latency.cached_count(ttft_rows)
ui.md(
    sanity.report(ttft_violations) + "\n\n" + sanity.WITHHELD if ttft_violations else
    "Not enough lengths to fit a line." if _line is None else
    f"Each extra 1,000 prompt tokens cost about **{_line[0]:.0f} ms** of waiting on this machine "
    "(a straight-line fit through the cold requests above). A chat application that "
    "resends the whole conversation every turn pays this again and again, which is what "
    "prefix caching, later in the course, avoids."
    + (f" {_cached} of {len(ttft_rows)} requests reported prompt tokens served from the prefix "
       "cache despite the reset before them, and were left out." if _cached else "")
)

# %% [markdown]
# **Exercise 2 (predict, then measure).** From the sweep above: how long (ms) will the first
# token of a **600-token** prompt take, one request alone, nothing cached?

# %%
my_ttft_600_ms = None    # your prediction in milliseconds, e.g. 200

# %%
exercise_ttft = prompt_latency.ttft_sweep(session, maker, [600], repeats=2)
exercise_600 = prompt_latency.median_by_length(exercise_ttft)
ui.compare(my_ttft_600_ms, exercise_600[0][1] if exercise_600 else float("nan"),
           "TTFT of a 600-token prompt (cold requests only)", "ms")

# %%
# Worked answer to Exercise 2, collapsed until opened
_n, _got = exercise_600[0] if exercise_600 else (600, float("nan"))
_line = prompt_latency.ttft_slope(ttft_rows)
_on_line = (lambda n: _line[1] + _line[0] * n / 1000) if _line else None
_off = (max(abs(_r["TTFT (ms)"] - _on_line(_r["prompt tokens"]))
            for _r in prompt_latency.cold(ttft_rows)) if _line else None)
ui.worked_answer(
    "TTFT is a fixed part (the request's round trip, scheduling) plus the prefill, which grows "
    "with the prompt. "
    + (f"The sweep's straight line is {_line[1]:.0f} ms + {_line[0]:.0f} ms per 1,000 tokens; "
       f"the server counted {_n} prompt tokens, so {_line[1]:.0f} + {_n / 1000:.3f} x "
       f"{_line[0]:.0f} = **{_on_line(_n):.0f} ms**"
       + ("" if _line[1] >= 0 else " (its fixed part is negative, which no request can have: "
          "the sweep's points were disturbed, re-run it)")
       + f". Measured: **{_got:.0f} ms**, {_got / _on_line(_n):.2f}x the line. The sweep's own "
       f"cold requests lie up to {_off:.0f} ms from it; the exercise's median lies "
       f"{abs(_got - _on_line(_n)):.0f} ms from it, "
       + ("no farther" if abs(_got - _on_line(_n)) <= _off else "farther than any of them")
       + " (its cold requests: "
       + ", ".join(f"{_r['TTFT (ms)']:.0f}" for _r in prompt_latency.cold(exercise_ttft))
       + " ms)."
       if _line else f"The sweep has too few lengths to fit a line; measured: **{_got:.0f} ms**.")
)

# %% [markdown]
# ## 4. One at a time is slow — but by how much, and why?
#
# A widely repeated comparison says a plain Hugging Face `generate` server manages a few dozen
# tokens per second while vLLM is more than ten times faster. Such comparisons usually set a
# **sequential** baseline (one request after another) against a **concurrent** engine (many
# requests batched into each model step), so the number mixes two different effects:
#
# * **the engine**: better kernels, a paged KV cache, less Python per token;
# * **batching**: one pass over the weights serves every running request at once.
#
# To separate them we send the *same* requests (same prompts, same lengths, `ignore_eos`) four
# ways: to the Hugging Face baseline (`--engine hf`, one request at a time by design) and to
# the engine the first cell connected to (vLLM unless `WORKSHOP_ENGINE` names another, e.g.
# SGLang), each first one after another, then many at once. The next cell connects to (or
# starts) the baseline server. The four runs take a few minutes without quick mode, mostly
# spent waiting for the baseline: that wait is the point.

# %%
hf_session = workshop.session.connect(engine="hf")

# %%
bench_requests = workshop.session.sweep(16, 4)
bench_concurrency = workshop.session.sweep(16, 4)
bench_output = workshop.session.sweep(128, 16)
engine_rows = engine_comparison.compare_engines(
    {"hf": hf_session, session.engine: session}, bench_requests, bench_concurrency,
    input_len=128, output_len=bench_output)
ui.table(engine_rows)

# %%
engines_plot = engine_comparison.plot_throughput(engine_rows)
engines_plot

# %%
factors = {r["comparison"]: r["speed-up (x)"]
           for r in engine_comparison.factor_rows(engine_rows, bench_concurrency)}
_total = factors[f"total: {session.engine} concurrent vs hf sequential"]
_engine = factors["engine alone (both sequential)"]
_batching = factors[f"concurrency with batching ({session.engine})"]
_hf_conc = factors["concurrency without batching (hf)"]
_ttft = {(r["engine"], r["in flight"]): r["median TTFT (ms)"] for r in engine_rows}
# One request at a time by design: concurrency can only overlap its HTTP and tokenization with
# generation, which the 30 % allowed here more than covers.
hf_violations = sanity.within(
    f"the baseline's throughput with {bench_concurrency} requests in flight against one at a time",
    _hf_conc, 1.0, "x", "a one-at-a-time server sped up by concurrency", ("busy", "few"),
    error=0.3)
ui.md(
    sanity.report(hf_violations) + "\n\n" + sanity.WITHHELD if hf_violations else
    f"Measured here, {bench_requests} requests of 128 prompt + {bench_output} output tokens:\n\n"
    + ui.markdown_table([{"comparison": k, "speed-up": f"{v:.1f}x"} for k, v in factors.items()])
    + f"\n\nThe headline number, {session.engine_name} with {bench_concurrency} requests in "
    f"flight against the baseline one at a time, is **{_total:.1f}x**: the product of the "
    f"engine alone, both serving one request at a time (**{_engine:.1f}x**), and batching on "
    f"{session.engine_name} (**{_batching:.1f}x**). "
    + ("In this run **batching** contributed the larger factor. " if _batching > _engine else
       "In this run the **engine alone** contributed the larger factor, not batching. ")
    + f"Sending the baseline {bench_concurrency} requests at once changed its throughput "
    f"{_hf_conc:.2f}x while its median TTFT went from {_ttft[('hf', 1)]:.0f} to "
    f"{_ttft[('hf', bench_concurrency)]:.0f} ms: it serves them one after another, so they "
    "only wait longer."
)

# %% [markdown]
# ## What to remember
#
# * KV memory = tokens held x bytes per token, summed over every request in flight; the engine's
#   capacity in tokens is what bounds concurrency.
# * TTFT grows with the prompt; decode speed per user falls as more users share the machine.
# * "vLLM is N x faster" multiplies two effects, the engine and batching; section 4 measured
#   how large each one was on this machine. Batching needs many requests in flight and room in
#   the KV cache for all of them. The following notebooks open up each of these mechanisms.

# %% [markdown]
# ## What the real engines do
#
# * vLLM, SGLang and TensorRT-LLM all page the KV cache in fixed-size blocks, as measured here,
#   so memory is handed out per block rather than per maximum context.
# * They batch continuously: a request joins the running batch at the next step instead of
#   waiting for the batch to finish, and leaves as soon as it is done.
# * Long prompts are split into chunks (chunked prefill) so that one long prompt does not stall
#   every other user's next token; prefix caching reuses the KV blocks of a shared prompt
#   start instead of recomputing them.
