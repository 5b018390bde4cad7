"""Knee detection on synthetic load curves; sweep and compare folders round-trip."""


from workshop.bench.compare import compare_folders, compare_table
from workshop.bench.metrics import RequestRecord, summarize
from workshop.bench.results import BenchResult
from workshop.bench.sweep import SweepResult, find_knee, find_knee_closed


def test_knee_where_throughput_stops_tracking():
    offered = [1, 2, 4, 8, 16]
    achieved = [1.0, 2.0, 3.9, 5.0, 5.1]  # saturates between 4 and 8
    assert find_knee(offered, achieved) == 2


def test_knee_where_an_slo_breaks_first():
    offered = [1, 2, 4, 8]
    achieved = [1, 2, 4, 8]            # keeps up everywhere...
    ttft = [100, 120, 900, 3000]       # ...but queueing blows TTFT past 500 ms at 4
    assert find_knee(offered, achieved, ttft, None, slo_ttft_ms=500) == 1
    itl = [20, 20, 20, 80]
    assert find_knee(offered, achieved, None, itl, slo_itl_ms=50) == 2
    assert find_knee(offered, achieved, ttft, itl, slo_ttft_ms=5000, slo_itl_ms=50) == 2


def test_knee_is_the_last_point_of_the_good_prefix():
    # a noisy recovery after a failure does not move the knee up
    assert find_knee([1, 2, 3, 4], [1, 1.2, 3, 4]) == 0
    assert find_knee([1, 2], [0.5, 1]) is None
    assert find_knee([1, 2, 4], [1, 2, 4]) == 2
    assert find_knee([1, 2, 4], [0.95, 1.85, 3.7], tolerance=0.9) == 2
    # a missing p99 (nothing completed) fails the SLO
    assert find_knee([1, 2], [1, 2], [100, None], None, slo_ttft_ms=500) == 0


def test_closed_loop_knee_on_diminishing_returns():
    conc = [1, 2, 4, 8, 16]
    thr = [1.0, 1.9, 3.6, 4.0, 4.1]    # doubling 4 -> 8 adds only 11%
    assert find_knee_closed(conc, thr, min_gain=0.2) == 2
    assert find_knee_closed(conc, thr, min_gain=0.05) == 3
    assert find_knee_closed(conc, thr, [10, 10, 600, 900, 2000], None, slo_ttft_ms=500, min_gain=0.05) == 1


def _result(label, rate, ttfts):
    recs = [RequestRecord(index=i, scheduled=i * 0.1, sent=i * 0.1, first_token=i * 0.1 + t,
                          chunk_times=[i * 0.1 + t, i * 0.1 + t + 0.01], end=i * 0.1 + t + 0.01,
                          prompt_tokens=8, output_tokens=2) for i, t in enumerate(ttfts)]
    return BenchResult(config={"label": label, "workload": "random", "request_rate": rate, "concurrency": None},
                       summary=summarize(recs), records=recs)


def test_sweep_and_compare_round_trip(tmp_path):
    pts = [_result("a", r, [0.05] * 5) for r in (1.0, 2.0)]
    sw = SweepResult("rate", [1.0, 2.0], pts, 1, {"workload": "random", "requests_per_session": 1.0})
    sw.save(tmp_path / "sweep")
    back = SweepResult.load(tmp_path / "sweep")
    assert back.knee == 2.0 and back.loads == [1.0, 2.0]
    assert [p.records for p in back.points] == [p.records for p in pts]
    assert (tmp_path / "sweep" / "load_curve.png").exists()
    assert "(knee)" in back.table()

    b = _result("b", 2.0, [0.2] * 5)
    b.save(tmp_path / "b")
    table, _ = compare_folders([tmp_path / "sweep" / "point-01", tmp_path / "b"], tmp_path / "cmp",
                               labels=["engine-a", "engine-b"])
    lines = table.splitlines()
    assert len(lines) == 4 and "engine-a" in lines[2] and "engine-b" in lines[3]
    assert "| 50.0 |" in lines[2] and "| 200.0 |" in lines[3]   # TTFT p50 in ms
    assert (tmp_path / "cmp" / "compare.png").exists() and (tmp_path / "cmp" / "compare.md").exists()
    assert compare_table([b]).count("\n") == 2
