"""Notebook 12's queue for real: a NATS server with JetStream from the project's own
dependency, the gateway, and worker processes running the teaching engine.

* a worker SIGKILLed while it holds requests loses none of them and duplicates none: the
  queue hands them to the other worker after ``ack_wait``, and each request gets one reply;
* the packing policy in a live worker: the models it evicted are the ones the policy says,
  in that order, and what it held never exceeded its budget.

The models are the bundled one cut to two layers (``catalog``): the tests are about the
queue and the policy, and a two-layer model keeps them to seconds.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

from workshop.shared_queue import experiments as ex
from workshop.shared_queue.cluster import Cluster
from workshop.shared_queue.gateway import PULL, PUSH_RR
from workshop.shared_queue.packing import ModelPool

pytestmark = pytest.mark.engine

ACK_WAIT = 1.5


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with Cluster.start(num_workers=2, num_models=3, budget_models=2, pinned=["smol-a"],
                       slots=2, layers=2, ack_wait=ACK_WAIT,
                       log_dir=tmp_path_factory.mktemp("queue-logs")) as c:
        yield c


def test_the_server_comes_from_the_project_dependency(cluster):
    from workshop.shared_queue.nats_server import server_binary
    assert server_binary().name == "nats-server"
    assert cluster.nats.info.get("jetstream") is True
    assert cluster.nats.alive() and all(w.alive() for w in cluster.workers.values())


def test_live_packing_evicts_what_the_policy_says_within_the_budget(cluster):
    # One model's room beside the pinned one: every switch between b and c is an eviction.
    cluster.configure(budget_models=2, pinned=["smol-a"])
    cluster.reset()
    cluster.gateway.set_route(PUSH_RR)
    order = ["smol-b", "smol-a", "smol-c", "smol-b", "smol-b", "smol-c", "smol-a", "smol-b"]
    for model in order:                # one at a time: no request waits for memory
        req = cluster.gateway.new_request(model, [11, 12, 13, 14], 2)
        run = cluster.gateway.run([req], [0.0], PUSH_RR, drain_s=60)
        assert run.records[0]["error"] is None and run.records[0]["tokens"] == 2
    stats = cluster.stats()
    assert sum(len(s["served"]) for s in stats.values()) == len(order)
    for s in stats.values():
        seen = [m for _, m, _ in s["served"]]
        policy = ModelPool(s["budget"], cluster.sizes, ["smol-a"])
        hits = [policy.admit(m).hit for m in seen]
        assert [hit for *_, hit in s["served"]] == hits                   # hit or miss, each
        assert s["evicted"] == policy.evictions                          # same victims, same order
        assert len(s["loads"]) == policy.misses                          # a load per miss
        assert s["peak_bytes"] <= s["budget"]                            # never over budget
        assert s["evicted"], "the sequence was chosen to force evictions on both workers"


def test_a_worker_killed_mid_request_loses_nothing_and_duplicates_nothing(cluster):
    cluster.configure(budget_models=2, pinned=["smol-a"])
    mix = ex.Mix(prompt=(8, 8), short=32, long=32, p_long=0.0)     # long enough to kill mid-way
    reqs = ex.make_requests(cluster, ["smol-a"] * 4, mix, np.random.default_rng(0))
    cluster.reset()
    cluster.gateway.set_route(PULL)
    future = cluster.gateway.start_run(reqs, [0.0] * len(reqs), PULL, drain_s=120)
    deadline = time.monotonic() + 60
    while True:                        # wait until w1 runs two requests it has not finished
        s = cluster.gateway.control("w1", "stats", reset=False)
        if s["held"] == 2 and not s["served"]:
            break
        assert time.monotonic() < deadline, s
        time.sleep(0.02)
    cluster.kill("w1")
    killed_at = time.time()
    run = future.result()

    records = {r["id"]: r for r in run.records}
    assert set(records) == {r.id for r in reqs}
    assert all(r["error"] is None for r in records.values()), records    # nothing lost
    assert all(r["replies"] == 1 for r in records.values())              # nothing repeated
    assert run.duplicates == 0
    assert all(r["tokens"] == 32 for r in records.values())
    assert {r["worker"] for r in records.values()} == {"w0"}             # the survivor did all
    redelivered = [r for r in records.values() if r["delivered"] > 1]
    assert len(redelivered) == 2                                         # what w1 held, again
    # ... not before ack_wait had passed since the dead worker last said it was working
    assert all(r["received"] - killed_at > ACK_WAIT * 0.5 for r in redelivered)
