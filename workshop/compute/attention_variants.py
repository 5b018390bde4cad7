"""Attention variants (MHA, GQA, MQA, MLA) and sliding windows: what each one caches, what it
costs in quality on the live teaching engine, and what it saves in decode time.

The KV formula itself has one home, ``reference_server/kv.py`` (``kv_bytes_per_token``,
``kv_bytes_per_sequence``); this module only builds the *architecture* of each variant
(``variant_arch``, ``with_window``) and lets that formula do the counting, so the numbers a
notebook predicts and the numbers the server reports come from independent places: the
formula on one side, the engine's allocated pool on the other.

Quality through the server: the teaching engine does not return prompt log-probabilities
(``echo`` is refused), so a perplexity cannot be read from it. What it can give exactly is
its greedy next token after any prefix (``next_tokens``): the share of held-out text tokens
it predicts (``match_share`` against the text) and the share of positions where a variant
picks the same token as the shipped model (``match_share`` against the reference).
"""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Callable, Sequence

from reference_server.kv import kv_bytes_per_sequence, kv_bytes_per_token
from reference_server.model_config import ModelArch
from workshop import plots
from workshop.timing import best_time_s

# ---------------------------------------------------------------------------------------
# The architecture of each variant (the formula stays in reference_server.kv)
# ---------------------------------------------------------------------------------------


def variant_arch(arch: ModelArch, attention: str, mla_rank: int = 0,
                 rope_dim: int = 0) -> ModelArch:
    """``arch`` with its attention swapped for ``attention``, everything else unchanged.

    * ``mha``: one KV head per query head;
    * ``gqa``: as shipped (for an MLA model: its ``num_key_value_heads``);
    * ``mqa``: one KV head;
    * ``mla``: a latent of ``mla_rank`` values plus a shared RoPE key of ``rope_dim`` values
      per layer and token. The teaching engine's MLA applies RoPE after re-expanding the
      latent, so it stores no separate RoPE key: ``rope_dim=0`` describes it.
    """
    if attention == "mla":
        if mla_rank <= 0:
            raise ValueError("MLA needs a positive latent rank")
        return replace(arch, attention="mla", kv_lora_rank=mla_rank, qk_rope_head_dim=rope_dim)
    heads = {"mha": arch.num_heads, "gqa": arch.num_kv_heads, "mqa": 1}
    if attention not in heads:
        raise ValueError(f"unknown attention variant {attention!r}: mha | gqa | mqa | mla")
    return replace(arch, attention="gqa", num_kv_heads=heads[attention],
                   kv_lora_rank=0, qk_rope_head_dim=0)


def with_window(arch: ModelArch, window: int, sliding_layers: int | None = None) -> ModelArch:
    """``arch`` with ``sliding_layers`` layers (default: all) keeping only ``window`` tokens."""
    n = arch.num_layers if sliding_layers is None else sliding_layers
    if not 0 <= n <= arch.num_layers:
        raise ValueError(f"sliding_layers must be 0..{arch.num_layers}")
    return replace(arch, sliding_window=window if n else 0, num_sliding_layers=n if window else 0)


def equivalent_kv_heads(arch: ModelArch) -> float:
    """How many GQA KV heads (of ``head_dim``) would cache as much as ``arch`` does per layer."""
    return kv_bytes_per_token(arch, "bf16") / kv_bytes_per_token(variant_arch(arch, "mqa"), "bf16")


def config_columns(arch: ModelArch) -> dict:
    """A model's row head for the catalogue table: its config linked, layers, query heads, and
    what one layer caches per token (KV heads x head size, or MLA's latent + RoPE key)."""
    cached = (f"MLA: latent {arch.kv_lora_rank} + RoPE key {arch.qk_rope_head_dim}"
              if arch.attention == "mla" else f"{arch.num_kv_heads} KV x {arch.head_dim}")
    return {"model": f"[{arch.name}]({arch.source})", "layers": arch.num_layers,
            "query heads": arch.num_heads, "cached per layer": cached}


def users_that_fit(budget_bytes: float, bytes_per_user: float) -> int:
    """Whole users of ``bytes_per_user`` each in ``budget_bytes`` (0 when none fits)."""
    if bytes_per_user <= 0:
        raise ValueError("bytes_per_user must be positive")
    return int(budget_bytes // bytes_per_user)


def window_rows(arch: ModelArch, windowed: ModelArch, contexts: Sequence[int],
                budget_bytes: float, kv_dtype: str = "bf16") -> list[dict]:
    """Per context: KV of one user with and without the window, and users per budget."""
    rows = []
    for c in contexts:
        full = kv_bytes_per_sequence(arch, c, kv_dtype)
        win = kv_bytes_per_sequence(windowed, c, kv_dtype)
        rows.append({"context (tokens)": c,
                     "KV per user, full (MiB)": full / 2**20,
                     "KV per user, window (MiB)": win / 2**20,
                     "users that fit, full": users_that_fit(budget_bytes, full),
                     "users that fit, window": users_that_fit(budget_bytes, win),
                     "saving (x)": full / win})
    return rows


# ---------------------------------------------------------------------------------------
# Quality through the server
# ---------------------------------------------------------------------------------------


def next_tokens(session, token_ids: Sequence[int], positions: Sequence[int],
                workers: int = 4) -> list[str]:
    """The server's greedy next token (as text) after ``token_ids[:p]`` for each ``p``.

    One completion request per position, prompts given as token ids so every server sees
    exactly the same prefix; a few in flight at once so the engine can batch them.
    """
    def one(p: int) -> str:
        with session.http(timeout=120) as http:
            r = http.post(f"{session.v1}/completions", json={
                "model": session.model, "prompt": list(token_ids[:p]), "max_tokens": 1,
                "temperature": 0, "logprobs": 0})
            r.raise_for_status()
            choice = r.json()["choices"][0]
            return (choice.get("logprobs") or {}).get("tokens", [choice["text"]])[0]
    with ThreadPoolExecutor(workers) as pool:
        return list(pool.map(one, positions))


def greedy_tokens(session, questions: Sequence[str], max_tokens: int) -> list[list[str]]:
    """Each question's greedy answer, token by token (the chat template is the server's)."""
    client = session.openai()

    def one(q: str) -> list[str]:
        r = client.chat.completions.create(
            model=session.model, messages=[{"role": "user", "content": q}], temperature=0,
            max_tokens=max_tokens, logprobs=True)
        return [t.token for t in (r.choices[0].logprobs.content or [])]
    with ThreadPoolExecutor(max(1, len(questions))) as pool:     # the engine batches them
        return list(pool.map(one, questions))


def match_share(a: Sequence, b: Sequence) -> float:
    """Share of positions where ``a`` and ``b`` hold the same item (same length required)."""
    if len(a) != len(b) or not a:
        raise ValueError("need two non-empty sequences of the same length")
    return sum(x == y for x, y in zip(a, b)) / len(a)


def greedy_token_share(reference: Sequence[Sequence], candidate: Sequence[Sequence]) -> float:
    """Share of the reference's generated tokens the candidate reproduced at the same place."""
    if len(reference) != len(candidate) or not reference:
        raise ValueError("need the same, non-zero number of answers")
    total = sum(len(r) for r in reference)
    same = sum(x == y for r, c in zip(reference, candidate) for x, y in zip(r, c))
    return same / total if total else 1.0


# ---------------------------------------------------------------------------------------
# Decode attention time vs KV heads
# ---------------------------------------------------------------------------------------


def decode_inputs(batch: int, q_heads: int, kv_heads: int, context: int, head_dim: int,
                  dtype=None, seed: int = 0):
    """Random q ``[batch, q_heads, head_dim]`` and a KV cache ``[batch, kv_heads, context,
    head_dim]`` each: one decode step of ``batch`` users who hold ``context`` tokens."""
    import torch
    if q_heads % kv_heads:
        raise ValueError("query heads must be a multiple of KV heads")
    g = torch.Generator().manual_seed(seed)
    dtype = dtype or torch.float32
    q = torch.randn(batch, q_heads, head_dim, generator=g).to(dtype)
    k = torch.randn(batch, kv_heads, context, head_dim, generator=g).to(dtype)
    v = torch.randn(batch, kv_heads, context, head_dim, generator=g).to(dtype)
    return q, k, v


def reference_decode(q, k, v):
    """PyTorch's SDPA with the KV heads copied out to every query head: the plain MHA way."""
    import torch.nn.functional as F
    grp = q.shape[1] // k.shape[1]
    k, v = (t.repeat_interleave(grp, dim=1) for t in (k, v))
    return F.scaled_dot_product_attention(q[:, :, None], k, v)[:, :, 0]


def attention_time_rows(fn: Callable, kv_heads: Sequence[int], contexts: Sequence[int],
                        q_heads: int = 9, head_dim: int = 64, batch: int = 1,
                        repeats: int = 10, threads: int | None = 1,
                        progress: Callable = lambda x, **_: x) -> list[dict]:
    """Time ``fn(q, k, v)`` (best of ``repeats``) for every (context, KV heads) pair.

    ``threads`` (default 1; None = PyTorch's setting): with several threads, one of them
    descheduled by other work on a busy machine stalls the others at every operation, and
    the timings say more about the machine's load than about the cache size.
    """
    import torch
    before = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    rows = []
    try:
        pairs = [(c, h) for c in contexts for h in kv_heads]
        for c, h in progress(pairs, title="decode attention"):
            q, k, v = decode_inputs(batch, q_heads, h, c, head_dim)
            t = best_time_s(lambda: fn(q, k, v), repeats)
            kv_bytes = k.numel() * k.element_size() * 2
            rows.append({"context": c, "KV heads": h, "time (ms)": t * 1e3,
                         "KV read (MiB)": kv_bytes / 2**20, "GB/s": kv_bytes / t / 1e9})
    finally:
        torch.set_num_threads(before)
    return rows


def cache_fit(mib: Sequence[float], caches: dict[str, int]) -> dict | None:
    """This CPU's largest data cache and whether each size in ``mib`` (MiB) fits in it.

    ``caches`` maps level to bytes, as ``flash_attention.cpu_caches`` returns them. Returns
    ``{"cache": level, "MiB": its size, "fits": [bool per size]}``, or None when it is empty.
    """
    if not caches:
        return None
    level = max(caches, key=caches.get)
    return {"cache": level, "MiB": caches[level] / 2**20,
            "fits": [m * 2**20 <= caches[level] for m in mib]}


# ---------------------------------------------------------------------------------------
# Figures
# ---------------------------------------------------------------------------------------


def bytes_figure(rows: Sequence[dict]):
    """Grouped bars: KV bytes per token (log scale) for each model under each variant."""
    variants = [k for k in rows[0] if k not in ("model",)]
    fig, ax = plots.figure("KV cache per token: the same models under each attention variant",
                           "model", "KV bytes per token (bf16, log scale)", size=(8.5, 4.4))
    width = 0.8 / len(variants)
    for j, name in enumerate(variants):
        xs = [i + (j - (len(variants) - 1) / 2) * width for i in range(len(rows))]
        ys = [r[name] if r[name] else math.nan for r in rows]
        ax.bar(xs, ys, width, label=name)
    ax.set_yscale("log")
    ax.set_xticks(range(len(rows)), [r["model"] for r in rows], rotation=20, ha="right")
    ax.legend(fontsize=8)
    return fig


def quality_figure(rows: Sequence[dict], bytes_key: str, metrics: Sequence[str]):
    """Grouped bars: each quality share per served variant, the variant's cache in its label."""
    fig, ax = plots.figure("Quality vs KV cache on the live teaching engine",
                           "variant (KV bytes per token reported by its server)",
                           "share of tokens (0..1)", size=(8.5, 4.4))
    width = 0.8 / len(metrics)
    for j, m in enumerate(metrics):
        xs = [i + (j - (len(metrics) - 1) / 2) * width for i in range(len(rows))]
        ax.bar(xs, [r[m] for r in rows], width, label=m)
    # three short lines per label: eight variants side by side stay legible
    ax.set_xticks(range(len(rows)), [f"{r['variant']}\n{r[bytes_key]:,}\nB/token" for r in rows],
                  fontsize=9)
    ax.set_ylim(0, 1.05)
    ax.legend(fontsize=8)
    return fig


def time_figure(rows: Sequence[dict], q_heads: int):
    """Measured time per context (log-log), each with a dashed line proportional to the bytes
    read, drawn from its fewest-heads point: a measured line that follows it is bandwidth-bound."""
    fig, ax = plots.figure(f"Decode attention time vs KV heads ({q_heads} query heads)",
                           "KV heads (log scale)", "time per decode step (ms, log scale)")
    for c, color in zip(sorted({r["context"] for r in rows}), [f"C{i}" for i in range(10)]):
        pts = sorted((r for r in rows if r["context"] == c), key=lambda r: r["KV heads"])
        hs = [r["KV heads"] for r in pts]
        ax.plot(hs, [r["time (ms)"] for r in pts], "o-", color=color, label=f"context {c:,}")
        ax.plot(hs, [pts[0]["time (ms)"] * h / hs[0] for h in hs], "--", color=color, alpha=0.5,
                label=f"context {c:,}, proportional to bytes")
    ax.set_xscale("log")
    ax.set_yscale("log")
    heads = sorted({r["KV heads"] for r in rows})
    ax.set_xticks(heads, [str(h) for h in heads])
    ax.minorticks_off()
    ax.legend(fontsize=8)
    return fig


def window_figure(series: dict[str, Sequence[dict]], window_label: str):
    """KV per user vs context: for each model, every layer full vs its windowed layers."""
    fig, ax = plots.figure("KV cache per user: full attention vs sliding windows",
                           "context per user (tokens, log scale)", "KV cache per user (GiB)")
    for (name, rows), color in zip(series.items(), ("tab:blue", "tab:orange", "tab:green")):
        xs = [r["context (tokens)"] for r in rows]
        ax.plot(xs, [r["KV per user, full (MiB)"] / 1024 for r in rows], "o-", color=color,
                label=f"{name}, every layer full")
        ax.plot(xs, [r["KV per user, window (MiB)"] / 1024 for r in rows], "s--", color=color,
                label=f"{name}, {window_label[name]}")
    ax.set_xscale("log", base=2)
    ticks = sorted({r["context (tokens)"] for rows in series.values() for r in rows})
    ax.set_xticks(ticks, [f"{t // 1024}k" if t >= 1024 else str(t) for t in ticks])
    ax.minorticks_off()
    ax.legend(fontsize=8)
    return fig


__all__ = ["variant_arch", "with_window", "equivalent_kv_heads", "config_columns",
           "users_that_fit", "window_rows", "next_tokens", "greedy_tokens", "match_share",
           "greedy_token_share", "decode_inputs", "reference_decode", "attention_time_rows",
           "cache_fit", "bytes_figure", "quality_figure", "time_figure", "window_figure"]
