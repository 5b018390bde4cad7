"""Pure logic behind notebooks 0 and 1: session plumbing, metrics parsing, timing, KV usage,
prompt latency and the engine comparison."""

from __future__ import annotations

import json as _json
import math
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from reference_server.model_config import read_arch
from workshop import hardware, session, ui
from workshop.live import (
    engine_comparison,
    kv_usage,
    live_requests,
    metrics_sampler,
    probe,
    prompt_latency,
)

# -- session -----------------------------------------------------------------------------------

def test_quick_mode_follows_the_environment(monkeypatch):
    monkeypatch.delenv("WORKSHOP_QUICK", raising=False)
    assert not session.quick() and session.sweep([1, 2, 4], [1]) == [1, 2, 4]
    for on in ("1", "true", "YES"):
        monkeypatch.setenv("WORKSHOP_QUICK", on)
        assert session.quick() and session.sweep([1, 2, 4], [1]) == [1]
    monkeypatch.setenv("WORKSHOP_QUICK", "0")
    assert not session.quick()


def test_env_names_per_engine():
    assert session.env_names("vllm") == ("WORKSHOP_BASE_URL", "WORKSHOP_API_KEY")
    assert session.env_names("hf") == ("WORKSHOP_HF_BASE_URL", "WORKSHOP_HF_API_KEY")


def test_the_remote_engine_fronts_workshop_upstream_url():
    url = {"WORKSHOP_UPSTREAM_URL": " http://gpu:8000/v1 "}
    assert session.upstream_args(url) == ["--upstream", "http://gpu:8000/v1"]
    for env in ({}, {"WORKSHOP_UPSTREAM_URL": " "}):
        with pytest.raises(ValueError, match="set WORKSHOP_UPSTREAM_URL"):
            session.upstream_args(env)


def test_default_engine_follows_workshop_engine():
    assert session.default_engine({}) == "vllm"
    assert session.default_engine({"WORKSHOP_ENGINE": ""}) == "vllm"
    assert session.default_engine({"WORKSHOP_ENGINE": " SGLang "}) == "sglang"
    assert session.default_engine({"WORKSHOP_ENGINE": "hf"}) == "hf"
    assert session.default_engine({"WORKSHOP_ENGINE": "remote"}) == "remote"
    with pytest.raises(ValueError, match="WORKSHOP_ENGINE='tgi'.*vllm, hf, sglang, mini"):
        session.default_engine({"WORKSHOP_ENGINE": "tgi"})


def test_engine_display_names():
    assert session.engine_name("sglang") == "SGLang" and session.engine_name("vllm") == "vLLM"
    assert session.engine_name("other") == "other"
    s = session.Session(base_url="http://h", api_key=None, model="m", engine="sglang")
    assert s.engine_name == "SGLang"


def test_a_second_engine_beside_the_session_only_where_named_or_worth_starting(monkeypatch):
    """In quick mode (CI) an engine joins only where its variable names a server: starting
    one would cost minutes; outside quick mode it joins where it is installed."""
    started = []
    monkeypatch.setattr(session, "connect", lambda engine: started.append(engine) or engine)
    monkeypatch.delenv("WORKSHOP_SGLANG_BASE_URL", raising=False)
    monkeypatch.setenv("WORKSHOP_QUICK", "1")
    assert session.beside("sglang") is None and started == []
    monkeypatch.setenv("WORKSHOP_SGLANG_BASE_URL", "http://127.0.0.1:9")
    assert session.beside("sglang") == "sglang"
    monkeypatch.delenv("WORKSHOP_SGLANG_BASE_URL")
    monkeypatch.delenv("WORKSHOP_QUICK")
    monkeypatch.setattr(session, "installed", lambda engine: False)
    assert session.beside("sglang") is None
    monkeypatch.setattr(session, "installed", lambda engine: True)
    assert session.beside("sglang") == "sglang"

def test_connect_without_server_and_without_start_fails_clearly(monkeypatch):
    monkeypatch.delenv("WORKSHOP_BASE_URL", raising=False)
    monkeypatch.delenv("WORKSHOP_ENGINE", raising=False)
    with pytest.raises(RuntimeError, match="no vllm server"):
        session.connect(port=1, start=False, verbose=False)


def test_hardware_line_names_the_cpu():
    line = hardware.hardware()
    assert "CPU" in line and "cores" in line
    kind = hardware.cpu_kind()
    assert kind is None or f"({kind})" in line


def test_cpu_kind_is_named_by_its_strongest_feature():
    # the three kinds of CPU this course is measured on, and one with none of the features
    assert hardware.cpu_kind(["amx_bf16", "avx512_bf16", "avx512f", "avx2"]) == "AMX"
    assert hardware.cpu_kind(["avx512_bf16", "avx512f", "avx2"]) == "AVX-512, native bf16"
    assert hardware.cpu_kind(["avx512f", "avx2"]) == "AVX-512"
    assert hardware.cpu_kind(["avx2"]) == "AVX2"
    assert hardware.cpu_kind([]) is None


# -- metrics -----------------------------------------------------------------------------------

def test_sampler_records_a_gauge_while_it_changes():
    value = {"g": 0.0}
    with metrics_sampler.MetricsSampler(lambda: dict(value), ("g", "absent"), interval=0.01) as s:
        time.sleep(0.05)
        value["g"] = 0.7
        time.sleep(0.05)
        value["g"] = 0.0
        time.sleep(0.03)
    assert s.samples.peak("g") == pytest.approx(0.7)
    assert s.samples.peak("absent") == 0.0
    assert len(s.samples.times) == len(s.samples.values["g"]) >= 5


def test_sampler_survives_a_failing_reader():
    calls = {"n": 0}

    def flaky():
        calls["n"] += 1
        if calls["n"] % 2:
            raise ConnectionError("boom")
        return {"g": 1.0}

    with metrics_sampler.MetricsSampler(flaky, ("g",), interval=0.01) as s:
        time.sleep(0.08)
    assert s.samples.errors >= 1 and s.samples.peak("g") == 1.0


# -- probe -------------------------------------------------------------------------------------

def test_decode_rate_excludes_the_first_token():
    # first token at 0.5 s, 10 tokens, end at 1.4 s -> 9 tokens in 0.9 s
    assert probe.decode_rate([0.5, 0.6], 10, 1.4) == pytest.approx(10.0)
    assert probe.decode_rate([], 10, 1.0) is None
    assert probe.decode_rate([0.5], 1, 1.0) is None
    assert probe.decode_rate([0.5], 5, 0.5) is None


def test_stream_timing_prefers_the_server_token_count():
    t = probe.StreamTiming(chunk_times=[0.2, 0.3, 0.4], end=0.4, completion_tokens=5)
    assert t.ttft == 0.2 and t.tokens == 5
    assert t.decode_tokens_per_s == pytest.approx(4 / 0.2)
    assert probe.StreamTiming(chunk_times=[0.2, 0.3], end=0.3).tokens == 2


def test_summarize_reports_median_and_spread():
    runs = [probe.StreamTiming(chunk_times=[a, a + 0.1], end=a + 0.1, completion_tokens=2)
            for a in (0.1, 0.3, 0.2)]
    s = probe.summarize(runs)
    assert s["ttft_ms_median"] == pytest.approx(200)
    assert s["ttft_ms_min"] == pytest.approx(100) and s["ttft_ms_max"] == pytest.approx(300)
    assert s["decode_tok_s_median"] == pytest.approx(10)


class _Chunk:
    def __init__(self, text=None, usage=None, finish=None):
        delta = type("D", (), {"content": text})()
        self.choices = [] if text is None and finish is None else [
            type("C", (), {"delta": delta, "finish_reason": finish})()]
        self.usage = usage


class _FakeClient:
    """Just enough of openai.OpenAI for stream_chat."""

    def __init__(self, chunks):
        self.chunks = chunks
        self.chat = type("Chat", (), {"completions": self})()
        self.kwargs = None

    def create(self, **kwargs):
        self.kwargs = kwargs
        for c in self.chunks:
            time.sleep(0.01)
            yield c


def test_stream_chat_times_text_chunks_and_reads_usage():
    usage = type("U", (), {"prompt_tokens": 7, "completion_tokens": 3})()
    client = _FakeClient([_Chunk("Hel"), _Chunk(""), _Chunk("lo"), _Chunk(finish="stop"),
                          _Chunk(usage=usage)])
    t = probe.stream_chat(client, "m", [{"role": "user", "content": "hi"}], max_tokens=5)
    assert t.text == "Hello" and len(t.chunk_times) == 2   # the empty chunk is not a token
    assert t.prompt_tokens == 7 and t.tokens == 3 and t.finish_reason == "stop"
    assert t.chunk_times[0] < t.chunk_times[1] <= t.end
    assert client.kwargs["stream_options"] == {"include_usage": True}


def test_info_rows_put_known_fields_first():
    rows = probe.info_rows({"zzz": 1, "engine": "vllm", "max_model_len": 2048})
    assert [r["field"] for r in rows] == ["engine", "max_model_len", "zzz"]


# -- ui ------------------------------------------------------------------------------------------

def test_controls_outside_a_notebook_are_fixed_defaults():
    assert ui.frontend() == "script"
    assert ui.slider(1, 10, 4, label="n").value == 4
    assert ui.dropdown(["a", "b"], "b").value == "b"
    assert ui.text("hi").value == "hi"
    assert list(ui.progress([1, 2, 3], title="t")) == [1, 2, 3]


def test_markdown_table_formats_and_escapes():
    text = ui.markdown_table([{"a": 1.23456, "b": "x|y", "c": None}])
    assert text.splitlines() == ["| a | b | c |", "|---|---|---|", "| 1.23 | x\\|y |  |"]
    assert ui.markdown_table([]) == "_(no rows)_"


# -- kv_usage: the gauge's block arithmetic --------------------------------------------------------

SMOL = {"num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3,
        "hidden_size": 576, "torch_dtype": "bfloat16"}


def _server_kv(config: dict, dtype: str = "bfloat16", capacity: int = 1024, block: int = 16):
    return kv_usage.ServerKV(arch=read_arch(config), dtype=dtype, capacity_tokens=capacity,
                             block_size=block)


def test_server_kv_bytes_match_the_known_smollm2_figure():
    kv = _server_kv(SMOL)
    assert kv.arch.head_dim == 64 and kv.arch.num_kv_heads == 3 and kv.dtype_bytes == 2
    assert kv.bytes_per_token == 23_040          # 2 x 30 x 3 x 64 x 2
    assert kv.usable_bytes == (1024 // 16 - 1) * 16 * 23_040


def test_server_kv_uses_kv_heads_not_attention_heads_and_explicit_head_dim():
    assert _server_kv(dict(SMOL, num_key_value_heads=None)).bytes_per_token == 2 * 30 * 9 * 64 * 2
    assert _server_kv(dict(SMOL, head_dim=128), "fp8").bytes_per_token == 2 * 30 * 3 * 128 * 1
    with pytest.raises(ValueError, match="unknown dtype"):
        _ = _server_kv(SMOL, "int3").bytes_per_token


def test_server_kv_reads_the_served_config_and_resolves_auto(tmp_path):
    # A server started with --dtype auto reports "auto": the config's torch_dtype decides.
    (tmp_path / "config.json").write_text(_json.dumps(dict(SMOL, torch_dtype="float32")))

    class FakeSession:
        model = "smol"
        info = {"model_path": str(tmp_path), "dtype": "auto", "kv_capacity_tokens": 4096,
                "block_size": 32, "kv_bytes_per_token": 46_080}

    kv = kv_usage.server_kv(FakeSession())
    assert kv.dtype == "float32" and kv.bytes_per_token == 2 * 30 * 3 * 64 * 4
    assert (kv.capacity_tokens, kv.block_size, kv.reported_bytes_per_token) == (4096, 32, 46_080)


def test_blocks_round_up():
    assert [kv_usage.blocks_for(t, 16) for t in (0, 1, 16, 17, 32)] == [0, 1, 1, 2, 2]


def test_predicted_usage_counts_whole_blocks_per_request():
    # 1600 tokens in 16-token blocks = 100 blocks, one reserved: the gauge's 100% is 99 blocks.
    # two requests of 17 tokens: 2 blocks each
    assert kv_usage.predicted_usage([17, 17], 16, 1600) == pytest.approx(4 / 99)
    # the same 34 tokens in one request need only 3 blocks
    assert kv_usage.predicted_usage([34], 16, 1600) == pytest.approx(3 / 99)
    assert kv_usage.predicted_usage([34], 16, 1600, reserved=0) == pytest.approx(0.03)


def test_prediction_matches_vllms_gauge_on_this_server():
    # Measured on the reference server (46,592 tokens in 128-token blocks): one request
    # holding 192 tokens read 0.0055096 = 2/363 on vllm:kv_cache_usage_perc.
    assert kv_usage.predicted_usage([192], 128, 46_592) == pytest.approx(0.0055096, rel=1e-4)


def test_users_until_full():
    assert kv_usage.users_until_full(100, 16, 1600) == 99 // 7
    assert kv_usage.users_until_full(0, 16, 1600) == 99


def test_kv_plot_draws_the_block_steps():
    kv = _server_kv(SMOL, "bf16")
    rows = [{"tokens held": 40, "KV in use (MiB, derived)": 1.0,
             "predicted KV (MiB, formula)": 1.0}]
    fig = kv_usage.plot_kv(rows, "tokens held", "t", "tokens", kv=kv)
    steps = fig.axes[0].lines[0]
    ys = list(steps.get_ydata())
    assert len(set(ys)) >= 3      # 0, 1 block, 2 blocks, 3 blocks ...
    assert max(ys) == pytest.approx(4 * 16 * 23_040 / 2**20)


# -- engine_comparison -----------------------------------------------------------------------------

def test_speedup_factors_multiply_to_the_total():
    T = engine_comparison.Trial
    tput = {T("hf", 1): 20.0, T("hf", 8): 21.0, T("vllm", 1): 30.0, T("vllm", 8): 240.0}
    f = engine_comparison.speedup_factors(tput, 8)
    assert f["engine alone (both sequential)"] == pytest.approx(1.5)
    assert f["concurrency with batching (vllm)"] == pytest.approx(8.0)
    assert f["concurrency without batching (hf)"] == pytest.approx(1.05)
    assert f["total: vllm concurrent vs hf sequential"] == pytest.approx(12.0)
    assert math.isclose(f["engine alone (both sequential)"] * f["concurrency with batching (vllm)"],
                        f["total: vllm concurrent vs hf sequential"])
    assert f["like for like: both concurrent"] == pytest.approx(240 / 21)


def test_factor_rows_reads_benchmark_rows():
    rows = [{"engine": e, "in flight": c, "output tok/s": v}
            for e, c, v in (("hf", 1, 10.0), ("hf", 4, 10.0), ("vllm", 1, 20.0), ("vllm", 4, 60.0))]
    out = {r["comparison"]: r["speed-up (x)"] for r in engine_comparison.factor_rows(rows, 4)}
    assert out["total: vllm concurrent vs hf sequential"] == pytest.approx(6.0)


def test_factors_name_whichever_engine_was_compared():
    rows = [{"engine": e, "in flight": c, "output tok/s": v}
            for e, c, v in (("hf", 1, 10.0), ("hf", 4, 10.0), ("sglang", 1, 20.0),
                            ("sglang", 4, 60.0))]
    assert engine_comparison.compared_engine(rows) == "sglang"
    out = {r["comparison"]: r["speed-up (x)"] for r in engine_comparison.factor_rows(rows, 4)}
    assert out["concurrency with batching (sglang)"] == pytest.approx(3.0)
    assert out["total: sglang concurrent vs hf sequential"] == pytest.approx(6.0)
    ax = engine_comparison.plot_throughput(rows).axes[0]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["Hugging Face baseline (hf)",
                                                                    "SGLang"]
    with pytest.raises(ValueError, match="one engine"):
        engine_comparison.compared_engine(rows[:2])


def test_throughput_plot_has_one_legend_entry_per_engine():
    rows = [{"engine": e, "in flight": c, "output tok/s": v}
            for e, c, v in (("hf", 1, 10.0), ("hf", 4, 10.0), ("vllm", 1, 20.0), ("vllm", 4, 60.0))]
    ax = engine_comparison.plot_throughput(rows).axes[0]
    assert ax.get_title() and ax.get_ylabel()
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["Hugging Face baseline (hf)",
                                                                    "vLLM"]


# -- live_requests ---------------------------------------------------------------------------------

def test_run_together_really_overlaps():
    def slow(p: str) -> live_requests.Timed:
        time.sleep(0.2)
        return live_requests.Timed(end=0.2, prompt_tokens=len(p))

    t0 = time.perf_counter()
    out = live_requests.run_together(slow, ["a"] * 5)
    assert time.perf_counter() - t0 < 0.6 and len(out) == 5
    assert threading.active_count() >= 1


class _CompletionChunk:
    def __init__(self, text=None, usage=None):
        self.choices = [] if text is None else [type("C", (), {"text": text})()]
        self.usage = usage


class _FakeCompletions:
    def __init__(self, chunks=None, error=None):
        self.chunks, self.error, self.kwargs = chunks or [], error, None
        self.completions = self

    def create(self, **kwargs):
        self.kwargs = kwargs
        if self.error:
            raise self.error
        for c in self.chunks:
            time.sleep(0.01)
            yield c


def test_stream_completion_times_the_first_text_and_reads_usage():
    usage = type("U", (), {"prompt_tokens": 5, "completion_tokens": 2})()
    client = _FakeCompletions([_CompletionChunk(""), _CompletionChunk("a"), _CompletionChunk("b"),
                               _CompletionChunk(usage=usage)])
    t = live_requests.stream_completion(client, "m", "p", 2)
    assert t.error is None and 0.015 < t.ttft < t.end
    assert (t.prompt_tokens, t.completion_tokens) == (5, 2)
    assert client.kwargs["extra_body"] == {"ignore_eos": True}


def test_stream_completion_reports_a_failure_instead_of_raising():
    t = live_requests.stream_completion(_FakeCompletions(error=ConnectionError("down")), "m", "p",
                                        2)
    assert t.ttft is None and t.error == "ConnectionError: down"


# -- prompt_latency --------------------------------------------------------------------------------

def test_plots_have_titles_labels_and_legends():
    rows = [{"prompt tokens": n, "tokens held": n + 8, "KV in use (MiB, derived)": n / 40,
             "predicted KV (MiB, formula)": n / 40, "TTFT (ms)": n / 10, "error": ""}
             for n in (100, 200)]
    for fig in (kv_usage.plot_kv(rows, "tokens held", "t", "tokens"),
                prompt_latency.plot_ttft(rows, 2048)):
        ax = fig.axes[0]
        assert ax.get_title() and ax.get_xlabel() and ax.get_ylabel()
        assert ax.get_legend() is not None


def test_ttft_slope_fits_a_line_and_needs_two_lengths():
    rows = [{"prompt tokens": n, "TTFT (ms)": 50 + 0.2 * n, "error": ""} for n in (100, 500, 900)]
    rows.append({"prompt tokens": 300, "TTFT (ms)": 1e9, "error": "Timeout"})  # ignored
    per_1k, at_zero = prompt_latency.ttft_slope(rows)
    assert per_1k == pytest.approx(200) and at_zero == pytest.approx(50)
    assert prompt_latency.ttft_slope(rows[:1]) is None


# -- session.connect against a stand-in server -----------------------------------------------------

def _fake_server(info: dict | None, api_key: str | None = None):
    """A server answering the few GETs connect() makes; info=None plays vLLM's own server."""

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):  # keep test output quiet
            pass

        def do_GET(self):
            if api_key and self.headers.get("Authorization") != f"Bearer {api_key}":
                return self._send(401, {"error": "unauthorized"})
            if self.path == "/server_info" and info is not None:
                return self._send(200, info)
            if self.path == "/ready" and info is not None:
                return self._send(200, {"status": "ready"})
            if self.path == "/health":
                return self._send(200, {})
            if self.path == "/v1/models":
                return self._send(200, {"data": [{"id": "served-name", "root": "/models/x",
                                                  "max_model_len": 4096}]})
            return self._send(404, {"error": "not found"})

        def _send(self, code, body):
            data = _json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


@pytest.fixture
def clean_env(monkeypatch):
    for var in ("WORKSHOP_BASE_URL", "WORKSHOP_API_KEY", "WORKSHOP_HF_BASE_URL",
                "WORKSHOP_HF_API_KEY", "WORKSHOP_SGLANG_BASE_URL", "WORKSHOP_SGLANG_API_KEY",
                "WORKSHOP_MODEL", "WORKSHOP_ENGINE"):
        monkeypatch.delenv(var, raising=False)
    return monkeypatch


def test_connect_uses_the_environment_and_the_api_key(clean_env, capsys):
    info = {"engine": "vllm", "engine_version": "0.0", "model": "smol", "model_path": "/m",
            "dtype": "bfloat16", "device": "cpu", "max_model_len": 2048,
            "kv_capacity_tokens": 1000}
    srv = _fake_server(info, api_key="k")
    try:
        clean_env.setenv("WORKSHOP_BASE_URL", f"http://127.0.0.1:{srv.server_port}/")
        clean_env.setenv("WORKSHOP_API_KEY", "k")
        s = session.connect()
        assert s.model == "smol" and s.api_key == "k" and s.process is None
        assert s.base_url == f"http://127.0.0.1:{srv.server_port}" and s.v1.endswith("/v1")
        out = capsys.readouterr().out
        assert "vllm 0.0" in out and "$WORKSHOP_BASE_URL" in out and "KV capacity=1000" in out
        s.stop()   # not ours to stop: must leave the server alone
        assert session._answers(s.base_url, "k")
    finally:
        srv.shutdown()


def test_connect_engine_specific_variables(clean_env):
    srv = _fake_server({"engine": "hf", "model": "smol"})
    try:
        clean_env.setenv("WORKSHOP_BASE_URL", "http://127.0.0.1:1")   # must not be used for hf
        clean_env.setenv("WORKSHOP_HF_BASE_URL", f"http://127.0.0.1:{srv.server_port}")
        s = session.connect(engine="hf", verbose=False)
        assert s.engine == "hf" and s.how == "$WORKSHOP_HF_BASE_URL"
    finally:
        srv.shutdown()


def test_connect_takes_its_engine_from_workshop_engine(clean_env):
    srv = _fake_server({"engine": "sglang", "model": "smol"}, api_key="sk")
    try:
        clean_env.setenv("WORKSHOP_ENGINE", "sglang")
        clean_env.setenv("WORKSHOP_BASE_URL", "http://127.0.0.1:1")   # vLLM's: not for sglang
        clean_env.setenv("WORKSHOP_SGLANG_BASE_URL", f"http://127.0.0.1:{srv.server_port}")
        clean_env.setenv("WORKSHOP_SGLANG_API_KEY", "sk")
        s = session.connect(verbose=False)
        assert (s.engine, s.engine_name, s.api_key) == ("sglang", "SGLang", "sk")
        assert s.how == "$WORKSHOP_SGLANG_BASE_URL"
        # An engine named in the call wins over WORKSHOP_ENGINE (notebook 1's hf baseline).
        with pytest.raises(RuntimeError, match="no hf server at http://127.0.0.1:8001"):
            session.connect(engine="hf", start=False, verbose=False)
    finally:
        srv.shutdown()


def test_workshop_engine_picks_the_default_port(clean_env):
    clean_env.setenv("WORKSHOP_ENGINE", "sglang")
    with pytest.raises(RuntimeError, match="no sglang server at http://127.0.0.1:8002"):
        session.connect(start=False, verbose=False)


def test_connect_finds_vllms_own_server_on_the_port(clean_env):
    srv = _fake_server(None)
    try:
        s = session.connect(port=srv.server_port, start=False, verbose=False)
        assert s.model == "served-name" and s.info["max_model_len"] == 4096
        assert "found running" in s.how
    finally:
        srv.shutdown()


def test_connect_refuses_a_server_of_another_engine(clean_env):
    srv = _fake_server({"engine": "hf", "model": "smol"})
    try:
        with pytest.raises(RuntimeError, match="not 'vllm'"):
            session.connect(port=srv.server_port, start=False, verbose=False)
    finally:
        srv.shutdown()


def test_root_url_drops_v1_and_slashes():
    assert session.root_url("http://h:8000/v1/") == "http://h:8000"
    assert session.root_url(" http://h:8000/ ") == "http://h:8000"
    assert session.root_url("http://h:8000/api/v1") == "http://h:8000/api"
