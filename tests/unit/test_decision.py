"""The decision chart on synthetic showdown folders: knee rows, winners, margins and ties,
missing and failed runs, several folders merged, SLO re-scoring, and the cited-facts file."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from workshop.bench.request_metrics import RequestRecord, summarize
from workshop.bench.results import BenchResult
from workshop.bench.sweep import SweepResult
from workshop.finale import decision, decision_chart

SLO_TTFT, SLO_ITL = 1000.0, 100.0


# --------------------------------------------------------------------------- a synthetic showdown
#
# Points are built from request timelines (so goodput can be re-scored from the records) with a
# hand-written saturation verdict (so the knee is where the test puts it).

def make_point(rate: float, *, achieved: float | None = None, n: int = 20,
               ttft: float | list[float] = 0.05,
               itl: float = 0.01, out: int = 8, overloaded: bool = False, kv: float | None = 0.2,
               hit: float | None = None, arrivals: int | None = None) -> BenchResult:
    ttfts = ttft if isinstance(ttft, list) else [ttft] * n
    recs = []
    for i, t0 in enumerate(ttfts):
        s = i / rate
        chunks = [s + t0 + k * itl for k in range(out)]
        recs.append(RequestRecord(index=i, session=i, scheduled=s, sent=s, first_token=s + t0,
                                  end=chunks[-1],
                                  chunk_times=chunks, prompt_tokens=16, output_tokens=out,
                                  max_tokens=out))
    summary = summarize(recs)
    summary["saturation"] = {"overloaded": overloaded, "client_limited": False,
                             "reasons": ["throughput falls behind"] if overloaded else [],
                             "window": {"offered_rate": rate, "achieved_rate": achieved or rate,
                                        "arrivals": n if arrivals is None else arrivals},
                             "shortfall_noise": 2.5}
    summary["server"] = {"metrics_available": True, "peak_kv_usage": kv,
                         "prefix_cache_hit_rate": hit}
    return BenchResult(config={"request_rate": rate}, summary=summary, records=recs)


def make_sweep(rates: list[float], knee: int | None, each: dict[str, list] | None = None,
               probe: tuple[float, float] | None = None, **kw) -> SweepResult:
    """Points at ``rates``; every point above ``knee`` overloaded (achieving 60 % of its rate).
    ``each`` gives a value per point (``each=dict(kv=[...])``), ``kw`` one for all; ``probe``
    (rate, ttft s) adds a synchronous probe as the sweep's own probes look."""
    points = []
    for i, r in enumerate(rates):
        args = {**kw, **{k: v[i] for k, v in (each or {}).items()}}
        bad = knee is None or i > knee
        points.append(make_point(r, overloaded=bad, achieved=0.6 * r if bad else r, **args))
    cfg = {"requests_per_session": 1.0, "slo_ttft_ms": SLO_TTFT, "slo_itl_ms": SLO_ITL,
           "tolerance": 0.9,
           "min_gain": 0.1}
    probes = {}
    if probe:
        probes["synchronous"] = make_point(probe[0], ttft=probe[1], n=5, kv=kw.get("kv", 0.2))
        cfg["synchronous_rate"] = probe[0]
    return SweepResult("rate", rates, points, knee, cfg, probes)


def make_root(folder: Path, runs: dict[tuple[str, str], SweepResult | str],
              created: str = "2026-12-01T10:00:00+00:00",
              machine: dict | None = None, slo: tuple[float, float] = (SLO_TTFT, SLO_ITL),
              kv_capacity: dict[str, int] | None = None, mode: str = "full") -> Path:
    """A showdown root as the runner writes it (SHOWDOWN_CONTRACT.md)."""
    engines = dict.fromkeys(e for e, _ in runs)
    manifest = {"format": 1, "created": created, "command": "synthetic", "mode": mode,
                "machine": machine or {"cpu": "Test CPU", "cores": 2, "memory_gib": 23.4,
                                       "gpu": None},
                "model": "smollm2-135m", "slo": {"ttft_ms": slo[0], "itl_ms": slo[1]},
                "engines": {e: {"engine": e.split("-")[0], "server_args": [], "status": "ok",
                                "server_info": {"kv_capacity_tokens": (kv_capacity
                                                                       or {}).get(e, 10000)}}
                            for e in engines},
                "workloads": {w: {"params": {}} for _, w in runs}, "runs": []}
    for (e, w), sw in runs.items():
        if isinstance(sw, str):
            manifest["runs"].append({"engine": e, "workload": w, "folder": None, "status": sw,
                                     "seconds": 1.0})
            continue
        sw.save(folder / e / w, )
        manifest["runs"].append({"engine": e, "workload": w, "folder": f"{e}/{w}", "status": "ok",
                                 "seconds": 1.0})
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "showdown.json").write_text(json.dumps(manifest))
    return folder


@pytest.fixture
def two_engines(tmp_path):
    """fast keeps up to 4 req/s, slow to 2; both tried at 1, 2, 4, 8 req/s."""
    runs = {("fast", "sharegpt"): make_sweep([1, 2, 4, 8], 2,
                                             each=dict(ttft=[0.04, 0.05, 0.08, 0.5],
                                                       kv=[0.1, 0.2, 0.3, 0.9])),
            ("slow", "sharegpt"): make_sweep([1, 2, 4, 8], 1, each=dict(ttft=[0.1, 0.2, 0.9, 2.0],
                                                                        kv=[0.2, 0.4, 0.8, 1.0]))}
    return make_root(tmp_path / "showdown-a", runs)


# --------------------------------------------------------------------------- ranking rule

def test_rank_names_winner_margin_and_ties():
    r = decision.rank({"a": 100.0, "b": 50.0, "c": 10.0}, "higher")
    assert (r["winner"], r["runner_up"], r["tied"]) == ("a", "b",
                                                        []) and r["margin"] == pytest.approx(2.0)
    r = decision.rank({"a": 100.0, "b": 95.0, "c": 10.0}, "higher")        # 5 % apart: a tie of two
    assert r["winner"] is None and r["tied"] == ["a",
                                                 "b"] and r["margin"] == pytest.approx(100 / 95)
    r = decision.rank({"a": 30.0, "b": 60.0}, "lower")                       # latency: lower wins
    assert r["winner"] == "a" and r["margin"] == pytest.approx(2.0)
    r = decision.rank({"a": 100.0, "b": 95.0}, "higher",
                      tie_within=0.01)   # a narrower band separates them
    assert r["winner"] == "a"
    assert decision.rank({"a": 1.0}, "higher") == {"winner": "a", "runner_up": None, "margin": None,
                                                   "tied": []}
    assert decision.rank({}, "higher")["winner"] is None


def test_verdict_labels():
    v = decision.Verdict("w", "throughput", {"a": 2.0, "b": 1.0}, "tok/s", "higher", winner="a",
                         runner_up="b",
                         margin=2.0)
    assert v.outcome == "win" and v.label == "a x2"
    v.bound = "at least"
    assert v.label == "a x>=2"
    v.bound = "unknown"
    assert v.label == "a x2 at the loads tried"
    assert decision.Verdict("w", "goodput", {}, "req/s", "higher",
                            tied=["a", "b"]).label == "tie: a, b"
    assert decision.Verdict("w", "goodput", {"a": 1}, "req/s", "higher",
                            winner="a").outcome == "only"


def test_verdict_margin_text_never_reads_as_a_bare_bound_word():
    v = decision.Verdict("w", "throughput", {"a": 2.3, "b": 2.0}, "tok/s", "higher", winner="a",
                         runner_up="b", margin=1.15)
    assert v.margin_text == "1.15x"
    v.bound = "at least"
    assert v.margin_text == "at least 1.15x"
    v.bound = "unknown"          # both knees at the highest load tried
    assert v.margin_text.startswith("1.15x at the loads tried") and "unknown" in v.margin_text


# --------------------------------------------------------------------------- knee rows

def test_knee_row_reads_the_knee_and_its_neighbours(two_engines):
    res = decision.load(two_engines)
    rows = {r["engine"]: r for r in decision.knee_table(res)}
    fast = rows["fast"]
    assert not fast["no_knee"] and not fast["lower_bound"]
    assert fast["knee_asked"] == 4 and fast["knee_offered"] == pytest.approx(4)
    assert fast["next_offered"] == pytest.approx(8)
    assert fast["output_tps"] == pytest.approx(4 * 8)  # achieved req/s x 8 tokens each
    assert fast["ttft_p99"] == pytest.approx(80, rel=1e-6) and fast["itl_p99"] == pytest.approx(10,
                                                                                                rel=1e-6)
    assert fast["peak_kv"] == pytest.approx(0.3) and fast["kv_capacity_tokens"] == 10000
    assert "knee: 4 req/s asked" in fast["note"]
    assert rows["slow"]["knee_offered"] == pytest.approx(2)


def test_a_window_without_completions_falls_back_to_the_whole_run(tmp_path):
    sw = make_sweep([1, 2], 1)
    for p in sw.points:            # what a quick run looks like: two arrivals, nothing finished
        p.summary["saturation"]["window"].update(achieved_rate=0.0, completions=0, short=True)
    whole_runs = [p.summary["request_throughput"] for p in sw.points]
    assert sw.achieved_basis() == [(whole_runs[0], True), (whole_runs[1], True)]
    row = decision.knee_row(decision.load(make_root(tmp_path / "r", {("a", "w"): sw})).runs[("a",
                                                                                             "w")],
                            decision.slo_of(SLO_TTFT, SLO_ITL))
    whole = sw.points[1].summary["request_throughput"]
    assert (whole > 0 and row["output_tps"] == pytest.approx(whole * 8)
            and "whole run" in row["note"])


def test_no_knee_and_knee_at_the_top_are_flagged(tmp_path):
    runs = {("never", "agentic"): make_sweep([1, 2], None),
            ("always", "agentic"): make_sweep([1, 2], 1)}
    rows = {r["engine"]: r for r in decision.knee_table(decision.load(make_root(tmp_path / "r",
                                                                                runs)))}
    assert rows["never"]["no_knee"] and rows["never"]["output_tps"] is None
    assert rows["never"]["note"].startswith("knee: none (even the lowest load fails")
    assert rows["always"]["lower_bound"] and "or more" in rows["always"]["note"]
    v = decision.decide(list(rows.values()), "agentic", "throughput")
    assert v.outcome == "only" and v.winner == "always" and "never" in v.excluded


def test_the_chart_spells_out_a_margin_whose_knees_could_both_go_higher(tmp_path):
    runs = {(e, "w"): make_sweep([1, 2], 1) for e in ("a", "b")}
    rows = decision.knee_table(decision.load(make_root(tmp_path / "r", runs)))
    v = decision.Verdict("w", "throughput", {"a": 2.3, "b": 2.0}, "tok/s", "higher", winner="a",
                         runner_up="b", margin=1.15, bound="unknown")
    fig = decision_chart.plot_decision([v], rows, "t")
    cell = next(t.get_text() for t in fig.axes[0].texts if t.get_text().startswith("a\n"))
    assert cell == "a\n×1.1 vs b\nat the loads tried\n(both could go higher)", cell


def test_a_tie_says_how_far_it_leads_the_rest():
    rows = [{"workload": "w", "engine": e, "status": "ok", "no_knee": False, "not_judged": False,
             "note": "", "output_tps": tps, "lower_bound": lb, "capacity_tps": tps}
            for e, tps, lb in (("a", 15.1, True), ("b", 14.5, True), ("c", 11.3, True),
                               ("d", 5.0, False))]
    v = decision.decide(rows, "w", "throughput")
    assert v.tied == ["a", "b"]
    # b, the weakest of the tie, against c, the best of the rest; both knees lower bounds
    assert v.lead == ("c", pytest.approx(14.5 / 11.3), "unknown")
    assert v.label == "tie: a, b (each x1.3 over c at the loads tried)"
    rows[2]["lower_bound"] = False
    assert decision.decide(rows, "w", "throughput").lead[2] == "at least"
    for r in rows[2:]:
        r["status"] = "failed"          # nobody outside the tie: nothing to lead
    assert decision.decide(rows, "w", "throughput").lead is None


def test_sweeps_too_short_to_judge_claim_no_knee(tmp_path):
    # notebook 10's quick plan: two arrivals in each point's steady window, none overloaded, so
    # no point says whether its engine kept up (a shortfall counts beyond 2.5 x its noise)
    runs = {(e, "w"): make_sweep([1, 2], 1, arrivals=2) for e in ("mini-hash", "mini-radix")}
    rows = decision.knee_table(decision.load(make_root(tmp_path / "r", runs)))
    assert all(r["no_knee"] and r["not_judged"] for r in rows)
    assert [d["knee req/s (offered)"] for d in decision.display_rows(rows)] == ["not judged"] * 2
    v = decision.decide(rows, "w", "throughput")
    # not "no engine kept up within the objectives at any load, so capacity alone"
    assert v.outcome == "none" and not v.ignores_objectives, v
    assert all("not enough requests per point to judge a knee" in why
               for why in v.excluded.values()), v
    fig = decision_chart.plot_decision(decision.decisions(rows), rows, "t")
    assert "not enough requests per\npoint to judge a knee" in [t.get_text()
                                                                for t in fig.axes[0].texts]


# --------------------------------------------------------------------------- winners

def test_when_no_engine_meets_the_objectives_throughput_falls_back_to_capacity(tmp_path):
    # Neither keeps up anywhere; "big" delivers the most at its heaviest load (0.6 x 8 req/s x
    # 16 tokens), "small" more in its throughput probe (5 req/s x 8) than at any load point.
    big = make_sweep([2, 4, 8], None, out=16)
    small = make_sweep([1, 2], None)
    small.probes["throughput"] = make_point(5.0)
    small.config["max_throughput_rate"] = 5.0
    rows = decision.knee_table(decision.load(make_root(tmp_path / "r",
                                                       {("big", "w"): big, ("small", "w"): small})))
    by = {r["engine"]: r for r in rows}
    assert (by["big"]["capacity_tps"] == pytest.approx(0.6 * 8 * 16)
            and by["big"]["capacity_at"] == "8 req/s offered")
    assert (by["small"]["capacity_tps"] == pytest.approx(5 * 8)
            and by["small"]["capacity_at"] == "throughput probe")
    v = decision.decide(rows, "w", "throughput")
    assert v.ignores_objectives and (v.winner, v.runner_up) == ("big", "small")
    assert v.margin == pytest.approx(76.8 / 40) and v.bound == ""
    assert "ignores the latency objectives" in v.basis and "objectives ignored" in v.label
    assert not v.excluded  # no knee is the reason for the fallback, not a reason out
    # one engine with a knee: the usual rule, the other left out
    rows2 = decision.knee_table(decision.load(make_root(tmp_path / "r2",
                                                        {("big", "w"): make_sweep([2, 4, 8], 0),
                                                                         ("small", "w"): small})))
    v2 = decision.decide(rows2, "w", "throughput")
    assert not v2.ignores_objectives and v2.outcome == "only" and v2.winner == "big"


def test_throughput_winner_and_margin(two_engines):
    rows = decision.knee_table(decision.load(two_engines))
    v = decision.decide(rows, "sharegpt", "throughput")
    assert (v.winner, v.runner_up) == ("fast",
                                       "slow") and v.margin == pytest.approx(2.0)   # 32 vs 16 tok/s
    assert v.bound == ""


def test_latency_and_memory_are_compared_at_the_common_load(two_engines):
    rows = decision.knee_table(decision.load(two_engines))
    assert decision.common_load(rows, "sharegpt") == pytest.approx(2)        # slow's knee
    v = decision.decide(rows, "sharegpt", "ttft_p99")
    # at 2 req/s: fast 50 ms, slow 200 ms (not fast's own knee, where it had 80 ms)
    assert v.values["fast"] == pytest.approx(50,
                                             rel=1e-6) and v.values["slow"] == pytest.approx(200,
                                                                                             rel=1e-6)
    assert v.winner == "fast" and v.margin == pytest.approx(4.0)
    kv = decision.decide(rows, "sharegpt", "kv_memory")
    assert kv.unit == "tokens" and kv.values == pytest.approx({"fast": 2000, "slow": 4000})
    assert kv.winner == "fast" and kv.margin == pytest.approx(2.0)


def test_the_synchronous_probe_anchors_loads_below_the_first_point(tmp_path):
    runs = {("fast", "w"): make_sweep([2, 4, 8], 1, each=dict(ttft=[0.09, 0.2, 1.0]),
                                      probe=(0.5, 0.03)),
            ("slow", "w"): make_sweep([0.5, 1, 2], 1, each=dict(ttft=[0.2, 0.3, 2.0]),
                                      probe=(0.3, 0.15))}
    rows = decision.knee_table(decision.load(make_root(tmp_path / "r", runs)))
    assert decision.common_load(rows, "w") == pytest.approx(1)
    v = decision.decide(rows, "w", "ttft_p99")
    # fast at 1 req/s: between its probe (0.5 req/s, 30 ms) and its first point (2 req/s, 90 ms)
    assert v.values["fast"] == pytest.approx(30 + (1 - 0.5) / (2 - 0.5) * 60, rel=1e-6)
    assert v.values["slow"] == pytest.approx(300, rel=1e-6) and not v.flags
    assert v.winner == "fast"
    # one request at a time: the probe's rate x 8 output tokens each
    assert {r["engine"]: r["synchronous_tps"]
            for r in rows} == pytest.approx({"fast": 0.5 * 8, "slow": 0.3 * 8})


def test_interpolation_between_points_and_below_the_first():
    pts = [{"offered": 1.0, "x": 10.0, "client_limited": False},
           {"offered": 3.0, "x": 30.0, "client_limited": False}]
    assert decision.interpolate(pts, "x", 2.0) == (pytest.approx(20.0), "")
    value, caveat = decision.interpolate(pts, "x", 0.5)
    assert value == 10.0 and "above the common load" in caveat
    assert decision.interpolate(pts, "x",
                                9.0)[0] == 30.0                    # the curve ends at the knee
    # below the synchronous probe the server idles between requests: its value holds, no caveat
    probe = {"offered": 0.8, "x": 5.0, "client_limited": False, "probe": True}
    assert decision.interpolate([probe] + pts, "x", 0.5) == (5.0, "")
    assert decision.interpolate([probe] + pts, "x", 0.9) == (pytest.approx(7.5), "")


def test_ties_within_the_band_are_reported_as_ties(tmp_path):
    runs = {("a", "sharegpt"): make_sweep([1, 2, 4], 1, out=20),
            ("b", "sharegpt"): make_sweep([1, 2, 4], 1,
                                          out=19)}           # 5 % fewer tokens per request
    rows = decision.knee_table(decision.load(make_root(tmp_path / "r", runs)))
    v = decision.decide(rows, "sharegpt", "throughput")
    assert v.outcome == "tie" and v.tied == ["a", "b"] and v.label == "tie: a, b"
    assert decision.decide(rows, "sharegpt", "throughput", tie_within=0.02).winner == "a"


def test_missing_and_failed_runs_are_left_out_with_their_reason(tmp_path):
    runs = {("a", "sharegpt"): make_sweep([1, 2], 0),
            ("b", "sharegpt"): "failed: RuntimeError: boom",
            ("a", "agentic"): make_sweep([1, 2], 1), ("c", "sharegpt"): make_sweep([1, 2], 1)}
    root = make_root(tmp_path / "r", runs)
    (root / "c" / "sharegpt" / "sweep.json").unlink()  # a folder lost afterwards
    res = decision.load(root)
    assert set(res.engines) == {"a", "b", "c"} and set(res.workloads) == {"sharegpt", "agentic"}
    rows = decision.knee_table(res)
    v = decision.decide(rows, "sharegpt", "throughput")
    assert v.outcome == "only" and v.winner == "a"
    assert v.excluded["b"].startswith("run failed: RuntimeError") and "missing" in v.excluded["c"]
    # agentic has one engine only; the other (engine, workload) pairs simply do not exist
    verdicts = decision.decisions(rows)
    assert {(x.workload, x.constraint) for x in verdicts} == {(w, c)
                                                              for w in ("sharegpt", "agentic")
                                                               for c in decision.CONSTRAINTS}
    assert decision.display_rows(rows)[1]["note"].startswith("run failed")
    assert decision.display_rows(rows)[0]["knee req/s (offered)"] == "1"
    # any subset
    sub = res.select(engines=["a"], workloads=["agentic"])
    assert list(sub.runs) == [("a", "agentic")] and sub.engines == ["a"]


def test_a_sweep_not_in_the_manifest_is_still_read(tmp_path):
    root = make_root(tmp_path / "r", {("a", "sharegpt"): make_sweep([1, 2], 1)})
    make_sweep([1, 2], 0).save(root / "mine" / "sharegpt", )
    res = decision.load(root)
    assert res.runs[("mine", "sharegpt")].ok and "not listed" in res.runs[("mine",
                                                                           "sharegpt")].status


# --------------------------------------------------------------------------- several roots

def test_several_roots_merge_later_wins_and_finished_beats_failed(tmp_path):
    old = make_root(tmp_path / "showdown-old", {("vllm", "sharegpt"): make_sweep([1, 2, 4], 0),
                                                ("sglang", "sharegpt"): make_sweep([1, 2, 4], 1)},
                    created="2026-11-01T00:00:00+00:00")
    new = make_root(tmp_path / "showdown-new", {("vllm", "sharegpt"): make_sweep([1, 2, 4], 1),
                                                ("sglang", "sharegpt"): "failed: engine did not "
                                                                        "start",
                                                ("mini-radix", "agentic"): make_sweep([1, 2], 1)},
                    created="2026-12-01T00:00:00+00:00",
                    machine={"cpu": "Other CPU", "cores": 8, "memory_gib": 64, "gpu": None})
    res = decision.load(new, old)                     # order given does not matter: `created` does
    assert [r.path.name for r in res.roots] == ["showdown-old", "showdown-new"]
    assert res.runs[("vllm", "sharegpt")].root.path.name == "showdown-new"      # later wins
    assert res.runs[("sglang",
                     "sharegpt")].root.path.name == "showdown-old"    # finished beats failed
    assert res.runs[("mini-radix", "agentic")].kind == "mini"
    dropped = {(d.engine, d.root.path.name) for d, _ in res.replaced}
    assert dropped == {("vllm", "showdown-old"), ("sglang", "showdown-new")}
    assert any("different machines" in w for w in res.warnings)
    # a parent folder of roots works too
    assert len(decision.load(tmp_path).roots) == 2


def test_find_roots_and_the_places_looked_at(tmp_path, monkeypatch):
    a = make_root(tmp_path / "x" / "showdown-1", {("a", "w"): make_sweep([1], 0)},
                  created="2026-01-02")
    b = make_root(tmp_path / "y", {("a", "w"): make_sweep([1], 0)}, created="2026-01-01")
    assert decision.find_roots(tmp_path / "x", b, tmp_path / "nowhere") == [b.resolve(),
                                                                            a.resolve()]
    monkeypatch.setenv(decision.ENV_DIRS, f"{tmp_path / 'x'}{__import__('os').pathsep}{b}")
    places = decision.default_places()
    assert tmp_path / "x" in places and b in places and places[0].name == "results"


# --------------------------------------------------------------------------- SLO re-scoring

def test_goodput_is_rescored_from_the_records(tmp_path):
    # 20 requests at 2 req/s, half of them with a 1.5 s first token
    slow_half = [0.05] * 10 + [1.5] * 10
    runs = {("a", "w"): make_sweep([2, 4], 0, ttft=slow_half)}
    res = decision.load(make_root(tmp_path / "r", runs, slo=(10_000, 1_000)))
    loose = decision.knee_row(res.runs[("a", "w")], decision.slo_of(10_000, 1_000))
    assert loose["slo_met_at_knee"] == 1.0 and loose["goodput_at_knee"] == pytest.approx(2.0)
    tight = decision.knee_row(res.runs[("a", "w")], decision.slo_of(1_000, 1_000))
    # the p99 TTFT (1.5 s) now breaks the objective at every load: no knee any more
    assert tight["no_knee"] and "objective" in tight["note"]
    assert (tight["points"][0]["slo_met"] == 0.5
            and tight["points"][0]["goodput"] == pytest.approx(1.0))
    # goodput is the best over the loads tried: the overloaded point still completes 2.4 req/s
    assert (tight["best_goodput"] == pytest.approx(1.2)
            and tight["best_goodput_at"] == pytest.approx(4))
    itl = decision.knee_row(res.runs[("a", "w")],
                            decision.slo_of(10_000, 5))     # every gap is 10 ms
    assert itl["best_goodput"] == 0.0
    v = decision.decide([itl], "w", "goodput")
    assert v.outcome == "none" and "no request met" in v.excluded["a"]


def test_a_tighter_slo_moves_the_knee_down(two_engines):
    res = decision.load(two_engines)
    fast = res.runs[("fast", "sharegpt")]
    assert decision.knee_row(fast,
                             decision.slo_of(SLO_TTFT, SLO_ITL))["knee_offered"] == pytest.approx(4)
    # p99 TTFT is 40, 50, 80 ms at 1, 2, 4 req/s: a 60 ms objective fails at 4
    row = decision.knee_row(fast, decision.slo_of(60, SLO_ITL))
    assert row["knee_offered"] == pytest.approx(2) and "objective" in row["note"]
    assert decision.knee_row(fast, decision.slo_of(30, SLO_ITL))["no_knee"]


# --------------------------------------------------------------------------- chart and report

def test_chart_and_report(two_engines, tmp_path):
    from matplotlib.figure import Figure
    res = decision.load(two_engines)
    rows = decision.knee_table(res)
    verdicts = decision.decisions(rows)
    fig = decision_chart.plot_decision(verdicts, rows, decision_chart.title_for(res))
    assert isinstance(fig, Figure) and len(fig.axes) == 2
    texts = " ".join(t.get_text() for t in fig.axes[0].texts)
    assert "fast" in texts and "×2" in texts
    assert decision_chart.write_report([two_engines], tmp_path / "out") == 0
    md = (tmp_path / "out" / "decision.md").read_text()
    assert (tmp_path / "out" / "decision.png").stat().st_size > 10_000
    assert "| sharegpt | throughput | fast x2 |" in md and "not measured" in md.lower()


def test_an_engine_has_one_colour_in_the_curves_and_the_chart(tmp_path):
    from matplotlib.colors import to_rgba

    from workshop.bench.plots import plot_showdown
    runs = {(e, "w"): make_sweep([1, 2], 1) for e in ("vllm", "mini-radix", "hf", "mine")}
    res = decision.load(make_root(tmp_path / "r", runs))
    curves = plot_showdown(res.sweeps())          # notebook 10: every engine
    curve = {ln.get_label(): to_rgba(ln.get_color()) for ln in curves.axes[0].get_lines()
             if not ln.get_label().startswith("_")}
    rows = decision.knee_table(res)
    # notebook 11: a subset, in another order
    chart = decision_chart.plot_decision(decision.decisions(rows), rows, "t",
                                         engines=["hf", "mine", "vllm"])
    legend = chart.axes[1].get_legend()
    # each legend entry: the engine's name, then its configuration
    bar = {t.get_text().split("\n")[0]: to_rgba(h.get_facecolor())
           for t, h in zip(legend.get_texts(), legend.legend_handles)}
    assert set(bar) == {"hf", "mine", "vllm"} and set(curve) >= set(bar)
    assert {e: bar[e] for e in bar} == {e: curve[e] for e in bar}


# --------------------------------------------------------------------------- cited facts

VALUES = {"yes", "no", "partial", "untested", "via backend", "unknown"}


def test_cited_file_every_cell_and_figure_has_a_source_and_date():
    cited = decision.load_cited()
    ids = {e["id"] for e in cited["engines"]}
    assert {"vllm", "sglang", "mini", "hf", "tensorrt-llm", "dynamo", "tgi", "llama.cpp"} <= ids
    assert set(cited["features"]) == set(decision.FEATURES + decision.HARDWARE)
    for e in cited["engines"]:
        assert e["name"] and e["here"] and e["status"] and e["doc_url"]
        assert set(e["features"]) == set(cited["features"]), e["id"]
        for f, cell in e["features"].items():
            assert cell["value"] in VALUES, (e["id"], f)
            assert cell["source"], (e["id"], f)
            external = e["id"] not in ("mini", "hf")
            assert (cell["source"].startswith("https://") if external
                    else Path(cell["source"]).exists() or cell["source"].startswith("https://")), \
                (e["id"], f, cell["source"])
        if e["id"] not in ("vllm", "sglang", "mini", "hf"):
            assert e["here"].startswith("not measured here")
    assert "maintenance" in decision.cited_engine("tgi", cited)["status"]
    assert decision.cited_engine("ollama", cited)["id"] == "llama.cpp"
    engines_with_figures = {f["engine"] for f in cited["figures"]}
    assert {"vLLM", "SGLang"} <= engines_with_figures
    for f in cited["figures"]:
        assert re.fullmatch(r"\d{4}-\d{2}(-\d{2})?", f["date"]), f
        assert f["source_url"].startswith("https://") and f["source_title"], f
        assert all(f[k] for k in ("claim", "hardware", "model", "workload")), f


def test_feature_rows_and_needs():
    rows = decision.feature_rows(["vllm", "mini"], measured=["vllm"])
    assert [r["engine"] for r in rows][0] == "vLLM" and rows[0]["here"] == "measured"
    assert rows[1]["structured output"] == "yes" and rows[1]["multi lora"] == "no"
    assert rows[1]["prefix caching"] == "yes"
    missing = decision.supporting(["structured_output", "multi_lora"], ["vllm", "mini", "nonesuch"])
    assert missing == {"vllm": [], "mini": ["multi_lora"],
                       "nonesuch": ["structured_output", "multi_lora"]}
    assert all(r["source"].startswith("[") for r in decision.figure_rows())


# --------------------------------------------------------------------------- the committed example

def _section(md: str, title: str) -> str:
    return md.split(f"## {title}\n", 1)[1].split("\n## ", 1)[0].strip()


def test_notebook_11_falls_back_to_the_fair_stage_whose_answers_were_checked():
    """With no showdown of the learner's, the chart is drawn from the AMX run: the only
    committed stage where both production engines ran as documented and passed the gate."""
    ref = decision.reference_run()
    assert ref is not None, f"{decision.REFERENCE_RUN} has no showdown.json"
    assert ref == decision.reference_stages()["Xeon with AMX"]
    results = decision.load(ref)
    assert decision.stage_fairness(results)["fair"] is True


def test_the_committed_avx2_run_is_a_full_cpu_field_and_its_chart_is_drawn_from_it(tmp_path):
    """Notebook 11 sets ``benchmarks/reference_results/showdown-cpu`` beside the fair stage: it
    must load, hold every CPU contender on every workload from a full run, and the verdicts
    committed beside it must be the ones its data give today."""
    from workshop.bench import showdown
    ref = decision.reference_stages()["EPYC with AVX2 only"]
    results = decision.load(ref)
    assert [r.mode for r in results.roots] == ["full"]
    assert set(results.engines) == {c.label for c in showdown.CPU_FIELD}
    assert set(results.workloads) == set(showdown.WORKLOADS)
    assert all(run.ok for run in results.runs.values()), {k: r.status for k,
                                                          r in results.runs.items() if not r.ok}
    assert "benchmarks/showdown.py" in (ref / "README.md").read_text()
    assert decision_chart.write_report([ref], tmp_path) == 0
    assert _section((tmp_path / "decision.md").read_text(), "Winners") == \
        _section((ref / "decision.md").read_text(), "Winners")


# --------------------------------------------------------------------------- what ran

def test_what_ran_is_read_from_server_info_and_differences_that_can_favour_one_are_listed():
    vllm = {"dtype": "bfloat16", "attention": "CPU_ATTN (AMX)", "prefix_caching": True,
            "prefix_cache": "hashed blocks of 128 tokens", "compiled": True,
            "kv_capacity_tokens": 46_592,
            "limits": {"max_running": 32}, "extra": {}}
    sglang = {"dtype": "bfloat16", "prefix_caching": True, "prefix_cache": "radix tree, page 1",
              "compiled": False, "kv_capacity_tokens": 46_603, "limits": {"max_running": 32},
              "extra": {"sglang": {"attention_backend": "torch_native"},
                        "support_note": "outside SGLang's supported CPUs: ..."}}
    gate = {"passed": False, "checks": []}
    a = decision.setup_of(vllm, {"passed": True}, {"cpu_features": ["amx_bf16", "avx2"]})
    b = decision.setup_of(sglang, gate)
    assert a == {"answers": "right", "dtype": "bfloat16", "attention": "CPU_ATTN (AMX)",
                 "prefix cache": "hashed blocks of 128 tokens", "compiled": "compiled",
                 "max running": 32,
                 "KV tokens": 46_592, "CPU": "amx_bf16, avx2", "notes": []}
    # from SGLang's own field
    assert b["attention"] == "torch_native" and b["answers"] == "wrong answers"
    assert decision.setup_of({"prefix_caching": False, "extra": {}})["prefix cache"] == "off"
    assert decision.setup_of({})["answers"] == "not checked"
    label = decision.setup_label(b)
    assert "outside its supported CPUs" in label and label.endswith("WRONG ANSWERS")
    diffs = decision.setup_differences({"vllm": a, "sglang": b})
    assert diffs == ["compiled: vllm compiled, sglang eager",
                     "sglang: outside SGLang's supported CPUs: ..."]
    # a run from before the server gave the note: the same rule, from the CPU it recorded
    old = {"engine": "sglang", "device": "cpu", "extra": {}}
    from reference_server.engines.sglang import SUPPORT_NOTE
    assert decision.setup_of(old, None, {"cpu_features": ["avx2"]})["notes"] == [SUPPORT_NOTE]
    for si, machine in ((old, {"cpu_features": ["amx_bf16", "avx2"]}), (old, {}),
                        ({**old, "engine": "vllm"}, {"cpu_features": ["avx2"]}),
                        ({**old, "device": "cuda"}, {"cpu_features": ["avx2"]})):
        assert decision.setup_of(si, None, machine)["notes"] == []
    assert decision.setup_of({**sglang, "engine": "sglang", "device": "cpu"}, None,
                             {"cpu_features": ["avx2"]})["notes"] == [
        "outside SGLang's supported CPUs: ..."]           # never twice
    # caches of two designs are both on; a cap and a pool 10 % apart are differences
    c = {**a, "max running": 64, "KV tokens": 60_000}
    assert decision.setup_differences({"vllm": a, "other": c}) == [
        "max running: vllm 32, other 64", "KV tokens: vllm 46,592, other 60,000"]


def test_two_stages_side_by_side_and_which_is_fair(tmp_path):
    runs = {(e, "w"): make_sweep([1, 2, 3], k) for e, k in (("vllm", 2), ("sglang", 0))}
    fair_root = make_root(tmp_path / "amx", runs)
    unfair_root = make_root(tmp_path / "avx2", {("vllm", "w"): make_sweep([1, 2, 3], 0),
                                                ("sglang", "w"): make_sweep([1, 2, 3], 2)})
    for root, gate, note, cap in ((fair_root, True, None, 32),
                                  (unfair_root, None, "outside SGLang's ...", 128)):
        m = json.loads((root / "showdown.json").read_text())
        for e, entry in m["engines"].items():
            entry["server_info"].update({"dtype": "bfloat16", "prefix_caching": True,
                                         "compiled": False,
                                         "limits": {"max_running": cap if e == "vllm" else 32},
                                         "extra": {"support_note": note} if note and e == "sglang"
                                         else {}})
            if gate:
                entry["gate"] = {"passed": True, "counts": {}, "checks": []}
        (root / "showdown.json").write_text(json.dumps(m))
    stages = {"amx": decision.load(fair_root), "avx2": decision.load(unfair_root)}
    fair, unfair = (decision.stage_fairness(r) for r in stages.values())
    assert fair["fair"] is True and fair["set-ups differ"] == "no" and fair["outside supported "
                                                                            "hardware"] == "none"
    assert unfair["fair"] is False and unfair["outside supported hardware"] == "sglang"
    assert unfair["set-ups differ"] == "max running: vllm 128, sglang 32"
    assert "not checked" in unfair["answers"]
    rows = {r["constraint"]: r for r in decision.compare_stages(stages)}
    assert (rows["throughput"]["amx"].startswith("vllm")
            and rows["throughput"]["avx2"].startswith("sglang"))
    assert rows["throughput"]["same winner"] == "no"


def test_the_committed_amx_run_is_a_full_cpu_field_whose_answers_were_checked(tmp_path):
    """Notebook 11 sets this run beside the AVX2 one as the fair stage for vLLM against SGLang."""
    from workshop.bench import showdown
    stages = decision.reference_stages()
    assert set(stages) == set(decision.REFERENCE_STAGES)
    results = decision.load(stages["Xeon with AMX"])
    assert [r.mode for r in results.roots] == ["full"]
    assert "amx_bf16" in results.newest.manifest["machine"]["cpu_features"]
    # every CPU contender (the baseline ran afterwards, alone, and was merged: README)
    ran = {e for (e, _), run in results.runs.items() if run.ok}
    assert ran == {c.label for c in showdown.CPU_FIELD}
    assert all(run.gate["passed"] for run in results.runs.values() if run.ok)
    assert decision.stage_fairness(results)["fair"] is True
    assert decision_chart.write_report([stages["Xeon with AMX"]], tmp_path) == 0
    assert _section((tmp_path / "decision.md").read_text(), "Winners") == \
        _section((stages["Xeon with AMX"] / "decision.md").read_text(), "Winners")


# --------------------------------------------------------------------------- notebook 10's readings

def test_the_knee_table_read_for_notebook_10(tmp_path):
    """Notebook 10's exercises read one row (row_of), its hit rate (mean over the points, or at
    the knee / lightest load), the capacity leaders, the work per request behind a cache, the
    requests in flight at capacity and how p99 TTFT grew with load."""
    runs = {("fast", "shared-prefix"): make_sweep([1, 2, 4, 8], 2,
                                                  each=dict(hit=[0.2, 0.4, 0.4, 0.4]),
                                                  probe=(0.5, 0.04)),
            ("slow", "shared-prefix"): make_sweep([1, 2, 4, 6], None, hit=0.3,
                                                  each=dict(ttft=[0.1, 0.2, 0.4, 0.8]))}
    res = decision.load(make_root(tmp_path / "s", runs))
    rows = decision.knee_table(res)
    fast, slow = (decision.row_of(rows, "shared-prefix", e) for e in ("fast", "slow"))
    assert decision.row_of(rows, "shared-prefix", "absent") is None
    assert (decision.mean_hit_rate(fast) == pytest.approx(0.35)
            and decision.mean_hit_rate(None) is None)
    assert decision.hit_rate_reading(fast) == (True, None, pytest.approx(0.4))
    assert decision.hit_rate_reading(slow) == (False, pytest.approx(1), pytest.approx(0.3))
    assert decision.hit_rate_reading(None) == (None, None, None)

    lead, = decision.capacity_leaders(rows)
    assert fast["capacity_tps"] > slow["capacity_tps"]
    assert (lead["engine"], lead["runner-up"]) == ("fast", "slow")
    assert lead["x runner-up"] == pytest.approx(fast["capacity_tps"] / slow["capacity_tps"])
    assert decision.capacity_leaders([]) == []

    work = decision.cache_work_rows(rows, "shared-prefix", ("fast", "absent", "slow"), 100.0)
    assert [r["engine"] for r in work] == ["fast", "slow"]
    assert [r["prompt tokens computed per request"] for r in work] == [pytest.approx(65),
                                                                       pytest.approx(70)]
    assert work[0]["capacity tok/s"] == fast["capacity_tps"]

    sweep = res.sweeps()["shared-prefix"]["fast"]
    best = max(range(len(fast["points"])), key=lambda i: fast["points"][i]["output_tps"])
    assert decision.in_flight_at_capacity(sweep,
                                          fast) == sweep.points[best].summary["mean_concurrency"]
    assert decision.in_flight_at_capacity(None, fast) is None

    growth = {r["engine"]: r for r in decision.ttft_growth(res.sweeps())}
    assert growth["slow"]["p99 TTFT, lightest load (ms)"] == pytest.approx(100)
    assert growth["slow"]["growth"] == pytest.approx(8)


def test_departures_from_the_reference_are_listed_and_agreements_are_not(tmp_path):
    root = make_root(tmp_path / "s", {("a", "w"): make_sweep([1, 2], 1)})
    manifest = json.loads((root / "showdown.json").read_text())
    check = {"kind": "short", "repeat": 1, "question": "What is the capital of Italy?",
             "verdict": "near tie",
             "departed_at": 2, "gap": 0.25, "reference_top2": ["io", "ri"], "got": "Il Corriere"}
    manifest["engines"]["a"]["gate"] = {"passed": True,
                                        "checks": [{**check, "verdict": "agree"}, check]}
    (root / "showdown.json").write_text(json.dumps(manifest))
    rows = decision.departure_rows(decision.load(root))
    assert rows == [{"engine": "a", "prompt": "short (repeat 1)",
                     "question": "What is the capital of Italy?",
                     "verdict": "near tie", "at token": 2, "gap (logits)": 0.25,
                     "reference's top two": "'io' / 'ri'", "got": "Il Corriere"}]


def test_every_cell_text_of_the_chart_stays_inside_its_cell(tmp_path):
    """A three-way tie of long names once ran across the neighbouring cells (notebook 11's
    reference run, five contenders)."""
    names = ("mini-radix", "mini-hash", "vllm-long-name")
    runs = {(e, "w"): make_sweep([1, 2], 1) for e in (*names, "sglang")}
    rows = decision.knee_table(decision.load(make_root(tmp_path / "r", runs)))
    tie = decision.Verdict("w", "throughput", dict(zip(names, (15.1, 14.9, 14.6))), "tok/s",
                           "higher", tied=list(names), lead=("sglang", 2.9, ""),
                           setup=["dtype"])
    from dataclasses import replace
    every_column = [replace(tie, constraint=c) for c in decision_chart.CONSTRAINTS]
    fig = decision_chart.plot_decision(every_column, rows, "t")
    fig.canvas.draw()
    grid = fig.axes[0]
    to_data = grid.transData.inverted()
    for t in grid.texts:
        (x0, _), (x1, _) = to_data.transform(t.get_window_extent().get_points())
        cell = int(t.get_position()[0])
        assert cell + 0.02 <= x0 and x1 <= cell + 0.98, (t.get_text(), x0, x1)
