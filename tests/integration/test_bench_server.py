"""The harness against the real reference server (fixture ``vllm_server`` from tests/conftest.py).

Short runs only (the engine is a 135M model on a few CPU cores): a closed-loop random run,
an agentic session with a fork, and the results folder they leave.
"""

import pytest

from workshop.bench import BenchResult, run_benchmark

pytestmark = pytest.mark.engine


def test_random_run_counts_every_token(vllm_server, tmp_path):
    res = run_benchmark(vllm_server.base_url, vllm_server.model, "random", num_requests=6,
                        concurrency=2,
                        api_key=vllm_server.api_key, seed=0, warmup=1, progress=False,
                        output_dir=str(tmp_path / "random"), input_len=32, output_len=8,
                        label="reference")
    s = res.summary
    assert s["errors"] == 0, s["error_kinds"]
    assert s["completed"] == 6
    measured = [r for r in res.records if not r.warmup]
    # ignore_eos + max_tokens control the output length; usage reports the prompt as sent
    assert [r.output_tokens for r in measured] == [8] * 6
    assert [r.prompt_tokens for r in measured] == [32] * 6
    for r in measured:
        assert r.scheduled <= r.sent <= r.first_token <= r.end
        assert 1 <= len(r.chunk_times) <= 8
    assert s["total_output_tokens"] == 48
    assert s["ttft_ms"]["p99"] <= s["e2e_ms"]["p99"]
    assert 0 < s["mean_concurrency"] <= 2.0 + 1e-9
    assert "metrics_available" in s["server"]
    back = BenchResult.load(tmp_path / "random")
    assert back.records == res.records and back.summary["completed"] == 6


def test_agentic_session_is_dependent_and_reuses_prefixes(vllm_server):
    res = run_benchmark(vllm_server.base_url, vllm_server.model, "agentic", num_requests=8,
                        concurrency=1,
                        api_key=vllm_server.api_key, seed=0, warmup=0, progress=False,
                        num_sessions=1,
                        system_prompt_len=200, main_turns=2, fork_at=[0], branches=2,
                        branch_turns=1,
                        turn_output=(6, 10), tool_result_len=(10, 20), summary_output=8,
                        final_output=8)
    s = res.summary
    assert s["errors"] == 0, s["error_kinds"]
    assert s["completed"] == 2 + 2 * 2 + 2
    by_tag = {r.tag: r for r in res.records}
    # each later request carries the earlier history, so its prompt is longer...
    assert by_tag["main1-0"].prompt_tokens > by_tag["main0-0"].prompt_tokens
    assert by_tag["review"].prompt_tokens > by_tag["propose"].prompt_tokens
    # ...and is sent only after the reply it depends on has ended
    assert by_tag["fork0-branch0-0"].sent >= by_tag["main0-0"].end
    assert by_tag["main1-0"].sent >= max(by_tag["fork0-branch0-summary"].end,
                                         by_tag["fork0-branch1-summary"].end)
    assert by_tag["review"].sent >= by_tag["propose"].end
    # computed from the requests actually sent (real replies included)
    assert s["workload"]["requests"] == 8
    assert s["workload"]["prefix_reuse_ratio"] > 0.5


def test_harness_measures_through_a_remote_engine(remote_server, tmp_path):
    """The harness reads a remote engine like any other: its requests, the server's metrics
    (the upstream's, under vLLM's names) and what the server says it is."""
    res = run_benchmark(remote_server.base_url, remote_server.model, "random", num_requests=4,
                        concurrency=2, api_key=remote_server.api_key, seed=0, warmup=0,
                        progress=False, output_dir=str(tmp_path / "remote"), input_len=16,
                        output_len=4, label="remote")
    s = res.summary
    assert s["errors"] == 0, s["error_kinds"]
    assert [r.output_tokens for r in res.records] == [4] * 4
    assert s["server"]["metrics_available"] and s["server"]["peak_kv_usage"] is not None
    assert res.environment["server"]["engine"] == "reference-remote"
