"""Notebook 10's switch-by-switch timing: which switches change the code for a batch (pure
rule), and a real round-robin run on the bundled model (the pieces a notebook shows)."""

from __future__ import annotations

import argparse

import pytest
import torch

from mini_engine.config import EngineConfig, add_cli_arguments
from mini_engine.linear import can_prepack
from mini_engine.model import CASCADE_MIN_SAVED_KEYS, eager_min_keys
from reference_server.models import ModelError, resolve_model
from workshop.finale import engine_switches as es

F32, BF16 = torch.float32, torch.bfloat16


def test_every_switch_names_a_config_field_and_a_server_flag():
    fields = EngineConfig.__dataclass_fields__
    parser = add_cli_arguments(argparse.ArgumentParser())
    for flag, overrides in es.SWITCHES.items():
        assert set(overrides) <= set(fields)
        parsed = vars(parser.parse_args(flag.split()))
        assert all(parsed[k] == v for k, v in overrides.items()), flag


def test_a_switch_applies_only_where_its_technique_runs():
    big = dict(batch=8, context=eager_min_keys() // 8 + 64, shared=CASCADE_MIN_SAVED_KEYS // 7 + 16)
    # float32 keeps SDPA under `auto` and is never packed; the gather and cascade still apply
    assert not es.applies("--decode-attention sdpa", dtype=F32, device="cpu", **big)
    assert not es.applies("--no-prepack", dtype=F32, device="cpu", **big)
    assert es.applies("--kv-read slot", dtype=F32, device="cpu", **big)
    assert es.applies("--no-cascade-attention", dtype=F32, device="cpu", **big)
    # bf16: `auto` writes attention out for a big batch, not for one sequence
    assert es.applies("--decode-attention sdpa", dtype=BF16, device="cpu", **big)
    assert not es.applies("--decode-attention sdpa", dtype=BF16, device="cpu",
                          **{**big, "batch": 1})
    assert es.applies("--no-prepack", dtype=BF16, device="cpu", **big) == can_prepack(BF16, "cpu")
    # cascade needs the saved keys: (sequences - 1) x shared
    assert not es.applies("--no-cascade-attention", dtype=F32, device="cpu",
                          **{**big, "batch": 2})
    assert not es.applies("--no-cascade-attention", dtype=F32, device="cpu", **{**big, "shared": 0})
    assert not es.applies("--no-such-flag", dtype=F32, device="cpu", **big)


def test_round_robin_rows_on_the_bundled_model():
    try:
        path = resolve_model("smollm2-135m", prepare=False).path
    except ModelError as exc:
        pytest.skip(f"bundled model not prepared: {exc}")
    rows, step_ms = es.decode_step_rows(path, dtype="float32", batch=3, shared_tokens=32,
                                        own_tokens=16, rounds=3,
                                        switches=("--kv-read slot", "--no-cascade-attention"))
    assert [r["variant"] for r in rows] == [es.DEFAULTS, "--kv-read slot", "--no-cascade-attention"]
    assert all(len(step_ms[r["variant"]]) == 3 for r in rows)
    assert rows[0]["slower than defaults"] == 1.0 and rows[0]["same tokens"]
    # the same numbers read another way: the same greedy tokens
    assert rows[1]["same tokens"] and rows[1]["applies here"]
    # 2 x 32 shared keys saved: under the engine's rule, so cascade is not used here
    assert not rows[2]["applies here"]
    for r in rows:
        assert r["ms per step"] == pytest.approx(sorted(step_ms[r["variant"]])[1])
    es.switches_figure(rows, step_ms, "test")


def test_bytes_per_step_count_weights_and_the_kv_each_variant_reads():
    rows = [{"variant": v, "applies here": a, "slower than defaults": t}
            for v, a, t in [("defaults", True, 1.0), ("--no-prepack", True, 1.1),
                            ("--kv-read slot", True, 1.0),
                            ("--decode-attention sdpa", False, 1.0),
                            ("--no-cascade-attention", True, 1.2)]]
    out = {r["variant"]: r for r in es.bytes_rows(rows, weight_bytes=1e6, kv_bytes_per_token=100,
                                                  batch=4, shared=1000, own=10)}
    cascade, each = ((1000 + 4 * 10) * 100,
                     4 * 1010 * 100)      # the shared prompt read once, or 4 times
    assert out["defaults"]["MB moved per step"] == pytest.approx((1e6 + cascade) / 1e6)
    assert out["--no-prepack"]["MB moved per step"] == pytest.approx((3e6 + cascade) / 1e6)
    assert out["--no-cascade-attention"]["bytes / defaults'"] == pytest.approx(
        (1e6 + each) / (1e6 + cascade))
    assert (out["--kv-read slot"]["bytes / defaults'"]
            == out["--decode-attention sdpa"]["bytes / defaults'"] == 1)
    assert out["--no-cascade-attention"]["time / defaults'"] == 1.2
    # switches that do not apply run the defaults' code: the defaults' bytes
    off = [{**r, "applies here": r["variant"] == "defaults"} for r in rows]
    assert {r["bytes / defaults'"]
            for r in es.bytes_rows(off, weight_bytes=1e6, kv_bytes_per_token=100,
                                                           batch=4, shared=1000, own=10)} == {1.0}
