"""The roofline model: measure this machine, then place prefill and decode on it.

A kernel that does F floating-point operations while moving B bytes to or from memory has
*arithmetic intensity* I = F / B (FLOP per byte). On a machine with peak compute P (FLOP/s)
and memory bandwidth W (bytes/s) it can run at most ``min(P, W * I)`` FLOP/s: below the
*ridge point* I = P / W it waits on memory, above it on arithmetic.

For a transformer, every weight is used for 2 FLOPs (multiply + add) per token that passes
through it. Decoding one token per sequence for a batch of B sequences reads the weights once
(for mixture-of-experts: the shared part and the experts its tokens were routed to) and each
sequence's KV cache, so its intensity grows with B; a prefill of T prompt tokens reads the
weights once for all T tokens, so its intensity is about T FLOP/byte at bf16. Engines compute
logits only for the last prompt token, so a prefill does the LM head's matmul once, not T times.

The compute roof is the best FLOP/s the machine reaches with the kernel an engine uses for its
linear layers (``x @ W.T``, ``torch.nn.functional.linear``), over the dtypes it offers. The
kernel matters: on a CPU without bf16 instructions (AVX2 only) PyTorch's bf16 ``a @ b`` took
0.5 GFLOP/s where bf16 ``F.linear`` on the same matrices took 3.6 and float32 7.5-145
(measured 2026-12-01 on the course's 2-core machine), so a roof timed with bf16 ``a @ b`` sat
below the engine's measured prefill.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from reference_server.kv import kv_bytes_per_sequence
from reference_server.model_config import ModelArch
from workshop.kvcache import WEIGHT_BYTES, weights_read_per_step


# ---------------------------------------------------------------------------------------
# Measuring this machine
# ---------------------------------------------------------------------------------------

def best_time_s(fn: Callable[[], object], repeats: int = 3) -> float:
    """Fastest of ``repeats`` timed calls after one warm-up (the least disturbed by others)."""
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
    seconds = best_time_s(lambda: x.sum(), repeats)
    return x.numel() * 4 / seconds


def measure_copy_bandwidth(mib: int = 256, repeats: int = 5) -> float:
    """Bytes/s for a copy (counted as read + write), the STREAM 'copy' convention."""
    import torch
    src = torch.ones(mib * 2**20 // 4, dtype=torch.float32)
    dst = torch.zeros_like(src)            # touched now, so page faults are not timed
    seconds = best_time_s(lambda: dst.copy_(src), repeats)
    return 2 * src.numel() * 4 / seconds


def measure_matmul_flops(n: int = 1024, dtype: str = "bfloat16", repeats: int = 5) -> float:
    """FLOP/s of an n x n x n product (2 n^3 FLOPs) in ``dtype``, laid out as a linear layer.

    ``F.linear(x, W)`` computes ``x @ W.T``, the layout of every ``nn.Linear`` and of the
    engines' linear layers; PyTorch may route a plain ``a @ b`` to a different, much slower
    kernel (see the module docstring).
    """
    import torch
    dt = getattr(torch, dtype)
    x = torch.randn(n, n).to(dt)
    w = torch.randn(n, n).to(dt)
    seconds = best_time_s(lambda: torch.nn.functional.linear(x, w), repeats)
    return 2 * n**3 / seconds


@dataclass(frozen=True)
class Machine:
    name: str
    bandwidth: float        # bytes/s
    flops: float            # FLOP/s: the roof, the best of ``ceilings``
    source: str = "measured"
    # FLOP/s per dtype ("bfloat16": ...): lower compute ceilings a kernel in that dtype meets
    ceilings: tuple[tuple[str, float], ...] = ()

    @property
    def ridge(self) -> float:
        return ridge_intensity(self.flops, self.bandwidth)

    def ceiling(self, dtype: str | None = None) -> float:
        """Peak FLOP/s for kernels in ``dtype`` (the roof when that dtype was not measured)."""
        return dict(self.ceilings).get(dtype, self.flops) if dtype else self.flops


def measure_machine(name: str = "this machine", mib: int = 256,
                    sizes: Sequence[int] = (512, 1024, 2048), repeats: int = 5,
                    dtypes: Sequence[str] = ("bfloat16", "float32")) -> Machine:
    """Read bandwidth, and the best linear-layer FLOP/s over a few sizes for each dtype.

    The roof is the best dtype (what the hardware can do); each dtype's best is kept as a
    ceiling, since an engine serving bf16 on a CPU without bf16 instructions cannot reach
    the float32 roof. Small sizes underuse the cores, big ones spill the caches; on a shared
    machine the best of several runs is the least disturbed.
    """
    ceilings = tuple((dt, max(measure_matmul_flops(n, dt, repeats) for n in sizes))
                     for dt in dtypes)
    best = max(ceilings, key=lambda c: c[1])
    return Machine(name, measure_read_bandwidth(mib, repeats), best[1],
                   f"measured (torch F.linear, best of {', '.join(dtypes)}: {best[0]}; "
                   f"float32 sum of {mib} MiB)", ceilings)


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
                   2 * n**3 / timed(lambda: torch.nn.functional.linear(a, a)),
                   "measured (torch CUDA, bf16 F.linear)")


# ---------------------------------------------------------------------------------------
# The model
# ---------------------------------------------------------------------------------------

def attainable_flops(intensity: float | np.ndarray, peak_flops: float,
                     bandwidth: float) -> float | np.ndarray:
    """The roof: ``min(peak, bandwidth * intensity)``."""
    return np.minimum(peak_flops, bandwidth * np.asarray(intensity, dtype=float))


def ridge_intensity(peak_flops: float, bandwidth: float) -> float:
    return peak_flops / bandwidth


def lm_head_params(cfg: ModelArch) -> int:
    """Weights of the output projection (hidden -> vocabulary logits)."""
    return cfg.vocab_size * cfg.hidden_size


def flops_per_token(cfg: ModelArch, context: int, logits: bool = True) -> float:
    """FLOPs to push one token through the model when it attends to ``context`` tokens.

    2 per weight (``active_params`` for mixture-of-experts) plus attention: scores (Q.K) and
    the weighted sum of V, each 2 x heads x head_dim per cached token per layer.
    ``logits=False`` leaves out the LM head: engines compute logits only for the last token
    of a prompt.
    """
    attention = 4 * cfg.num_layers * cfg.num_heads * cfg.head_dim * context
    head = 0 if logits else lm_head_params(cfg)
    return 2 * (cfg.active_params - head) + attention


def prefill_flops(cfg: ModelArch, prompt_tokens: int) -> float:
    """FLOPs of one prefill: every prompt token through the layers (attending on average to
    half the prompt), logits for the last one only."""
    return (prompt_tokens * flops_per_token(cfg, prompt_tokens // 2, logits=False)
            + 2 * lm_head_params(cfg))


@dataclass(frozen=True)
class Point:
    label: str
    intensity: float        # FLOP/byte
    flops: float            # FLOP/s achieved (or bound)
    tokens_per_s: float


def weight_bytes_read(cfg: ModelArch, tokens: int, weight_dtype: str = "bf16") -> float:
    """Weight bytes one forward pass over ``tokens`` tokens reads: all of a dense model; for
    mixture-of-experts the shared part plus the experts those tokens were routed to."""
    return weights_read_per_step(cfg, tokens) * WEIGHT_BYTES[weight_dtype]


def decode_intensity(cfg: ModelArch, batch: int, context: int,
                     weight_dtype: str = "bf16", kv_dtype: str = "bf16") -> float:
    """FLOP/byte of one decode step: ``batch`` new tokens, each attending to ``context``."""
    flops = batch * flops_per_token(cfg, context)
    bytes_ = (weight_bytes_read(cfg, batch, weight_dtype)
              + batch * kv_bytes_per_sequence(cfg, context, kv_dtype))
    return flops / bytes_


def prefill_intensity(cfg: ModelArch, prompt_tokens: int, weight_dtype: str = "bf16",
                      kv_dtype: str = "bf16") -> float:
    """FLOP/byte of one prefill of ``prompt_tokens``: weights read once, KV written once."""
    bytes_ = (weight_bytes_read(cfg, prompt_tokens, weight_dtype)
              + kv_bytes_per_sequence(cfg, prompt_tokens, kv_dtype))
    return prefill_flops(cfg, prompt_tokens) / bytes_


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
                 tokens_per_s * prefill_flops(cfg, prompt_tokens) / prompt_tokens, tokens_per_s)


def decode_bound_tokens_per_s(cfg: ModelArch, machine: Machine, batch: int = 1,
                              context: int = 1, weight_dtype: str = "bf16") -> float:
    """Most tokens/s (all sequences together) the roof allows for decoding."""
    intensity = decode_intensity(cfg, batch, context, weight_dtype)
    return float(attainable_flops(intensity, machine.flops, machine.bandwidth)
                 / flops_per_token(cfg, context))


# Measured points are medians of a few requests on a shared machine, the roof the best of a
# few runs; 20 % covers the run-to-run spread seen on the course's 2-core machine.
MEASUREMENT_ERROR = 0.20


def roof_ratio(machine: Machine, point: Point, dtype: str | None = None) -> float:
    """Attained / attainable at the point's intensity, under the ``dtype`` ceiling."""
    return point.flops / float(attainable_flops(point.intensity, machine.ceiling(dtype),
                                                machine.bandwidth))


def above_roof(machine: Machine, points: Sequence[Point], dtype: str | None = None,
               error: float = MEASUREMENT_ERROR) -> list[tuple[Point, float]]:
    """The points that attain more than ``(1 + error)`` x their roof, with their ratio.

    A point measured with ``dtype`` kernels is held to that dtype's ceiling. Physically none
    can be above: a non-empty answer means a FLOP or byte count, or the roof, is wrong.
    """
    ratios = [(p, roof_ratio(machine, p, dtype)) for p in points]
    return [(p, r) for p, r in ratios if r > 1 + error]


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
            return best_time_s(lambda: (model(ids, use_cache=False), sync()), repeats)
        cache = model(ids[:, :-1], use_cache=True).past_key_values

        def step():
            model(ids[:, -1:], past_key_values=cache, use_cache=True)
            cache.crop(-1)               # drop the token just added, so every step is equal
            sync()
        return best_time_s(step, repeats)


def time_weight_stream(model, repeats: int = 3) -> float:
    """Seconds to read every parameter of ``model`` once (summing each tensor).

    The floor for any decode step that uses all weights: what bandwidth / weight bytes
    predicts, measured on this model's own tensors instead of a synthetic buffer.
    """
    import torch
    params = list(model.parameters())
    sync = torch.cuda.synchronize if params[0].is_cuda else (lambda: None)
    return best_time_s(lambda: ([p.sum() for p in params], sync()), repeats)


def plot_roofline(ax, machine: Machine, points: Sequence[Point] = (),
                  intensity_range: tuple[float, float] = (0.1, 1e4), color: str | None = None,
                  marker: str = "o", annotate: bool = True):
    """Draw ``machine``'s roof (log-log) and ``points`` on a matplotlib axis."""
    x = np.logspace(np.log10(intensity_range[0]), np.log10(intensity_range[1]), 200)
    y = attainable_flops(x, machine.flops, machine.bandwidth)
    (line,) = ax.loglog(x, y, color=color, label=f"{machine.name} roof")
    c = line.get_color()
    ax.axvline(machine.ridge, color=c, linestyle=":", linewidth=0.8)
    for dtype, flops in machine.ceilings:
        if flops < 0.95 * machine.flops:      # a lower ceiling: the roof for that dtype
            ax.loglog(x, attainable_flops(x, flops, machine.bandwidth), color=c,
                      linestyle="--", linewidth=0.9, label=f"{machine.name}: {dtype} ceiling")
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
    "flops_per_token", "lm_head_params", "prefill_flops", "weight_bytes_read",
    "MEASUREMENT_ERROR", "roof_ratio", "above_roof", "decode_intensity", "prefill_intensity", "decode_point",
    "prefill_point", "decode_bound_tokens_per_s", "time_decode_step", "time_weight_stream",
    "plot_roofline",
    "roofline_figure", "serve_decode", "serve_prefill",
]
