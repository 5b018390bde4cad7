"""KV-cache arithmetic: what one token, one sequence and one block of the cache cost.

The one home of the formula the server reports in ``/server_info`` and the course teaches:

    bytes per token = layers x (values cached per layer and token) x bytes per value

where a layer caches K and V for each *KV head* (grouped-query attention shares one KV head
between several query heads; multi-query attention keeps a single one), or, with multi-head
latent attention, one compressed latent plus one shared RoPE key for all heads. Layers with a
sliding window keep only the last ``sliding_window`` tokens, which ``kv_bytes_per_sequence``
accounts for.
"""

from __future__ import annotations

import math

from reference_server import dtypes
from reference_server.model_config import ModelArch


def kv_values_per_token_per_layer(arch: ModelArch) -> int:
    """How many numbers one token leaves in the cache of one layer."""
    if arch.attention == "mla":
        if arch.kv_lora_rank <= 0:
            raise ValueError(f"{arch.name}: MLA config without kv_lora_rank")
        return arch.kv_lora_rank + arch.qk_rope_head_dim
    return 2 * arch.num_kv_heads * arch.head_dim          # K and V, per KV head


def kv_bytes_per_token(arch: ModelArch, kv_dtype: str = "auto") -> float:
    """Bytes one token occupies while every layer still holds it (sliding layers included).

    ``kv_dtype`` "auto" is the model's own dtype (``dtypes.resolve``).
    """
    return (arch.num_layers * kv_values_per_token_per_layer(arch)
            * dtypes.bytes_per_element(kv_dtype, arch.torch_dtype))


def kv_bytes_per_sequence(arch: ModelArch, tokens: int, kv_dtype: str = "auto") -> float:
    """Bytes one sequence of ``tokens`` tokens occupies; sliding layers keep only the window."""
    per_layer_token = (kv_values_per_token_per_layer(arch)
                       * dtypes.bytes_per_element(kv_dtype, arch.torch_dtype))
    full_layers = arch.num_layers - arch.num_sliding_layers
    kept_by_sliding = min(tokens, arch.sliding_window) if arch.num_sliding_layers else 0
    return per_layer_token * (full_layers * tokens + arch.num_sliding_layers * kept_by_sliding)


# -- paged caches: whole blocks only ----------------------------------------------------------

def blocks_for(tokens: int, block_size: int) -> int:
    """A paged KV cache hands out whole blocks: 17 tokens in 16-token blocks take 2."""
    return math.ceil(tokens / block_size) if tokens > 0 else 0


def engine_capacity_tokens(kv_space_bytes: int, bytes_per_token: float, block_size: int) -> int:
    """Tokens a paged engine can hold in ``kv_space_bytes``: whole blocks only.

    vLLM divides its KV space into blocks and reports ``num_blocks * block_size``.
    """
    num_blocks = int(kv_space_bytes // (bytes_per_token * block_size))
    return num_blocks * block_size


__all__ = ["kv_values_per_token_per_layer", "kv_bytes_per_token", "kv_bytes_per_sequence",
           "blocks_for", "engine_capacity_tokens"]
