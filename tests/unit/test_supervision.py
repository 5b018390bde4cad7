"""A child engine that dies or hangs is reported (503 with the reason), never hidden, and
restarted a bounded number of times; the HTTP layer counts and reports every failure.

The child here is a real process serving real HTTP: a tiny stand-in for an engine server
that answers /health and then exits (or, stopped with SIGSTOP, hangs; or is SIGKILLed by
the test), so the supervision code runs exactly as with vLLM. The HTTP-layer tests at the end use a
scripted in-process engine: what they check is the server's own logic.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import signal
import sys
import time

import pytest
from conftest import sse_events

from reference_server.config import ServerConfig
from reference_server.engines.base import EngineDied, EngineHung, EngineInfo
from reference_server.engines.proxy import ProxyEngine
from reference_server.models import ModelSpec

CHILD = """
import http.server, json, subprocess, sys, threading, os, time
# an engine worker of its own, as vLLM's engine core: in the child's process group
worker = (subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
          if sys.argv[3:] == ["worker"] else None)
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps({"auth": self.headers.get("Authorization"),
                           "worker": worker and worker.pid}).encode()
        self.send_response(200); self.send_header("Content-Type", "application/json")
        self.end_headers(); self.wfile.write(body)
    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if body.get("prompt") == "ping":      # a request the engine answers
            answer = json.dumps({"object": "text_completion", "pid": os.getpid(),
                                 "choices": [{"index": 0, "text": "pong"}]}).encode()
            self.send_response(200); self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers(); self.wfile.write(answer)
            return
        if body.get("prompt") != "fail mid-stream":
            time.sleep(60)      # a request the engine never answers
            return
        # vLLM's way of failing a request mid-generation: an error event inside the 200,
        # here with the event split across two writes
        self.send_response(200); self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for part in (b'data: {"choices": [{"text": "a"}]}\\n\\ndata: {"err',
                     b'or": {"message": "engine failed", "code": 500}}\\n\\n',
                     b"data: [DONE]\\n\\n"):
            self.wfile.write(part); self.wfile.flush(); time.sleep(0.2)
    def log_message(self, *a): pass
srv = http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H)
threading.Timer(float(sys.argv[2]), lambda: os._exit(3)).start()
srv.serve_forever()
"""


class DyingEngine(ProxyEngine):
    name = "dying"

    def __init__(self, lifetime: float, restart_delays=(), worker=False, **config):
        super().__init__(ServerConfig(engine_start_timeout=30, **config),
                         ModelSpec("m", "m", False))
        self.lifetime = lifetime
        self.worker = worker
        self.restart_delays = restart_delays      # none unless a test is about restarts

    def command(self):
        return ([sys.executable, "-c", CHILD, str(self.port), str(self.lifetime)]
                + (["worker"] if self.worker else []))

    async def on_ready(self):
        self.check()        # as vLLM's reads /metrics and SGLang's /server_info: through check()

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
    """Without restarts left (here: none at all), a dead engine is a 503 for good."""
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
        # A request already waiting for the child's headers when it hangs: cut by the
        # detection, not left to the 600 s read timeout.
        in_flight = concurrent.futures.ThreadPoolExecutor(1).submit(
            client.post, "/v1/completions", json={"model": "m", "prompt": "hi"})
        t0 = time.monotonic()
        while not engine._sending and time.monotonic() - t0 < 10:
            time.sleep(0.05)
        os.kill(engine._child.pid, signal.SIGSTOP)     # alive, but answers nothing
        try:
            r = in_flight.result(timeout=15)
            assert r.status_code == 503 and r.json()["error"]["type"] == "engine_unresponsive"
            r = client.get("/health")
            assert r.status_code == 503
            assert r.json()["error"]["type"] == "engine_unresponsive"
            assert "has not answered its health check" in r.json()["error"]["message"]
            r = client.post("/v1/completions", json={"model": "m", "prompt": "hi"})
            assert r.status_code == 503 and r.json()["error"]["type"] == "engine_unresponsive"
            with pytest.raises(EngineHung):
                engine.check()
        finally:
            os.kill(engine._child.pid, signal.SIGCONT)
        t0 = time.monotonic()
        while client.get("/health").status_code != 200 and time.monotonic() - t0 < 10:
            time.sleep(0.1)
        assert client.get("/health").status_code == 200


# ---- restarts: a child that died (or stayed hung) is started again, a bounded number of times

def _until(condition, timeout: float = 30.0, what: str = "condition"):
    t0 = time.monotonic()
    while not (result := condition()):
        assert time.monotonic() - t0 < timeout, f"{what} not met in {timeout} s"
        time.sleep(0.05)
    return result


def _ready(client):
    _until(lambda: client.get("/ready").status_code == 200, what="ready")


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"    # a zombie holds nothing
    except FileNotFoundError:
        return True


def test_killed_child_is_restarted_and_serves_again():
    from fastapi.testclient import TestClient

    from reference_server.app import create_app

    engine = DyingEngine(lifetime=600, restart_delays=(1.5, 1.5, 1.5), worker=True)
    app = create_app(engine.config, engine=engine)
    with TestClient(app) as client:
        _ready(client)
        ping = {"model": "m", "prompt": "hi"}
        first = client.post("/v1/completions", json={**ping, "prompt": "ping"}).json()["pid"]
        worker = asyncio.run_coroutine_threadsafe(engine.get_json("/w"),
                                                  engine._probe.get_loop()).result(10)["worker"]
        in_flight = concurrent.futures.ThreadPoolExecutor(1).submit(
            client.post, "/v1/completions", json=ping)
        _until(lambda: engine._sending, what="request sent to the child")
        os.kill(first, signal.SIGKILL)
        # the request in flight dies with its child, and says so
        r = in_flight.result(timeout=15)
        assert r.status_code == 503 and r.json()["error"]["type"] == "engine_died"
        assert "killed by SIGKILL" in r.json()["error"]["message"]
        # while it restarts: not ready, new requests refused with a time to come back
        _until(lambda: engine.state == "restarting", what="restarting")
        for method, path in (("GET", "/ready"), ("POST", "/v1/completions")):
            r = client.request(method, path, json=ping if method == "POST" else None)
            assert r.status_code == 503, r.text
            assert r.json()["error"]["type"] == "engine_restarting"
            assert "killed by SIGKILL" in r.json()["error"]["message"]
            assert int(r.headers["retry-after"]) >= 1
        health = client.get("/health")
        assert health.status_code == 200 and health.json()["status"] == "restarting"
        info = client.get("/server_info").json()
        assert info["engine"] == "dying"
        assert info["engine_process"]["state"] == "restarting"
        assert "killed by SIGKILL" in info["engine_process"]["last_death"]
        # its engine worker, orphaned by the kill, is gone before a new child starts
        _until(lambda: _gone(worker), timeout=10, what="the old worker killed")
        _ready(client)
        again = client.post("/v1/completions", json={**ping, "prompt": "ping"})
        assert again.status_code == 200 and again.json()["pid"] != first
        assert client.get("/health").json() == {"status": "ok"}
        info = client.get("/server_info").json()["engine_process"]
        assert info["state"] == "serving" and info["restarts"] == 1 and info["restart_limit"] == 3
        assert _metric(client, "reference_server_engine_restarts_total") == 1
        assert _metric(client, "reference_server_engine_up") == 1


def test_child_that_keeps_dying_is_given_up_on():
    from fastapi.testclient import TestClient

    from reference_server.app import create_app

    engine = DyingEngine(lifetime=1.0, restart_delays=(0.1, 0.1))
    app = create_app(engine.config, engine=engine)
    with TestClient(app) as client:
        _ready(client)
        _until(lambda: engine.state == "gave up", what="given up")
        for path in ("/health", "/ready"):
            r = client.get(path)
            assert r.status_code == 503 and r.json()["error"]["type"] == "engine_died"
            assert "gave up on it after 2 restart(s)" in r.json()["error"]["message"]
            assert "exited with code 3" in r.json()["error"]["message"]
        r = client.post("/v1/completions", json={"model": "m", "prompt": "ping"})
        assert r.status_code == 503 and "retry-after" not in r.headers   # it will not come back
        info = client.get("/server_info").json()["engine_process"]
        assert info == {"state": "gave up", "restarts": 2, "restart_limit": 2,
                        "last_death": "process exited with code 3"}
        assert _metric(client, "reference_server_engine_restarts_total") == 2
        assert _metric(client, "reference_server_engine_up") == 0


def test_a_restart_that_fails_to_start_counts_as_a_try():
    async def run():
        engine = DyingEngine(lifetime=600, restart_delays=(0.1, 0.1))
        await engine.start()
        engine.command = lambda: [sys.executable, "-c", "import sys; sys.exit(7)"]
        os.kill(engine._child.pid, signal.SIGKILL)
        t0 = time.monotonic()
        while engine.state != "gave up" and time.monotonic() - t0 < 20:
            await asyncio.sleep(0.05)
        try:
            assert engine.supervision()["restarts"] == 2
            assert "did not start again" in engine.last_death and "code 7" in engine.last_death
            with pytest.raises(EngineDied, match="gave up"):
                engine.check()
        finally:
            await engine.stop()
    asyncio.run(run())


def test_tries_start_again_after_the_child_served_a_while():
    """Each death of a child that had served ``stable_after`` is a new incident: restarted
    again and again, where a crash loop would have had its one try."""
    async def run():
        engine = DyingEngine(lifetime=1.0, restart_delays=(0.1,))
        engine.stable_after = 0.5          # it serves 1 s between deaths
        await engine.start()
        t0 = time.monotonic()
        while engine.restarts < 3 and time.monotonic() - t0 < 30:
            assert engine.state != "gave up"
            await asyncio.sleep(0.05)
        await engine.stop()
        return engine.restarts
    assert asyncio.run(run()) >= 3


def test_child_hung_too_long_is_killed_and_restarted():
    from fastapi.testclient import TestClient

    from reference_server.app import create_app

    engine = DyingEngine(lifetime=600, restart_delays=(0.1,), liveness_interval=0.2,
                         liveness_failures=2, upstream_probe_timeout=0.5)
    engine.hang_restart_after = 2.0
    app = create_app(engine.config, engine=engine)
    with TestClient(app) as client:
        _ready(client)
        hung = engine._child.pid
        os.kill(hung, signal.SIGSTOP)
        try:
            r = _until(lambda: (r := client.get("/health")).status_code == 503 and r,
                       what="hung reported")
            assert r.json()["error"]["type"] == "engine_unresponsive"
            assert client.get("/server_info").json()["engine_process"]["state"] == "hung"
            _until(lambda: engine.restarts == 1, timeout=15, what="restarted")
            assert _gone(hung)
        finally:
            if not _gone(hung):
                os.kill(hung, signal.SIGCONT)
        _ready(client)
        info = client.get("/server_info").json()["engine_process"]
        assert info["state"] == "serving" and info["restarts"] == 1
        assert "did not answer its health check" in info["last_death"]


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


def test_an_error_event_inside_a_relayed_stream_counts_as_a_failed_stream():
    from fastapi.testclient import TestClient

    from reference_server.app import create_app

    engine = DyingEngine(lifetime=600)
    with TestClient(create_app(engine.config, engine=engine)) as client:
        t0 = time.monotonic()
        while client.get("/ready").status_code != 200 and time.monotonic() - t0 < 30:
            time.sleep(0.1)
        r = client.post("/v1/completions",
                        json={"model": "m", "prompt": "fail mid-stream", "stream": True})
        assert r.status_code == 200 and 'data: {"error": {"message": "engine failed"' in r.text
        assert _metric(client, "reference_server_stream_failures_total") == 1
        assert _metric(client, "reference_server_client_disconnects_total") == 0
        assert _metric(client, "reference_server_requests_total", status="500") == 1
        assert _metric(client, "reference_server_requests_total", status="200") == 0


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
            super().__init__(ServerConfig(engine="hf", device="cpu"), ModelSpec("m", "", False))
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
        events = sse_events(r.text)           # no [DONE] after an error event
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
        assert client.post("/v1/completions",
                           json={"model": "m", "prompt": "hi"}).status_code == 200


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
    from reference_server.sse import EngineStream

    state = _scripted_app().state.server
    closed = []

    class EngineAnswer:
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
    response = EngineStream(EngineAnswer(), state, {})
    with pytest.raises(Exception):
        asyncio.run(response({"type": "http", "asgi": {"spec_version": "2.4"}}, receive, send))
    assert state.active == 0 and closed == [True]



def test_client_leaving_while_a_chunk_is_being_sent_is_counted_and_its_engine_stream_closed():
    """The hang-up cancels Starlette inside ``send`` (a slow socket), not inside the engine
    stream: the body generator is left at a ``yield`` and must still be closed at once."""
    from reference_server import prometheus as P
    from reference_server.sse import EngineStream

    state = _scripted_app().state.server
    closed = []

    class EngineAnswer:              # an endless engine answer
        def __aiter__(self):
            return self

        async def __anext__(self):
            await asyncio.sleep(0)
            return b"data: {}\n\n"

        async def aclose(self):
            closed.append(True)

    async def main():
        gone, sent = asyncio.Event(), []

        async def send(message):
            sent.append(message)
            if len(sent) == 3:               # the second chunk: the socket stops draining
                gone.set()
                await asyncio.Event().wait()

        async def receive():
            await gone.wait()
            return {"type": "http.disconnect"}

        def count():
            return state.metrics.registry.get_sample_value(P.SERVER_CLIENT_DISCONNECTS)

        before = count()
        state.request_started()
        await EngineStream(EngineAnswer(), state, {})(
            {"type": "http", "asgi": {"spec_version": "2.3"}}, receive, send)
        # checked before asyncio.run ends: its shutdown would close a forgotten generator
        return state.active, closed, count() - before

    assert asyncio.run(main()) == (0, [True], 1)

# ---- the child's own key check (it runs inside the child: here, over a stand-in app) ----

# Paths vLLM 0.32 serves outside the prefixes its own key check covers (/v1, /v2, /inference,
# /cohere), and SGLang's open ones (/health*, /metrics*).
CHILD_PATHS = [("POST", "/invocations"), ("POST", "/tokenize"), ("POST", "/detokenize"),
               ("POST", "/generative_scoring"), ("POST", "/scale_elastic_ep"),
               ("GET", "/metrics"), ("GET", "/docs"), ("GET", "/health"),
               ("GET", "/health_generate"), ("OPTIONS", "/v1/completions"),
               ("GET", "/v1/models")]


def _child_app(engine_client=None):
    from starlette.applications import Starlette
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route, WebSocketRoute

    from reference_server.engines.vllm import ChildMiddleware

    async def anything(request):
        return PlainTextResponse("served")

    async def realtime(ws):
        await ws.accept()
        await ws.send_text("served")
        await ws.close()

    methods = ["GET", "POST", "OPTIONS"]
    app = Starlette(routes=[Route(p, anything, methods=methods) for _, p in CHILD_PATHS]
                    + [WebSocketRoute("/v1/realtime", realtime)])
    app.state.engine_client = engine_client
    app.add_middleware(ChildMiddleware)        # as vLLM's --middleware does
    return app


def test_the_childs_key_is_needed_on_every_path(monkeypatch):
    from starlette.testclient import TestClient
    from starlette.websockets import WebSocketDisconnect

    class EngineClient:
        async def reset_prefix_cache(self):
            return True

    monkeypatch.setenv("VLLM_API_KEY", "child-key")
    with TestClient(_child_app(EngineClient())) as client:
        for auth in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "child-key"}):
            for method, path in CHILD_PATHS + [("POST", "/reset_prefix_cache")]:
                r = client.request(method, path, headers=auth)
                assert r.status_code == 401, (method, path, auth)
                assert r.json()["error"]["type"] == "authentication_error"
            with pytest.raises(WebSocketDisconnect) as closed:
                with client.websocket_connect("/v1/realtime", headers=auth) as ws:
                    ws.receive_text()
            assert closed.value.code == 1008
        key = {"Authorization": "Bearer child-key"}
        for method, path in CHILD_PATHS:
            assert client.request(method, path, headers=key).text == "served", path
        with client.websocket_connect("/v1/realtime", headers=key) as ws:
            assert ws.receive_text() == "served"
        assert client.post("/reset_prefix_cache", headers=key).json() == {"success": True}
        assert client.get("/reset_prefix_cache", headers=key).status_code == 405
    monkeypatch.delenv("VLLM_API_KEY")              # started without its key: closed
    with TestClient(_child_app()) as client:
        assert client.get("/health", headers={"Authorization": "Bearer "}).status_code == 401


def test_every_route_of_vllms_own_app_needs_the_childs_key(monkeypatch):
    """vLLM's real app (no engine behind it), built from the arguments the child gets, with
    our middleware loaded the way vLLM loads it: every route it mounts, today's and any a
    later vLLM adds, answers 401 without the child's key."""
    pytest.importorskip("vllm")
    from starlette.testclient import TestClient
    from vllm.entrypoints.launchers.app import build_app
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    from reference_server.engines.vllm import ChildMiddleware

    monkeypatch.setenv("VLLM_API_KEY", "child-key")
    args = make_arg_parser(FlexibleArgumentParser()).parse_args(
        ["--model", "m", "--middleware", f"{ChildMiddleware.__module__}.ChildMiddleware"])
    app = build_app(args, supported_tasks=("generate",))
    routes = {(m, r.path.replace("{", "").replace("}", ""))
              for r in app.routes for m in (getattr(r, "methods", None) or {"GET"})}
    assert {("POST", "/invocations"), ("POST", "/tokenize"), ("GET", "/metrics"),
            ("POST", "/scale_elastic_ep"), ("POST", "/v1/completions")} <= routes
    client = TestClient(app, raise_server_exceptions=False)   # no lifespan: no engine
    for auth in ({}, {"Authorization": "Bearer wrong"}):
        open_routes = [(m, p, r.status_code) for m, p in sorted(routes)
                       if (r := client.request(m, p, headers=auth)).status_code != 401]
        assert open_routes == []
    # with the key, requests reach vLLM (which, without an engine, fails them otherwise)
    assert client.get("/version", headers={"Authorization": "Bearer child-key"}).status_code == 200


def test_sglang_is_launched_with_the_guard_on_its_app(monkeypatch):
    """``sglang_launch`` over stand-in SGLang modules: the guard goes on the app SGLang
    serves, with the key SGLang parsed, and modes it cannot guard are refused."""
    import types

    from reference_server.engines import sglang_launch
    from reference_server.engines.child_guard import ChildKeyGuard

    def launch(**parsed_args):
        added, ran = [], []
        parsed = types.SimpleNamespace(**{
            "api_key": "sgl-key", "tokenizer_worker_num": 1, "encoder_only": False,
            "smg_grpc_mode": False, "use_ray": False, **parsed_args})
        app = types.SimpleNamespace(add_middleware=lambda cls, **kw: added.append((cls, kw)))
        fake = {
            "sglang": types.ModuleType("sglang"),
            "sglang.launch_server": types.SimpleNamespace(run_server=ran.append),
            "sglang.srt.plugins": types.SimpleNamespace(load_plugins=lambda: None),
            "sglang.srt.server_args": types.SimpleNamespace(prepare_server_args=lambda a: parsed),
            "sglang.srt.utils": types.SimpleNamespace(kill_process_tree=lambda *a, **k: None),
            "sglang.srt.entrypoints.http_server": types.SimpleNamespace(app=app),
        }
        with monkeypatch.context() as m:
            for name, module in fake.items():
                m.setitem(sys.modules, name, module)
            sglang_launch.main(["--model-path", "m"])
        return added, ran == [parsed]

    assert launch() == ([(ChildKeyGuard, {"key": "sgl-key"})], True)
    for unguardable in ({"api_key": None}, {"tokenizer_worker_num": 2}, {"smg_grpc_mode": True},
                        {"use_ray": True}, {"encoder_only": True}):
        with pytest.raises(SystemExit):
            launch(**unguardable)
