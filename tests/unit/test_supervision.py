"""A child engine that dies is reported (503 with the reason), never hidden.

The child here is a real process serving real HTTP: a tiny stand-in for an engine server
that answers /health and then exits, so the supervision code runs exactly as with vLLM.
"""

from __future__ import annotations

import asyncio
import sys
import time

import pytest

from reference_server.config import ServerConfig
from reference_server.engines.base import EngineDied, EngineInfo
from reference_server.engines.proxy import ProxyEngine
from reference_server.models import ModelSpec

CHILD = """
import http.server, sys, threading, os
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(b"{}")
    def log_message(self, *a): pass
srv = http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H)
threading.Timer(float(sys.argv[2]), lambda: os._exit(3)).start()
srv.serve_forever()
"""


class DyingEngine(ProxyEngine):
    name = "dying"

    def __init__(self, lifetime: float):
        super().__init__(ServerConfig(engine_start_timeout=30), ModelSpec("m", "m", False))
        self.lifetime = lifetime

    def command(self):
        return [sys.executable, "-c", CHILD, str(self.port), str(self.lifetime)]

    def info(self):
        return EngineInfo("dying", "0", "m", "m", "none", "cpu", 16, None, None, None, False)

    async def reset_prefix_cache(self):
        return False


def test_crash_after_start_is_detected():
    async def run():
        engine = DyingEngine(lifetime=1.0)
        await engine.start()
        assert engine.ready
        engine.check()                       # alive: nothing to report
        t0 = time.monotonic()
        while engine.ready and time.monotonic() - t0 < 10:
            await asyncio.sleep(0.1)
        with pytest.raises(EngineDied, match="exited with code 3"):
            engine.check()
        await engine.stop()
    asyncio.run(run())


def test_crash_during_start_raises():
    async def run():
        engine = DyingEngine(lifetime=0.0)
        engine.command = lambda: [sys.executable, "-c", "import sys; sys.exit(7)"]
        with pytest.raises(EngineDied, match="code 7"):
            await engine.start()
        await engine.stop()
    asyncio.run(run())


def test_server_reports_dead_engine_as_503():
    from fastapi.testclient import TestClient

    from reference_server.app import create_app

    app = create_app(ServerConfig(), engine=DyingEngine(lifetime=2.0))
    with TestClient(app) as client:
        t0 = time.monotonic()
        while client.get("/ready").status_code != 200 and time.monotonic() - t0 < 30:
            time.sleep(0.1)
        assert client.get("/health").json() == {"status": "ok"}
        time.sleep(3)
        for path in ("/health", "/ready"):
            r = client.get(path)
            assert r.status_code == 503
            assert r.json()["error"]["type"] == "engine_died"
        r = client.post("/v1/completions", json={"model": "m", "prompt": "hi"})
        assert r.status_code == 503 and "exited with code 3" in r.json()["error"]["message"]
