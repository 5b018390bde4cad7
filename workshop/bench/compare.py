"""Several result folders -> one table and one figure."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

from .plots import _STATS, _plt
from .results import BenchResult

COLUMNS = ("label", "workload", "load", "completed", "errors", "req/s", "out tok/s", "goodput",
           "TTFT p50", "TTFT p99", "TPOT p50", "ITL p50", "ITL p99", "E2E p50", "prefix hit %",
           "KV peak %",
           "lag p99")


def _row(r: BenchResult) -> list[str]:
    s = r.summary
    c = r.config
    srv = s.get("server") or {}

    def ms(m: str, p: str) -> str:
        v = s[m][p]
        return "-" if v is None else f"{v:.1f}"

    def pct(v) -> str:
        return "-" if v is None else f"{100 * v:.0f}"

    load = f"{c['request_rate']:g} req/s" if c.get("request_rate") else f"c={c.get('concurrency')}"
    return [r.label, c.get("workload", "?"), load, str(s["completed"]), str(s["errors"]),
            f"{s['request_throughput']:.2f}", f"{s['output_throughput']:.1f}",
            f"{s['goodput']:.2f}",
            ms("ttft_ms", "median"), ms("ttft_ms", "p99"), ms("tpot_ms", "median"),
            ms("itl_ms", "median"),
            ms("itl_ms", "p99"), ms("e2e_ms", "median"),
            pct(srv.get("prefix_cache_hit_rate", s.get("client_cached_token_ratio"))),
            pct(srv.get("peak_kv_usage")),
            ms("schedule_lag_ms", "p99")]


def compare_table(results: Sequence[BenchResult]) -> str:
    """A Markdown table, one row per run (latencies in ms)."""
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(_row(r)) + " |" for r in results]
    return "\n".join(lines)


def compare_figure(results: Sequence[BenchResult]):
    """TTFT and ITL percentiles per run, output throughput, and prefix reuse, in one figure."""
    import numpy as np

    plt = _plt()
    fig, axes = plt.subplots(2, 2, figsize=(12, 7))
    labels = [r.label if len({x.label for x in results}) == len(results)
              else f"{r.label}/{r.config.get('workload')}"
              for r in results]
    x = np.arange(len(_STATS))
    w = 0.8 / max(len(results), 1)
    for ax, m in zip(axes[0], ("ttft_ms", "itl_ms")):
        for i, (r, lab) in enumerate(zip(results, labels)):
            ax.bar(x + i * w - 0.4 + w / 2, [r.summary[m][s] or 0 for s in _STATS], w, label=lab)
        ax.set_xticks(x, _STATS)
        ax.set_ylabel(m.replace("_ms", "").upper() + " (ms)")
        ax.grid(axis="y", alpha=0.3)
    axes[0][0].legend(fontsize=8)
    xi = np.arange(len(results))
    axes[1][0].bar(xi, [r.summary["output_throughput"] for r in results], color="tab:green")
    axes[1][0].set_xticks(xi, labels, fontsize=8, rotation=15)
    axes[1][0].set_ylabel("output tokens/s")
    axes[1][0].grid(axis="y", alpha=0.3)
    theo = [100 * (r.summary.get("workload", {}).get("prefix_reuse_ratio") or 0) for r in results]
    hit = [100 * ((r.summary.get("server") or {}).get("prefix_cache_hit_rate")
                  or r.summary.get("client_cached_token_ratio") or 0) for r in results]
    axes[1][1].bar(xi - 0.2, theo, 0.4, label="theoretical")
    axes[1][1].bar(xi + 0.2, hit, 0.4, label="measured")
    axes[1][1].set_xticks(xi, labels, fontsize=8, rotation=15)
    axes[1][1].set_ylabel("prefix-cache hit (%)")
    axes[1][1].legend(fontsize=8)
    axes[1][1].grid(axis="y", alpha=0.3)
    fig.tight_layout()
    return fig


def compare_folders(folders: Sequence[str | os.PathLike], out: str | os.PathLike | None = None,
                    labels: Sequence[str] | None = None) -> tuple[str, object]:
    """Load result folders, return (Markdown table, figure); write compare.md/.png to ``out``."""
    results = [BenchResult.load(f) for f in folders]
    if labels:
        for r, lab in zip(results, labels):
            r.config["label"] = lab
    table = compare_table(results)
    fig = compare_figure(results)
    if out is not None:
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "compare.md").write_text(table + "\n")
        fig.savefig(out / "compare.png", dpi=120, bbox_inches="tight")
    return table, fig
