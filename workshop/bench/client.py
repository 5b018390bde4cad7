"""The load generator: an async streaming OpenAI client and the send-time scheduler.

Timing contract. Every request gets a *scheduled* time, the moment the workload wanted it on
the wire: its arrival time (open loop), the moment a concurrency slot freed (closed loop or a
capped open loop), or the end of the reply it depends on (later turns of a session). TTFT
and E2E are measured from it. ``sent`` is when the client actually began the HTTP request;
``sent - scheduled`` is the schedule lag. A saturated client shows up as schedule lag
instead of being mistaken for a slow server.

Load model. Sessions are the unit of arrival: single-turn workloads are sessions of one
request, so ``concurrency`` / ``request_rate`` mean requests; for multi-turn and agentic
workloads they mean concurrent sessions (users) / session arrivals per second.
"""

from __future__ import annotations

import asyncio
import contextvars
import gc
import json
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from .request_metrics import RequestRecord
from .workloads import Reply, Request, Sent, Session

try:  # aiohttp parses streams with far less CPU than httpx; keep the client's own cost low
    import aiohttp
except ImportError:  # pragma: no cover
    aiohttp = None


SPIN_S = 0.001  # open loop: how long before a send the scheduler stops sleeping and yields


@dataclass(frozen=True)
class Load:
    """How sessions arrive.

    ``request_rate`` None or inf: closed loop, ``concurrency`` sessions at a time (all
    sessions at once when ``concurrency`` is None too). Otherwise open loop: gamma-distributed
    gaps with mean 1/rate and shape ``burstiness`` (1 = Poisson, < 1 burstier, inf = evenly
    spaced), capped at ``concurrency`` sessions in flight unless it is None; latency still
    counts from the arrival, the wait for the cap shows as ``queue_wait``.
    """

    concurrency: int | None = None
    request_rate: float | None = None
    burstiness: float = 1.0
    seed: int = 0

    @property
    def open_loop(self) -> bool:
        return self.request_rate is not None and np.isfinite(self.request_rate)


def arrival_times(n: int, rate: float, burstiness: float = 1.0, seed: int = 0) -> list[float]:
    """Arrival offsets (s) of ``n`` sessions, first at 0, gaps ~ Gamma(shape=b, scale=1/(rate*b)).

    Unlike vLLM, gaps are not rescaled to make the run last exactly n/rate: the process stays
    a true renewal process, so short runs show their real variance.
    """
    if n <= 0:
        return []
    if not np.isfinite(burstiness):
        gaps = np.full(n - 1, 1.0 / rate)
    else:
        rng = np.random.default_rng(seed)
        gaps = rng.gamma(shape=burstiness, scale=1.0 / (rate * burstiness), size=n - 1)
    return [0.0] + np.cumsum(gaps).tolist()


class OpenAIClient:
    """Streams one request to ``/v1/chat/completions`` or ``/v1/completions`` and times it."""

    def __init__(self, base_url: str, model: str, api_key: str | None = None,
                 timeout_s: float = 600.0, ignore_eos: bool = True, extra_body: dict | None = None):
        if aiohttp is None:
            raise ImportError("the benchmark client needs aiohttp (pip install aiohttp)")
        self.base_url = base_url.rstrip("/")
        if self.base_url.endswith("/v1"):
            self.base_url = self.base_url[:-3]
        self.model = model
        self.headers = {"Content-Type": "application/json"}
        if api_key:
            self.headers["Authorization"] = f"Bearer {api_key}"
        self.timeout_s = timeout_s
        self.ignore_eos = ignore_eos
        self.extra_body = extra_body or {}
        self.session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> "OpenAIClient":
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, ttl_dns_cache=300),
            timeout=aiohttp.ClientTimeout(total=None, sock_read=self.timeout_s))
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.session.close()

    def body(self, req: Request) -> dict:
        # No sampling parameters: the server's defaults, as vLLM's and SGLang's benchmark
        # clients do (greedy and sampled decoding cost differently); set them via extra_body.
        body: dict[str, Any] = {"model": self.model, "max_tokens": req.max_tokens, "stream": True,
                                "stream_options": {"include_usage": True}}
        if self.ignore_eos:
            body["ignore_eos"] = True
        if req.messages is not None:
            body["messages"] = req.messages
        else:
            body["prompt"] = req.prompt
        if req.tools:
            body["tools"], body["tool_choice"] = req.tools, "required"
        body.update(self.extra_body)
        return body

    async def stream(self, req: Request, rec: RequestRecord, clock: Callable[[], float],
                     tool_calls: list[dict] | None = None) -> str:
        """Send ``req``, fill ``rec`` (sent, first_token, chunk_times, end, tokens, error).

        Returns the generated text; the tool calls streamed (``delta.tool_calls``, their
        arguments joined) go into ``tool_calls`` when given. Never raises for server or
        network errors: they go to ``rec.error`` so they are counted, not dropped.
        """
        calls: dict[int, dict] = {}
        url = f"{self.base_url}/v1/{'chat/completions' if req.api == 'chat' else 'completions'}"
        chat = req.api == "chat"
        parts: list[str] = []
        usage = None
        rec.max_tokens = req.max_tokens
        rec.sent = clock()
        try:
            async with self.session.post(url, data=json.dumps(self.body(req)),
                                         headers=self.headers) as resp:
                if resp.status != 200:
                    text = (await resp.text())[:300]
                    rec.error = f"HTTP {resp.status}: {text}"
                    rec.end = clock()
                    return ""
                async for raw in resp.content:
                    now = clock()
                    line = raw.strip()
                    if not line.startswith(b"data:"):
                        continue
                    data = line[5:].strip()
                    if data == b"[DONE]":
                        break
                    msg = json.loads(data)
                    if msg.get("error"):
                        rec.error = f"stream error: {json.dumps(msg['error'])[:300]}"
                        break
                    if msg.get("usage"):
                        usage = msg["usage"]
                    choices = msg.get("choices") or []
                    if not choices:
                        continue
                    c = choices[0]
                    text = ((c.get("delta") or {}).get("content")
                            or (c.get("delta") or {}).get("reasoning_content")
                            if chat else c.get("text")) or ""
                    called = (c.get("delta") or {}).get("tool_calls") if chat else None
                    for tc in called or []:
                        call = calls.setdefault(tc.get("index", 0), {
                            "id": "", "type": "function",
                            "function": {"name": "", "arguments": ""}})
                        call["id"] = tc.get("id") or call["id"]
                        fn = tc.get("function") or {}
                        call["function"]["name"] = fn.get("name") or call["function"]["name"]
                        call["function"]["arguments"] += fn.get("arguments") or ""
                    if text or called:
                        if rec.first_token is None:
                            rec.first_token = now
                        rec.chunk_times.append(now)
                        parts.append(text)
                rec.end = clock()
            if tool_calls is not None:
                tool_calls += [calls[i] for i in sorted(calls)]
        except asyncio.CancelledError:
            rec.error = "cancelled"
            rec.end = clock()
            raise
        except Exception as e:  # network errors, bad JSON, timeouts: all counted
            rec.error = f"{type(e).__name__}: {e}"[:300]
            rec.end = clock()
            return ""
        if rec.error is None and rec.first_token is None:
            rec.error = "no tokens in the stream"
        if usage:
            rec.output_tokens = int(usage.get("completion_tokens") or 0)
            rec.prompt_tokens = int(usage.get("prompt_tokens") or 0)
            details = usage.get("prompt_tokens_details") or {}
            if details.get("cached_tokens") is not None:
                rec.cached_tokens = int(details["cached_tokens"])
        else:  # a server without include_usage: one token per text chunk, a lower bound
            rec.output_tokens = len(rec.chunk_times)
            rec.usage = False
        return "".join(parts)


@dataclass
class _SessionState:
    index: int
    last_end: float  # latest end of any of its requests so far
    admitted: float | None = None  # capped open loop: slot time, given to the first request


_ready_at: contextvars.ContextVar[float] = contextvars.ContextVar("ready_at")
_state: contextvars.ContextVar[_SessionState] = contextvars.ContextVar("session_state")


@dataclass
class RunLog:
    """What a run produced, in send order."""

    records: list[RequestRecord] = field(default_factory=list)
    sent: list[Sent | None] = field(default_factory=list)  # aligned with records; None: no request


class Runner:
    """Runs sessions under a ``Load`` through an ``OpenAIClient``, recording every request."""

    def __init__(self, client: OpenAIClient,
                 on_request_done: Callable[[RequestRecord], None] | None = None):
        self.client = client
        self.on_request_done = on_request_done or (lambda r: None)
        self.log = RunLog()
        self.t0 = time.perf_counter()

    def clock(self) -> float:
        return time.perf_counter() - self.t0

    async def send(self, req: Request, warmup: bool = False) -> Reply:
        """The ``send`` handed to sessions: schedule, stream, record."""
        state = _state.get()
        # After a fork joins, the next request was ready when the last branch ended.
        scheduled = max(_ready_at.get(), state.last_end)
        rec = RequestRecord(index=len(self.log.records), session=state.index, tag=req.tag,
                            scheduled=scheduled, warmup=warmup, admitted=state.admitted)
        state.admitted = None
        self.log.records.append(rec)
        slot = len(self.log.sent)
        self.log.sent.append(Sent(req, ""))
        calls: list[dict] = []
        text = await self.client.stream(req, rec, self.clock, calls if req.tools else None)
        self.log.sent[slot].reply = text
        end = rec.end if rec.end is not None else self.clock()
        _ready_at.set(end)
        state.last_end = max(state.last_end, end)
        self.on_request_done(rec)
        return Reply(text, ok=rec.error is None, tool_calls=calls)

    async def _run_session(self, index: int, session: Session, ready: float,
                           admitted: float | None = None) -> float:
        state = _SessionState(index, ready, admitted)
        _state.set(state)
        _ready_at.set(ready)
        try:
            await session.run(self.send)
        except Exception as e:  # a bug in a workload script must not kill the whole run
            rec = RequestRecord(index=len(self.log.records), session=index, tag="session-error",
                                scheduled=ready, sent=ready, end=self.clock(),
                                error=f"session failed: {e!r}")
            self.log.records.append(rec)
            self.log.sent.append(None)
            self.on_request_done(rec)
        return state.last_end

    def _spawn(self, index: int, session: Session, ready: float) -> asyncio.Task:
        # A fresh context per session so its timing variables are its own.
        return asyncio.create_task(self._run_session(index, session, ready),
                                   context=contextvars.Context())

    async def warmup(self, requests: Sequence[Request]) -> None:
        """Send requests one by one, recorded with ``warmup=True`` (excluded from summaries)."""
        for i, req in enumerate(requests):
            ctx = contextvars.Context()
            ready = self.clock()

            async def one(req=req, ready=ready) -> None:
                _state.set(_SessionState(-1 - i, ready))
                _ready_at.set(ready)
                await self.send(req, warmup=True)
            await asyncio.create_task(one(), context=ctx)

    async def run(self, sessions: Sequence[Session], load: Load) -> RunLog:
        # A full garbage collection pauses the loop for milliseconds once many records exist,
        # which would show up as schedule lag; runs are bounded, so collect after instead.
        gc.collect()
        gc.freeze()
        gc.disable()
        try:
            return await self._run(sessions, load)
        finally:
            gc.enable()
            gc.unfreeze()

    async def _run(self, sessions: Sequence[Session], load: Load) -> RunLog:
        start = self.clock()
        n = len(sessions)
        slots: asyncio.Queue[float] | None = None
        if load.concurrency is not None:
            slots = asyncio.Queue()
            for _ in range(load.concurrency):
                slots.put_nowait(start)

        async def gated(i: int, s: Session, arrival: float) -> None:
            freed = await slots.get()
            end = start
            try:
                if load.open_loop:
                    # The user arrived at ``arrival``: waiting for the cap is part of their
                    # latency (recorded as queue wait, not as client lag).
                    end = await self._run_session(i, s, arrival, max(arrival, freed))
                else:
                    end = await self._run_session(i, s, max(arrival, freed))
            finally:
                slots.put_nowait(end)

        tasks: list[asyncio.Task] = []
        if not load.open_loop:
            for i, s in enumerate(sessions):
                tasks.append(asyncio.create_task(gated(i, s, start), context=contextvars.Context())
                             if slots else self._spawn(i, s, start))
        else:
            offsets = arrival_times(n, load.request_rate, load.burstiness, load.seed)
            for i, (s, off) in enumerate(zip(sessions, offsets)):
                due = start + off
                # epoll rounds timeouts up to whole milliseconds: sleep until 1 ms before, then
                # yield until due (a longer spin costs CPU that a busy machine takes back as lag)
                wait = due - self.clock() - SPIN_S
                if wait > 0:
                    await asyncio.sleep(wait)
                while self.clock() < due:
                    await asyncio.sleep(0)
                tasks.append(asyncio.create_task(gated(i, s, due), context=contextvars.Context())
                             if slots else self._spawn(i, s, due))
        await asyncio.gather(*tasks)
        return self.log
