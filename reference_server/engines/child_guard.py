"""The key check that runs INSIDE a child engine (vLLM's or SGLang's server), on every path.

Why our own: the engines' key checks leave paths open. vLLM 0.32 guards only the ``/v1``,
``/v2``, ``/inference`` and ``/cohere`` prefixes, so ``POST /invocations`` (generation, as
``/v1``), ``/tokenize``, ``/detokenize``, ``/generative_scoring``, ``/scale_elastic_ep``,
``/metrics`` and ``/docs`` answered any local process without a key. SGLang 0.5.18 guards
everything but ``/health*`` and ``/metrics*`` (``/health_generate`` runs a generation;
``/metrics`` has the prefix-cache counters our own server keeps behind its key) and never
checks WebSocket connections (``/v1/realtime``). The child is reachable only by our server,
which sends the child's key on every call, probes included, so nothing needs to be open.

It is plain ASGI and imports only the standard library at module level: it is loaded by the
child's interpreter (vLLM's ``--middleware``, ``sglang_launch``), which may be another
virtual environment than the server's.
"""

from __future__ import annotations

import hmac


class ChildKeyGuard:
    """ASGI middleware: a request without ``Authorization: Bearer <key>`` gets a 401 (a
    WebSocket is closed before it is accepted, which the HTTP server answers with a 403),
    whatever its path or method. With no key at all everything is refused: a child started
    without its key must not be open."""

    def __init__(self, app, key: str | None) -> None:
        self.app = app
        self.expected = f"Bearer {key}".encode() if key else None

    def allowed(self, scope) -> bool:
        auth = dict(scope.get("headers") or ()).get(b"authorization", b"")
        return self.expected is not None and hmac.compare_digest(auth, self.expected)

    async def __call__(self, scope, receive, send):
        if scope["type"] not in ("http", "websocket"):      # lifespan: not a request
            return await self.app(scope, receive, send)
        if self.allowed(scope):
            return await self.handle(scope, receive, send)
        if scope["type"] == "websocket":
            return await send({"type": "websocket.close", "code": 1008})
        from starlette.responses import JSONResponse

        from reference_server.protocol import error_body
        resp = JSONResponse(error_body("missing or wrong API key", "authentication_error"),
                            status_code=401)
        await resp(scope, receive, send)

    async def handle(self, scope, receive, send):
        """An authenticated request; subclasses may answer some paths themselves."""
        await self.app(scope, receive, send)
