"""Shared fixtures: real reference servers over real engines, started once per session.

Servers are launched lazily: the first test that asks for any engine starts every engine
at once (they load in parallel), so a unit-only run (``-m "not engine"``) starts nothing.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

API_KEY = "sk-workshop-test"
MODEL = "smollm2-135m"
ENGINES = ("vllm", "hf", "mini")
# Per-engine server options. The queue bounds are small enough for the queue test to fill
# them and large enough for the 64-stream load test: vLLM runs 64 at once here (as mini does
# by default), hf runs one and queues the rest.
FLEET_ARGS = {
    "vllm": ("--max-queued-requests", "8", "--", "--max-num-seqs", "64"),
    "hf": ("--max-queued-requests", "64"),
    "mini": ("--max-queued-requests", "8"),
}
START_TIMEOUT = float(os.environ.get("WORKSHOP_TEST_START_TIMEOUT", "900"))
LOG_DIR = Path(os.environ.get("WORKSHOP_TEST_LOGS", "/tmp/workshop-test-logs"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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

    def metrics(self) -> dict[str, float]:
        """Prometheus samples by name+labels -> value (e.g. 'vllm:kv_cache_usage_perc{...}')."""
        r = httpx.get(self.base_url + "/metrics", headers=self.headers, timeout=30)
        r.raise_for_status()
        text = r.text
        out = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                key, _, value = line.rpartition(" ")
                out[key] = float(value)
        return out

    def metric(self, name: str) -> float:
        """Sum of every sample of ``name`` (all label sets)."""
        return sum(v for k, v in self.metrics().items() if k.split("{")[0] == name)

    def log_tail(self, n: int = 60) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""


def launch(engine: str, *args: str, api_key: str = API_KEY) -> RunningServer:
    """Start ``python -m reference_server`` without waiting for it to be ready."""
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    port = _free_port()
    log_path = LOG_DIR / f"{engine}-{port}.log"
    cmd = [sys.executable, "-m", "reference_server", "--engine", engine, "--model", MODEL,
           "--port", str(port), "--max-model-len", "2048", "--kv-cache-gib", "1",
           "--log-level", "warning", *args]
    # the key by environment: a flag would be visible to every user in `ps`
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "WORKSHOP_API_KEY": api_key or ""}
    proc = subprocess.Popen(cmd, stdout=open(log_path, "w"), stderr=subprocess.STDOUT, env=env)
    return RunningServer(engine, f"http://127.0.0.1:{port}", api_key, MODEL, proc, log_path)


def wait_ready(server: RunningServer, timeout: float = START_TIMEOUT) -> RunningServer:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.proc.poll() is not None:
            raise RuntimeError(f"{server.engine} server exited with {server.proc.returncode}:\n"
                               + server.log_tail())
        try:
            if httpx.get(server.base_url + "/ready", timeout=5).status_code == 200:
                return server
        except httpx.HTTPError:
            pass
        time.sleep(1)
    stop(server)
    raise RuntimeError(f"{server.engine} server not ready after {timeout} s:\n" + server.log_tail())


def stop(server: RunningServer) -> None:
    if server.proc.poll() is None:
        server.proc.terminate()
        try:
            server.proc.wait(60)
        except subprocess.TimeoutExpired:
            server.proc.kill()
            server.proc.wait()


class _Fleet:
    """Every engine server of the session, launched together on first use."""

    def __init__(self) -> None:
        self.servers: dict[str, RunningServer] = {}
        self.ready: dict[str, RunningServer] = {}

    def get(self, engine: str) -> RunningServer:
        if not self.servers:
            # Prepare the bundled model once, before several servers race to do it.
            from workshop.models import resolve_model
            resolve_model(MODEL)
            for e in ENGINES:
                self.servers[e] = launch(e, *FLEET_ARGS.get(e, ()))
        if engine not in self.ready:
            self.ready[engine] = wait_ready(self.servers[engine])
        return self.ready[engine]

    def close(self) -> None:
        for s in self.servers.values():
            stop(s)


@pytest.fixture(scope="session")
def fleet():
    f = _Fleet()
    yield f
    f.close()


@pytest.fixture(scope="session")
def vllm_server(fleet) -> RunningServer:
    return fleet.get("vllm")


@pytest.fixture(scope="session")
def hf_server(fleet) -> RunningServer:
    return fleet.get("hf")


@pytest.fixture(scope="session")
def mini_server(fleet) -> RunningServer:
    return fleet.get("mini")


@pytest.fixture(params=ENGINES)
def server(request) -> RunningServer:
    """The same API test against every engine."""
    return request.getfixturevalue(f"{request.param}_server")
