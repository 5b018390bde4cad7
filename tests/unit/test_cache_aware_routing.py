"""workshop.cache_aware_routing's pure parts: the session workload (planned without a server),
the hit-rate ceiling and block counts worked by hand, the imbalance, and the prefix policy
keeping each planned session on one replica."""

from __future__ import annotations

import time

import pytest

from workshop import cache_aware_routing as car
from workshop.api_gateway.routing import Prefix, Spread, prompt_text
from workshop.bench.tokenizer import Tokenizer
from workshop.bench.workloads import plan


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
