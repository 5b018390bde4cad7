"""Figures. Every function returns a matplotlib Figure (headless backend when none is set).

A leaf of the harness: it imports no other module of ``workshop.bench``
(``tests/unit/test_bench_imports.py``). Its inputs are duck-typed: a run is anything with a
``BenchResult``'s ``records``, ``summary``, ``config`` and ``label``; a sweep anything with a
``SweepResult``'s ``points``, ``loads``, ``offered()``, ``achieved()``, ``judged()``,
``knee_index``, ``mode``, ``config`` and ``slo``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

_STATS = ("mean", "median", "p90", "p95", "p99")
# Engine labels that always wear the same tab10 colour, in colour order: the showdown's
# contenders, its CPU field then the GPU field's others (tests/unit/test_showdown.py keeps
# them in step), so an engine has one colour in notebook 10's curves and notebook 11's chart.
KNOWN_ENGINES = ("vllm", "sglang", "mini-hash", "mini-radix", "hf", "vllm-tuned", "sglang-tuned")


def _plt():
    import matplotlib
    if matplotlib.get_backend().lower() not in ("module://matplotlib_inline.backend_inline",
                                                "nbagg", "widget",
                                                "module://ipympl.backend_nbagg"):
        matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _latencies(res: Any, metric: str) -> np.ndarray:
    done = [r for r in res.records if r.ok and not r.warmup]
    if metric == "ttft":
        v = [r.ttft for r in done]
    elif metric == "e2e":
        v = [r.e2e for r in done]
    elif metric == "tpot":
        v = [r.tpot for r in done if r.tpot is not None]
    elif metric == "itl":
        v = [g for r in done for g in r.itls]
    else:
        raise ValueError(metric)
    return np.sort(np.asarray(v, dtype=float) * 1e3)


def plot_latency_cdf(results: Sequence[Any],
                     metrics: Sequence[str] = ("ttft", "itl", "e2e"),
                     labels: Sequence[str] | None = None):
    """One panel per metric, one CDF line per run (log x axis)."""
    plt = _plt()
    fig, axes = plt.subplots(1, len(metrics), figsize=(4.5 * len(metrics), 3.4), squeeze=False)
    labels = labels or [r.label for r in results]
    for ax, m in zip(axes[0], metrics):
        for res, lab in zip(results, labels):
            v = _latencies(res, m)
            if v.size:
                ax.step(v, np.arange(1, v.size + 1) / v.size, where="post", label=lab)
        ax.set_xscale("log")
        ax.set_xlabel(f"{m.upper()} (ms)")
        ax.set_ylabel("fraction of " + ("gaps" if m == "itl" else "requests"))
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_percentiles(results: Sequence[Any],
                     metrics: Sequence[str] = ("ttft_ms", "itl_ms"),
                     labels: Sequence[str] | None = None):
    """Grouped bars: mean/median/p90/p95/p99 of each metric, one bar colour per run (engine)."""
    plt = _plt()
    fig, axes = plt.subplots(1, len(metrics), figsize=(5.5 * len(metrics), 3.4), squeeze=False)
    labels = labels or [r.label for r in results]
    x = np.arange(len(_STATS))
    w = 0.8 / max(len(results), 1)
    for ax, m in zip(axes[0], metrics):
        for i, (res, lab) in enumerate(zip(results, labels)):
            vals = [res.summary[m][s] or 0.0 for s in _STATS]
            ax.bar(x + i * w - 0.4 + w / 2, vals, w, label=lab)
        ax.set_xticks(x, _STATS)
        ax.set_ylabel(m.replace("_ms", "").upper() + " (ms)")
        ax.grid(axis="y", alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_load_curve(sweep: Any):
    """Achieved vs offered load (or vs concurrency) with the knee marked; p99 TTFT on the right."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 4))
    x = sweep.offered()
    y = sweep.achieved()
    ax.plot(x, y, "o-", label="achieved")
    if sweep.mode == "rate":
        lim = max(x + y) * 1.05
        ax.plot([0, lim], [0, lim], "--", color="grey", lw=1, label="achieved = offered")
        ax.set_xlabel("offered load (req/s, as scheduled)")
    else:
        ax.set_xlabel("concurrency")
    ax.set_ylabel("achieved throughput (req/s)")
    if sweep.knee_index is not None:
        k = sweep.knee_index
        ax.plot([x[k]], [y[k]], "r*", ms=16, label=f"knee ({sweep.loads[k]:g})")
    ax2 = ax.twinx()
    ttft = [p.summary["ttft_ms"]["p99"] or np.nan for p in sweep.points]
    ax2.plot(x, ttft, "s:", color="tab:orange", label="p99 TTFT")
    ax2.set_ylabel("p99 TTFT (ms)", color="tab:orange")
    slo = sweep.slo.ttft_ms
    if slo:
        ax2.axhline(slo, color="tab:orange", lw=0.8, alpha=0.6)
    lines = ax.get_legend_handles_labels()
    lines2 = ax2.get_legend_handles_labels()
    ax.legend(lines[0] + lines2[0], lines[1] + lines2[1], fontsize=8, loc="upper left")
    ax.grid(alpha=0.3)
    ax.set_title(f"{sweep.config.get('workload', '')}: load sweep")
    fig.tight_layout()
    return fig


def plot_prefix_hit(results: Sequence[Any], labels: Sequence[str] | None = None):
    """Per run (usually one per workload): theoretical prefix reuse vs the hit rate measured."""
    plt = _plt()
    labels = (labels or [f"{r.summary.get('workload', {}).get('workload', '?')}\n{r.label}"
                         for r in results])
    theo = [100 * (r.summary.get("workload", {}).get("prefix_reuse_ratio") or 0) for r in results]
    server = [100 * ((r.summary.get("server") or {}).get("prefix_cache_hit_rate") or 0)
              for r in results]
    client = [100 * (r.summary.get("client_cached_token_ratio") or 0) for r in results]
    x = np.arange(len(results))
    fig, ax = plt.subplots(figsize=(max(5, 1.6 * len(results)), 3.6))
    ax.bar(x - 0.27, theo, 0.27, label="theoretical (perfect cache)")
    ax.bar(x, server, 0.27, label="server /metrics")
    ax.bar(x + 0.27, client, 0.27, label="usage.cached_tokens")
    ax.set_xticks(x, labels, fontsize=8)
    ax.set_ylabel("prompt tokens from cache (%)")
    ax.set_ylim(0, 105)
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    return fig


def plot_timeline(res: Any, max_requests: int = 400):
    """Each request as a line: grey while waiting (scheduled -> first token), blue while
    streaming."""
    plt = _plt()
    recs = [r for r in res.records if not r.warmup][:max_requests]
    fig, ax = plt.subplots(figsize=(7, 0.02 * len(recs) + 2.5))
    for i, r in enumerate(recs):
        end = r.end if r.end is not None else r.sent
        if r.first_token is not None:
            ax.hlines(i, r.scheduled, r.first_token, color="grey", lw=1.5)
            ax.hlines(i, r.first_token, end, color="tab:blue", lw=1.5)
        else:
            ax.hlines(i, r.scheduled, end, color="tab:red", lw=1.5)
    ax.set_xlabel("time since start (s)")
    ax.set_ylabel("request")
    ax.set_title("grey: waiting for first token, blue: streaming, red: failed", fontsize=9)
    fig.tight_layout()
    return fig


def save_run_plots(res: Any, folder: Path) -> None:
    """A run folder's figures: ``latency_cdf.png`` and ``timeline.png``."""
    plt = _plt()
    for name, fig in (("latency_cdf.png", plot_latency_cdf([res])),
                      ("timeline.png", plot_timeline(res))):
        fig.savefig(Path(folder) / name, dpi=110, bbox_inches="tight")
        plt.close(fig)


def save_sweep_plots(sweep: Any, folder: Path) -> None:
    """A saved sweep folder's figures: each point's and probe's run figures in its own folder
    (``path``, set when the sweep was saved), and ``load_curve.png``."""
    for p in (*sweep.points, *sweep.probes.values()):
        save_run_plots(p, p.path)
    fig = plot_load_curve(sweep)
    fig.savefig(Path(folder) / "load_curve.png", dpi=120, bbox_inches="tight")
    _plt().close(fig)


def engine_colors(labels: Sequence[str],
                  known: Sequence[str] = KNOWN_ENGINES) -> dict[str, tuple[float, ...]]:
    """Each engine label's colour, the same in every figure (notebook 10's curves, notebook
    11's decision chart): each of ``known`` always gets the same tab10 colour, whichever others
    are drawn; any other label gets one of the colours left, in sorted order of the other
    labels drawn."""
    from matplotlib import colormaps

    cmap = colormaps["tab10"]
    known = list(known)
    spare = [i for i in range(cmap.N) if i >= len(known)]
    others = sorted({e for e in labels if e not in known})
    out = {}
    for e in labels:
        i = known.index(e) if e in known else spare[others.index(e) % len(spare)]
        out[e] = cmap(i % cmap.N)
    return out


def plot_showdown(sweeps: Mapping[str, Mapping[str, Any]], metric: str = "ttft_ms"):
    """One column per workload: achieved vs offered load of every engine (knees starred, points
    too short to judge hollow), and below it the p99 of ``metric`` against offered load.
    ``sweeps``: workload -> engine -> sweep. Offered and achieved rates are in requests/s over
    each point's steady window."""
    from matplotlib.lines import Line2D

    from workshop.plots import new_figure
    workloads = list(sweeps)
    engines = sorted({e for per in sweeps.values() for e in per})
    colors = engine_colors(engines)
    unjudged_any = False
    fig = new_figure((4.6 * max(len(workloads), 1), 7.2))
    axes = fig.subplots(2, max(len(workloads), 1), squeeze=False, sharex="col")
    for j, w in enumerate(workloads):
        top, bottom = axes[0][j], axes[1][j]
        lim = 0.0
        for e, sw in sweeps[w].items():
            x, y = sw.offered(), sw.achieved()
            lim = max([lim, *x, *y])
            top.plot(x, y, "o-", color=colors[e], label=e, ms=4)
            p99 = [p.summary[metric]["p99"] if p.summary[metric]["p99"] is not None else np.nan
                   for p in sw.points]
            bottom.plot(x, p99, "o-", color=colors[e], label=e, ms=4)
            unjudged = [i for i, j in enumerate(sw.judged()) if j is False]
            unjudged_any = unjudged_any or bool(unjudged)
            for ax, ys in ((top, y), (bottom, p99)):
                ax.plot([x[i] for i in unjudged], [ys[i] for i in unjudged], "o", ms=7, mfc="white",
                        mec=colors[e], mew=1.2, ls="none")
            if sw.knee_index is not None:
                k = sw.knee_index
                top.plot([x[k]], [y[k]], "*", color=colors[e], ms=15, mec="black", mew=0.6)
                bottom.plot([x[k]], [p99[k]], "*", color=colors[e], ms=15, mec="black", mew=0.6)
        top.plot([0, lim * 1.05], [0, lim * 1.05], "--", color="grey", lw=1)
        top.set_title(w)
        top.set_ylabel("achieved (req/s)")
        bottom.set_ylabel(f"p99 {metric.replace('_ms', '').upper()} (ms)")
        bottom.set_yscale("log")
        bottom.set_xlabel("offered load (req/s)")
        slo = (getattr(next(iter(sweeps[w].values())).slo, metric, None) if sweeps[w]
               else None)
        if slo:
            bottom.axhline(slo, color="black", lw=0.8, ls=":", label="objective")
        for ax in (top, bottom):
            ax.grid(alpha=0.3)
    handles, labels = axes[0][0].get_legend_handles_labels()
    if unjudged_any:
        handles.append(Line2D([], [], marker="o", ms=7, mfc="white", mec="grey", ls="none"))
        labels.append("not judged: too few\nrequests in the point")
    axes[0][0].legend(handles, labels, fontsize=8, loc="upper left")
    fig.suptitle("Every engine swept to its knee (star); on the dashed line an engine keeps up")
    return fig
