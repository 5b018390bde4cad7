"""The gateway's per-key limits as pure arithmetic: the token bucket and the quota window,
on hand-computed cases (times are passed in, nothing waits)."""

from __future__ import annotations

import pytest

from workshop.api_gateway.bucket import TokenBucket
from workshop.api_gateway.quota import QuotaWindow


def test_a_full_bucket_lets_a_burst_through_then_refuses_with_the_wait():
    b = TokenBucket(per_minute=60, burst=3)         # one token a second, three at most
    assert [b.take(10.0) for _ in range(3)] == [0.0, 0.0, 0.0]
    assert b.take(10.0) == pytest.approx(1.0)       # empty: the next token is 1 s away
    assert b.take(10.25) == pytest.approx(0.75)     # a refusal takes nothing
    assert b.take(11.0) == 0.0                      # one token refilled
    assert b.take(11.0) == pytest.approx(1.0)


def test_the_bucket_refills_at_the_rate_and_never_beyond_the_burst():
    b = TokenBucket(per_minute=30, burst=2)         # 0.5 tokens a second
    assert b.take(0.0) == 0.0 and b.take(0.0) == 0.0
    assert b.take(1.0) == pytest.approx(1.0)        # 0.5 tokens: 0.5 more at 0.5/s = 1 s
    assert b.take(2.0) == 0.0                       # 1.0 token at t=2
    # a long quiet spell fills it to the burst, not to 0.5 * 1000
    assert [b.take(1000.0) for _ in range(3)] == [0.0, 0.0, pytest.approx(2.0)]


def test_a_clock_that_steps_back_adds_nothing():
    b = TokenBucket(per_minute=60, burst=1)
    assert b.take(5.0) == 0.0
    assert b.take(4.0) > 0                          # no refill from negative time


@pytest.mark.parametrize("args", [(0, 1), (60, 0)])
def test_the_bucket_refuses_nonsense(args):
    with pytest.raises(ValueError):
        TokenBucket(*args)


def test_the_quota_admits_until_spent_and_says_when_the_window_ends():
    q = QuotaWindow(tokens=100, window_s=60)
    assert q.check(0.0) == 0.0                      # the window opens at t=0
    q.add(70, 10.0)
    assert q.check(20.0) == 0.0 and q.remaining(20.0) == 30
    q.add(45, 25.0)                                 # the last admitted request overshoots
    assert q.remaining(25.0) == 0
    assert q.check(30.0) == pytest.approx(30.0)     # spent: back at t=60
    assert q.resets_in(45.0) == pytest.approx(15.0)
    assert q.check(60.0) == 0.0 and q.remaining(60.0) == 100   # a new window, nothing used


def test_a_quota_used_exactly_is_spent():
    q = QuotaWindow(tokens=10, window_s=60)
    q.add(9, 0.0)
    assert q.check(1.0) == 0.0                      # one token left: admitted
    q.add(1, 2.0)
    assert q.check(3.0) == pytest.approx(57.0)      # none left


def test_tokens_of_a_request_finished_after_its_window_go_to_the_next():
    q = QuotaWindow(tokens=10, window_s=5)
    assert q.check(0.0) == 0.0
    q.add(8, 6.0)                                   # finished at t=6: window [6, 11)
    assert q.remaining(6.0) == 2 and q.resets_in(6.0) == pytest.approx(5.0)


def test_the_quota_refuses_nonsense():
    with pytest.raises(ValueError):
        QuotaWindow(tokens=0, window_s=1)
