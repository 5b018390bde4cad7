"""``workshop.bench.iterations`` reads vLLM's per-step log lines and the teaching engine's
copy of them, and splits the steps into decode-only and mixed ones."""

from __future__ import annotations

import logging

import pytest

from workshop.bench import iterations

# As vLLM 0.32 logs them with --enable-logging-iteration-details (a served agentic run's log)
VLLM_LOG = """\
(APIServer pid=101) INFO 12-04 23:41:02 [loggers.py:199] Iteration(40): 0 context requests, \
0 context tokens, 8 generation requests, 8 generation tokens, iteration elapsed time: \
147.91 ms, cpu KV cache usage: 4.1%
(APIServer pid=101) INFO 12-04 23:41:02 [loggers.py:257] Engine 000: Avg prompt throughput: 1.0
(APIServer pid=101) INFO 12-04 23:41:03 [loggers.py:199] Iteration(41): 1 context requests, \
178 context tokens, 7 generation requests, 7 generation tokens, iteration elapsed time: \
1030.20 ms, cpu KV cache usage: 4.3%
(APIServer pid=101) INFO 12-04 23:41:03 [loggers.py:199] Iteration(42): 0 context requests, \
0 context tokens, 8 generation requests, 8 generation tokens, iteration elapsed time: \
150.09 ms, cpu KV cache usage: 4.3%
(APIServer pid=101) INFO 12-04 23:41:03 [loggers.py:199] Iteration(43): 0 context requests, \
0 context tokens, 3 generation requests, 3 generation tokens, iteration elapsed time: \
90.00 ms, cpu KV cache usage: 4.3%
"""


def test_parse_reads_vllm_lines_and_skips_the_rest():
    steps = iterations.parse(VLLM_LOG)
    assert [s.index for s in steps] == [40, 41, 42, 43]
    assert steps[1] == iterations.Iteration(41, 1, 178, 7, 7, 1030.2)


def test_by_kind_splits_decode_only_from_mixed_steps():
    kinds = iterations.by_kind(iterations.parse(VLLM_LOG))
    assert kinds["decode-only"]["steps"] == 3
    assert kinds["decode-only"]["seconds"] == pytest.approx((147.91 + 150.09 + 90.0) / 1e3)
    assert kinds["decode-only"]["common_batch"] == 8
    assert kinds["decode-only"]["common_batch_median_ms"] == pytest.approx(149.0)
    assert kinds["mixed"] == {"steps": 1, "seconds": pytest.approx(1.0302), "median_ms": 1030.2,
                              "median_context_tokens": 178}
    table = iterations.table({"vllm": kinds, "mini": {}})
    assert "vllm" in table and "mini" in table


def test_the_teaching_engine_logs_the_same_line(caplog):
    from mini_engine import LLMEngine, SamplingParams
    from reference_server.models import ModelError, resolve_model
    try:
        path = resolve_model("smollm2-135m", prepare=False).path
    except ModelError as exc:
        pytest.skip(f"bundled model not prepared: {exc}")
    eng = LLMEngine(path, kv_cache_gib=0.02, num_threads=1, max_num_batched_tokens=16,
                    log_iteration_details=True)
    params = SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True)
    with caplog.at_level(logging.INFO, logger="mini_engine"):
        eng.generate([list(range(100, 120)), list(range(200, 205))], params)
    steps = iterations.parse(caplog.text)
    # A 20-token and a 5-token prompt under a 16-token budget, then decodes
    assert [(s.context_requests, s.context_tokens) for s in steps[:2]] == [(1, 16), (2, 9)]
    assert sum(s.generation_tokens for s in steps) == 2 * 3 - 2   # the first tokens come
    assert [s.index for s in steps] == list(range(1, len(steps) + 1))  # from the prefills
    assert all(s.ms > 0 for s in steps)
    assert iterations.by_kind(steps)["mixed"]["steps"] == 2
