"""What the routes share: the engine, its start-up outcome, limits, counters; and the one
guard that stops a route while the engine cannot serve."""

from __future__ import annotations

import asyncio
import logging

from fastapi import Depends, Request
from fastapi.responses import JSONResponse

from reference_server.config import ServerConfig
from reference_server.engines import Engine, EngineDied, create_engine, loads_model
from reference_server.errors import engine_error_response, error_response
from reference_server.exported_metrics import ServerMetrics
from reference_server.protocol import RequestLimits

log = logging.getLogger("reference_server")


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


class EngineUnavailable(Exception):
    """Raised by the guard; the app answers it with ``response`` (a 503 saying why)."""

    def __init__(self, response: JSONResponse) -> None:
        super().__init__(response.status_code)
        self.response = response


def server_state(request: Request) -> ServerState:
    return request.app.state.server


def serving_engine(state: ServerState = Depends(server_state)) -> Engine:
    """The engine, once it can serve: the one guard of every route that needs it (a
    dependency, or called directly where input must be checked first)."""
    problem = state.engine_problem()
    if problem is not None:
        raise EngineUnavailable(problem)
    return state.engine
