"""``--engine remote``: a reference server in front of another server process, over real HTTP.

The fleet's ``remote_server`` fronts a teaching-engine server of its own (tests/conftest.py);
the API and bad-input suites run against it like every engine. Here: what only a remote
engine has to get right. Its upstream's key stays between the two servers; a remote server
that goes away is reported with OpenAI-style errors (502, then 503), never a crash, and is
used again when it comes back (that one fronts the harness's mock server, a real process
that starts in a moment and can be killed without touching the fleet). A busy upstream's
429 / 503 reaches the client with its Retry-After (the upstream: a tiny HTTP server in this
process that refuses everything, the behaviour being simulated). ``connect()`` with
``WORKSHOP_ENGINE=remote`` starts a remote engine of its own in front of the fleet's upstream.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from conftest import UPSTREAM_KEY, RunningServer, launch_remote, stop, wait_ready

from reference_server import launch as launcher
from reference_server import prometheus as P

pytestmark = pytest.mark.engine


def _descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        for task in Path(f"/proc/{p}/task").iterdir():
            kids = [int(k) for k in (task / "children").read_text().split()]
            out += kids
            todo += kids
    return out


def test_requests_reach_the_upstream_process(remote_server):
    upstream = remote_server.extra["upstream"]
    # a second server process, not a child of the remote one
    assert upstream.proc.pid not in _descendants(remote_server.proc.pid)
    info = httpx.get(remote_server.base_url + "/server_info", headers=remote_server.headers).json()
    assert info["engine"] == "remote" and info["extra"]["remote"]["engine"] == "mini"
    before = upstream.metric(P.SERVER_REQUESTS)
    r = remote_server.openai().completions.create(model=remote_server.model, prompt="Hello",
                                                  max_tokens=3)
    assert r.usage.completion_tokens == 3
    assert upstream.metric(P.SERVER_REQUESTS) == before + 1
    # our own counters are the remote server's, not the upstream's relayed as well
    names = [s.name for s in remote_server.metrics()]
    assert names.count(P.SERVER_ENGINE_UP) == 1


def test_upstream_key_stays_between_the_servers(remote_server):
    upstream = remote_server.extra["upstream"]
    # the keys differ: ours does not open the upstream, and the upstream's is needed there
    r = httpx.get(upstream.base_url + "/v1/models", headers=remote_server.headers)
    assert r.status_code == 401
    h = remote_server.headers
    bad = httpx.post(remote_server.base_url + "/v1/completions", headers=h,
                     json={"model": remote_server.model, "prompt": [999999], "max_tokens": 2})
    assert bad.status_code == 400          # the upstream's own answer, relayed
    seen = [bad.text] + [httpx.get(remote_server.base_url + path, headers=h).text
                         for path in ("/server_info", "/metrics", "/v1/models", "/openapi.json")]
    seen.append(remote_server.log_path.read_text(errors="replace"))
    seen.append(Path(f"/proc/{remote_server.proc.pid}/cmdline").read_bytes().decode(errors="replace"))
    for text in seen:
        assert UPSTREAM_KEY not in text


def test_a_refused_upstream_key_stops_the_start_and_says_why(remote_server):
    wrong = "sk-wrong-upstream-key-1234"
    server = launch_remote(remote_server.extra["upstream"], upstream_key=wrong, log_level="info")
    try:
        with pytest.raises(RuntimeError, match="exited"):
            wait_ready(server, timeout=120)
    finally:
        server.extra.pop("upstream")       # the fleet's: not ours to stop
        stop(server)
    log = server.log_path.read_text(errors="replace")
    assert "refused this server's key" in log
    assert wrong not in log


def test_a_notebook_connects_through_a_remote_engine_it_starts(remote_server, monkeypatch):
    # WORKSHOP_ENGINE=remote: connect() starts a remote-engine server of its own in front of
    # the fleet's upstream, named by WORKSHOP_UPSTREAM_URL, its key by WORKSHOP_UPSTREAM_API_KEY
    from workshop import session as sessions
    upstream = remote_server.extra["upstream"]
    monkeypatch.setenv("WORKSHOP_ENGINE", "remote")
    monkeypatch.setenv("WORKSHOP_UPSTREAM_URL", upstream.base_url + "/v1")
    monkeypatch.setenv("WORKSHOP_UPSTREAM_API_KEY", UPSTREAM_KEY)
    monkeypatch.delenv("WORKSHOP_REMOTE_BASE_URL", raising=False)
    s = sessions.connect(port=launcher.free_port(), verbose=False)
    try:
        assert s.process is not None and s.engine == "remote", s.how
        assert s.info["extra"]["remote"]["engine"] == "mini" and s.model == upstream.model
        before = upstream.metric(P.SERVER_REQUESTS)
        r = s.openai().completions.create(model=s.model, prompt="Hello", max_tokens=3)
        assert r.usage.completion_tokens == 3
        assert upstream.metric(P.SERVER_REQUESTS) == before + 1
    finally:
        s.stop()


def _mock_upstream(port: int) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-m", "workshop.bench.mock_server", "--port",
                             str(port)],
                            stdout=subprocess.PIPE, text=True)
    assert "mock server on" in proc.stdout.readline()
    return proc


def _complete(server: RunningServer) -> httpx.Response:
    # the mock answers every request as a stream
    return httpx.post(server.base_url + "/v1/completions", headers=server.headers, timeout=30,
                      json={"model": "mock", "prompt": "hi", "max_tokens": 2, "stream": True})


def _until(condition, timeout: float = 30.0):
    t0 = time.monotonic()
    while not (result := condition()):
        assert time.monotonic() - t0 < timeout, "condition not met in time"
        time.sleep(0.2)
    return result


def test_upstream_down_is_an_openai_error_not_a_crash():
    port = launcher.free_port()
    mock = _mock_upstream(port)
    upstream = RunningServer("mock", f"http://127.0.0.1:{port}", "", "mock", mock,
                             Path("/dev/null"))
    server = launch_remote(upstream, "--liveness-interval", "0.5", "--liveness-failures", "2",
                           upstream_key=None)
    server.model = "mock"
    try:
        wait_ready(server, timeout=120)
        info = httpx.get(server.base_url + "/server_info", headers=server.headers).json()
        assert info["engine"] == "remote" and info["model"] == "mock"
        assert _complete(server).status_code == 200
        mock.kill()
        mock.wait()
        gone = _complete(server)               # before the probe notices: the connection fails
        assert gone.status_code in (502, 503), gone.text
        assert gone.json()["error"]["type"] in ("engine_error", "engine_unresponsive")
        down = _until(lambda: (r := _complete(server)).status_code == 503 and r)
        assert down.json()["error"]["type"] == "engine_unresponsive"
        assert "remote server is down" in down.json()["error"]["message"]
        assert httpx.get(server.base_url + "/health").status_code == 503
        assert server.proc.poll() is None      # still serving its own routes
        mock = _mock_upstream(port)            # back on the same address
        _until(lambda: _complete(server).status_code == 200)
        assert httpx.get(server.base_url + "/health").status_code == 200
    finally:
        server.extra.pop("upstream", None)
        stop(server)
        mock.kill()
        mock.wait()


def test_a_busy_upstream_says_when_to_retry_through_the_remote_engine(busy_upstream):
    upstream = RunningServer("busy", busy_upstream, "", "busy", None, Path("/dev/null"))
    server = launch_remote(upstream, upstream_key=None)
    try:
        wait_ready(server, timeout=120)
        h = server.headers
        for stream in (False, True):
            r = httpx.post(server.base_url + "/v1/completions", headers=h, timeout=30,
                           json={"model": "busy", "prompt": "hi", "max_tokens": 2,
                                 "stream": stream})
            assert r.status_code == 429 and r.headers.get("retry-after") == "7", (r.headers, r.text)
            assert r.json()["error"] == {"message": "slow down", "type": "rate_limit_error",
                                         "param": None,
                                         "code": "rate_limited"}
        r = httpx.post(server.base_url + "/v1/chat/completions", headers=h, timeout=30,
                       json={"model": "busy", "messages": [{"role": "user", "content": "hi"}],
                             "max_tokens": 2})
        assert r.status_code == 503 and r.headers.get("retry-after") == "30", (r.headers, r.text)
        err = r.json()["error"]
        assert err["message"] == "Service Unavailable" and err["type"] == "engine_unavailable", err
    finally:
        server.extra.pop("upstream", None)
        stop(server)
