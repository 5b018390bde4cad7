"""Notebook 14's measurements: the same load through the gateway under each routing policy,
with what each replica did while it ran.

Per replica: the requests it served and the time it had at least one outstanding (the gateway's
own exact count, ``/gateway/stats``), and the engine's running batch
(``vllm:num_requests_running`` on its ``/metrics``, sampled by
``workshop.live.metrics_sampler.MetricsSampler`` while the load runs).
The load is the course's harness (``workshop.bench.run_benchmark``) pointed at the gateway.

``forecast`` is the worked answer's model of the two policies: Little's law per replica, with
a request's latency growing linearly in the requests it shares its replica with.
"""

from __future__ import annotations

import contextlib
import functools
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from reference_server import prometheus
from workshop.bench import run_benchmark
from workshop.bench.server_metrics import RUNNING
from workshop.live.metrics_sampler import MetricsSampler


def _running(replica: Any) -> dict[str, float]:
    """A replica's running batch, for ``MetricsSampler`` (a poll without it counts as failed)."""
    value = prometheus.first(replica.metrics(), RUNNING)
    if value is None:
        raise LookupError("no running-requests gauge on /metrics")
    return {"running": value}


@dataclass
class PolicyRun:
    policy: str
    rate: float                         # offered requests/s
    summary: dict                       # the harness's summary
    wall_s: float
    replicas: list[dict] = field(default_factory=list)

    def released(self, idle_at_least: float) -> int:
        """Replicas idle at least this fraction of the run: could be given back."""
        return sum(1 for r in self.replicas if 1 - r["busy"] >= idle_at_least)

    def row(self, idle_at_least: float) -> dict:
        s = self.summary
        out = {"policy": self.policy, "offered req/s": self.rate,
               "achieved req/s": s["request_throughput"],
               "output tok/s": s["output_throughput"], "p50 latency s": s["e2e_ms"]["median"] / 1e3
               if s["e2e_ms"]["median"] is not None else None,
               "p99 latency s": s["e2e_ms"]["p99"] / 1e3 if s["e2e_ms"]["p99"] is not None
               else None, "errors": s["errors"]}
        for r in self.replicas:
            i = r["replica"]
            out[f"r{i} served"] = r["served"]
            out[f"r{i} busy"] = r["busy"]
            out[f"r{i} batch"] = r["batch when running"]
        out["could release"] = self.released(idle_at_least)
        return out


def run_policy(gateway: Any, replicas: Sequence[Any], model: str, rate: float, num_requests: int,
               *, input_len: int = 32, output_len: int = 16, seed: int = 0) -> PolicyRun:
    """``num_requests`` random requests at ``rate`` per second (Poisson) through ``gateway``
    (a ``launch.RunningGateway``) to ``replicas`` (the Sessions behind it, in its order)."""
    before = gateway.stats()
    with contextlib.ExitStack() as stack:
        samplers = [stack.enter_context(MetricsSampler(functools.partial(_running, r), ("running",),
                                                       interval=0.2))
                    for r in replicas]
        t0 = time.monotonic()
        result = run_benchmark(gateway.base_url, model, "random", num_requests=num_requests,
                               concurrency=None, request_rate=rate, api_key=gateway.admin_key,
                               warmup=0, progress=False, scrape_metrics=False,
                               environment=False, input_len=input_len, output_len=output_len,
                               seed=seed)
        wall = time.monotonic() - t0
    after = gateway.stats()
    run_s = result.config.get("wall_seconds") or wall
    run = PolicyRun(after["policy"], rate, result.summary, run_s)
    for b, a, sampler in zip(before["replicas"], after["replicas"], samplers):
        samples = sampler.samples.values["running"]
        running = [x for x in samples if x > 0]
        run.replicas.append({
            "replica": a["replica"], "served": a["served"] - b["served"],
            "busy": min(1.0, (a["busy_s"] - b["busy_s"]) / run_s),
            "mean outstanding": (a["load_s"] - b["load_s"]) / run_s,
            "batch when running": float(np.mean(running)) if running else 0.0,
            "running samples": len(samples)})
    return run


def latency_with_others(l1: float, per_other: float, rate: float) -> float:
    """Mean latency at a replica receiving ``rate`` requests/s, where a request alone takes
    ``l1`` s and each request it shares the replica with adds ``per_other`` s: it finds
    N = rate * L others on average (Little's law), so L = l1 + per_other * rate * L, that is
    L = l1 / (1 - per_other * rate). Infinite at or past saturation."""
    load = per_other * rate
    return l1 / (1 - load) if load < 1 else float("inf")


def forecast(policy: str, rate: float, replicas: int, l1: float, per_other: float,
             max_per_replica: int = 1) -> list[dict]:
    """Per replica: the requests/s it gets, the requests it holds and their latency, in
    steady state (``latency_with_others``). ``spread``: each gets ``rate / replicas``.
    ``concentrate``: replica 0 takes everything while it holds fewer than
    ``max_per_replica``; full, it serves ``max_per_replica / L`` (L with that many others)
    and the overflow goes to the next. Past every replica full the policy is spread's (the fewest
    outstanding)."""
    def row(i, r, latency=None):
        latency = latency_with_others(l1, per_other, r) if latency is None else latency
        return {"replica": i, "req/s": r, "holds": r * latency if r else 0.0,
                "latency s": latency if r else None}

    if policy == "spread":
        return [row(i, rate / replicas) for i in range(replicas)]
    rows, left = [], rate
    full_latency = l1 + per_other * max_per_replica      # where rate * L reaches the cap
    for i in range(replicas):
        alone = latency_with_others(l1, per_other, left)
        if left * alone <= max_per_replica:
            rows.append(row(i, left, alone))
            left = 0.0
        else:
            served = max_per_replica / full_latency
            rows.append(row(i, served, full_latency))
            left = max(0.0, left - served)
    return forecast("spread", rate, replicas, l1, per_other) if left > 0 else rows


def figure(runs: Sequence[PolicyRun], idle_at_least: float):
    """Left: p50 and p99 latency against offered load, per policy. Right: each replica's
    busy fraction, per policy; dotted: the idle share above which a replica could go."""
    from workshop.plots import new_figure

    fig = new_figure((11.5, 4.3))
    ax1, ax2 = fig.subplots(1, 2)
    policies = list(dict.fromkeys(r.policy for r in runs))
    colors = {p: c for p, c in zip(policies, ("tab:blue", "tab:orange", "tab:green"))}
    for p in policies:
        mine = sorted((r for r in runs if r.policy == p), key=lambda r: r.rate)
        rates = [r.rate for r in mine]
        ax1.plot(rates, [r.summary["e2e_ms"]["p99"] / 1e3 for r in mine], "o-",
                 color=colors[p], label=f"{p}: p99")
        ax1.plot(rates, [r.summary["e2e_ms"]["median"] / 1e3 for r in mine], "s--",
                 color=colors[p], alpha=0.6, label=f"{p}: p50")
        for k, marker in zip(range(len(mine[0].replicas)), ("o", "^", "s", "D")):
            ax2.plot(rates, [r.replicas[k]["busy"] for r in mine], marker=marker,
                     linestyle="-" if k == 0 else ":", color=colors[p],
                     label=f"{p}: replica {k}")
    ax1.set_title("Latency through the gateway")
    ax1.set_xlabel("offered load (requests/s)")
    ax1.set_ylabel("end-to-end latency (s)")
    ax1.set_ylim(bottom=0)
    ax2.axhline(1 - idle_at_least, color="grey", linestyle="--", linewidth=1,
                label=f"busy < {1 - idle_at_least:.0%}: could release")
    ax2.set_title("Each replica's busy time")
    ax2.set_xlabel("offered load (requests/s)")
    ax2.set_ylabel("fraction of the run with a request outstanding")
    ax2.set_ylim(-0.03, 1.05)
    for ax in (ax1, ax2):
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    return fig
