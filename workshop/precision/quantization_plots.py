"""Notebook 4's figure: what each weight format costs in memory and in quality."""

from __future__ import annotations

from workshop.plots import figure


def plot_tradeoff(rows: list[dict]):
    """Weight memory against perplexity, one labelled point per variant (rows as returned by
    ``evaluate_variant``): the trade-off at a glance, lower-left is better."""
    fig, ax = figure("Memory vs quality of each weight format", "weights (MiB)",
                     "perplexity on held-out ShareGPT (lower is better)")
    for r in rows:
        ax.scatter(r["weights (MiB)"], r["perplexity"], s=45, label=r["variant"])
    ax.legend(fontsize=8)
    return fig


__all__ = [
    "plot_tradeoff",
]
