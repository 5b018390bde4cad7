"""Notebook 2's tables and figures, built from ``kvcache`` and ``capacity``.

The arithmetic lives in those two modules; here it is laid out as rows for ``ui.table`` and as
figures (``workshop.plots`` conventions: a bare ``Figure`` with title, labels and legend).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from reference_server.model_config import ModelArch
from workshop.plots import figure
from workshop.sizing.capacity import (
    GPU,
    Step,
    decode_step,
    latency_plan,
    plan,
    prefill_step,
    ttft_plan,
)
from workshop.sizing.kvcache import (
    human_bytes,
    kv_bytes_per_sequence,
    kv_bytes_per_token,
    list_models,
    load_model,
    naive_kv_bytes_per_token,
    weight_bytes,
)


def _gpus_label(gpu: GPU, num_gpus: int) -> str:
    return f"{num_gpus} x {gpu.name}" if num_gpus > 1 else gpu.name


def model_rows(keys: list[str] | None = None, context: int = 32_768,
               kv_dtype: str = "bf16") -> list[dict]:
    """One row per shipped model: the config terms and what they imply for the cache."""
    rows = []
    for key in keys or list_models():
        cfg = load_model(key)
        per_token = kv_bytes_per_token(cfg, kv_dtype)
        ctx = min(context, cfg.max_context) if cfg.max_context else context
        if cfg.attention == "mla":
            terms = f"MLA: latent {cfg.kv_lora_rank} + RoPE key {cfg.qk_rope_head_dim}"
        else:
            terms = f"{cfg.num_kv_heads} KV heads x {cfg.head_dim} (of {cfg.num_heads} heads)"
        if cfg.num_sliding_layers:
            terms += f"; {cfg.num_sliding_layers} layers window {cfg.sliding_window}"
        rows.append({
            "model": f"[{cfg.name}]({cfg.source})",
            "layers": cfg.num_layers,
            "cached per layer": terms,
            f"KV B/token ({kv_dtype})": round(per_token),
            "naive B/token": round(naive_kv_bytes_per_token(cfg, kv_dtype)),
            "KV of one long conversation":
                f"{human_bytes(kv_bytes_per_sequence(cfg, ctx, kv_dtype))} at {ctx:,} tokens",
            "weights (bf16)": human_bytes(weight_bytes(cfg, "bf16")),
        })
    return rows


def _per_gpu(gpus: dict[str, GPU], num_gpus: int, row) -> list[dict]:
    """One row per GPU of the catalogue: its name, then ``row(gpu)``."""
    return [{"GPU": _gpus_label(g, num_gpus), **row(g)} for g in gpus.values()]


def _round(x: float | None, digits: int | None = None) -> float | None:
    return None if x is None else round(x, digits)


def gpu_rows(cfg: ModelArch, gpus: dict[str, GPU], *, weight_dtype: str, kv_dtype: str,
             context: int, users: int, num_gpus: int = 1) -> list[dict]:
    """``plan`` for every GPU of the catalogue."""
    def row(g: GPU) -> dict:
        p = plan(cfg, g, weight_dtype=weight_dtype, kv_dtype=kv_dtype, context=context,
                 users=users, num_gpus=num_gpus)
        return {"fits": "yes" if p.fits else "no", "max users": p.max_users,
                f"max context ({users} users)": p.max_context,
                "tok/s per user (bound)": round(p.decode_tok_s_per_user, 1) if p.fits else None,
                "tok/s total (bound)": round(p.decode_tok_s_total) if p.fits else None,
                "$/hour (indicative)": g.price_usd_hour,
                "$ per M tokens (at best)": _round(p.usd_per_million_tokens, 3)}
    return _per_gpu(gpus, num_gpus, row)


def latency_rows(cfg: ModelArch, gpus: dict[str, GPU], tpot_s: float, *, weight_dtype: str,
                 kv_dtype: str, context: int, num_gpus: int = 1) -> list[dict]:
    """``latency_plan`` for every GPU of the catalogue."""
    def row(g: GPU) -> dict:
        lp = latency_plan(cfg, g, tpot_s, context=context, weight_dtype=weight_dtype,
                          kv_dtype=kv_dtype, num_gpus=num_gpus)
        return {"max batch": lp.batch, "limited by": lp.limited_by,
                "users per GPU": round(lp.users_per_gpu, 1),
                "TPOT at that batch (ms)": _round(lp.tpot_s * 1e3 if lp.step else None, 1),
                "tok/s total (bound)": round(lp.tokens_per_s_total) if lp.step else None,
                "$ per M tokens (at best)": _round(lp.usd_per_million_tokens, 3)}
    return _per_gpu(gpus, num_gpus, row)


def ttft_rows(cfg: ModelArch, gpus: dict[str, GPU], ttft_s: float, *, prompt_len: int,
              weight_dtype: str, kv_dtype: str, num_gpus: int = 1) -> list[dict]:
    """``ttft_plan`` for every GPU of the catalogue."""
    def row(g: GPU) -> dict:
        tp = ttft_plan(cfg, g, ttft_s, prompt_len=prompt_len, weight_dtype=weight_dtype,
                       kv_dtype=kv_dtype, num_gpus=num_gpus)
        return {"prompts together": tp.together, "limited by": tp.limited_by,
                "prompts per step (stream)": tp.stream,
                "requests/s per GPU (bound)": round(tp.requests_per_s_per_gpu, 1),
                "$ per M prompt tokens (at best)": _round(tp.usd_per_million_prompt_tokens, 4)}
    return _per_gpu(gpus, num_gpus, row)


def plot_users_vs_context(cfg: ModelArch, gpu: GPU, weight_dtype: str, num_gpus: int = 1,
                          contexts: list[int] | None = None):
    """Max simultaneous users against context: bf16 KV, fp8 KV, and the naive calculator."""
    top = cfg.max_context or 131_072
    contexts = contexts or [c for c in (512, 1024, 2048, 4096, 8192, 16384, 32768, 65536,
                                        131072) if c <= top]
    memory = gpu.memory_bytes * num_gpus * 0.9 - weight_bytes(cfg, weight_dtype)
    fig, ax = figure(f"{cfg.name} on {num_gpus} x {gpu.name}, weights {weight_dtype}",
                     "context per user (tokens)", "max simultaneous users")
    for kv_dtype, style in (("bf16", "o-"), ("fp8", "s-")):
        users = [max(int(memory // kv_bytes_per_sequence(cfg, c, kv_dtype)), 0) for c in contexts]
        ax.plot(contexts, users, style, label=f"KV cache {kv_dtype} (KV heads only)")
    # The classic mistake: keys and values for every attention head (bf16 cache).
    heads = [max(int(memory // (naive_kv_bytes_per_token(cfg, "bf16") * c)), 0) for c in contexts]
    ax.plot(contexts, heads, "x--", color="tab:gray",
            label=f"mistake: K and V for all {cfg.num_heads} attention heads (bf16)")
    ax.set_xscale("log", base=2)
    ax.set_yscale("symlog", linthresh=1)
    ax.set_ylim(bottom=0)
    ax.legend()
    return fig


def _bound_figure(title: str, xlabel: str, ylabel: str, xs: Sequence[int],
                  steps: Sequence[Step], labels: tuple[str, str, str]):
    """A step's time bound against batch size, with the memory and compute terms under it
    (``labels``: bound, memory time, compute time)."""
    fig, ax = figure(title, xlabel, ylabel)
    # The bound is drawn wide and pale so that the part it follows stays visible on top.
    ax.plot(xs, [s.seconds * 1e3 for s in steps], "-", lw=6, alpha=0.3, color="tab:blue",
            label=labels[0])
    ax.plot(xs, [s.memory_s * 1e3 for s in steps], "--", lw=1.3, color="navy", label=labels[1])
    ax.plot(xs, [s.compute_s * 1e3 for s in steps], ":", lw=1.8, color="tab:purple",
            label=labels[2])
    ax.set_xlim(left=0)
    return fig, ax


def _mark_limits(ax, target_ms: float, target_label: str, memory_limit: int, top: int,
                 memory_label: str, answer: tuple[int, float, str] | None, ymax_ms: float):
    """The target, the KV-memory limit (when in view) and the answer on a ``_bound_figure``."""
    ax.axhline(target_ms, color="tab:green", label=target_label)
    if memory_limit < top:
        ax.axvline(memory_limit, color="tab:red", linestyle="-.", label=memory_label)
    if answer:
        n, ms, label = answer
        ax.plot([n], [ms], "o", color="black", markersize=8, label=label)
    ax.set_ylim(0, max(2 * target_ms, min(ymax_ms, 4 * target_ms)))


def plot_tpot_vs_batch(cfg: ModelArch, gpu: GPU, tpot_s: float, *, context: int,
                       weight_dtype: str = "bf16", kv_dtype: str = "bf16", num_gpus: int = 1):
    """TPOT bound against batch size, with the target, the memory limit and the answer."""
    lp = latency_plan(cfg, gpu, tpot_s, context=context, weight_dtype=weight_dtype,
                      kv_dtype=kv_dtype, num_gpus=num_gpus)
    top = max(int(1.5 * max(lp.max_batch_latency, lp.max_batch_memory)), 8)
    batches = np.unique(np.linspace(1, top, 200).astype(int))
    steps = [decode_step(cfg, gpu, int(b), context, weight_dtype=weight_dtype,
                         kv_dtype=kv_dtype, num_gpus=num_gpus) for b in batches]
    fig, ax = _bound_figure(f"{cfg.name} on {_gpus_label(gpu, num_gpus)}: weights "
                            f"{weight_dtype}, KV {kv_dtype}, {context:,} tokens per user",
                            "batch (users decoding together)", "time per output token (ms)",
                            batches, steps, (
                                "TPOT bound = max(memory time, compute time)",
                                "memory time: (weights read + batch x KV per user) / bandwidth",
                                "compute time: batch x 2 x active params / FLOP/s"))
    _mark_limits(ax, tpot_s * 1e3, f"TPOT target {tpot_s * 1e3:g} ms", lp.max_batch_memory,
                 top, f"KV cache full: {lp.max_batch_memory:,} users",
                 (lp.batch, lp.tpot_s * 1e3, f"answer: batch {lp.batch:,} ({lp.limited_by})")
                 if lp.step else None, steps[-1].seconds * 1e3)
    ax.legend(fontsize=8)
    return fig


def plot_ttft_vs_prompts(cfg: ModelArch, gpu: GPU, ttft_s: float, *, prompt_len: int,
                         weight_dtype: str = "bf16", kv_dtype: str = "bf16", num_gpus: int = 1):
    """Prefill time bound against the prompts prefilled together, with the target, half the
    target (what a stream of requests can spend on its own step), the memory limit and both
    answers."""
    tp = ttft_plan(cfg, gpu, ttft_s, prompt_len=prompt_len, weight_dtype=weight_dtype,
                   kv_dtype=kv_dtype, num_gpus=num_gpus)
    top = max(int(1.5 * min(tp.max_prompts_latency, tp.max_prompts_memory)), 8)
    counts = np.unique(np.linspace(1, top, 200).astype(int))
    steps = [prefill_step(cfg, gpu, int(n), prompt_len, weight_dtype=weight_dtype,
                          kv_dtype=kv_dtype, num_gpus=num_gpus) for n in counts]
    fig, ax = _bound_figure(f"{cfg.name} on {_gpus_label(gpu, num_gpus)}: weights "
                            f"{weight_dtype}, {prompt_len:,}-token prompts",
                            "prompts prefilled together", "prefill time = TTFT (ms)",
                            counts, steps, (
                                "TTFT bound = max(memory time, compute time)",
                                "memory time: (weights read + prompts x KV per prompt) "
                                "/ bandwidth",
                                "compute time: prompts x F(prompt length) / FLOP/s"))
    _mark_limits(ax, ttft_s * 1e3, f"TTFT target {ttft_s * 1e3:g} ms", tp.max_prompts_memory,
                 top, f"KV cache full: {tp.max_prompts_memory:,} prompts",
                 (tp.together, tp.together_step.seconds * 1e3,
                  f"together: {_prompts(tp.together)} ({tp.limited_by})")
                 if tp.together_step else None, steps[-1].seconds * 1e3)
    ax.axhline(ttft_s * 1e3 / 2, color="tab:green", linestyle=":",
               label="half the target: a request may wait for the step ahead")
    if tp.stream_step:
        ax.plot([tp.stream], [tp.stream_step.seconds * 1e3], "D", color="tab:orange",
                markersize=7, label=f"stream: {_prompts(tp.stream)} per step, "
                f"{tp.requests_per_s:,.1f} requests/s")
    ax.legend(fontsize=8, loc="upper left")     # the bound rises from the lower left
    return fig


def _prompts(n: int) -> str:
    return f"{n:,} prompt" + ("" if n == 1 else "s")


__all__ = [
    "model_rows", "gpu_rows", "latency_rows", "ttft_rows", "plot_users_vs_context",
    "plot_tpot_vs_batch", "plot_ttft_vs_prompts",
]
