"""The roofline model: what bounds a forward pass, and where prefill and decode sit under it.

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

The compute roof is the best FLOP/s the machine reaches with the kernels engines use for their
linear layers (``x @ W.T``: ``torch.nn.functional.linear`` and oneDNN's packed matmul), over the
dtypes it offers. The
kernel matters: on a CPU without bf16 instructions (AVX2 only) PyTorch's bf16 ``a @ b`` was
several times slower than bf16 ``F.linear`` on the same matrices (docs/measured_here.md), so
a roof timed with bf16 ``a @ b`` sat below the engine's measured prefill.

Pure arithmetic: measuring this machine and a live server is ``roofline_measure``, drawing the
roofs ``roofline_plots``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from reference_server.kv import kv_bytes_per_sequence
from reference_server.model_config import ModelArch
from workshop.sanity import MEASUREMENT_ERROR, Violation, within
from workshop.sizing.kvcache import WEIGHT_BYTES


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


def best_of(*machines: Machine) -> Machine:
    """One machine measured several times: the best bandwidth and the best ceiling per dtype.
    A disturbed measurement only ever comes out low, so the best is the least disturbed."""
    first = machines[0]
    ceilings: dict[str, float] = {}
    for m in machines:
        for dt, f in m.ceilings:
            ceilings[dt] = max(f, ceilings.get(dt, 0.0))
    return Machine(first.name, max(m.bandwidth for m in machines),
                   max(m.flops for m in machines),
                   f"{first.source}; best of {len(machines)} measurements", tuple(ceilings.items()))


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


def weights_read_per_step(cfg: ModelArch, batch: int) -> float:
    """Parameters one forward pass over ``batch`` tokens must read (a decode step for
    ``batch`` users, or a prefill of ``batch`` prompt tokens in all).

    Dense model: all of them, whatever the batch. Mixture-of-experts: the always-used part
    plus the experts at least one of the ``batch`` tokens was routed to. With uniform routing
    an expert is untouched by one token with probability 1 - k/E, by ``batch`` tokens with
    (1 - k/E)**batch. The expert and shared sizes follow from total and active counts:
    total - active = experts * (1 - k/E).
    """
    if not cfg.num_experts or cfg.active_params >= cfg.params:
        return float(cfg.params)
    frac = cfg.experts_per_token / cfg.num_experts
    experts = (cfg.params - cfg.active_params) / (1 - frac)
    shared = cfg.params - experts
    touched = 1 - (1 - frac) ** max(batch, 1)
    return shared + experts * touched


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




def roof_at(machine: Machine, point: Point, dtype: str | None = None) -> float:
    """Attainable FLOP/s at the point's intensity, under the ``dtype`` ceiling."""
    return float(attainable_flops(point.intensity, machine.ceiling(dtype), machine.bandwidth))


def roof_ratio(machine: Machine, point: Point, dtype: str | None = None) -> float:
    """Attained / attainable at the point's intensity, under the ``dtype`` ceiling."""
    return point.flops / roof_at(machine, point, dtype)


def above_roof(machine: Machine, points: Sequence[Point], dtype: str | None = None,
               error: float = MEASUREMENT_ERROR) -> list[tuple[Point, float]]:
    """The points that attain more than ``(1 + error)`` x their roof, with their ratio.

    A point measured with ``dtype`` kernels is held to that dtype's ceiling. Physically none
    can be above: a non-empty answer means a FLOP or byte count, or the roof, is wrong.
    """
    ratios = [(p, roof_ratio(machine, p, dtype)) for p in points]
    return [(p, r) for p, r in ratios if r > 1 + error]


def roof_violations(machine: Machine, points: Sequence[Point], dtype: str | None = None,
                    error: float = MEASUREMENT_ERROR) -> list[Violation]:
    """``above_roof`` as sanity-gate violations (``workshop.sanity``), with the numbers."""
    return [v for p in points
            for v in within(p.label, p.flops / 1e9, roof_at(machine, p, dtype) / 1e9,
                            "GFLOP/s", f"above the {dtype or 'best'} roof",
                            ("cache", "busy", "kernel", "count"), error)]


__all__ = [
    "Machine", "best_of", "attainable_flops", "ridge_intensity", "lm_head_params",
    "flops_per_token", "prefill_flops", "Point", "weights_read_per_step", "weight_bytes_read",
    "decode_intensity",
    "prefill_intensity", "decode_point", "prefill_point", "decode_bound_tokens_per_s",
    "MEASUREMENT_ERROR", "roof_at", "roof_ratio", "above_roof", "roof_violations",
]
