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


def test_gpu_memory_is_not_datasheet_gb_read_as_gib():
    # Vendors quote decimal GB; nvidia-smi shows e.g. 23,034 MiB (22.5 GiB) on a "24 GB" L4.
    gpus = kv.load_gpus()
    for name in ("L4", "A10"):
        assert gpus[name].memory_bytes < 22.6 * 2**30, name
    assert gpus["T4"].memory_bytes <= 15 * 2**30
    assert gpus["H100-SXM"].memory_bytes < 80 * 2**30
    assert gpus["H200"].memory_bytes < 141 * 2**30
    # Without an nvidia-smi figure the datasheet GB is read as 10^9 bytes.
    assert kv.gpu_memory_bytes({"memory_gb": 24}) == 24 * 10**9
    assert kv.gpu_memory_bytes({"memory_gb": 24, "memory_mib": 23034}) == 23034 * 2**20


def test_gpt_oss_120b_fits_one_80gb_gpu_only_in_mxfp4():
    cfg, h100 = kv.load_model("gpt-oss-120b"), kv.load_gpus()["H100-SXM"]
    assert kv.plan(cfg, h100, weight_dtype="mxfp4", context=4096).fits
    assert not kv.plan(cfg, h100, weight_dtype="bf16", context=1).fits


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


# -- from a TPOT target to a batch ------------------------------------------------------------

def _llama_on_l4_terms():
    """Llama 3.1 8B, int4 weights, bf16 cache, 8,192 tokens, L4: the terms written out by hand."""
    cfg, gpu = kv.load_model("llama-3.1-8b"), kv.load_gpus()["L4"]
    weights = cfg.params * (0.5 + 2 / 128)          # int4: half a byte, plus a bf16 scale per 128
    kv_user = 2 * 32 * 8 * 128 * 2 * 8192                    # K and V x layers x KV heads x dim
    return cfg, gpu, weights, kv_user


def test_max_batch_matches_the_closed_form_for_a_dense_memory_bound_model():
    cfg, gpu, weights, kv_user = _llama_on_l4_terms()
    for target in (0.02, 0.05, 0.1):
        closed = int((target * 300e9 - weights) // kv_user)   # (T x bandwidth - W) / KV per user
        assert kv.max_batch_for_tpot(cfg, gpu, target, 8192, weight_dtype="int4") == closed
    # just below one user's step: nobody can be served
    one_user = (weights + kv_user) / 300e9
    assert kv.max_batch_for_tpot(cfg, gpu, 0.999 * one_user, 8192, weight_dtype="int4") == 0
    assert kv.max_batch_for_tpot(cfg, gpu, 1.001 * one_user, 8192, weight_dtype="int4") == 1


def test_max_batch_stops_at_the_compute_bound():
    # One-token contexts leave almost no KV to read: past a few hundred users the FLOPs win.
    cfg, gpu = kv.load_model("smollm2-135m"), kv.load_gpus()["H100-SXM"]
    target = 0.001
    batch = kv.max_batch_for_tpot(cfg, gpu, target, 1)
    assert batch == int(target * 989e12 // (2 * cfg.active_params))
    assert kv.decode_step(cfg, gpu, batch + 1, 1).bound_by == "compute"


def test_moe_batch_sits_between_active_and_total_weights():
    cfg, gpu = kv.load_model("gpt-oss-120b"), kv.load_gpus()["H100-SXM"]
    kv_user = kv.kv_bytes_per_sequence(cfg, 4096)
    target, bw = 0.02, gpu.bandwidth_bytes_s
    batch = kv.max_batch_for_tpot(cfg, gpu, target, 4096)
    if_only_active = (target * bw - 2 * cfg.active_params) // kv_user
    if_all_experts = (target * bw - 2 * cfg.params) // kv_user
    assert if_all_experts < batch < if_only_active


@settings(max_examples=40, deadline=None)
@given(a=st.floats(0.001, 0.5), b=st.floats(0.001, 0.5),
       model=st.sampled_from(["smollm2-135m", "qwen2.5-7b", "gpt-oss-120b"]),
       context=st.integers(1, 100_000))
def test_max_batch_is_the_edge_and_grows_with_the_target(a, b, model, context):
    cfg, gpu = kv.load_model(model), kv.load_gpus()["A100-80GB"]
    lo, hi = sorted((a, b))
    b_lo = kv.max_batch_for_tpot(cfg, gpu, lo, context)
    assert b_lo <= kv.max_batch_for_tpot(cfg, gpu, hi, context)
    if b_lo:
        assert kv.decode_step(cfg, gpu, b_lo, context).seconds <= lo
    assert kv.decode_step(cfg, gpu, b_lo + 1, context).seconds > lo


def test_latency_plan_takes_the_tighter_limit_and_prices_it():
    cfg, gpu, weights, kv_user = _llama_on_l4_terms()
    tight = kv.latency_plan(cfg, gpu, 0.05, context=8192, weight_dtype="int4")
    assert tight.limited_by == "latency target" and tight.batch == tight.max_batch_latency
    tpot = (weights + tight.batch * kv_user) / 300e9
    assert tight.tpot_s == pytest.approx(tpot)
    assert tight.usd_per_million_tokens == pytest.approx(0.80 / (tight.batch / tpot * 3600) * 1e6)
    loose = kv.latency_plan(cfg, gpu, 0.5, context=8192, weight_dtype="int4")
    fits = int((23034 * 2**20 * 0.9 - weights) // kv_user)      # 90% of memory, weights first
    assert loose.limited_by == "KV-cache memory" and loose.batch == fits
    assert loose.max_batch_latency > fits
    two = kv.latency_plan(cfg, gpu, 0.05, context=8192, weight_dtype="int4", num_gpus=2)
    assert two.users_per_gpu == two.batch / 2 and two.batch > tight.batch


def test_latency_plan_when_nothing_fits():
    none = kv.latency_plan(kv.load_model("deepseek-v3"), kv.load_gpus()["H100-SXM"], 0.05,
                           weight_dtype="fp8")
    assert none.batch == 0 and none.step is None and none.usd_per_million_tokens is None
    assert none.limited_by.startswith("memory")
    small = kv.load_model("smollm2-135m")      # its KV would fit, but not past its context limit
    beyond = kv.latency_plan(small, kv.load_gpus()["H200"], 0.05, context=small.max_context + 1)
    assert beyond.batch == 0 and beyond.max_batch_latency > 0
    assert beyond.limited_by.startswith("context")
    with pytest.raises(ValueError):
        kv.latency_plan(kv.load_model("llama-3.1-8b"), kv.load_gpus()["H200"], 0)


def test_latency_table_and_figure():
    import matplotlib
    matplotlib.use("Agg")
    cfg, gpus = kv.load_model("qwen2.5-7b"), kv.load_gpus()
    rows = kv.latency_rows(cfg, gpus, 0.03, weight_dtype="int4", kv_dtype="bf16", context=4096)
    assert [r["GPU"] for r in rows] == list(gpus)
    fig = kv.plot_tpot_vs_batch(cfg, gpus["L4"], 0.03, context=4096, weight_dtype="int4")
    ax = fig.axes[0]
    assert ax.get_title() and ax.get_xlabel() and ax.get_ylabel()
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert any("target 30 ms" in t for t in labels) and any(t.startswith("answer") for t in labels)


def test_notebook_02_offers_mxfp4_weights():
    import ast
    from pathlib import Path
    src = Path(__file__).parents[2] / "notebooks" / "src" / "02_kv_cache_capacity.py"
    offered = next(ast.literal_eval(node.value.args[0]) for node in ast.walk(ast.parse(src.read_text()))
                   if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "calc_weights")
    assert "mxfp4" in offered and set(offered) <= set(kv.WEIGHT_BYTES)
