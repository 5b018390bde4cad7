"""KV-cache size of one token, from a Hugging Face config: what the server reports."""

from __future__ import annotations

DTYPE_BYTES = {"float32": 4, "fp32": 4, "float16": 2, "fp16": 2, "half": 2, "bfloat16": 2,
               "bf16": 2, "auto": 2, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1, "int8": 1}


def kv_bytes_per_token(config: dict, dtype: str) -> int:
    """2 (K and V) x layers x KV heads x head dim x bytes per element.

    GQA/MQA shrink the KV-head count, which is why it comes from ``num_key_value_heads``
    and not from ``num_attention_heads``.
    """
    layers = config["num_hidden_layers"]
    heads = config["num_attention_heads"]
    kv_heads = config.get("num_key_value_heads") or heads
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    return 2 * layers * kv_heads * head_dim * DTYPE_BYTES[str(dtype).lower()]
