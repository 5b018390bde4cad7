"""Start a child process, wait until it serves, stop it: the project's one launcher.

Every child the project starts goes through ``start``: the reference server (``launch``),
the engine server behind it (``engines/proxy.py``), the gateway replicas, the shared
queue's NATS server and workers, the test fixtures and the benchmarks' servers. Each child

* leads a process group of its own: stopping it stops the helpers it started too;
* writes to its log file (``INHERIT``: to this process's output; None: nowhere);
* dies with this process, even one killed outright (``die_with_parent``; where the kernel
  cannot do that, a server polls its launcher: ``watch_launcher``).

``Launched`` then waits until the child serves (``wait_ready``; ``await_ready`` in async
code), stops it (SIGTERM to its group, SIGKILL after a timeout) or kills it (``kill``).

    server = launch(["--engine", "vllm", "--model", "smollm2-135m"], log_path="vllm.log")
    server.wait_ready(timeout=600)
    ...
    server.stop()
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Awaitable, Callable, Iterator, Mapping, Sequence

import httpx

# The checkout (or site-packages) this package was imported from: a child started from here
# must import the same code, also when it was only put on sys.path by hand.
_ROOT = str(Path(__file__).resolve().parent.parent)


class _Inherit:
    def __repr__(self) -> str:
        return "launch.INHERIT"


# ``start(..., log_path=INHERIT)``: the child writes where this process writes (an engine
# under the reference server: its output belongs in the server's log).
INHERIT = _Inherit()

try:
    import ctypes
    # Looked up here, in the parent: a child just forked from a threaded process should
    # not load libraries.
    _prctl = ctypes.CDLL(None).prctl
except (OSError, AttributeError):
    _prctl = None                    # not Linux: servers poll their launcher instead
_PR_SET_PDEATHSIG = 1
# Where the kernel has no parent-death signal (macOS): the child's launcher, which a server
# polls (``watch_launcher``) so that a killed notebook kernel does not leave it holding memory.
PARENT_PID_ENV = "WORKSHOP_PARENT_PID"


def die_with_parent(parent: int) -> None:
    """``preexec_fn`` of every child (``parent``: this process's pid): a notebook kernel or
    a test run that is killed outright runs no clean-up, and a child in a session of its own
    would outlive it, holding a port and gigabytes. On Linux the kernel sends the child
    SIGTERM when the thread that forked it ends; ``_spawn`` forks from a thread that ends
    with this process."""
    if _prctl is None:
        return
    _prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent:      # it died between the fork and now: the signal never comes
        os.kill(os.getpid(), signal.SIGTERM)


_jobs: queue.SimpleQueue | None = None
_jobs_lock = threading.Lock()


def _spawn(popen: Callable[[], subprocess.Popen]) -> subprocess.Popen:
    """Run ``popen`` on the spawner thread. The parent-death signal follows the thread that
    forked the child, not its process: a child forked from a pool's thread (``workshop.session``
    starts servers from one) would be stopped as soon as that thread ended."""
    global _jobs
    with _jobs_lock:
        if _jobs is None:
            _jobs = queue.SimpleQueue()
            # a daemon: it ends when this process ends, and not before
            threading.Thread(target=_spawner, args=(_jobs,), name="launch-spawner",
                             daemon=True).start()
        jobs = _jobs
    done: concurrent.futures.Future = concurrent.futures.Future()
    jobs.put((popen, done))
    return done.result()


def _spawner(jobs: queue.SimpleQueue) -> None:
    while True:
        popen, done = jobs.get()
        try:
            done.set_result(popen())
        except Exception as exc:
            done.set_exception(exc)


def _forget_spawner() -> None:
    global _jobs, _jobs_lock
    _jobs, _jobs_lock = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_spawner)    # a forked copy has no spawner thread


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


class ChildExited(RuntimeError):
    """The child exited before it served (``returncode``: negative for a signal)."""

    def __init__(self, returncode: int, log_path: Path | None) -> None:
        self.returncode = returncode
        super().__init__(f"the server exited with code {returncode} while starting; "
                         f"last log lines ({log_path}):\n{log_tail(log_path)}")


def _http_probe(base_url: str, api_key: str | None, path: str) -> Callable[[], bool]:
    """Whether ``base_url + path`` answers 200. ``/ready`` is the reference server's "the
    engine can serve"; a server without it (vLLM's own answers 404) is asked ``/health``."""
    asked = [path]

    def probe() -> bool:
        try:
            r = httpx.get(base_url + asked[0], headers=_auth(api_key), timeout=5.0)
        except httpx.HTTPError:
            return False
        if r.status_code == 404 and asked[0] == "/ready":
            asked[0] = "/health"
            return probe()
        return r.status_code == 200

    return probe


def _waits(what: str, timeout: float, proc, log_path) -> Iterator[float]:
    """The seconds waited, before each probe of a wait, sync or async; raises ``ChildExited``
    once ``proc`` has exited, ``TimeoutError`` after ``timeout`` seconds."""
    t0 = time.monotonic()
    while True:
        if proc is not None and proc.poll() is not None:
            raise ChildExited(proc.returncode, log_path)
        waited = time.monotonic() - t0
        if waited > timeout:
            raise TimeoutError(f"{what} not ready after {timeout:.0f} s; last log lines "
                               f"({log_path}):\n{log_tail(log_path)}")
        yield waited


def _poll(probe: Callable[[], bool], what: str, timeout: float, proc, log_path,
          progress: Callable[[float], None] | None, interval: float) -> None:
    last_note = 0.0
    for waited in _waits(what, timeout, proc, log_path):
        if probe():
            return
        if progress is not None and waited - last_note > 15:
            progress(waited)
            last_note = waited
        time.sleep(interval)


def wait_ready(base_url: str, *, timeout: float, proc: subprocess.Popen | None = None,
               log_path: Path | None = None, api_key: str | None = None, path: str = "/ready",
               progress: Callable[[float], None] | None = None, interval: float = 0.5) -> None:
    """Poll ``base_url + path`` until it answers 200 (``/health`` where ``/ready`` is 404).

    Raises ``ChildExited`` (a ``RuntimeError``) with the end of the log if ``proc`` exits
    first, ``TimeoutError`` after ``timeout`` seconds. ``progress`` is called with the
    seconds waited, about every 15 s.
    """
    _poll(_http_probe(base_url, api_key, path), base_url, timeout, proc, log_path, progress,
          interval)


async def await_ready(probe: Callable[[], Awaitable[bool]], *, timeout: float,
                      proc: subprocess.Popen | None = None, log_path: Path | None = None,
                      interval: float = 0.5) -> None:
    """``wait_ready`` for async code: await ``probe()`` until it is true (it catches its own
    connection errors). Raises ``ChildExited`` if ``proc`` exits first, ``TimeoutError``
    after ``timeout`` seconds."""
    for _ in _waits("the server", timeout, proc, log_path):
        if await probe():
            return
        await asyncio.sleep(interval)


def stop(proc: subprocess.Popen | None, timeout: float = 30.0) -> None:
    """SIGTERM (a server then stops its engine), SIGKILL after ``timeout`` s, each to the
    child's process group. Idempotent."""
    if proc is None or proc.poll() is not None:
        return
    _signal(proc, signal.SIGTERM)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        _signal(proc, signal.SIGKILL)
        proc.wait()


def _signal(proc: subprocess.Popen, sig: int) -> None:
    # The group when the child leads one (``start``'s do), so helpers it started without
    # supervising them go too; otherwise the child alone.
    try:
        if os.getpgid(proc.pid) == proc.pid:
            os.killpg(proc.pid, sig)
        else:
            proc.send_signal(sig)
    except ProcessLookupError:
        pass


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _group_alive(pgid: int) -> bool:
    """Whether a process of group ``pgid`` still runs (zombies, waiting for init to reap
    them, hold no memory and do not count)."""
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    try:
        pids = [p for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return True                   # no /proc: trust kill(0)
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[2] == str(pgid) and fields[0] != "Z":   # state, ppid, pgrp, ...
            return True
    return False


@dataclass
class Launched:
    """A child this process started (``start``)."""

    proc: subprocess.Popen
    base_url: str                  # root URL, without /v1 ("" for a child without a port)
    port: int | None
    log_path: Path | None = None
    api_key: str | None = None

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def wait_ready(self, timeout: float, path: str = "/ready",
                   progress: Callable[[float], None] | None = None, *,
                   probe: Callable[[], bool] | None = None,
                   interval: float = 0.5) -> "Launched":
        """Until ``base_url + path`` answers 200, or ``probe()`` is true (a child that
        speaks no HTTP). Raises ``ChildExited`` or ``TimeoutError`` (see ``wait_ready``)."""
        if probe is None:
            probe = _http_probe(self.base_url, self.api_key, path)
        what = self.base_url or Path(str(self.proc.args[0])).name
        _poll(probe, what, timeout, self.proc, self.log_path, progress, interval)
        return self

    async def await_ready(self, probe: Callable[[], Awaitable[bool]], timeout: float,
                          interval: float = 0.5) -> "Launched":
        await await_ready(probe, timeout=timeout, proc=self.proc, log_path=self.log_path,
                          interval=interval)
        return self

    def stop(self, timeout: float = 30.0) -> None:
        stop(self.proc, timeout)

    def kill(self, timeout: float = 30.0) -> None:
        """SIGKILL to the whole group, and wait until none of it runs (up to ``timeout`` s):
        what a crash looks like to the rest of the system, or the end of a hung child, whose
        helpers may outlive it holding memory that a new child needs. Idempotent."""
        _signal_group(self.pid, signal.SIGKILL)
        self.proc.wait()
        deadline = time.monotonic() + timeout
        while _group_alive(self.pid) and time.monotonic() < deadline:
            _signal_group(self.pid, signal.SIGKILL)
            time.sleep(0.2)

    def exit_code(self) -> int | None:
        """The exit code (negative: the signal that killed it) once the child has ended,
        None while it runs; without reaping it, so it answers while another thread waits
        on the child (``Popen.poll`` cannot)."""
        if self.proc.returncode is not None:
            return self.proc.returncode
        try:
            info = os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:     # reaped meanwhile: the waiting thread knows
            return self.proc.returncode
        if info is None or info.si_pid == 0:
            return None
        killed = info.si_code in (os.CLD_KILLED, os.CLD_DUMPED)
        return -info.si_status if killed else info.si_status

    def log_tail(self, lines: int = 60) -> str:
        return log_tail(self.log_path, lines)


def start(cmd: Sequence[str], port: int | None = None, *,
          log_path: str | Path | _Inherit | None = None,
          env: Mapping[str, str] | None = None, cwd: str | None = None,
          api_key: str | None = None) -> Launched:
    """Run ``cmd`` as a child of this process (see the module doc), ``port``: where it will
    serve, if it does. Output to the file ``log_path`` (``INHERIT``: to this process's
    output; None: discarded). ``env`` (default: this process's) gets this checkout first on
    ``PYTHONPATH``. Does not wait: call ``.wait_ready``."""
    env = dict(os.environ if env is None else env)
    paths = env.get("PYTHONPATH")
    if not paths or paths.split(os.pathsep)[0] != _ROOT:     # once is enough
        env["PYTHONPATH"] = os.pathsep.join(p for p in (_ROOT, paths) if p)
    if _prctl is None:
        env[PARENT_PID_ENV] = str(os.getpid())
    if log_path is INHERIT:
        out = None
    elif log_path is None:
        out = subprocess.DEVNULL
    else:
        log_path = Path(log_path)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        out = open(log_path, "w")
    popen = functools.partial(
        subprocess.Popen, list(cmd), stdout=out, stderr=None if out is None else subprocess.STDOUT,
        env=env, cwd=cwd, start_new_session=True,
        preexec_fn=functools.partial(die_with_parent, os.getpid()))
    try:
        proc = _spawn(popen)
    finally:
        if out not in (None, subprocess.DEVNULL):
            out.close()        # the child holds its own copy
    return Launched(proc, f"http://127.0.0.1:{port}" if port else "", port,
                    None if log_path is INHERIT else log_path, api_key)


def launch(args: Sequence[str] = (), *, port: int | None = None,
           log_path: str | Path | None = None, env: Mapping[str, str] | None = None,
           api_key: str | None = None, python: str = sys.executable) -> Launched:
    """Start ``python -m reference_server ARGS --port PORT`` (a free port by default).

    ``api_key`` reaches the server as ``WORKSHOP_API_KEY`` (a ``--api-key`` flag would be
    visible to every user in ``ps``) and is used when polling readiness. Does not wait: call
    ``.wait_ready(timeout)`` (several servers can load at once that way).
    """
    port = port or free_port()
    args = list(args)
    cut = args.index("--") if "--" in args else len(args)    # after "--": the engine's own
    cmd = [python, "-m", "reference_server", *args[:cut], "--port", str(port), *args[cut:]]
    env = dict(os.environ if env is None else env)
    env["WORKSHOP_API_KEY"] = api_key or ""
    return start(cmd, port, log_path=log_path, env=env, api_key=api_key)


def watch_launcher(on_gone: Callable[[int], None]) -> "asyncio.Task | None":
    """In a server: a task that calls ``on_gone(pid)`` once its launcher is gone, where the
    kernel cannot tell it (``PARENT_PID_ENV`` set by ``start``); None elsewhere. The variable
    is popped: it is not for this server's own children."""
    parent = os.environ.pop(PARENT_PID_ENV, "")
    if not parent.isdigit():
        return None

    async def watch(pid: int) -> None:
        while True:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            except PermissionError:     # alive, another user's
                pass
            await asyncio.sleep(1.0)
        on_gone(pid)

    return asyncio.create_task(watch(int(parent)))


__all__ = ["free_port", "wait_ready", "await_ready", "stop", "log_tail", "Launched", "start",
           "launch", "ChildExited", "INHERIT", "die_with_parent", "watch_launcher",
           "PARENT_PID_ENV"]
