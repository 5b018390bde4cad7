"""A worker: a separate OS process that pulls the requests it can serve from the queue,
batches them in the teaching engine, replies, and only then acknowledges.

One loop, in this order, for as long as the worker lives::

    free = slots - held                  # how many more requests it can run at once
    pull up to `free` messages           # wait for the first only when there is nothing to do
    for each: admit its model            # packing policy: hit, or evict + load
              add it to that model's engine
    one engine step per model with work  # the engine batches whatever is running
    for each finished request:
        publish the reply, flush         # the reply has left this process...
        ack the message                  # ...before the queue forgets the request

A worker that dies anywhere before the ack leaves its requests unacknowledged, and the queue
hands them to another worker once ``ack_wait`` has passed since the last sign of life
(``in_progress`` every ``ack_wait / 3`` seconds while a request runs). The price is
at-least-once delivery: a worker killed between its reply and its ack gets its request run
twice, so the gateway drops a second reply to the same request id.

Requests come from one JetStream consumer at a time, set by the gateway (``mode``): the
shared ``pool`` consumer (pull: any worker takes the next request) or the worker's own
``direct-<id>`` consumer (push: the gateway already chose the worker).

Run as ``python -m workshop.shared_queue.worker SPEC_JSON`` (``spawn`` does it).
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import signal
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import nats
import nats.errors

from reference_server import launch
from workshop.shared_queue import wire
from workshop.shared_queue.packing import ModelPool

# torch and the teaching engine are imported inside the worker process only: the notebook
# imports this module to show its code and must not pay for them.

STREAM = "WORK"
POOL_CONSUMER = "pool"


def direct_consumer(worker_id: str) -> str:
    return f"direct-{worker_id}"


@dataclass
class WorkerSpec:
    id: str
    nats_url: str
    models: dict[str, str]            # name -> folder
    sizes: dict[str, int]             # name -> bytes (catalog.model_bytes)
    budget: int                       # bytes of models this worker may hold
    pinned: list[str] = field(default_factory=list)
    slots: int = 4                    # requests it runs at once (the batch it builds)
    num_blocks: int = 32              # KV blocks per model
    ack_wait: float = 3.0
    threads: int = 1


@dataclass(eq=False)                  # compared by identity: one per pulled message
class Held:
    """A request this worker pulled and has not acknowledged yet."""
    msg: object                       # nats Msg
    req: wire.Request
    reply_to: str
    pulled: float
    delivered: int
    hit: bool = True
    load_s: float = 0.0
    tokens: list[int] = field(default_factory=list)


class Worker:
    def __init__(self, spec: WorkerSpec):
        self.spec = spec
        self.pool = ModelPool(spec.budget, spec.sizes, spec.pinned)
        self.engines: dict[str, object] = {}
        self.held: dict[str, Held] = {}           # request id -> held message
        self.waiting: list[Held] = []             # pulled, its model cannot fit yet
        self.consumer = POOL_CONSUMER
        self.stopping = False
        self._reset_stats()

    # -- statistics the gateway asks for ------------------------------------------------------

    def _reset_stats(self) -> None:
        self.steps: list[tuple[float, str, int, float]] = []   # (end, model, batch, seconds)
        self.loads: list[tuple[float, str, float]] = []        # (end, model, seconds)
        self.served: list[tuple[str, str, bool]] = []          # (request id, model, hit)
        self.evicted: list[str] = []
        self.peak_bytes = sum(self.spec.sizes[m] for m in getattr(self, "engines", {}))

    def stats(self) -> dict:
        import psutil
        return {"id": self.spec.id, "pid": os.getpid(), "steps": self.steps, "loads": self.loads,
                "served": self.served, "evicted": self.evicted, "loaded": list(self.pool.loaded),
                "used_bytes": self.pool.used, "peak_bytes": self.peak_bytes,
                "budget": self.pool.budget,
                "held": len(self.held), "consumer": self.consumer,
                "rss_bytes": psutil.Process().memory_info().rss}

    # -- models -------------------------------------------------------------------------------

    def _load(self, name: str) -> float:
        """Load a model and run it once (a cold model's first step is several times slower
        than the next: that cost belongs to the load, not to the first request)."""
        from mini_engine.engine import LLMEngine
        from mini_engine.sequence import SamplingParams
        # What is resident while this model loads: a policy that loaded before it evicted
        # would show here as more than the budget.
        resident = sum(self.spec.sizes[m] for m in self.engines) + self.spec.sizes[name]
        self.peak_bytes = max(self.peak_bytes, resident)
        t0 = time.perf_counter()
        engine = LLMEngine(self.spec.models[name], dtype="float32",
                           num_blocks=self.spec.num_blocks, max_num_seqs=self.spec.slots,
                           num_threads=self.spec.threads, history=16)
        engine.generate([[1, 2, 3, 4]], SamplingParams(max_tokens=2, ignore_eos=True))
        self.engines[name] = engine
        return time.perf_counter() - t0

    def _unload(self, name: str) -> None:
        self.engines.pop(name, None)
        gc.collect()            # give the weights' memory back before the next model loads

    async def _admit(self, h: Held) -> bool:
        """Make the request's model resident (packing policy); False: it must wait."""
        busy = {x.req.model for x in self.held.values() if x not in self.waiting}
        decision = self.pool.admit(h.req.model, busy)
        if decision is None:
            return False
        for name in decision.evict:
            self._unload(name)
            self.evicted.append(name)
        if not decision.hit:
            h.hit = False
            h.load_s = await asyncio.get_running_loop().run_in_executor(None, self._load,
                                                                        h.req.model)
            self.loads.append((time.time(), h.req.model, h.load_s))
        from mini_engine.sequence import SamplingParams
        self.engines[h.req.model].add_request(
            h.req.prompt, SamplingParams(max_tokens=h.req.max_tokens, ignore_eos=True),
            request_id=h.req.id)
        return True

    # -- the queue ----------------------------------------------------------------------------

    async def pull(self, n: int, wait_s: float) -> list:
        """Ask the queue for up to ``n`` messages: those available now, or, with ``wait_s``,
        wait up to that long for the first one. Never more than ``n``: a worker takes only
        the work it has room for."""
        subject = f"$JS.API.CONSUMER.MSG.NEXT.{STREAM}.{self.consumer}"
        got = []
        if wait_s > 0:
            await self.nc.publish(subject, json.dumps(
                {"batch": 1, "expires": int(wait_s * 1e9)}).encode(), reply=self.inbox)
            got += await self._collect(1, wait_s + 2.0)
            if not got:
                return got
        if n > len(got):
            await self.nc.publish(subject, json.dumps(
                {"batch": n - len(got), "no_wait": True}).encode(), reply=self.inbox)
            got += await self._collect(n - len(got), 2.0)
        return got

    async def _collect(self, n: int, timeout: float) -> list:
        """Messages of one pull request, until ``n`` arrived or the server says there are no
        more (a status message: 404 no messages, 408 request expired)."""
        out = []
        while len(out) < n:
            try:
                msg = await self.inbox_sub.next_msg(timeout)
            except nats.errors.TimeoutError:       # the server never answered
                break
            if msg.headers and "Status" in msg.headers:
                break
            out.append(msg)
        return out

    def _hold(self, msg) -> Held:
        req = wire.Request.decode(msg.data)
        h = Held(msg, req, msg.headers[wire.REPLY_HEADER], time.time(),
                 msg.metadata.num_delivered)
        self.held[req.id] = h
        return h

    async def _reply(self, h: Held, error: str | None) -> None:
        reply = wire.Reply(h.req.id, self.spec.id, h.tokens, error, h.delivered, h.hit, h.load_s,
                           h.pulled, time.time())
        await self.nc.publish(h.reply_to, reply.encode())
        await self.nc.flush()           # the reply is out of this process ...
        await h.msg.ack()               # ... so the queue may forget the request
        await self.nc.flush()
        self.held.pop(h.req.id, None)
        self.served.append((h.req.id, h.req.model, h.hit))

    async def _keepalive(self) -> None:
        """Tell the queue every held request is still being worked on, so ``ack_wait`` can be
        short (fast redelivery after a crash) while requests run longer than it."""
        while not self.stopping:
            await asyncio.sleep(self.spec.ack_wait / 3)
            for h in list(self.held.values()):
                try:
                    await h.msg.in_progress()
                except nats.errors.Error:      # the connection is closing: nothing to keep
                    return

    # -- engine steps -------------------------------------------------------------------------

    def _step_all(self) -> list:
        """One step of every model with work; the engine's outputs of all of them."""
        outputs = []
        for name, engine in list(self.engines.items()):
            if not engine.has_unfinished():
                continue
            t0 = time.perf_counter()
            outputs += engine.step()
            dt = time.perf_counter() - t0
            if engine.history:
                self.steps.append((time.time(), name, len(engine.history[-1].scheduled), dt))
        return outputs

    # -- control from the gateway -------------------------------------------------------------

    async def _on_control(self, msg) -> None:
        cmd = wire.decode(msg.data)
        answer: dict = {"ok": True}
        if cmd["cmd"] == "stats":
            answer = self.stats()
            if cmd.get("reset"):
                self._reset_stats()
        elif cmd["cmd"] == "mode":
            self.consumer = cmd["consumer"]
        elif cmd["cmd"] == "flush":
            # Drop everything held: its messages are terminated (never redelivered) and its
            # sequences aborted. Between experiments only.
            for h in list(self.held.values()):
                eng = self.engines.get(h.req.model)
                if eng is not None:
                    eng.abort(h.req.id)
                await h.msg.term()
            self.held.clear()
            self.waiting.clear()
        elif cmd["cmd"] == "configure":
            self.pool = ModelPool(cmd["budget"], self.spec.sizes, cmd.get("pinned", []))
            for name in list(self.engines):
                if name not in self.pool.loaded:
                    self._unload(name)
            for name in self.pool.loaded:
                if name not in self.engines:
                    await asyncio.get_running_loop().run_in_executor(None, self._load, name)
            self._reset_stats()
        await msg.respond(wire.encode(answer))

    # -- the loop -----------------------------------------------------------------------------

    async def run(self) -> None:
        import torch
        torch.set_num_threads(self.spec.threads)
        self.nc = await nats.connect(self.spec.nats_url, name=self.spec.id,
                                     max_reconnect_attempts=3,
                                     closed_cb=self._closed)
        self.inbox = self.nc.new_inbox()
        self.inbox_sub = await self.nc.subscribe(self.inbox)
        await self.nc.subscribe(f"ctl.{self.spec.id}", cb=self._on_control)
        for name in self.pool.loaded:             # the pinned models, loaded up front
            await asyncio.get_running_loop().run_in_executor(None, self._load, name)
        await self.nc.publish(f"events.ready.{self.spec.id}", wire.encode({"pid": os.getpid()}))
        keepalive = asyncio.create_task(self._keepalive())
        loop = asyncio.get_running_loop()
        while not self.stopping:
            busy = any(e.has_unfinished() for e in self.engines.values())
            free = self.spec.slots - len(self.held)
            if free > 0:
                for msg in await self.pull(free, 0.0 if busy or self.waiting else 0.5):
                    self.waiting.append(self._hold(msg))
            for h in list(self.waiting):
                try:
                    admitted = await self._admit(h)
                except (KeyError, ValueError) as exc:      # unknown model, never fits, bad prompt
                    self.waiting.remove(h)
                    await self._reply(h, f"{type(exc).__name__}: {exc}")
                    continue
                if admitted:
                    self.waiting.remove(h)
            if not any(e.has_unfinished() for e in self.engines.values()):
                await asyncio.sleep(0.002 if self.waiting else 0)
                continue
            for out in await loop.run_in_executor(None, self._step_all):
                h = self.held.get(out.request_id)
                if h is None:
                    continue
                h.tokens += out.new_token_ids
                if out.finish_reason is not None:
                    await self._reply(h, out.error)
        keepalive.cancel()
        await self.nc.drain()

    async def _closed(self) -> None:
        self.stopping = True


# -- the process ------------------------------------------------------------------------------

@dataclass
class WorkerProcess:
    spec: WorkerSpec
    child: launch.Launched

    @property
    def proc(self):
        return self.child.proc

    @property
    def log_path(self) -> Path | None:
        return self.child.log_path

    @property
    def pid(self) -> int:
        return self.child.pid

    def alive(self) -> bool:
        return self.child.alive()

    def kill(self) -> None:
        """SIGKILL: no clean-up, no goodbye, exactly what a crash looks like to the queue."""
        self.child.kill()

    def stop(self, timeout: float = 10.0) -> None:
        self.child.stop(timeout)


def spawn(spec: WorkerSpec, log_path: str | Path | None = None) -> WorkerProcess:
    """Start a worker process (it announces itself on ``events.ready.<id>`` when ready)."""
    child = launch.start([sys.executable, "-m", "workshop.shared_queue.worker",
                          json.dumps(asdict(spec))], log_path=log_path)
    return WorkerProcess(spec, child)


def main(argv: list[str] | None = None) -> None:
    spec = WorkerSpec(**json.loads((argv or sys.argv[1:])[0]))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    asyncio.run(Worker(spec).run())


if __name__ == "__main__":
    main()
