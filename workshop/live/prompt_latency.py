"""Time to first token against prompt length: the prefill is paid before any output appears.

``ttft_slope`` is arithmetic (unit-tested); ``ttft_sweep`` times single requests on a live
server, one prompt length after another, with nothing else running. A request is timed cold:
the prefix cache is emptied before it, and one whose usage still reports prompt tokens served
from the cache keeps its row (``cached tokens``) but is left out of every figure (``cold``).
"""

from __future__ import annotations

import math
import statistics
from typing import Any, Callable, Sequence

from workshop.live.live_requests import PromptMaker, reset_prefix_cache, stream_completion


def cold(rows: list[dict]) -> list[dict]:
    """The rows of requests that completed with a first token and no cached prompt tokens."""
    return [r for r in rows if not r["error"] and not r.get("cached tokens")
            and not math.isnan(r["TTFT (ms)"])]


def cached_count(rows: list[dict]) -> int:
    """How many requests reported prompt tokens served from the prefix cache (left out)."""
    return sum(1 for r in rows if not r["error"] and r.get("cached tokens"))


def median_by_length(rows: list[dict]) -> list[tuple[int, float]]:
    """(prompt tokens, median TTFT ms) of the cold requests, one per length, shortest first."""
    by: dict[int, list[float]] = {}
    for r in cold(rows):
        by.setdefault(r["prompt tokens"], []).append(r["TTFT (ms)"])
    return [(n, statistics.median(by[n])) for n in sorted(by)]


def line_fit(points: Sequence[tuple[float, float]]) -> tuple[float, float] | None:
    """Least-squares line through (x, y) points: (slope, intercept), or None with fewer than
    two different x."""
    if len({x for x, _ in points}) < 2:
        return None
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    slope = (sum((x - mx) * (y - my) for x, y in points)
             / sum((x - mx) ** 2 for x, _ in points))
    return slope, my - slope * mx


def ttft_slope(rows: list[dict]) -> tuple[float, float] | None:
    """Least-squares line through (prompt tokens, TTFT ms) of the cold requests:
    (ms per 1000 tokens, ms at 0)."""
    fit = line_fit([(r["prompt tokens"], r["TTFT (ms)"]) for r in cold(rows)])
    return None if fit is None else (fit[0] * 1000, fit[1])


def plot_ttft(rows: list[dict], max_model_len: int | None = None):
    from workshop.plots import figure

    ok = cold(rows)
    fig, ax = figure("Time to first token grows with the prompt",
                     "prompt length (tokens)", "time to first token (ms)")
    ax.plot([r["prompt tokens"] for r in ok], [r["TTFT (ms)"] for r in ok], "o-",
            label="measured, one request at a time")
    if max_model_len:
        ax.axvline(max_model_len, color="tab:red", linestyle=":",
                   label=f"context limit ({max_model_len} tokens)")
    ax.set_xlim(left=0)
    ax.set_ylim(bottom=0)
    ax.legend()
    return fig


def ttft_sweep(session: Any, maker: PromptMaker, lengths: Sequence[int], repeats: int = 1,
               progress: Callable = lambda x, **_: x) -> list[dict]:
    """TTFT of single requests (nothing else running) as the prompt grows, one row per
    request; ``cached tokens`` is what its usage reported served from the prefix cache."""
    client = session.openai()
    rows = []
    plan = [n for n in lengths for _ in range(repeats)]
    # A throw-away request first: the first request after start-up pays one-off costs.
    stream_completion(client, session.model, maker.make(16), 2)
    for n in progress(plan, title="prompt length sweep"):
        reset_prefix_cache(session, tries=8)   # a cached prefix would skip the work we want to time
        r = stream_completion(client, session.model, maker.make(n), 4)
        rows.append({"prompt tokens": r.prompt_tokens or n,
                     "TTFT (ms)": r.ttft * 1000 if r.ttft is not None else float("nan"),
                     "cached tokens": r.cached_tokens, "error": r.error or ""})
    return rows


__all__ = ["cold", "cached_count", "median_by_length", "line_fit", "ttft_slope", "plot_ttft",
           "ttft_sweep"]
