"""Notebook 1's measurements: why serving an LLM naively hurts.

Three experiments, all live against a running server:

* KV memory: the cache grows with every token of every running request. We read the engine's
  own gauge (``vllm:kv_cache_usage_perc``) *while* requests run and set it next to the formula
  ``2 x layers x KV heads x head_dim x bytes`` from the model's config.
* TTFT: the prompt is processed before the first token, so TTFT grows with prompt length.
* One-at-a-time serving: the same requests through the naive Hugging Face server and through
  vLLM, each both sequentially and concurrently, so each factor of the speed-up shows.

The pure functions (block arithmetic, predictions, factor table) are unit-tested; the live
ones are exercised by the notebook tests.
"""

from __future__ import annotations

import math
import random
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from reference_server import dtypes, prometheus
from reference_server.kv import blocks_for, kv_bytes_per_token
from reference_server.model_config import ModelArch, read_arch
from workshop.metrics import MetricsSampler, Samples

KV_USAGE = prometheus.KV_CACHE_USAGE
RUNNING = prometheus.NUM_REQUESTS_RUNNING
WAITING = prometheus.NUM_REQUESTS_WAITING
MIB = 2**20


# -- the formula ------------------------------------------------------------------------------

@dataclass(frozen=True)
class KVFormula:
    """The terms of bytes/token = 2 x layers x KV heads x head_dim x dtype bytes."""

    arch: ModelArch
    dtype: str                 # canonical name, "auto" already resolved

    @property
    def layers(self) -> int:
        return self.arch.num_layers

    @property
    def kv_heads(self) -> int:
        return self.arch.num_kv_heads

    @property
    def head_dim(self) -> int:
        return self.arch.head_dim

    @property
    def attention_heads(self) -> int:
        return self.arch.num_heads

    @property
    def dtype_bytes(self) -> float:
        return dtypes.bytes_per_element(self.dtype)

    @property
    def bytes_per_token(self) -> int:
        return int(kv_bytes_per_token(self.arch, self.dtype))

    def explain(self) -> str:
        return (f"2 (K and V) x {self.layers} layers x {self.kv_heads} KV heads x "
                f"{self.head_dim} dims x {self.dtype_bytes:g} bytes ({self.dtype}) = "
                f"{self.bytes_per_token:,} bytes per token")


def kv_formula(arch: ModelArch, dtype: str) -> KVFormula:
    """The formula's terms for ``arch`` with the cache in ``dtype`` ("auto": the model's)."""
    return KVFormula(arch=arch, dtype=dtypes.canonical(dtype, arch.torch_dtype))


# vLLM keeps one block aside (its "null block") and reports usage against the rest:
# vllm/v1/core/block_pool.py, BlockPool.get_usage.
RESERVED_BLOCKS = 1


def usable_blocks(capacity_tokens: int, block_size: int, reserved: int = RESERVED_BLOCKS) -> int:
    return capacity_tokens // block_size - reserved


def predicted_usage(tokens_per_request: Sequence[int], block_size: int,
                    capacity_tokens: int, reserved: int = RESERVED_BLOCKS) -> float:
    """Fraction of the KV cache, as the engine's gauge reports it, that these requests occupy."""
    used = sum(blocks_for(t, block_size) for t in tokens_per_request)
    return used / usable_blocks(capacity_tokens, block_size, reserved)


def users_until_full(tokens_per_user: int, block_size: int, capacity_tokens: int,
                     reserved: int = RESERVED_BLOCKS) -> int:
    """How many users of this size fit in the KV cache at once."""
    return (usable_blocks(capacity_tokens, block_size, reserved)
            // max(blocks_for(tokens_per_user, block_size), 1))


# -- prompts of a known length -------------------------------------------------------------------

class PromptMaker:
    """Prompts of exactly ``n`` tokens, each one different from the first word on.

    Different first words mean no two prompts share a prefix, so prefix caching cannot make
    two users share memory (prefix caching, later in the course, is about when they can).
    """

    def __init__(self, model: str, model_path: str | None = None, seed: int = 0) -> None:
        from workshop.bench.workloads import Tokenizer
        tokenizer = model_path if model_path and Path(model_path).is_dir() else None
        self.tok = Tokenizer.load(model, tokenizer)
        self.rng = random.Random(seed)

    @property
    def exact(self) -> bool:
        return self.tok.hf is not None

    def make(self, n_tokens: int) -> str:
        from workshop.bench.workloads import exact_filler
        return exact_filler(self.tok, self.rng, n_tokens)


# -- live requests -----------------------------------------------------------------------------

@dataclass
class Timed:
    """One streamed completion. Times are seconds after it was sent."""

    ttft: float | None = None
    end: float = 0.0
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    error: str | None = None


def stream_completion(client: Any, model: str, prompt: str, max_tokens: int,
                      ignore_eos: bool = True) -> Timed:
    """Stream one ``/v1/completions`` request and time its first token and its end."""
    t = Timed()
    start = time.perf_counter()
    try:
        stream = client.completions.create(
            model=model, prompt=prompt, max_tokens=max_tokens, temperature=0.0, stream=True,
            stream_options={"include_usage": True}, extra_body={"ignore_eos": ignore_eos})
        for chunk in stream:
            if chunk.usage is not None:
                t.prompt_tokens = chunk.usage.prompt_tokens
                t.completion_tokens = chunk.usage.completion_tokens
            if t.ttft is None and chunk.choices and chunk.choices[0].text:
                t.ttft = time.perf_counter() - start
    except Exception as e:   # reported in the table, not raised: one failure must not hide the rest
        t.error = f"{type(e).__name__}: {e}"
    t.end = time.perf_counter() - start
    return t


def run_together(fn: Callable[[str], Timed], prompts: Sequence[str]) -> list[Timed]:
    """Send every prompt at once (one thread each) and wait for all of them."""
    with ThreadPoolExecutor(max_workers=max(len(prompts), 1)) as pool:
        return list(pool.map(fn, prompts))


def reset_prefix_cache(session: Any) -> None:
    import httpx
    try:
        httpx.post(session.base_url + "/reset_prefix_cache", headers=session.headers, timeout=30)
    except httpx.HTTPError:
        pass   # a server without the endpoint simply keeps its cache


@dataclass
class KVRun:
    requests: list[Timed]
    samples: Samples

    @property
    def peak_usage(self) -> float:
        return self.samples.peak(KV_USAGE)

    @property
    def peak_running(self) -> int:
        return int(self.samples.peak(RUNNING))

    @property
    def peak_waiting(self) -> int:
        return int(self.samples.peak(WAITING))

    @property
    def samples_while_running(self) -> int:
        return sum(v > 0 for v in self.samples.values.get(RUNNING, []))


def measure_kv(session: Any, prompts: Sequence[str], max_tokens: int,
               interval: float = 0.05) -> KVRun:
    """Run ``prompts`` concurrently while sampling the KV gauge; return both."""
    client = session.openai()
    reset_prefix_cache(session)
    with MetricsSampler(session.metrics, (KV_USAGE, RUNNING, WAITING), interval) as sampler:
        results = run_together(lambda p: stream_completion(client, session.model, p, max_tokens),
                               prompts)
        time.sleep(interval * 2)   # one more sample after the last request finished
    return KVRun(results, sampler.samples)


@dataclass
class ServerKV:
    """What the engine says about its cache, plus the formula's view."""

    formula: KVFormula
    reported_bytes_per_token: int | None
    capacity_tokens: int
    block_size: int

    @property
    def capacity_bytes(self) -> float:
        return self.capacity_tokens * self.formula.bytes_per_token

    @property
    def usable_bytes(self) -> float:
        """What the usage gauge's 100% stands for: every block but the reserved one."""
        return (usable_blocks(self.capacity_tokens, self.block_size) * self.block_size
                * self.formula.bytes_per_token)


def server_kv(session: Any) -> ServerKV:
    info = session.info
    formula = kv_formula(read_arch(info["model_path"]), info.get("dtype", "auto"))
    return ServerKV(formula=formula, reported_bytes_per_token=info.get("kv_bytes_per_token"),
                    capacity_tokens=int(info["kv_capacity_tokens"]),
                    block_size=int(info.get("block_size") or 16))


def context_sweep(session: Any, kv: ServerKV, maker: PromptMaker, lengths: Sequence[int],
                  max_tokens: int, progress: Callable = lambda x, **_: x) -> list[dict]:
    """One request per prompt length: peak KV next to the prediction for prompt + output."""
    rows = []
    for n in progress(list(lengths), title="growing the context"):
        run = measure_kv(session, [maker.make(n)], max_tokens)
        r = run.requests[0]
        tokens = (r.prompt_tokens or n) + (r.completion_tokens or max_tokens)
        pred = predicted_usage([tokens], kv.block_size, kv.capacity_tokens)
        rows.append({"prompt tokens": r.prompt_tokens or n, "tokens held": tokens,
                     "KV in use (MiB, derived)": run.peak_usage * kv.usable_bytes / MIB,
                     "predicted KV (MiB, formula)": pred * kv.usable_bytes / MIB,
                     "measured usage (%)": 100 * run.peak_usage,
                     "predicted usage (%)": 100 * pred,
                     "samples": run.samples_while_running, "error": r.error or ""})
    return rows


def users_sweep(session: Any, kv: ServerKV, maker: PromptMaker, users: Sequence[int],
                prompt_tokens: int, max_tokens: int,
                progress: Callable = lambda x, **_: x) -> list[dict]:
    """``u`` users at once, each with its own prompt: peak KV next to u x one user's blocks."""
    rows = []
    for u in progress(list(users), title="adding users"):
        prompts = [maker.make(prompt_tokens) for _ in range(u)]
        run = measure_kv(session, prompts, max_tokens)
        held = [(r.prompt_tokens or prompt_tokens) + (r.completion_tokens or max_tokens)
                for r in run.requests]
        pred = predicted_usage(held, kv.block_size, kv.capacity_tokens)
        rows.append({"users": u, "tokens held": sum(held),
                     "KV in use (MiB, derived)": run.peak_usage * kv.usable_bytes / MIB,
                     "predicted KV (MiB, formula)": min(pred, 1.0) * kv.usable_bytes / MIB,
                     "measured usage (%)": 100 * run.peak_usage,
                     "predicted usage (%)": 100 * pred,
                     "peak running": run.peak_running, "peak waiting": run.peak_waiting,
                     "samples": run.samples_while_running,
                     "errors": sum(r.error is not None for r in run.requests)})
    return rows


def ttft_sweep(session: Any, maker: PromptMaker, lengths: Sequence[int], repeats: int = 1,
               progress: Callable = lambda x, **_: x) -> list[dict]:
    """TTFT of single requests (nothing else running) as the prompt grows."""
    client = session.openai()
    rows = []
    plan = [n for n in lengths for _ in range(repeats)]
    # A throw-away request first: the first request after start-up pays one-off costs.
    stream_completion(client, session.model, maker.make(16), 2)
    for n in progress(plan, title="prompt length sweep"):
        reset_prefix_cache(session)   # a cached prefix would skip the work we want to time
        r = stream_completion(client, session.model, maker.make(n), 4)
        rows.append({"prompt tokens": r.prompt_tokens or n,
                     "TTFT (ms)": r.ttft * 1000 if r.ttft is not None else float("nan"),
                     "error": r.error or ""})
    return rows


# -- sequential vs concurrent, naive vs batched ---------------------------------------------------

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


def factor_rows(rows: list[dict], concurrency: int) -> list[dict]:
    tput = {Trial(r["engine"], r["in flight"]): r["output tok/s"] for r in rows}
    return [{"comparison": k, "speed-up (x)": v}
            for k, v in speedup_factors(tput, concurrency).items()]


# -- plots ----------------------------------------------------------------------------------------

def plot_kv(rows: list[dict], x: str, title: str, xlabel: str, capacity_mib: float | None = None,
            kv: ServerKV | None = None):
    """Measured peaks against the formula; with ``kv`` and x = tokens, the formula's block steps."""
    from workshop.plots import figure

    fig, ax = figure(title, xlabel, "KV cache in use (MiB)")
    xs = [r[x] for r in rows]
    label = "formula: blocks needed x block size x bytes/token"
    if kv is not None:
        # The k-th block is taken by token k * block_size + 1: the steps sit exactly there.
        edges = [0] + list(range(1, max(xs) + kv.block_size + 1, kv.block_size))
        ax.step(edges, [blocks_for(t, kv.block_size) * kv.block_size
                        * kv.formula.bytes_per_token / MIB for t in edges],
                where="post", linestyle="--", color="tab:gray", label=label)
    else:
        ax.plot(xs, [r["predicted KV (MiB, formula)"] for r in rows], "--", color="tab:gray", label=label)
    ax.plot(xs, [r["KV in use (MiB, derived)"] for r in rows], "o", color="tab:blue", markersize=7,
            label="engine's usage gauge (peak while running) x usable blocks x formula")
    if capacity_mib is not None:
        top = max(max(r["predicted KV (MiB, formula)"] for r in rows), max(r["KV in use (MiB, derived)"]
                                                                   for r in rows))
        if top > 0.5 * capacity_mib:   # only worth a line when the data gets near it
            ax.axhline(capacity_mib, color="tab:red", label=f"KV capacity ({capacity_mib:.0f} MiB)")
    ax.set_xlim(left=0)
    ax.set_ylim(bottom=0)
    ax.legend()
    return fig


def plot_ttft(rows: list[dict], max_model_len: int | None = None):
    from workshop.plots import figure

    ok = [r for r in rows if not r["error"]]
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


def ttft_slope(rows: list[dict]) -> tuple[float, float] | None:
    """Least-squares line through (prompt tokens, TTFT ms): (ms per 1000 tokens, ms at 0)."""
    ok = [(r["prompt tokens"], r["TTFT (ms)"]) for r in rows
          if not r["error"] and not math.isnan(r["TTFT (ms)"])]
    if len({x for x, _ in ok}) < 2:
        return None
    n = len(ok)
    mx = sum(x for x, _ in ok) / n
    my = sum(y for _, y in ok) / n
    slope = sum((x - mx) * (y - my) for x, y in ok) / sum((x - mx) ** 2 for x, _ in ok)
    return slope * 1000, my - slope * mx
