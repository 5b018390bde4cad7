"""Notebook 01's TTFT sweep times cold requests only: stream_completion reads the prompt tokens
a server's prefix cache served (usage.prompt_tokens_details.cached_tokens), and a request that
reports any keeps its row but is left out of the line, the plot and the medians, and counted."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from workshop.live import live_requests, prompt_latency


class _Client:
    def __init__(self, cached):
        self.cached, self.completions = cached, self

    def create(self, **_):
        details = None if self.cached is None else SimpleNamespace(cached_tokens=self.cached)
        yield SimpleNamespace(choices=[SimpleNamespace(text="a")], usage=None)
        yield SimpleNamespace(choices=[], usage=SimpleNamespace(
            prompt_tokens=64, completion_tokens=1, prompt_tokens_details=details))


@pytest.mark.parametrize("cached", [None, 0, 48])
def test_stream_completion_reads_cached_tokens(cached):
    assert live_requests.stream_completion(_Client(cached), "m", "p", 1).cached_tokens == cached


def _row(n, ms, cached=0, error=""):
    return {"prompt tokens": n, "TTFT (ms)": ms, "cached tokens": cached, "error": error}


def test_cached_requests_are_left_out_and_counted():
    rows = [_row(100, 70), _row(100, 90), _row(500, 160), _row(500, 20, cached=480),
            _row(900, 240), _row(900, math.nan, error="Timeout"), _row(300, 10, cached=None)]
    assert prompt_latency.cached_count(rows) == 1
    assert [r["TTFT (ms)"] for r in prompt_latency.cold(rows)] == [70, 90, 160, 240, 10]
    assert prompt_latency.median_by_length(rows) == [(100, 80), (300, 10), (500, 160), (900, 240)]
    # the cached 20 ms at 500 tokens would have pulled the line down
    rows.pop()
    per_1k, at_zero = prompt_latency.ttft_slope(rows)
    assert per_1k == pytest.approx(200) and at_zero == pytest.approx(60)


def test_sweep_keeps_the_cached_tokens_of_each_request(monkeypatch):
    reported = iter([0, 0, 96])                  # the warm-up, then two timed requests
    monkeypatch.setattr(prompt_latency, "reset_prefix_cache", lambda s, **_: None)
    monkeypatch.setattr(prompt_latency, "stream_completion", lambda *a: live_requests.Timed(
        ttft=0.1, end=0.2, prompt_tokens=128, cached_tokens=next(reported)))
    session = SimpleNamespace(openai=lambda: None, model="m")
    maker = SimpleNamespace(make=lambda n: "x" * n)
    rows = prompt_latency.ttft_sweep(session, maker, [128, 128])
    assert [r["cached tokens"] for r in rows] == [0, 96]
    assert prompt_latency.cached_count(rows) == 1 and len(prompt_latency.cold(rows)) == 1
