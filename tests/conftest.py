"""Shared fixtures: real reference servers over real engines, started once per session.

Servers are launched lazily: the first test that asks for any engine starts every engine
the selected tests use, at once (they load in parallel), so a unit-only run (``-m "not
engine"``) starts nothing and ``-k sglang`` starts SGLang alone.

SGLang runs from its own environment (``scripts/setup.sh --with-sglang``, which
``scripts/test.sh`` runs); where that was not built its tests are skipped, except on CI.

``remote`` is a reference server with ``--engine remote`` in front of a second server
process: a teaching-engine server with a key of its own (``UPSTREAM_KEY``), started with it
(one per session) and stopped with it.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from reference_server import launch as launcher
from reference_server import prometheus

API_KEY = "sk-workshop-test"
MODEL = "smollm2-135m"
ENGINES = ("vllm", "sglang", "hf", "mini", "remote")
# WORKSHOP_TEST_MATRIX=full also runs what the 45-minute CI budget leaves out (before a
# release): every notebook in both formats, notebook 1 on SGLang, vLLM's engine restart.
FULL_MATRIX = os.environ.get("WORKSHOP_TEST_MATRIX", "").strip().lower() == "full"
UPSTREAM_KEY = "sk-remote-upstream-test"      # the remote engine's upstream's key, not ours
# Per-engine server options. The queue bounds are small enough for the queue test to fill
# them and large enough for the 64-stream load test: vLLM and SGLang run 64 at once here (as
# mini does by default), hf runs one and queues the rest.
FLEET_ARGS = {
    "vllm": ("--max-queued-requests", "8", "--", "--max-num-seqs", "64"),
    "sglang": ("--max-queued-requests", "8", "--", "--max-running-requests", "64"),
    "hf": ("--max-queued-requests", "64"),
    "mini": ("--max-queued-requests", "8"),
    # the same bound as its upstream's (mini, below), so the upstream never refuses what
    # the remote server admitted
    "remote": ("--max-queued-requests", "8"),
}
UPSTREAM_ARGS = ("--max-queued-requests", "8")
START_TIMEOUT = float(os.environ.get("WORKSHOP_TEST_START_TIMEOUT", "900"))
LOG_DIR = Path(os.environ.get("WORKSHOP_TEST_LOGS", "/tmp/workshop-test-logs"))
DONE = "[DONE]"                               # the last event of an OpenAI stream


def sse_events(body: str | bytes) -> list:
    """The events of a whole server-sent-events body, in order: each ``data:`` payload parsed
    as JSON, the closing ``data: [DONE]`` as ``DONE``. Any other non-blank line fails the test
    (the servers under test send nothing else). A test that must act in the middle of a
    stream reads its lines itself."""
    text = body.decode() if isinstance(body, bytes) else body
    events = []
    for line in text.splitlines():
        if not line.strip():
            continue
        assert line.startswith("data: "), f"not an SSE data line: {line!r}"
        payload = line[len("data: "):]
        events.append(DONE if payload == DONE else json.loads(payload))
    return events


def _free_port() -> int:
    return launcher.free_port()


@dataclass
class RunningServer:
    """A reference server subprocess: what tests need to talk to it over HTTP."""

    engine: str
    base_url: str            # root URL, without /v1
    api_key: str
    model: str
    proc: subprocess.Popen
    log_path: Path
    extra: dict = field(default_factory=dict)

    @property
    def headers(self) -> dict:
        return {"Authorization": f"Bearer {self.api_key}"}

    def openai(self, **kw):
        import openai
        return openai.OpenAI(base_url=self.base_url + "/v1", api_key=self.api_key,
                             max_retries=0, timeout=kw.pop("timeout", 120), **kw)

    def async_openai(self, **kw):
        import openai
        return openai.AsyncOpenAI(base_url=self.base_url + "/v1", api_key=self.api_key,
                                  max_retries=0, timeout=kw.pop("timeout", 300), **kw)

    def metrics(self) -> list[prometheus.Sample]:
        """Every sample of ``/metrics``, with its labels (the endpoint needs the key)."""
        r = httpx.get(self.base_url + "/metrics", headers=self.headers, timeout=30)
        r.raise_for_status()
        return prometheus.parse(r.text)

    def metric(self, name: str) -> float:
        """Sum of every sample of ``name`` (all label sets)."""
        return sum(s.value for s in self.metrics() if s.name == name)

    def log_tail(self, n: int = 60) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""


def launch(engine: str, *args: str, api_key: str = API_KEY, env: dict | None = None,
           log_level: str = "warning") -> RunningServer:
    """Start ``python -m reference_server`` without waiting for it to be ready (``env``:
    variables added to this process's)."""
    port = _free_port()
    log_path = LOG_DIR / f"{engine}-{port}.log"
    child = launcher.launch(["--engine", engine, "--model", MODEL, "--max-model-len", "2048",
                             "--kv-cache-gib", "1", "--log-level", log_level, *args],
                            port=port, log_path=log_path, api_key=api_key,
                            env={**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})})
    return RunningServer(engine, child.base_url, api_key, MODEL, child.proc, log_path)


def launch_remote(upstream: RunningServer, *args: str, upstream_key: str | None = UPSTREAM_KEY,
                  **kw) -> RunningServer:
    """A ``--engine remote`` server in front of ``upstream``, its key by environment."""
    server = launch("remote", "--upstream", upstream.base_url + "/v1", *args,
                    env={"WORKSHOP_UPSTREAM_API_KEY": upstream_key or ""}, **kw)
    server.extra["upstream"] = upstream
    return server


def wait_ready(server: RunningServer, timeout: float = START_TIMEOUT) -> RunningServer:
    try:
        launcher.wait_ready(server.base_url, timeout=timeout, proc=server.proc,
                            log_path=server.log_path, api_key=server.api_key)
    except TimeoutError:
        stop(server)
        raise
    return server


def stop(server: RunningServer) -> None:
    launcher.stop(server.proc, timeout=60)
    if "upstream" in server.extra:
        stop(server.extra["upstream"])


@functools.cache
def unavailable(engine: str) -> str | None:
    """Why ``engine`` cannot run here (skip), or None. On CI every engine must run: a
    missing one fails its tests there instead of skipping them.

    SGLang needs its own environment (scripts/test.sh builds it), with a kernel built for
    this CPU."""
    if os.environ.get("CI"):
        return None
    if engine != "sglang":
        return None
    from reference_server.engines.sglang import not_installed
    return not_installed()


# The engines the selected tests use (pytest_collection_modifyitems): the fleet starts those,
# and stops each after the last test that uses it (_LAST_USER: engine -> test id), so the
# notebooks, which need vLLM and hf only, do not share 2 cores and the memory with the rest.
_WANTED: set[str] = set()
_LAST_USER: dict[str, str] = {}
_FLEETS: list["_Fleet"] = []


def _engines_of(item) -> set[str]:
    params = getattr(getattr(item, "callspec", None), "params", {})
    used = {params[name] for name in ("server", "engine") if params.get(name) in ENGINES}
    return used | {e for e in ENGINES if f"{e}_server" in getattr(item, "fixturenames", ())}


@pytest.hookimpl(trylast=True)     # after -k and -m have deselected what will not run
def pytest_collection_modifyitems(config, items):
    for item in items:
        for e in _engines_of(item):
            _WANTED.add(e)
            _LAST_USER[e] = item.nodeid


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    yield
    for e, last in _LAST_USER.items():
        if last == item.nodeid:
            for f in _FLEETS:
                f.retire(e)


class _Fleet:
    """Every engine server of the session, launched together on first use."""

    def __init__(self) -> None:
        self.servers: dict[str, RunningServer] = {}
        self.ready: dict[str, RunningServer] = {}

    def get(self, engine: str) -> RunningServer:
        if unavailable(engine):
            pytest.skip(unavailable(engine))
        if not self.servers:
            # Prepare the bundled model once, before several servers race to do it.
            from reference_server.models import resolve_model
            resolve_model(MODEL)
            for e in ENGINES:
                if e in (_WANTED or ENGINES) and not unavailable(e):
                    self.servers[e] = self._launch(e)
        if engine not in self.servers:      # not foreseen at collection: start it now
            self.servers[engine] = self._launch(engine)
        if engine not in self.ready:
            self.ready[engine] = wait_ready(self.servers[engine])
        return self.ready[engine]

    @staticmethod
    def _launch(engine: str) -> RunningServer:
        if engine != "remote":
            return launch(engine, *FLEET_ARGS.get(engine, ()))
        upstream = launch("mini", *UPSTREAM_ARGS, api_key=UPSTREAM_KEY)
        return launch_remote(upstream, *FLEET_ARGS["remote"])

    def retire(self, engine: str) -> None:
        """Stop ``engine``'s server (and a remote one's upstream): no test left needs it."""
        server = self.servers.pop(engine, None)
        self.ready.pop(engine, None)
        if server is not None:
            stop(server)

    def close(self) -> None:
        for s in self.servers.values():
            stop(s)


@pytest.fixture(scope="session")
def fleet():
    f = _Fleet()
    _FLEETS.append(f)
    yield f
    f.close()
    _FLEETS.remove(f)


@pytest.fixture(scope="session")
def vllm_server(fleet) -> RunningServer:
    return fleet.get("vllm")


@pytest.fixture(scope="session")
def sglang_server(fleet) -> RunningServer:
    return fleet.get("sglang")


@pytest.fixture(scope="session")
def hf_server(fleet) -> RunningServer:
    return fleet.get("hf")


@pytest.fixture(scope="session")
def mini_server(fleet) -> RunningServer:
    return fleet.get("mini")


@pytest.fixture(scope="session")
def remote_server(fleet) -> RunningServer:
    """``--engine remote`` in front of a teaching-engine server (``.extra["upstream"]``)."""
    return fleet.get("remote")


@pytest.fixture(params=ENGINES)
def server(request) -> RunningServer:
    """The same API test against every engine."""
    return request.getfixturevalue(f"{request.param}_server")


@pytest.fixture
def mock_engine():
    """``start(chunk_delay_s, first_token_delay_s, max_concurrency)`` runs
    ``python -m workshop.bench.mock_server`` with that timing (a server of known capacity)
    and returns its URL; every one started is stopped after the test."""
    procs = []

    def start(chunk_delay_s: float, first_token_delay_s: float, max_concurrency: int) -> str:
        port = launcher.free_port()
        p = subprocess.Popen([sys.executable, "-m", "workshop.bench.mock_server", "--port",
                              str(port),
                              "--chunk-delay-s", str(chunk_delay_s), "--first-token-delay-s",
                              str(first_token_delay_s),
                              "--max-concurrency", str(max_concurrency)],
                             stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONUNBUFFERED": "1"})
        procs.append(p)
        assert "mock server on" in p.stdout.readline()
        return f"http://127.0.0.1:{port}"

    yield start
    for p in procs:
        p.terminate()
        p.wait(10)


class _BusyUpstream(BaseHTTPRequestHandler):
    """An OpenAI-compatible server that is always busy: a 429 for completions (an OpenAI error
    body), a 503 for chat (a gateway's plain text), each with its own Retry-After."""

    def do_GET(self):
        if self.path == "/v1/models":
            self._send(200, json.dumps({"object": "list",
                                        "data": [{"id": "busy", "object": "model"}]}))
        elif self.path == "/health":
            self._send(200, "")
        else:
            self._send(404, "")

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.path == "/v1/completions":
            self._send(429, json.dumps({"error": {"message": "slow down",
                                                  "type": "rate_limit_error",
                                                  "code": "rate_limited"}}), {"Retry-After": "7"})
        else:
            self._send(503, "Service Unavailable", {"Retry-After": "30"}, "text/plain")

    def _send(self, status, text, headers=None, kind="application/json"):
        data = text.encode()
        self.send_response(status)
        for k, v in {"Content-Type": kind, "Content-Length": str(len(data)),
                     **(headers or {})}.items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture
def busy_upstream():
    """The root URL of an always-busy OpenAI-compatible server (``_BusyUpstream``), in this
    process: what the remote engine and notebook 14's gateway must relay, not simulate."""
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _BusyUpstream)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_port}"
    httpd.shutdown()
