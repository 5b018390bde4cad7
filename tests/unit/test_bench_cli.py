"""The command line: run, compare and workloads end to end against the mock server."""

import asyncio
import json
import threading

import pytest

from workshop.bench.__main__ import main
from workshop.bench.mock_server import MockServer


@pytest.fixture(scope="module")
def mock_url():
    ready = threading.Event()
    box = {}

    def serve():
        async def go():
            srv = MockServer()
            box["port"] = await srv.start()
            box["stop"] = asyncio.Event()
            box["loop"] = asyncio.get_running_loop()
            ready.set()
            await box["stop"].wait()
            await srv.close()
        asyncio.run(go())

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    assert ready.wait(10)
    yield f"http://127.0.0.1:{box['port']}"
    box["loop"].call_soon_threadsafe(box["stop"].set)
    t.join(10)


def test_run_then_compare(mock_url, tmp_path, capsys):
    for label, rate in (("a", None), ("b", "50")):
        argv = ["run", "--base-url", mock_url, "--model", "mock", "--workload", "random",
                "--num-requests", "5",
                "--input-len", "8", "--output-len", "3", "--warmup", "1", "--no-progress",
                "--label", label,
                "--output-dir", str(tmp_path / label)]
        if rate:
            argv += ["--request-rate", rate, "--concurrency", "0"]
        assert main(argv) == 0
    out = capsys.readouterr().out
    assert "completed 5  errors 0" in out
    # the command line draws each run folder's figures (saving a result alone draws none)
    assert {f.name for f in (tmp_path / "a").glob("*.png")} == {"latency_cdf.png", "timeline.png"}
    cfg = json.loads((tmp_path / "b" / "config.json").read_text())
    assert cfg["request_rate"] == 50.0 and cfg["concurrency"] is None and cfg["label"] == "b"
    assert main(["compare", str(tmp_path / "a"), str(tmp_path / "b"), "--output-dir",
                 str(tmp_path / "cmp")]) == 0
    table = (tmp_path / "cmp" / "compare.md").read_text()
    assert "| a | random | c=8 | 5 | 0 |" in table and "| b | random | 50 req/s | 5 | 0 |" in table


def test_workloads_command_prints_stats(capsys):
    assert main(["workloads", "--workload", "shared-prefix", "--model", "not-a-local-model",
                 "--num-requests", "6",
                 "--num-groups", "2", "--system-prompt-len", "40", "--question-len", "5",
                 "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert (row["workload"] == "shared-prefix" and row["requests"] == 6
            and row["tokenizer"] == "whitespace")
    assert 0.5 < row["prefix_reuse_ratio"] < 1


def test_sweep_command_over_rates_and_concurrencies(mock_url, tmp_path, capsys):
    from workshop.bench import SweepResult, sweep_load
    sw = sweep_load(mock_url, "mock", "random", concurrencies=[1, 2], num_requests=4, warmup=0,
                    progress=False,
                    input_len=8, output_len=2, output_dir=str(tmp_path / "closed"))
    assert sw.mode == "concurrency" and sw.loads == [1.0, 2.0] and len(sw.points) == 2
    assert all(p.summary["completed"] == 4 for p in sw.points)
    assert main(["sweep", "--base-url", mock_url, "--model", "mock", "--request-rates", "20,40",
                 "--num-requests", "4",
                 "--input-len", "8", "--output-len", "2", "--warmup", "0", "--no-progress",
                 "--output-dir", str(tmp_path / "open")]) == 0
    assert "knee:" in capsys.readouterr().out
    back = SweepResult.load(tmp_path / "open")
    assert back.mode == "rate" and back.loads == [20.0, 40.0]
    assert (tmp_path / "open" / "load_curve.png").exists()
    for name in ("point-00", "point-01"):
        assert {f.name for f in (tmp_path / "open" / name).glob("*.png")} == {"latency_cdf.png",
                                                                             "timeline.png"}
    assert (back.points[1].config["request_rate"] == 40.0
            and back.points[1].config["concurrency"] is None)


def test_sweep_empties_the_prefix_cache_before_every_point_unless_told_not_to(mock_url, tmp_path,
                                                                              capsys):
    from workshop.bench import SweepResult
    base = ["sweep", "--base-url", mock_url, "--model", "mock", "--request-rates", "20,40",
            "--num-requests", "4",
            "--input-len", "8", "--output-len", "2", "--warmup", "0", "--no-progress",
            "--no-verify"]
    assert main(base + ["--output-dir", str(tmp_path / "reset")]) == 0
    sw = SweepResult.load(tmp_path / "reset")
    assert sw.config["reset_cache"] is True
    assert [p.config.get("prefix_cache_reset") for p in sw.points] == ["/reset_prefix_cache"] * 2
    assert main(base + ["--no-reset-cache", "--output-dir", str(tmp_path / "kept")]) == 0
    sw = SweepResult.load(tmp_path / "kept")
    assert sw.config["reset_cache"] is False and all("prefix_cache_reset" not in p.config
                                                     for p in sw.points)
    # `bench run` keeps its opt-in --reset-cache
    import argparse

    from workshop.bench.cli import add_subcommands
    parser = argparse.ArgumentParser()
    add_subcommands(parser.add_subparsers(dest="command"))
    assert parser.parse_args(["bench", "run"]).reset_cache is False
    assert parser.parse_args(["bench", "sweep"]).reset_cache is True


def test_a_sweep_says_how_long_each_point_and_the_rest_should_take(mock_url):
    from workshop.bench import sweep_load
    from workshop.bench.sweep import _TimeLeft
    lines = []
    sweep_load(mock_url, "mock", "random", request_rates=[20, 40], num_requests=4, warmup=0,
               progress=True,
               log=lines.append, input_len=8, output_len=2, environment=False)
    assert [ln.split(",")[0] for ln in lines] == ["sweep: point 1 of 2",
                                                  "sweep: point 2 of 2"], lines
    assert all("left in the sweep" in ln for ln in lines) and "so far" in lines[1], lines
    # the estimate: each open-loop point lasts (sessions - 1) / rate plus the last drain measured
    left = _TimeLeft(1.0)
    left.drain_s = 2.0
    line = left.line("rate", [1.0, 2.0], [11, 21], 3)
    assert line == ("sweep: point 2 of 3, 1 req/s, 11 requests, about 12 s; "
                    "about 24 s left in the sweep"), line
    assert "min left" in _TimeLeft(1.0).line("rate", [0.1], [100], 1)


def test_sweep_counts_every_objective_it_is_given_in_goodput(mock_url, tmp_path):
    """No flag silently ignored: an e2e objective no request can meet leaves no goodput."""
    from workshop.bench import SweepResult
    assert main(["sweep", "--base-url", mock_url, "--model", "mock", "--request-rates", "20",
                 "--num-requests", "4", "--input-len", "8", "--output-len", "2", "--warmup",
                 "0", "--no-progress", "--slo-e2e-ms", "0.001",
                 "--output-dir", str(tmp_path / "sw")]) == 0
    point = SweepResult.load(tmp_path / "sw").points[0].summary
    assert point["completed"] == 4 and point["goodput"] == 0
