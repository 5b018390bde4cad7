"""A child engine that dies or hangs is reported (503 with the reason), never hidden; the
HTTP layer counts and reports every failure.

The child here is a real process serving real HTTP: a tiny stand-in for an engine server
that answers /health and then exits (or, stopped with SIGSTOP, hangs), so the supervision
code runs exactly as with vLLM. The HTTP-layer tests at the end use a scripted in-process
engine: what they check is the server's own logic.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time

import pytest

from reference_server.config import ServerConfig
from reference_server.engines.base import EngineDied, EngineHung, EngineInfo
from reference_server.engines.proxy import ProxyEngine
from reference_server.models import ModelSpec

CHILD = """
import http.server, json, sys, threading, os, time
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps({"auth": self.headers.get("Authorization")}).encode()
        self.send_response(200); self.send_header("Content-Type", "application/json")
        self.end_headers(); self.wfile.write(body)
    def do_POST(self):
        time.sleep(60)          # a request the engine never answers
    def log_message(self, *a): pass
srv = http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H)
threading.Timer(float(sys.argv[2]), lambda: os._exit(3)).start()
srv.serve_forever()
"""


class DyingEngine(ProxyEngine):
    name = "dying"

    def __init__(self, lifetime: float, **config):
        super().__init__(ServerConfig(engine_start_timeout=30, **config),
                         ModelSpec("m", "m", False))
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


def test_child_gets_a_random_key_of_its_own():
    async def run():
        engine = DyingEngine(lifetime=60, api_key="the-servers-key")
        await engine.start()
        try:
            auth = (await engine.get_json("/anything"))["auth"]
            return auth, engine.child_key, engine.env()
        finally:
            await engine.stop()
    os.environ["WORKSHOP_API_KEY"] = "the-servers-key"
    try:
        auth, key, env = asyncio.run(run())
    finally:
        del os.environ["WORKSHOP_API_KEY"]
    assert auth == f"Bearer {key}" and len(key) >= 32 and "servers" not in key
    assert "WORKSHOP_API_KEY" not in env


def test_hung_child_is_reported_then_recovers():
    from fastapi.testclient import TestClient

    from reference_server.app import create_app

    engine = DyingEngine(lifetime=600, liveness_interval=0.2, liveness_failures=2,
                         upstream_probe_timeout=0.5)
    app = create_app(engine.config, engine=engine)
    with TestClient(app) as client:
        t0 = time.monotonic()
        while client.get("/ready").status_code != 200 and time.monotonic() - t0 < 30:
            time.sleep(0.1)
        os.kill(engine._proc.pid, signal.SIGSTOP)     # alive, but answers nothing
        try:
            t0 = time.monotonic()
            while client.get("/health").status_code == 200 and time.monotonic() - t0 < 10:
                time.sleep(0.1)
            r = client.get("/health")
            assert r.status_code == 503
            assert r.json()["error"]["type"] == "engine_unresponsive"
            assert "has not answered its health check" in r.json()["error"]["message"]
            r = client.post("/v1/completions", json={"model": "m", "prompt": "hi"})
            assert r.status_code == 503 and r.json()["error"]["type"] == "engine_unresponsive"
            with pytest.raises(EngineHung):
                engine.check()
        finally:
            os.kill(engine._proc.pid, signal.SIGCONT)
        t0 = time.monotonic()
        while client.get("/health").status_code != 200 and time.monotonic() - t0 < 10:
            time.sleep(0.1)
        assert client.get("/health").status_code == 200


def test_upstream_read_timeout_fails_the_request():
    from fastapi.testclient import TestClient

    from reference_server.app import create_app

    engine = DyingEngine(lifetime=600, upstream_read_timeout=1.0)
    app = create_app(engine.config, engine=engine)
    with TestClient(app) as client:
        t0 = time.monotonic()
        while client.get("/ready").status_code != 200 and time.monotonic() - t0 < 30:
            time.sleep(0.1)
        t0 = time.monotonic()
        r = client.post("/v1/completions", json={"model": "m", "prompt": "hi"})
        assert r.status_code == 504 and r.json()["error"]["type"] == "engine_timeout"
        assert time.monotonic() - t0 < 10


# ---- the HTTP layer's own accounting, over a scripted in-process engine -----------------

def _scripted_app(fail: str | None = None, **config):
    from reference_server.app import create_app
    from reference_server.engines.local import EngineStats, GenerationStep, LocalEngine

    class Tok:
        eos_token_id = 0

        def encode(self, text):
            return [ord(c) for c in text]

        def decode(self, ids, skip_special_tokens=True):
            return "".join(chr(i) for i in ids if i)

    class Scripted(LocalEngine):
        name = "scripted"
        ready = True

        def __init__(self):
            super().__init__()
            self.tokenizer, self.max_model_len, self.model_name = Tok(), 64, "m"

        async def generate(self, request_id, prompt_token_ids, params):
            yield GenerationStep([ord("a")])
            if fail == "step":
                raise RuntimeError("NaN probabilities")
            yield GenerationStep([0], finish_reason="stop")

        def info(self):
            if self.broken:
                raise RuntimeError("a bug in a route")
            return EngineInfo("scripted", "0", "m", "m", "none", "cpu", 64, None, None, None,
                              False)

        def stats(self):
            return EngineStats()

        broken = False       # set by a test once the server is up

        async def start(self): ...
        async def stop(self): ...
        async def reset_prefix_cache(self): return False

    return create_app(ServerConfig(served_model_name="m", **config), engine=Scripted())


def _metric(client, name: str, **labels) -> float:
    total = 0.0
    for line in client.get("/metrics").text.splitlines():
        key, _, value = line.rpartition(" ")
        if key.split("{")[0] == name and all(f'{k}="{v}"' in key for k, v in labels.items()):
            total += float(value)
    return total


def test_engine_fault_is_a_500_engine_error_and_counted():
    from fastapi.testclient import TestClient
    with TestClient(_scripted_app(fail="step")) as client:
        r = client.post("/v1/completions", json={"model": "m", "prompt": "hi"})
        assert r.status_code == 500 and r.json()["error"]["type"] == "engine_error"
        assert _metric(client, "reference_server_requests_total", status="500") == 1


def test_unhandled_route_error_is_counted_as_a_500():
    from fastapi.testclient import TestClient
    app = _scripted_app()
    with TestClient(app, raise_server_exceptions=False) as client:
        app.state.server.engine.broken = True
        r = client.get("/v1/models")
        assert r.status_code == 500 and r.json()["error"]["type"] == "server_error"
        assert _metric(client, "reference_server_requests_total", status="500") == 1


def test_stream_failing_server_side_is_a_failure_not_a_disconnect():
    from fastapi.testclient import TestClient
    with TestClient(_scripted_app(fail="step")) as client:
        r = client.post("/v1/completions", json={"model": "m", "prompt": "hi", "stream": True})
        assert r.status_code == 200           # already sent when the engine failed
        events = [json.loads(line[6:]) for line in r.text.splitlines()
                  if line.startswith("data: {")]
        assert events[-1]["error"]["type"] == "engine_error"
        assert _metric(client, "reference_server_stream_failures_total") == 1
        assert _metric(client, "reference_server_client_disconnects_total") == 0
        assert _metric(client, "reference_server_requests_total", status="500") == 1
        assert _metric(client, "reference_server_requests_in_flight") == 0


def test_full_server_answers_429_with_retry_after():
    from fastapi.testclient import TestClient
    app = _scripted_app(max_queued_requests=0)
    with TestClient(app) as client:
        state = app.state.server
        state.active = state.max_active          # as if that many were being served
        r = client.post("/v1/completions", json={"model": "m", "prompt": "hi"})
        assert r.status_code == 429 and r.headers["retry-after"] == "1"
        assert r.json()["error"]["code"] == "queue_full"
        state.active = 0
        assert client.post("/v1/completions", json={"model": "m", "prompt": "hi"}).status_code == 200


def test_deeply_nested_json_is_a_400():
    from fastapi.testclient import TestClient
    with TestClient(_scripted_app()) as client:
        body = b'{"model": "m", "prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
        r = client.post("/v1/completions", content=body,
                        headers={"Content-Type": "application/json"})
        assert r.status_code == 400 and "nested" in r.json()["error"]["message"]


def test_key_policy_everything_but_health_and_ready():
    from fastapi.testclient import TestClient
    with TestClient(_scripted_app(api_key="k")) as client:
        for method, path in [("GET", "/server_info"), ("GET", "/metrics"), ("GET", "/docs"),
                             ("GET", "/openapi.json"), ("POST", "/reset_prefix_cache"),
                             ("GET", "/v1/models"), ("GET", "/nowhere")]:
            assert client.request(method, path).status_code == 401, path
            ok = client.request(method, path, headers={"Authorization": "Bearer k"})
            assert ok.status_code == (404 if path == "/nowhere" else 200), path
        assert client.get("/health").status_code == 200
        assert client.get("/ready").status_code == 200


def test_client_leaving_before_the_first_byte_frees_its_slot_and_engine_stream():
    from reference_server.app import _EngineStream

    state = _scripted_app().state.server
    closed = []

    class EngineStream:
        def __aiter__(self):
            return self

        async def __anext__(self):
            raise StopAsyncIteration

        async def aclose(self):
            closed.append(True)

    async def send(message):
        raise OSError("the client is gone")

    async def receive():
        return {"type": "http.disconnect"}

    state.request_started()
    response = _EngineStream(EngineStream(), state, {})
    with pytest.raises(Exception):
        asyncio.run(response({"type": "http", "asgi": {"spec_version": "2.4"}}, receive, send))
    assert state.active == 0 and closed == [True]
