"""The operator's endpoints: liveness, readiness, what is served, metrics, cache reset."""

from __future__ import annotations

import logging

from fastapi import APIRouter, Depends
from fastapi.responses import PlainTextResponse

from reference_server import __version__
from reference_server.engines import Engine, EngineDied, EngineError
from reference_server.engines.base import engine_fault
from reference_server.errors import engine_error_response
from reference_server.state import ServerState, server_state, serving_engine

log = logging.getLogger("reference_server")

router = APIRouter()


@router.get("/health")
async def health(state: ServerState = Depends(server_state)):
    # Alive while loading; unhealthy only once start-up failed or the engine died.
    problem = state.engine_problem() if state.started.is_set() else None
    process = state.engine.supervision() if problem and state.engine_started else None
    if process and process["state"] == "restarting":
        # alive, mending itself: a liveness check must not replace this server for that
        return {"status": "restarting", "engine_process": process}
    return problem or {"status": "ok"}


@router.get("/ready")
async def ready(state: ServerState = Depends(server_state)):
    return state.engine_problem() or {"status": "ready", "model": state.served_name}


@router.get("/server_info")
async def server_info(state: ServerState = Depends(server_state)):
    problem = state.engine_problem()
    # An engine that served once is still described while it restarts or after the
    # server gave up on it, with what became of its process ("engine_process").
    process = state.engine.supervision() if state.engine_started else None
    if problem and process is None:
        return problem
    config = state.config
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


@router.get("/metrics")
async def metrics(state: ServerState = Depends(server_state)):
    text = state.metrics.render()
    if state.engine is not None and state.engine.ready:
        try:
            text = await state.engine.metrics_text() + text
        except Exception as exc:  # a dead engine still lets us report our own counters
            log.warning("could not read engine metrics: %s", exc)
    return PlainTextResponse(text, media_type="text/plain; version=0.0.4")


@router.post("/reset_prefix_cache")
async def reset_prefix_cache(engine: Engine = Depends(serving_engine)):
    # "prefix_caching" tells a refusal (vLLM's while a request holds blocks: ask again) from
    # an engine that has no such cache (nothing to empty)
    try:
        return {"success": await engine.reset_prefix_cache(),
                "prefix_caching": engine.info().prefix_caching}
    except (EngineError, EngineDied) as exc:
        return engine_error_response(exc)
    except Exception as exc:    # e.g. the child's answer timed out
        log.exception("prefix-cache reset failed")
        return engine_error_response(engine_fault(exc))
