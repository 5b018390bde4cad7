"""Capacity and cost: what fits on a GPU, and back from TPOT and TTFT targets to batches,
request rates and cost; the tables and figures notebook 2 draws from them."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import workshop
from workshop.sizing import capacity as cap
from workshop.sizing import capacity_plots as cp
from workshop.sizing import kvcache as kv


def test_kv_precision_is_separate_from_weight_precision():
    cfg = kv.load_model("llama-3.1-8b")
    assert kv.kv_bytes_per_token(cfg, "fp8") * 2 == kv.kv_bytes_per_token(cfg, "bf16")
    gpu = cap.load_gpus()["L4"]
    a = cap.plan(cfg, gpu, weight_dtype="int4", kv_dtype="bf16", context=8192, users=1)
    b = cap.plan(cfg, gpu, weight_dtype="int4", kv_dtype="fp8", context=8192, users=1)
    assert a.weight_bytes == b.weight_bytes
    assert b.kv_bytes_per_user * 2 == a.kv_bytes_per_user
    assert b.max_users >= 2 * a.max_users


def test_gpu_catalogue_has_sources_and_sane_numbers():
    gpus = cap.load_gpus()
    assert {"T4", "L4", "A100-80GB", "H100-SXM", "H200", "MI300X"} <= set(gpus)
    for g in gpus.values():
        assert g.spec_source and g.price_source
        assert 10 * 2**30 < g.memory_bytes < 300 * 2**30
        assert 1e11 < g.bandwidth_bytes_s < 1e13 and 1e13 < g.flops < 1e16
    assert gpus["H200"].memory_bytes > gpus["H100-SXM"].memory_bytes


# Published driver totals (nvidia-smi memory.total in MiB; rocm-smi's VRAM total for AMD),
# written here by hand from the pages gpus.json cites, so the catalogue is checked against them:
# https://github.com/modal-labs/modal-client/pull/2797 (T4, L4, A10, A100 40GB and 80GB, H100),
# https://github.com/RLinf/RLinf/issues/255 (RTX 4090), rocm-smi's 206141652992 B (MI300X).
PUBLISHED_MIB = {"T4": 15360, "L4": 23034, "A10": 23028, "A100-40GB": 40960,
                 "A100-80GB": 81920, "H100-SXM": 81559, "H200": 143771,
                 "RTX-4090": 24564, "MI300X": 206141652992 // 2**20}
# ECC on GDDR6 takes 1/16 of the chips; elsewhere the driver keeps under 1.5 % of them.
ECC_GDDR = {"T4", "L4", "A10"}


def test_gpu_memory_is_what_the_driver_reports():
    gpus = cap.load_gpus()
    assert set(PUBLISHED_MIB) == set(gpus), "every catalogued GPU needs a published total"
    for name, mib in PUBLISHED_MIB.items():
        assert gpus[name].memory_bytes == mib * 2**20, name
        assert gpus[name].memory_source, name
    # 80 GB read as 10^9 bytes is 74.5 GiB; the A100-80GB's driver reports 80 GiB.
    assert gpus["A100-80GB"].memory_bytes == 80 * 2**30


def test_driver_total_is_within_the_datasheet_gib():
    import json
    for g in json.loads((workshop.DATA_DIR / "gpus.json").read_text())["gpus"]:
        chips = g["memory_gb"] * 2**30          # the datasheet's "GB" of memory is binary
        lost = 1 - cap.gpu_memory_bytes(g) / chips
        assert 0 <= lost <= (1 / 16 + 0.001 if g["name"] in ECC_GDDR else 0.015), g["name"]


def test_gpu_memory_needs_the_driver_figure():
    with pytest.raises(ValueError, match="memory_mib"):
        cap.gpu_memory_bytes({"name": "X", "memory_gb": 24})
    assert cap.gpu_memory_bytes({"memory_gb": 24, "memory_mib": 23034}) == 23034 * 2**20


def test_gpt_oss_120b_fits_one_80gb_gpu_only_in_mxfp4():
    cfg, h100 = kv.load_model("gpt-oss-120b"), cap.load_gpus()["H100-SXM"]
    assert cap.plan(cfg, h100, weight_dtype="mxfp4", context=4096).fits
    assert not cap.plan(cfg, h100, weight_dtype="bf16", context=1).fits


def test_decode_bound_batch1_is_weights_over_bandwidth():
    cfg = kv.load_model("llama-3.1-8b")
    gpu = cap.load_gpus()["H100-SXM"]
    p = cap.plan(cfg, gpu, context=1, users=1)
    expected = gpu.bandwidth_bytes_s / (cfg.params * 2 + kv.kv_bytes_per_sequence(cfg, 1))
    assert p.decode_tok_s_per_user == pytest.approx(expected)
    assert p.bound_by == "memory bandwidth"


def test_batching_raises_total_and_lowers_cost_until_compute_bound():
    cfg = kv.load_model("smollm2-135m")
    gpu = cap.load_gpus()["H100-SXM"]
    plans = [cap.plan(cfg, gpu, context=512, users=u) for u in (1, 8, 64, 512)]
    totals = [p.decode_tok_s_total for p in plans]
    assert totals == sorted(totals)
    costs = [p.usd_per_million_tokens for p in plans]
    assert costs == sorted(costs, reverse=True)


def test_model_that_does_not_fit():
    p = cap.plan(kv.load_model("deepseek-v3"), cap.load_gpus()["H100-SXM"], weight_dtype="fp8")
    assert not p.fits and p.max_users == 0 and p.usd_per_million_tokens is None


@settings(max_examples=60, deadline=None)
@given(context=st.integers(1, 200_000), users=st.integers(1, 300),
       model=st.sampled_from(["smollm2-135m", "qwen2.5-7b", "gpt-oss-120b", "deepseek-v3"]),
       gpu=st.sampled_from(["L4", "A100-80GB", "H200", "MI300X"]),
       wdt=st.sampled_from(["bf16", "fp8", "int4"]), kdt=st.sampled_from(["bf16", "fp8"]))
def test_plan_is_self_consistent(context, users, model, gpu, wdt, kdt):
    cfg = kv.load_model(model)
    g = cap.load_gpus()[gpu]
    p = cap.plan(cfg, g, weight_dtype=wdt, kv_dtype=kdt, context=context, users=users)
    within_model = context <= cfg.max_context
    assert p.fits == (p.memory_for_kv > 0 and users <= p.max_users and within_model)
    if p.max_users:
        assert p.max_users * p.kv_bytes_per_user <= p.memory_for_kv
        assert (p.max_users + 1) * p.kv_bytes_per_user > p.memory_for_kv
    if 0 < p.max_context < cfg.max_context:
        assert users * kv.kv_bytes_per_sequence(cfg, p.max_context, kdt) <= p.memory_for_kv
        assert users * kv.kv_bytes_per_sequence(cfg, p.max_context + 1, kdt) > p.memory_for_kv
    assert p.decode_tok_s_total == pytest.approx(users * p.decode_tok_s_per_user)


def test_notebook_tables_and_figure():
    rows = cp.model_rows()
    assert len(rows) == len(kv.list_models()) and all(set(r) == set(rows[0]) for r in rows)
    gpus = cap.load_gpus()
    g_rows = cp.gpu_rows(kv.load_model("qwen2.5-7b"), gpus, weight_dtype="bf16", kv_dtype="fp8",
                         context=4096, users=8)
    assert [r["GPU"] for r in g_rows] == list(gpus)
    assert {r["fits"] for r in g_rows} <= {"yes", "no"}
    import matplotlib
    matplotlib.use("Agg")
    fig = cp.plot_users_vs_context(kv.load_model("qwen2.5-7b"), gpus["L4"], "int4")
    assert len(fig.axes[0].lines) == 3


# -- from a TPOT target to a batch ------------------------------------------------------------

def _llama_on_l4_terms():
    """Llama 3.1 8B, int4 weights, bf16 cache, 8,192 tokens, L4: the terms written out by hand."""
    cfg, gpu = kv.load_model("llama-3.1-8b"), cap.load_gpus()["L4"]
    weights = cfg.params * (0.5 + 2 / 128)          # int4: half a byte, plus a bf16 scale per 128
    kv_user = 2 * 32 * 8 * 128 * 2 * 8192                    # K and V x layers x KV heads x dim
    return cfg, gpu, weights, kv_user


def test_max_batch_matches_the_closed_form_for_a_dense_memory_bound_model():
    cfg, gpu, weights, kv_user = _llama_on_l4_terms()
    for target in (0.02, 0.05, 0.1):
        closed = int((target * 300e9 - weights) // kv_user)   # (T x bandwidth - W) / KV per user
        assert cap.max_batch_for_tpot(cfg, gpu, target, 8192, weight_dtype="int4") == closed
    # just below one user's step: nobody can be served
    one_user = (weights + kv_user) / 300e9
    assert cap.max_batch_for_tpot(cfg, gpu, 0.999 * one_user, 8192, weight_dtype="int4") == 0
    assert cap.max_batch_for_tpot(cfg, gpu, 1.001 * one_user, 8192, weight_dtype="int4") == 1


def test_max_batch_stops_at_the_compute_bound():
    # One-token contexts leave almost no KV to read: past a few hundred users the FLOPs win.
    cfg, gpu = kv.load_model("smollm2-135m"), cap.load_gpus()["H100-SXM"]
    target = 0.001
    batch = cap.max_batch_for_tpot(cfg, gpu, target, 1)
    assert batch == int(target * 989e12 // (2 * cfg.active_params))
    assert cap.decode_step(cfg, gpu, batch + 1, 1).bound_by == "compute"


def test_moe_batch_sits_between_active_and_total_weights():
    cfg, gpu = kv.load_model("gpt-oss-120b"), cap.load_gpus()["H100-SXM"]
    kv_user = kv.kv_bytes_per_sequence(cfg, 4096)
    target, bw = 0.02, gpu.bandwidth_bytes_s
    batch = cap.max_batch_for_tpot(cfg, gpu, target, 4096)
    if_only_active = (target * bw - 2 * cfg.active_params) // kv_user
    if_all_experts = (target * bw - 2 * cfg.params) // kv_user
    assert if_all_experts < batch < if_only_active


@settings(max_examples=40, deadline=None)
@given(a=st.floats(0.001, 0.5), b=st.floats(0.001, 0.5),
       model=st.sampled_from(["smollm2-135m", "qwen2.5-7b", "gpt-oss-120b"]),
       context=st.integers(1, 100_000))
def test_max_batch_is_the_edge_and_grows_with_the_target(a, b, model, context):
    cfg, gpu = kv.load_model(model), cap.load_gpus()["A100-80GB"]
    lo, hi = sorted((a, b))
    b_lo = cap.max_batch_for_tpot(cfg, gpu, lo, context)
    assert b_lo <= cap.max_batch_for_tpot(cfg, gpu, hi, context)
    if b_lo:
        assert cap.decode_step(cfg, gpu, b_lo, context).seconds <= lo
    assert cap.decode_step(cfg, gpu, b_lo + 1, context).seconds > lo


def test_latency_plan_takes_the_tighter_limit_and_prices_it():
    cfg, gpu, weights, kv_user = _llama_on_l4_terms()
    tight = cap.latency_plan(cfg, gpu, 0.05, context=8192, weight_dtype="int4")
    assert tight.limited_by == "latency target" and tight.batch == tight.max_batch_latency
    tpot = (weights + tight.batch * kv_user) / 300e9
    assert tight.tpot_s == pytest.approx(tpot)
    assert tight.usd_per_million_tokens == pytest.approx(0.80 / (tight.batch / tpot * 3600) * 1e6)
    loose = cap.latency_plan(cfg, gpu, 0.5, context=8192, weight_dtype="int4")
    fits = int((23034 * 2**20 * 0.9 - weights) // kv_user)      # 90% of memory, weights first
    assert loose.limited_by == "KV-cache memory" and loose.batch == fits
    assert loose.max_batch_latency > fits
    two = cap.latency_plan(cfg, gpu, 0.05, context=8192, weight_dtype="int4", num_gpus=2)
    assert two.users_per_gpu == two.batch / 2 and two.batch > tight.batch


def test_latency_plan_when_nothing_fits():
    none = cap.latency_plan(kv.load_model("deepseek-v3"), cap.load_gpus()["H100-SXM"], 0.05,
                           weight_dtype="fp8")
    assert none.batch == 0 and none.step is None and none.usd_per_million_tokens is None
    assert none.limited_by.startswith("memory")
    small = kv.load_model("smollm2-135m")      # its KV would fit, but not past its context limit
    beyond = cap.latency_plan(small, cap.load_gpus()["H200"], 0.05, context=small.max_context + 1)
    assert beyond.batch == 0 and beyond.max_batch_latency > 0
    assert beyond.limited_by.startswith("context")
    with pytest.raises(ValueError):
        cap.latency_plan(kv.load_model("llama-3.1-8b"), cap.load_gpus()["H200"], 0)


def test_latency_table_and_figure():
    import matplotlib
    matplotlib.use("Agg")
    cfg, gpus = kv.load_model("qwen2.5-7b"), cap.load_gpus()
    rows = cp.latency_rows(cfg, gpus, 0.03, weight_dtype="int4", kv_dtype="bf16", context=4096)
    assert [r["GPU"] for r in rows] == list(gpus)
    fig = cp.plot_tpot_vs_batch(cfg, gpus["L4"], 0.03, context=4096, weight_dtype="int4")
    ax = fig.axes[0]
    assert ax.get_title() and ax.get_xlabel() and ax.get_ylabel()
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert any("target 30 ms" in t for t in labels) and any(t.startswith("answer") for t in labels)


# -- from a TTFT target to prompts, requests per second and cost -----------------------------

def _prefill_flops_by_hand(cfg, prompt_len: int) -> float:
    """F(L) as notebook 2 writes it: 2 per active weight per token, attention over the prompt,
    the LM head for the last token only."""
    head = cfg.vocab_size * cfg.hidden_size
    return (2 * prompt_len * cfg.active_params
            + 2 * prompt_len**2 * cfg.num_layers * cfg.num_heads * cfg.head_dim
            - 2 * (prompt_len - 1) * head)


def test_prefill_step_reads_weights_once_and_writes_each_prompts_kv():
    cfg, gpu = kv.load_model("llama-3.1-8b"), cap.load_gpus()["H100-SXM"]
    step = cap.prefill_step(cfg, gpu, 3, 2048, weight_dtype="int4")
    assert step.flops == pytest.approx(3 * _prefill_flops_by_hand(cfg, 2048))
    assert step.bytes_read == pytest.approx(cfg.params * (0.5 + 2 / 128)
                                            + 3 * 2 * 32 * 8 * 128 * 2 * 2048)
    assert step.compute_s == pytest.approx(step.flops / 989e12)
    assert step.bound_by == "compute"           # prefill: thousands of FLOPs per weight byte


def test_max_prompts_matches_the_closed_form_for_a_compute_bound_model():
    cfg, gpu = kv.load_model("llama-3.1-8b"), cap.load_gpus()["H100-SXM"]
    for target, prompt_len in ((0.2, 512), (0.5, 2048), (2.0, 8192)):
        closed = int(target * 989e12 // _prefill_flops_by_hand(cfg, prompt_len))
        assert cap.max_prompts_for_ttft(cfg, gpu, target, prompt_len) == closed > 0
        two = cap.max_prompts_for_ttft(cfg, gpu, target, prompt_len, num_gpus=2)
        assert two == int(target * 2 * 989e12 // _prefill_flops_by_hand(cfg, prompt_len))


@settings(max_examples=40, deadline=None)
@given(target=st.floats(0.001, 5.0), prompt_len=st.integers(1, 32_768),
       model=st.sampled_from(["smollm2-135m", "qwen2.5-7b", "gpt-oss-120b", "deepseek-v3"]),
       gpu=st.sampled_from(["L4", "H100-SXM", "MI300X"]), wdt=st.sampled_from(["bf16", "int4"]))
def test_max_prompts_is_the_inverse_of_the_prefill_time(target, prompt_len, model, gpu, wdt):
    # The inverse (largest N with TTFT(N) <= target) checked against the forward formula.
    cfg, g = kv.load_model(model), cap.load_gpus()[gpu]
    n = cap.max_prompts_for_ttft(cfg, g, target, prompt_len, weight_dtype=wdt)
    if n:
        assert cap.prefill_step(cfg, g, n, prompt_len, weight_dtype=wdt).seconds <= target
    if n < 10**7:                       # the search's cap: past it, n says "at least"
        assert cap.prefill_step(cfg, g, n + 1, prompt_len, weight_dtype=wdt).seconds > target


def test_ttft_plan_streams_within_half_the_target_and_prices_prompt_tokens():
    cfg, gpu = kv.load_model("llama-3.1-8b"), cap.load_gpus()["H100-SXM"]
    tp = cap.ttft_plan(cfg, gpu, 0.5, prompt_len=2048)
    assert tp.together == cap.max_prompts_for_ttft(cfg, gpu, 0.5, 2048) == tp.max_prompts_latency
    assert tp.limited_by == "latency target" and tp.together < tp.max_prompts_memory
    assert tp.stream == cap.max_prompts_for_ttft(cfg, gpu, 0.25, 2048)
    assert tp.stream_step.seconds <= 0.25
    rate = tp.stream / tp.stream_step.seconds
    assert tp.requests_per_s == pytest.approx(rate)
    assert tp.prompt_tokens_per_s == pytest.approx(rate * 2048)
    price = gpu.price_usd_hour
    assert tp.usd_per_million_prompt_tokens == pytest.approx(price / (rate * 2048 * 3600) * 1e6)
    # Compute-bound: halving the batch hardly changes the rate, so the stream's rate is close
    # to what the whole target allows back to back.
    assert tp.requests_per_s == pytest.approx(tp.together / tp.together_step.seconds, rel=0.1)
    two = cap.ttft_plan(cfg, gpu, 0.5, prompt_len=2048, num_gpus=2, price_usd_hour=1.0)
    assert two.requests_per_s_per_gpu == pytest.approx(two.requests_per_s / 2)
    assert two.usd_per_million_prompt_tokens == pytest.approx(
        2 / (two.requests_per_s * 2048 * 3600) * 1e6)


def test_ttft_plan_memory_context_and_too_short_targets():
    h100 = cap.load_gpus()["H100-SXM"]
    none = cap.ttft_plan(kv.load_model("deepseek-v3"), h100, 1.0, weight_dtype="fp8")
    assert none.together == none.stream == 0 and none.together_step is None
    assert none.usd_per_million_prompt_tokens is None and none.limited_by.startswith("memory")
    small = kv.load_model("smollm2-135m")
    beyond = cap.ttft_plan(small, h100, 1.0, prompt_len=small.max_context + 1)
    assert beyond.together == 0 and beyond.limited_by.startswith("context")
    # Long prompts on a small GPU: one fits the target, but not half of it.
    llama, l4 = kv.load_model("llama-3.1-8b"), cap.load_gpus()["L4"]
    tight = cap.ttft_plan(llama, l4, 0.5, prompt_len=2048, weight_dtype="int4")
    assert tight.together == 1 and tight.stream == 0 and tight.requests_per_s == 0.0
    assert cap.ttft_plan(llama, l4, 0.1, prompt_len=2048).limited_by.startswith("latency")
    with pytest.raises(ValueError):
        cap.ttft_plan(llama, l4, 0)


def test_ttft_table_and_figure():
    import matplotlib
    matplotlib.use("Agg")
    cfg, gpus = kv.load_model("qwen2.5-7b"), cap.load_gpus()
    rows = cp.ttft_rows(cfg, gpus, 0.5, prompt_len=4096, weight_dtype="int4", kv_dtype="bf16")
    assert [r["GPU"] for r in rows] == list(gpus)
    fig = cp.plot_ttft_vs_prompts(cfg, gpus["H100-SXM"], 0.5, prompt_len=4096)
    ax = fig.axes[0]
    assert ax.get_title() and ax.get_xlabel() and ax.get_ylabel()
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert any("target 500 ms" in t for t in labels) and any(t.startswith("together")
                                                             for t in labels)
    assert any(t.startswith("stream") for t in labels)


# ---- the fleet plan (notebook 14): demand and a measured throughput to replicas and a bill ----

def test_replicas_for_rounds_up_and_only_up():
    from workshop.sizing.capacity import replicas_for
    assert replicas_for(100.0, 50.0) == 2
    assert replicas_for(100.1, 50.0) == 3
    assert replicas_for(0.0, 50.0) == 0
    with pytest.raises(ValueError):
        replicas_for(1.0, 0.0)


def test_fleet_plan_on_a_hand_computed_day():
    from workshop.sizing.capacity import HOURS_PER_MONTH, fleet_plan
    # 8.64 M tokens a day = 100 tok/s on average; 4 h a day at 3x = 300 tok/s, so the other
    # 20 h carry (2400 - 1200) / 20 = 60 tok/s. One replica serves 100 tok/s.
    p = fleet_plan(8.64e6, peak_to_mean=3, peak_hours=4, tokens_per_s_per_replica=100,
                   on_demand_usd_hour=2.0, reserved_usd_hour=1.0)
    assert (p.mean_tokens_per_s, p.peak_tokens_per_s) == pytest.approx((100, 300))
    assert p.base_tokens_per_s == pytest.approx(60)
    assert (p.replicas_peak, p.replicas_base) == (3, 1)
    reserved, on_demand, mixed = p.options
    days = HOURS_PER_MONTH / 24
    assert reserved.usd_month == pytest.approx(3 * HOURS_PER_MONTH * 1.0)
    assert on_demand.gpu_hours == pytest.approx(days * (4 * 3 + 20 * 1))
    assert on_demand.usd_month == pytest.approx(days * 32 * 2.0)
    assert mixed.reserved_replicas == 1
    assert mixed.on_demand_gpu_hours == pytest.approx(days * 4 * 2)
    assert mixed.usd_month == pytest.approx(HOURS_PER_MONTH * 1.0 + days * 8 * 2.0)
    million = 8.64e6 * days / 1e6
    assert reserved.usd_per_million_tokens == pytest.approx(reserved.usd_month / million)


def test_fleet_plan_refuses_a_peak_longer_than_the_day_allows():
    from workshop.sizing.capacity import fleet_plan
    with pytest.raises(ValueError, match="at most 6"):
        fleet_plan(1e6, peak_to_mean=4, peak_hours=8, tokens_per_s_per_replica=10,
                   on_demand_usd_hour=1, reserved_usd_hour=1)
    flat = fleet_plan(8.64e6, peak_to_mean=1, peak_hours=24, tokens_per_s_per_replica=100,
                      on_demand_usd_hour=1, reserved_usd_hour=1)
    assert flat.replicas_peak == flat.replicas_base == 1
