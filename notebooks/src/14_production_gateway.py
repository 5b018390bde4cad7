# %% [markdown]
# # 14 · The production gateway: keys, limits, routing, and what the fleet costs
#
# [![Open in Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/{{github_repo}}/blob/main/notebooks/14_production_gateway.ipynb)
# [![Open in molab](https://marimo.io/molab-shield.svg)](https://molab.marimo.io/github/{{github_repo}}/blob/main/notebooks/14_production_gateway.py)
#
# An engine server answers whoever reaches it. vLLM takes `--api-key` (one key, or a list:
# any of them opens every route it guards), SGLang one `--api-key` and an admin key; neither
# knows who is calling, how much they may use, or what a reply cost. In production a
# **gateway** sits in front of the engines and does that: it knows every client's key, limits
# each one's request rate and token use, logs every request for billing and incidents
# (without what was said), and decides which engine replica gets the request. The topics
# follow the PLaMo serving talk named in the course's plan (its figures are not reproduced
# here); everything below is measured on this machine with the course's own gateway
# (`workshop/api_gateway/`) in front of two real teaching-engine replicas:
#
# 1. **Keys, limits, quotas and the log**: a key with a small request rate gets 429s with
#    `Retry-After`, a token quota runs out, and the request log holds no prompt text;
# 2. **Spread or concentrate**: the same load routed evenly over the replicas, or piled onto
#    as few as possible; latency, each replica's batch and busy time, and how many replicas
#    could be released;
# 3. **A capacity and cost plan** from the throughput you measured: replicas, GPU-hours per
#    month, reserved vs on-demand, and the cost of a million tokens.


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
# ## 1. Two replicas and a gateway
#
# The replicas are two teaching-engine servers (`workshop.session.start_many`), each with one
# torch thread, so each can have a core of its own on a small machine; the gateway is a
# separate process, `python -m workshop.api_gateway`, that knows their addresses and keys and
# gives clients keys of its own. Its keys file holds, per key, a name (what logs and
# statistics show), a request rate with a burst, and optionally a token quota per window.
#
# Choose the limits of two small keys: `trial`'s requests per minute and how many it may
# send at once after a quiet spell (the burst), and `metered`'s token quota per hour
# (prompt + completion tokens, as counted by the replica that served each request). In Jupyter re-run the cells below after
# changing a control; marimo re-runs them for you.

# %%
import inspect
import secrets
import time

import numpy as np

from workshop import ui
from workshop.api_gateway import experiments as gx
from workshop.api_gateway import launch as gateway_launch
from workshop.api_gateway.app import Gateway
from workshop.api_gateway.bucket import TokenBucket
from workshop.session import sweep

# %%
trial_per_minute = ui.slider(6, 600, 30, 6, "trial key: requests per minute")
trial_per_minute

# %%
trial_burst = ui.slider(1, 20, 3, 1, "trial key: burst (requests)")
trial_burst

# %%
metered_quota = ui.slider(100, 5000, 200, 100, "metered key: token quota per hour")
metered_quota

# %%
# One torch thread per replica: two engines that each spawn a thread per core would fight
# over the same cores.
replicas = workshop.session.start_many("mini", {
    f"replica {i}": ["--max-model-len", "512", "--kv-cache-gib", "0.1", "--",
                     "--threads", "1", "--max-num-seqs", "16"] for i in range(2)})
replica_list = list(replicas.values())
model = replica_list[0].model
keys = [
    {"name": "ops", "key": "sk-ops-" + secrets.token_hex(8), "requests_per_minute": 60_000,
     "burst": 1000, "admin": True},
    {"name": "trial", "key": "sk-trial-" + secrets.token_hex(8),
     "requests_per_minute": trial_per_minute.value, "burst": trial_burst.value},
    {"name": "metered", "key": "sk-metered-" + secrets.token_hex(8),
     "requests_per_minute": 6000, "burst": 100, "quota_tokens": metered_quota.value,
     "quota_window_s": 3600},
]
key_of = {k["name"]: k["key"] for k in keys}
gw_spread = gateway_launch.start([(r.base_url, r.api_key) for r in replica_list], keys,
                                 policy="spread")
ui.table([{"replica": i, "server": r.base_url, "engine": r.info["engine"],
           "max running": r.info["extra"]["max_num_seqs"]}
          for i, r in enumerate(replica_list)]
         + [{"replica": "gateway", "server": gw_spread.base_url, "engine": "api_gateway",
             "max running": "-"}])

# %% [markdown]
# Every request first meets `Gateway.admit`: the key's quota (is anything left in this
# window?) and then its rate (is there a token in its bucket?). Both answer before a byte
# goes to a replica; a refusal is a 429 with `Retry-After`, the seconds until the request
# would be admitted.

# %%
ui.md("```python\n" + inspect.getsource(Gateway.admit) + "```")

# %% [markdown]
# The rate limit is a **token bucket**: it holds at most `burst` tokens, refills at
# `per_minute / 60` a second, and each request takes one. A quiet key can send `burst` at
# once; over a longer time, no more than `per_minute` a minute.

# %%
ui.md("```python\n" + inspect.getsource(TokenBucket.take) + "```")

# %% [markdown]
# **Exercise 1 (predict, then measure).** The `trial` key sends 12 requests back to back,
# each waiting for the previous reply. How many will be admitted?

# %%
my_admitted = None    # your prediction, e.g. 5

# %%
import httpx


def ask(key_name, text="Say hello.", max_tokens=4, gw=None):
    """One chat request through the gateway with this key; the reply (any status)."""
    gw = gw or gw_spread
    return httpx.post(gw.base_url + "/v1/chat/completions", timeout=120,
                      headers={"Authorization": f"Bearer {key_of.get(key_name, key_name)}"},
                      json={"model": model, "max_tokens": max_tokens,
                            "messages": [{"role": "user", "content": text}]})


rate_rows = []
_t0 = time.monotonic()
for _i in range(12):
    _r = ask("trial")
    rate_rows.append({"request": _i + 1, "status": _r.status_code,
                      "Retry-After s": _r.headers.get("retry-after", ""),
                      "error": _r.json().get("error", {}).get("type", "") if _r.status_code != 200
                      else ""})
rate_span_s = time.monotonic() - _t0
rate_admitted = sum(r["status"] == 200 for r in rate_rows)
ui.compare(my_admitted, rate_admitted, "requests admitted out of 12")

# %%
ui.table(rate_rows)

# %%
_wrong = ask("sk-not-a-key")
ui.md((f"**{rate_admitted}** of 12 admitted: the burst of {trial_burst.value}, plus one "
       f"token every {60 / trial_per_minute.value:.1f} s refilled while the "
       f"{rate_span_s:.1f} s of requests went by ({trial_burst.value} + "
       f"{rate_span_s:.1f} / {60 / trial_per_minute.value:.1f} = "
       f"{trial_burst.value + rate_span_s * trial_per_minute.value / 60:.1f} tokens in all; "
       "each request takes a whole one). "
       "The others were refused with 429 `rate_limit_exceeded`, each told when to come back. "
       if rate_admitted < 12 else
       f"All 12 admitted: at {trial_per_minute.value} a minute the bucket refilled faster "
       f"than the requests came ({rate_span_s:.1f} s for 12). Lower the rate to see 429s. ")
      + f"A request with an unknown key gets {_wrong.status_code} "
      f"`{_wrong.json()['error']['type']}` the same way, before any replica sees it.")

# %% [markdown]
# ### A token quota, run down
#
# The `metered` key may use the quota you chose per hour. The gateway cannot know a
# reply's length in advance, so it admits a request while anything is left, adds the
# request's `usage` (from the replica's reply) when it finishes, and refuses the next one
# once the window's count reaches the quota: the last admitted request may overshoot. A
# refusal says `insufficient_quota` (OpenAI's name for it) and the seconds until the window
# ends. Streams are counted too: the gateway asks the replica for
# `stream_options.include_usage` and passes the usage chunk on only to clients that asked
# for it (checked by `tests/integration/test_api_gateway.py`).

# %%
quota_rows = []
for _i in range(sweep(60, 40)):
    _r = ask("metered", max_tokens=8)
    _k = gw_spread.stats()["keys"]["metered"]
    quota_rows.append({"request": _i + 1, "status": _r.status_code,
                       "tokens": sum(_r.json()["usage"][f] for f in ("prompt_tokens",
                                                                     "completion_tokens"))
                       if _r.status_code == 200 else 0,
                       "quota left": _k["quota_remaining"],
                       "Retry-After s": _r.headers.get("retry-after", ""),
                       "error": _r.json()["error"]["type"] if _r.status_code != 200 else ""})
    if _r.status_code != 200:
        break
ui.table(quota_rows)

# %%
quota_used = sum(r["tokens"] for r in quota_rows)
quota_refused = quota_rows[-1]["status"] == 429
ui.md((f"**{len(quota_rows) - 1} requests** used **{quota_used}** tokens of a quota of "
       f"{metered_quota.value}" + (f" ({quota_used - metered_quota.value} over it: the last admitted "
                                  "request's tokens were counted after it ran)"
                                  if quota_used > metered_quota.value else "")
       + f"; request {len(quota_rows)} got 429 `{quota_rows[-1]['error']}` with Retry-After "
       f"{quota_rows[-1]['Retry-After s']} s, the end of the hour's window.")
      if quota_refused else
      f"All {len(quota_rows)} requests fitted in the quota of {metered_quota.value} tokens "
      f"({quota_used} used): lower the quota to see it run out.")

# %% [markdown]
# ### The request log, and what it must not hold
#
# One JSON line per request: time, the key's **name** (never the key), model, replica,
# status, token counts, latency and, for streams, time to first token. Never the prompt or
# the reply: billing, capacity planning and most incident work need none of it, and a log
# full of prompts is a store of users' data with none of the protection the data needs. The
# log line is built by a function that takes only those fields, so a prompt cannot slip in
# by a careless `**request`:

# %%
from workshop.api_gateway import request_log

ui.md("```python\n" + inspect.getsource(request_log.line) + "```")

# %%
log_marker = "PURPLE-OWL-" + secrets.token_hex(4)
log_reply = ask("ops", text=f"My account number is {log_marker}. Repeat it back to me.",
                max_tokens=24)
log_lines = gw_spread.log()
ui.table([{**_l, "time": time.strftime("%H:%M:%S", time.localtime(_l["time"]))}
          for _l in log_lines[-6:]])

# %%
_raw = gw_spread.log_path.read_text()
_secrets_seen = [k["name"] for k in keys if k["key"] in _raw]
log_clean = log_marker not in _raw and not _secrets_seen
ui.md(f"The log (`{gw_spread.log_path}`) has {len(log_lines)} lines. The prompt's marker "
      f"`{log_marker}` appears in it **{_raw.count(log_marker)}** times"
      + (f" (the reply contained it {log_reply.text.count(log_marker)} times: what reaches "
         "the client is not logged)" if log_reply.status_code == 200 else "")
      + f"; key secrets found in it: {len(_secrets_seen)}. "
      + ("Nothing was said in the log." if log_clean else
         "**Something leaked into the log: this is a bug.**"))

# %% [markdown]
# ## 2. Spread the load, or concentrate it?
#
# With several replicas the gateway decides where each request goes. Two opposite policies:
#
# * **spread**: the replica with the fewest outstanding requests (ties in turn). Every
#   replica gets a share, batches stay small, and each request waits least, if the
#   replicas do not compete for the same hardware;
# * **concentrate**: the first replica until it holds `max per replica` outstanding
#   requests, then the next. Batches grow (an engine's throughput rises with its batch,
#   notebook 7), and the last replicas stay idle while demand allows: those could be
#   released (scaled down, given back, used for something else).
#
# The policies' code:

# %%
from workshop.api_gateway import routing

ui.md("```python\n" + inspect.getsource(routing.Spread.choose) + "\n"
      + inspect.getsource(routing.Concentrate.choose) + "```")

# %% [markdown]
# The same requests, at the same Poisson arrival times, go through a spread gateway and a
# concentrate gateway over the same two replicas, at a few loads. The load is the course's
# harness (`workshop.bench`) pointed at the gateway; while it runs, a thread samples each
# replica's `/metrics` for `vllm:num_requests_running` (its running batch), and the gateway
# counts the time each replica had at least one request outstanding (its busy time). A
# replica busy less than the share you choose could be released.
#
# The loads are multiples of what one replica does one request at a time (one over the
# unloaded latency, measured first), from below it up to the highest you choose.

# %%
max_per_replica = ui.slider(1, 16, 4, 1, "concentrate: max outstanding per replica")
max_per_replica

# %%
top_load = ui.slider(1.0, 8.0, 3.0, 0.5, "highest load (x one replica's one-at-a-time rate)")
top_load

# %%
requests_per_point = ui.slider(6, 200, sweep(40, 6), 2, "requests per policy and load")
requests_per_point

# %%
idle_release = ui.slider(0.5, 1.0, 0.8, 0.05, "a replica idle at least this share could go")
idle_release

# %%
bench_output_len = sweep(32, 8)
bench_input_len = 32
gw_concentrate = gateway_launch.start([(r.base_url, r.api_key) for r in replica_list], keys,
                                      policy="concentrate",
                                      max_per_replica=max_per_replica.value)
_t = []
for _ in range(sweep(3, 2)):
    _r = ask("ops", text="Count to ten.", max_tokens=bench_output_len)
    _t.append(_r.elapsed.total_seconds())
unloaded_latency_s = float(np.median(_t))
one_at_a_time_rate = 1 / unloaded_latency_s
# from below one replica's one-at-a-time rate (where one replica should do) to the top
policy_rates = [f * one_at_a_time_rate
                for f in np.geomspace(sweep(0.5, 0.75), top_load.value, sweep(4, 2))]
ui.md(f"Unloaded latency of a request of {bench_output_len} output tokens: "
      f"**{unloaded_latency_s:.2f} s**, so one replica serving one request at a time manages "
      f"{one_at_a_time_rate:.2f} requests/s. Offered loads: "
      + ", ".join(f"{r:.2f}" for r in policy_rates) + " requests/s.")

# %% [markdown]
# **Exercise 2 (predict, then measure).** At the highest load, what will the p99 latency
# under **concentrate** be, as a multiple of the p99 under **spread**?

# %%
my_p99_ratio = None    # your prediction, e.g. 1.5

# %%
policy_runs = []
for _rate in ui.progress(policy_rates, title="loads"):
    for _gw in (gw_spread, gw_concentrate):
        policy_runs.append(gx.run_policy(_gw, replica_list, model, _rate,
                                         requests_per_point.value, input_len=bench_input_len,
                                         output_len=bench_output_len, seed=len(policy_runs) // 2))
policy_top = {r.policy: r for r in policy_runs if r.rate == policy_rates[-1]}
p99_ratio = (policy_top["concentrate"].summary["e2e_ms"]["p99"]
             / policy_top["spread"].summary["e2e_ms"]["p99"])
ui.compare(my_p99_ratio, p99_ratio, "p99 concentrate / p99 spread at the highest load", "x")

# %%
policy_rows = [r.row(idle_release.value) for r in policy_runs]
ui.table(policy_rows)

# %%
gx.figure(policy_runs, idle_release.value)

# %%
_low = {r.policy: r for r in policy_runs if r.rate == policy_rates[0]}
_low_p99 = {p: r.summary["e2e_ms"]["p99"] / 1e3 for p, r in _low.items()}
_released_low = _low["concentrate"].released(idle_release.value)
_released_spread = max(r.released(idle_release.value) for r in policy_runs
                       if r.policy == "spread")
_c, _s = policy_top["concentrate"], policy_top["spread"]
_batch = lambda run: max(x["batch when running"] for x in run.replicas)
_tok = {p: policy_top[p].summary["output_throughput"] for p in policy_top}
ui.md(
    f"At the lowest load ({policy_rates[0]:.2f} req/s), concentrate left "
    f"**{_released_low}** of {len(replica_list)} replicas idle at least "
    f"{idle_release.value:.0%} of the time (spread, at any load: {_released_spread}), at a "
    f"p99 of {_low_p99['concentrate']:.2f} s against spread's {_low_p99['spread']:.2f} s"
    + (": the price of the bigger batch. " if _low_p99["concentrate"] > 1.1 * _low_p99["spread"]
       else ": the bigger batch cost no latency that this run could see. ")
    + f"At the highest ({policy_rates[-1]:.2f} req/s), the busiest replica ran batches of "
    f"{_batch(_c):.1f} requests on average under concentrate and {_batch(_s):.1f} under "
    f"spread, and p99 latency was {_c.summary['e2e_ms']['p99'] / 1e3:.2f} s against "
    f"{_s.summary['e2e_ms']['p99'] / 1e3:.2f} s ({p99_ratio:.2f}x). "
    + ("Spreading gave the lower tail, as the usual advice says: two replicas with a core "
       "each decode side by side, so splitting the load halves each one's batch. "
       if p99_ratio > 1.1 else
       "Spreading did **not** lower the tail here, against the usual advice. The two "
       f"replicas share this machine's {workshop.session.cores()} cores with the gateway "
       "and the load generator, so a second replica adds little compute; and a bigger "
       "batch on one replica costs little more per step than a small one (notebook 7). "
       "Where each replica has hardware of its own (a GPU each), a second replica adds its "
       "whole compute: measure there before choosing. "
       if p99_ratio < 0.9 else
       "The two tails were within 10 % of each other: at this load the choice did not "
       "matter for latency" + (f", and concentrate still left {_c.released(idle_release.value)} "
                               "replica(s) idle enough to release. "
                               if _c.released(idle_release.value) else ". "))
    + f"Output throughput: {_tok['concentrate']:.1f} tokens/s concentrated, "
    f"{_tok['spread']:.1f} spread."
    + (" (Under 100 requests per point a p99 is about the slowest request, and noisy: raise "
       "the requests per point before trusting a difference.)"
       if requests_per_point.value < 100 else ""))

# %% [markdown]
# Try a smaller `max per replica` (concentrate overflows sooner and looks more like
# spread), a higher load (where the single replica saturates and concentrate's tail should
# blow up), or more requests per point.
#
# ## 3. A capacity and cost plan from your own measurement
#
# A fleet is sized from one number: the tokens per second one replica delivers **while
# meeting the latency objective**. Pushing a replica harder raises its throughput and its
# latency; the objective decides where to stop. Choose the objective (p99 end-to-end
# latency); the throughput per replica is the best measured above among the points that met
# it, divided by the replicas that point kept busy (those not idle enough to release).

# %%
_p99s = sorted(r.summary["e2e_ms"]["p99"] / 1e3 for r in policy_runs)
slo_p99_s = ui.slider(0.5, 60.0, min(60.0, round(max(1.0, 2 * _p99s[0]) * 2) / 2), 0.5,
                      "latency objective: p99 end-to-end (s)")
slo_p99_s

# %%
def _per_replica(run):
    busy = len(run.replicas) - run.released(idle_release.value)
    return run.summary["output_throughput"] / max(busy, 1)


slo_points = [r for r in policy_runs if r.summary["e2e_ms"]["p99"] / 1e3 <= slo_p99_s.value
              and r.summary["errors"] == 0]
slo_best = max(slo_points, key=_per_replica, default=None)
measured_tokens_per_s = _per_replica(slo_best) if slo_best else None
ui.md(f"{len(slo_points)} of {len(policy_runs)} points met a p99 of {slo_p99_s.value:g} s. "
      + (f"The best: **{measured_tokens_per_s:.1f} output tokens/s per replica** "
         f"({slo_best.policy} at {slo_best.rate:.2f} req/s, p99 "
         f"{slo_best.summary['e2e_ms']['p99'] / 1e3:.2f} s)." if slo_best else
         "None did: loosen the objective (no throughput meets it on this machine)."))

# %% [markdown]
# **This is a CPU standing in for a GPU.** The figure above is the teaching engine with a
# 135M-parameter model on this machine's cores, not vLLM or SGLang on a GPU with the model
# you would serve; only the arithmetic below carries over. To plan a real fleet, run
# section 2 against your own GPU replicas (or the course's harness, `workshop bench`,
# against one) and write the tokens/s per replica you measured within your objective here:

# %%
my_tokens_per_s_per_replica = None    # your own measurement, e.g. 1500.0 for a GPU replica

# %%
plan_tokens_per_s = my_tokens_per_s_per_replica or measured_tokens_per_s or 1.0
demand_tokens_per_day = ui.slider(1e6, 1e9, 5e7, 1e6, "demand: output tokens per day")
demand_tokens_per_day

# %%
peak_to_mean = ui.slider(1.0, 6.0, 3.0, 0.5, "peak / mean demand")
peak_to_mean

# %%
peak_hours = ui.slider(1.0, 24.0, 4.0, 0.5, "hours a day at the peak")
peak_hours

# %% [markdown]
# Prices per GPU-hour are yours to set. The defaults come from the course's one GPU
# catalogue, `workshop/data/gpus.json` (the one notebook 2 prices with): an H100's on-demand
# and one-year-commitment prices, each with its source and date, shown below. Prices vary by
# provider, region, commitment and month by a factor of two or more.

# %%
from workshop import capacity

price_gpu = capacity.load_gpus()["H100-SXM"]
ui.md(f"{price_gpu.name}: **${price_gpu.price_usd_hour:.2f}/h on demand** "
      f"({price_gpu.price_source}) and **${price_gpu.reserved_price_usd_hour:.2f}/h on a "
      f"one-year commitment** ({price_gpu.reserved_price_source}). The two come from different "
      "sources; set your own below.")

# %%
price_on_demand = ui.slider(0.1, 12.0, price_gpu.price_usd_hour, 0.01,
                            "on-demand $ per GPU-hour")
price_on_demand

# %%
price_reserved = ui.slider(0.1, 12.0, price_gpu.reserved_price_usd_hour, 0.01,
                           "reserved $ per GPU-hour (paid every hour)")
price_reserved

# %% [markdown]
# The day has two levels: `peak hours` at peak demand, the rest at the base level that
# keeps the day's total. Replicas at each level round up; three ways to pay for them, and
# the cost of a million tokens for each (the month's bill over the month's tokens, so idle
# reserved hours count):

# %%
ui.md("```python\n" + inspect.getsource(capacity.fleet_plan) + "```")

# %% [markdown]
# **Exercise 3 (predict, then measure).** With your demand and prices, how many replicas
# does the peak need?

# %%
my_peak_replicas = None    # your prediction, e.g. 10

# %%
plan_peak_hours = min(peak_hours.value, 24 / peak_to_mean.value)
fleet = capacity.fleet_plan(demand_tokens_per_day.value, peak_to_mean.value, plan_peak_hours,
                            plan_tokens_per_s, price_on_demand.value, price_reserved.value)
ui.compare(my_peak_replicas, fleet.replicas_peak, "replicas at the peak", how="computed")

# %%
ui.table([{"option": o.name, "reserved replicas": o.reserved_replicas,
           "on-demand GPU-h / month": o.on_demand_gpu_hours, "GPU-h / month": o.gpu_hours,
           "$ / month": o.usd_month, "$ per million tokens": o.usd_per_million_tokens}
          for o in fleet.options], floatfmt=",.4g")

# %%
_best = min(fleet.options, key=lambda o: o.usd_month)
_floor = {p: capacity.usd_per_million_tokens(v, 1, plan_tokens_per_s)
          for p, v in (("on demand", price_on_demand.value), ("reserved", price_reserved.value))}
_src = ("your own measurement" if my_tokens_per_s_per_replica else
        "this machine's measurement (a CPU standing in for a GPU)" if measured_tokens_per_s
        else "a placeholder of 1 token/s (nothing met the objective)")
ui.md(
    f"At {plan_tokens_per_s:,.1f} tokens/s per replica ({_src}), a mean of "
    f"{fleet.mean_tokens_per_s:,.1f} tokens/s and a peak of {fleet.peak_tokens_per_s:,.1f} "
    f"for {plan_peak_hours:g} h a day"
    + (f" (capped at {plan_peak_hours:g} h: at {peak_to_mean.value:g}x the mean, a longer peak "
       "would exceed the day's tokens)" if plan_peak_hours < peak_hours.value else "")
    + f" need **{fleet.replicas_peak}** replicas at the peak and {fleet.replicas_base} "
    f"the rest of the day. Cheapest at your prices: **{_best.name}**, "
    f"${_best.usd_month:,.0f} a month, ${_best.usd_per_million_tokens:,.3g} per million "
    f"tokens. A replica busy every hour would cost ${_floor['on demand']:,.3g} per million "
    f"tokens on demand and ${_floor['reserved']:,.3g} reserved: the floor, which only a "
    "fully used fleet reaches. "
    + ("Reserving for the peak pays for idle replicas most of the day; here that cost more "
       "than on-demand's higher rate. " if fleet.options[0].usd_month > fleet.options[1].usd_month
       else "The reserved rate is low enough that paying for idle peak replicas still beat "
       "on demand. ")
    + "Section 2's concentrate policy is what makes the on-demand and mixed options real: "
    "only a replica the gateway leaves idle can be released.")

# %% [markdown]
# ## 4. What production systems do
#
# | system | keys and limits | source |
# |---|---|---|
# | vLLM (0.32) | `--api-key`: one or several keys, any of which opens the routes it guards (`/v1`, `/v2`, `/inference`; its own help says other routes stay open and not to rely on it alone); no per-key limits, quotas or usage log | `vllm/entrypoints/launchers/cli_args.py`, installed with this course; [vLLM security docs](https://docs.vllm.ai/en/latest/usage/security.html) |
# | SGLang (0.5.18) | `--api-key` (one) and `--admin-api-key` for management routes; no per-key limits | `sglang/srt/server_args.py` in `.venv-sglang` |
# | LiteLLM proxy | virtual keys generated with a master key, each with `rpm` / `tpm` limits, a budget in USD over a period, allowed models | [LiteLLM docs: getting started, virtual keys and RPM limits](https://docs.litellm.ai/docs/proxy/docker_quick_start) |
# | Envoy AI Gateway | token-based rate limits on Envoy Gateway's global rate limiting: token usage read from OpenAI-shaped responses, per model and user, checked when the next request arrives (429 over the limit), custom token costs as CEL expressions | [Envoy AI Gateway: usage-based rate limiting](https://aigateway.envoyproxy.io/docs/0.1/capabilities/usage-based-ratelimiting) |
# | Kong AI Gateway | AI Rate Limiting Advanced: token (or cost) limits per consumer, consumer group or provider, over several windows at once (e.g. per minute and per hour) | [Kong: AI Rate Limiting Advanced](https://developer.konghq.com/plugins/ai-rate-limiting-advanced/examples/consumer-rate-limiting/) |
# | Apache APISIX | `ai-rate-limiting`: token limits per time window on `total_tokens`, `prompt_tokens` or `completion_tokens` | [APISIX ai-rate-limiting](https://apisix.apache.org/docs/apisix/3.17/plugins/ai-rate-limiting/) |
#
# Like ours, the token-based limiters count tokens from the reply's `usage` after the fact,
# so one request can overshoot a limit. Unlike ours, they can keep their counters in a
# shared store (Kong's `redis` strategy, Envoy Gateway's global rate-limit service), so that
# several gateway instances enforce one limit; ours keeps them in its own memory, which is
# enough for one gateway process and loses them on restart.

# %%
_done_with = (rate_rows, quota_rows, log_clean, policy_runs)   # stop only after their last use
gw_spread.stop()
gw_concentrate.stop()
for _r in replica_list:
    _r.stop()
ui.md("The gateways and both replicas are stopped.")
