"""The same requests through two engines, each one at a time and many at once.

"vLLM is N x faster than the Hugging Face baseline" multiplies two effects: the engine itself
(both serving one request at a time) and batching (many requests in one model step). With the
four runs baseline/engine x sequential/concurrent (hf and whichever engine the notebook
connected to: vLLM, SGLang, ...), ``speedup_factors`` splits the total into them.
The factors are arithmetic (unit-tested); ``compare_engines`` runs the benchmark harness
against live servers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Trial:
    engine: str          # "hf" (the baseline), "vllm", "sglang", ...
    concurrency: int     # requests in flight at once (1 = one after another)


BASELINE = "hf"


def speedup_factors(throughput: dict[Trial, float], concurrency: int, engine: str = "vllm",
                    baseline: str = BASELINE) -> dict[str, float]:
    """Split the total speed-up into what each change contributes.

    ``throughput`` maps the four trials (``baseline``/``engine`` x 1/``concurrency``) to
    output tokens/s. The product of "better engine, one at a time" and "batching on that
    engine" is the total, the number usually quoted as "vLLM is N x faster than Hugging Face".
    The keys name the two engines: ``"concurrency with batching (sglang)"``.
    """
    b1, bc = throughput[Trial(baseline, 1)], throughput[Trial(baseline, concurrency)]
    e1, ec = throughput[Trial(engine, 1)], throughput[Trial(engine, concurrency)]
    return {
        "engine alone (both sequential)": e1 / b1,
        f"concurrency without batching ({baseline})": bc / b1,
        f"concurrency with batching ({engine})": ec / e1,
        f"total: {engine} concurrent vs {baseline} sequential": ec / b1,
        "like for like: both concurrent": ec / bc,
    }


def compared_engine(rows: list[dict], baseline: str = BASELINE) -> str:
    """The one engine in ``compare_engines``' rows that is not the baseline."""
    others = sorted({r["engine"] for r in rows} - {baseline})
    if len(others) != 1:
        raise ValueError(f"expected the {baseline} baseline and one engine, got {others}")
    return others[0]


def factor_rows(rows: list[dict], concurrency: int, baseline: str = BASELINE) -> list[dict]:
    """``speedup_factors`` of ``compare_engines``' rows, as table rows."""
    tput = {Trial(r["engine"], r["in flight"]): r["output tok/s"] for r in rows}
    return [{"comparison": k, "speed-up (x)": v}
            for k, v in speedup_factors(tput, concurrency, compared_engine(rows, baseline),
                                        baseline).items()]


def plot_throughput(rows: list[dict]):
    from workshop.plots import figure
    from workshop.session import engine_name

    fig, ax = figure("Same requests, four ways of serving them", "",
                     "output throughput (tokens/s)")
    names = {BASELINE: "Hugging Face baseline (hf)"}
    colors = {BASELINE: "tab:orange"}
    for i, r in enumerate(rows):
        bars = ax.bar([i], [r["output tok/s"]], color=colors.get(r["engine"], "tab:blue"),
                      label=names.get(r["engine"], engine_name(r["engine"])))
        ax.bar_label(bars, fmt="%.0f")
    ax.set_xticks(range(len(rows)), [
        f"{r['engine']}\n" + ("one at a time" if r["in flight"] == 1
                              else f"{r['in flight']} at once")
        for r in rows])
    handles, labels = ax.get_legend_handles_labels()
    unique = dict(zip(labels, handles))          # one legend entry per engine
    ax.legend(unique.values(), unique.keys())
    return fig


def compare_engines(sessions: dict[str, Any], num_requests: int, concurrency: int,
                    input_len: int, output_len: int, progress: bool = True) -> list[dict]:
    """The same random workload through each engine, one at a time and ``concurrency`` at once."""
    from workshop.bench import run_benchmark
    from workshop.timing import let_servers_rest

    rows = []
    for engine, s in sessions.items():
        for c in (1, concurrency):
            let_servers_rest()     # the last run's server would still spin on a core
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


__all__ = ["Trial", "BASELINE", "speedup_factors", "compared_engine", "factor_rows",
           "plot_throughput", "compare_engines"]
