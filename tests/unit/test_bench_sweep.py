"""Knee detection on synthetic load curves; sweep and compare folders round-trip."""

import math

import numpy as np
import pytest

from workshop.bench import sweep_load
from workshop.bench.client import arrival_times
from workshop.bench.compare import compare_folders, compare_table
from workshop.bench.request_metrics import SLO, RequestRecord, summarize
from workshop.bench.results import BenchResult
from workshop.bench.saturation import Baseline, judge, offered_vs_asked, sampling_band
from workshop.bench.sweep import SweepResult, _knee, find_knee, find_knee_closed


def test_knee_where_throughput_stops_tracking():
    offered = [1, 2, 4, 8, 16]
    achieved = [1.0, 2.0, 3.9, 5.0, 5.1]  # saturates between 4 and 8
    assert find_knee(offered, achieved) == 2


def test_knee_where_an_slo_breaks_first():
    offered = [1, 2, 4, 8]
    achieved = [1, 2, 4, 8]            # keeps up everywhere...
    ttft = [100, 120, 900, 3000]       # ...but queueing blows TTFT past 500 ms at 4
    assert find_knee(offered, achieved, {"ttft_ms": ttft}, SLO(ttft_ms=500)) == 1
    itl = [20, 20, 20, 80]
    assert find_knee(offered, achieved, {"itl_ms": itl}, SLO(itl_ms=50)) == 2
    assert find_knee(offered, achieved, {"ttft_ms": ttft, "itl_ms": itl},
                     SLO(ttft_ms=5000, itl_ms=50)) == 2
    # an objective on another metric (notebook 12: end-to-end latency) is checked the same way
    assert find_knee(offered, achieved, {"e2e_ms": ttft}, SLO(e2e_ms=500)) == 1
    assert find_knee(offered, achieved, {"e2e_ms": ttft}, SLO(ttft_ms=500)) == 3


def test_knee_is_the_last_point_of_the_good_prefix():
    # a noisy recovery after a failure does not move the knee up
    assert find_knee([1, 2, 3, 4], [1, 1.2, 3, 4]) == 0
    assert find_knee([1, 2], [0.5, 1]) is None
    assert find_knee([1, 2, 4], [1, 2, 4]) == 2
    assert find_knee([1, 2, 4], [0.95, 1.85, 3.7], tolerance=0.9) == 2
    # a missing p99 (nothing completed) fails the SLO
    assert find_knee([1, 2], [1, 2], {"ttft_ms": [100, None]}, SLO(ttft_ms=500)) == 0


def test_closed_loop_knee_on_diminishing_returns():
    conc = [1, 2, 4, 8, 16]
    thr = [1.0, 1.9, 3.6, 4.0, 4.1]    # doubling 4 -> 8 adds only 11%
    assert find_knee_closed(conc, thr, min_gain=0.2) == 2
    assert find_knee_closed(conc, thr, min_gain=0.05) == 3
    assert find_knee_closed(conc, thr, {"ttft_ms": [10, 10, 600, 900, 2000]}, SLO(ttft_ms=500),
                            min_gain=0.05) == 1


def _result(label, rate, ttfts):
    recs = [RequestRecord(index=i, scheduled=i * 0.1, sent=i * 0.1, first_token=i * 0.1 + t,
                          chunk_times=[i * 0.1 + t, i * 0.1 + t + 0.01], end=i * 0.1 + t + 0.01,
                          prompt_tokens=8, output_tokens=2) for i, t in enumerate(ttfts)]
    return BenchResult(config={"label": label, "workload": "random", "request_rate": rate,
                               "concurrency": None},
                       summary=summarize(recs), records=recs)


def test_sweep_and_compare_round_trip(tmp_path):
    pts = [_result("a", r, [0.05] * 5) for r in (1.0, 2.0)]
    sw = SweepResult("rate", [1.0, 2.0], pts, 1,
                     {"workload": "random", "requests_per_session": 1.0})
    sw.save(tmp_path / "sweep")
    back = SweepResult.load(tmp_path / "sweep")
    assert back.knee == 2.0 and back.loads == [1.0, 2.0]
    assert [p.records for p in back.points] == [p.records for p in pts]
    assert not list((tmp_path / "sweep").rglob("*.png"))   # saving writes data, no figures
    assert "(knee)" in back.table()

    b = _result("b", 2.0, [0.2] * 5)
    b.save(tmp_path / "b")
    table, _ = compare_folders([tmp_path / "sweep" / "point-01", tmp_path / "b"], tmp_path / "cmp",
                               labels=["engine-a", "engine-b"])
    lines = table.splitlines()
    assert len(lines) == 4 and "engine-a" in lines[2] and "engine-b" in lines[3]
    assert "| 50.0 |" in lines[2] and "| 200.0 |" in lines[3]   # TTFT p50 in ms
    assert ((tmp_path / "cmp" / "compare.png").exists()
            and (tmp_path / "cmp" / "compare.md").exists())
    assert compare_table([b]).count("\n") == 2


# ----------------------------------------------------------------------- the knee of a known server
#
# The mock engine with a concurrency limit C and fixed token timing: a request of L tokens
# holds a slot for S = first_token_delay + (L - 1) x chunk_delay, so the server completes at
# most C / S requests per second. It runs in its own process so that the client under test
# does not share a GIL (or an event loop) with it. Tolerances are wide on purpose: the test
# machine is a loaded 2-core box, and the sweep's points are a fifth of the capacity apart.

# Few chunks per request (CPU stays low) and a service time long against the machine's
# scheduling stalls.
C, FIRST, CHUNK, L = 8, 0.05, 0.15, 2           # S = 0.05 + 1 x 0.15 = 0.2 s
CAPACITY = C / (FIRST + (L - 1) * CHUNK)          # 40 requests/s


def test_knee_of_a_server_with_known_capacity(mock_engine, tmp_path):
    url = mock_engine(CHUNK, FIRST, C)
    # 32 requests: the throughput probe runs 16 at a time, twice the server's limit
    sw = sweep_load(url, "mock", "random", num_requests=32, warmup=0, progress=False, input_len=8,
                    output_len=L,
                    environment=False,
                    duration_s=2.0, sweep_points=5)
    note = sw.knee_note() + "\n" + sw.table()
    # the probes: one at a time gives 1/S (5/s), the throughput probe the capacity C/S
    assert 0.7 * CAPACITY / C <= sw.config["synchronous_rate"] <= 1.2 * CAPACITY / C, note
    assert 0.75 * CAPACITY <= sw.config["max_throughput_rate"] <= 1.2 * CAPACITY, note
    assert max(sw.offered()) >= 1.15 * CAPACITY, note   # the sweep goes past the capacity
    # Tolerance: the knee, as offered, lies within 25% of the capacity (the points are
    # ~0.25 x capacity apart, so the last point that keeps up is 0.75-1.05 x capacity).
    assert sw.knee_offered is not None, note
    assert abs(sw.knee_offered - CAPACITY) <= 0.25 * CAPACITY, note
    over = sw.overloaded()
    offered = sw.offered()
    for o, bad in zip(offered, over):
        if o <= 0.7 * CAPACITY:
            assert not bad, note                  # well under capacity: never flagged
        if o >= 1.15 * CAPACITY:
            assert bad, note                      # well over: always flagged
    # the mock's own queue was seen, and the overloaded point says why (the last is offered
    # ~1.3 x capacity)
    last = sw.points[-1].summary
    assert last["server"]["peak_waiting"] > 0 and last["saturation"]["reasons"], note
    sw.save(tmp_path / "sweep", )
    back = type(sw).load(tmp_path / "sweep")
    assert set(back.probes) == {"synchronous", "throughput"} and back.knee == sw.knee


def test_long_answers_under_capacity_are_not_overload(mock_engine):
    # ShareGPT's shape, shrunk: most answers short, one in six long (4 vs 60 tokens at 50 ms:
    # 0.15 s vs 2.95 s), 8 arrivals/s for ~6 s. The server has 64 slots (capacity ~64 /
    # 0.6 s ~ 100 req/s), so 8 req/s is far under it and nothing ever waits; but the run ends
    # with the drain of the last long answers, so completed / duration falls short of the
    # arrival rate.
    from workshop.bench.workloads import Request, SingleRequest, Workload
    url = mock_engine(0.05, 0.0, 64)
    wl = Workload("long-tail",
                  [SingleRequest(Request(60 if i % 6 == 3 else 4, prompt=f"q{i} a b c"))
                                for i in range(48)], {"api": "completions"})
    sw = sweep_load(url, "mock", wl, request_rates=[8.0], num_requests=48, warmup=0, progress=False,
                    environment=False)
    (p,) = sw.points
    s = p.summary
    assert s["errors"] == 0 and s["server"]["peak_waiting"] == 0
    # The scenario has the shape: the previous criterion (completed / duration against
    # n / (arrival span + median session)) called this point overloaded.
    previous_offered = s["completed"] / (s["arrival_span_s"] + s["session_median_s"])
    assert s["request_throughput"] < 0.9 * previous_offered, s
    assert not s["saturation"]["overloaded"], s["saturation"]
    assert sw.knee == 8.0, sw.knee_note()


def test_a_fixed_session_count_sizes_the_points_not_the_synchronous_probe(mock_engine):
    # The showdown fixes the agentic workload's sessions per point; its synchronous probe (2
    # of 12 requests) must run its share of them, not every session one at a time.
    url = mock_engine(0.001, 0.0, 64)
    sw = sweep_load(url, "mock", "agentic", num_requests=12, num_sessions=6, probe_requests=2,
                    probe_concurrency=3, sweep_points=1, warmup=0, progress=False,
                    environment=False,
                    system_prompt_len=40, main_turns=1, branch_turns=0, turn_output=(2, 3),
                    tool_result_len=(4, 8), summary_output=2, final_output=2)
    sessions = {k: p.summary["num_sessions"] for k, p in sw.probes.items()}
    assert sessions == {"synchronous": 1, "throughput": 6}, sessions
    assert sw.points[0].summary["num_sessions"] == 6


# ------------------------------------------------------------------------- the verdict on timelines


def _timeline(arrivals, lengths, ttfts=None):
    recs = []
    for i, (a, length) in enumerate(zip(arrivals, lengths)):
        t = (ttfts[i] if ttfts else 0.05)
        recs.append(RequestRecord(index=i, session=i, scheduled=a, sent=a, first_token=a + t,
                                  chunk_times=[a + t, a + length], end=a + length, output_tokens=2,
                                  max_tokens=2))
    return recs


def test_stable_server_with_long_answers_keeps_up():
    # one arrival a second for 60 s, answers alternating 2 s and 20 s: a stable system that
    # holds ~11 requests; completed / duration = 60 / 79 s looks like 76% of the load
    arr = [float(i) for i in range(60)]
    lengths = [2.0 if i % 2 else 20.0 for i in range(60)]
    recs = _timeline(arr, lengths)
    base = Baseline(session_p90_s=20.0, session_median_s=11.0, ttft_median_s=0.05)
    v = judge(recs, None, base)
    assert not v.overloaded and not v.client_limited, v
    assert v.window["start_s"] == pytest.approx(20.0) and v.window["end_s"] == pytest.approx(59.0)
    assert v.throughput_ratio == pytest.approx(1.0, abs=0.1)


def test_growing_queue_is_overload():
    # a single server of 0.5 s per request fed 4 requests a second: each waits longer than the last
    arr = [0.25 * i for i in range(80)]
    starts, free = [], 0.0
    for a in arr:
        free = max(free, a)
        starts.append(free)
        free += 0.5
    recs = _timeline(arr, [s + 0.5 - a for s, a in zip(starts, arr)],
                     [s + 0.05 - a for s, a in zip(starts, arr)])
    base = Baseline(session_p90_s=0.5, session_median_s=0.5, ttft_median_s=0.05)
    series = {"t": [0.5 * i for i in range(40)], "waiting": [float(i) for i in range(40)]}
    v = judge(recs, series, base)
    assert v.overloaded and v.falls_behind and v.queue_grows and v.ttft_grows, v
    assert v.throughput_ratio == pytest.approx(0.5, abs=0.1)
    # without the server's queue the other two signs still say so
    assert judge(recs, None, base).overloaded


def test_client_that_falls_behind_its_schedule_is_named():
    arr = [0.1 * i for i in range(50)]
    recs = _timeline(arr, [0.05] * 50)
    for i, r in enumerate(recs):        # each send 5 ms later than the one before
        r.sent += 0.005 * i
        r.first_token += 0.005 * i
        r.chunk_times = [t + 0.005 * i for t in r.chunk_times]
        r.end += 0.005 * i
    v = judge(recs, None, Baseline(0.05, 0.05, 0.05))
    assert v.client_limited and "client" in v.reasons[-1]


def test_offered_vs_asked_and_the_sampling_band():
    n, rate = 40, 1.0
    arr = arrival_times(n, rate, 1.0, seed=0)
    recs = _timeline(arr, [0.5] * n)
    ld = offered_vs_asked(recs, rate)
    assert ld["scheduled_rate"] == pytest.approx((n - 1) / arr[-1])
    assert ld["offered_rate"] == pytest.approx(ld["scheduled_rate"])
    lo, hi = ld["sampling_band_95"]
    # about 1/sqrt(39) = 16% relative spread: the 95% band is roughly 0.7-1.4 x asked
    assert 0.6 < lo < 0.8 and 1.2 < hi < 1.5
    # and it is right: 95% of seeds realise a rate inside it
    inside = [lo <= (n - 1) / arrival_times(n, rate, 1.0, seed=s)[-1] <= hi for s in range(2000)]
    assert 0.93 < np.mean(inside) < 0.97
    # the same seed gives the same relative shortfall at every rate (the gaps scale with 1/rate)
    r16 = offered_vs_asked(_timeline(arrival_times(n, 16.0, 1.0, seed=0), [0.5] * n), 16.0)
    assert r16["offered_vs_asked"] == pytest.approx(ld["offered_vs_asked"])
    assert sampling_band(10_001)[0] > 0.95     # long runs converge


# ------------------------------------------------------------------------ points too short to judge

from workshop.bench.saturation import judged  # noqa: E402


def _judged_point(arrivals, lengths, base):
    recs = _timeline(arrivals, lengths)
    res = BenchResult(config={}, summary=summarize(recs), records=recs)
    res.summary["saturation"] = judge(recs, None, base).to_dict()
    return res


BASE = Baseline(session_p90_s=1.0, session_median_s=1.0, ttft_median_s=0.05)
# notebook 10's quick plan: four arrivals, each session 3 s, against 1 s unloaded: the window
# holds two or three arrivals and no end, and no shortfall that small can exceed its noise
SHORT = ([0.0, 0.3, 0.6, 0.9], [3.0] * 4)
# a long stable point: one arrival every 0.5 s for 30 s, each session 1 s
LONG = ([0.5 * i for i in range(60)], [1.0] * 60)


def test_a_point_too_short_to_judge_is_neither_kept_up_nor_overloaded():
    v = judge(_timeline(*SHORT), None, BASE).to_dict()
    assert (not v["overloaded"] and v["window"]["completions"] == 0
            and v["window"]["arrivals"] <= 3), v
    assert judged(v) is False and v["reasons"][-1].startswith("not judged"), v
    long = judge(_timeline(*LONG), None, BASE).to_dict()
    assert not long["overloaded"] and judged(long) is True, long
    assert judged(None) is None and judged({}) is None        # closed-loop points carry no verdict


def test_no_knee_is_claimed_from_points_too_short_to_judge(tmp_path):
    from workshop.bench.plots import plot_showdown
    cfg = {"requests_per_session": 1.0, "tolerance": 0.9, "min_gain": 0.1}
    short = [_judged_point(*SHORT, BASE), _judged_point(*SHORT, BASE)]
    sw = SweepResult("rate", [1.0, 2.0], short,
                     _knee("rate", [1.0, 2.0], short, SLO(), 0.9, 0.1), cfg)
    assert sw.knee_index is None and sw.judged() == [False, False]
    assert "not enough requests per point to judge a knee" in sw.knee_note()
    assert sw.table().count("not judged") == 2 and "(knee)" not in sw.table()
    # a folder written before the rule stored a knee claimed from such a point: it is re-derived
    sw.knee_index = 1
    sw.save(tmp_path / "old", )
    sw = SweepResult.load(tmp_path / "old")
    assert sw.knee_index is None
    # the figure stars nothing and draws both points hollow
    fig = plot_showdown({"shared-prefix": {"mini-hash": sw}})
    lines = fig.axes[0].get_lines()
    assert not [ln for ln in lines if ln.get_marker() == "*"]
    assert sum(len(ln.get_xdata()) for ln in lines if ln.get_markerfacecolor() == "white") == 2
    # a judged point below one too short: the knee is the judged one, a lower bound
    mixed = [_judged_point(*LONG, BASE), _judged_point(*SHORT, BASE)]
    sw = SweepResult("rate", [1.0, 2.0], mixed,
                     _knee("rate", [1.0, 2.0], mixed, SLO(), 0.9, 0.1), cfg)
    assert (sw.knee_index == 0
            and "at least (not enough requests at 2 req/s to judge them)" in sw.knee_note())
    # an agent session is several requests: the asked load is sessions/s, the offered req/s
    sessions = SweepResult("rate", [1.0, 2.0], mixed, sw.knee_index,
                           {**cfg, "requests_per_session": 6.0})
    note = sessions.knee_note()
    assert note.startswith("knee: 1 sessions/s asked, ") and " req/s offered at least" in note, note
    assert "at 2 sessions/s to judge" in note and sessions.knee_offered == 6 * sw.knee_offered, note


# ------------------------------------------------------------------ a server that admits everything
#
# vLLM admits every request at once: an overload shows as more requests running and slower
# tokens, never as waiting requests or a rising TTFT (issue 35: a sweep offered up to 0.51 req/s,
# achieved 0.30, and called every point "keeps up"). A token-step model of such a server: every
# step gives each request in flight one token and lasts 75 ms + 4 ms per request, until the
# machine's compute is spent (85 tokens/s in all); answers are ShareGPT-like (median 200 tokens).

from workshop.bench.saturation import Z, closed_loop_throughput  # noqa: E402


def _admit_all(outs, *, arrivals=None, concurrency=None, tokens_per_s=85.0, base_s=0.075,
               per_request_s=0.004):
    """Records of a server that admits every request (open loop at ``arrivals``, or a closed loop
    of ``concurrency``): each step, a token for every request in flight."""
    n = len(outs)
    left, start, first, end = list(outs), [None] * n, [None] * n, [None] * n
    t, nxt, active = 0.0, 0, []
    while nxt < n or active:
        if arrivals is None:
            while nxt < n and len(active) < concurrency:
                start[nxt] = t
                active.append(nxt)
                nxt += 1
        else:
            if not active:
                t = max(t, arrivals[nxt])
            while nxt < n and arrivals[nxt] <= t:
                start[nxt] = arrivals[nxt]
                active.append(nxt)
                nxt += 1
        t += max(base_s + per_request_s * len(active), len(active) / tokens_per_s)
        for j in active:
            left[j] -= 1
            first[j] = first[j] or t
            if not left[j]:
                end[j] = t
        active = [j for j in active if left[j]]
    return [RequestRecord(index=k, session=k, scheduled=start[k], sent=start[k],
                          first_token=first[k], end=end[k],
                          chunk_times=[first[k], end[k]], output_tokens=outs[k], max_tokens=outs[k])
            for k in range(n)]


def _admit_all_sweep(rates, probe_concurrency=20, **server):
    """The sweep as ``sweep_load`` runs it with 40 requests a point: a synchronous probe (10), a
    throughput probe (60 at 20 in flight: its maximum is the ceiling), then the rates."""
    rng = np.random.default_rng(0)
    outs = [int(min(1500, max(8, x))) for x in rng.lognormal(math.log(200), 0.8, 60)]
    base = Baseline.from_records(_admit_all(outs[:10], concurrency=1, **server),
                                 "synchronous probe")
    ceiling = closed_loop_throughput(_admit_all(outs, concurrency=probe_concurrency, **server),
                                     base.session_p90_s)
    no_queue = {"t": [0.5 * i for i in range(600)],
                "waiting": [0.0] * 600}   # what vLLM's /metrics says
    points = []
    for rate in rates:
        recs = _admit_all(outs[:40], arrivals=arrival_times(40, rate, 1.0, seed=0), **server)
        res = BenchResult(config={"request_rate": rate}, summary=summarize(recs), records=recs)
        res.summary["server"] = {"series": no_queue}
        res.summary["saturation"] = judge(recs, no_queue, base, 0.9, ceiling).to_dict()
        points.append(res)
    cfg = {"requests_per_session": 1.0, "tolerance": 0.9, "min_gain": 0.1,
           "max_throughput_rate": ceiling,
           "baseline": vars(base)}
    return SweepResult("rate", list(rates), points,
                       _knee("rate", list(rates), points, SLO(), 0.9, 0.1), cfg), base


def test_overload_without_a_queue_is_seen_in_the_work_in_flight():
    sw, base = _admit_all_sweep([0.12, 0.51])
    low, high = (p.summary["saturation"] for p in sw.points)
    note = sw.knee_note() + "\n" + sw.table()
    # the measured pattern: the probe's maximum ~0.34/s; offered ~0.51, achieved ~0.30; nothing
    # waits, TTFT stays flat, the requests in flight pile up and every token slows down
    assert 0.3 < sw.config["max_throughput_rate"] < 0.37, note
    win = high["window"]
    assert 0.45 < win["offered_rate"] < 0.56 and 0.25 < win["achieved_rate"] < 0.35, note
    assert high["queue_grows"] is False and high["ttft_grows"] is False, high
    assert high["in_flight_end"] > high["in_flight_start"] + 5, high
    assert (sw.points[1].summary["tpot_ms"]["median"]
            > 1.2 * sw.points[0].summary["tpot_ms"]["median"])
    # only one or two noises deep, as a run of 40 long answers is: not beyond Z = 2.5
    assert high["shortfall"] < Z * high["shortfall_noise"], high
    # above the probe's maximum the point has to show that it kept up, and it did not
    assert high["above_ceiling"] and high["overloaded"], high
    assert high["falls_behind"] and high["in_flight_grows"], high
    assert any(r.startswith("work in flight grows") for r in high["reasons"]), high
    # the light point keeps up, and the knee is there, not "higher than the highest load tried"
    assert not low["overloaded"] and judged(low) and not low["above_ceiling"], low
    assert low["kept_up"].startswith("achieved ") and "in flight steady" in low["kept_up"], low
    assert sw.knee_index == 0 and "no point tried was overloaded" not in note, note
    assert ("at 0.51: throughput falls behind" in note
            and sw.table().count("| overloaded |") == 1), note


def test_a_point_that_keeps_up_above_the_probe_maximum_says_how():
    # A server whose batches are nearly free (1 ms per request per step, compute never spent),
    # probed with 2 in flight: far from its limit, so points above the probe's maximum can keep
    # up; they must show it, and the verdict and knee note say how.
    sw, _ = _admit_all_sweep([0.2, 0.3], probe_concurrency=2, tokens_per_s=1e9, per_request_s=0.001)
    sat = [p.summary["saturation"] for p in sw.points]
    note = sw.knee_note() + "\n" + sw.table()
    assert all(s["above_ceiling"] and not s["overloaded"] and judged(s) for s in sat), note
    kept = sat[-1]["kept_up"]
    assert (kept.startswith("achieved ") and " offered " in kept
            and "throughput probe sustained" in kept), kept
    assert sw.knee_index == 1 and f"at the knee: {kept}" in sw.knee_note(), note
    assert f"keeps up ({kept})" in sw.table(), note
    # the stored points read the same when judged again by today's rule
    again = sw.rejudged()
    assert again.knee_index == 1 and again.points[1].summary["saturation"]["kept_up"] == kept
