# %% [markdown]
# # 14 · The production gateway: keys, limits, routing, and what the fleet costs
#
# [![Open in Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/{{github_repo}}/blob/main/notebooks/14_production_gateway.ipynb)
# [![Open in molab](https://marimo.io/molab-shield.svg)](https://molab.marimo.io/github/{{github_repo}}/blob/main/notebooks/14_production_gateway.py)
#
# An engine server answers whoever reaches it. vLLM takes `--api-key` (one key or several,
# any of which opens every route it guards), SGLang one `--api-key` and an admin key; neither
# knows who is calling, how much they may use, or what a reply cost. In production a
# **gateway** in front of the engines does that: a key per client, a request rate and a token
# quota per key, a log of every request for billing and incidents (without what was said),
# and the choice of replica. The topics follow the PLaMo serving talk named in the course's
# plan; everything is measured here with the course's gateway (`workshop/api_gateway/`) in
# front of two teaching-engine replicas:
#
# 1. **Keys, limits, quotas and the log**: 429s with `Retry-After`, a token quota run out, and
#    a request log with no prompt text in it;
# 2. **Spread or concentrate**: the same load routed evenly or piled onto as few replicas as
#    possible: latency, each replica's batch and busy time, replicas that could be released;
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
# The replicas are two teaching-engine servers (`workshop.session.start_many`), one torch
# thread each; the gateway is a separate process, `python -m workshop.api_gateway`, that knows
# their addresses and keys and gives clients keys of its own. Its keys file holds, per key, a
# name (what logs and statistics show), a request rate with a burst, and optionally a token
# quota per window.
#
# Choose `trial`'s requests per minute and its burst (how many it may send at once after a
# quiet spell), and `metered`'s token quota per hour (prompt + completion tokens, as counted
# by the replica that served each request). In Jupyter re-run the cells below after changing
# a control; marimo re-runs them for you.

# %%
import inspect
import secrets
import time

import numpy as np

from workshop import hardware, sanity, ui
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
# One torch thread per replica, so that the two engines do not fight over the same cores.
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
# Every request first meets `Gateway.admit`: the key's quota (anything left in this window?),
# then its rate (a token in its bucket?), before a byte goes to a replica; a refusal is a 429
# with `Retry-After`, the seconds until the request would be admitted.

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
from concurrent.futures import ThreadPoolExecutor

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
    _sent = time.monotonic() - _t0
    _r = ask("trial")
    rate_rows.append({"request": _i + 1, "sent at s": _sent, "status": _r.status_code,
                      "Retry-After s": _r.headers.get("retry-after", ""),
                      "error": _r.json().get("error", {}).get("type", "") if _r.status_code != 200
                      else ""})
rate_admitted = sum(r["status"] == 200 for r in rate_rows)
ui.compare(my_admitted, rate_admitted, "requests admitted out of 12")

# %%
ui.table(rate_rows)

# %%
# Worked answer to Exercise 1, collapsed until opened
_per = 60 / trial_per_minute.value
_span = rate_rows[-1]["sent at s"]
_replay = TokenBucket(trial_per_minute.value, trial_burst.value)
rate_forecast = sum(_replay.take(r["sent at s"]) == 0.0 for r in rate_rows)
_took = [r["sent at s"] - q["sent at s"] for q, r in zip(rate_rows, rate_rows[1:])]
_ok_s = np.median([t for t, q in zip(_took, rate_rows) if q["status"] == 200] or [np.nan])
ui.worked_answer(
    f"The bucket starts full, {trial_burst.value} tokens, and gains one every {_per:.1f} s. "
    f"Each admitted request waits for its reply ({_ok_s:.2f} s at the median here), a refused "
    f"one only for the 429, so the 12 went out over {_span:.2f} s: {trial_burst.value} + "
    f"{_span:.2f} / {_per:.1f} = {trial_burst.value + _span / _per:.1f} tokens at most (a full "
    f"bucket keeps no more than {trial_burst.value}, and each request takes a whole one). The "
    f"same bucket replayed over these send times admits **{rate_forecast}**.\n\n"
    f"Measured: **{rate_admitted}**"
    + (": the same." if rate_forecast == rate_admitted else
       f", {rate_admitted - rate_forecast:+d}: the gateway stamps a request when it reads it, "
       "milliseconds after the client sent it, and a token due within those milliseconds "
       "fell on the other side."))

# %%
_wrong = ask("sk-not-a-key")
ui.md(f"**{rate_admitted} of 12 admitted**; the others got 429 `rate_limit_exceeded`, each "
      f"with a `Retry-After`. An unknown key gets {_wrong.status_code} "
      f"`{_wrong.json()['error']['type']}`, before any replica sees the request.")

# %% [markdown]
# ### A token quota, run down
#
# The gateway cannot know a reply's length in advance: it admits a request while anything
# is left of the `metered` key's quota, adds the reply's `usage` when it finishes, and refuses
# the next one once the window's count reaches the quota, so the last admitted request may
# overshoot. A refusal says `insufficient_quota` (OpenAI's name) and the seconds until the
# window ends. Streams are counted too: the gateway asks the replica for
# `stream_options.include_usage` and passes the usage chunk on only to clients that asked
# (checked by `tests/integration/test_api_gateway.py`).

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
# the reply: billing, capacity planning and most incidents need none of it, and a log full of
# prompts is users' data without the protection it needs. The line is built by a function
# that takes only those fields, so a prompt cannot slip in by a careless `**request`:

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
# * **spread**: the replica with the fewest outstanding requests (ties in turn): small
#   batches, and each request waits least if the replicas do not share hardware;
# * **concentrate**: the first replica until it holds `max per replica` outstanding, then the
#   next: bigger batches (throughput rises with the batch, notebook 7), and the last replicas
#   stay idle while demand allows, so they could be released.

# %%
from workshop.api_gateway import routing

ui.md("```python\n" + inspect.getsource(routing.Spread.choose) + "\n"
      + inspect.getsource(routing.Concentrate.choose) + "```")

# %% [markdown]
# The same requests, at the same Poisson arrival times, go through a spread and a
# concentrate gateway over the same two replicas, at a few loads (the course's harness,
# `workshop.bench`, pointed at the gateway). A thread samples each replica's running batch
# (`vllm:num_requests_running` on `/metrics`); the gateway counts each replica's busy time
# (at least one request outstanding) and its mean outstanding requests. A replica busy less
# than the share you choose could be released. The loads are multiples of one replica's
# one-at-a-time rate (one over the unloaded latency, measured first).

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


def latencies_at_once(replica, n):
    """Seconds each of ``n`` requests took, sent together straight to ``replica``: the
    benchmark's output length, end-of-sequence ignored."""
    body = {"model": model, "max_tokens": bench_output_len, "ignore_eos": True,
            "messages": [{"role": "user", "content": "Count to ten."}]}

    def one(_):
        _r = httpx.post(replica.base_url + "/v1/chat/completions", json=body, timeout=120,
                        headers={"Authorization": f"Bearer {replica.api_key}"})
        _r.raise_for_status()
        return _r.elapsed.total_seconds()
    with ThreadPoolExecutor(n) as _pool:
        return list(_pool.map(one, range(n)))


# the best of three alone (a busy moment only adds time), then one burst
unloaded_latency_s = min(latencies_at_once(replica_list[0], 1)[0] for _ in range(3))
burst_size = max(2, max_per_replica.value)
burst_latency_s = float(np.median(latencies_at_once(replica_list[0], burst_size)))
per_other_s = (burst_latency_s - unloaded_latency_s) / (burst_size - 1)
burst_violations = sanity.grows_with("latency (s) against requests sent at once",
                                     [1, burst_size], [unloaded_latency_s, burst_latency_s])
one_at_a_time_rate = 1 / unloaded_latency_s
policy_rates = [f * one_at_a_time_rate
                for f in np.geomspace(sweep(0.5, 0.75), top_load.value, sweep(4, 2))]
ui.md(sanity.report(burst_violations) + "\n\n" + f"A request of {bench_output_len} output "
      f"tokens took **{unloaded_latency_s:.2f} s** alone on replica 0 (best of 3; "
      f"{one_at_a_time_rate:.2f} requests/s one at a time) and **{burst_latency_s:.2f} s** with "
      f"{burst_size} sent at once: each request sharing the replica changed the latency by "
      f"{per_other_s * 1e3:+.0f} ms. Offered loads: "
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
# Worked answer to Exercise 2, collapsed until opened
policy_forecast = {p: gx.forecast(p, policy_rates[-1], len(replica_list), unloaded_latency_s,
                                  per_other_s, max_per_replica.value)
                   for p in ("spread", "concentrate")}
_slowest = {p: max(x["latency s"] for x in rows if x["latency s"] is not None)
            for p, rows in policy_forecast.items()}


def _replica_text(rows):
    return "; ".join(f"replica {x['replica']} {x['req/s']:.2f} req/s, holds {x['holds']:.1f}, "
                     f"{x['latency s']:.2f} s" for x in rows if x["req/s"] > 0)


def _held_text(run):
    return ", ".join(f"{x['mean outstanding']:.1f}" for x in run.replicas)


ui.worked_answer(
    f"Little's law per replica: a replica given λ requests/s whose requests take L s holds "
    f"N = λ·L of them. A request alone takes {unloaded_latency_s:.2f} s and each one it "
    f"shares the replica with changes that by {per_other_s:+.3f} s (the burst above), so "
    f"L = {unloaded_latency_s:.2f} + ({per_other_s:+.3f})·λ·L, that is "
    f"L = {unloaded_latency_s:.2f} / (1 − ({per_other_s:+.3f})·λ). At {policy_rates[-1]:.2f} req/s:\n\n"
    f"* spread: {_replica_text(policy_forecast['spread'])};\n"
    f"* concentrate (full at {max_per_replica.value}): "
    f"{_replica_text(policy_forecast['concentrate'])}.\n\n"
    f"Forecast, slowest replica against slowest: **{_slowest['concentrate'] / _slowest['spread']:.2f}x**. "
    f"Measured p99s: **{p99_ratio:.2f}x**. Requests held on average, per replica (the gateway's "
    f"count): {_held_text(policy_top['concentrate'])} concentrated, "
    f"{_held_text(policy_top['spread'])} spread. The forecast is a mean, and its per-request "
    f"cost was measured on replica 0 with replica 1 idle; here the replicas, the gateway and "
    f"the load generator shared "
    f"{hardware.cores()} cores, and with {requests_per_point.value} requests per point "
    "the p99 lies between the two slowest requests.")

# %%
policy_rows = [r.row(idle_release.value) for r in policy_runs]
ui.table(policy_rows)

# %%
gx.figure(policy_runs, idle_release.value)

# %%
_low = {r.policy: r for r in policy_runs if r.rate == policy_rates[0]}
_low_p99 = {p: r.summary["e2e_ms"]["p99"] / 1e3 for p, r in _low.items()}
_released_spread = max(r.released(idle_release.value) for r in policy_runs
                       if r.policy == "spread")
_tok = {p: policy_top[p].summary["output_throughput"] for p in policy_top}
ui.md(
    f"**At {policy_rates[0]:.2f} req/s concentrate left "
    f"{_low['concentrate'].released(idle_release.value)} of {len(replica_list)} replicas idle "
    f"at least {idle_release.value:.0%} of the time** (spread, at any load: {_released_spread}), "
    f"at a p99 of {_low_p99['concentrate']:.2f} s against spread's {_low_p99['spread']:.2f} s. At "
    f"{policy_rates[-1]:.2f} req/s the p99 ratio was {p99_ratio:.2f}x and output "
    f"{_tok['concentrate']:.1f} tokens/s concentrated against {_tok['spread']:.1f} spread.")

# %% [markdown]
# Try a smaller `max per replica` (concentrate overflows sooner and looks more like spread),
# a higher load, or more requests per point.
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
# **This is a CPU standing in for a GPU**: a 135M-parameter model in the teaching engine, not
# the model you would serve on vLLM or SGLang; only the arithmetic below carries over. To plan
# a real fleet, run section 2 (or `workshop bench`) against your GPU replicas and write the
# tokens/s per replica you measured within your objective here:

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
# Prices per GPU-hour are yours to set. The defaults are an H100's on-demand and one-year
# prices from the course's GPU catalogue, `workshop/data/gpus.json` (notebook 2's), with their
# sources; prices vary by provider, region, commitment and month by a factor of two or more.

# %%
from workshop.sizing import capacity

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
# **Exercise 3 (predict, then compute).** With your demand and the throughput per replica
# above, how many replicas does the peak need?

# %%
my_peak_replicas = None    # your prediction, e.g. 10

# %%
plan_peak_hours = min(peak_hours.value, 24 / peak_to_mean.value)
fleet = capacity.fleet_plan(demand_tokens_per_day.value, peak_to_mean.value, plan_peak_hours,
                            plan_tokens_per_s, price_on_demand.value, price_reserved.value)
ui.compare(my_peak_replicas, fleet.replicas_peak, "replicas at the peak", how="computed")

# %%
# Worked answer to Exercise 3, collapsed until opened
ui.worked_answer(
    f"A day has 86,400 s: {demand_tokens_per_day.value:,.0f} tokens a day is a mean of "
    f"{fleet.mean_tokens_per_s:,.1f} tokens/s, and the peak {peak_to_mean.value:g}x that, "
    f"{fleet.peak_tokens_per_s:,.1f} tokens/s. At {plan_tokens_per_s:,.1f} tokens/s per "
    f"replica that is {fleet.peak_tokens_per_s / plan_tokens_per_s:,.2f} replicas, rounded up: "
    f"**{fleet.replicas_peak}**. The rest of the day, at {fleet.base_tokens_per_s:,.1f} tokens/s "
    f"(what keeps the day's total), needs {fleet.replicas_base}. Prices do not enter: they "
    "decide how to pay for the replicas, not how many.")

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
    f"**Cheapest at your prices: {_best.name}, ${_best.usd_month:,.0f} a month, "
    f"${_best.usd_per_million_tokens:,.3g} per million tokens**, at {plan_tokens_per_s:,.1f} "
    f"tokens/s per replica: {_src}"
    + (f"; the peak is capped at {plan_peak_hours:g} h a day (a longer one at "
       f"{peak_to_mean.value:g}x the mean exceeds the day's tokens)"
       if plan_peak_hours < peak_hours.value else "")
    + f". A replica busy every hour costs ${_floor['on demand']:,.3g} per million tokens on "
    f"demand and ${_floor['reserved']:,.3g} reserved: the floor, reached only by a fully used "
    "fleet. The on-demand and mixed options count on releasing idle replicas, which section "
    "2's concentrate policy makes possible.")

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
# Like ours, the token-based limiters count the reply's `usage` after the fact, so one
# request can overshoot. Unlike ours, they can keep their counters in a shared store (Kong's
# `redis` strategy, Envoy Gateway's global rate-limit service), so that several gateway
# instances enforce one limit; ours keeps them in memory, lost on restart.

# %%
_done_with = (rate_rows, quota_rows, log_clean, policy_runs)   # stop only after their last use
gw_spread.stop()
gw_concentrate.stop()
for _r in replica_list:
    _r.stop()
ui.md("The gateways and both replicas are stopped.")
