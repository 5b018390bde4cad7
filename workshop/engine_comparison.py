"""The same requests through two engines, each one at a time and many at once.

"vLLM is N x faster than the Hugging Face baseline" multiplies two effects: the engine itself
(both serving one request at a time) and batching (many requests in one model step). With the
four runs hf/vllm x sequential/concurrent, ``speedup_factors`` splits the total into them.
The factors are arithmetic (unit-tested); ``compare_engines`` runs the benchmark harness
against live servers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Trial:
    engine: str          # "hf" or "vllm"
    concurrency: int     # requests in flight at once (1 = one after another)


def speedup_factors(throughput: dict[Trial, float], concurrency: int) -> dict[str, float]:
    """Split the total speed-up into what each change contributes.

    ``throughput`` maps the four trials (hf/vllm x 1/``concurrency``) to output tokens/s.
    The product of "better engine, one at a time" and "batching on that engine" is the total,
    which is the number usually quoted as "vLLM is N x faster than Hugging Face".
    """
    hf1, hfc = throughput[Trial("hf", 1)], throughput[Trial("hf", concurrency)]
    v1, vc = throughput[Trial("vllm", 1)], throughput[Trial("vllm", concurrency)]
    return {
        "engine alone (both sequential)": v1 / hf1,
        "concurrency without batching (hf)": hfc / hf1,
        "concurrency with batching (vllm)": vc / v1,
        "total: vllm concurrent vs hf sequential": vc / hf1,
        "like for like: both concurrent": vc / hfc,
    }


def factor_rows(rows: list[dict], concurrency: int) -> list[dict]:
    """``speedup_factors`` of ``compare_engines``' rows, as table rows."""
    tput = {Trial(r["engine"], r["in flight"]): r["output tok/s"] for r in rows}
    return [{"comparison": k, "speed-up (x)": v}
            for k, v in speedup_factors(tput, concurrency).items()]


def plot_throughput(rows: list[dict]):
    from workshop.plots import figure

    fig, ax = figure("Same requests, four ways of serving them", "",
                     "output throughput (tokens/s)")
    names = {"hf": "Hugging Face baseline (hf)", "vllm": "vLLM"}
    colors = {"hf": "tab:orange", "vllm": "tab:blue"}
    for i, r in enumerate(rows):
        bars = ax.bar([i], [r["output tok/s"]], color=colors.get(r["engine"], "tab:gray"),
                      label=names.get(r["engine"], r["engine"]))
        ax.bar_label(bars, fmt="%.0f")
    ax.set_xticks(range(len(rows)), [
        f"{r['engine']}\n" + ("one at a time" if r["in flight"] == 1 else f"{r['in flight']} at once")
        for r in rows])
    handles, labels = ax.get_legend_handles_labels()
    unique = dict(zip(labels, handles))          # one legend entry per engine
    ax.legend(unique.values(), unique.keys())
    return fig


def compare_engines(sessions: dict[str, Any], num_requests: int, concurrency: int,
                    input_len: int, output_len: int, progress: bool = True) -> list[dict]:
    """The same random workload through each engine, one at a time and ``concurrency`` at once."""
    from workshop.bench import run_benchmark

    rows = []
    for engine, s in sessions.items():
        for c in (1, concurrency):
            res = run_benchmark(base_url=s.base_url, model=s.model, workload="random",
                                num_requests=num_requests, concurrency=c, api_key=s.api_key,
                                input_len=input_len, output_len=output_len, progress=progress,
                                warmup=1, seed=7)
            summ = res.summary
            rows.append({"engine": engine, "in flight": c, "requests": summ["completed"],
                         "errors": summ["errors"], "wall time (s)": summ["duration_s"],
                         "output tok/s": summ["output_throughput"],
                         "requests/s": summ["request_throughput"],
                         "median TTFT (ms)": summ["ttft_ms"]["median"],
                         "median TPOT (ms)": summ["tpot_ms"]["median"]})
    return rows


__all__ = ["Trial", "speedup_factors", "factor_rows", "plot_throughput", "compare_engines"]
