"""How full a paged KV cache is: the engine's usage gauge next to the block arithmetic.

A paged engine hands out whole blocks of ``block_size`` tokens, so a request holding ``t``
tokens occupies ``ceil(t / block_size)`` blocks, and the gauge ``vllm:kv_cache_usage_perc``
reports blocks in use over the blocks it can hand out. The bytes per token come from the one
formula of the project, ``reference_server.kv``.

The first part is arithmetic (unit-tested); the second sends requests to a live server while
sampling the gauge (exercised by the notebook tests).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from reference_server import dtypes, prometheus
from reference_server.kv import blocks_for, kv_bytes_per_token
from reference_server.model_config import ModelArch
from workshop.live.live_requests import (
    PromptMaker,
    Timed,
    reset_prefix_cache,
    run_together,
    stream_completion,
)
from workshop.live.metrics_sampler import MetricsSampler, Samples

KV_USAGE = prometheus.KV_CACHE_USAGE
RUNNING = prometheus.NUM_REQUESTS_RUNNING
WAITING = prometheus.NUM_REQUESTS_WAITING
MIB = 2**20

# vLLM keeps one block aside (its "null block") and reports usage against the rest:
# vllm/v1/core/block_pool.py, BlockPool.get_usage.
RESERVED_BLOCKS = 1


# -- arithmetic --------------------------------------------------------------------------------

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


@dataclass(frozen=True)
class ServerKV:
    """A server's KV cache: the model it serves, the cache's dtype, capacity and block size."""

    arch: ModelArch
    dtype: str                          # canonical name, "auto" already resolved
    capacity_tokens: int
    block_size: int
    reported_bytes_per_token: int | None = None   # what /server_info says, if anything

    @property
    def dtype_bytes(self) -> float:
        return dtypes.bytes_per_element(self.dtype)

    @property
    def bytes_per_token(self) -> int:
        return int(kv_bytes_per_token(self.arch, self.dtype))

    @property
    def capacity_bytes(self) -> float:
        return self.capacity_tokens * self.bytes_per_token

    @property
    def usable_bytes(self) -> float:
        """What the usage gauge's 100% stands for: every block but the reserved one."""
        return (usable_blocks(self.capacity_tokens, self.block_size) * self.block_size
                * self.bytes_per_token)


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
        ax.step(edges, [blocks_for(t, kv.block_size) * kv.block_size * kv.bytes_per_token / MIB
                        for t in edges],
                where="post", linestyle="--", color="tab:gray", label=label)
    else:
        ax.plot(xs, [r["predicted KV (MiB, formula)"] for r in rows], "--", color="tab:gray",
                label=label)
    ax.plot(xs, [r["KV in use (MiB, derived)"] for r in rows], "o", color="tab:blue", markersize=7,
            label="engine's usage gauge (peak while running) x usable blocks x formula")
    if capacity_mib is not None:
        top = max(max(r["predicted KV (MiB, formula)"] for r in rows),
                  max(r["KV in use (MiB, derived)"] for r in rows))
        if top > 0.5 * capacity_mib:   # only worth a line when the data gets near it
            ax.axhline(capacity_mib, color="tab:red", label=f"KV capacity ({capacity_mib:.0f} MiB)")
    ax.set_xlim(left=0)
    ax.set_ylim(bottom=0)
    ax.legend()
    return fig


# -- live: the gauge while requests run --------------------------------------------------------

def server_kv(session: Any) -> ServerKV:
    """The served model's config (``kvcache.served_model_config``) and the server's cache
    figures."""
    from workshop.sizing.kvcache import served_model_config

    info = session.info
    arch = served_model_config(str(info.get("model_path") or session.model), name=session.model)
    return ServerKV(arch=arch, dtype=dtypes.canonical(info.get("dtype", "auto"), arch.torch_dtype),
                    capacity_tokens=int(info["kv_capacity_tokens"]),
                    block_size=int(info.get("block_size") or 16),
                    reported_bytes_per_token=info.get("kv_bytes_per_token"))


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
    reset_prefix_cache(session, tries=8)
    with MetricsSampler(session.metrics, (KV_USAGE, RUNNING, WAITING), interval) as sampler:
        results = run_together(lambda p: stream_completion(client, session.model, p, max_tokens),
                               prompts)
        time.sleep(interval * 2)   # one more sample after the last request finished
    return KVRun(results, sampler.samples)


def gauge_row(session: Any, run: Any, prompt_tokens: int, max_tokens: int) -> dict:
    """One row for a burst of equal requests measured with ``measure_kv`` on ``session``'s
    server: sent and completed, the gauges' peaks, the KV usage the blocks predict with every
    request in at once (None without a paged pool: the Hugging Face baseline reports no block
    size), the pool, and how many samples were taken and failed."""
    cap = int(session.info.get("kv_capacity_tokens") or 0)
    bs = int(session.info.get("block_size") or 0)
    n, samples = len(run.requests), run.samples
    pred = predicted_usage([prompt_tokens + max_tokens - 1] * n, bs, cap) if cap and bs else None
    return {"engine": session.engine_name, "sent": n,
            "completed": sum(r.error is None for r in run.requests),
            "peak running": samples.peak(RUNNING), "peak waiting": samples.peak(WAITING),
            "peak KV usage (%)": 100 * samples.peak(KV_USAGE),
            "all at once, by the blocks (%)": None if pred is None else 100 * pred,
            "KV pool (tokens)": cap or None, "block size": bs or None,
            "samples": len(samples.times), "failed polls": samples.errors}


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


__all__ = ["KV_USAGE", "RUNNING", "WAITING", "RESERVED_BLOCKS", "blocks_for", "usable_blocks",
           "predicted_usage", "users_until_full", "ServerKV", "plot_kv", "server_kv", "KVRun",
           "measure_kv", "context_sweep", "users_sweep"]
