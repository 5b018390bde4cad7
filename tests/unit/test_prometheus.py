"""The one Prometheus parser, and the metric names it shares with the server that writes them."""

from __future__ import annotations

from reference_server import prometheus as P
from reference_server.engines.local import EngineStats
from reference_server.exported_metrics import EngineMetrics, ServerMetrics

PROM = """\
# HELP vllm:num_requests_running Number of requests running.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="a"} 2.0
vllm:num_requests_running{engine="1",model_name="a"} 1.0
vllm:kv_cache_usage_perc{engine="0",model_name="a",le="x}y"} 0.25
vllm:time_to_first_token_seconds_bucket{le="+Inf"} 7
vllm:cache_config_info{block_size="128",cache_dtype="auto",note="say \\"hi\\"",num_gpu_blocks="364"} 1.0
plain_counter_total 3 1700000000000
broken_line
unclosed{a="1" 4
nan_gauge NaN
"""  # noqa: E501 (metrics text as servers write it: its lines are not ours to wrap)


def test_parse_keeps_labels_and_skips_junk():
    samples = P.parse(PROM)
    running = [s for s in samples if s.name == P.NUM_REQUESTS_RUNNING]
    assert [(s.labels["engine"], s.value) for s in running] == [("0", 2.0), ("1", 1.0)]
    kv = next(s for s in samples if s.name == P.KV_CACHE_USAGE)
    assert kv.labels == {"engine": "0", "model_name": "a", "le": "x}y"} and kv.value == 0.25
    names = {s.name for s in samples}
    assert "broken_line" not in names and "unclosed" not in names and "nan_gauge" not in names


def test_totals_sum_label_sets_and_ignore_timestamps():
    m = P.totals(PROM)
    assert m[P.NUM_REQUESTS_RUNNING] == 3.0
    assert m["vllm:time_to_first_token_seconds_bucket"] == 7
    assert m["plain_counter_total"] == 3
    assert P.first(m, ("absent", P.NUM_REQUESTS_RUNNING)) == 3.0
    assert P.first(m, ("absent",)) is None


def test_info_gauge_labels():
    info = P.labels_of(PROM, P.CACHE_CONFIG_INFO)
    assert info["block_size"] == "128" and info["num_gpu_blocks"] == "364"
    assert info["note"] == 'say "hi"'
    assert P.labels_of("vllm:num_requests_running 0\n", P.CACHE_CONFIG_INFO) == {}


def test_the_server_writes_the_names_readers_look_for():
    engine = EngineMetrics("m")
    engine.prompt_tokens.inc(5)
    engine.requests_success.labels("stop").inc()
    engine.ttft.observe(0.1)
    server = ServerMetrics()
    server.requests.labels("/v1/completions", "200").inc()
    text = engine.render(EngineStats(num_running=1, num_waiting=2, kv_cache_usage=0.5)) \
        + server.render()
    m = P.totals(text)
    for name in (P.NUM_REQUESTS_RUNNING, P.NUM_REQUESTS_WAITING, P.KV_CACHE_USAGE,
                 P.PREFIX_CACHE_QUERIES, P.PREFIX_CACHE_HITS, P.NUM_PREEMPTIONS,
                 P.PROMPT_TOKENS, P.GENERATION_TOKENS, P.REQUEST_SUCCESS,
                 P.TIME_TO_FIRST_TOKEN + "_count", P.INTER_TOKEN_LATENCY + "_bucket",
                 P.E2E_REQUEST_LATENCY + "_sum", P.SERVER_REQUESTS, P.SERVER_IN_FLIGHT,
                 P.SERVER_CLIENT_DISCONNECTS, P.SERVER_ENGINE_UP):
        assert name in m, name
    assert (m[P.NUM_REQUESTS_WAITING], m[P.KV_CACHE_USAGE], m[P.PROMPT_TOKENS]) == (2, 0.5, 5)
    labelled = [s for s in P.parse(text) if s.name == P.SERVER_REQUESTS]
    assert labelled[0].labels == {"endpoint": "/v1/completions", "status": "200"}


def test_metric_names_are_spelled_only_in_prometheus_py():
    """No vLLM or SGLang metric name as a string literal outside reference_server/prometheus.py."""
    import ast
    import re
    from pathlib import Path

    root = Path(__file__).parents[2]
    name = re.compile(r"\b(?:vllm|sglang):[a-z_]+")
    inline = []
    for package in ("reference_server", "workshop", "mini_engine"):
        for path in sorted((root / package).rglob("*.py")):
            if path == root / "reference_server" / "prometheus.py":
                continue
            tree = ast.parse(path.read_text())
            docstrings = {id(n.value) for n in ast.walk(tree)
                          if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)}
            inline += [f"{path.relative_to(root)}:{n.lineno}: {n.value!r}" for n in ast.walk(tree)
                       if isinstance(n, ast.Constant) and isinstance(n.value, str)
                       and id(n) not in docstrings and name.search(n.value)]
    assert not inline, "\n".join(inline)


def test_without_drops_a_family_with_its_comments():
    page = ("# HELP reference_server_engine_up Up.\n# TYPE reference_server_engine_up gauge\n"
            "reference_server_engine_up 1.0\n" + PROM)
    kept = P.without(page, P.SERVER_PREFIX)
    assert P.SERVER_PREFIX not in kept
    assert kept == PROM
    assert P.without("", P.SERVER_PREFIX) == ""
