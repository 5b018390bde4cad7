"""Weight-only quantized linear layers: int8 per output channel, int4 per group.

Activations stay in floating point; only the stored weights shrink (4x and ~7x smaller than
fp32). On a memory-bound decode step the weights are most of the bytes read, which is why
weight-only quantization is the first thing people try. The matmul here dequantizes the
weight to the activation dtype first, so these layers teach *accuracy and memory*, not speed:
fast int kernels (Marlin, AWQ, llama.cpp's Q4) fuse the dequantization into the matmul.

The int4 group quantizer (``quantize_int4_groupwise``) is the one notebook 4 teaches too
(``workshop/precision/quantization.py`` imports it). A weight is rebuilt as ``q * scale +
offset``, q in 0..15, with a float scale and offset per group: llama.cpp's Q4_1 convention (``d
* q + m``).
Asymmetric, the offset is the group's minimum; symmetric, it is ``-8 * scale`` (Q4_0's and
GPTQ's fixed zero point of 8).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


def quantize_int8_per_channel(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``w`` [out, in] -> int8 ``q`` [out, in] and one fp32 scale per output row [out, 1].

    scale = the row's largest |w| / 127, q = w / scale rounded: symmetric, so zero stays exact
    and the row's largest weight is represented exactly.
    """
    w = w.float()
    scale = w.abs().amax(dim=1, keepdim=True).clamp(min=1e-8) / 127.0
    return torch.round(w / scale).clamp(-127, 127).to(torch.int8), scale


def dequantize_int8(q: torch.Tensor, scale: torch.Tensor, dtype=torch.float32) -> torch.Tensor:
    return (q.float() * scale).to(dtype)


def pack_int4(q: torch.Tensor) -> torch.Tensor:
    """Values 0..15, last dimension even -> uint8 with two values per byte (low nibble first)."""
    q = q.to(torch.uint8)
    return q[..., 0::2] | (q[..., 1::2] << 4)


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """The inverse of ``pack_int4``: uint8 values 0..15, twice as many along the last axis."""
    return torch.stack([packed & 0x0F, packed >> 4], dim=-1).flatten(-2)


@dataclass
class Int4Weight:
    packed: torch.Tensor       # uint8 [out, in/2]
    scale: torch.Tensor        # [out, in/group]
    offset: torch.Tensor       # [out, in/group]: the group minimum (asymmetric) or -8*scale
    group_size: int
    shape: tuple[int, int]

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.packed, self.scale, self.offset))


def quantize_int4_groupwise(w: torch.Tensor, group_size: int = 128, symmetric: bool = True,
                            scale_dtype: torch.dtype = torch.bfloat16) -> Int4Weight:
    """``w`` [out, in] -> 16 levels per group of ``group_size`` weights along each row.

    Symmetric: levels -8..7 times ``absmax / 7`` (zero is exact). Asymmetric: 16 levels spread
    from the group's minimum to its maximum (GGUF's Q4_1 does this with groups of 32).
    Either way a weight is rebuilt as ``q * scale + offset`` with q in 0..15.
    """
    out_f, in_f = w.shape
    if in_f % group_size or group_size % 2:
        raise ValueError(f"in_features {in_f} is not a multiple of group_size {group_size}")
    g = w.float().reshape(out_f, in_f // group_size, group_size)
    if symmetric:
        scale = g.abs().amax(dim=-1, keepdim=True).clamp(min=1e-12) / 7
        offset = -8 * scale
    else:
        lo, hi = g.amin(dim=-1, keepdim=True), g.amax(dim=-1, keepdim=True)
        scale = ((hi - lo) / 15).clamp(min=1e-12)
        offset = lo
    # Round with the scale as it will be stored, so rebuilding uses exactly the same numbers.
    scale, offset = scale.to(scale_dtype).float(), offset.to(scale_dtype).float()
    q = torch.round((g - offset) / scale).clamp(0, 15)
    return Int4Weight(pack_int4(q.reshape(out_f, in_f)), scale.squeeze(-1).to(scale_dtype),
                      offset.squeeze(-1).to(scale_dtype), group_size, (out_f, in_f))


def dequantize_int4(w: Int4Weight, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Rebuild ``q * scale + offset`` in ``dtype`` (bf16 halves the memory traffic)."""
    out_f, in_f = w.shape
    q = unpack_int4(w.packed).to(dtype).reshape(out_f, in_f // w.group_size, w.group_size)
    scale, offset = w.scale.to(dtype).unsqueeze(-1), w.offset.to(dtype).unsqueeze(-1)
    return torch.addcmul(offset, q, scale).reshape(out_f, in_f)


class Int8Linear:
    """``y = x @ (q * scale)^T`` with ``q`` int8 and one fp scale per output row (symmetric)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None):
        self.qweight, self.scale = quantize_int8_per_channel(weight)
        self.bias = bias

    def dequantize(self, dtype=torch.float32) -> torch.Tensor:
        return dequantize_int8(self.qweight, self.scale, dtype)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.dequantize(x.dtype), self.bias)

    def nbytes(self) -> int:
        return self.qweight.numel() + self.scale.numel() * 4


class Int4Linear:
    """Asymmetric 4-bit weights in groups of ``group_size`` input columns; two values per
    byte. Each group stores its own scale and minimum, which is what keeps 4 bits usable:
    one outlier only spoils its own group."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None,
                 group_size: int = 64):
        self.qweight = quantize_int4_groupwise(weight, group_size, symmetric=False,
                                               scale_dtype=torch.float32)
        self.bias = bias

    def dequantize(self, dtype=torch.float32) -> torch.Tensor:
        # Rebuilt in fp32, rounded once: the same weights whatever dtype the engine serves in.
        return dequantize_int4(self.qweight, torch.float32).to(dtype)

    @property
    def packed(self) -> torch.Tensor:
        return self.qweight.packed

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.dequantize(x.dtype), self.bias)

    def nbytes(self) -> int:
        return self.qweight.nbytes()
