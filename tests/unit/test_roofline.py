"""Roofline arithmetic, the measurement helpers' bookkeeping (not their speed), the figures."""

from __future__ import annotations

import math

import numpy as np
import pytest

from workshop.compute import roofline as rl
from workshop.compute import roofline_measure as rm
from workshop.compute import roofline_plots as rp
from workshop.sizing.kvcache import load_model
from workshop.timing import best_time_s


def test_roof_is_min_of_bandwidth_and_peak():
    peak, bw = 1e12, 1e11                      # ridge at 10 FLOP/byte
    assert rl.ridge_intensity(peak, bw) == 10
    assert rl.attainable_flops(1.0, peak, bw) == pytest.approx(1e11)
    assert rl.attainable_flops(100.0, peak, bw) == pytest.approx(1e12)
    ys = rl.attainable_flops(np.array([0.5, 10, 20]), peak, bw)
    assert list(ys) == [5e10, 1e12, 1e12]


def test_batch1_decode_intensity_is_about_one_flop_per_byte_at_bf16():
    # 2 FLOPs per weight, 2 bytes per weight: ~1 FLOP/byte, plus a little attention.
    cfg = load_model("llama-3.1-8b")
    i = rl.decode_intensity(cfg, batch=1, context=1)
    assert 0.99 < i < 1.05
    # int4 weights read 4x fewer bytes for the same FLOPs.
    assert rl.decode_intensity(cfg, 1, 1, weight_dtype="int4") == pytest.approx(4 * i, rel=0.05)


def test_decode_intensity_grows_with_batch_but_kv_reads_cap_it():
    cfg = load_model("smollm2-135m")
    xs = [rl.decode_intensity(cfg, b, context=1024) for b in (1, 2, 8, 64, 512, 4096)]
    assert xs == sorted(xs)
    # With a huge batch the step is dominated by each sequence's own KV reads, whose
    # intensity is fixed: per token, attention FLOPs / KV bytes.
    per_token_cap = rl.flops_per_token(cfg, 1024) / (1024 * 23_040)
    assert xs[-1] < per_token_cap


def test_prefill_intensity_is_about_prompt_length():
    cfg = load_model("llama-3.1-8b")
    i = rl.prefill_intensity(cfg, 512)
    assert 400 < i < 600


def test_points_convert_tokens_to_flops():
    cfg = load_model("smollm2-135m")
    p = rl.decode_point(cfg, batch=4, context=100, tokens_per_s=50.0)
    assert p.flops == pytest.approx(50.0 * rl.flops_per_token(cfg, 100))
    assert p.intensity == pytest.approx(rl.decode_intensity(cfg, 4, 100))
    q = rl.prefill_point(cfg, prompt_tokens=256, tokens_per_s=1000.0)
    # Prefill: logits for the last prompt token only.
    assert q.flops == pytest.approx(1000.0 * rl.prefill_flops(cfg, 256) / 256)
    assert q.flops < 1000.0 * rl.flops_per_token(cfg, 128)


def test_decode_bound_batch1_equals_bandwidth_over_bytes():
    cfg = load_model("mistral-7b")
    m = rl.Machine("gpu", bandwidth=2e12, flops=1e15)
    bound = rl.decode_bound_tokens_per_s(cfg, m, batch=1, context=1)
    bytes_per_step = cfg.params * 2 + 2 * 32 * 8 * 128 * 2
    assert bound == pytest.approx(2e12 / bytes_per_step, rel=1e-6)


def test_measurement_bookkeeping(monkeypatch):
    # Fix the timer so the byte and FLOP counts themselves are what is tested.
    monkeypatch.setattr(rm, "best_time_s", lambda fn, repeats: (fn(), 0.5)[1])
    assert rm.measure_read_bandwidth(mib=4) == pytest.approx(4 * 2**20 / 0.5)
    assert rm.measure_copy_bandwidth(mib=4) == pytest.approx(2 * 4 * 2**20 / 0.5)
    assert rm.measure_matmul_flops(n=64) == pytest.approx(2 * 64**3 / 0.5)


def test_measurements_run_and_are_finite():
    bw = rm.measure_read_bandwidth(mib=8, repeats=1)
    fl = rm.measure_matmul_flops(n=128, repeats=1, dtype="float32")
    assert math.isfinite(bw) and bw > 0 and math.isfinite(fl) and fl > 0


def test_plot_roofline_draws(tmp_path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots()
    m = rl.Machine("toy", bandwidth=1e10, flops=1e11)
    rp.plot_roofline(ax, m, [rl.Point("p", 2.0, 1e10, 1.0)])
    assert len(ax.lines) >= 3          # roof, ridge line, point
    fig.savefig(tmp_path / "roof.png")
    plt.close(fig)


def test_time_decode_step_runs_on_a_tiny_model():
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=1024, hidden_size=64, intermediate_size=128,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
    model = LlamaForCausalLM(cfg).eval()
    cached = rm.time_decode_step(model, context=32, use_cache=True, repeats=2)
    full = rm.time_decode_step(model, context=32, use_cache=False, repeats=1)
    assert cached > 0 and full > 0
    assert rm.time_weight_stream(model, repeats=1) > 0


@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="no CUDA device here")
def test_cuda_measurements_run_on_a_gpu():
    """Notebook 3's GPU path: the machine's two ceilings timed with CUDA events, and a decode
    step of a model on the GPU (synchronised, so the time is the kernels', not the launch's)."""
    from transformers import LlamaConfig, LlamaForCausalLM
    m = rm.measure_cuda_machine(n=2048, mib=256, repeats=3)
    print(f"{m.name}: {m.bandwidth / 1e9:.0f} GB/s, {m.flops / 1e12:.0f} TFLOP/s")
    assert m.bandwidth > 1e11 and m.flops > 1e12        # any GPU of the last ten years
    cfg = LlamaConfig(vocab_size=1024, hidden_size=64, intermediate_size=128,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
    model = LlamaForCausalLM(cfg).to("cuda").eval()
    assert rm.time_decode_step(model, context=32, use_cache=True, repeats=2) > 0
    assert rm.time_weight_stream(model, repeats=1) > 0


def test_roofline_figure_has_one_roof_per_machine():
    import matplotlib
    matplotlib.use("Agg")
    machines = [rl.Machine("a", 1e10, 1e11), rl.Machine("b", 1e12, 1e14)]
    fig = rp.roofline_figure("t", machines, {"a": [rl.Point("decode b=1", 1.0, 1e9, 1.0)]})
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert labels == ["a roof", "b roof"]


class _FakeResult:
    def __init__(self, summary):
        self.summary = summary


def test_serve_helpers_turn_latencies_into_rates(monkeypatch):
    import workshop.bench as bench
    calls = []

    def fake_run_benchmark(**kw):
        calls.append(kw)
        return _FakeResult({"tpot_ms": {"median": 50.0}, "ttft_ms": {"median": 200.0},
                            "completed": kw["num_requests"], "errors": 0})
    monkeypatch.setattr(bench, "run_benchmark", fake_run_benchmark)
    session = type("S", (), {"base_url": "http://x", "model": "m", "api_key": None})()
    d = rm.serve_decode(session, batch=8, input_len=100, output_len=20)
    assert d["tok/s per request"] == pytest.approx(20.0)
    assert d["tok/s total"] == pytest.approx(160.0) and d["context"] == 110
    assert calls[-1]["concurrency"] == 8 and calls[-1]["num_requests"] == 8


def test_moe_decode_reads_active_not_all_parameters():
    # gpt-oss-120b: 116.8B parameters, 5.1B active. At batch 1 a decode step reads the shared
    # part and 4 of 128 experts per layer, so an H100's bound is hundreds of tokens/s, not 14.
    cfg = load_model("gpt-oss-120b")
    h100 = rl.Machine("H100", bandwidth=3.35e12, flops=989e12)
    bound = rl.decode_bound_tokens_per_s(cfg, h100, batch=1, context=1)
    assert rl.weights_read_per_step(cfg, 1) == pytest.approx(cfg.active_params, rel=0.01)
    assert 300 < bound < 340
    # A large batch touches nearly every expert: the bytes approach all parameters.
    assert rl.weight_bytes_read(cfg, 4096) == pytest.approx(cfg.params * 2, rel=0.02)
    # Dense models: every weight is read at any batch.
    dense = load_model("llama-3.1-8b")
    assert rl.weight_bytes_read(dense, 1) == rl.weight_bytes_read(dense, 64) == dense.params * 2


def test_prefill_counts_the_lm_head_once():
    cfg = load_model("smollm2-135m")
    head = 49152 * 576
    assert rl.lm_head_params(cfg) == head
    t = 512
    attention = 4 * 30 * 9 * 64 * (t // 2)
    assert rl.prefill_flops(cfg, t) == t * (2 * (cfg.params - head) + attention) + 2 * head
    # Decode computes logits for every new token.
    assert rl.flops_per_token(cfg, 10) == 2 * cfg.params + 4 * 30 * 9 * 64 * 10


def test_above_roof_flags_only_points_over_the_stated_error():
    m = rl.Machine("m", bandwidth=1e10, flops=1e11, ceilings=(("bfloat16", 2e10),
                                                             ("float32", 1e11)))
    ok = rl.Point("prefill ok", 100.0, 1.1 * 2e10, 1.0)          # within 20 % of bf16's
    bad = rl.Point("prefill bad", 100.0, 1.3 * 2e10, 1.0)
    assert [p.label for p, _ in rl.above_roof(m, [ok, bad], dtype="bfloat16")] == ["prefill bad"]
    assert rl.above_roof(m, [ok, bad], dtype="float32") == []
    slow = rl.Point("decode", 0.5, 0.9 * 0.5e10, 1.0)            # memory side of the roof
    assert rl.roof_ratio(m, slow) == pytest.approx(0.9)


def test_measured_bf16_prefill_lies_under_the_measured_bf16_roof():
    """Live: an engine-like prefill (bf16 linears, logits for the last token only) timed in
    this process must not beat the bf16 ceiling measured by ``measure_machine`` beyond the
    stated error. It fails if the roof is timed with a slower kernel than the model's linear
    layers, or if the LM head is counted for every prompt token."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from reference_server.model_config import read_arch
    torch.manual_seed(0)
    hf_cfg = LlamaConfig(vocab_size=32768, hidden_size=256, intermediate_size=688,
                         num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                         tie_word_embeddings=True)
    model = LlamaForCausalLM(hf_cfg).to(torch.bfloat16).eval()
    params = sum(p.numel() for p in model.parameters())     # tied weights counted once
    cfg = read_arch(hf_cfg.to_dict(), name="tiny", params=params)
    machine = rm.measure_machine("here", mib=64, sizes=(256, 512), repeats=3)
    t = 256
    ids = torch.randint(0, 32768, (1, t))
    with torch.inference_mode():
        seconds = best_time_s(lambda: model(ids, logits_to_keep=1), 3)
    point = rl.prefill_point(cfg, t, t / seconds)
    assert rl.above_roof(machine, [point], dtype="bfloat16") == [], (
        f"prefill at {point.flops / 1e9:.2f} GFLOP/s, bf16 ceiling "
        f"{machine.ceiling('bfloat16') / 1e9:.2f}")


def test_moe_reads_more_experts_as_batch_grows():
    cfg = load_model("gpt-oss-120b")
    reads = [rl.weights_read_per_step(cfg, b) for b in (1, 4, 64, 4096)]
    assert reads == sorted(reads)
    assert reads[0] == pytest.approx(cfg.active_params, rel=1e-6)
    assert reads[-1] == pytest.approx(cfg.params, rel=1e-3)
    dense = load_model("llama-3.1-8b")
    assert rl.weights_read_per_step(dense, 64) == dense.params


def test_best_of_keeps_the_least_disturbed_measurement_per_quantity():
    a = rl.Machine("cpu", 10e9, 300e9, "measured", (("bfloat16", 300e9), ("float32", 100e9)))
    b = rl.Machine("cpu", 24e9, 250e9, "measured", (("bfloat16", 250e9), ("float32", 120e9)))
    m = rl.best_of(a, b)
    assert m.bandwidth == 24e9 and m.flops == 300e9
    assert m.ceiling("bfloat16") == 300e9 and m.ceiling("float32") == 120e9
    assert rl.best_of(a) == rl.Machine("cpu", 10e9, 300e9, "measured; best of 1 measurements",
                                       a.ceilings)
