"""The models behind the worked answers of notebooks 12 and 14: the routes replayed over
engine steps of a given length (``shared_queue.experiments.simulate``), and Little's law per
replica under spread and concentrate (``api_gateway.experiments.forecast``)."""

from __future__ import annotations

import math

import pytest

from workshop.api_gateway import experiments as gx
from workshop.shared_queue import experiments as qx
from workshop.shared_queue.gateway import PULL, PUSH_RR


def test_one_worker_one_slot_serves_in_arrival_order():
    # steps of 1 s: 1, then 2 more, then 3 more
    assert qx.simulate([0, 0, 0], [1, 2, 3], 1, 1, (1.0, 0.0), PULL) == [1.0, 3.0, 6.0]


def test_round_robin_sends_a_short_request_behind_a_long_one_and_pull_does_not():
    # r0 (10 steps) goes to w0, r1 (1 step) to w1; r2 arrives at 0.1 s. Round-robin puts it
    # behind r0 on w0; pulled, it goes to w1, free again at 1 s.
    arrivals, steps = [0.0, 0.0, 0.1], [10, 1, 1]
    rr = qx.simulate(arrivals, steps, 2, 1, (1.0, 0.0), PUSH_RR)
    pull = qx.simulate(arrivals, steps, 2, 1, (1.0, 0.0), PULL)
    assert rr[2] == pytest.approx(10.9)       # waits for w0's 10 steps, then its own
    assert pull[2] == pytest.approx(1.9)      # w1 is free after 1 s


def test_a_step_grows_with_its_batch():
    # two requests of 2 steps in one slot-2 worker: steps of 1 + 0.5 * 2 = 2 s each
    assert qx.simulate([0, 0], [2, 2], 1, 2, (1.0, 0.5), PULL) == [4.0, 4.0]


def test_littles_law_latency_and_saturation():
    assert gx.latency_with_others(1.0, 0.1, 0.0) == 1.0
    assert gx.latency_with_others(1.0, 0.1, 5.0) == pytest.approx(2.0)    # 1 / (1 - 0.5)
    assert math.isinf(gx.latency_with_others(1.0, 0.1, 10.0))


def test_concentrate_piles_onto_the_first_replica_then_overflows_then_spreads():
    low = gx.forecast("concentrate", 1.0, 2, 1.0, 0.1, max_per_replica=4)
    assert low[0]["req/s"] == 1.0 and low[1]["req/s"] == 0.0
    mid = gx.forecast("concentrate", 3.0, 2, 1.0, 0.1, max_per_replica=4)
    assert mid[0]["holds"] == pytest.approx(4.0) and mid[1]["req/s"] > 0
    assert sum(r["req/s"] for r in mid) == pytest.approx(3.0)
    high = gx.forecast("concentrate", 9.0, 2, 1.0, 0.1, max_per_replica=4)
    assert high == gx.forecast("spread", 9.0, 2, 1.0, 0.1)
