"""Linear layers: how a projection's weight is stored and multiplied.

Every projection of the model (fused q/k/v, o, fused gate/up, down, the LM head) is one of
these, built by ``make_linear``. They share one contract: ``layer(x)`` is
``x @ W.T + b`` for ``x`` of shape ``[..., in]``; ``dequantize(dtype)`` returns ``W`` as a
plain ``[out, in]`` matrix (``loader.hf_state_dict`` reads it); ``nbytes()`` is what the
stored weight takes.

* ``DenseLinear``: the weight as loaded, multiplied by ``F.linear``.
* ``PackedLinear``: the same weight reordered *once*, at load time, into the blocked layout
  oneDNN's matmul kernels read on this CPU. Handed a plain bf16 weight, oneDNN reorders it
  into that layout on every call; at decode time (one row of activations) the reorder took
  as long as the multiplication itself (docs/runs/mini_engine_speed.md has the figures). Same
  numbers out, since the same kernel runs. vLLM-CPU also packs every weight at load
  (``dispatch_cpu_unquantized_gemm`` in ``vllm/model_executor/layers/utils.py``: a oneDNN
  matmul handle per layer, or SGLang's packed kernel for small shapes). Used for bf16/fp16
  on CPU; float32 keeps ``F.linear``, the path Hugging Face's ``nn.Linear`` takes, so fp32
  stays bit-exact with it (oneDNN's fp32 kernel sums in another order), unless asked
  (``fp32=True``: the engine's ``prepack_fp32``), which trades that for speed.
* ``Int8Linear``, ``Int4Linear`` (``quant.py``): weight-only quantization.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from mini_engine.quant import Int4Linear, Int8Linear


class DenseLinear:
    """The unquantized layer, with the same call shape as the quantized ones."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None):
        self.weight, self.bias = weight, bias

    def dequantize(self, dtype=torch.float32) -> torch.Tensor:
        return self.weight.to(dtype)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)

    def nbytes(self) -> int:
        return self.weight.numel() * self.weight.element_size()


class PackedLinear(DenseLinear):
    """A dense weight in oneDNN's blocked layout, packed once (CPU only)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None):
        super().__init__(torch.ops.mkldnn._reorder_linear_weight(weight, None), bias)

    def dequantize(self, dtype=torch.float32) -> torch.Tensor:
        return self.weight.to_dense().to(dtype)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.weight, self.bias, "none", [], "")


def can_prepack(dtype: torch.dtype, device: torch.device | str, fp32: bool = False) -> bool:
    """Whether ``PackedLinear`` applies: bf16/fp16 on a CPU whose oneDNN computes it; float32
    too when ``fp32``."""
    if torch.device(device).type != "cpu" or not torch.backends.mkldnn.is_available():
        return False
    if dtype == torch.bfloat16:
        return torch.ops.mkldnn._is_mkldnn_bf16_supported()
    if dtype == torch.float16:
        return torch.ops.mkldnn._is_mkldnn_fp16_supported()
    return fp32 and dtype == torch.float32


def packs(dtype: torch.dtype, device: torch.device | str, quant: str | None = None,
          prepack: bool = False, prepack_fp32: bool = False) -> bool:
    """Whether ``make_linear`` with these settings returns a ``PackedLinear`` (a server
    choosing its threads asks before the model loads)."""
    return quant in (None, "none") and prepack and can_prepack(dtype, device, fp32=prepack_fp32)


def make_linear(weight: torch.Tensor, bias: torch.Tensor | None, quant: str | None = None,
                prepack: bool = False, prepack_fp32: bool = False):
    """The layer for ``weight`` [out, in]: quantized if ``quant`` says so, else packed for
    oneDNN when ``packs`` says so, else plain."""
    if quant == "int8":
        return Int8Linear(weight, bias)
    if quant == "int4":
        return Int4Linear(weight, bias)
    if quant not in (None, "none"):
        raise ValueError(f"unknown quantization {quant!r}: none | int8 | int4")
    if packs(weight.dtype, weight.device, quant, prepack, prepack_fp32):
        return PackedLinear(weight, bias)
    return DenseLinear(weight, bias)
