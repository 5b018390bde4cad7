"""The one launcher: start a child, wait until it serves, stop or kill it with its process
group, report why it died, and never let it outlive the process that started it.

Uses the benchmark's mock server (plain asyncio, starts in well under a second) and a child
that fails on purpose; the reference server itself is launched by the engine fixtures.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import time

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


def _until_gone(pid: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while _running(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _running(pid)


def _leaves_when_its_launcher_is_killed(code: str, log_path) -> None:
    """Run ``code`` (it starts a server and prints its pid) in a process, kill that process
    without cleanup, and see the server go."""
    import subprocess

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
    """The same for notebook 14's gateway (``workshop.api_gateway.launch.start``)."""
    code = ("import sys, time\n"
            "from workshop.api_gateway import launch\n"
            "g = launch.start([('http://127.0.0.1:9', None)],\n"
            "                 [{'name': 'a', 'key': 'k', 'requests_per_minute': 1}],\n"
            "                 log_path=sys.argv[1].replace('.out', '.jsonl'))\n"
            "print(g.proc.pid, flush=True)\n"
            "time.sleep(600)\n")
    _leaves_when_its_launcher_is_killed(code, tmp_path / "requests.out")   # the gateway's output


def test_a_child_started_by_any_thread_dies_with_its_launcher_only(tmp_path):
    """The kernel's parent-death signal follows the thread that forked: a child started from
    a pool's thread (``workshop.session`` starts servers so) must outlive that thread, and
    still go when the whole process is killed without clean-up."""
    code = ("import sys, threading, time\n"
            "from reference_server import launch\n"
            "got = []\n"
            "t = threading.Thread(target=lambda: got.append(launch.start(\n"
            "    [sys.executable, '-c', 'import time; time.sleep(600)'], log_path=sys.argv[1])))\n"
            "t.start(); t.join(); time.sleep(1.0)\n"
            "assert got[0].alive(), 'the child went with the thread that started it'\n"
            "print(got[0].pid, flush=True)\n"
            "time.sleep(600)\n")
    _leaves_when_its_launcher_is_killed(code, tmp_path / "sleeper.log")


def _grandchild(tmp_path, ignore_term: bool):
    """A child that starts a helper of its own (as vLLM its engine core) and writes the
    helper's pid to its log; with ``ignore_term`` both ignore SIGTERM."""
    ignore = "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n" if ignore_term else ""
    helper = f"import signal, time\n{ignore}time.sleep(600)"
    code = (f"import signal, subprocess, sys, time\n{ignore}"
            f"h = subprocess.Popen([sys.executable, '-c', {helper!r}])\n"
            "print(h.pid, flush=True)\ntime.sleep(600)\n")
    child = launch.start([sys.executable, "-c", code], log_path=tmp_path / "parent.log")
    child.wait_ready(30, probe=lambda: child.log_tail().strip().isdigit(), interval=0.05)
    return child, int(child.log_tail())


def test_stop_ends_the_childs_whole_group_and_kills_what_ignores_sigterm(tmp_path):
    child, helper = _grandchild(tmp_path, ignore_term=False)
    child.stop(5)
    assert child.proc.returncode == -15
    _until_gone(helper)
    stubborn, helper = _grandchild(tmp_path, ignore_term=True)
    t0 = time.monotonic()
    stubborn.stop(1)
    assert stubborn.proc.returncode == -9 and time.monotonic() - t0 < 5
    _until_gone(helper)                         # the SIGKILL went to its whole group


def test_kill_waits_until_the_whole_group_is_gone(tmp_path):
    child, helper = _grandchild(tmp_path, ignore_term=True)
    assert child.exit_code() is None
    child.kill()
    assert child.proc.returncode == -9 and child.exit_code() == -9
    assert not _running(helper)                 # gone when kill returns, not later
    child.kill()                                # idempotent


def test_exit_code_is_read_without_reaping_the_child():
    """So it answers while another thread waits on the child (the proxy's watcher does):
    that thread still reaps it and learns the same code."""
    child = launch.start([sys.executable, "-c", "raise SystemExit(5)"])
    deadline = time.monotonic() + 30
    while child.exit_code() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert child.exit_code() == 5
    assert child.proc.returncode is None        # not reaped: the waiter's to do
    assert child.proc.wait(30) == 5


def test_await_ready_polls_until_the_probe_says_so_and_reports_an_early_exit():
    import asyncio

    async def run():
        calls = []

        async def third_time() -> bool:
            calls.append(1)
            return len(calls) == 3

        sleeper = launch.start([sys.executable, "-c", "import time; time.sleep(60)"])
        try:
            await sleeper.await_ready(third_time, timeout=30, interval=0.01)
            assert len(calls) == 3

            async def never() -> bool:
                return False

            with pytest.raises(TimeoutError):
                await sleeper.await_ready(never, timeout=0.2, interval=0.01)
        finally:
            sleeper.stop(5)
        dying = launch.start([sys.executable, "-c", "raise SystemExit(4)"])
        with pytest.raises(launch.ChildExited) as exited:
            await dying.await_ready(never, timeout=30, interval=0.01)
        assert exited.value.returncode == 4

    asyncio.run(run())


def test_a_child_writes_to_its_log_or_to_the_launchers_own_output(tmp_path):
    import subprocess
    launch.start([sys.executable, "-c", "print('to the log')"],
                 log_path=tmp_path / "sub" / "child.log").proc.wait(30)
    assert (tmp_path / "sub" / "child.log").read_text() == "to the log\n"
    code = ("import sys\nfrom reference_server import launch\n"
            "launch.start([sys.executable, '-c', 'print(\"inherited\")'],\n"
            "             log_path=launch.INHERIT).proc.wait(30)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60)
    assert out.stdout == "inherited\n", out.stderr


def test_the_checkout_goes_first_on_the_childs_path_once(tmp_path):
    code = "import os; print(os.environ['PYTHONPATH'])"
    root = launch._ROOT
    for given, expected in (("", root), ("/elsewhere", f"{root}:/elsewhere"),
                            (f"{root}:/x", f"{root}:/x")):
        env = {**os.environ, "PYTHONPATH": given}
        child = launch.start([sys.executable, "-c", code], env=env, log_path=tmp_path / "p.log")
        child.proc.wait(30)
        assert child.log_tail() == expected
