"""The showdown runner: its plan and field (pure), and a whole showdown over real HTTP against
mock engines of known capacity (``workshop.bench.mock_server``), one of which cannot start."""

from __future__ import annotations

import json
import time

import pytest

from workshop.bench import showdown
from workshop.bench.showdown import Contender, Plan, Showdown


def test_field_labels_are_unique_and_name_real_engines():
    for field in (showdown.CPU_FIELD, showdown.GPU_FIELD):
        labels = [c.label for c in field]
        assert len(labels) == len(set(labels))
        assert {c.engine for c in field} <= {"vllm", "sglang", "mini", "hf"}
    # the two teaching-engine contenders differ only in their prefix cache
    mini = [c for c in showdown.CPU_FIELD if c.engine == "mini"]
    assert sorted(c.server_args[-1] for c in mini) == ["hash", "radix"]


def test_plan_scales_fixed_session_counts_like_requests():
    plan = Plan.full()
    assert plan.kwargs_for("agentic")["num_sessions"] == 8
    assert plan.kwargs_for("agentic", 1 / 3)["num_sessions"] == 3
    assert plan.kwargs_for("agentic", 0.01)["num_sessions"] == 2      # never fewer than two
    assert plan.kwargs_for("sharegpt") == {"max_output_len": 128}
    assert "max_output_len" not in Plan(sharegpt_max_output=None).kwargs_for("sharegpt")
    assert set(Plan.quick().workloads) <= set(showdown.WORKLOADS)


def test_with_servers_points_running_labels_at_their_server():
    class Running:
        base_url, api_key = "http://127.0.0.1:9", "sk-x"
    out = showdown.with_servers(showdown.CPU_FIELD, {"vllm": Running()})
    by = {c.label: c for c in out}
    assert by["vllm"].base_url == "http://127.0.0.1:9" and by["vllm"].api_key == "sk-x"
    assert all(c.base_url is None for c in out if c.label != "vllm")


def test_find_roots_oldest_first(tmp_path):
    for name, created in (("b", "2026-01-01T00:00:00+00:00"), ("a", "2026-03-01T00:00:00+00:00")):
        Showdown(tmp_path / name, {"created": created, "runs": []}).write()
    (tmp_path / "not-a-showdown").mkdir()
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "showdown.json").write_text("{")
    assert [r.name for r in showdown.find_roots(tmp_path)] == ["b", "a"]
    assert showdown.find_roots(tmp_path / "a") == [(tmp_path / "a").resolve()]
    assert showdown.find_roots(tmp_path / "missing") == []


def test_a_showdown_over_http_ranks_engines_by_capacity(mock_engine, tmp_path):
    # Two engines that differ only in how many requests they serve at once (8 vs 2), a third
    # that cannot start: the showdown records it and goes on.
    fast = Contender("fast", "mock", base_url=mock_engine(0.15, 0.05, 8))
    slow = Contender("slow", "mock", base_url=mock_engine(0.15, 0.05, 2))
    broken = Contender("broken", "no-such-engine")
    plan = Plan(workloads=("shared-prefix",), num_requests=24, sweep_points=4, probe_requests=4,
                probe_concurrency=12, slo_ttft_ms=None, slo_itl_ms=None,
                workload_args={"shared-prefix": {"system_prompt_len": 16, "question_len": 4, "output_len": 2}})
    t0 = time.monotonic()
    show = showdown.run_showdown(tmp_path / "sd", [fast, slow, broken], plan, model="mock", mode="quick",
                                 command="test", progress=False, log=lambda s: None, start_timeout_s=60)
    m = json.loads((tmp_path / "sd" / "showdown.json").read_text())
    assert m["format"] == showdown.FORMAT and m["command"] == "test" and m["machine"]["cores"] >= 1
    runs = {(r["engine"], r["workload"]): r for r in m["runs"]}
    assert runs[("fast", "shared-prefix")]["status"] == "ok"
    assert runs[("slow", "shared-prefix")]["status"] == "ok"
    assert runs[("broken", "shared-prefix")]["folder"] is None
    assert m["engines"]["broken"]["status"].startswith("did not start")
    from workshop import decision
    sweeps = decision.load(tmp_path / "sd").sweeps()["shared-prefix"]
    assert set(sweeps) == {"fast", "slow"}
    note = {e: s.knee_note() + "\n" + s.table() for e, s in sweeps.items()}
    # capacities 8/0.2 = 40 and 2/0.2 = 10 requests/s: the fast knee lies well above the slow one
    assert sweeps["fast"].knee_offered and sweeps["slow"].knee_offered, note
    assert sweeps["fast"].knee_offered > 2 * sweeps["slow"].knee_offered, note
    assert sweeps["slow"].knee_offered <= 1.3 * 10, note
    assert show.root == tmp_path / "sd" and time.monotonic() - t0 < 240
