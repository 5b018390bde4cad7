"""The one launcher: start a child server, wait until it serves, stop it, report why it died.

Uses the benchmark's mock server (plain asyncio, starts in well under a second) and a child
that fails on purpose; the reference server itself is launched by the engine fixtures.
"""

from __future__ import annotations

import shutil
import sys

import httpx
import pytest

from reference_server import launch


def test_start_wait_stop_a_real_child_server(tmp_path):
    port = launch.free_port()
    server = launch.start([sys.executable, "-m", "workshop.bench.mock_server", "--port", str(port)],
                          port, log_path=tmp_path / "mock.log")
    try:
        # The mock has no /ready (404): the launcher falls back to /health, which it also
        # lacks, so ask for the path it does serve.
        server.wait_ready(30, path="/v1/models")
        assert httpx.get(server.base_url + "/v1/models").status_code == 200
    finally:
        server.stop(10)
    assert server.proc.poll() is not None
    server.stop()                                  # idempotent
    with pytest.raises(httpx.HTTPError):
        httpx.get(server.base_url + "/v1/models", timeout=2)


def test_a_child_that_dies_while_starting_is_reported_with_its_log(tmp_path):
    port = launch.free_port()
    dying = launch.start([sys.executable, "-c", "print('no model here'); raise SystemExit(3)"],
                         port, log_path=tmp_path / "dying.log")
    with pytest.raises(RuntimeError, match=r"(?s)code 3.*no model here"):
        dying.wait_ready(30)


def test_a_child_that_never_serves_times_out(tmp_path):
    port = launch.free_port()
    idle = launch.start([sys.executable, "-c", "import time; time.sleep(60)"], port)
    try:
        with pytest.raises(TimeoutError):
            idle.wait_ready(1.0)
    finally:
        idle.stop(5)
    assert idle.proc.returncode is not None


def test_reference_server_command_keeps_engine_args_last(tmp_path):
    # echo stands in for Python: only the command line is under test here.
    child = launch.launch(["--engine", "mini", "--", "--spec", "ngram"], port=1, api_key="k",
                          python=shutil.which("echo"), log_path=tmp_path / "x.log")
    child.proc.wait(10)
    args = child.proc.args
    assert (tmp_path / "x.log").read_text().split() == args[1:]
    assert args[1:3] == ["-m", "reference_server"]
    assert args[args.index("--"):] == ["--", "--spec", "ngram"]       # the engine's own flags
    assert args.index("--port") < args.index("--")
    assert "k" not in args and "--api-key" not in args                # a key in argv shows in `ps`


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as f:
            return "\nState:\tZ" not in f.read()        # a zombie has exited
    except FileNotFoundError:
        return False


def _leaves_when_its_launcher_is_killed(code: str, log_path) -> None:
    """Run ``code`` (it starts a server and prints its pid) in a process, kill that process
    without cleanup, and see the server go."""
    import os
    import signal
    import subprocess
    import time

    launcher = subprocess.Popen([sys.executable, "-c", code, str(log_path)],
                                stdout=subprocess.PIPE, text=True)
    try:
        server_pid = int(launcher.stdout.readline())
        assert _running(server_pid)
        launcher.kill()                                  # no atexit, no cleanup
        launcher.wait()
        deadline = time.monotonic() + 30
        while _running(server_pid) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not _running(server_pid), log_path.read_text()[-2000:]
    finally:
        launcher.kill()
        try:
            os.kill(server_pid, signal.SIGKILL)
        except (ProcessLookupError, UnboundLocalError):
            pass


@pytest.mark.engine
def test_a_launched_server_leaves_when_its_launcher_is_killed(tmp_path):
    """A notebook kernel killed without running atexit (marimo's export does that) must not
    leave its servers behind: they watch the launcher's pid."""
    code = ("import sys, time\n"
            "from reference_server import launch\n"
            "s = launch.launch(['--engine', 'mini', '--kv-cache-gib', '0.02'], "
            "log_path=sys.argv[1])\ns.wait_ready(300)\n"
            "print(s.proc.pid, flush=True)\n"
            "time.sleep(600)\n")
    _leaves_when_its_launcher_is_killed(code, tmp_path / "server.log")


def test_a_started_gateway_leaves_when_its_launcher_is_killed(tmp_path):
    """The same for notebook 14's gateway (``launch.start(..., follow_launcher=True)``)."""
    code = ("import sys, time\n"
            "from workshop.api_gateway import launch\n"
            "g = launch.start([('http://127.0.0.1:9', None)],\n"
            "                 [{'name': 'a', 'key': 'k', 'requests_per_minute': 1}],\n"
            "                 log_path=sys.argv[1].replace('.out', '.jsonl'))\n"
            "print(g.proc.pid, flush=True)\n"
            "time.sleep(600)\n")
    _leaves_when_its_launcher_is_killed(code, tmp_path / "requests.out")   # the gateway's output
