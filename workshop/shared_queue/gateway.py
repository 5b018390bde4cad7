"""The gateway: annotates each request and puts it on the durable queue; collects replies.

It holds no model and, in pull mode, no state about the workers: it writes the model into the
subject (``work.pool.<model>``) and the request's size into a header, publishes to the
JetStream stream ``WORK`` (the publish returns once the server has stored the message), and
waits for the reply on a core-NATS subject of its own.

For the comparison it can also *push*: choose the worker itself and publish to that
worker's own subject (``work.direct.<worker>.<model>``): round-robin; to the worker with the
fewest outstanding requests (sent there, no reply yet: the rule of vLLM's data-parallel
load balancer, which counts requests); or to the one with the least outstanding work (the
sum of the sizes the gateway annotated: the cost-aware rule of Superlinked's direct
dispatch).
The workers are the same in both modes; only who decides where a request goes differs.

The gateway runs its NATS client on an event loop in a thread of its own, so a notebook
(which has its own event loop) calls it like ordinary functions.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import threading
import time
import uuid
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Sequence

import nats
from nats.js.api import AckPolicy, ConsumerConfig, RetentionPolicy, StorageType, StreamConfig

from workshop.shared_queue import wire
from workshop.shared_queue.worker import POOL_CONSUMER, STREAM, direct_consumer

PULL = "pull (shared queue)"
PUSH_RR = "push: round-robin"
PUSH_FEWEST = "push: fewest requests"
PUSH_LEAST = "push: least work"
ROUTES = (PULL, PUSH_RR, PUSH_FEWEST, PUSH_LEAST)


@dataclass
class Pending:
    req: wire.Request
    worker: str | None                       # the worker a push route chose
    reply: wire.Reply | None = None
    received: float = 0.0
    replies: int = 0                         # how many replies arrived (more than 1: a repeat)


@dataclass
class Run:
    """What one batch of requests produced, as plain records."""
    route: str
    records: list[dict] = field(default_factory=list)
    duplicates: int = 0                      # replies beyond the first for a request id
    started: float = 0.0
    ended: float = 0.0


class Gateway:
    def __init__(self, nats_url: str, ack_wait: float = 3.0, max_ack_pending: int = 1024):
        self.nats_url = nats_url
        self.ack_wait = ack_wait
        self.max_ack_pending = max_ack_pending
        self.workers: list[str] = []
        self.ready: dict[str, dict] = {}
        self.pending: dict[str, Pending] = {}
        self.outstanding: dict[str, int] = defaultdict(int)       # sizes, per worker
        self.in_flight: dict[str, int] = defaultdict(int)         # requests, per worker
        self._rr = itertools.count()
        self._ids = itertools.count()
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True,
                                        name="gateway")
        self._thread.start()
        self._call(self._connect())

    def _call(self, coro, timeout: float | None = None):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    async def _connect(self) -> None:
        self.nc = await nats.connect(self.nats_url, name="gateway")
        self.js = self.nc.jetstream()
        # Work-queue retention: a message leaves the stream when a worker acknowledges it.
        await self.js.add_stream(StreamConfig(name=STREAM, subjects=["work.>"],
                                              retention=RetentionPolicy.WORK_QUEUE,
                                              storage=StorageType.FILE))
        await self._add_consumer(POOL_CONSUMER, "work.pool.>")
        self.reply_subject = f"reply.{uuid.uuid4().hex[:12]}"
        await self.nc.subscribe(self.reply_subject, cb=self._on_reply)
        await self.nc.subscribe("events.ready.*", cb=self._on_ready)

    async def _add_consumer(self, name: str, subject: str) -> None:
        await self.js.add_consumer(STREAM, ConsumerConfig(
            durable_name=name, filter_subject=subject, ack_policy=AckPolicy.EXPLICIT,
            ack_wait=self.ack_wait, max_ack_pending=self.max_ack_pending))

    async def _on_ready(self, msg) -> None:
        self.ready[msg.subject.rsplit(".", 1)[-1]] = wire.decode(msg.data)

    async def _on_reply(self, msg) -> None:
        reply = wire.Reply.decode(msg.data)
        p = self.pending.get(reply.id)
        if p is None:
            return                              # a late reply from an earlier run
        p.replies += 1
        if p.reply is not None:
            return                              # a repeat (at-least-once): first one wins
        p.reply, p.received = reply, time.time()
        if p.worker is not None:
            self.outstanding[p.worker] -= p.req.size
            self.in_flight[p.worker] -= 1

    # -- workers ------------------------------------------------------------------------------

    def add_worker(self, worker_id: str) -> None:
        """Give a worker its own consumer (for push) before it starts."""
        self._call(self._add_consumer(direct_consumer(worker_id), f"work.direct.{worker_id}.>"))
        self.workers.append(worker_id)

    def wait_ready(self, worker_ids: Sequence[str], timeout: float, alive=None) -> None:
        deadline = time.monotonic() + timeout
        while not all(w in self.ready for w in worker_ids):
            if alive is not None and not alive():
                raise RuntimeError("a worker exited while starting (see its log)")
            if time.monotonic() > deadline:
                missing = [w for w in worker_ids if w not in self.ready]
                raise TimeoutError(f"workers not ready after {timeout:.0f} s: {missing}")
            time.sleep(0.05)

    def control(self, worker_id: str, cmd: str, timeout: float = 60.0, **args) -> dict:
        async def ask():
            msg = await self.nc.request(f"ctl.{worker_id}", wire.control(cmd, **args),
                                        timeout=timeout)
            return wire.decode(msg.data)
        return self._call(ask(), timeout + 5)

    def set_route(self, route: str) -> None:
        """Point every worker at the consumer this route fills."""
        for w in self.workers:
            self.control(w, "mode", consumer=POOL_CONSUMER if route == PULL else direct_consumer(w))

    def purge(self) -> None:
        """Empty the queue (between experiments)."""
        self._call(self.js.purge_stream(STREAM))

    # -- requests -----------------------------------------------------------------------------

    def new_request(self, model: str, prompt: list[int], max_tokens: int) -> wire.Request:
        return wire.Request(f"r{next(self._ids)}", model, list(prompt), max_tokens)

    def route(self, req: wire.Request, route: str) -> tuple[str, str | None]:
        """The subject a request is published to, and the worker a push route chose."""
        if route == PULL:
            return f"work.pool.{req.model}", None
        if route not in ROUTES:
            raise ValueError(f"unknown route {route!r}: {ROUTES}")
        k = next(self._rr) % len(self.workers)
        order = self.workers[k:] + self.workers[:k]      # ties go round-robin, not to w0
        if route == PUSH_RR:
            worker = order[0]
        elif route == PUSH_FEWEST:
            worker = min(order, key=lambda w: self.in_flight[w])
        else:
            worker = min(order, key=lambda w: self.outstanding[w])
        return f"work.direct.{worker}.{req.model}", worker

    async def _publish(self, req: wire.Request, route: str) -> None:
        subject, worker = self.route(req, route)
        req.sent = time.time()
        self.pending[req.id] = Pending(req, worker)
        if worker is not None:
            self.outstanding[worker] += req.size
            self.in_flight[worker] += 1
        await self.js.publish(subject, req.encode(), headers={
            wire.MODEL_HEADER: req.model, wire.SIZE_HEADER: str(req.size),
            wire.REPLY_HEADER: self.reply_subject})

    def run(self, requests: Sequence[wire.Request], offsets: Sequence[float], route: str,
            drain_s: float) -> Run:
        """Publish ``requests[i]`` at ``offsets[i]`` seconds from now (open loop: arrivals do
        not wait for replies), then wait up to ``drain_s`` after the last one for the replies.
        A request without a reply by then is recorded with ``latency_s`` None."""
        return self.start_run(requests, offsets, route, drain_s).result()

    def start_run(self, requests: Sequence[wire.Request], offsets: Sequence[float], route: str,
                  drain_s: float) -> "concurrent.futures.Future[Run]":
        """``run`` without waiting: its ``.result()`` is the Run (to act while it runs)."""
        return asyncio.run_coroutine_threadsafe(
            self._run(list(requests), list(offsets), route, drain_s), self.loop)

    async def _run(self, requests, offsets, route, drain_s) -> Run:
        self.pending.clear()
        self.outstanding.clear()
        self.in_flight.clear()
        run = Run(route, started=time.time())
        t0 = time.monotonic()
        for req, off in zip(requests, offsets):
            delay = t0 + off - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            await self._publish(req, route)
        deadline = time.monotonic() + drain_s
        while time.monotonic() < deadline and any(p.reply is None for p in self.pending.values()):
            await asyncio.sleep(0.01)
        run.ended = time.time()
        for p in self.pending.values():
            r = p.reply
            run.duplicates += max(0, p.replies - 1)
            run.records.append({
                "id": p.req.id, "model": p.req.model, "prompt_tokens": len(p.req.prompt),
                "max_tokens": p.req.max_tokens, "size": p.req.size, "route": route,
                "pushed_to": p.worker, "worker": r.worker if r else None, "sent": p.req.sent,
                "received": p.received if r else None,
                "latency_s": p.received - p.req.sent if r else None,
                "queue_s": r.pulled - p.req.sent if r else None,
                "delivered": r.delivered if r else None, "hit": r.hit if r else None,
                "load_s": r.load_s if r else None, "tokens": len(r.tokens) if r else 0,
                "error": r.error if r else "no reply", "replies": p.replies})
        return run

    def close(self) -> None:
        if not self.loop.is_running():
            return
        try:
            self._call(self.nc.drain(), 10)
        except Exception:
            pass
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5)
