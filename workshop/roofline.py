"""The roofline model: measure this machine, then place prefill and decode on it.

A kernel that does F floating-point operations while moving B bytes to or from memory has
*arithmetic intensity* I = F / B (FLOP per byte). On a machine with peak compute P (FLOP/s)
and memory bandwidth W (bytes/s) it can run at most ``min(P, W * I)`` FLOP/s: below the
*ridge point* I = P / W it waits on memory, above it on arithmetic.

For a transformer, every weight is used for 2 FLOPs (multiply + add) per token that passes
through it. Decoding one token per sequence for a batch of B sequences reads all weights once
and each sequence's KV cache, so its intensity grows with B; a prefill of T prompt tokens
reads the weights once for all T tokens, so its intensity is about T FLOP/byte at bf16.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from reference_server.kv import kv_bytes_per_sequence
from reference_server.model_config import ModelArch
from workshop.kvcache import WEIGHT_BYTES


# ---------------------------------------------------------------------------------------
# Measuring this machine
# ---------------------------------------------------------------------------------------

def _best_time(fn: Callable[[], object], repeats: int) -> float:
    fn()                                   # warm up: page faults, thread pool, caches
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def measure_read_bandwidth(mib: int = 256, repeats: int = 5) -> float:
    """Bytes/s for streaming a buffer much larger than the caches: sum it with torch.

    Reading is what decoding does to weights, so this is the bandwidth that matters. A sum
    does one add per 4 bytes, far below the compute limit, so memory is the bottleneck.
    Pick ``mib`` several times the last-level cache, or the result measures the cache.
    """
    import torch
    x = torch.ones(mib * 2**20 // 4, dtype=torch.float32)
    seconds = _best_time(lambda: x.sum(), repeats)
    return x.numel() * 4 / seconds


def measure_copy_bandwidth(mib: int = 256, repeats: int = 5) -> float:
    """Bytes/s for a copy (counted as read + write), the STREAM 'copy' convention."""
    import torch
    src = torch.ones(mib * 2**20 // 4, dtype=torch.float32)
    dst = torch.zeros_like(src)            # touched now, so page faults are not timed
    seconds = _best_time(lambda: dst.copy_(src), repeats)
    return 2 * src.numel() * 4 / seconds


def measure_matmul_flops(n: int = 1024, dtype: str = "bfloat16", repeats: int = 5) -> float:
    """FLOP/s of an n x n x n matmul (2 n^3 FLOPs) with torch, in ``dtype``."""
    import torch
    dt = getattr(torch, dtype)
    a = torch.randn(n, n).to(dt)
    b = torch.randn(n, n).to(dt)
    seconds = _best_time(lambda: a @ b, repeats)
    return 2 * n**3 / seconds


@dataclass(frozen=True)
class Machine:
    name: str
    bandwidth: float        # bytes/s
    flops: float            # FLOP/s
    source: str = "measured"

    @property
    def ridge(self) -> float:
        return ridge_intensity(self.flops, self.bandwidth)


def measure_machine(name: str = "this machine", mib: int = 256,
                    sizes: Sequence[int] = (512, 1024, 2048), repeats: int = 5,
                    dtype: str = "bfloat16") -> Machine:
    """Read bandwidth and the best matmul FLOP/s over a few sizes (small ones underuse the
    cores, big ones spill the caches; on a shared machine the best is the least disturbed)."""
    flops = max(measure_matmul_flops(n, dtype, repeats) for n in sizes)
    return Machine(name, measure_read_bandwidth(mib, repeats), flops,
                   f"measured (torch {dtype} matmul, float32 sum of {mib} MiB)")


def measure_cuda_machine(n: int = 4096, mib: int = 1024, repeats: int = 5) -> Machine:
    """The same two measurements on the first CUDA GPU, timed with CUDA events."""
    import torch
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    x = torch.ones(mib * 2**20 // 4, device="cuda", dtype=torch.float32)

    def timed(fn) -> float:
        fn()
        torch.cuda.synchronize()
        best = float("inf")
        for _ in range(repeats):
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            best = min(best, start.elapsed_time(end) / 1e3)
        return best

    return Machine(torch.cuda.get_device_name(), x.numel() * 4 / timed(lambda: x.sum()),
                   2 * n**3 / timed(lambda: a @ a), "measured (torch CUDA, bf16 matmul)")


# ---------------------------------------------------------------------------------------
# The model
# ---------------------------------------------------------------------------------------

def attainable_flops(intensity: float | np.ndarray, peak_flops: float,
                     bandwidth: float) -> float | np.ndarray:
    """The roof: ``min(peak, bandwidth * intensity)``."""
    return np.minimum(peak_flops, bandwidth * np.asarray(intensity, dtype=float))


def ridge_intensity(peak_flops: float, bandwidth: float) -> float:
    return peak_flops / bandwidth


def flops_per_token(cfg: ModelArch, context: int) -> float:
    """FLOPs to push one token through the model when it attends to ``context`` tokens.

    2 per weight (``active_params`` for mixture-of-experts) plus attention: scores (Q.K) and
    the weighted sum of V, each 2 x heads x head_dim per cached token per layer.
    """
    attention = 4 * cfg.num_layers * cfg.num_heads * cfg.head_dim * context
    return 2 * cfg.active_params + attention


@dataclass(frozen=True)
class Point:
    label: str
    intensity: float        # FLOP/byte
    flops: float            # FLOP/s achieved (or bound)
    tokens_per_s: float


def decode_intensity(cfg: ModelArch, batch: int, context: int,
                     weight_dtype: str = "bf16", kv_dtype: str = "bf16") -> float:
    """FLOP/byte of one decode step: ``batch`` new tokens, each attending to ``context``."""
    flops = batch * flops_per_token(cfg, context)
    bytes_ = (cfg.params * WEIGHT_BYTES[weight_dtype]
              + batch * kv_bytes_per_sequence(cfg, context, kv_dtype))
    return flops / bytes_


def prefill_intensity(cfg: ModelArch, prompt_tokens: int, weight_dtype: str = "bf16",
                      kv_dtype: str = "bf16") -> float:
    """FLOP/byte of one prefill of ``prompt_tokens``: weights read once, KV written once.

    Attention inside the prompt averages ``prompt_tokens / 2`` tokens of context.
    """
    flops = prompt_tokens * flops_per_token(cfg, prompt_tokens // 2)
    bytes_ = (cfg.params * WEIGHT_BYTES[weight_dtype]
              + kv_bytes_per_sequence(cfg, prompt_tokens, kv_dtype))
    return flops / bytes_


def decode_point(cfg: ModelArch, batch: int, context: int, tokens_per_s: float,
                 label: str | None = None, weight_dtype: str = "bf16") -> Point:
    """A measured decode rate (all sequences together) placed on the roofline."""
    return Point(label or f"decode b={batch}", decode_intensity(cfg, batch, context, weight_dtype),
                 tokens_per_s * flops_per_token(cfg, context), tokens_per_s)


def prefill_point(cfg: ModelArch, prompt_tokens: int, tokens_per_s: float,
                  label: str | None = None, weight_dtype: str = "bf16") -> Point:
    """A measured prefill rate (prompt tokens per second) placed on the roofline."""
    return Point(label or f"prefill {prompt_tokens}",
                 prefill_intensity(cfg, prompt_tokens, weight_dtype),
                 tokens_per_s * flops_per_token(cfg, prompt_tokens // 2), tokens_per_s)


def decode_bound_tokens_per_s(cfg: ModelArch, machine: Machine, batch: int = 1,
                              context: int = 1, weight_dtype: str = "bf16") -> float:
    """Most tokens/s (all sequences together) the roof allows for decoding."""
    intensity = decode_intensity(cfg, batch, context, weight_dtype)
    return float(attainable_flops(intensity, machine.flops, machine.bandwidth)
                 / flops_per_token(cfg, context))


def time_decode_step(model, context: int, use_cache: bool, repeats: int = 3) -> float:
    """Seconds for one decode step of a Hugging Face causal LM at ``context`` tokens.

    ``use_cache=True`` is what engines do: run only the newest token, reading the keys and
    values of the earlier ones from the cache. ``use_cache=False`` re-runs the whole sequence
    for every new token, the common benchmarking mistake: its cost grows with the context.
    """
    import torch
    ids = torch.randint(100, 1000, (1, context), device=model.device)
    sync = torch.cuda.synchronize if model.device.type == "cuda" else (lambda: None)
    with torch.inference_mode():
        if not use_cache:
            return _best_time(lambda: (model(ids, use_cache=False), sync()), repeats)
        cache = model(ids[:, :-1], use_cache=True).past_key_values

        def step():
            model(ids[:, -1:], past_key_values=cache, use_cache=True)
            cache.crop(-1)               # drop the token just added, so every step is equal
            sync()
        return _best_time(step, repeats)


def time_weight_stream(model, repeats: int = 3) -> float:
    """Seconds to read every parameter of ``model`` once (summing each tensor).

    The floor for any decode step that uses all weights: what bandwidth / weight bytes
    predicts, measured on this model's own tensors instead of a synthetic buffer.
    """
    import torch
    params = list(model.parameters())
    sync = torch.cuda.synchronize if params[0].is_cuda else (lambda: None)
    return _best_time(lambda: ([p.sum() for p in params], sync()), repeats)


def plot_roofline(ax, machine: Machine, points: Sequence[Point] = (),
                  intensity_range: tuple[float, float] = (0.1, 1e4), color: str | None = None,
                  marker: str = "o", annotate: bool = True):
    """Draw ``machine``'s roof (log-log) and ``points`` on a matplotlib axis."""
    x = np.logspace(np.log10(intensity_range[0]), np.log10(intensity_range[1]), 200)
    y = attainable_flops(x, machine.flops, machine.bandwidth)
    (line,) = ax.loglog(x, y, color=color, label=f"{machine.name} roof")
    c = line.get_color()
    ax.axvline(machine.ridge, color=c, linestyle=":", linewidth=0.8)
    for p in points:
        ax.loglog(p.intensity, p.flops, "s" if p.label.startswith("prefill") else marker,
                  color=c)
        if annotate:
            ax.annotate(p.label, (p.intensity, p.flops), textcoords="offset points",
                        xytext=(4, -10), fontsize=7, color=c)
    ax.set_xlabel("arithmetic intensity (FLOP / byte)")
    ax.set_ylabel("FLOP/s")
    ax.grid(True, which="both", linewidth=0.3)
    return ax


def roofline_figure(title: str, machines: Sequence[Machine],
                    points: dict[str, Sequence[Point]] | None = None,
                    intensity_range: tuple[float, float] = (0.1, 1e4)):
    """A figure with each machine's roof and its points (squares: prefill, circles: decode)."""
    from workshop.plots import figure
    fig, ax = figure(title, "arithmetic intensity (FLOP / byte)", "attained FLOP/s")
    for i, m in enumerate(machines):
        # Label the first machine's points only; the others repeat the same labels.
        plot_roofline(ax, m, (points or {}).get(m.name, ()), intensity_range, annotate=i == 0)
    ax.legend(fontsize=8)
    return fig


# ---------------------------------------------------------------------------------------
# Measuring a live server (through the course's benchmark harness)
# ---------------------------------------------------------------------------------------

def serve_decode(session, batch: int, input_len: int = 128, output_len: int = 32,
                 progress: bool = False) -> dict:
    """Decode speed with ``batch`` requests in flight together, from the streamed tokens.

    All ``batch`` requests start at once (closed loop, concurrency = batch) and ask for exactly
    ``output_len`` tokens (``ignore_eos``). TPOT (time per output token after the first) is
    per request; while all of them decode together the engine makes ``batch / TPOT`` tokens/s.
    """
    from workshop.bench import run_benchmark
    res = run_benchmark(base_url=session.base_url, model=session.model, workload="random",
                        num_requests=batch, concurrency=batch, input_len=input_len,
                        output_len=output_len, api_key=session.api_key, progress=progress,
                        warmup=1, seed=batch)
    tpot_ms = res.summary["tpot_ms"]["median"]
    return {"batch": batch, "context": input_len + output_len // 2, "TPOT ms (median)": tpot_ms,
            "tok/s per request": 1000 / tpot_ms, "tok/s total": batch * 1000 / tpot_ms,
            "completed": res.summary["completed"], "errors": res.summary["errors"]}


def serve_prefill(session, prompt_tokens: int, repeats: int = 3, progress: bool = False) -> dict:
    """Prefill speed of one prompt at a time: prompt tokens / time to first token (median).

    TTFT also contains the HTTP round trip, tokenization and one decode step, so short prompts
    understate the prefill rate; long prompts make those fixed costs negligible.
    """
    from workshop.bench import run_benchmark
    res = run_benchmark(base_url=session.base_url, model=session.model, workload="random",
                        num_requests=repeats, concurrency=1, input_len=prompt_tokens,
                        output_len=1, api_key=session.api_key, progress=progress, warmup=1,
                        seed=1000 + prompt_tokens)
    ttft_ms = res.summary["ttft_ms"]["median"]
    return {"prompt tokens": prompt_tokens, "TTFT ms (median)": ttft_ms,
            "prefill tok/s": prompt_tokens * 1000 / ttft_ms,
            "completed": res.summary["completed"], "errors": res.summary["errors"]}


__all__ = [
    "Machine", "Point", "measure_read_bandwidth", "measure_copy_bandwidth",
    "measure_matmul_flops", "measure_machine", "measure_cuda_machine", "attainable_flops", "ridge_intensity",
    "flops_per_token", "decode_intensity", "prefill_intensity", "decode_point",
    "prefill_point", "decode_bound_tokens_per_s", "time_decode_step", "time_weight_stream",
    "plot_roofline",
    "roofline_figure", "serve_decode", "serve_prefill",
]
