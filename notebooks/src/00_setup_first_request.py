# %% [markdown]
# # 0 · Set-up and your first request
#
# [![Open in Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/{{github_repo}}/blob/main/notebooks/00_setup_first_request.ipynb)
# [![Open in molab](https://marimo.io/molab-shield.svg)](https://molab.marimo.io/github/{{github_repo}}/blob/main/notebooks/00_setup_first_request.py)
#
# Every notebook in this course talks to a real inference server over HTTP, exactly as an
# application would. This one checks that the server is there, asks it what it is, sends one
# chat request, and then times a streamed answer with a stopwatch of our own: **time to first
# token** (how long the user stares at nothing) and **tokens per second** (how fast the answer
# then scrolls). Every number below is measured on the machine you are running on.
#
# The first cell finds a server for the engine named by `WORKSHOP_ENGINE` (`vllm` by default,
# or `sglang`): the one at `WORKSHOP_BASE_URL` (SGLang: `WORKSHOP_SGLANG_BASE_URL`), else one
# on the engine's port (vLLM `:8000`, SGLang `:8002`), else it starts the course's reference
# server with the small bundled model, SmolLM2-135M (on a GPU runtime: the model named by
# `WORKSHOP_MODEL`). A part that needs a feature the server lacks says so and skips.

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
# ## Is it up, and what is it?
#
# An OpenAI-compatible server answers a few plain `GET` endpoints besides the API itself.
# `/health` says the process is alive, `/ready` that the engine has loaded the model and
# accepts work, `/v1/models` lists what you may put in the `"model"` field, and the reference
# server's `/server_info` describes the engine: its dtype, its maximum context, and how many
# tokens of KV cache it has room for (notebook 1 explains why that last number matters).

# %%
from workshop import ui
from workshop.live import probe

ui.table(probe.check_endpoints(session))

# %%
ui.table(probe.info_rows(session.info))

# %% [markdown]
# ## A chat request
#
# The `openai` Python client works with any OpenAI-compatible server: point its `base_url` at
# the server's `/v1`. The request is a list of messages; the answer carries the generated
# message and a `usage` block that counts tokens. SmolLM2-135M is tiny, so expect short, plain
# answers: this course is about serving, not about the model's wit.

# %%
client = session.openai()
reply = client.chat.completions.create(
    model=session.model,
    messages=[{"role": "user", "content": "What is the capital of France? Answer in one sentence."}],
    max_tokens=48,
    temperature=0.0,
)
print(reply.choices[0].message.content)
print(reply.usage)

# %% [markdown]
# ## How one token is produced
#
# The model never sees text. The server first cuts the prompt into **tokens**, pieces of text
# from a fixed vocabulary, each known by an integer id. Then, to produce one new token:
#
# 1. every token id picks one row of the **embedding** table: a vector of numbers per token;
# 2. the vectors go through the model's **layers**. In each one, every position computes a
#    query (Q), a key (K) and a value (V); attention lets a position take in the values of the
#    positions before it, weighted by how well its query matches their keys; a small MLP follows;
# 3. the vector at the last position is scored against every entry of the vocabulary: one
#    number, a **logit**, per possible next token;
# 4. softmax turns the logits into probabilities and **sampling** picks one (greedy decoding
#    simply takes the most likely);
# 5. the chosen id is appended to the input, and everything starts again for the next token.
#
# The sizes of each stage, for the model this server runs, read from its `config.json`:

# %%
import math
import time

from reference_server.model_config import read_arch
from workshop.live import next_token

# The server does not expose its tokenizer over HTTP; load the same tokenizer files it loaded.
tokenizer = next_token.load_tokenizer(session)
served_arch = read_arch(tokenizer.name_or_path)
ui.md(
    f"**{session.model}**: the embedding table has {served_arch.vocab_size:,} rows (one per "
    f"token id) of {served_arch.hidden_size} numbers; {served_arch.num_layers} layers, each "
    f"with {served_arch.num_heads} query heads and {served_arch.num_kv_heads} key/value heads "
    f"of {served_arch.head_dim} numbers; the last step yields {served_arch.vocab_size:,} logits, "
    f"one per token of the vocabulary, for every token generated."
)

# %% [markdown]
# Type a short prompt; the next cells tokenize it, ask the live server which token comes
# next, and then generate a few tokens one request at a time.

# %%
token_prompt = ui.text("The capital of France is", label="prompt to continue")
token_prompt

# %% [markdown]
# The token ids below come from the tokenizer files (␣ marks a space, which belongs to the
# token that follows it); the request sends the prompt as *text*, so the `usage` the server
# returns is its own, independent count. `logprobs: 5` asks for the log-probabilities of the
# five most likely next tokens, computed from the raw logits, before temperature or top-p
# (vLLM's default; SGLang's for greedy requests such as these); `exp(logprob)` is the
# probability.

# %%
token_prompt_ids = tokenizer.encode(token_prompt.value)
first_step = client.completions.create(model=session.model, prompt=token_prompt.value,
                                       max_tokens=1, temperature=0.0, logprobs=5)
ui.table(next_token.token_rows(tokenizer, token_prompt_ids))

# %%
ui.md(
    f"The tokenizer here cut the prompt into **{len(token_prompt_ids)} tokens**; the server "
    f"counted **{first_step.usage.prompt_tokens}**: "
    + ("the same." if first_step.usage.prompt_tokens == len(token_prompt_ids) else
       "a different count, so the tokenizer loaded here is not the one the server uses "
       "(or the server adds special tokens); the ids below are this tokenizer's.")
)

# %%
first_top = next_token.top_probabilities(first_step.choices[0].logprobs.top_logprobs[0])
next_token.plot_top_probabilities(first_top, token_prompt.value)

# %% [markdown]
# **Exercise 1 (predict, then measure).** How many tokens will the server count in this
# sentence, sent as a prompt? *Tokenizers split rare words such as
# antidisestablishmentarianism into several pieces.* (The token table above shows how words,
# spaces and punctuation were cut.)

# %%
my_sentence_tokens = None    # your prediction: a number of tokens, e.g. 12

# %%
exercise_sentence = ("Tokenizers split rare words such as antidisestablishmentarianism into "
                     "several pieces.")
exercise_count = client.completions.create(model=session.model, prompt=exercise_sentence,
                                           max_tokens=1, temperature=0.0)
ui.compare(my_sentence_tokens, exercise_count.usage.prompt_tokens, "tokens in the sentence",
           "tokens")

# %%
# Worked answer to Exercise 1, collapsed until opened
import re

# Each word alone, with the space before it (the first has none), through the same tokenizer.
_words = re.findall(r"\w+|[^\w\s]", exercise_sentence)
_cut = [(_w, tokenizer.encode(("" if _i == 0 or not _w.isalnum() else " ") + _w,
                              add_special_tokens=False)) for _i, _w in enumerate(_words)]
_expected = sum(len(_ids) for _, _ids in _cut)
_whole = len(tokenizer.encode(exercise_sentence))
_served = exercise_count.usage.prompt_tokens
ui.worked_answer(
    f"A first guess: one token per word or punctuation mark, **{len(_words)}**. The vocabulary "
    f"({len(tokenizer):,} entries here) holds common words whole, each with the space before "
    f"it; a word it lacks is cut into pieces it has: "
    + "; ".join(f"*{_w}* → " + " | ".join(next_token.shown(tokenizer.decode([_t])) for _t in _ids)
                for _w, _ids in _cut if len(_ids) > 1)
    + f". That adds {_expected - len(_words)}: **{_expected} tokens expected**. The tokenizer "
    f"loaded here, special tokens included, counts the whole sentence as {_whole}; the server "
    f"counted **{_served}**"
    + (": the same." if _served == _whole else
       f", {_served - _whole:+d}: the server does not cut text the way the tokenizer loaded "
       "here does.")
)

# %% [markdown]
# Now the loop itself, made visible. Each request below sends the prompt **as token ids**,
# asks for exactly one token (greedy, `temperature=0`), and the cell appends the chosen id to
# the prompt for the next request. `logprobs` gives the chosen token's probability.

# %%
loop_ids = list(token_prompt_ids)
loop_rows = []
for _step in range(workshop.session.sweep(8, 4)):
    _start = time.perf_counter()
    _r = client.completions.create(model=session.model, prompt=loop_ids, max_tokens=1,
                                   temperature=0.0, logprobs=5)
    _ms = (time.perf_counter() - _start) * 1000
    _choice = _r.choices[0]
    _id = next_token.piece_id(tokenizer, _choice.text) if _choice.text else None
    loop_rows.append({"step": _step + 1, "tokens sent": _r.usage.prompt_tokens,
                      "chosen token": next_token.shown(_choice.text), "its id": _id,
                      "probability": math.exp(_choice.logprobs.token_logprobs[0]),
                      "request (ms)": _ms})
    if _id is None:          # end of text, or a piece that is not one token on its own
        break
    loop_ids = loop_ids + [_id]
ui.table(loop_rows, floatfmt=".2f")

# %% [markdown]
# Inside one request the server runs this same loop. A check: ask for the same number of
# tokens in **one** request and compare the texts.

# %%
loop_text = tokenizer.decode(loop_ids[len(token_prompt_ids):])
_start = time.perf_counter()
one_request = client.completions.create(model=session.model, prompt=token_prompt_ids,
                                        max_tokens=len(loop_rows), temperature=0.0)
one_request_ms = (time.perf_counter() - _start) * 1000
ui.md(
    f"{len(loop_rows)} requests of one token wrote *{loop_text!r}*; one request of "
    f"{len(loop_rows)} tokens wrote *{one_request.choices[0].text!r}*: "
    + ("**the same text**. " if one_request.choices[0].text == loop_text else
       "**different texts**: greedy decoding follows the top token, and when two candidates "
       "are nearly tied, tiny numerical differences between runs can flip the choice. ")
    + f"The loop's requests took {sum(r['request (ms)'] for r in loop_rows):.0f} ms in all, "
    f"the single request {one_request_ms:.0f} ms. Each of our requests carried the whole text "
    "again; inside one request the server keeps every earlier token's K and V (the *KV "
    "cache*, notebook 1) and feeds only the newest token through the layers."
)

# %% [markdown]
# ## Streaming, timed by hand
#
# With `stream=True` the server sends the answer as it is generated, a few characters per
# chunk. Two numbers describe what a user feels:
#
# * **TTFT**, time to first token: from sending the request to the first chunk with text. The
#   server must read the whole prompt first (the *prefill*), so TTFT grows with the prompt.
# * **decode speed**: tokens per second after the first one. Each new token needs one more pass
#   through the model (the *decode* step), so this is roughly constant for one request.
#
# Type your own prompt and pick a length; the next cell sends it.

# %%
prompt = ui.text("Explain in three sentences why the sky is blue.", label="prompt")
prompt

# %%
max_tokens = ui.slider(16, 256, value=workshop.session.sweep(128, 32), step=16,
                       label="max_tokens")
max_tokens

# %% [markdown]
# The stopwatch is short enough to read in full: note the time of each chunk that carries text,
# and take the token count from the final `usage` chunk that `stream_options` asks for.

# %%
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

# %%
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

# %% [markdown]
# The same measurement as a picture: each step is a chunk arriving. The gap before the first
# step is TTFT; the slope after it is the decode speed.

# %%
stream_plot = probe.plot_stream(
    probe.StreamTiming(text="".join(pieces), chunk_times=chunk_times, end=stream_end,
                       completion_tokens=n_tokens))
stream_plot

# %% [markdown]
# ## One measurement is not a measurement
#
# A single run is noisy: the first request after start-up is often slower, and on a laptop other
# programs compete for the cores. Repeat the same request a few times and look at the spread.
# `workshop.live.probe.stream_chat` is the stopwatch above, packaged. The repeats set `ignore_eos`,
# an extension of the OpenAI API (vLLM's and SGLang's; the reference server accepts it for every
# engine) that keeps generating past the model's end-of-text token, so every run produces
# exactly `max_tokens` tokens and the runs compare like for like.

# %%
repeat_runs = [
    probe.stream_chat(client, session.model,
                      [{"role": "user", "content": prompt.value}], max_tokens=max_tokens.value,
                      extra_body={"ignore_eos": True})
    for _ in ui.progress(range(workshop.session.sweep(8, 3)), title="repeating the request")
]
repeat_summary = probe.summarize(repeat_runs)
ui.table([{"run": _i + 1, "TTFT (ms)": _r.ttft * 1000, "prompt tokens": _r.prompt_tokens,
           "of them cached": _r.cached_tokens, "output tokens": _r.tokens,
           "decode tokens/s": _r.decode_tokens_per_s, "total time (s)": _r.end}
          for _i, _r in enumerate(repeat_runs)], floatfmt=".1f")

# %%
_cached_runs = sum(1 for _r in repeat_runs if _r.cached_tokens)
_max_cached = max((_r.cached_tokens or 0) for _r in repeat_runs)
_unreported = all(_r.cached_tokens is None for _r in repeat_runs)
ui.md(
    f"Over {len(repeat_runs)} runs the time to first token ranged from "
    f"{repeat_summary['ttft_ms_min']:.0f} to {repeat_summary['ttft_ms_max']:.0f} ms "
    f"(median {repeat_summary['ttft_ms_median']:.0f} ms) and the decode speed from "
    f"{repeat_summary['decode_tok_s_min']:.1f} to {repeat_summary['decode_tok_s_max']:.1f} "
    f"tokens/s. "
    + (f"The same prompt sent again is not the same work: {_cached_runs} of the "
       f"{len(repeat_runs)} runs found up to {_max_cached} of their "
       f"{repeat_runs[0].prompt_tokens} prompt tokens in the server's prefix cache (the "
       "*of them cached* column), so their time to first token skipped that part of the "
       "prefill. Notebook 8 is about that cache; timings that must be cold send new prompts."
       if _cached_runs else
       "No run reported prompt tokens served from a prefix cache"
       + (" (this server does not report them)." if _unreported else "."))
    + " Notebook 1 asks what happens to these numbers when prompts get long and when many "
    "users arrive at once."
)

# %% [markdown]
# **Exercise 2 (predict, then measure).** The same prompt again, with a longer answer (four
# times `max_tokens`; twice in quick mode, to keep CI short). From the repeats' medians above,
# how many seconds will the whole answer take to stream, from the request to its last token?

# %%
exercise_long_tokens = workshop.session.sweep(4, 2) * max_tokens.value
ui.md(f"Answer length for the exercise: **{exercise_long_tokens} tokens**.")

# %%
my_long_answer_s = None    # your prediction in seconds, e.g. 10

# %%
exercise_long = probe.stream_chat(client, session.model,
                                  [{"role": "user", "content": prompt.value}],
                                  max_tokens=exercise_long_tokens,
                                  extra_body={"ignore_eos": True})
ui.compare(my_long_answer_s, exercise_long.end,
           f"time to stream a {exercise_long.tokens}-token answer", "s")

# %%
# Worked answer to Exercise 2, collapsed until opened
_ttft_s = repeat_summary["ttft_ms_median"] / 1000
_rate = repeat_summary["decode_tok_s_median"]
_expected_s = _ttft_s + (exercise_long.tokens - 1) / _rate
# Decode speed of the answer's first and second half of chunks, in tokens/s.
_t = exercise_long.chunk_times
_mid = len(_t) // 2
_per_chunk = exercise_long.tokens / len(_t)
_halves = (_per_chunk * _mid / (_t[_mid] - _t[0]),
           _per_chunk * (len(_t) - 1 - _mid) / (_t[-1] - _t[_mid]))
_change = _halves[1] / _halves[0] - 1
# How far apart the repeats' decode speeds were: a smaller change between halves is within it.
_spread = repeat_summary["decode_tok_s_max"] / repeat_summary["decode_tok_s_min"] - 1
ui.worked_answer(
    f"One prefill, then one decode step per further token: time ≈ TTFT + (tokens − 1) / "
    f"decode speed. With the repeats' medians: {_ttft_s * 1000:.0f} ms + "
    f"{exercise_long.tokens - 1} / {_rate:.1f} tokens/s = **{_expected_s:.2f} s**. Measured: "
    f"**{exercise_long.end:.2f} s**, {exercise_long.end / _expected_s:.2f}x that: TTFT "
    f"{exercise_long.ttft * 1000:.0f} ms (the repeats: {repeat_summary['ttft_ms_min']:.0f} to "
    f"{repeat_summary['ttft_ms_max']:.0f}), then {exercise_long.decode_tokens_per_s:.1f} "
    f"tokens/s (the repeats: {repeat_summary['decode_tok_s_min']:.1f} to "
    f"{repeat_summary['decode_tok_s_max']:.1f}). Its first half decoded at "
    f"{_halves[0]:.1f} tokens/s, its second "
    f"half at {_halves[1]:.1f}, {abs(_change):.0%} {'slower' if _change < 0 else 'faster'}"
    + (f", more than the {_spread:.0%} between the repeats' slowest and fastest. Each step's "
       "attention reads the K and V of every earlier token, so steps lengthen as the answer "
       "grows, past the lengths the repeats reached." if -_change > _spread else
       f", not slower by more than the {_spread:.0%} between the repeats' slowest and "
       "fastest: at this length the growing attention did not measurably slow the steps.")
)

# %% [markdown]
# ## What the real engines do
#
# * **They keep the keys and values.** After the first pass over the prompt (the *prefill*),
#   a decode step feeds only the newest token through the layers; the K and V of all earlier
#   tokens are read from the KV cache. Across requests, automatic prefix caching (the
#   `prefix_caching` row of `/server_info`) lets vLLM reuse the K and V of a prompt start it
#   has already seen, in whole blocks of tokens; SGLang keeps them in a radix tree of token
#   sequences (later in the course).
# * **Text handling runs beside the model.** In vLLM's V1 engine the API-server process
#   tokenizes prompts and turns ids back into text, while a separate engine-core process
#   schedules and runs the model, so neither waits for the other
#   ([vLLM V1 announcement, 2025](https://blog.vllm.ai/2025/01/27/v1-alpha-release.html)).
#   vLLM's own server also answers `/tokenize` and `/detokenize`; the reference server relays
#   only the OpenAI routes, which is why this notebook loaded the tokenizer files.
# * **Sampling is batched.** vLLM's sampler applies penalties, temperature and top-k / top-p to
#   the logits of every request of a step at once, then draws one token per request; the
#   logprobs it returns are, by default, those of the raw logits, before any of these
#   (`vllm/v1/sample/sampler.py`, `logprobs_mode="raw_logprobs"` in `vllm/config/model.py`).
# * **More than one token per step.** Speculative decoding lets a cheap draft propose several
#   tokens and the model check them all in one pass, keeping the output distribution
#   unchanged ([Leviathan et al. 2023](https://arxiv.org/abs/2211.17192)).
