"""The SGLang engine's own logic, without SGLang: its command line and key file, the token-id
check that keeps crashing input away from it, its metrics under vLLM's names, and what
``/server_info`` repeats of SGLang's. (The real SGLang runs in tests/integration.)"""

from __future__ import annotations

import asyncio
import json
import os
import stat
import sys
from pathlib import Path

import pytest

from reference_server import prometheus as P
from reference_server.config import ServerConfig, parse_args
from reference_server.engines import sglang as S
from reference_server.engines.base import EngineError
from reference_server.engines.proxy import ProxyEngine
from reference_server.models import ModelSpec
from reference_server.protocol import CompletionRequest

ROOT = Path(__file__).resolve().parents[2]

# SmolLM2-135M's shape: 2 (K, V) x 30 layers x 3 KV heads x 64 dims x 2 bytes = 23040 B/token
CONFIG = {"model_type": "llama", "num_hidden_layers": 30, "num_attention_heads": 9,
          "num_key_value_heads": 3, "hidden_size": 576, "vocab_size": 49152,
          "torch_dtype": "bfloat16"}


@pytest.fixture
def model(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(CONFIG))
    return ModelSpec("smollm2-135m", str(tmp_path), True)


@pytest.fixture(autouse=True)
def no_amx(monkeypatch):
    from reference_server import dtypes as V
    monkeypatch.setattr(V, "cpu_has_amx", lambda: False)


def engine(model, *engine_args, **kw) -> S.SGLangEngine:
    cfg = ServerConfig(engine="sglang", device="cpu", engine_python=sys.executable, **kw)
    cfg.engine_args = list(engine_args)
    return S.SGLangEngine(cfg, model)


def test_the_engine_is_registered():
    assert parse_args(["--engine", "sglang"]).engine == "sglang"


def test_kv_tokens_for():
    assert S.kv_tokens_for(1, 23040) == 46603          # 1073741824 / 23040 = 46603.4
    assert S.kv_tokens_for(0.5, 1024) == 524288


def test_cpu_mem_fraction():
    gib = 2**30
    assert S.cpu_mem_fraction(1 * gib, 1 * gib, 50 * gib) == 0.1     # (1 + 1 + 3) / 50
    assert S.cpu_mem_fraction(0, 0, 100 * gib) == 0.05                # never below the recipe's
    assert S.cpu_mem_fraction(8 * gib, 1 * gib, 10 * gib) == 0.9      # never all of it


def test_weight_bytes(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"x" * 100)
    (tmp_path / "config.json").write_text("{}")
    assert S.weight_bytes(str(tmp_path)) == 100


def test_engine_arg_last_one_wins():
    args = ["--max-running-requests", "8", "--x", "--max-running-requests=64"]
    assert S.engine_arg(args, "--max-running-requests") == "64"
    assert S.engine_arg(["--max-running-requests", "8"], "--max-running-requests") == "8"
    assert S.engine_arg(["--max-running-requests"], "--max-running-requests") is None


@pytest.mark.parametrize("body, bad", [
    ({"prompt": [1, 2, 3]}, None),
    ({"prompt": [49151]}, None),                         # the last id there is
    ({"prompt": [5, 49152]}, ("prompt", 49152)),
    ({"prompt": [999999, 5]}, ("prompt", 999999)),
    ({"prompt": "999999"}, None),                        # text, not ids
    ({"prompt": ["a", "b"]}, None),
    ({"prompt": "hi", "stop_token_ids": [2, 50000]}, ("stop_token_ids", 50000)),
    ({"prompt": "hi", "logit_bias": {"5": 10}}, None),
    ({"prompt": "hi", "logit_bias": {"49152": 10}}, ("logit_bias", 49152)),
    ({"prompt": "hi", "logit_bias": {"-1": 10}}, ("logit_bias", -1)),
    ({"prompt": "hi", "logit_bias": {"a": 10}}, ("logit_bias", "a")),
])
def test_out_of_vocabulary(body, bad):
    assert S.out_of_vocabulary(body, 49152) == bad


def test_an_out_of_vocabulary_prompt_is_refused_without_reaching_sglang(model):
    e = engine(model)      # never started: forwarding anything would fail on the missing client
    req = CompletionRequest.model_validate({"model": "m", "prompt": [999999, 5]})
    with pytest.raises(EngineError) as err:
        asyncio.run(e._forward("/v1/completions", req))
    assert err.value.status_code == 400 and err.value.param == "prompt"
    assert "49152" in err.value.message


def test_cpu_command(model):
    cmd = engine(model, "--max-running-requests", "64").command()
    # SGLang's launcher plus our key check on every path (child_guard)
    assert cmd[:3] == [sys.executable, "-m", "reference_server.engines.sglang_launch"]
    assert cmd[cmd.index("--host") + 1] == "127.0.0.1"       # loopback only
    assert cmd[cmd.index("--context-length") + 1] == "2048"
    assert cmd[cmd.index("--max-total-tokens") + 1] == "46603"   # --kv-cache-gib 1
    assert cmd[cmd.index("--attention-backend") + 1] == "torch_native"
    assert 0.05 <= float(cmd[cmd.index("--mem-fraction-static") + 1]) <= 0.9
    assert engine(model, gpu_memory_utilization=0.2).command()[
        cmd.index("--mem-fraction-static") + 1] == "0.2"                # the user's word
    assert "--enable-metrics" in cmd and "--enable-cache-report" in cmd
    assert "--disable-radix-cache" not in cmd
    assert cmd[cmd.index("--log-level") + 1] == "warning"    # info would log the key
    assert cmd[-2:] == ["--max-running-requests", "64"]     # the user's word comes last
    assert not any("key" in a for a in cmd)
    env = engine(model).env()
    assert env["SGLANG_USE_CPU_ENGINE"] == "1"
    assert env["SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION"] == "0"     # a cheap liveness probe
    assert engine(model).max_running == S.CPU_MAX_RUNNING
    assert engine(model, "--max-running-requests", "64").max_running == 64
    assert "--disable-radix-cache" in engine(model, enable_prefix_caching=False).command()


def test_default_python(tmp_path):
    assert S.default_python({}, str(tmp_path)) == sys.executable     # no environment built
    py = tmp_path / ".venv-sglang" / "bin" / "python"
    py.parent.mkdir(parents=True)
    py.touch()
    assert S.default_python({}, str(tmp_path)) == str(py)
    assert S.default_python({"WORKSHOP_SGLANG_VENV": str(tmp_path / "elsewhere")},
                            str(tmp_path)) == sys.executable


def test_the_key_travels_in_a_private_file_that_is_gone_once_started(model, monkeypatch):
    e = engine(model)
    seen = {}

    async def fake_start(self):
        cmd = self.command()
        path = cmd[cmd.index("--config") + 1]
        seen["path"] = path
        seen["mode"] = stat.S_IMODE(os.stat(path).st_mode)
        seen["dir_mode"] = stat.S_IMODE(os.stat(os.path.dirname(path)).st_mode)
        seen["text"] = open(path).read()
        seen["cmd"] = cmd

    monkeypatch.setattr(ProxyEngine, "start", fake_start)
    monkeypatch.setattr(S.SGLangEngine, "_check_installed", lambda self: None)
    asyncio.run(e.start())
    assert seen["mode"] == 0o600 and seen["dir_mode"] == 0o700
    assert json.loads(seen["text"].split(": ", 1)[1]) == e.child_key
    assert e.child_key not in " ".join(seen["cmd"])
    assert not e.child_key.startswith("-")
    assert not os.path.exists(seen["path"])
    assert "--config" not in e.command()


def test_missing_sglang_says_how_to_install_it(model):
    e = engine(model)          # this interpreter has no SGLang (the project's own venv)
    if __import__("importlib").util.find_spec("sglang") is not None:
        pytest.skip("SGLang is importable here")
    with pytest.raises(Exception, match="setup.sh --with-sglang"):
        asyncio.run(e.start())


SGLANG_PAGE = """\
# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{engine_type="unified",model_name="smollm2-135m",tp_rank="0"} 3.0
sglang:num_running_reqs{engine_type="unified",model_name="smollm2-135m",tp_rank="1"} 2.0
sglang:num_queue_reqs{engine_type="unified",model_name="smollm2-135m",tp_rank="0"} 4.0
sglang:token_usage{engine_type="unified",model_name="smollm2-135m",tp_rank="0"} 0.25
sglang:token_usage{engine_type="unified",model_name="smollm2-135m",tp_rank="1"} 0.75
sglang:prompt_tokens_total{is_streaming="false",model_name="smollm2-135m"} 100.0
sglang:prompt_tokens_total{is_streaming="true",model_name="smollm2-135m"} 20.0
sglang:generation_tokens_total{is_streaming="false",model_name="smollm2-135m"} 7.0
sglang:time_to_first_token_seconds_bucket{is_streaming="false",le="0.1",model_name="smollm2-135m"} 1.0
sglang:time_to_first_token_seconds_bucket{is_streaming="false",le="1.0",model_name="smollm2-135m"} 2.0
sglang:time_to_first_token_seconds_bucket{is_streaming="false",le="+Inf",model_name="smollm2-135m"} 3.0
sglang:time_to_first_token_seconds_bucket{is_streaming="true",le="0.1",model_name="smollm2-135m"} 0.0
sglang:time_to_first_token_seconds_bucket{is_streaming="true",le="1.0",model_name="smollm2-135m"} 1.0
sglang:time_to_first_token_seconds_bucket{is_streaming="true",le="+Inf",model_name="smollm2-135m"} 1.0
sglang:time_to_first_token_seconds_sum{is_streaming="false",model_name="smollm2-135m"} 5.5
sglang:time_to_first_token_seconds_sum{is_streaming="true",model_name="smollm2-135m"} 0.5
sglang:time_to_first_token_seconds_count{is_streaming="false",model_name="smollm2-135m"} 3.0
sglang:time_to_first_token_seconds_count{is_streaming="true",model_name="smollm2-135m"} 1.0
"""  # noqa: E501 (a metrics page as SGLang writes it: its lines are not ours to wrap)


def test_sglang_metrics_under_vllms_names():
    text = S.vllm_metrics(SGLANG_PAGE, "smollm2-135m")
    t = P.totals(text)
    assert t[P.NUM_REQUESTS_RUNNING] == 5            # summed over ranks
    assert t[P.NUM_REQUESTS_WAITING] == 4
    assert t[P.KV_CACHE_USAGE] == 0.5                # a fraction: averaged, never summed
    assert t[P.PROMPT_TOKENS] == 120                 # streaming and not
    assert t[P.PREFIX_CACHE_QUERIES] == 120
    assert t[P.PREFIX_CACHE_HITS] == 0               # SGLang writes none before a first hit
    assert t[P.GENERATION_TOKENS] == 7
    assert t[P.NUM_PREEMPTIONS] == 0
    buckets = {s.labels["le"]: s.value for s in P.parse(text)
               if s.name == P.TIME_TO_FIRST_TOKEN + "_bucket"}
    assert buckets == {"0.1": 1, "1.0": 3, "+Inf": 4}
    assert t[P.TIME_TO_FIRST_TOKEN + "_count"] == 4
    assert t[P.TIME_TO_FIRST_TOKEN + "_sum"] == 6.0
    assert P.INTER_TOKEN_LATENCY + "_bucket" not in t   # nothing observed: no series
    assert t["sglang:num_queue_reqs"] == 4              # SGLang's own lines stay
    labels = P.labels_of(text, P.NUM_REQUESTS_RUNNING)
    assert labels == {"model_name": "smollm2-135m"}


def test_hits_are_read_from_the_cache_report():
    page = SGLANG_PAGE + ('sglang:cached_tokens_total{cache_source="device",'
                          'model_name="smollm2-135m"} 64.0\n')
    assert P.totals(S.vllm_metrics(page, "m"))[P.PREFIX_CACHE_HITS] == 64


def test_a_page_without_sglang_metrics_is_left_alone():
    page = "python_gc_objects_collected_total{generation=\"0\"} 5.0\n"
    assert S.vllm_metrics(page, "m") == page


def test_server_info_repeats_settings_never_the_key_or_address(model):
    e = engine(model)
    theirs = {"version": "0.5.18", "api_key": "sgl-secret", "admin_api_key": None,
              "host": "127.0.0.1", "port": 41234, "max_total_num_tokens": 46603,
              "page_size": 1, "disable_radix_cache": False, "kv_cache_dtype": "auto",
              "context_length": 2048, "max_running_requests": 64,
              "attention_backend": "torch_native", "model_path": "/somewhere"}

    async def get_json(path):
        return theirs

    e.get_json = get_json
    asyncio.run(e.on_ready())
    info = e.info().to_dict()
    text = json.dumps(info)
    assert "sgl-secret" not in text and "41234" not in text and "127.0.0.1" not in text
    assert info["engine"] == "sglang" and info["engine_version"] == "0.5.18"
    assert info["kv_capacity_tokens"] == 46603 and info["block_size"] == 1
    assert info["kv_bytes_per_token"] == 23040 and info["prefix_caching"] is True
    assert info["max_model_len"] == 2048
    assert e.max_running == 64                       # what SGLang settled on


def test_an_error_body_whose_error_is_a_string_keeps_its_status():
    from reference_server.engines.proxy import error_answer
    err = error_answer(401, b'{"error": "Unauthorized"}')     # SGLang's key check
    assert err.status_code == 401 and err.message == "Unauthorized"
    err = error_answer(400, b'{"object": "error", "message": "too long", '
                             b'"type": "BadRequestError", "param": null, "code": 400}')
    assert err.status_code == 400 and err.message == "too long"


def test_a_request_whose_client_left_is_aborted_by_its_own_id(model):
    e = engine(model)
    sent = []

    async def fake_abort(rids, resp):
        sent.append(rids)

    e._abort = fake_abort
    one = e.request_body(CompletionRequest.model_validate(
        {"model": "m", "prompt": "hi", "rid": "someone-elses"}))
    three = e.request_body(CompletionRequest.model_validate({"model": "m", "prompt": "hi", "n": 3}))
    assert one["rid"] != "someone-elses" and len(one["rid"]) == 32
    assert one["rid"] != three["rid"]

    async def leave():
        e.abandon(None, one)
        e.abandon(None, three)
        await asyncio.gather(*e._aborts)

    asyncio.run(leave())
    r = three["rid"]
    assert sent == [[one["rid"]], [f"{r}_0", f"{r}_1", f"{r}_2"]]


def test_on_an_amx_cpu_it_runs_as_its_cpu_docs_say_and_elsewhere_it_says_it_is_unsupported(
        model, monkeypatch):
    from reference_server import dtypes as V
    monkeypatch.setattr(V, "cpu_has_amx", lambda: True)
    e = engine(model)
    cmd = e.command()
    assert "--disable-radix-cache" not in cmd
    assert cmd[cmd.index("--attention-backend") + 1] == "intel_amx"
    info = e.info()
    assert info.prefix_caching is True and info.attention == "intel_amx"
    assert "support_note" not in info.extra
    monkeypatch.setattr(V, "cpu_has_amx", lambda: False)
    e = engine(model)
    cmd = e.command()
    assert "--disable-radix-cache" not in cmd
    assert cmd[cmd.index("--attention-backend") + 1] == "torch_native"
    assert "outside SGLang's supported CPUs" in e.info().extra["support_note"]


def test_kv_usage_from_exact_token_counts_when_sglang_gives_them():
    page = SGLANG_PAGE + ('sglang:num_used_tokens{model_name="m",tp_rank="0"} 30.0\n'
                          'sglang:max_total_num_tokens{model_name="m",tp_rank="0"} 46603.0\n')
    # token_usage says 0.25 and 0.75 (rounded to 0.01 by SGLang); the counts say 30 / 46603
    assert P.totals(S.vllm_metrics(page, "m"))[P.KV_CACHE_USAGE] == 30 / 46603


def test_avx2_patch_applies_to_the_kernel_source(tmp_path):
    """setup_sglang.sh patches a copy of SGLang's kernel source for AVX2-only CPUs; the patch
    checks every anchor it edits, so a changed upstream must fail here, not in a crash."""
    import runpy
    import shutil

    src = Path(os.environ.get("SGLANG_KERNEL_SRC",
                              ROOT.parent / "shared" / "third_party" / "sglang-kernel-cpu"))
    if not (src / "csrc" / "cpu" / "CMakeLists.txt").exists():
        pytest.skip(f"no SGLang kernel source at {src}")
    for name in ("CMakeLists.txt", "shm.cpp"):
        (tmp_path / "csrc" / "cpu").mkdir(parents=True, exist_ok=True)
        shutil.copy(src / "csrc" / "cpu" / name, tmp_path / "csrc" / "cpu" / name)
    patch = runpy.run_path(str(ROOT / "scripts" / "sglang_kernel_avx2.py"))
    patch["main"](str(tmp_path))
    cmake = (tmp_path / "csrc" / "cpu" / "CMakeLists.txt").read_text()
    assert "-march=x86-64-v3" in cmake and "x86-64-v4" not in cmake and "-mamx" not in cmake
    assert "SGLANG_CPU_ARM64_SKIP_X86_ONLY_OPS" in cmake
    assert (tmp_path / "csrc" / "cpu" / "avx2_unavailable.cpp").exists()
    with pytest.raises(SystemExit):     # a second run finds its anchors gone
        patch["main"](str(tmp_path))
