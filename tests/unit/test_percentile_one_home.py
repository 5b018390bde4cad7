"""One percentile for the project: the harness's (``workshop.bench.request_metrics.percentile``),
which notebook 12's shared-queue measurements use too (issue 35, item 4)."""

import math

import numpy as np
import pytest

from workshop.bench import request_metrics
from workshop.shared_queue import experiments


def test_percentile_interpolates_like_numpy_linear():
    values = [0.5, 3.0, 1.0, 2.0, 10.0]
    for q in (0, 25, 50, 90, 99, 100):
        expected = float(np.percentile(values, q))
        assert request_metrics.percentile(values, q) == pytest.approx(expected)
    # By hand: sorted 0.5 1 2 3 10, p99 sits at rank 0.99 * 4 = 3.96, between 3 and 10.
    assert request_metrics.percentile(values, 99) == pytest.approx(3 + 0.96 * 7)


def test_percentile_with_an_infinite_value():
    # A rank that draws weight from an infinite value is infinite (numpy would give nan);
    # one that draws none is the finite value.
    assert request_metrics.percentile([1.0, 2.0, math.inf], 99) == math.inf
    assert request_metrics.percentile([1.0, 2.0, math.inf], 50) == 2.0
    assert math.isnan(request_metrics.percentile([], 50))


def test_shared_queue_p99_is_the_harness_p99():
    latencies = [float(x) for x in range(1, 11)]      # 1..10 s
    assert experiments.percentile(latencies, 99) == request_metrics.percentile(latencies, 99)
    # Interpolated (9.91 s), not the next higher sample (10 s) as it used to be.
    assert experiments.percentile(latencies, 99) == pytest.approx(9.91)
    # A request that never came back counts as infinitely slow.
    assert experiments.percentile(latencies + [None], 99) == math.inf
    assert request_metrics.stats(latencies)["p99"] == experiments.percentile(latencies, 99)
