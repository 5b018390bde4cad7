"""The HTTP layer: OpenAI-compatible routes, validation, auth, errors, metrics.

It owns no model. It validates every request itself (so every engine refuses bad input the
same way), hands it to the engine, and relays the answer: JSON, or server-sent events.

Trust boundary (with an API key): every path but ``/health`` and ``/ready`` needs the key,
``/metrics`` and ``/docs`` included (prefix-cache hit counters and latencies tell one client
about the others' prompts); nothing secret is ever shown (``/server_info`` redacts engine
arguments and never names the child engine's own address).
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import time
from contextlib import asynccontextmanager
from typing import AsyncIterator

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from reference_server import __version__, tools
from reference_server.config import ServerConfig
from reference_server.engines import Engine, EngineDied, EngineError, create_engine, loads_model
from reference_server.engines.base import engine_fault
from reference_server.metrics import ServerMetrics
from reference_server.protocol import (ChatCompletionRequest, CompletionRequest, ModelCard,
                                       ModelList, RequestLimits, check_limits, error_body)

log = logging.getLogger("reference_server")

# Open without the key: liveness and readiness probes (they say nothing but "up" and the
# served model's name).
OPEN_PATHS = frozenset({"/health", "/ready"})
STREAM_FAILED = "reference_server.stream_failed"    # scope key: a 200 stream that failed


def error_response(status: int, message: str, type: str = "invalid_request_error",
                   param: str | None = None, code: str | None = None,
                   headers: dict | None = None) -> JSONResponse:
    return JSONResponse(status_code=status, content=error_body(message, type, param, code),
                        headers=headers)


def engine_error_response(exc: EngineError | EngineDied) -> JSONResponse:
    return JSONResponse(status_code=exc.status_code, content=exc.body(), headers=getattr(exc, "headers", None))


class ServerState:
    """What the routes share: the engine, its start-up outcome, limits, counters."""

    def __init__(self, config: ServerConfig, engine: Engine | None = None) -> None:
        self.config = config
        self.engine = engine
        self.model_names: set[str] = set()
        self.served_name = config.served_model_name or ""
        self.start_error: str | None = None
        self.started = asyncio.Event()
        self.fatal = asyncio.Event()          # set when start-up failed: __main__ exits
        self.metrics = ServerMetrics(restarts=lambda: self.engine.restarts if self.engine else 0)
        self.engine_started = False           # it served once: /server_info can describe it
        self.limits = RequestLimits(
            max_n=config.max_n, max_logprobs=config.max_logprobs,
            max_sequences_per_request=config.max_sequences_per_request)
        self.active = 0                       # generation requests admitted and not finished

    @property
    def max_active(self) -> int:
        running = self.engine.max_running if self.engine is not None else 1
        return running + self.config.max_queued_requests

    def request_started(self) -> None:
        self.active += 1
        self.metrics.in_flight.inc()

    def request_finished(self) -> None:
        self.active -= 1
        self.metrics.in_flight.dec()

    async def start_engine(self) -> None:
        try:
            if self.engine is None:
                from reference_server.models import resolve_model
                model = (await asyncio.to_thread(resolve_model, self.config.model)
                         if loads_model(self.config.engine) else None)
                self.engine = create_engine(self.config, model)
            await self.engine.start()
            info = self.engine.info()
            self.served_name = info.model
            self.model_names = {info.model, info.model_path}
            if loads_model(self.config.engine):    # a remote engine's --model is a choice
                self.model_names.add(self.config.model)
            self.metrics.engine_up.set(1)
            self.engine_started = True
            log.info("engine %s ready: model %s on %s", info.engine, info.model, info.device)
        except Exception as exc:  # reported on /health and by the exit code, never hidden
            self.start_error = f"{type(exc).__name__}: {exc}"
            log.exception("engine failed to start")
            self.fatal.set()
        finally:
            self.started.set()

    def engine_problem(self) -> JSONResponse | None:
        """The 503 to answer while the engine cannot serve, or None when it can."""
        if self.start_error:
            return error_response(503, f"engine failed to start: {self.start_error}",
                                  "engine_unavailable")
        if self.engine is not None:
            try:
                self.engine.check()
            except EngineDied as exc:
                self.metrics.engine_up.set(0)
                return engine_error_response(exc)
            self.metrics.engine_up.set(1)
        if self.engine is None or not self.engine.ready:
            return error_response(503, "engine is still loading; poll /ready",
                                  "engine_unavailable")
        return None


def create_app(config: ServerConfig, engine: Engine | None = None) -> FastAPI:
    state = ServerState(config, engine)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        # The engine loads in the background so /health answers at once and /ready tells
        # when serving can begin (vLLM takes tens of seconds on a CPU).
        task = asyncio.create_task(state.start_engine())
        yield
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        if state.engine is not None:
            await state.engine.stop()

    app = FastAPI(title="LLM-inference workshop reference server", version=__version__,
                  lifespan=lifespan)
    app.state.server = state

    # ---- errors: always the OpenAI shape ------------------------------------------------
    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException):
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return error_response(exc.status_code, str(exc.detail), kind)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError):
        return error_response(400, str(exc))

    @app.exception_handler(Exception)
    async def _internal_error(request: Request, exc: Exception):
        log.exception("unhandled error on %s", request.url.path)
        return error_response(500, f"internal error: {type(exc).__name__}", "server_error")

    app.add_middleware(GuardMiddleware, state=state)

    # ---- liveness, readiness, description ----------------------------------------------
    @app.get("/health")
    async def health():
        # Alive while loading; unhealthy only once start-up failed or the engine died.
        problem = state.engine_problem() if state.started.is_set() else None
        process = state.engine.supervision() if problem and state.engine_started else None
        if process and process["state"] == "restarting":
            # alive, mending itself: a liveness check must not replace this server for that
            return {"status": "restarting", "engine_process": process}
        return problem or {"status": "ok"}

    @app.get("/ready")
    async def ready():
        return state.engine_problem() or {"status": "ready", "model": state.served_name}

    @app.get("/server_info")
    async def server_info():
        problem = state.engine_problem()
        # An engine that served once is still described while it restarts or after the
        # server gave up on it, with what became of its process ("engine_process").
        process = state.engine.supervision() if state.engine_started else None
        if problem and process is None:
            return problem
        info = state.engine.info().to_dict()
        if process is not None:
            info["engine_process"] = process
        info["server_version"] = __version__
        info["limits"] = {"max_body_bytes": config.max_body_bytes, "max_n": config.max_n,
                          "max_logprobs": config.max_logprobs,
                          "max_sequences_per_request": config.max_sequences_per_request,
                          "max_running": state.engine.max_running,
                          "max_queued_requests": config.max_queued_requests}
        return info

    @app.get("/v1/models")
    async def models():
        problem = state.engine_problem()
        if problem:
            return problem
        info = state.engine.info()
        return ModelList(data=[ModelCard(id=info.model, created=int(time.time()),
                                         root=info.model_path,
                                         max_model_len=info.max_model_len)]).model_dump()

    @app.get("/metrics")
    async def metrics():
        text = state.metrics.render()
        if state.engine is not None and state.engine.ready:
            try:
                text = await state.engine.metrics_text() + text
            except Exception as exc:  # a dead engine still lets us report our own counters
                log.warning("could not read engine metrics: %s", exc)
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4")

    @app.post("/reset_prefix_cache")
    async def reset_prefix_cache():
        problem = state.engine_problem()
        if problem:
            return problem
        try:
            return {"success": await state.engine.reset_prefix_cache()}
        except (EngineError, EngineDied) as exc:
            return engine_error_response(exc)
        except Exception as exc:    # e.g. the child's answer timed out
            log.exception("prefix-cache reset failed")
            return engine_error_response(engine_fault(exc))

    # ---- generation --------------------------------------------------------------------
    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        return await generate(request, ChatCompletionRequest, "chat")

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await generate(request, CompletionRequest, "complete")

    async def generate(request: Request, schema, method: str) -> Response:
        body = await _read_body(request, config.max_body_bytes)
        if isinstance(body, Response):
            return body
        try:
            parsed = schema.model_validate(body)
        except ValidationError as exc:
            return error_response(400, _validation_message(exc), param=_first_loc(exc))
        if parsed.model not in state.model_names and state.model_names:
            return error_response(404, f"The model `{parsed.model}` does not exist; this server "
                                  f"serves `{state.served_name}`.", "not_found_error",
                                  param="model", code="model_not_found")
        broken = check_limits(parsed, state.limits)
        if broken:
            return error_response(400, broken[1], param=broken[0])
        try:   # tools: the engine gets a JSON-schema request, the client tool calls
            tool_plan = tools.plan(parsed) if method == "chat" else None
        except tools.ToolError as exc:
            return error_response(400, str(exc), param=exc.param)
        if tool_plan is not None:
            parsed = tool_plan.request
        problem = state.engine_problem()
        if problem:
            return problem
        if state.active >= state.max_active:
            # Bounded queue: an overloaded server says so at once instead of growing a
            # backlog no client will wait for.
            return error_response(
                429, f"the server is full ({state.active} requests admitted, "
                f"{config.max_queued_requests} may wait); retry shortly", "server_overloaded",
                code="queue_full", headers={"Retry-After": "1"})
        state.request_started()
        streaming = False        # a stream hands the in-flight count over to _sse
        try:
            result = await _unless_disconnected(request, getattr(state.engine, method)(parsed))
            if tool_plan is not None:
                return _tool_answer(tool_plan, result)
            if isinstance(result, dict):
                return JSONResponse(result)
            streaming = True
            return _EngineStream(result, state, request.scope)
        except (EngineError, EngineDied) as exc:
            return engine_error_response(exc)
        except Exception as exc:   # an engine bug fails this request, with a proper body
            log.exception("engine failed a request")
            return engine_error_response(engine_fault(exc))
        finally:
            if not streaming:
                state.request_finished()

    return app


def _tool_answer(plan: tools.ToolPlan, result) -> Response:
    """An engine's complete JSON answer as tool calls: one JSON body, or a short stream."""
    answer = plan.answer(result)
    if not plan.stream:
        return JSONResponse(answer)
    events = [f"data: {json.dumps(c)}\n\n".encode() for c in plan.chunks(answer)]
    return StreamingResponse(iter([*events, b"data: [DONE]\n\n"]), media_type="text/event-stream")


_ENDPOINTS = {"/v1/models", "/v1/completions", "/v1/chat/completions"}


class GuardMiddleware:
    """Auth and the body-size cap, before any route runs; counts /v1 answers by status
    (a 500 from an unhandled error included: it is sent outside this middleware).

    Plain ASGI rather than ``BaseHTTPMiddleware``: it adds nothing to a streamed response's
    path, which matters for the proxy's overhead budget.
    """

    def __init__(self, app, state: ServerState) -> None:
        self.app = app
        self.state = state
        key = state.config.api_key
        self.expected = f"Bearer {key}".encode() if key else None

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope["path"]
        headers = dict(scope["headers"])
        problem = None
        if self.expected and path not in OPEN_PATHS:
            if not hmac.compare_digest(headers.get(b"authorization", b""), self.expected):
                problem = error_response(
                    401, "missing or wrong API key: send 'Authorization: Bearer <key>'",
                    "authentication_error", code="invalid_api_key")
        length = headers.get(b"content-length", b"")
        limit = self.state.config.max_body_bytes
        if problem is None and length.isdigit() and int(length) > limit:
            problem = error_response(413, f"request body is {int(length)} bytes; the limit is "
                                     f"{limit}", code="request_too_large")
        status = problem.status_code if problem else 0

        async def counting_send(message):
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            if problem is not None:
                await problem(scope, receive, send)
            else:
                await self.app(scope, receive, counting_send)
        except Exception:
            status = status or 500
            raise
        finally:
            self._count(path, 500 if scope.get(STREAM_FAILED) else status)

    def _count(self, path: str, status: int) -> None:
        if path.startswith("/v1/"):
            # unknown paths share one label value: a scanner must not grow the metric forever
            endpoint = path if path in _ENDPOINTS else "other"
            self.state.metrics.requests.labels(endpoint=endpoint, status=str(status)).inc()


async def _read_body(request: Request, limit: int) -> dict | Response:
    """Read and parse the JSON object body, with a size cap (chunked uploads carry no
    Content-Length to check). Parsed once here; the schema validates the dict."""
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            return error_response(413, f"request body exceeds the limit of {limit} bytes",
                                  code="request_too_large")
        chunks.append(chunk)
    body = b"".join(chunks)
    if not body:
        return error_response(400, "request body is empty; send a JSON object")
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        return error_response(400, "request body is not valid UTF-8")
    try:
        payload = json.loads(text)
    except ValueError as exc:
        return error_response(400, f"request body is not valid JSON: {exc}")
    except RecursionError:
        return error_response(400, "request body is nested too deeply")
    if not isinstance(payload, dict):
        return error_response(400, "request body must be a JSON object")
    return payload


def _validation_message(exc: ValidationError) -> str:
    parts = []
    for e in exc.errors()[:5]:
        loc = ".".join(str(x) for x in e["loc"]) or "body"
        parts.append(f"{loc}: {e['msg']}")
    return "; ".join(parts)


def _first_loc(exc: ValidationError) -> str | None:
    errs = exc.errors()
    return ".".join(str(x) for x in errs[0]["loc"]) if errs and errs[0]["loc"] else None


async def _unless_disconnected(request: Request, work):
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


class _EngineStream(StreamingResponse):
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


async def _sse(response: _EngineStream, scope: dict) -> AsyncIterator[bytes]:
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
