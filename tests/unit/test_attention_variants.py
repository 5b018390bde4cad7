"""Attention variants: each variant's cache counted by hand, window capacity, quality shares,
and the decode-attention timing helpers."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from reference_server.kv import kv_bytes_per_sequence, kv_bytes_per_token
from workshop.compute import attention_variants as av
from workshop.sizing import kvcache


@pytest.fixture
def smol():
    return kvcache.load_model("smollm2-135m")


def test_variant_bytes_for_smollm2_by_hand(smol):
    # 30 layers, 9 query heads, 3 KV heads of 64; bf16 = 2 bytes.
    assert kv_bytes_per_token(av.variant_arch(smol, "gqa"), "bf16") == 2 * 3 * 64 * 30 * 2 == 23_040
    assert kv_bytes_per_token(av.variant_arch(smol, "mha"), "bf16") == 2 * 9 * 64 * 30 * 2
    assert kv_bytes_per_token(av.variant_arch(smol, "mqa"), "bf16") == 2 * 1 * 64 * 30 * 2 == 7_680
    # The teaching engine's MLA caches the rank-r latent only (no separate RoPE key).
    assert kv_bytes_per_token(av.variant_arch(smol, "mla", 128), "bf16") == 128 * 30 * 2 == 7_680
    assert kv_bytes_per_token(av.variant_arch(smol, "mla", 64), "fp32") == 64 * 30 * 4
    assert kv_bytes_per_token(av.variant_arch(smol, "mla", 64, rope_dim=32), "bf16") == 96 * 30 * 2


def test_variant_arch_refuses_nonsense(smol):
    with pytest.raises(ValueError):
        av.variant_arch(smol, "mla", 0)
    with pytest.raises(ValueError):
        av.variant_arch(smol, "sparse")


def test_deepseek_v3_both_ratios():
    ds = kvcache.load_model("deepseek-v3")
    mla = kv_bytes_per_token(ds, "bf16")
    assert mla == 61 * (512 + 64) * 2 == 70_272
    mha = kv_bytes_per_token(av.variant_arch(ds, "mha"), "bf16")
    assert mha == 2 * 128 * 128 * 61 * 2
    assert mha / mla == pytest.approx(56.89, abs=0.01)           # the "about 57x"
    llama70 = kvcache.load_model("llama-3.1-70b")
    gqa = kv_bytes_per_token(llama70, "bf16")
    assert gqa == 2 * 8 * 128 * 80 * 2 == 327_680
    assert gqa / mla == pytest.approx(4.66, abs=0.01)
    # 576 numbers per layer = 2.25 KV heads of 128 (the DeepSeek-V2 paper's "2.25 groups").
    assert av.equivalent_kv_heads(ds) == pytest.approx(2.25)
    # MLA -> GQA keeps the config's num_key_value_heads, and drops the latent.
    assert kv_bytes_per_token(av.variant_arch(ds, "gqa"), "bf16") == mha


def test_window_rows_by_hand():
    mistral = kvcache.load_model("mistral-7b")
    per_token = 2 * 8 * 128 * 32 * 2                               # 128 KiB
    win = av.with_window(mistral, 4096)
    assert win.num_sliding_layers == 32 and win.sliding_window == 4096
    assert kv_bytes_per_sequence(win, 2048) == 2048 * per_token    # below the window: no saving
    assert kv_bytes_per_sequence(win, 32768) == 4096 * per_token
    rows = av.window_rows(mistral, win, [2048, 32768], budget_bytes=40 * 2**30)
    assert rows[0]["saving (x)"] == 1.0
    assert rows[1]["saving (x)"] == 8.0
    assert rows[1]["users that fit, full"] == 10          # 40 GiB / 4 GiB
    assert rows[1]["users that fit, window"] == 80        # 40 GiB / 0.5 GiB
    # Half the layers windowed (gpt-oss style): at most a 2x saving.
    half = av.with_window(mistral, 128, 16)
    assert kv_bytes_per_sequence(half, 1 << 20) / kv_bytes_per_sequence(mistral, 1 << 20) \
        == pytest.approx((16 * (1 << 20) + 16 * 128) / (32 * (1 << 20)))
    # No window at all.
    assert av.with_window(half, 0, 0).num_sliding_layers == 0
    with pytest.raises(ValueError):
        av.with_window(mistral, 4096, 33)


def test_config_columns():
    ds, smol = kvcache.load_model("deepseek-v3"), kvcache.load_model("smollm2-135m")
    row = av.config_columns(ds)
    assert row["model"] == f"[{ds.name}]({ds.source})" and row["layers"] == 61
    assert row["query heads"] == 128
    assert row["cached per layer"] == "MLA: latent 512 + RoPE key 64"
    assert av.config_columns(smol)["cached per layer"] == "3 KV x 64"
    assert list(av.config_columns(smol)) == ["model", "layers", "query heads", "cached per layer"]


def test_cache_fit():
    caches = {"L1": 48 * 2**10, "L2": 2 * 2**20, "L3": 32 * 2**20}
    fit = av.cache_fit([1.0, 32.0, 33.0], caches)
    assert fit == {"cache": "L3", "MiB": 32.0, "fits": [True, True, False]}
    assert av.cache_fit([1.0], {}) is None


def test_users_that_fit():
    assert av.users_that_fit(10, 3) == 3
    assert av.users_that_fit(2, 3) == 0
    with pytest.raises(ValueError):
        av.users_that_fit(10, 0)


def test_match_shares():
    assert av.match_share(["a", "b", "c", "d"], ["a", "x", "c", "y"]) == 0.5
    with pytest.raises(ValueError):
        av.match_share(["a"], ["a", "b"])
    ref = [["a", "b", "c"], ["d"]]
    assert av.greedy_token_share(ref, [["a", "b", "c"], ["d"]]) == 1.0
    assert av.greedy_token_share(ref, [["a", "x", "c"], ["e"]]) == 0.5       # 2 of 4
    assert av.greedy_token_share(ref, [["a"], []]) == 0.25                   # a shorter answer
    with pytest.raises(ValueError):
        av.greedy_token_share(ref, [["a"]])


def test_reference_decode_is_attention():
    import torch
    q, k, v = av.decode_inputs(batch=2, q_heads=4, kv_heads=2, context=5, head_dim=8)
    assert q.shape == (2, 4, 8) and k.shape == (2, 2, 5, 8)
    out = av.reference_decode(q, k, v)
    # query head 3 belongs to KV head 1 (heads 0,1 -> KV 0; heads 2,3 -> KV 1)
    w = torch.softmax(k[1, 1] @ q[1, 3] / 8 ** 0.5, dim=0)
    assert torch.allclose(out[1, 3], w @ v[1, 1], atol=1e-5)
    with pytest.raises(ValueError):
        av.decode_inputs(1, 9, 2, 4, 8)


def test_attention_time_rows():
    import torch
    threads = torch.get_num_threads()
    calls = []
    rows = av.attention_time_rows(lambda q, k, v: calls.append((k.shape, torch.get_num_threads())),
                                  kv_heads=[1, 3], contexts=[16], q_heads=3, head_dim=8,
                                  repeats=2)
    assert [r["KV heads"] for r in rows] == [1, 3]
    assert rows[1]["KV read (MiB)"] == 2 * 3 * 16 * 8 * 4 / 2**20
    assert len(calls) == 2 * 3                    # warm-up + 2 repeats, per pair
    assert {n for _, n in calls} == {1}           # timed on one thread ...
    assert torch.get_num_threads() == threads     # ... and the setting restored
    assert all(r["time (ms)"] >= 0 for r in rows)


def test_figures_build():
    rows = [{"model": "a", "MHA": 10.0, "as shipped": 5.0},
            {"model": "b", "MHA": 8.0, "as shipped": 0}]
    assert av.bytes_figure(rows).axes
    q = [{"variant": "gqa", "B": 10, "acc": 0.5}, {"variant": "mqa", "B": 5, "acc": 0.3}]
    assert av.quality_figure(q, "B", ["acc"]).axes
    t = [{"context": 16, "KV heads": h, "time (ms)": float(h)} for h in (1, 3)]
    assert av.time_figure(t, 3).axes
    w = [{"context (tokens)": c, "KV per user, full (MiB)": c, "KV per user, window (MiB)": 1}
         for c in (1, 2)]
    assert av.window_figure({"m": w}, {"m": "window 4"}).axes


SOURCE = Path(__file__).resolve().parents[2] / "notebooks" / "src" / "05_attention_variants.py"


@pytest.fixture(scope="module")
def nb_decode():
    """The notebook's own decode_attention (reading it is the lesson), from its source cell."""
    cells = re.split(r"^# %%.*$", SOURCE.read_text(), flags=re.M)
    wanted = [c for c in cells if re.search(r"^def decode_attention\(", c, flags=re.M)]
    assert len(wanted) == 1, "expected one cell defining decode_attention"
    namespace: dict = {}
    exec(compile(wanted[0], str(SOURCE), "exec"), namespace)
    return namespace["decode_attention"]


@pytest.mark.parametrize("batch,q_heads,kv_heads,context,head_dim",
                         [(1, 9, 1, 7, 64), (2, 9, 3, 100, 64), (3, 9, 9, 33, 16), (1, 8, 2, 1, 8)])
def test_notebook_decode_attention_matches_sdpa(nb_decode, batch, q_heads, kv_heads, context,
                                                head_dim):
    import torch
    q, k, v = av.decode_inputs(batch, q_heads, kv_heads, context, head_dim, seed=context)
    out = nb_decode(q, k, v)
    assert out.shape == (batch, q_heads, head_dim)
    assert torch.allclose(out, av.reference_decode(q, k, v), atol=1e-5)
