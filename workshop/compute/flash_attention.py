"""FlashAttention's idea, measured: what attention costs in memory, memory traffic and time.

The two attention functions themselves (the naive one and the tiled one with an online
softmax) are written in notebook 06, where reading them is the lesson; this module holds what
the notebook measures them with, so it takes them as arguments:

* the **peak memory** a call allocates beyond its inputs, measured with ``tracemalloc``
  (NumPy reports every array it allocates to it, so the N x N score matrix shows up exactly);
* the **memory traffic** each way must move between slow and fast memory, counted by the
  standard I/O analysis of Dao et al. 2022 (arXiv:2205.14135, section 3.2): Theta(Nd + N^2)
  accesses for standard attention, Theta(N^2 d^2 / M) for the tiled one with M words of fast
  memory;
* **wall time**, best of a few runs, next to PyTorch's fused
  ``scaled_dot_product_attention``.

Shapes: one attention head, ``q``, ``k``, ``v`` of shape ``[N, d]`` (float32 NumPy arrays).
"""

from __future__ import annotations

import math
import tracemalloc
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from workshop.compute.roofline import flops_per_token, prefill_flops
from workshop.live.prompt_latency import line_fit
from workshop.timing import best_time_s

Attention = Callable[..., np.ndarray]

# Dao et al. 2022, section 2.1: "the A100 GPU has ... 192KB of on-chip SRAM per each of 108
# streaming multiprocessors". The fast memory a FlashAttention tile must fit in.
A100_SRAM_BYTES_PER_SM = 192 * 1024
FLASH_ATTENTION_PAPER = "https://arxiv.org/abs/2205.14135"
FLASH_ATTENTION_2_PAPER = "https://arxiv.org/abs/2307.08691"


def random_qkv(n: int, d: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Queries, keys and values of one head: three ``[n, d]`` float32 arrays, N(0, 1)."""
    rng = np.random.default_rng(seed)
    return tuple(rng.standard_normal((n, d), dtype=np.float32)
                 for _ in range(3))  # type: ignore[return-value]


def sdpa(q: np.ndarray, k: np.ndarray, v: np.ndarray, causal: bool = False) -> np.ndarray:
    """PyTorch's fused attention on the same NumPy inputs (shares their memory, no copy)."""
    import torch
    import torch.nn.functional as F

    t = [torch.from_numpy(np.ascontiguousarray(x))[None, None] for x in (q, k, v)]
    return F.scaled_dot_product_attention(*t, is_causal=causal)[0, 0].numpy()


def sdpa_kernel(n: int = 256, d: int = 64) -> str:
    """Which ATen kernel PyTorch's SDPA dispatched to on this machine (from the profiler)."""
    import torch
    from torch.profiler import profile

    x = torch.randn(1, 1, n, d)
    with profile() as prof:
        torch.nn.functional.scaled_dot_product_attention(x, x, x, is_causal=True)
    names = [e.key for e in prof.key_averages()]
    inner = [s for s in names if "scaled_dot_product" in s
             and s != "aten::scaled_dot_product_attention"]
    return inner[0] if inner else "aten::scaled_dot_product_attention (no inner kernel recorded)"


# ---------------------------------------------------------------------------------------
# Memory traffic, counted (slow memory = GPU HBM, or a CPU's DRAM)
# ---------------------------------------------------------------------------------------

def naive_io_bytes(n: int, d: int, itemsize: int = 4) -> int:
    """Bytes standard attention moves to and from slow memory (Dao et al. 2022, Algorithm 0).

    S = Q K^T reads Q and K (2Nd) and writes S (N^2); softmax reads S and writes P (2 N^2);
    O = P V reads P and V (N^2 + Nd) and writes O (Nd). Total 4Nd + 4N^2 numbers.
    """
    return itemsize * (4 * n * d + 4 * n * n)


def tiled_io_bytes(n: int, d: int, tile: int, itemsize: int = 4, causal: bool = False) -> int:
    """Bytes the tiled loop moves: Q read once, O written once, K and V once per query tile.

    This is FlashAttention-2's loop order (queries outside, keys inside). With causal masking
    a query tile starting at row i reads keys 0 .. min(i + tile, n) only. Nothing N x N is
    ever written, so for large N this is 2Nd + 2N^2 d / tile: Theta(N^2 d^2 / M) when the tile
    is as large as a fast memory of M numbers allows (tile ~ M / d).
    """
    if tile < 1:
        raise ValueError("tile must be >= 1")
    key_rows = sum(min(i + tile, n) if causal else n for i in range(0, n, tile))
    return itemsize * (2 * n * d + 2 * d * key_rows)


def tile_fast_memory_bytes(tile: int, d: int, itemsize: int = 4) -> int:
    """Fast memory one query tile needs: Q, K, V and output tiles, the scores tile, max and sum."""
    return itemsize * (4 * tile * d + tile * tile + 2 * tile)


def largest_tile(fast_memory_bytes: int, d: int, itemsize: int = 4) -> int:
    """The largest tile whose working set fits in ``fast_memory_bytes``."""
    tile = 1
    while tile_fast_memory_bytes(tile + 1, d, itemsize) <= fast_memory_bytes:
        tile += 1
    return tile


def cpu_caches() -> dict[str, int]:
    """This CPU's data caches per level in bytes, from sysfs (empty where it is not readable)."""
    out: dict[str, int] = {}
    for idx in sorted(Path("/sys/devices/system/cpu/cpu0/cache").glob("index*")):
        try:
            if (idx / "type").read_text().strip() == "Instruction":
                continue
            level = (idx / "level").read_text().strip()
            size = (idx / "size").read_text().strip()
        except OSError:
            continue
        scale = {"K": 1024, "M": 1024**2, "G": 1024**3}.get(size[-1], 1)
        out[f"L{level}"] = int(size.rstrip("KMG")) * scale
    return out


# ---------------------------------------------------------------------------------------
# Measurements
# ---------------------------------------------------------------------------------------

def peak_extra_bytes(fn: Attention, *args: Any, **kwargs: Any) -> int:
    """Peak bytes allocated by ``fn(*args)`` beyond what existed before it (tracemalloc).

    Counts NumPy arrays and Python objects; memory taken by native libraries outside NumPy
    (e.g. PyTorch tensors) is invisible to it.
    """
    was_tracing = tracemalloc.is_tracing()
    if not was_tracing:
        tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        before, _ = tracemalloc.get_traced_memory()
        result = fn(*args, **kwargs)
        _, peak = tracemalloc.get_traced_memory()
        del result
    finally:
        if not was_tracing:
            tracemalloc.stop()
    return peak - before


def memory_rows(naive: Attention, tiled: Attention, lengths: Sequence[int], d: int, tile: int,
                progress: Callable = iter) -> list[dict]:
    """Peak extra memory of both functions per sequence length, next to one N x N fp32 matrix."""
    rows = []
    for n in progress(lengths):
        q, k, v = random_qkv(n, d)
        rows.append({"N": n,
                     "naive peak (MiB)": peak_extra_bytes(naive, q, k, v) / 2**20,
                     "tiled peak (MiB)": peak_extra_bytes(tiled, q, k, v, tile=tile) / 2**20,
                     "one N x N fp32 matrix (MiB)": n * n * 4 / 2**20,
                     "output N x d (MiB)": n * d * 4 / 2**20})
    return rows


def timing_rows(naive: Attention, tiled: Attention, lengths: Sequence[int], d: int, tile: int,
                causal: bool = True, repeats: int = 3, progress: Callable = iter) -> list[dict]:
    """Best-of-``repeats`` wall time of naive, tiled and PyTorch SDPA per sequence length."""
    rows = []
    for n in progress(lengths):
        q, k, v = random_qkv(n, d)
        rows.append({"N": n,
                     "naive (ms)": 1e3 * best_time_s(lambda: naive(q, k, v, causal=causal),
                                                     repeats),
                     "tiled (ms)": 1e3 * best_time_s(
                         lambda: tiled(q, k, v, tile=tile, causal=causal), repeats),
                     "PyTorch SDPA (ms)": 1e3 * best_time_s(
                         lambda: sdpa(q, k, v, causal=causal), repeats)})
    for r in rows:
        r["tiled / naive"] = r["tiled (ms)"] / r["naive (ms)"]
        r["SDPA / naive"] = r["PyTorch SDPA (ms)"] / r["naive (ms)"]
    return rows


def traffic_rows(lengths: Sequence[int], d: int, tiles: Sequence[int], causal: bool = False,
                 itemsize: int = 4) -> list[dict]:
    rows = []
    for n in lengths:
        row: dict[str, Any] = {"N": n, "naive (MiB)": naive_io_bytes(n, d, itemsize) / 2**20}
        for t in tiles:
            row[f"tiled, tile {t} (MiB)"] = tiled_io_bytes(n, d, t, itemsize, causal) / 2**20
        rows.append(row)
    return rows


# ---------------------------------------------------------------------------------------
# Figures
# ---------------------------------------------------------------------------------------

def memory_figure(rows: Sequence[dict]):
    from workshop.plots import figure
    fig, ax = figure("Peak memory of one attention head (measured with tracemalloc, fp32)",
                     "sequence length N (tokens)", "peak memory allocated by the call (MiB)")
    n = [r["N"] for r in rows]
    ax.plot(n, [r["naive peak (MiB)"] for r in rows], "o-", label="naive (measured)")
    ax.plot(n, [r["tiled peak (MiB)"] for r in rows], "s-",
            label="tiled, online softmax (measured)")
    ax.plot(n, [r["one N x N fp32 matrix (MiB)"] for r in rows], "k--", lw=1,
            label="one N x N fp32 matrix (N² x 4 B)")
    ax.plot(n, [r["output N x d (MiB)"] for r in rows], "k:", lw=1, label="the N x d output")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.legend()
    return fig


def traffic_figure(rows: Sequence[dict], d: int):
    from workshop.plots import figure
    fig, ax = figure(f"Bytes moved to and from slow memory, one head, d={d}, fp32 (counted)",
                     "sequence length N (tokens)", "slow-memory traffic (MiB)")
    n = [r["N"] for r in rows]
    for key in rows[0]:
        if key != "N":
            ax.plot(n, [r[key] for r in rows], "o-" if key.startswith("naive") else ".-",
                    label=key.replace(" (MiB)", ""))
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.legend()
    return fig


def timing_figure(rows: Sequence[dict], d: int, tile: int, causal: bool):
    from workshop.plots import figure
    fig, ax = figure(f"Attention time on this machine, one head, d={d}, "
                     f"{'causal' if causal else 'full'}, fp32 (best of runs)",
                     "sequence length N (tokens)", "time per call (ms)")
    n = [r["N"] for r in rows]
    ax.plot(n, [r["naive (ms)"] for r in rows], "o-", label="naive (NumPy)")
    ax.plot(n, [r["tiled (ms)"] for r in rows], "s-",
            label=f"tiled, tile {tile} (NumPy + Python loop)")
    ax.plot(n, [r["PyTorch SDPA (ms)"] for r in rows], "^-", label="PyTorch fused SDPA")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.legend()
    return fig


def attention_share(cfg, prompt_tokens: int) -> float:
    """Share of a prefill's FLOPs spent in attention (scores and weighted values).

    The rest is the weights' 2 FLOPs per parameter and token (``roofline.prefill_flops``,
    which counts the output layer for the last prompt token only, as engines do).
    """
    return 1 - flops_per_token(cfg, 0, logits=False) / flops_per_token(cfg, prompt_tokens // 2,
                                                                         logits=False)


def fixed_cost_fit(rows: Sequence[dict], cfg) -> tuple[float, float] | None:
    """Least-squares line of TTFT (ms) against prefill FLOPs over ``rows``: (ms per GFLOP,
    ms at zero FLOPs), or None with fewer than two prompt lengths. The intercept is the part
    of every request the FLOP count does not explain (HTTP, tokenizing, scheduling, one step)."""
    return line_fit([(prefill_flops(cfg, r["prompt tokens"]) / 1e9, r["TTFT ms (median)"])
                     for r in rows if not math.isnan(r["TTFT ms (median)"])])


def prefill_figure(rows: Sequence[dict], engine: str, cfg):
    """TTFT against prompt length, next to what the FLOP count predicts from the first point."""
    from workshop.plots import figure
    fig, ax = figure(f"Prefill on the live {engine} server (time to first token, median)",
                     "prompt length (tokens)", "time to first token (ms)")
    n = [r["prompt tokens"] for r in rows]
    ttft = [r["TTFT ms (median)"] for r in rows]
    ax.plot(n, ttft, "o-", label="measured")
    base = prefill_flops(cfg, n[0])
    ax.plot(n, [ttft[0] * prefill_flops(cfg, x) / base for x in n], "k--", lw=1,
            label=f"FLOP count (weights + attention), scaled to the {n[0]}-token point")
    ax.legend()
    return fig


__all__ = [
    "A100_SRAM_BYTES_PER_SM", "FLASH_ATTENTION_PAPER", "FLASH_ATTENTION_2_PAPER", "random_qkv",
    "sdpa", "sdpa_kernel", "naive_io_bytes", "tiled_io_bytes", "tile_fast_memory_bytes",
    "largest_tile", "cpu_caches", "peak_extra_bytes", "best_time_s", "memory_rows",
    "timing_rows", "traffic_rows", "memory_figure", "traffic_figure", "timing_figure",
    "attention_share", "fixed_cost_fit", "prefill_figure",
]
