"""Notebook 06's attention code and the helpers it is measured with.

The naive and tiled attention functions live in the notebook's source (reading them is the
lesson), so these tests execute those two cells and check them against each other and against
PyTorch's SDPA, an independent implementation.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from workshop.compute import flash_attention as fa

SOURCE = Path(__file__).resolve().parents[2] / "notebooks" / "src" / "06_flash_attention.py"
# float32 outputs of size ~1: two summation orders differ by rounding only.
TOL = 1e-5


@pytest.fixture(scope="module")
def nb() -> dict:
    """The notebook cells that define naive_attention and tiled_attention, executed in order."""
    cells = re.split(r"^# %%.*$", SOURCE.read_text(), flags=re.M)
    wanted = [c for c in cells if re.search(r"^def (naive|tiled)_attention\(", c, flags=re.M)]
    assert len(wanted) == 2, "expected one cell per attention function in the notebook source"
    namespace: dict = {}
    for cell in wanted:
        exec(compile(cell, str(SOURCE), "exec"), namespace)
    return namespace


@pytest.mark.parametrize("n,d,tile", [(1, 8, 4), (7, 16, 4), (64, 32, 16), (100, 64, 32),
                                      (257, 64, 64), (300, 128, 512), (130, 48, 1)])
@pytest.mark.parametrize("causal", [False, True])
def test_tiled_equals_naive_and_sdpa(nb, n, d, tile, causal):
    q, k, v = fa.random_qkv(n, d, seed=n * 31 + d)
    naive = nb["naive_attention"](q, k, v, causal=causal)
    tiled = nb["tiled_attention"](q, k, v, tile=tile, causal=causal)
    torch_out = fa.sdpa(q, k, v, causal=causal)
    assert tiled.shape == naive.shape == (n, d)
    assert np.abs(tiled - naive).max() < TOL
    assert np.abs(naive - torch_out).max() < TOL


def test_causal_mask_matters(nb):
    # Guards against a mask that does nothing: the first row attends to itself only.
    q, k, v = fa.random_qkv(50, 16, seed=3)
    out = nb["tiled_attention"](q, k, v, tile=8, causal=True)
    assert np.abs(out[0] - v[0]).max() < TOL
    assert np.abs(out - nb["tiled_attention"](q, k, v, tile=8)).max() > 0.1


def test_large_scores_do_not_overflow(nb):
    # Scores around 1e3 overflow exp() without the running max; the online softmax keeps it.
    q, k, v = fa.random_qkv(96, 16, seed=5)
    q *= 300.0
    tiled = nb["tiled_attention"](q, k, v, tile=16, causal=True)
    assert np.isfinite(tiled).all()
    assert np.abs(tiled - nb["naive_attention"](q, k, v, causal=True)).max() < 1e-4


def test_io_counts_by_hand():
    # N=4, d=2, fp32. Naive: 4Nd + 4N^2 = 32 + 64 = 96 numbers.
    assert fa.naive_io_bytes(4, 2) == 96 * 4
    # Tiled, tile 2: Q and O 2Nd = 16; K and V read once per query tile: 2 tiles x 2 x 4 x 2 = 32.
    assert fa.tiled_io_bytes(4, 2, tile=2) == 48 * 4
    # Causal: query tile 0 reads keys 0..1 (2 rows), tile 1 reads keys 0..3 (4): 2d x 6 = 24.
    assert fa.tiled_io_bytes(4, 2, tile=2, causal=True) == 40 * 4
    # Ragged: N=5, tile 2 -> 3 query tiles; causal key rows 2 + 4 + 5 = 11.
    assert fa.tiled_io_bytes(5, 1, tile=2, itemsize=2, causal=True) == 2 * (2 * 5 + 2 * 11)
    # One tile covering everything: each of Q, K, V read once, O written once.
    assert fa.tiled_io_bytes(10, 8, tile=10) == 4 * 10 * 8 * 4


def test_io_asymptotics():
    # Theta(N^2 d^2 / M): doubling the tile halves the N^2 term; naive / tiled -> 2 tile / d.
    n, d = 1 << 16, 64
    assert fa.tiled_io_bytes(n, d, 128) / fa.tiled_io_bytes(n, d, 256) == pytest.approx(2, rel=0.01)
    assert fa.naive_io_bytes(n, d) / fa.tiled_io_bytes(n, d, 256) == pytest.approx(2 * 256 / d,
                                                                                 rel=0.01)


def test_tile_fast_memory():
    # tile 2, d 3: Q, K, V, acc 4 x 6 = 24, scores 4, max and sum 4 -> 32 numbers.
    assert fa.tile_fast_memory_bytes(2, 3) == 32 * 4
    t = fa.largest_tile(fa.A100_SRAM_BYTES_PER_SM, 64, itemsize=2)
    assert fa.tile_fast_memory_bytes(t, 64, 2) <= fa.A100_SRAM_BYTES_PER_SM
    assert fa.tile_fast_memory_bytes(t + 1, 64, 2) > fa.A100_SRAM_BYTES_PER_SM


def test_peak_memory_sees_the_score_matrix(nb):
    n = 512
    q, k, v = fa.random_qkv(n, 32)
    naive = fa.peak_extra_bytes(nb["naive_attention"], q, k, v)
    tiled = fa.peak_extra_bytes(nb["tiled_attention"], q, k, v, tile=32)
    assert naive >= n * n * 4                 # at least one N x N fp32 matrix
    assert tiled < n * n * 4 / 4              # far below it


def test_attention_share_counts_by_hand():
    # One layer, 2 heads of 4 dims, 100 parameters, no output layer: a token attending to c
    # tokens costs 2 x 100 FLOPs in weights and 4 x 1 x 2 x 4 x c = 32 c in attention.
    from reference_server.model_config import read_arch
    cfg = read_arch({"num_hidden_layers": 1, "num_attention_heads": 2, "hidden_size": 8,
                     "vocab_size": 0}, params=100)
    assert fa.attention_share(cfg, 1) == 0                 # attends to 1 // 2 = 0 tokens
    assert fa.attention_share(cfg, 50) == pytest.approx(32 * 25 / (200 + 32 * 25))
    # the output layer is not part of a prompt token's cost: the share does not depend on it
    big_head = read_arch({"num_hidden_layers": 1, "num_attention_heads": 2, "hidden_size": 8,
                          "vocab_size": 10}, params=180)
    assert fa.attention_share(big_head, 50) == pytest.approx(fa.attention_share(cfg, 50))


def test_fixed_cost_fit_recovers_the_intercept_of_a_line():
    from workshop.compute.roofline import prefill_flops
    from workshop.sizing.kvcache import load_model
    cfg = load_model("smollm2-135m")
    # 40 ms per request plus 3 ms per GFLOP, exactly
    rows = [{"prompt tokens": n, "TTFT ms (median)": 40 + 3 * prefill_flops(cfg, n) / 1e9}
            for n in (128, 512, 1024)]
    slope, intercept = fa.fixed_cost_fit(rows, cfg)
    assert slope == pytest.approx(3) and intercept == pytest.approx(40)
    assert fa.fixed_cost_fit(rows[:1], cfg) is None
    assert fa.fixed_cost_fit(rows[:1] + [{"prompt tokens": 512, "TTFT ms (median)": float("nan")}],
                             cfg) is None
