"""Notebook 07's arithmetic: reservations, fragmentation, the pool simulation, step traces.

Every expected number below was worked out by hand (the comments show how)."""

from __future__ import annotations

from collections import deque
from types import SimpleNamespace

import pytest

from mini_engine.block_manager import BlockManager
from mini_engine.config import EngineConfig
from mini_engine.scheduler import ContinuousScheduler, StaticScheduler
from workshop.engine_lab import batching as b

# -- reservations ------------------------------------------------------------------------------

@pytest.mark.parametrize("tokens, layout, expected", [
    (17, "paged", 32),          # 2 blocks of 16
    (16, "paged", 16),          # exactly 1 block
    (17, "contiguous", 64),     # max_len 64 reserved whatever the request
    (70, "contiguous", 80),     # longer than max_len: its own length, in whole blocks (5)
    (17, "exact", 17),
])
def test_reserved_slots(tokens, layout, expected):
    assert b.reserved_slots(tokens, layout, 16, 64) == expected


def test_contiguous_max_len_rounds_up_to_blocks():
    assert b.reserved_slots(10, "contiguous", 16, 50) == 64      # ceil(50 / 16) = 4 blocks


def test_reserved_slots_agree_with_the_engine_block_manager():
    for mode in ("paged", "contiguous"):
        bm = BlockManager(100, 16, mode=mode, max_model_len=100)
        for t in (1, 15, 16, 17, 99, 100, 101, 250):
            assert b.reserved_slots(t, mode, 16, 100) == bm.blocks_for(t) * 16, (mode, t)


def test_unknown_layout():
    with pytest.raises(ValueError):
        b.reserved_slots(10, "buddy", 16, 64)


def test_internal_waste():
    # paged: 17 -> 32 slots, 32 -> 32 slots: 64 reserved, 49 used, 15 wasted
    w = b.internal_waste([17, 32], "paged", 16, 64)
    assert (w["reserved"], w["used"], w["wasted"]) == (64, 49, 15)
    assert w["wasted_pct"] == pytest.approx(100 * 15 / 64)
    # contiguous: 2 x 64 = 128 reserved, 79 wasted
    assert b.internal_waste([17, 32], "contiguous", 16, 64)["wasted"] == 79
    assert b.internal_waste([17, 32], "exact", 16, 64)["wasted"] == 0
    assert b.internal_waste([], "paged", 16, 64)["wasted_pct"] == 0.0


def test_fit_count():
    lens = [10, 20, 30]
    assert b.fit_count(lens, 64, "exact", 16, 32) == 3          # 10 + 20 + 30 = 60 <= 64
    assert b.fit_count(lens, 64, "paged", 16, 32) == 2          # 16 + 32 = 48; + 32 = 80 > 64
    assert b.fit_count(lens, 70, "paged", 16, 32) == 2          # whole blocks only: 70 -> 64
    assert b.fit_count(lens, 64, "contiguous", 16, 32) == 2     # 32 each
    assert b.fit_count(lens, 95, "contiguous", 16, 32) == 2     # the third needs 96
    assert b.fit_count(lens, 5, "exact", 16, 32) == 0


def test_external_fragmentation():
    assert b.external_fragmentation([10, 30]) == pytest.approx(0.25)   # 1 - 30/40
    assert b.external_fragmentation([40]) == 0.0
    assert b.external_fragmentation([]) == 0.0
    assert b.external_fragmentation([0, 5]) == 0.0


# -- the pool over time ------------------------------------------------------------------------

def _steps(r):
    return [(s.running, s.held, s.reserved, s.stranded, s.waiting) for s in r.steps]


def test_simulate_exact_layout_strands_free_memory():
    # capacity 10; A needs 4 slots (3+1), B 4 (2+2), C 5 (3+2).
    # step 1: A [0,4), B [4,8); C waits, the only hole [8,10) is too small: 2 stranded;
    #         A finishes.
    # step 2: B decodes (held 3). Free: [0,4) and [8,10) = 6 >= 5, yet no hole of 5: 6 stranded.
    #         B finishes.
    # step 3: C at [0,5), held 3.  step 4: C held 4, finishes.
    r = b.simulate([(3, 1), (2, 2), (3, 2)], 10, "exact")
    assert _steps(r) == [(2, 5, 8, 2, 1), (1, 3, 4, 6, 1), (1, 3, 5, 0, 0), (1, 4, 5, 0, 0)]
    assert r.preemptions == 0
    # busy steps are 1 and 2: held (5+3)/2 = 4 -> 40 %, internal ((8-5)+(4-3))/2 = 2 -> 20 %,
    # stranded (2+6)/2 = 4 -> 40 %, free 0 %.
    shares = r.pool_shares()
    assert shares == pytest.approx({"holding tokens": 40.0, "internal waste": 20.0,
                                    "external waste": 40.0, "free": 0.0})
    assert r.mean_running == pytest.approx(1.5)
    assert r.peak_running == 2


def test_simulate_contiguous_reserves_max_len():
    # max_len 8, capacity 20: two reservations of 8 fit, 4 slots are left stranded for the third.
    r = b.simulate([(2, 2)] * 3, 20, "contiguous", block_size=4, max_len=8)
    assert r.steps[0] == b.StepStats(running=2, held=4, reserved=16, stranded=4, waiting=1)
    assert r.peak_running == 2


def test_simulate_paged_preempts_by_recompute():
    # block_size 2, 2 blocks. R0 and R1: prompt 2, output 3.
    # step 1: both admitted with 1 block each (held 2 each).
    # step 2: R0 needs a 2nd block, none free: R1 (admitted last) is preempted, keeps its one
    #         generated token; R0 takes the block (held 3). No admissions in a preempting step.
    # step 3: R0 held 4, finishes; R1 needs blocks_for(2 + 1) = 2 blocks, none free: waits.
    # step 4: R1 re-admitted, prefills 3 tokens.  step 5: R1 held 4, finishes.
    r = b.simulate([(2, 3), (2, 3)], 4, "paged", block_size=2)
    assert r.preemptions == 1
    assert _steps(r) == [(2, 4, 4, 0, 0), (1, 3, 4, 0, 1), (1, 4, 4, 0, 1), (1, 3, 4, 0, 0),
                         (1, 4, 4, 0, 0)]


def test_simulate_max_num_seqs_caps_running():
    r = b.simulate([(1, 2)] * 4, 100, "paged", block_size=4, max_num_seqs=2)
    assert r.peak_running == 2
    assert len(r.steps) == 4                 # two waves of two steps


def test_simulate_refuses_a_request_larger_than_the_pool():
    with pytest.raises(ValueError):
        b.simulate([(10, 10)], 16, "paged", block_size=4)


# -- step traces -------------------------------------------------------------------------------

def _rec(seconds, *scheduled):
    return SimpleNamespace(seconds=seconds, scheduled=list(scheduled))


HISTORY = [
    _rec(1.0, ("a", 10, "prefill"), ("b", 4, "prefill")),
    _rec(0.5, ("a", 1, "decode"), ("b", 1, "decode")),
    _rec(2.0, ("a", 1, "decode"), ("c", 100, "prefill")),
    _rec(0.5, ("a", 1, "decode")),
]


def test_step_spans():
    assert b.step_spans(HISTORY) == [(0.0, 1.0), (1.0, 1.5), (1.5, 3.5), (3.5, 4.0)]


def test_token_times_and_gaps():
    assert b.token_times(HISTORY, "a") == [1.0, 1.5, 3.5, 4.0]
    assert b.max_gap(b.token_times(HISTORY, "a")) == pytest.approx(2.0)
    assert b.token_times(HISTORY, "b") == [1.0, 1.5]
    assert b.token_times(HISTORY, "c") == [3.5]
    assert b.max_gap([3.5]) == 0.0
    assert b.token_times(HISTORY, "nobody") == []


def test_token_times_chunked_and_recomputed():
    chunked = [_rec(1.0, ("c", 50, "prefill")), _rec(1.0, ("c", 50, "prefill")),
               _rec(0.5, ("c", 1, "decode"))]
    assert b.token_times(chunked, "c") == [2.0, 2.5]       # first token when the prompt is done
    recomputed = [_rec(1.0, ("c", 8, "prefill")), _rec(1.0, ("c", 1, "decode")),
                  _rec(1.0, ("x", 1, "decode")), _rec(1.0, ("c", 9, "prefill")),
                  _rec(1.0, ("c", 1, "decode"))]
    assert b.token_times(recomputed, "c") == [4.0, 5.0]


def test_reschedule_swaps_the_policy_of_an_idle_engine():
    bm = BlockManager(8, 4)
    engine = SimpleNamespace(config=EngineConfig(), block_manager=bm, max_model_len=64,
                             history=deque([1, 2]), has_unfinished=lambda: False,
                             scheduler=None)
    b.reschedule(engine, scheduler="static", max_num_seqs=3)
    assert isinstance(engine.scheduler, StaticScheduler)
    assert engine.scheduler.max_num_seqs == 3 and not engine.history
    b.reschedule(engine, scheduler="continuous", chunked_prefill=False, max_num_batched_tokens=32)
    assert isinstance(engine.scheduler, ContinuousScheduler)
    assert engine.scheduler.chunked_prefill is False
    assert engine.scheduler.max_num_batched_tokens == 32
    with pytest.raises(ValueError):
        b.reschedule(engine, scheduler="lottery")
    engine.has_unfinished = lambda: True
    with pytest.raises(RuntimeError):
        b.reschedule(engine, scheduler="static")


def test_predicted_burst():
    info = {"block_size": 16, "kv_capacity_tokens": 1024, "max_model_len": 512}
    assert b.predicted_burst(info, "contiguous", 55, 12) == {"running": 2, "usage": 1.0}
    paged = b.predicted_burst(info, "paged", 55, 12)
    assert paged["running"] == 12 and paged["usage"] == 12 * 64 / 1024


def test_step_cost_rows_reprice_each_run_at_the_mean_step_costs():
    runs = {"a": [_rec(3.0, ("x", 4, "prefill")), _rec(1.0, ("x", 1, "decode"))],
            "b": [_rec(1.0, ("y", 4, "prefill"), ("x", 1, "decode")),
                  _rec(1.0, ("y", 1, "decode"))]}
    a, bb = b.step_cost_rows(runs, tokens=4)
    assert (a["steps"], a["steps with a prefill"], a["tokens per step"]) == (2, 1, 2.0)
    assert a["engine time (s)"] == 4.0 and bb["engine time (s)"] == 2.0
    assert a["time at the mean step costs (s)"] == 3.0 == bb["time at the mean step costs (s)"]
    assert a["mean prefill step (ms)"] == 2000.0 and a["mean decode step (ms)"] == 1000.0


def test_both_gathers_read_the_same_keys_and_are_timed_for_each_placement():
    import torch

    pool = torch.randn(2, 8 * 4, 3)               # 2 KV heads, 8 blocks of 4 slots, d = 3
    blocks = torch.tensor([5, 0, 7])
    by_slot, by_block = b.gather_by_slot(pool, blocks, 4), b.gather_by_block(pool, blocks, 4)
    assert by_slot.shape == (2, 12, 3) and torch.equal(by_slot, by_block)
    assert torch.equal(by_slot[:, 4:8], pool[:, 0:4])      # block 0 second, whole
    rows = b.time_gathers([(pool, pool)], {"here": blocks}, 4, threads=[1], repeats=1)
    assert [(r["blocks"], r["read"], r["threads"]) for r in rows] == [
        ("here", "slot by slot", 1), ("here", "block by block", 1)]
    assert all(r[b.GATHER_MS] > 0 for r in rows)


def test_drive_admits_requests_when_they_arrive():
    added = []

    class Engine:
        num_steps, history = 0, []

        def has_unfinished(self):
            return bool(added) and self.num_steps < 5

        def add_request(self, ids, params, request_id):
            added.append((self.num_steps, request_id, params.max_tokens))

        def step(self):
            self.num_steps += 1
            self.history.append(self.num_steps)

    history = b.drive(Engine(), [([1], 3), ([2], 4)], arrive_at=[0, 2])
    assert added == [(0, "r0", 3), (2, "r1", 4)] and history == [1, 2, 3, 4, 5]


def test_burst_row_puts_the_block_arithmetic_next_to_the_gauges():
    reqs = [SimpleNamespace(prompt_tokens=40, ttft=t, end=t + 1, error=None) for t in (0.1, 0.5)]
    run = SimpleNamespace(requests=reqs, peak_running=1, peak_waiting=1, peak_usage=1.0)
    info = {"block_size": 16, "kv_capacity_tokens": 512, "max_model_len": 512}
    row = b.burst_row("contiguous", run, info, "contiguous", 40, 16)
    assert row["tokens stored per request"] == 55 and row["predicted running"] == 1
    assert row["predicted KV usage (%)"] == 100.0 and row["latest first token (s)"] == 0.5
    assert row["slowest request (s)"] == 1.5 and row["completed"] == 2


# -- notebook 07's rows and forecasts -----------------------------------------------------------

def test_length_summary():
    s = b.length_summary([10, 30, 20, 40, 100, 50, 60, 70, 80, 90, 5])
    assert s["mean"] == pytest.approx(555 / 11) and s["median"] == 50 and s["longest"] == 100
    assert s["p90"] == 90          # sorted, index int(0.9 x 10) = 9


def test_sim_rows_one_per_layout():
    reqs = [(8, 4)] * 4
    rows = b.sim_rows([b.simulate(reqs, 64, layout, 16, 32) for layout in b.LAYOUTS])
    assert [r["layout"] for r in rows] == list(b.LAYOUTS)
    for r in rows:
        shares = [r[k] for k in r if k.endswith("(%)")]
        assert len(shares) == 4 and sum(shares) == pytest.approx(100)
        assert r["steps to serve all"] > 0 and r["peak running"] >= r["mean running"]


def test_server_rows_read_server_info():
    info = {"kv_capacity_tokens": 512, "block_size": 16, "max_model_len": 256,
            "extra": {"kv_layout": "paged", "scheduler": "static", "chunked_prefill": True,
                      "max_num_seqs": 64, "max_num_batched_tokens": 512, "other": 1}}
    (row,) = b.server_rows({"static": SimpleNamespace(info=info)})
    assert row == {"server": "static", "kv_capacity_tokens": 512, "block_size": 16,
                   "max_model_len": 256,
                   "kv_layout": "paged", "scheduler": "static", "chunked_prefill": True,
                   "max_num_seqs": 64, "max_num_batched_tokens": 512}


def test_chunk_row_reads_gaps_and_the_late_prompt_first_token():
    # HISTORY: c arrives at step 2 (starts at 1.5 s) and gets its first token at 3.5 s
    row = b.chunk_row("x", HISTORY, ["a", "b"], "c", 2)
    assert row == {"run": "x", "short requests' longest gap (ms)": pytest.approx(2000),
                   "long prompt's first token (ms after it arrived)": pytest.approx(2000),
                   "steps": 4}


def test_bench_row():
    summary = {"output_throughput": 40.0, "request_throughput": 4.0, "ttft_ms": {"median": 100.0},
               "e2e_ms": {"median": 600.0, "p90": 900.0}, "completed": 6}
    row = b.bench_row("static", SimpleNamespace(summary=summary))
    assert row == {"scheduler": "static", "output tokens/s": 40.0, "requests/s": 4.0,
                   "median TTFT (ms)": 100.0,
                   "median latency (ms)": 600.0, "p90 latency (ms)": 900.0, "completed": 6}


def test_closed_loop_forecast_prices_steps():
    # 2 seats, answers 4, 2, 6, 2: static batches (4, 2) and (6, 2): 2 prefills + 3 + 5 decodes;
    # continuous: 1 + 2 prefill steps and (14 - 4) / 2 = 5 decode steps
    f = b.closed_loop_forecast([4, 2, 6, 2], 2, prefill_ms=100, decode_ms=10)
    assert (f["batches"], f["joins"]) == (2, 3)
    assert f["static_s"] == pytest.approx((100 + 30 + 100 + 50) / 1e3)
    assert f["continuous_s"] == pytest.approx((300 + 50) / 1e3)
    assert f["forecast_pct"] == pytest.approx(100 * 350 / 280)
    assert f["steps_share_pct"] == pytest.approx(100 * 14 / 2 / 10)


def test_gauge_row_puts_the_blocks_next_to_the_gauges():
    from workshop.live import kv_usage
    from workshop.live.metrics_sampler import Samples

    samples = Samples((kv_usage.RUNNING, kv_usage.WAITING, kv_usage.KV_USAGE), times=[0, 1, 2],
                      values={kv_usage.RUNNING: [0, 4, 2], kv_usage.WAITING: [2, 0, 0],
                              kv_usage.KV_USAGE: [0, 0.25, 0.1]}, errors=1)
    run = SimpleNamespace(requests=[SimpleNamespace(error=None)] * 3
                          + [SimpleNamespace(error="boom")],
                          samples=samples)
    session = SimpleNamespace(engine_name="vLLM",
                              info={"kv_capacity_tokens": 1040, "block_size": 16})
    row = kv_usage.gauge_row(session, run, 64, 8)
    # 4 requests of 71 tokens: 5 blocks each, of 1040 / 16 - 1 = 64 usable
    assert row["all at once, by the blocks (%)"] == pytest.approx(100 * 20 / 64)
    assert (row["sent"], row["completed"], row["peak running"], row["peak waiting"]) == (4, 3, 4, 2)
    assert row["peak KV usage (%)"] == pytest.approx(25) and (row["samples"],
                                                              row["failed polls"]) == (3, 1)
    hf = kv_usage.gauge_row(SimpleNamespace(engine_name="hf", info={}), run, 64, 8)
    assert hf["all at once, by the blocks (%)"] is None and hf["block size"] is None
