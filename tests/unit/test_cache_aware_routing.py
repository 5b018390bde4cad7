"""workshop.fleet.cache_aware_routing's pure parts: the session workload (planned without a server),
the hit-rate ceiling and block counts worked by hand, the imbalance, and the prefix policy
keeping each planned session on one replica."""

from __future__ import annotations

import time

import pytest

from workshop.api_gateway.routing import Prefix, Spread, prompt_text
from workshop.bench.tokenizer import Tokenizer
from workshop.bench.workloads import plan
from workshop.fleet import cache_aware_routing as car


def planned(num_sessions=3, **kw):
    wl = car.session_workload(Tokenizer(), num_sessions, prefix_len=64, turns=3,
                              question_len=8, output_len=4, **kw)
    return wl, plan(wl)


def test_each_session_has_its_own_system_prompt_and_its_turns_extend_each_other():
    wl, sent = planned()
    systems = [s.system for s in wl.sessions]
    assert len(set(systems)) == 3 and len({s.split()[1] for s in systems}) == 3
    assert len(sent) == 3 * 3 and all(s.request.max_tokens == 4 for s in sent)
    for k in range(3):                          # plan runs the sessions one after another
        turns = [prompt_text({"messages": s.request.messages}) for s in sent[3 * k:3 * k + 3]]
        assert turns[1].startswith(turns[0]) and turns[2].startswith(turns[1])
        # the reply of each turn is in the next turn's history
        assert sent[3 * k].reply in sent[3 * k + 1].request.messages[2]["content"]


def test_a_hot_workload_shares_one_system_prompt():
    wl, _ = planned(hot=True)
    assert len({s.system for s in wl.sessions}) == 1
    assert wl.params["hot"] is True


def test_sessions_pause_between_turns_only():
    wl = car.session_workload(Tokenizer(), 1, prefix_len=8, turns=3, question_len=2,
                              output_len=1, think_s=0.05)
    t0 = time.monotonic()
    plan(wl)
    took = time.monotonic() - t0
    assert 2 * 0.5 * 0.05 <= took < 2 * 1.5 * 0.05 + 0.5     # two pauses, none before turn 1


def test_the_prefix_policy_keeps_every_planned_session_on_one_replica():
    wl, sent = planned(num_sessions=4)
    policy, spread = Prefix(), Spread()
    home: dict[str, set[int]] = {}
    spread_home: dict[str, set[int]] = {}
    for s in sent:
        system = s.request.messages[0]["content"]
        home.setdefault(system, set()).add(policy.choose([0, 0], prompt_text(
            {"messages": s.request.messages})))
        spread_home.setdefault(system, set()).add(spread.choose([0, 0]))
    assert all(len(v) == 1 for v in home.values())
    assert sorted(next(iter(v)) for v in home.values()) == [0, 0, 1, 1]
    assert any(len(v) == 2 for v in spread_home.values())     # load-blind: sessions move


def test_hit_ceiling_worked_by_hand():
    # turn 1: 30 + 34 + (8 + 8) = 80 prompt tokens, nothing found; with its 16-token reply,
    # 96 tokens = 6 whole blocks. Turn 2: 30 + 34 + 2 * 16 + 16 = 112, of which 96 found.
    assert car.hit_ceiling(turns=2, prefix_len=34, question_len=8, output_len=16) == \
        pytest.approx(96 / 192)
    assert car.hit_ceiling(turns=1, prefix_len=500, question_len=8, output_len=16) == 0.0
    # more turns: more of each prompt is history
    assert car.hit_ceiling(4, 256, 24, 8) > car.hit_ceiling(3, 256, 24, 8)


def test_session_blocks_round_up():
    # 30 + 34 + 2 * (8 + 8) + 2 * 16 = 128 tokens: 8 blocks; one more token: 9
    assert car.session_blocks(prefix_len=34, turns=2, question_len=8, output_len=16) == 8
    assert car.session_blocks(prefix_len=35, turns=2, question_len=8, output_len=16) == 9


def test_measured_prompts_replace_the_estimate():
    # turn 2 finds turn 1's 100 + 10 tokens in whole 16-token blocks: 96 of 100 + 150 sent
    wl = dict(prefix_len=999, turns=2, question_len=999, output_len=10)
    assert car.hit_ceiling(block_size=16, prompt_tokens=[100, 150], **wl) == \
        pytest.approx(96 / 250)
    assert car.hit_ceiling(block_size=128, prompt_tokens=[100, 150], **wl) == 0.0
    assert car.session_blocks(block_size=16, prompt_tokens=[100, 150], **wl) == 10
    # measured: each turn's prompt holds the one before, its reply and a question
    sizes = car.turn_prompt_tokens(Tokenizer(), turns=3, prefix_len=40, question_len=8,
                                   output_len=5)
    assert len(sizes) == 3 and sizes[0] > 40 + 8
    assert all(b - a >= 8 + 5 for a, b in zip(sizes, sizes[1:]))


def test_imbalance():
    assert car.imbalance([3, 1]) == pytest.approx(1.5)
    assert car.imbalance([2, 2]) == 1.0
    assert car.imbalance([4, 0]) == 2.0
    assert car.imbalance([0, 0]) is None


def test_replica_args_set_the_pool_size():
    args = car.replica_args(48, threads=1)
    assert args[args.index("--num-blocks") + 1] == "48"
    assert args.index("--") < args.index("--num-blocks")       # an engine flag, after "--"


def test_the_figure_has_both_panels_and_tolerates_a_missing_value():
    rows = [{"policy": p, "sessions": n, "hit rate": h, "p99 TTFT ms": t}
            for p, n, h, t in (("spread", 2, 0.3, 500.0), ("spread", 4, None, 900.0),
                               ("prefix", 2, 0.6, 300.0), ("prefix", 4, 0.6, None))]
    fig = car.figure(rows, ceiling=0.62)
    ax1, ax2 = fig.axes
    assert [line.get_label() for line in ax1.lines][:2] == ["spread", "prefix"]
    assert ax1.get_title() == "Prefix-cache hit rate, whole fleet"      # one engine: unnamed
    assert ax2.get_ylabel() == "seconds"


def test_the_tenant_figure_splits_the_probes_by_setting_and_kind():
    rows = [{"salts": salted, "sent_by_a": sent, "ttft_ms": ms}
            for salted, sent, ms in ((False, True, 10.0), (False, False, 50.0),
                                     (True, True, 48.0), (True, False, 52.0),
                                     (True, False, None))]
    fig = car.tenant_figure(rows, [10.0, None])
    left, right = fig.axes
    assert [len(c.get_offsets()) for c in left.collections] == [1, 1]
    assert [len(c.get_offsets()) for c in right.collections] == [1, 1]   # the None is left out
    assert left.collections[0].get_offsets()[0][1] == 10.0
    assert len(left.lines) == 1 and len(right.lines) == 0                # thresholds given


# -- vLLM replicas ------------------------------------------------------------------------------

SMOLLM2_KV = ('{"torch_dtype": "bfloat16", "num_hidden_layers": 30, "num_attention_heads": 9, '
              '"num_key_value_heads": 3, "hidden_size": 576}')


def test_vllm_bytes_per_token_follow_the_served_dtype(monkeypatch, tmp_path):
    from reference_server import dtypes
    (tmp_path / "config.json").write_text(SMOLLM2_KV)
    # 30 layers x K and V x 3 KV heads x 64 values, two bytes each in bfloat16
    monkeypatch.setattr(dtypes, "cpu_has_bf16", lambda: True)
    assert car.vllm_kv_bytes_per_token(str(tmp_path)) == 30 * 2 * 3 * 64 * 2 == 23040
    monkeypatch.setattr(dtypes, "cpu_has_bf16", lambda: False)     # served in float32
    assert car.vllm_kv_bytes_per_token(str(tmp_path)) == 46080


@pytest.mark.parametrize("bf16", [True, False])
def test_a_vllm_replica_gets_the_sliders_tokens_in_whole_blocks(monkeypatch, tmp_path, bf16):
    """Through the server's own parsing and vLLM command: the KV bytes it hands vLLM, divided
    as vLLM divides them, make exactly the slider's tokens, for every slider position."""
    from reference_server import dtypes
    from reference_server.config import parse_args
    from reference_server.engines.vllm import VLLMEngine
    from reference_server.models import ModelSpec
    (tmp_path / "config.json").write_text(SMOLLM2_KV)
    monkeypatch.setattr(dtypes, "cpu_has_bf16", lambda: bf16)
    monkeypatch.setattr(dtypes, "cpu_has_amx", lambda: False)
    per_token = car.vllm_kv_bytes_per_token(str(tmp_path))
    for blocks in range(32, 257, 16):                  # the notebook's slider
        tokens = blocks * car.SLIDER_BLOCK
        cfg = parse_args(["--engine", "vllm", "--device", "cpu",
                          *car.vllm_replica_args(tokens, per_token)])
        cmd = VLLMEngine(cfg, ModelSpec("m", str(tmp_path), True)).command()
        kv_bytes = int(cmd[cmd.index("--kv-cache-memory-bytes") + 1])
        # vLLM's division, less the null block it holds back: the slider's tokens
        assert (kv_bytes // (car.VLLM_CPU_BLOCK * per_token) - 1) * car.VLLM_CPU_BLOCK == tokens
        # vLLM refuses a max_model_len its usable blocks cannot hold
        assert int(cmd[cmd.index("--max-model-len") + 1]) == min(1024, tokens)
        assert "--enforce-eager" in cmd and cmd[cmd.index("--max-num-seqs") + 1] == "16"


def test_vllm_kv_gib_sits_between_whole_blocks():
    # 12 blocks of tokens and the null block; half a block above their bytes, so that the
    # server's and vLLM's roundings down keep all 13
    per_token, block = 23040, 128
    kv_bytes = car.vllm_kv_gib(1536, per_token, block) * 2**30
    assert 13 * block * per_token < kv_bytes < 14 * block * per_token
    assert car.vllm_blocks(1536) == 13 and car.vllm_blocks(1500) == 13
    assert car.vllm_blocks(10) == 2


def test_replica_cores_take_turns():
    assert [car.replica_cores(i, 1, [0, 1]) for i in range(3)] == ["0", "1", "0"]
    assert [car.replica_cores(i, 2, [4, 5, 6, 7]) for i in range(2)] == ["4,5", "6,7"]
    assert car.replica_cores(1, 2, [0, 1, 2]) == "2,0"


def test_vllm_is_skipped_with_a_reason(monkeypatch):
    import importlib.util

    import workshop.hardware
    monkeypatch.setattr(workshop.hardware, "gpu_name", lambda: None)
    assert "SGLang" in car.vllm_unavailable("sglang")
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "vllm" else real(name, *a))
    assert "not installed" in car.vllm_unavailable("vllm")
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: object() if name == "vllm" else real(name, *a))
    assert car.vllm_unavailable("vllm") is None
    monkeypatch.setattr(workshop.hardware, "gpu_name", lambda: "NVIDIA H100, 80 GiB")
    assert "GPU" in car.vllm_unavailable("vllm")


def test_capacity_follows_the_fleets_blocks():
    wl = dict(prefix_len=256, turns=3, question_len=24, output_len=8, think_s=0.3)
    mini = car.capacity(car.Fleet([], {}, 96, 16), wl)
    vllm = car.capacity(car.Fleet([], {}, 12, 128, engine="vllm"), wl)
    assert mini["KV tokens"] == vllm["KV tokens"] == 1536
    # last turn: 30 + 256 + 3 x 32 + 2 x 8 + 8 = 406 tokens: 26 blocks of 16, 4 of 128
    assert (mini["session blocks"], vllm["session blocks"]) == (26, 4)
    assert vllm["sessions it keeps"] == 3.0
    assert vllm["hit ceiling"] < mini["hit ceiling"]       # coarser blocks: less found


def _row(engine, policy, n, hit, p99):
    return {"engine": engine, "policy": policy, "sessions": n, "hit rate": hit,
            "p99 TTFT ms": p99}


def test_engine_comparison_reads_each_engines_largest_count():
    rows = [_row("mini", "spread", 2, 0.3, 400.0), _row("mini", "prefix", 2, 0.6, 300.0),
            _row("mini", "spread", 8, 0.2, 900.0), _row("mini", "prefix", 8, 0.5, 600.0),
            _row("vllm", "spread", 8, 0.0, 800.0), _row("vllm", "prefix", 8, 0.4, 700.0)]
    mini, vllm = car.engine_comparison(rows, "spread")
    assert (mini["engine"], mini["sessions"]) == ("mini", 8)
    assert mini["hit-rate ratio"] == pytest.approx(2.5)
    assert mini["prefix p99 TTFT s"] == 0.6 and mini["spread p99 TTFT s"] == 0.9
    assert vllm["hit-rate ratio"] is None                 # nothing found by the baseline


def test_the_figure_has_a_row_of_panels_per_engine():
    rows = [_row(e, p, n, 0.5, 500.0 if e == "mini" else 2000.0) for e in ("mini", "vllm")
            for p in ("spread", "prefix") for n in (2, 4)]
    fig = car.figure(rows, ceiling={"mini": 0.62, "vllm": 0.48}, keeps={"mini": 3.7, "vllm": 3})
    (a1, a2), (b1, b2) = fig.axes[:2], fig.axes[2:]
    assert "vLLM" in b1.get_title() and "teaching engine" in a1.get_title()
    assert [line.get_ydata()[0] for line in b1.lines if line.get_linestyle() == ":"] == [0.48]
    assert a2.get_shared_y_axes().joined(a2, b2)            # one TTFT scale for both
    assert a2.get_ylim()[0] == 0 and b2.get_ylim()[1] > 2.0  # the slower engine not clipped


def test_empty_cache_retries_a_refusal_and_raises_when_it_persists(monkeypatch):
    import httpx
    answers = iter([False, False, True])
    calls = []

    def post(url, **_):
        calls.append(url)
        return httpx.Response(200, json={"success": next(answers)},
                              request=httpx.Request("POST", url))

    monkeypatch.setattr(httpx, "post", post)
    replica = type("R", (), {"base_url": "http://r", "headers": {}})()
    car.empty_cache(replica, pause_s=0)
    assert len(calls) == 3
    answers = iter([False] * 4)
    with pytest.raises(RuntimeError, match="refused"):
        car.empty_cache(replica, tries=4, pause_s=0)


def test_a_server_without_a_prefix_cache_is_asked_once(monkeypatch):
    """Its refusal is final: asking again would only add pauses to every timing."""
    import httpx

    from workshop.live.live_requests import reset_prefix_cache
    calls = []

    def post(url, **_):
        calls.append(url)
        return httpx.Response(200, json={"success": False, "prefix_caching": False},
                              request=httpx.Request("POST", url))

    monkeypatch.setattr(httpx, "post", post)
    replica = type("R", (), {"base_url": "http://r", "headers": {}})()
    assert reset_prefix_cache(replica, tries=8, pause_s=0) is False
    assert len(calls) == 1


def test_a_busy_refusal_is_asked_again_as_the_harness_does(monkeypatch):
    """The notebooks' reset reads answers as the harness does (``reset_verdict``): SGLang's
    400 while requests run is a refusal to ask again, not a missing endpoint."""
    import httpx

    from workshop.live.live_requests import reset_prefix_cache
    answers = iter([(400, {"error": "busy"}), (200, {"success": True})])
    calls = []

    def post(url, **_):
        calls.append(url)
        status, body = next(answers)
        return httpx.Response(status, json=body, request=httpx.Request("POST", url))

    monkeypatch.setattr(httpx, "post", post)
    replica = type("R", (), {"base_url": "http://r", "headers": {}})()
    assert reset_prefix_cache(replica, tries=8, pause_s=0) is True
    assert len(calls) == 2
