"""Notebook 15's arithmetic (``workshop/live/sampling.py``): the softmax at a temperature from raw
log-probabilities, shares of draws, total variation, entropy, distinct-n, JSON validity."""

from __future__ import annotations

import math
from collections import Counter

import pytest

from workshop.live import sampling

LPS = {"a": math.log(0.5), "b": math.log(0.3), "c": math.log(0.2)}


def test_softmax_at_one_is_the_distribution_and_temperature_sharpens_or_flattens():
    assert sampling.softmax_at(LPS, 1.0) == pytest.approx({"a": 0.5, "b": 0.3, "c": 0.2})
    cold, hot = sampling.softmax_at(LPS, 0.5), sampling.softmax_at(LPS, 2.0)
    # T = 0.5 squares the probabilities before renormalising: 0.25 / (0.25 + 0.09 + 0.04)
    assert cold["a"] == pytest.approx(0.25 / 0.38)
    assert hot["a"] < 0.5 < cold["a"] and sum(hot.values()) == pytest.approx(1.0)
    assert sampling.softmax_at(LPS, 0) == {"a": 1.0, "b": 0.0, "c": 0.0}


def test_shares_total_variation_entropy_and_distinct_n():
    shares = sampling.frequencies(Counter({"a": 6, "b": 3, "z": 1}), ["a", "b", "c"])
    assert shares == pytest.approx({"a": 0.6, "b": 0.3, "c": 0.0, sampling.OTHER: 0.1})
    assert sampling.total_variation({"a": 1.0}, {"b": 1.0}) == 1.0
    assert sampling.total_variation(shares, shares) == 0.0
    assert sampling.entropy_bits({"a": 0.5, "b": 0.5}) == 1.0
    assert sampling.entropy_bits({"a": 1.0, "b": 0.0}) == 0.0
    assert sampling.distinct_n(["the sea is blue", "the sea is grey"], 2) == pytest.approx(4 / 6)
    assert sampling.distinct_n(["one"], 2) == 0.0


def test_check_json_tells_valid_from_wrong_shape_from_not_json():
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    assert sampling.check_json('{"city": "Paris"}', schema) == "valid"
    assert sampling.check_json('{"town": "Paris"}', schema) == "wrong shape"
    assert sampling.check_json('```json\n{"city": "Paris"}\n```', schema) == "not JSON"


def test_choices_asks_at_most_per_request_at_a_time_and_passes_every_parameter():
    from types import SimpleNamespace

    calls = []

    def create(**kw):
        calls.append(kw)
        return SimpleNamespace(choices=[SimpleNamespace(message=SimpleNamespace(content="a"))]
                               * kw["n"])

    client = SimpleNamespace(chat=SimpleNamespace(completions=SimpleNamespace(create=create)))
    got = sampling.choices(client, "m", [], 16, 8, max_tokens=64, response_format={"x": 1})
    assert len(got) == 16 and [c["n"] for c in calls] == [8, 8]
    assert all(c["max_tokens"] == 64 and c["response_format"] == {"x": 1} for c in calls)
    calls.clear()
    counts = sampling.sample_first_tokens(client, "m", [], 0.7, 12, per_request=8)
    assert counts == Counter({"a": 16}) and calls[0]["max_tokens"] == 1
