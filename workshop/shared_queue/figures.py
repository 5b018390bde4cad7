"""Notebook 12's figures, each from the run's own data."""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
from matplotlib.patches import Patch

from workshop.plots import figure, new_figure
from workshop.shared_queue.experiments import Point, ZipfResult, percentile


def _finite(x: float, cap: float) -> float:
    return cap if not math.isfinite(x) else x


def sweep_figure(points: Sequence[Point], knees: dict[str, dict]):
    """Achieved vs offered load, and p99 latency vs offered load, per route; the knee marked."""
    fig = new_figure((11, 4.2))
    ax1, ax2 = fig.subplots(1, 2)
    routes = list(dict.fromkeys(p.route for p in points))
    finite = [s["p99 s"] for p in points for s in [p.summary()] if math.isfinite(s["p99 s"])]
    cap = 1.5 * max(finite) if finite else 1.0
    top = 0.0
    for route in routes:
        rows = sorted((p.summary() for p in points if p.route == route),
                      key=lambda r: r["offered req/s"])
        x = [r["offered req/s"] for r in rows]
        top = max(top, *x)
        line, = ax1.plot(x, [r["achieved req/s"] for r in rows], "o-", label=route)
        ax2.plot(x, [_finite(r["p99 s"], cap) for r in rows], "o-", color=line.get_color(),
                 label=route)
        for r in rows:
            if not math.isfinite(r["p99 s"]):
                ax2.annotate("no reply\nin time", (r["offered req/s"], cap), fontsize=7,
                             ha="center", va="top", color=line.get_color())
        k = knees.get(route) or {}
        if k.get("knee req/s") is not None:
            ax1.axvline(k["knee req/s"], color=line.get_color(), ls=":", alpha=0.7)
    ax1.plot([0, top], [0, top], color="grey", lw=0.8, ls="--", label="achieved = offered")
    ax1.set(title="Throughput (dotted: each route's knee)", xlabel="offered load (requests/s)",
            ylabel="achieved (requests/s)")
    ax2.set(title="p99 latency, publish to reply", xlabel="offered load (requests/s)",
            ylabel="p99 latency (s)")
    if finite and max(finite) > 20 * min(finite):
        ax2.set_yscale("log")
    for ax in (ax1, ax2):
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    return fig


def workers_figure(points: Sequence[Point], rate_index: int = -1):
    """At one load (the highest by default): the batch sizes each route's workers ran, and the
    share of the wall time each worker was busy."""
    routes = list(dict.fromkeys(p.route for p in points))
    rates = sorted({p.rate for p in points})
    rate = rates[rate_index]
    chosen = {p.route: p for p in points if p.rate == rate}
    fig = new_figure((11, 4.0))
    ax1, ax2 = fig.subplots(1, 2)
    slots = max((b for p in chosen.values() for a in p.activity.values() for b in a["batches"]),
                default=1)
    edges = np.arange(0.5, slots + 1.5)
    width = 0.8 / max(len(routes), 1)
    for i, route in enumerate(routes):
        p = chosen.get(route)
        if p is None:
            continue
        batches = [b for a in p.activity.values() for b in a["batches"]]
        counts, _ = np.histogram(batches, bins=edges)
        share = counts / max(counts.sum(), 1)
        ax1.bar(np.arange(1, slots + 1) + (i - (len(routes) - 1) / 2) * width, share, width,
                label=f"{route} (mean {np.mean(batches) if batches else 0:.2f})")
        workers = sorted(p.activity)
        ax2.bar(np.arange(len(workers)) + (i - (len(routes) - 1) / 2) * width,
                [p.activity[w]["busy"] for w in workers], width, label=route)
    ax1.set(title=f"Batch sizes the workers ran (at {rate:.2g} req/s asked)",
            xlabel="requests in one engine step", ylabel="share of steps")
    ax1.set_xticks(range(1, slots + 1))
    workers = sorted(next(iter(chosen.values())).activity)
    ax2.set_xticks(range(len(workers)), workers)
    ax2.set(title="Busy time per worker (steps + loads) / wall time", xlabel="worker",
            ylabel="busy fraction")
    ax2.set_ylim(0, 1.05)
    for ax in (ax1, ax2):
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    return fig


def zipf_figure(curves: list[dict], live: ZipfResult, live_budget: float):
    """Hit rate vs Zipf exponent per budget (replayed policy and Che's approximation), the
    live run marked; and the live latencies split into hits and misses."""
    fig = new_figure((11, 4.2))
    ax1, ax2 = fig.subplots(1, 2)
    for b in sorted({r["budget (models)"] for r in curves}):
        rows = [r for r in curves if r["budget (models)"] == b]
        s = [r["zipf s"] for r in rows]
        line, = ax1.plot(s, [r["replayed hit rate"] for r in rows], "o-", ms=3,
                         label=f"budget {b:g} models (replay)")
        ax1.plot(s, [r["Che's approximation"] for r in rows], "--", color=line.get_color(),
                 lw=1, label=f"budget {b:g} models (Che)")
    ax1.plot([live.s], [live.hit_rate()], "k*", ms=12,
             label=f"live run (budget {live_budget:g}, s = {live.s:g})")
    ax1.set(title="Hit rate: requests whose model was resident", xlabel="Zipf exponent s",
            ylabel="hit rate")
    ax1.set_ylim(0, 1.02)
    rec = [r for r in live.point.records if r["latency_s"] is not None]
    hits = sorted(r["latency_s"] for r in rec if r["hit"])
    misses = sorted(r["latency_s"] for r in rec if not r["hit"])
    for vals, label in ((hits, "hit"), (misses, "miss (model loaded first)")):
        if vals:
            ax2.plot(vals, np.arange(1, len(vals) + 1) / len(vals), drawstyle="steps-post",
                     label=f"{label}: {len(vals)} requests")
    if rec:
        p99 = percentile([r["latency_s"] for r in rec], 99)
        ax2.axvline(p99, color="k", ls=":", label=f"p99 of all: {p99:.2f} s")
    ax2.set(title="Live run: latency of hits and misses", xlabel="latency (s)",
            ylabel="fraction of requests at or below")
    for ax in (ax1, ax2):
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    return fig


def encoding_figure(rows: list[dict]):
    """Encoded size / raw size, and encode + decode time, per payload and encoding."""
    fig = new_figure((11, 4.0))
    ax1, ax2 = fig.subplots(1, 2)
    payloads = list(dict.fromkeys(r["payload"] for r in rows))
    encodings = list(dict.fromkeys(r["encoding"] for r in rows))
    width = 0.8 / len(encodings)
    for i, enc in enumerate(encodings):
        sel = [next(r for r in rows if r["payload"] == p and r["encoding"] == enc)
               for p in payloads]
        x = np.arange(len(payloads)) + (i - (len(encodings) - 1) / 2) * width
        ax1.bar(x, [r["size / raw"] for r in sel], width, label=enc)
        ax2.bar(x, [(r["encode us"] + r["decode us"]) / 1e3 for r in sel], width, label=enc)
    labels = [p.split(":")[0] for p in payloads]
    ax1.set_xticks(range(len(payloads)), labels)
    ax2.set_xticks(range(len(payloads)), labels)
    ax1.axhline(4 / 3, color="grey", ls=":", lw=1)
    ax1.set(title="Bytes on the wire / raw bytes (dotted: 4/3)", ylabel="size / raw")
    ax2.set(title="Encode + decode, one message", ylabel="milliseconds (log)")
    ax2.set_yscale("log")
    for ax in (ax1, ax2):
        ax.grid(True, alpha=0.3, axis="y")
        ax.legend(fontsize=8)
    return fig


def kill_figure(result: dict):
    """Every request as a bar from publish to reply, coloured by the worker that answered;
    the kill and ``ack_wait`` after it marked."""
    run = result["run"]
    rec = sorted(run.records, key=lambda r: r["sent"])
    t0 = min(r["sent"] for r in rec)
    fig, ax = figure("A worker killed mid-request: every request, publish to reply",
                     "seconds since the first request", "request")
    workers = sorted({r["worker"] for r in rec if r["worker"]})
    colors = {w: f"C{i}" for i, w in enumerate(workers)}
    for i, r in enumerate(rec):
        if r["received"] is None:
            ax.barh(i, 1, left=r["sent"] - t0, color="red")
            continue
        ax.barh(i, r["received"] - r["sent"], left=r["sent"] - t0, color=colors[r["worker"]],
                hatch="//" if r["delivered"] > 1 else None, edgecolor="k", lw=0.3)
    handles = [Patch(color=colors[w], label=f"answered by {w}") for w in workers]
    handles.append(Patch(facecolor="white", hatch="//", edgecolor="k",
                         label="delivered a second time"))
    if result["killed_at"]:
        k = result["killed_at"] - t0
        handles.append(ax.axvline(k, color="red", ls="--", label=f"{result['victim']} killed"))
        handles.append(ax.axvspan(k, k + result["ack_wait"], color="red", alpha=0.08,
                                  label=f"ack_wait ({result['ack_wait']:g} s) after the kill"))
    ax.set_yticks(range(len(rec)), [r["id"] for r in rec])
    ax.legend(handles=handles, fontsize=8, loc="lower right")
    return fig
