"""The measurements of notebook 12, on a running ``Cluster``.

* ``measure_capacity``: how many requests per second the workers finish when the queue never
  runs dry (a burst, pulled);
* ``run_point`` / ``sweep``: open-loop Poisson arrivals at a rate, the same seeded requests
  for every route, and what came back: throughput, latency percentiles, batch sizes and busy
  time per worker (from the workers' own step records);
* ``knee``: per route, the highest offered load that is still served (the harness's rule);
* ``zipf_run``: requests whose models follow a Zipf popularity, through the packing policy;
* ``kill_run``: a worker killed while it holds requests, and what the queue did about it;
* ``simulate`` / ``simulated_p99``: the routes replayed in a model of the workers (engine
  steps of a measured length, nothing else), over a run's own arrivals: the worked answer's
  forecast.
"""

from __future__ import annotations

import heapq
import math
import time
from collections import deque
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from workshop.bench import request_metrics
from workshop.bench.sweep import find_knee
from workshop.live.prompt_latency import line_fit
from workshop.shared_queue import wire
from workshop.shared_queue.cluster import Cluster
from workshop.shared_queue.gateway import PULL, Run
from workshop.shared_queue.packing import che_hit_rate, replay, zipf_models, zipf_weights

VOCAB = (1000, 20000)        # prompt token ids are drawn from here: their content is irrelevant


@dataclass(frozen=True)
class Mix:
    """Request sizes: a prompt of ``prompt`` tokens (uniform), then ``short`` output tokens,
    or ``long`` ones with probability ``p_long``. Outputs ignore end-of-sequence, so a
    request's size is exactly what its annotation says."""
    prompt: tuple[int, int] = (8, 48)
    short: int = 2
    long: int = 24
    p_long: float = 0.2

    def sample(self, n: int, rng: np.random.Generator) -> list[tuple[int, int]]:
        prompts = rng.integers(self.prompt[0], self.prompt[1] + 1, n)
        outputs = np.where(rng.random(n) < self.p_long, self.long, self.short)
        return [(int(p), int(o)) for p, o in zip(prompts, outputs)]


def make_requests(cluster: Cluster, models: Sequence[str], mix: Mix,
                  rng: np.random.Generator) -> list[wire.Request]:
    return [cluster.gateway.new_request(m, rng.integers(*VOCAB, p).tolist(), o)
            for m, (p, o) in zip(models, mix.sample(len(models), rng))]


def poisson_offsets(n: int, rate: float, rng: np.random.Generator) -> list[float]:
    """Arrival times of ``n`` requests of a Poisson process at ``rate`` per second."""
    gaps = rng.exponential(1.0 / rate, n)
    gaps[0] = 0.0
    return np.cumsum(gaps).tolist()


def percentile(values: Sequence[float | None], q: float) -> float:
    """The harness's ``q``-th percentile (``request_metrics.percentile``, interpolated),
    where a request that never came back (None) counts as infinitely slow."""
    return request_metrics.percentile([math.inf if x is None else x for x in values], q)


# -- what the workers did -------------------------------------------------------------------------

def worker_activity(stats: dict[str, dict], start: float, end: float) -> dict[str, dict]:
    """Per worker, over [start, end]: engine steps and their batch sizes, busy seconds
    (steps + model loads) and the busy fraction of the wall time."""
    out = {}
    for w, s in stats.items():
        steps = [(t, m, b, d) for t, m, b, d in s["steps"] if start <= t <= end + 1]
        loads = [(t, m, d) for t, m, d in s["loads"] if start <= t <= end + 1]
        busy = sum(d for *_, d in steps) + sum(d for *_, d in loads)
        wall = max(end - start, 1e-9)
        out[w] = {"steps": len(steps), "batches": [b for _, _, b, _ in steps],
                  "step_s": [d for *_, d in steps],
                  "busy_s": busy, "wall_s": wall, "busy": busy / wall,
                  "served": len(s["served"]), "loads": len(loads),
                  "peak_bytes": s["peak_bytes"], "budget": s["budget"],
                  "rss_bytes": s["rss_bytes"], "served_list": s["served"]}
    return out


def _merge_activity(parts: Sequence[dict[str, dict]]) -> dict[str, dict]:
    out: dict[str, dict] = {}
    for act in parts:
        for w, a in act.items():
            m = out.setdefault(w, {"steps": 0, "batches": [], "step_s": [], "busy_s": 0.0,
                                   "wall_s": 0.0, "served": 0, "loads": 0, "peak_bytes": 0,
                                   "served_list": []})
            for k in ("steps", "busy_s", "wall_s", "served", "loads"):
                m[k] += a[k]
            m["batches"] += a["batches"]
            m["step_s"] += a["step_s"]
            m["served_list"] += a["served_list"]
            m["peak_bytes"] = max(m["peak_bytes"], a["peak_bytes"])
            m["budget"], m["rss_bytes"] = a["budget"], a["rss_bytes"]
            m["busy"] = m["busy_s"] / m["wall_s"]
    return out


@dataclass
class Point:
    """One route at one rate: one or more runs (rounds), taken as one sample."""
    route: str
    rate: float                                   # asked, req/s
    runs: list[Run]
    activities: list[dict[str, dict]]             # per run: worker -> activity
    offsets: list[list[float]]                    # per run: arrival times

    @property
    def records(self) -> list[dict]:
        return [r for run in self.runs for r in run.records]

    @property
    def activity(self) -> dict[str, dict]:
        return _merge_activity(self.activities)

    @property
    def duplicates(self) -> int:
        return sum(run.duplicates for run in self.runs)

    @classmethod
    def merge(cls, points: Sequence["Point"]) -> "Point":
        return cls(points[0].route, points[0].rate, [r for p in points for r in p.runs],
                   [a for p in points for a in p.activities],
                   [o for p in points for o in p.offsets])

    def summary(self) -> dict:
        rec = self.records
        done = [r for r in rec if r["latency_s"] is not None and not r["error"]]
        walls = []                     # per run: first publish to last reply
        for run in self.runs:
            ends = [r["received"] for r in run.records if r["received"] is not None]
            if ends:
                walls.append(max(ends) - min(r["sent"] for r in run.records))
        lat = [r["latency_s"] if r["latency_s"] is not None and not r["error"] else None
               for r in rec]
        shortest = min((r["max_tokens"] for r in rec), default=0)
        short = [latency for latency, r in zip(lat, rec) if r["max_tokens"] == shortest]
        activity = self.activity
        batches = [b for a in activity.values() for b in a["batches"]]
        busy = [a["busy"] for a in activity.values()]
        span = sum(o[-1] for o in self.offsets)
        return {"route": self.route, "asked req/s": self.rate,
                # arrivals over the time they took (the Poisson draw, not the rate asked)
                "offered req/s": sum(len(o) - 1 for o in self.offsets) / span if span > 0
                else math.nan,
                "achieved req/s": len(done) / sum(walls) if sum(walls) > 0 else 0.0,
                "requests": len(rec), "no reply": len(rec) - len(done),
                "p50 s": percentile(lat, 50), "p99 s": percentile(lat, 99),
                "p99 short s": percentile(short, 99),
                "mean batch": float(np.mean(batches)) if batches else 0.0,
                "busy min": min(busy) if busy else 0.0, "busy max": max(busy) if busy else 0.0,
                "repeats": self.duplicates}


def run_point(cluster: Cluster, route: str, rate: float, n: int, mix: Mix, seed: int,
              models: Sequence[str] | None = None, drain_s: float | None = None) -> Point:
    """``n`` requests arriving at ``rate`` per second (Poisson), all routed by ``route``; the
    same ``seed`` gives the same requests and arrival times. Replies are awaited for as long
    as the arrivals took (``drain_s``) after the last one."""
    rng = np.random.default_rng(seed)
    n = max(2, n)
    names = list(models) if models else [next(iter(cluster.models))] * n
    reqs = make_requests(cluster, names[:n], mix, rng)
    offsets = poisson_offsets(n, rate, rng)
    cluster.reset()
    cluster.gateway.set_route(route)
    run = cluster.gateway.run(reqs, offsets, route,
                              drain_s if drain_s is not None else max(offsets[-1], 5.0))
    activity = worker_activity(cluster.stats(reset=True), run.started, run.ended)
    return Point(route, rate, [run], [activity], [offsets])


def step_line(activity: dict[str, dict]) -> tuple[float, float]:
    """Seconds per engine step as ``fixed + per_request * batch``, least squares over every
    worker's steps: (fixed, per_request). One batch size only: its mean step, per_request 0."""
    pairs = [(b, d) for a in activity.values() for b, d in zip(a["batches"], a["step_s"])]
    fit = line_fit(pairs)
    if fit is None:
        return float(np.mean([d for _, d in pairs])) if pairs else 0.0, 0.0
    slope, intercept = fit
    return intercept, slope


def measure_capacity(cluster: Cluster, mix: Mix, n: int, seed: int = 0,
                     timeout: float = 300.0) -> dict:
    """All ``n`` requests at once, pulled: finished requests per second while the queue never
    runs dry (the most the workers can do with this mix), and the length of an engine step
    against its batch (``step_line``)."""
    rng = np.random.default_rng(seed)
    reqs = make_requests(cluster, [next(iter(cluster.models))] * n, mix, rng)
    cluster.reset()
    cluster.gateway.set_route(PULL)
    run = cluster.gateway.run(reqs, [0.0] * n, PULL, timeout)
    done = [r for r in run.records if r["latency_s"] is not None]
    seconds = max(r["latency_s"] for r in done)     # all were sent at once
    activity = worker_activity(cluster.stats(reset=True), run.started, run.ended)
    fixed, per_request = step_line(activity)
    return {"requests": n, "seconds": seconds, "req_per_s": len(done) / seconds,
            "mean batch": float(np.mean([b for a in activity.values() for b in a["batches"]])),
            "step fixed s": fixed, "step per request s": per_request}


def sweep(cluster: Cluster, routes: Sequence[str], rates: Sequence[float], n: int,
          mix: Mix, rounds: int = 1, seed: int = 1, progress: Callable = iter) -> list[Point]:
    """Every route at every rate, ``n`` requests each, in ``rounds`` turns: at each rate the
    routes take turns with ``n / rounds`` requests, so a slow spell of a shared machine
    hits them alike. Round k of rate i gets the same requests at the same times whatever
    the route."""
    per = max(2, math.ceil(n / rounds))
    jobs = [(i, rate, k, route) for i, rate in enumerate(rates) for k in range(rounds)
            for route in routes]
    parts: dict[tuple[str, int], list[Point]] = {}
    for i, rate, k, route in progress(jobs):
        parts.setdefault((route, i), []).append(
            run_point(cluster, route, rate, per, mix, seed + 1000 * i + k))
    return [Point.merge(parts[(route, i)]) for i in range(len(rates)) for route in routes]


def knee(points: Sequence[Point], route: str, p99_objective_s: float) -> dict:
    """The highest offered load ``route`` still serves: at it and every lower load, at least
    90 % of the offered requests per second come back, and p99 latency is within the
    objective (``workshop.bench.sweep.find_knee``, the harness's rule)."""
    rows = sorted((p.summary() for p in points if p.route == route),
                  key=lambda r: r["offered req/s"])
    i = find_knee([r["offered req/s"] for r in rows], [r["achieved req/s"] for r in rows],
                  {"e2e_ms": [r["p99 s"] * 1e3 for r in rows]},
                  request_metrics.SLO(e2e_ms=p99_objective_s * 1e3))
    return {"route": route, "index": i,
            "knee req/s": None if i is None else rows[i]["offered req/s"],
            "last point": i == len(rows) - 1 if i is not None else False,
            "rows": rows}


# -- the routes in a model of the workers ---------------------------------------------------------

def simulate(arrivals: Sequence[float], steps: Sequence[int], workers: int, slots: int,
             step: tuple[float, float], route: str) -> list[float]:
    """Each request's latency in a model of the workers: a worker runs up to ``slots``
    requests, one engine step at a time, a step taking ``fixed + per_request * batch``
    seconds (``step``); request i needs ``steps[i]`` steps (one per output token: the prefill
    makes the first). Before each step a worker with free slots takes waiting requests, in
    arrival order: from one shared queue (``PULL``), or from its own, where request k of the
    run was pushed round-robin (any push route is taken as round-robin). No network, no
    queue server, no loads: what routing alone does."""
    fixed, per = step
    order = sorted(range(len(arrivals)), key=lambda i: arrivals[i])
    pull = route == PULL
    queues = [deque() for _ in range(1 if pull else workers)]
    running: list[dict[int, int]] = [{} for _ in range(workers)]
    latency = [math.inf] * len(arrivals)
    clock = [(0.0, w) for w in range(workers)]
    nxt = 0                                          # next arrival not yet queued
    while clock:
        t, w = heapq.heappop(clock)
        while nxt < len(order) and arrivals[order[nxt]] <= t:
            queues[0 if pull else nxt % workers].append(order[nxt])
            nxt += 1
        mine = queues[0 if pull else w]
        while mine and len(running[w]) < slots:
            running[w][mine.popleft()] = 0
        if not running[w]:
            if nxt < len(order):                     # idle: look again at the next arrival
                heapq.heappush(clock, (arrivals[order[nxt]], w))
            continue                                 # nothing will ever come: done
        t += fixed + per * len(running[w])
        for i in list(running[w]):
            running[w][i] += 1
            if running[w][i] >= steps[i]:
                del running[w][i]
                latency[i] = t - arrivals[i]
        heapq.heappush(clock, (t, w))
    return latency


def simulated_p99(point: Point, workers: int, slots: int, step: tuple[float, float]) -> float:
    """The p99 latency ``simulate`` gives for ``point``'s route over each of its runs' own
    arrival times and output lengths."""
    lat: list[float] = []
    for run in point.runs:
        t0 = min(r["sent"] for r in run.records)
        lat += simulate([r["sent"] - t0 for r in run.records],
                        [max(1, r["max_tokens"]) for r in run.records], workers, slots, step,
                        point.route)
    return percentile(lat, 99)


# -- Zipf popularity through the packing policy ---------------------------------------------------

@dataclass
class ZipfResult:
    s: float
    names: list[str]
    point: Point
    budget_models: float
    pinned: list[str]

    def hit_rate(self) -> float:
        served = [r for r in self.point.records if r["hit"] is not None]
        return float(np.mean([r["hit"] for r in served])) if served else math.nan

    def che(self) -> float:
        return che_hit_rate(zipf_weights(len(self.names), self.s), self.budget_models,
                            len(self.pinned))

    def replay_hit_rate(self, sizes: dict[str, int], budget: int) -> float:
        """The same policy replayed over each worker's own sequence of requests, one at a
        time: what the live hit rate would be if no request ever had to wait for memory."""
        hits = total = 0
        for a in self.point.activity.values():
            seq = [m for _, m, _ in a["served_list"]]
            pool = replay(seq, budget, sizes, self.pinned)
            hits, total = hits + pool.hits, total + pool.hits + pool.misses
        return hits / total if total else math.nan

    def first_use_misses(self) -> int:
        """Misses that were a worker's first request for an unpinned model: the policy
        starts with only the pinned models loaded, so these miss whatever the popularity."""
        return sum(len({m for _, m, _ in a["served_list"] if m not in self.pinned})
                   for a in self.point.activity.values())


def zipf_run(cluster: Cluster, s: float, n: int, rate: float, mix: Mix, budget_models: float,
             pinned: Sequence[str], seed: int = 7) -> ZipfResult:
    """``n`` requests at ``rate`` per second whose models follow Zipf(``s``), pulled by
    workers that pack models with ``budget_models`` and ``pinned`` (reconfigured first)."""
    names = list(cluster.models)
    cluster.configure(budget_models, pinned)
    rng = np.random.default_rng(seed)
    models = zipf_models(names, s, n, rng)
    point = run_point(cluster, PULL, rate, n, mix, seed, models=models,
                      drain_s=max(30.0, n / rate))
    return ZipfResult(s, names, point, budget_models, list(pinned))


def replay_curves(names: Sequence[str], sizes: dict[str, int], budgets: Sequence[float],
                  exponents: Sequence[float], pinned: int, n: int = 20_000,
                  seed: int = 3) -> list[dict]:
    """Hit rate of the policy replayed over ``n`` Zipf requests (one worker), per budget (in
    models) and Zipf exponent, next to Che's approximation."""
    size = max(sizes.values())
    rows = []
    for s in exponents:
        seq = zipf_models(list(names), s, n, np.random.default_rng(seed))
        for b in budgets:
            if b <= pinned and b < len(names):
                continue                 # nothing but the pinned models would ever fit
            pool = replay(seq, int(b * size), sizes, list(names)[:pinned])
            rows.append({"zipf s": s, "budget (models)": b, "replayed hit rate": pool.hit_rate,
                         "Che's approximation": che_hit_rate(zipf_weights(len(names), s), b,
                                                             pinned)})
    return rows


# -- a worker dies mid-request ----------------------------------------------------------------

def kill_run(cluster: Cluster, victim: str, n: int, mix: Mix, seed: int = 11,
             timeout: float = 120.0) -> dict:
    """``n`` requests at once, pulled; ``victim`` is SIGKILLed as soon as it holds a request
    that has not finished. Returns the run, which requests the victim held, and when."""
    rng = np.random.default_rng(seed)
    reqs = make_requests(cluster, [next(iter(cluster.models))] * n, mix, rng)
    cluster.reset()
    cluster.gateway.set_route(PULL)
    future = cluster.gateway.start_run(reqs, [0.0] * n, PULL, timeout)
    held, killed_at = 0, None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not future.done():
        held = cluster.gateway.control(victim, "stats", reset=False)["held"]
        if held:
            cluster.kill(victim)
            killed_at = time.time()
            break
        time.sleep(0.05)
    run = future.result()
    return {"run": run, "victim": victim, "held_when_killed": held, "killed_at": killed_at,
            "ack_wait": cluster.gateway.ack_wait}
