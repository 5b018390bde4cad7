"""The gateway's routing policies on hand-computed outstanding counts."""

from __future__ import annotations

import pytest

from workshop.api_gateway.routing import Concentrate, Spread, make_policy


def test_spread_takes_the_least_loaded_and_breaks_ties_round_robin():
    p = Spread()
    assert [p.choose([0, 0, 0]) for _ in range(4)] == [0, 1, 2, 0]
    assert p.choose([3, 1, 2]) == 1
    assert p.choose([2, 5, 2]) == 2                 # tie 0/2: the round robin resumes after 1
    assert p.choose([2, 5, 2]) == 0


def test_spread_on_a_live_sequence_keeps_replicas_level():
    p, out = Spread(), [0, 0]
    for _ in range(5):
        out[p.choose(out)] += 1
    assert out == [3, 2]


def test_concentrate_fills_the_first_then_overflows_in_order():
    p = Concentrate(max_per_replica=2)
    out = [0, 0, 0]
    chosen = []
    for _ in range(7):
        i = p.choose(out)
        chosen.append(i)
        out[i] += 1
    # 2 on the first, 2 on the second, 2 on the third, then the least loaded (the first)
    assert chosen == [0, 0, 1, 1, 2, 2, 0]
    assert p.choose([1, 0, 0]) == 0                 # room left on the first: it stays there
    assert p.choose([2, 3, 1]) == 2


def test_make_policy_names():
    assert make_policy("spread").name == "spread"
    assert make_policy("concentrate", 4).max_per_replica == 4
    with pytest.raises(ValueError):
        make_policy("random")
    with pytest.raises(ValueError):
        Concentrate(0)
