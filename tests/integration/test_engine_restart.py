"""A killed engine child comes back: the reference server restarts vLLM's (and SGLang's) own
server and serves again, over real HTTP.

One kill per proxied engine, on the session's fleet server (tests/conftest.py): the test
waits until that server serves again, so the tests after it find it serving (on a new
child: the engine's own counters start again from zero; ours do not). It costs one engine
start each. Both engines' children are supervised by the same code (ProxyEngine), so CI
kills SGLang's (40-55 s) and vLLM's (compiled on a CPU: 100-130 s) only in the full matrix
(``WORKSHOP_TEST_MATRIX=full``). The restart logic itself (the bound, the reset,
a hung child) is tested over a stand-in child in tests/unit/test_supervision.py.
"""

from __future__ import annotations

import json
import os
import signal
import time

import httpx
import psutil
import pytest
from conftest import FULL_MATRIX

from reference_server import prometheus as P

pytestmark = pytest.mark.engine

CHILD_MODULE = {"vllm": "vllm.entrypoints.openai.api_server",
                "sglang": "reference_server.engines.sglang_launch"}


def _child(server) -> psutil.Process:
    """The engine's own server, the reference server's child."""
    found = [p for p in psutil.Process(server.proc.pid).children()
             if CHILD_MODULE[server.engine] in " ".join(p.cmdline())]
    assert len(found) == 1, [p.cmdline() for p in psutil.Process(server.proc.pid).children()]
    return found[0]


def _group(pgid: int) -> list[psutil.Process]:
    """The live processes of a process group (the child and the workers it started)."""
    out = []
    for p in psutil.process_iter():
        try:
            if os.getpgid(p.pid) == pgid and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except (ProcessLookupError, psutil.NoSuchProcess):
            continue
    return out


def _get(server, path: str) -> httpx.Response:
    # a long timeout: SGLang's start probes its install synchronously, stalling the server
    return httpx.get(server.base_url + path, headers=server.headers, timeout=120)


def _until(condition, timeout: float, what: str):
    t0 = time.monotonic()
    while not (result := condition()):
        assert time.monotonic() - t0 < timeout, f"{what}: not within {timeout:.0f} s"
        time.sleep(0.25)
    return result


def _complete(server, **body) -> httpx.Response:
    return httpx.post(server.base_url + "/v1/completions", headers=server.headers, timeout=120,
                      json={"model": server.model, "prompt": "The capital of France is",
                            "max_tokens": 4, "temperature": 0, **body})


def _process(server) -> dict:
    r = _get(server, "/server_info")
    assert r.status_code == 200, r.text
    return r.json()["engine_process"]


@pytest.mark.parametrize("engine", [
    pytest.param("vllm", marks=pytest.mark.skipif(not FULL_MATRIX, reason=(
        "vLLM's restart (minutes on a CPU) runs in the full matrix; SGLang's covers the "
        "supervisor in CI"))),
    "sglang"])
def test_killed_engine_child_is_restarted_and_serves_again(engine, request):
    server = request.getfixturevalue(f"{engine}_server")
    assert _complete(server).status_code == 200
    restarts = server.metric(P.SERVER_ENGINE_RESTARTS)
    child = _child(server)
    old_group = os.getpgid(child.pid)
    assert len(_group(old_group)) >= 2       # the engine's own workers share its group

    # A stream under way when the child dies: it ends with an error event that says why.
    with httpx.stream("POST", server.base_url + "/v1/completions", headers=server.headers,
                      timeout=120, json={"model": server.model, "prompt": "Count to a thousand:",
                                         "max_tokens": 1000, "ignore_eos": True,
                                         "stream": True}) as r:
        assert r.status_code == 200
        lines = r.iter_lines()
        assert next(line for line in lines if line.startswith("data: "))
        child.send_signal(signal.SIGKILL)
        rest = [line for line in lines if line.startswith("data: ")]
    error = json.loads(rest[-1].removeprefix("data: "))["error"]
    assert error["type"] == "engine_died" and "SIGKILL" in error["message"], error

    # While it restarts: not ready, requests refused with a time to come back, alive.
    process = _until(lambda: (p := _process(server))["state"] == "restarting" and p, 30,
                     "restarting")
    assert "killed by SIGKILL" in process["last_death"]
    for r in (_get(server, "/ready"), _complete(server)):
        assert r.status_code == 503, r.text
        assert r.json()["error"]["type"] == "engine_restarting"
        assert int(r.headers["retry-after"]) >= 1
    assert _get(server, "/health").json()["status"] == "restarting"
    # nothing of the old child is left to hold the model's memory
    _until(lambda: not _group(old_group), 60, "the old child's process group gone")

    t0 = time.monotonic()
    _until(lambda: _get(server, "/ready").status_code == 200, 900, "serving again")
    print(f"{engine}: served again {time.monotonic() - t0:.0f} s after the old child was gone")
    r = _complete(server)
    assert r.status_code == 200 and r.json()["choices"][0]["text"], r.text
    assert _child(server).pid != child.pid
    assert _get(server, "/health").json() == {"status": "ok"}
    process = _process(server)
    assert process["state"] == "serving" and process["restarts"] >= 1
    assert server.metric(P.SERVER_ENGINE_RESTARTS) == restarts + 1
    assert server.metric(P.SERVER_ENGINE_UP) == 1
