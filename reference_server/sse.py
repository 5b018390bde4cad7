"""An engine's answer relayed as server-sent events, and what happens when the client leaves.

Once the status line (200) is sent, a failure can only be an error event; a client that
hangs up cancels the engine's work at once and is counted, whichever await it interrupts.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import AsyncIterator

from fastapi import Request
from fastapi.responses import StreamingResponse

from reference_server.engines import EngineDied, EngineError
from reference_server.engines.base import engine_fault
from reference_server.state import ServerState

log = logging.getLogger("reference_server")

STREAM_FAILED = "reference_server.stream_failed"    # scope key: a 200 stream that failed


async def unless_disconnected(request: Request, work):
    """Await ``work`` but cancel it if the client hangs up first, so a non-streaming request
    whose client left does not keep generating (streams are cancelled by Starlette)."""
    task = asyncio.ensure_future(work)

    async def hung_up():
        while True:
            if (await request.receive())["type"] == "http.disconnect":
                return

    watcher = asyncio.ensure_future(hung_up())
    try:
        done, _ = await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
    if task in done:
        return task.result()
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    raise asyncio.CancelledError("client disconnected")


class EngineStream(StreamingResponse):
    """An engine stream as server-sent events, and its admission slot.

    The slot and the engine stream are released in ``_sse``'s clean-up, and here again in
    case Starlette never started the body (the client left before the first byte): an
    unstarted generator runs no ``finally``, and a leaked slot would shrink the server's
    capacity for good. Releasing twice does nothing. A started body is closed here too: a
    hang-up that cancels Starlette while it sends leaves ``_sse`` suspended at a ``yield``,
    and its clean-up (the count, the engine's abort) would wait for the garbage collector.
    """

    def __init__(self, stream: AsyncIterator, state: ServerState, scope: dict) -> None:
        self.engine_stream = stream
        self.server_state = state
        self.started = False
        super().__init__(_sse(self, scope), media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            if not self.started:
                self.started = True
                self.server_state.metrics.disconnects.inc()
                self.server_state.request_finished()
                await self.engine_stream.aclose()
            else:
                await self.body_iterator.aclose()     # nothing if _sse has ended


async def _sse(response: EngineStream, scope: dict) -> AsyncIterator[bytes]:
    """Frame engine output as server-sent events. Proxies already send framed bytes.

    The status line (200) is already sent: a failure now can only be an error event. It is
    counted as a failed stream (and as a 500 in the request counter), not as a client that
    left; so is a proxied stream whose engine sent an error event of its own (``failed``).
    """
    response.started = True
    stream, state = response.engine_stream, response.server_state
    finished = False
    framed = False
    try:
        async for item in stream:
            if isinstance(item, bytes):
                yield item
            else:
                framed = True
                yield b"data: " + json.dumps(item, separators=(",", ":")).encode() + b"\n\n"
        if framed:
            yield b"data: [DONE]\n\n"
        finished = True
    except Exception as exc:
        finished = True
        state.metrics.stream_failures.inc()
        scope[STREAM_FAILED] = True
        if not isinstance(exc, (EngineError, EngineDied)):
            log.exception("stream failed")
            exc = engine_fault(exc)
        yield b"data: " + json.dumps(exc.body()).encode() + b"\n\n"
    finally:
        if getattr(stream, "failed", False) and not scope.get(STREAM_FAILED):
            # a proxied engine's own error event, relayed inside the 200: a failure, even
            # if the client then left
            state.metrics.stream_failures.inc()
            scope[STREAM_FAILED] = True
        elif not finished:
            state.metrics.disconnects.inc()
        state.request_finished()
        await stream.aclose()
