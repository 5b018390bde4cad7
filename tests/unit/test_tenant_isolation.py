"""workshop.fleet.tenant_isolation: the threshold between two TTFT distributions, the probe plan,
and a whole measurement against a fake server whose prefix cache is keyed by (salt, prompt)."""

from __future__ import annotations

import itertools

import pytest

from workshop.fleet import tenant_isolation as ti
from workshop.live.live_requests import Timed


def test_a_clean_gap_is_told_apart_every_time():
    t, acc = ti.best_threshold([10, 11, 12], [50, 51, 52])
    assert acc == 1.0 and t == 12          # "sent" at or below the slowest sent probe


def test_identical_or_reversed_distributions_are_a_coin_flip():
    assert ti.best_threshold([30, 30], [30, 30]) == (None, 0.5)
    # sent probes slower: no threshold of the form "fast = sent" beats guessing "not sent"
    assert ti.best_threshold([50, 60], [10, 20]) == (None, 0.5)
    assert ti.best_threshold([], []) == (None, 0.0)


def test_overlap_worked_by_hand():
    # t=20: sent 10, 20 right, 40 wrong; unsent 30, 50, 60 right (> 20) -> 5 of 6
    assert ti.best_threshold([10, 20, 40], [30, 50, 60]) == (20, pytest.approx(5 / 6))


def test_the_plan_is_balanced_and_seeded():
    plan = ti.probe_plan(10, seed=3)
    assert plan.count(True) == plan.count(False) == 5
    assert plan == ti.probe_plan(10, seed=3) != ti.probe_plan(10, seed=4)


class FakeServer:
    """A shared prefix cache keyed by (salt, prompt): a cached prompt's first token comes in
    10 ms, an uncached one's in 50 ms."""

    def __init__(self):
        self.cache: set = set()
        self.sent: list = []

    def send(self, prompt, salt):
        self.sent.append((prompt, salt))
        hit = (salt, prompt) in self.cache
        self.cache.add((salt, prompt))
        return Timed(ttft=0.010 if hit else 0.050, cached_tokens=64 if hit else 0)


def test_a_shared_cache_leaks_and_salts_stop_the_leak():
    fake, counter = FakeServer(), itertools.count()
    out = ti.measure(None, n_probes=6, prompt_tokens=0, send=fake.send,
                     prompts=lambda: f"prompt {next(counter)}")
    plain, salted = out["summary"]
    assert (plain["salts"], salted["salts"]) == (False, True)
    assert plain["accuracy"] == 1.0 and plain["probes with cached tokens"] == 3
    assert salted["accuracy"] == 0.5 and salted["probes with cached tokens"] == 0
    assert plain["median TTFT, A sent it (ms)"] == pytest.approx(10)
    assert len(out["rows"]) == 12 and all(r["ttft_ms"] for r in out["rows"])
    # 1 warm-up, then per probe A's request and B's; each tenant keeps one salt, A's != B's
    salts = {s for _, s in fake.sent[1 + 12:]}
    assert len(fake.sent) == 1 + 2 * 12 and len(salts) == 2 and None not in salts


def test_failed_probes_are_left_out_of_the_summary():
    rows = [{"salts": False, "sent_by_a": True, "ttft_ms": 10.0, "cached_tokens": 5,
             "error": None},
            {"salts": False, "sent_by_a": False, "ttft_ms": None, "cached_tokens": None,
             "error": "ConnectionError: down"}]
    (row,) = ti.summarize(rows)
    assert row["probes"] == 1 and row["accuracy"] == 1.0
    assert row["median TTFT, A did not (ms)"] is None
