"""Start a server as a child process, wait until it serves, stop it: the project's one launcher.

Used by the notebooks' first cell (``workshop.session``), the test fixtures and the scripts in
``benchmarks/``. ``launch`` starts ``python -m reference_server``; ``start`` runs any command
that serves HTTP on a port (vLLM's own server, the benchmark's mock server).

    server = launch(["--engine", "vllm", "--model", "smollm2-135m"], log_path="vllm.log")
    server.wait_ready(timeout=600)
    ...
    server.stop()
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Sequence

import httpx

# The checkout (or site-packages) this package was imported from: a child started from here
# must import the same code, also when it was only put on sys.path by hand.
_ROOT = str(Path(__file__).resolve().parent.parent)

# Set for a child by ``launch`` (and ``start(..., follow_launcher=True)``): the process that
# started it. A notebook kernel that is killed (marimo's export, a restarted Jupyter kernel)
# never runs its atexit handlers, and a server in a session of its own would outlive it,
# holding gigabytes. So such a server leaves when its launcher is gone (``watch_launcher``);
# servers started by hand (no variable) stay up.
PARENT_PID_ENV = "WORKSHOP_PARENT_PID"


def die_with_parent() -> None:
    """``preexec_fn`` for a child that must not outlive the process that started it: on Linux
    the kernel sends it SIGTERM when that process dies, even one killed outright with no
    chance to clean up, so no orphan keeps a port or a model's memory. Elsewhere: nothing."""
    try:
        import ctypes
        ctypes.CDLL("libc.so.6").prctl(1, signal.SIGTERM)     # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:      # alive, another user's
        return True
    return True


def watch_launcher(on_gone: Callable[[int], None]) -> "asyncio.Task | None":
    """In a server: a task that calls ``on_gone(pid)`` once the process that launched it is
    gone, or None when it was not launched that way. The variable is popped: it is not for
    this server's own children."""
    parent = os.environ.pop(PARENT_PID_ENV, "")
    if not parent.isdigit():
        return None

    async def watch(pid: int) -> None:
        while _alive(pid):
            await asyncio.sleep(1.0)
        on_gone(pid)

    return asyncio.create_task(watch(int(parent)))


def free_port() -> int:
    """A TCP port nobody listens on right now (the OS picks it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _auth(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def log_tail(log_path: Path | None, lines: int = 60) -> str:
    try:
        return "\n".join(Path(log_path).read_text(errors="replace").splitlines()[-lines:])
    except (OSError, TypeError):
        return ""


def wait_ready(base_url: str, *, timeout: float, proc: subprocess.Popen | None = None,
               log_path: Path | None = None, api_key: str | None = None, path: str = "/ready",
               progress: Callable[[float], None] | None = None, interval: float = 0.5) -> None:
    """Poll ``base_url + path`` until it answers 200.

    ``/ready`` is the reference server's "the engine can serve"; a server without it (vLLM's
    own answers 404) is asked ``/health`` instead. Raises ``RuntimeError`` with the end of the
    log if ``proc`` exits first, ``TimeoutError`` after ``timeout`` seconds. ``progress`` is
    called with the seconds waited, about every 15 s.
    """
    t0 = last_note = time.monotonic()
    while True:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"the server exited with code {proc.returncode} while starting; "
                               f"last log lines ({log_path}):\n{log_tail(log_path)}")
        try:
            r = httpx.get(base_url + path, headers=_auth(api_key), timeout=5.0)
            if r.status_code == 404 and path == "/ready":
                path = "/health"
                continue
            if r.status_code == 200:
                return
        except httpx.HTTPError:
            pass
        now = time.monotonic()
        if now - t0 > timeout:
            raise TimeoutError(f"{base_url} not ready after {timeout:.0f} s; last log lines "
                               f"({log_path}):\n{log_tail(log_path)}")
        if progress is not None and now - last_note > 15:
            progress(now - t0)
            last_note = now
        time.sleep(interval)


def stop(proc: subprocess.Popen | None, timeout: float = 30.0) -> None:
    """SIGTERM (the server then stops its engine), SIGKILL after ``timeout`` s. Idempotent."""
    if proc is None or proc.poll() is not None:
        return
    _signal(proc, signal.SIGTERM)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        _signal(proc, signal.SIGKILL)
        proc.wait()


def _signal(proc: subprocess.Popen, sig: int) -> None:
    # ``start`` makes each child the leader of its own process group: signal the group, so
    # helpers it started without supervising them go too.
    try:
        if os.getpgid(proc.pid) == proc.pid:
            os.killpg(proc.pid, sig)
        else:
            proc.send_signal(sig)
    except ProcessLookupError:
        pass


@dataclass
class Launched:
    """A server this process started."""

    proc: subprocess.Popen
    base_url: str                  # root URL, without /v1
    port: int
    log_path: Path | None = None
    api_key: str | None = None

    def wait_ready(self, timeout: float, path: str = "/ready",
                   progress: Callable[[float], None] | None = None) -> "Launched":
        wait_ready(self.base_url, timeout=timeout, proc=self.proc, log_path=self.log_path,
                   api_key=self.api_key, path=path, progress=progress)
        return self

    def stop(self, timeout: float = 30.0) -> None:
        stop(self.proc, timeout)

    def log_tail(self, lines: int = 60) -> str:
        return log_tail(self.log_path, lines)


def start(cmd: Sequence[str], port: int, *, log_path: str | Path | None = None,
          env: Mapping[str, str] | None = None, cwd: str | None = None,
          api_key: str | None = None, follow_launcher: bool = False) -> Launched:
    """Run ``cmd`` (which must serve on ``port``), output to ``log_path`` (default: discarded).
    ``follow_launcher``: tell a server that calls ``watch_launcher`` who started it."""
    env = dict(os.environ if env is None else env)
    if follow_launcher:
        env[PARENT_PID_ENV] = str(os.getpid())
    env["PYTHONPATH"] = os.pathsep.join(p for p in (_ROOT, env.get("PYTHONPATH")) if p)
    if log_path is not None:
        log_path = Path(log_path)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        out = open(log_path, "w")
    else:
        out = subprocess.DEVNULL
    try:
        proc = subprocess.Popen(list(cmd), stdout=out, stderr=subprocess.STDOUT, env=env,
                                cwd=cwd, start_new_session=True)
    finally:
        if out is not subprocess.DEVNULL:
            out.close()        # the child holds its own copy
    return Launched(proc, f"http://127.0.0.1:{port}", port, log_path, api_key)


def launch(args: Sequence[str] = (), *, port: int | None = None,
           log_path: str | Path | None = None, env: Mapping[str, str] | None = None,
           api_key: str | None = None, python: str = sys.executable) -> Launched:
    """Start ``python -m reference_server ARGS --port PORT`` (a free port by default).

    ``api_key`` reaches the server as ``WORKSHOP_API_KEY`` (a ``--api-key`` flag would be
    visible to every user in ``ps``) and is used when polling readiness. The server shuts
    itself down when this process is gone (``PARENT_PID_ENV``), even if it was killed
    without running its exit handlers. Does not wait: call ``.wait_ready(timeout)`` (several
    servers can load at once that way).
    """
    port = port or free_port()
    args = list(args)
    cut = args.index("--") if "--" in args else len(args)    # after "--": the engine's own
    cmd = [python, "-m", "reference_server", *args[:cut], "--port", str(port), *args[cut:]]
    env = dict(os.environ if env is None else env)
    env["WORKSHOP_API_KEY"] = api_key or ""
    return start(cmd, port, log_path=log_path, env=env, api_key=api_key, follow_launcher=True)


__all__ = ["free_port", "wait_ready", "stop", "log_tail", "Launched", "start", "launch",
           "PARENT_PID_ENV", "watch_launcher", "die_with_parent"]
