"""The showdown runner: its plan and field (pure), and a whole showdown over real HTTP against
mock engines of known capacity (``workshop.bench.mock_server``), one of which cannot start."""

from __future__ import annotations

import json
import time

import pytest

from workshop.bench import plots, showdown
from workshop.bench.request_metrics import SLO
from workshop.bench.showdown import Contender, Plan, Showdown


def test_field_labels_are_unique_and_name_real_engines():
    for field in (showdown.CPU_FIELD, showdown.GPU_FIELD):
        labels = [c.label for c in field]
        assert len(labels) == len(set(labels))
        assert {c.engine for c in field} <= {"vllm", "sglang", "mini", "hf"}
    # the two teaching-engine contenders differ only in their prefix cache
    mini = [c for c in showdown.CPU_FIELD if c.engine == "mini"]
    assert sorted(c.server_args[-1] for c in mini) == ["hash", "radix"]


def test_every_contender_has_its_own_fixed_colour():
    # plots imports no sibling module, so the colour order it keeps must follow the fields here
    labels = tuple(dict.fromkeys(c.label for c in (*showdown.CPU_FIELD, *showdown.GPU_FIELD)))
    assert plots.KNOWN_ENGINES == labels


def test_plan_scales_fixed_session_counts_like_requests():
    plan = Plan(sharegpt_max_output=128,
                workload_args={"agentic": {"num_sessions": 8, "main_turns": 2}})
    assert plan.kwargs_for("agentic") == {"num_sessions": 8, "main_turns": 2}
    assert plan.kwargs_for("agentic", 1 / 3)["num_sessions"] == 3
    assert plan.kwargs_for("agentic", 0.01)["num_sessions"] == 2      # never fewer than two
    assert plan.kwargs_for("sharegpt") == {"max_output_len": 128}
    assert "num_sessions" in Plan.full().kwargs_for("agentic")
    assert "max_output_len" not in Plan(sharegpt_max_output=None).kwargs_for("sharegpt")
    assert set(Plan.quick().workloads) <= set(showdown.WORKLOADS)


def test_objectives_not_stated_are_derived_from_the_best_unloaded_p99():
    unloaded = [{"workload": "a", "engine": "fast", "ttft_ms": 100.0, "itl_ms": 20.0},
                {"workload": "a", "engine": "slow", "ttft_ms": 400.0, "itl_ms": 10.0},
                {"workload": "b", "engine": "fast", "ttft_ms": 300.0, "itl_ms": 25.0},
                {"workload": "b", "engine": "slow", "ttft_ms": 250.0, "itl_ms": None}]
    d = showdown.derive_objectives(unloaded, 3.0)
    # TTFT: per workload the best engine's p99 (a: fast 100, b: slow 250); the higher of those
    assert d["ttft_ms"] == {"ms": 750.0, "engine": "slow", "workload": "b",
                            "unloaded_p99_ms": {"ttft_ms": 250.0}}
    # ITL: per workload the best engine's p99 ITL + p99 TTFT (a: fast 120, b: fast 325, slow has no
    # ITL)
    assert d["itl_ms"] == {"ms": 975.0, "engine": "fast", "workload": "b",
                           "unloaded_p99_ms": {"itl_ms": 25.0, "ttft_ms": 300.0}}
    assert showdown.derive_objectives([], 3.0) == {"ttft_ms": None, "itl_ms": None}
    # stated ones are kept as stated; each says where it came from
    entry = showdown.objectives_entry(Plan(slo=SLO(ttft_ms=2000.0), slo_factor=3.0), d)
    assert entry["ttft_ms"] == 2000.0 and entry["how"]["ttft_ms"] == {"stated": True}
    assert entry["itl_ms"] == 975.0 and entry["how"]["itl_ms"]["derived"]["engine"] == "fast"
    text = showdown.objectives_text(entry)
    assert "2,000 ms (stated)" in text
    assert "975 ms (derived: 3 x (p99 ITL 25 ms + p99 TTFT 300 ms), fast unloaded on b)" in text
    assert (showdown.objectives_text(showdown.objectives_entry(Plan()))
            == "no TTFT objective; no ITL objective")
    # a manifest written before objectives said where they came from
    assert showdown.objectives_text({"ttft_ms": 1000,
                                     "itl_ms": 100}) == "p99 TTFT ≤ 1,000 ms; p99 ITL ≤ 100 ms"
    assert Plan.quick().slo.ttft_ms is None and Plan.full().slo.itl_ms is None


def test_a_running_sglang_server_is_in_the_field_where_sglang_is_not_installed(monkeypatch):
    monkeypatch.setattr(showdown, "sglang_installed", lambda: False)
    assert "sglang" not in [c.label for c in showdown.default_field(gpu=False)]
    assert "sglang" in [c.label
                        for c in showdown.default_field(gpu=False, running={"sglang": object()})]
    monkeypatch.setattr(showdown, "sglang_installed", lambda: True)
    assert "sglang" in [c.label for c in showdown.default_field(gpu=False)]


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
                probe_concurrency=12, slo_factor=10.0,
                workload_args={"shared-prefix": {"system_prompt_len": 16, "question_len": 4,
                                                 "output_len": 2}})
    t0 = time.monotonic()
    show = showdown.run_showdown(tmp_path / "sd", [fast, slow, broken], plan, model="mock",
                                 mode="quick",
                                 command="test", progress=False, log=lambda s: None,
                                 start_timeout_s=60)
    m = json.loads((tmp_path / "sd" / "showdown.json").read_text())
    assert m["format"] == showdown.FORMAT and m["command"] == "test" and m["machine"]["cores"] >= 1
    runs = {(r["engine"], r["workload"]): r for r in m["runs"]}
    assert runs[("fast", "shared-prefix")]["status"] == "ok"
    assert runs[("slow", "shared-prefix")]["status"] == "ok"
    assert runs[("broken", "shared-prefix")]["folder"] is None
    assert m["engines"]["broken"]["status"].startswith("did not start")
    # no objective stated: both derived from the synchronous probes, and every sweep judged by them
    unloaded = {e: json.loads((tmp_path / "sd" / e / "shared-prefix" / "probe-synchronous"
                               / "summary.json").read_text()) for e in ("fast", "slow")}
    for key, terms in showdown.DERIVED_FROM.items():
        derived = m["slo"]["how"][key]["derived"]
        base = {e: sum(unloaded[e][t]["p99"] for t in terms) for e in unloaded}
        best = min(base, key=base.get)
        assert (derived["engine"], derived["workload"]) == (best, "shared-prefix")
        assert m["slo"][key] == pytest.approx(10.0 * base[best])
        for e in ("fast", "slow"):
            cfg = json.loads((tmp_path / "sd" / e / "shared-prefix" / "sweep.json")
                             .read_text())["config"]
            assert cfg[f"slo_{key}"] == m["slo"][key]
    from workshop.finale import decision
    sweeps = decision.load(tmp_path / "sd").sweeps()["shared-prefix"]
    assert set(sweeps) == {"fast", "slow"}
    note = {e: s.knee_note() + "\n" + s.table() for e, s in sweeps.items()}
    # capacities 8/0.2 = 40 and 2/0.2 = 10 requests/s: the fast knee lies well above the slow one
    assert sweeps["fast"].knee_offered and sweeps["slow"].knee_offered, note
    assert sweeps["fast"].knee_offered > 2 * sweeps["slow"].knee_offered, note
    assert sweeps["slow"].knee_offered <= 1.3 * 10, note
    assert show.root == tmp_path / "sd" and time.monotonic() - t0 < 240


def test_a_label_names_this_machines_contender():
    # "vllm" is in both fields; on a CPU the CPU field's request cap must not be lost
    cpu = showdown.known_contenders(gpu=False)
    assert cpu["vllm"].server_args == ("--", "--max-num-seqs", str(showdown.MAX_RUNNING))
    assert "mini-radix" in cpu and "vllm-tuned" in cpu
    assert showdown.known_contenders(gpu=True)["vllm"].server_args == ()


def test_workloads_are_described_before_any_engine_sees_them():
    from workshop.bench.tokenizer import Tokenizer

    plan = showdown.Plan.quick()
    rows, seqs = showdown.describe_workloads(plan, Tokenizer.load("smollm2-135m"))
    (row,) = rows
    assert row["workload"] == "shared-prefix" and row["requests"] == len(seqs["shared-prefix"])
    assert 0 < row["prefix reuse"] < 1 and row["mean prompt (tok)"] > row["mean output (tok)"] > 0
    prompt, reply = seqs["shared-prefix"][0]
    assert len(prompt) > 0 and len(reply) > 0


def test_the_field_says_which_servers_run_already():
    rows = showdown.field_rows(showdown.CPU_FIELD, {"vllm"})
    by = {r["label"]: r for r in rows}
    assert by["vllm"]["server"] == "already running" and by["mini-hash"]["server"] == "started here"
    assert by["hf"]["server args"] == "(defaults)"
