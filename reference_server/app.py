"""The HTTP layer: the app that holds the routes, the engine's lifetime, auth and errors.

It owns no model. Its routers (``routes/``) validate every request themselves (so every
engine refuses bad input the same way), hand it to the engine, and relay the answer.

Trust boundary (with an API key): every path but ``/health`` and ``/ready`` needs the key,
``/metrics`` and ``/docs`` included (prefix-cache hit counters and latencies tell one client
about the others' prompts); nothing secret is ever shown (``/server_info`` redacts engine
arguments and never names the child engine's own address).
"""

from __future__ import annotations

import asyncio
import hmac
import logging
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from reference_server import __version__
from reference_server.config import ServerConfig
from reference_server.engines import Engine
from reference_server.errors import error_response
from reference_server.routes import openai, ops
from reference_server.sse import STREAM_FAILED
from reference_server.state import EngineUnavailable, ServerState

log = logging.getLogger("reference_server")

# Open without the key: liveness and readiness probes (they say nothing but "up" and the
# served model's name).
OPEN_PATHS = frozenset({"/health", "/ready"})


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

    @app.exception_handler(EngineUnavailable)
    async def _engine_unavailable(request: Request, exc: EngineUnavailable):
        return exc.response

    app.add_middleware(GuardMiddleware, state=state)
    app.include_router(ops.router)
    app.include_router(openai.router)
    return app


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
