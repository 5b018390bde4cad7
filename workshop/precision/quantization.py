"""Weight quantization in a few readable lines: the schemes notebook 4 measures.

* The quantizers are the teaching engine's, imported from their one home,
  ``mini_engine/quant.py``: int8 per channel (one scale per output row), and int4 in groups
  of ``group_size`` consecutive weights in a row (``quantize_int4_groupwise``), packed two per
  byte, each group rebuilt as ``q * scale + offset``. Symmetric groups take offset
  ``-8 * scale``; min/max groups take the group's minimum itself (GGUF's Q4_1), which rebuilds
  weights already on a Q4_1 grid exactly.
* ``QuantLinear`` keeps only the packed integers and scales and rebuilds the bf16 weight inside
  ``forward``. That saves memory, not time: real int4 kernels (llama.cpp, Marlin, torchao) fuse
  the unpacking into the matmul. ``quantize_dynamic_int8`` is the library path that works on
  a CPU today: PyTorch's built-in dynamic int8 (fbgemm/oneDNN kernels).
* ``gguf_summary`` and ``distinct_values_per_group``: what a GGUF file stores, and whether a
  matrix still sits on a 4-bit grid.

Measuring what a scheme costs and buys lives elsewhere: ``model_quality`` (perplexity,
agreement), ``model_memory`` (bytes, RSS), ``quantization_measure`` (one variant end to end).
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Sequence

import torch
from torch import nn

from mini_engine.quant import (
    Int4Weight,
    dequantize_int4,
    dequantize_int8,
    pack_int4,
    quantize_int4_groupwise,
    quantize_int8_per_channel,
    unpack_int4,
)


def relative_error(w: torch.Tensor, rebuilt: torch.Tensor) -> float:
    """mean |rebuilt - w| / mean |w|: the error of a round trip, relative to the weights' size."""
    return ((rebuilt.float() - w.float()).abs().mean() / w.float().abs().mean()).item()


class QuantLinear(nn.Module):
    """A linear layer that stores int8 or packed int4 weights and rebuilds them per call."""

    def __init__(self, linear: nn.Linear, bits: int, group_size: int = 128,
                 symmetric: bool = True):
        super().__init__()
        self.bits, self.in_features, self.out_features = (bits, linear.in_features,
                                                          linear.out_features)
        w = linear.weight.detach()
        if bits == 8:
            q, scale = quantize_int8_per_channel(w)
            self.register_buffer("q", q)
            self.register_buffer("scale", scale.to(torch.bfloat16))
        elif bits == 4:
            qw = quantize_int4_groupwise(w, group_size, symmetric)
            self.group_size = group_size
            self.register_buffer("packed", qw.packed)
            self.register_buffer("scale", qw.scale)
            self.register_buffer("offset", qw.offset)
        else:
            raise ValueError("bits must be 8 or 4")
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach().clone())

    def weight_dequantized(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        if self.bits == 8:
            return self.q.to(dtype) * self.scale.to(dtype)
        return dequantize_int4(Int4Weight(self.packed, self.scale, self.offset, self.group_size,
                                          (self.out_features, self.in_features)), dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.linear(x, self.weight_dequantized(x.dtype), self.bias)


def quantize_model(model: nn.Module, bits: int, group_size: int = 128, symmetric: bool = True,
                   skip: Sequence[str] = ("lm_head",)) -> nn.Module:
    """Replace every ``nn.Linear`` (except names ending in ``skip``) by a ``QuantLinear``.

    ``lm_head`` is skipped by default: in SmolLM2 it *is* the embedding matrix (tied), which
    stays bf16 here, as it does in most int4 recipes.
    """
    for name, module in list(model.named_modules()):
        for child_name, child in list(module.named_children()):
            full = f"{name}.{child_name}" if name else child_name
            if isinstance(child, nn.Linear) and not full.endswith(tuple(skip)):
                setattr(module, child_name, QuantLinear(child, bits, group_size, symmetric))
    return model


def quantize_dynamic_int8(model: nn.Module, skip: Sequence[str] = ("lm_head",)) -> nn.Module:
    """The library path: PyTorch's dynamic int8 quantization of the ``nn.Linear`` layers.

    Weights become int8 with one scale per output row; **activations** are quantized to int8
    on the fly, one scale per tensor, and the matmul runs in int8 kernels (W8A8). It needs
    float32 activations, so the rest of the model is converted to float32 first. ``lm_head``
    (tied to the embedding in SmolLM2) is left alone, as in ``quantize_model``. (PyTorch marks
    this API as moving to ``torchao``; it still ships and works in torch 2.13.)
    """
    import warnings

    from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic
    model = model.float()
    targets = {name: per_channel_dynamic_qconfig for name, m in model.named_modules()
               if isinstance(m, nn.Linear) and not name.endswith(tuple(skip))}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return quantize_dynamic(model, targets, dtype=torch.qint8)


# The variants notebook 4 measures, by the name its table shows.
VARIANTS: dict[str, Callable[[nn.Module], nn.Module]] = {
    "bf16 (reference)": lambda m: m,
    "int8 per-channel (ours)": lambda m: quantize_model(m, 8),
    "int4 group 64, symmetric (ours)": lambda m: quantize_model(m, 4, 64, True),
    "int4 group 32, min/max (ours, Q4_1's grid)": lambda m: quantize_model(m, 4, 32, False),
    "int8 dynamic (PyTorch library)": quantize_dynamic_int8,
}


# ---------------------------------------------------------------------------------------
# The GGUF the bundled model came from
# ---------------------------------------------------------------------------------------


def gguf_summary(path: str | Path) -> dict[str, dict[str, float]]:
    """Per tensor type in a GGUF file: number of weights, bytes, bits per weight."""
    import gguf
    reader = gguf.GGUFReader(str(path))
    out: dict[str, dict[str, float]] = {}
    for t in reader.tensors:
        row = out.setdefault(t.tensor_type.name, {"weights": 0, "bytes": 0})
        row["weights"] += int(t.n_elements)
        row["bytes"] += int(t.n_bytes)
    for row in out.values():
        row["bits_per_weight"] = 8 * row["bytes"] / row["weights"]
    return out


def distinct_values_per_group(w: torch.Tensor, group_size: int = 32,
                              max_groups: int = 2000) -> float:
    """Mean number of distinct values in each group of ``group_size`` consecutive weights.

    A weight matrix that was stored as 4-bit groups has at most 16 per group.
    """
    groups = w.reshape(-1, group_size)[:max_groups]
    return sum(len(torch.unique(g)) for g in groups) / len(groups)


__all__ = [
    "quantize_int8_per_channel", "dequantize_int8", "pack_int4", "unpack_int4",
    "relative_error", "Int4Weight", "quantize_int4_groupwise", "dequantize_int4",
    "QuantLinear", "quantize_model", "quantize_dynamic_int8", "VARIANTS", "gguf_summary",
    "distinct_values_per_group",
]
