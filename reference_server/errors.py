"""Every error the server answers, in OpenAI's shape (``protocol.error_body``)."""

from __future__ import annotations

from fastapi.responses import JSONResponse

from reference_server.engines import EngineDied, EngineError
from reference_server.protocol import error_body


def error_response(status: int, message: str, type: str = "invalid_request_error",
                   param: str | None = None, code: str | None = None,
                   headers: dict | None = None) -> JSONResponse:
    return JSONResponse(status_code=status, content=error_body(message, type, param, code),
                        headers=headers)


def engine_error_response(exc: EngineError | EngineDied) -> JSONResponse:
    return JSONResponse(status_code=exc.status_code, content=exc.body(),
                        headers=getattr(exc, "headers", None))
