"""Disaggregated prefill and decode (notebook 17) over real processes: the KV hand-off gives
the colocated engine's greedy tokens, the bytes counted are the KV size formula's, and a
decode process that dies mid-request is reported at once instead of hanging the caller."""

from __future__ import annotations

import time

import pytest

from workshop.fleet import disaggregation as dg

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def engine():
    from mini_engine import LLMEngine
    from reference_server.models import resolve_model
    return LLMEngine(resolve_model("smollm2-135m").path, kv_cache_gib=0.05, num_threads=1)


@pytest.fixture(scope="module")
def workload(engine):
    return dg.make_workload(engine.runner.cfg.vocab_size, streams=2, stream_prompt=16,
                            stream_tokens=8, long_prompts=1, long_len=80, long_tokens=6,
                            first_arrival_s=0.2)


@pytest.fixture(scope="module")
def disaggregated(workload):
    return dg.run_setup("disaggregated", workload, kv_cache_gib=0.05)


def test_disaggregated_decode_gives_the_colocated_engines_greedy_tokens(engine, workload,
                                                                         disaggregated):
    from mini_engine import SamplingParams
    colocated = engine.generate([r.prompt for r in workload],
                                [SamplingParams(max_tokens=r.max_tokens, ignore_eos=True)
                                 for r in workload])
    assert {r.request_id: toks for r, toks in zip(workload, colocated)} == disaggregated.tokens
    # every request went through the hand-off: first token from the prefill process, the rest
    # from the decode process
    assert sorted(h["request_id"] for h in disaggregated.handoffs) == sorted(
        r.request_id for r in workload)
    roles = {p["role"]: p for p in disaggregated.processes}
    assert roles["prefill"]["generated_tokens"] == len(workload)
    assert roles["decode"]["generated_tokens"] == sum(r.max_tokens - 1 for r in workload)


def test_kv_bytes_counted_are_the_kv_size_formula(engine, workload, disaggregated):
    cfg = engine.runner.cfg
    per_token = 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * \
        engine.runner.model.dtype.itemsize
    assert per_token == engine.runner.kv_bytes_per_token()
    prompts = {r.request_id: len(r.prompt) for r in workload}
    for h in disaggregated.handoffs:
        # the prompt's KV moves; the first token's is computed by the decode process
        assert h["kv_tokens"] == prompts[h["request_id"]]
        assert h["kv_bytes"] == per_token * prompts[h["request_id"]]
        assert h["receive_s"] is not None
    row = next(r for r in dg.summary_rows([disaggregated], 1e9, 1e9))
    assert row["KV bytes per request"] == per_token * sum(prompts.values()) / len(prompts)
    assert row["met objective"] == f"{len(workload)} of {len(workload)}"


def test_a_decode_process_dying_mid_request_is_a_clear_error_not_a_hang(engine):
    work = dg.make_workload(engine.runner.cfg.vocab_size, streams=1, stream_prompt=16,
                            stream_tokens=400, long_prompts=0)
    killed = {"tokens": 0}

    def kill_after_decoding(cluster, request_id, tokens):
        killed["tokens"] += len(tokens)      # the first from the prefill process, then decodes
        if killed["tokens"] >= 3 and "at" not in killed:
            killed["at"] = time.monotonic()
            cluster.processes["decode"].kill()

    cluster = dg.Cluster("disaggregated", kv_cache_gib=0.05).start()
    try:
        with pytest.raises(dg.WorkerDied,
                           match=r"the decode process .* died .*unfinished.*stream-0"):
            cluster.run(work, stall_s=30, timeout_s=60, on_tokens=kill_after_decoding)
        assert time.monotonic() - killed["at"] < 5
    finally:
        cluster.close()
    assert not any(p.is_alive() for p in cluster.processes.values())


def test_a_prefill_process_dying_is_named_as_such(engine):
    work = dg.make_workload(engine.runner.cfg.vocab_size, streams=1, stream_prompt=16,
                            stream_tokens=400, long_prompts=1, long_len=32, first_arrival_s=30)

    def kill_prefill(cluster, request_id, tokens):
        if cluster.processes["prefill"].is_alive():
            cluster.processes["prefill"].kill()

    with dg.Cluster("disaggregated", kv_cache_gib=0.05) as cluster:
        with pytest.raises(dg.WorkerDied, match=r"the prefill process .* died with exit code -9"):
            cluster.run(work, stall_s=30, timeout_s=60, on_tokens=kill_prefill)
