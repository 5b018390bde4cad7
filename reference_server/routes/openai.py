"""The OpenAI endpoints: models, chat completions, completions.

Every request is validated here, the same for every engine (400 before any byte is
streamed), then handed to the engine; the answer is relayed as JSON or server-sent events.
"""

from __future__ import annotations

import json
import logging
import time

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response
from pydantic import ValidationError

from reference_server import tools
from reference_server.engines import Engine, EngineDied, EngineError
from reference_server.engines.base import engine_fault
from reference_server.errors import engine_error_response, error_response
from reference_server.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    ModelCard,
    ModelList,
    check_limits,
)
from reference_server.sse import EngineStream, unless_disconnected
from reference_server.state import ServerState, server_state, serving_engine

log = logging.getLogger("reference_server")

router = APIRouter()


@router.get("/v1/models")
async def models(engine: Engine = Depends(serving_engine)):
    info = engine.info()
    return ModelList(data=[ModelCard(id=info.model, created=int(time.time()),
                                     root=info.model_path,
                                     max_model_len=info.max_model_len)]).model_dump()


@router.post("/v1/chat/completions")
async def chat(request: Request, state: ServerState = Depends(server_state)):
    return await generate(request, state, ChatCompletionRequest, "chat")


@router.post("/v1/completions")
async def completions(request: Request, state: ServerState = Depends(server_state)):
    return await generate(request, state, CompletionRequest, "complete")


async def generate(request: Request, state: ServerState, schema, method: str) -> Response:
    """Validate, then admit and hand to the engine: the engine's state is checked only after
    the input, so bad input gets its 400 whatever the engine is doing."""
    config = state.config
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
    engine = serving_engine(state)        # raises the 503 while it cannot serve
    if state.active >= state.max_active:
        # Bounded queue: an overloaded server says so at once instead of growing a
        # backlog no client will wait for.
        return error_response(
            429, f"the server is full ({state.active} requests admitted, "
            f"{config.max_queued_requests} may wait); retry shortly", "server_overloaded",
            code="queue_full", headers={"Retry-After": "1"})
    state.request_started()
    streaming = False        # a stream hands the in-flight count over to EngineStream
    try:
        result = await unless_disconnected(request, getattr(engine, method)(parsed))
        if isinstance(result, dict):
            return JSONResponse(tool_plan.answer(result) if tool_plan else result)
        if tool_plan is not None:
            result = tool_plan.relay(result)
        streaming = True
        return EngineStream(result, state, request.scope)
    except (EngineError, EngineDied) as exc:
        return engine_error_response(exc)
    except Exception as exc:   # an engine bug fails this request, with a proper body
        log.exception("engine failed a request")
        return engine_error_response(engine_fault(exc))
    finally:
        if not streaming:
            state.request_finished()


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
