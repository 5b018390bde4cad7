"""The physical sanity gates (workshop.sanity): each check flags an injected impossible
measurement and passes a plausible one, and the notebook tests' scan finds what they print."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

from workshop import sanity
from workshop.compute import roofline as rl

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "notebooks"))


def test_a_prefill_above_the_measured_roof_is_implausible():
    # A 1,024-token prefill in 157 ms on a 0.38 TFLOP/s machine (issue 35's cache hit): about
    # 1.7 TFLOP/s for SmolLM2-135M.
    from workshop.sizing.kvcache import load_model
    cfg = load_model("smollm2-135m")
    machine = rl.Machine("cpu", bandwidth=20e9, flops=380e9, ceilings=(("bfloat16", 380e9),))
    cached = rl.prefill_point(cfg, 1024, 1024 / 0.157)
    honest = rl.prefill_point(cfg, 512, 512 / 0.348)
    v = rl.roof_violations(machine, [cached, honest], "bfloat16")
    assert [x.what.split(" measured")[0] for x in v] == ["prefill 1024"]
    line = v[0].line()
    assert line.startswith(sanity.MARK) and "prefix-cache hit" in line and "x the bound" in line
    assert sanity.report(v).count(sanity.MARK) == 1
    assert rl.roof_violations(machine, [honest], "bfloat16") == []


def test_bounds_allow_the_stated_error_and_no_more():
    e = sanity.MEASUREMENT_ERROR
    assert sanity.within("x", 1 + e - 1e-9, 1, "u", "c", ()) == []
    assert len(sanity.within("x", 1 + e + 1e-6, 1, "u", "c", ())) == 1
    assert sanity.within("x", math.nan, 1, "u", "c", ()) == []     # nothing measured: no claim
    assert len(sanity.bandwidth_within_roof("weights", 40e9, 20e9)) == 1
    assert sanity.bandwidth_within_roof("weights", 20e9, 20e9) == []


def test_a_draft_costing_more_than_its_share_of_the_model_is_implausible():
    # notebook 9's reference run: 8 of 30 layers measured at c = 1.52 of the full model
    assert len(sanity.part_within_whole("8-layer self-draft", 1.52, 8 / 30)) == 1
    assert sanity.part_within_whole("8-layer self-draft", 0.30, 8 / 30) == []


def test_cached_tokens_in_a_cold_timing():
    assert sanity.cold("prefill 512", [0, None, 0]) == []
    v = sanity.cold("prefill 512", [0, 496, None])
    assert len(v) == 1 and "496" in v[0].what


def test_a_cache_hit_cannot_beat_the_share_of_the_prompt_it_skips():
    # with 91 % of the prompt skipped, 0.18 is plausible; 0.05 beats computing the 9 % left
    assert sanity.hit_within_floor("vLLM", 0.18, 0.91) == []
    assert sanity.hit_within_floor("vLLM", float("nan"), 0.91) == []
    v = sanity.hit_within_floor("vLLM", 0.05, 0.91)
    assert len(v) == 1 and "0.09" in v[0].what and v[0].line().startswith(sanity.MARK)


def test_nothing_completed_and_flat_gauges():
    assert len(sanity.completed_some("12 requests", 0, 12)) == 1
    assert sanity.completed_some("12 requests", 1, 12) == []
    assert sanity.completed_some("nothing sent", 0, 0) == []
    assert len(sanity.nonzero("KV usage", [0.0, 0, 0.0])) == 1
    assert sanity.nonzero("KV usage", [0.0, 0.2, 0.0]) == []


def test_ttft_must_not_fall_as_the_prompt_grows():
    assert sanity.grows_with("ttft", [128, 512, 1024], [40, 120, 200]) == []
    assert sanity.grows_with("ttft", [128, 512, 1024], [40, 120, 110]) == []   # within 20 %
    v = sanity.grows_with("ttft", [512, 1024, 128], [348, 157, 40])            # unsorted input
    assert len(v) == 1 and "157" in v[0].what


def test_the_notebook_test_fails_on_a_printed_violation():
    from test_execute import implausible
    v = sanity.cold("prefill 512", [496])
    shown = "| point | ratio |\n" + sanity.report(v) + "\nmore output"
    assert implausible(shown) and implausible(shown)[0].startswith(f"**{sanity.MARK}")
    assert implausible("**Every point is under its roof** (within 20%).") == []


def test_notebook_sources_never_spell_the_mark():
    # The marimo export carries each cell's source: a literal mark there would fail every run.
    root = Path(__file__).resolve().parents[2] / "notebooks" / "src"
    assert not [p.name for p in root.glob("*.py") if sanity.MARK in p.read_text()]


@pytest.mark.parametrize("cached", [[0], [512]])
def test_cold_prefill_drops_requests_that_report_cached_tokens(monkeypatch, cached):
    import workshop.bench as bench
    from workshop.bench.request_metrics import RequestRecord
    from workshop.compute import roofline_measure as rm
    calls = []

    def fake_run_benchmark(**kw):
        calls.append(kw)
        recs = [RequestRecord(0, first_token=0.01, end=0.01, warmup=True)]
        recs += [RequestRecord(1, scheduled=0.0, first_token=0.2, end=0.2, cached_tokens=0),
                 RequestRecord(2, scheduled=0.0, first_token=0.02, end=0.02,
                               cached_tokens=cached[0])]
        return type("R", (), {"records": recs, "summary": {}})()
    monkeypatch.setattr(bench, "run_benchmark", fake_run_benchmark)
    session = type("S", (), {"base_url": "http://x", "model": "m", "api_key": None})()
    a = rm.cold_prefill(session, 400, repeats=2)
    b = rm.cold_prefill(session, 400, repeats=2)
    assert calls[0]["reset_cache"] and calls[0]["concurrency"] == 1
    assert calls[0]["seed"] != calls[1]["seed"]          # a second call sends other prompts
    if cached[0]:
        assert a["cached (dropped)"] == 1 and a["completed"] == 1
        assert a["TTFT ms (median)"] == pytest.approx(200.0)
    else:
        assert a["cached (dropped)"] == 0 and a["TTFT ms (median)"] == pytest.approx(110.0)
    assert a["prefill tok/s"] == pytest.approx(400_000 / a["TTFT ms (median)"]) and b == a
