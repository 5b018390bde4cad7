"""Weight-only quantized linear layers: int8 per output channel, int4 per group.

Activations stay in floating point; only the stored weights shrink (4x and ~7x smaller than
fp32). On a memory-bound decode step the weights are most of the bytes read, which is why
weight-only quantization is the first thing people try. The matmul here dequantizes the
weight to the activation dtype first, so these layers teach *accuracy and memory*, not speed:
fast int kernels (Marlin, AWQ, llama.cpp's Q4) fuse the dequantization into the matmul.
"""

from __future__ import annotations

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
    byte. Each group stores its own scale and zero point, which is what keeps 4 bits usable:
    one outlier only spoils its own group."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None,
                 group_size: int = 64):
        out_f, in_f = weight.shape
        if in_f % group_size or group_size % 2:
            raise ValueError(f"in_features {in_f} not divisible by group size {group_size}")
        w = weight.float().reshape(out_f, in_f // group_size, group_size)
        lo, hi = w.amin(dim=2, keepdim=True), w.amax(dim=2, keepdim=True)
        scale = ((hi - lo) / 15.0).clamp(min=1e-8)
        zero = torch.round(-lo / scale)
        self.packed = pack_int4(torch.round(w / scale + zero).clamp(0, 15).reshape(out_f, in_f))
        self.scale, self.zero = scale, zero
        self.shape, self.group_size, self.bias = (out_f, in_f), group_size, bias

    def dequantize(self, dtype=torch.float32) -> torch.Tensor:
        out_f, in_f = self.shape
        q = unpack_int4(self.packed).float().reshape(out_f, -1, self.group_size)
        w = (q - self.zero) * self.scale
        return w.reshape(out_f, in_f).to(dtype)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.dequantize(x.dtype), self.bias)

    def nbytes(self) -> int:
        return self.packed.numel() + (self.scale.numel() + self.zero.numel()) * 4
