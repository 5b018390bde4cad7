"""Engines that speak the OpenAI API over HTTP: a child process we start (vLLM's or SGLang's
server), or a server someone else runs (``remote.py``: the same proxy without a child).

Why a child process and not an import: vLLM and SGLang pin conflicting versions of shared
packages, so each may live in its own virtual environment (``--engine-python``); and a
crash in the engine must not take the HTTP layer down with it, so the server can say what
happened instead of vanishing.

A child that dies, or stays hung, is restarted: a few times, each after a longer wait, then
the server gives up and says so (``_restart_child``; the README's "Restarts" section).

The child is behind our trust boundary: it listens on loopback only and requires a random
key that only this process knows (``child_key``), so no local process can go around the
server's own key. Every call to it has a read timeout, and a liveness probe notices a child
that is alive but no longer answers.
"""

from __future__ import annotations

import abc
import asyncio
import json
import logging
import math
import os
import secrets
import signal
import sys
import time
from pathlib import Path
from typing import Any, AsyncIterator

import aiohttp

from reference_server import launch
from reference_server.config import ServerConfig, redact_args
from reference_server.engines.base import (
    Engine,
    EngineDied,
    EngineError,
    EngineHung,
    EngineRestarting,
)
from reference_server.launch import free_port
from reference_server.models import ModelSpec
from reference_server.protocol import ChatCompletionRequest, CompletionRequest, OpenAIRequest

# The folder holding reference_server/: a child engine imports our hooks from it, even when
# it runs in another virtual environment (--engine-python).
PROJECT_ROOT = str(Path(__file__).resolve().parents[2])

log = logging.getLogger("reference_server")


# What ``ProxyEngine.state`` says of the child.
STARTING, SERVING, RESTARTING, GAVE_UP, STOPPED = (
    "starting", "serving", "restarting", "gave up", "stopped")


_WHERE = ("the child listens on 127.0.0.1, on a port the server picks, and is reached only "
          "through the server: use the server's own --host and --port")
_KEY = ("the child has a random key that only the server knows: protect the server with "
        "WORKSHOP_API_KEY instead")


def reserved_in(args: list[str], reserved) -> list[tuple[str, str]]:
    """``(name, flag)`` for each of ``args`` that would set one of the ``reserved`` flags:
    the flag itself, ``--flag=value``, its underscore spelling (vLLM reads ``--api_key``) or
    an abbreviation (argparse takes any unambiguous prefix: ``--hos`` is ``--host``)."""
    found = []
    for a in args:
        if not a.startswith("--") or a == "--":
            continue
        name = a.split("=", 1)[0].replace("_", "-")
        flag = next((r for r in reserved if r.startswith(name)), None)
        if flag:
            found.append((a.split("=", 1)[0], flag))     # never the value: it may be a key
    return found


class ProxyEngine(Engine):
    """Start, supervise and forward to an OpenAI-compatible engine server.

    Subclasses say how to launch it (``command``, ``env``) and describe it (``info``); this
    class owns the process, readiness, crash detection and the forwarding itself. One that
    starts no process (``target`` and ``spawn`` overridden) keeps the rest: readiness,
    liveness, timeouts and forwarding.
    """

    health_path = "/health"    # answers 200 once the engine can serve
    # Flags the server sets for the child itself, and why an engine argument after `--` may
    # not: appended last, it would win (argparse keeps the last value) and move the child
    # off loopback or replace the key only the server knows. Subclasses add theirs.
    reserved_args: dict[str, str] = {"--host": _WHERE, "--port": _WHERE, "--api-key": _KEY}
    # Why a liveness failure happens, for the 503 that reports it.
    hung_hint = "its process is running: hung or overloaded"
    # The wait before each restart of a child that died; one entry per try, () for none.
    # The first comes almost at once (a one-off crash should cost one start, no more); the
    # later ones give a passing cause (a neighbour's memory peak) time to pass; a child that
    # dies three times in a row will die a fourth.
    restart_delays: tuple[float, ...] = (1.0, 10.0, 30.0)
    # A child that served this long before it died starts a fresh count of tries: a death an
    # hour is an incident each time, a death within minutes of every start is a crash loop.
    stable_after = 600.0
    # Hung this long (from its first missed probe), the child is killed and restarted: a
    # stopped or deadlocked one never comes back by itself, its requests were already cut,
    # and a merely busy engine answers again well within it.
    hang_restart_after = 60.0

    def __init__(self, config: ServerConfig, model: ModelSpec | None) -> None:
        reserved = reserved_in(config.engine_args, self.reserved_args)
        if reserved:
            name, flag = reserved[0]
            raise ValueError(f"engine argument {name} after `--` would set {flag} for the "
                             f"{self.name} engine, which the server sets itself: "
                             f"{self.reserved_args[flag]}")
        self.config = config
        self.model = model
        # a remote engine has no model of ours: it names the remote server's once it is up
        self.served_name = config.served_model_name or (model.name if model is not None else "")
        self.port: int | None = None
        self.prefix = ""          # a path the engine's routes sit under ("" for a child)
        self.url, self.child_key = self.target()  # the key is never logged, never on a command line
        self.python = config.engine_python or sys.executable
        self._child: launch.Launched | None = None
        self._ready = False
        self._exit_code: int | None = None
        self._stopping = False
        self._watch: asyncio.Task | None = None
        self._probe: asyncio.Task | None = None
        self._client: aiohttp.ClientSession | None = None
        self._hung_since: float | None = None         # monotonic time of the first failed probe
        self._hung = False
        self._open: set[aiohttp.ClientResponse] = set()   # upstream answers being relayed
        self._sending: set[asyncio.Task] = set()    # requests waiting for the child's headers
        self._probe_timeout = aiohttp.ClientTimeout(total=config.upstream_probe_timeout)
        self.state = STARTING
        self.restarts = 0                             # new children started after a death
        self.last_death: str | None = None            # what happened to the last one that died
        self._tries = 0                               # restarts since it last served stable_after
        self._serving_since: float | None = None
        self._start_took: float | None = None         # seconds the last good start took
        self._back_at: float | None = None            # when a restarting child should serve
        self._restart: asyncio.Task | None = None

    def target(self) -> tuple[str, str | None]:
        """Where the engine listens and the key it requires: a child of ours, on a free
        loopback port, with a random key only this process knows."""
        self.port = free_port()
        return f"http://127.0.0.1:{self.port}", secrets.token_urlsafe(32)

    @abc.abstractmethod
    def command(self) -> list[str]: ...

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.pop("WORKSHOP_API_KEY", None)    # the child has its own key, not the server's
        env["PYTHONPATH"] = os.pathsep.join(p for p in (PROJECT_ROOT, env.get("PYTHONPATH")) if p)
        return env

    @property
    def ready(self) -> bool:
        return self._ready and self._exit_code is None

    def check(self) -> None:
        if self.state == GAVE_UP:
            raise EngineDied(
                f"{self.name} engine {self.last_death}; the server gave up on it after "
                f"{self._tries} restart(s) in a row (see its log for the engine's last words): "
                "restart the server")
        if self.state == RESTARTING:
            raise EngineRestarting(
                f"{self.name} engine {self.last_death}; the server is restarting it (try "
                f"{self._tries} of {len(self.restart_delays)}): retry after the time "
                "Retry-After gives", self.retry_after())
        if self._exit_code is not None and not self._stopping:
            raise EngineDied(f"{self.name} engine process {_exit_words(self._exit_code)}; "
                             "see the server log above for its last words")
        if self._hung:
            raise EngineHung(
                f"{self.name} engine has not answered its health check for "
                f"{time.monotonic() - self._hung_since:.0f} s ({self.hung_hint}); "
                "requests are refused until it answers again")

    def retry_after(self) -> int:
        """Seconds until a restarting child should serve: its wait plus as long as its last
        good start took."""
        left = (self._back_at or 0.0) - time.monotonic()
        return math.ceil(left) if left >= 1 else 5    # later than the last start: ask again soon

    def supervision(self) -> dict | None:
        if self._child is None:
            return None                               # no child of ours (a remote engine)
        state = "hung" if self._hung and self.state == SERVING else self.state
        return {"state": state, "restarts": self.restarts,
                "restart_limit": len(self.restart_delays), "last_death": self.last_death}

    def spawn(self) -> launch.Launched | None:
        """Start the engine's process (None: there is none to start); its output is part
        of the server's own."""
        cmd = self.command()
        log.info("starting %s engine: %s", self.name, " ".join(redact_args(cmd)))
        return launch.start(cmd, self.port, env=self.env(), log_path=launch.INHERIT)

    async def start(self) -> None:
        """Start the child and return once it serves; also how a restart starts a new one."""
        t0 = time.monotonic()
        self._child = child = self.spawn()
        # aiohttp rather than httpx: its C HTTP parser costs less CPU per relayed chunk, and
        # on a small CPU every cycle the proxy spends is taken from the engine. No pool
        # limit: one connection per in-flight stream, as the client would have had.
        self._client = aiohttp.ClientSession(
            base_url=self.url, connector=aiohttp.TCPConnector(limit=0),
            headers={"Authorization": f"Bearer {self.child_key}"} if self.child_key else None,
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=10,
                                          sock_read=self.config.upstream_read_timeout))

        async def serves() -> bool:
            try:
                return await self.serving()
            except (aiohttp.ClientError, asyncio.TimeoutError):
                return False

        try:
            await launch.await_ready(serves, timeout=self.config.engine_start_timeout,
                                     proc=child.proc if child else None)
        except launch.ChildExited as exited:
            self._exit_code = exited.returncode
            raise EngineDied(f"{self.name} engine {_exit_words(self._exit_code)} "
                             "while starting; see its log above") from None
        except TimeoutError:
            await self._end_child()
            raise EngineDied(f"{self.name} engine not ready after "
                             f"{self.config.engine_start_timeout} s") from None
        # Serving from here: on_ready reads the child through the same checked calls requests use.
        self.state = SERVING
        await self.on_ready()
        self._ready = True
        self._start_took = time.monotonic() - t0
        self._serving_since = time.monotonic()
        if child is not None:
            self._watch = asyncio.create_task(self._watch_process(child))
        self._probe = asyncio.create_task(self._liveness())

    async def serving(self) -> bool:
        """Whether the engine can serve yet (polled while it starts)."""
        async with self._client.get(self.prefix + self.health_path,
                                    timeout=aiohttp.ClientTimeout(total=2)) as resp:
            return resp.status == 200

    async def on_ready(self) -> None:
        """Hook: read whatever ``info`` needs from the running engine."""

    async def _watch_process(self, child: launch.Launched) -> None:
        code = await asyncio.to_thread(child.proc.wait)
        if child is not self._child:
            return
        self._exit_code = code
        if not self._stopping:
            self._died(f"process {_exit_words(code)}")

    def _died(self, reason: str) -> None:
        """The child died (or was killed for hanging): fail what it was serving, then restart
        it in the background, or give up once it has had its tries."""
        if self._stopping or (self._restart is not None and not self._restart.done()):
            return
        self._ready = False
        self.last_death = reason
        log.error("%s engine %s", self.name, reason)
        if (self._serving_since is not None
            and time.monotonic() - self._serving_since >= self.stable_after):
            self._tries = 0
        self._serving_since = None
        self.state = RESTARTING if self._tries < len(self.restart_delays) else GAVE_UP
        self._cut_in_flight()
        self._restart = asyncio.create_task(self._restart_child())

    async def _restart_child(self) -> None:
        while True:
            await self._end_child()
            if self._tries >= len(self.restart_delays):
                self.state = GAVE_UP
                log.error("%s engine: gave up after %d restart(s) in a row; restart the server",
                          self.name, self._tries)
                return
            delay = self.restart_delays[self._tries]
            self._tries += 1
            self.state = RESTARTING
            self._back_at = time.monotonic() + delay + (self._start_took or 0.0)
            log.warning("%s engine: restarting it in %.0f s (try %d of %d)", self.name, delay,
                        self._tries, len(self.restart_delays))
            await asyncio.sleep(delay)
            self.restarts += 1
            self._exit_code, self._hung, self._hung_since = None, False, None
            # a new port: nothing left of the old child can hold it
            self.port = free_port()
            self.url = f"http://127.0.0.1:{self.port}"
            try:
                await self.start()
            except Exception as exc:    # it died, or never answered, while starting
                self.state, self._ready = RESTARTING, False
                self.last_death = f"did not start again: {exc}"
                log.error("%s engine %s", self.name, self.last_death)
                continue
            log.warning("%s engine serves again (restart %d, try %d of %d)", self.name,
                        self.restarts, self._tries, len(self.restart_delays))
            return

    async def _end_child(self) -> None:
        """Kill the child's whole process group and wait until it is gone: its engine workers
        may outlive it, holding the model's memory that a new child needs."""
        if self._probe is not None and self._probe is not asyncio.current_task():
            self._probe.cancel()
            await asyncio.gather(self._probe, return_exceptions=True)
        if self._child is not None:
            await asyncio.to_thread(self._child.kill, 30)
        if self._watch is not None:
            await asyncio.gather(self._watch, return_exceptions=True)
        if self._client is not None:
            await self._client.close()
            self._client = None

    def _cut_in_flight(self) -> None:
        """Fail the requests in flight now instead of at the read timeout: those being
        relayed, and those still waiting for the child's headers (a non-streamed vLLM
        request gets none until its answer is complete)."""
        for resp in list(self._open):
            resp.close()
        for task in list(self._sending):
            task.cancel()

    async def _liveness(self) -> None:
        """Probe ``health_path`` forever; after ``liveness_failures`` misses in a row the
        child is hung: new requests get a 503 and the ones in flight are cut."""
        c = self.config
        fails = 0
        while self._exit_code is None:
            await asyncio.sleep(c.liveness_interval)
            try:
                async with self._client.get(self.prefix + self.health_path,
                                            timeout=self._probe_timeout) as resp:
                    ok = resp.status == 200
            except (aiohttp.ClientError, asyncio.TimeoutError):
                ok = False
            if ok:
                if self._hung:
                    log.warning("%s engine answers again", self.name)
                fails, self._hung, self._hung_since = 0, False, None
                continue
            fails += 1
            if fails == 1:
                self._hung_since = time.monotonic() - c.liveness_interval
            if fails >= c.liveness_failures and not self._hung and self._exit_code is None:
                self._hung = True
                log.error("%s engine does not answer its health check (%d probes): %s",
                          self.name, fails, self.hung_hint)
                self._cut_in_flight()
            hung_for = time.monotonic() - (self._hung_since or time.monotonic())
            if (self._hung and self._child is not None and self.restart_delays
                    and hung_for >= self.hang_restart_after and self._exit_code is None):
                self._died(f"did not answer its health check for {hung_for:.0f} s (hung): "
                           "killed it")
                return

    async def stop(self) -> None:
        self._stopping = True
        self._ready = False
        self.state = STOPPED
        if self._restart is not None:
            self._restart.cancel()
            await asyncio.gather(self._restart, return_exceptions=True)
        if self._probe is not None:
            self._probe.cancel()
            await asyncio.gather(self._probe, return_exceptions=True)
        if self._child is not None:
            await asyncio.to_thread(self._child.stop, 30)
        if self._watch is not None:
            await asyncio.gather(self._watch, return_exceptions=True)
        if self._client is not None:
            await self._client.close()
            self._client = None

    # ---- forwarding ------------------------------------------------------------------

    async def chat(self, request: ChatCompletionRequest):
        return await self._forward("/v1/chat/completions", request)

    async def complete(self, request: CompletionRequest):
        return await self._forward("/v1/completions", request)

    def request_body(self, request: OpenAIRequest) -> dict:
        """The JSON body sent to the child for a validated ``request``."""
        # Every field the client set goes on, cache_salt too: vLLM and SGLang 0.5.18 both scope
        # their prefix caches by it, and a remote server answers for itself.
        body = request.model_dump(exclude_unset=True, by_alias=True)
        body["model"] = self.served_name
        return body

    def abandon(self, resp: aiohttp.ClientResponse, body: dict) -> None:
        """The client left before the answer ended: drop the connection to the child, which
        is how vLLM learns to abort the request. An engine that needs more says so here.
        ``resp`` is None when the client left before the child's answer began."""
        if resp is not None:
            resp.close()

    async def _forward(self, path: str, request: OpenAIRequest):
        self.check()
        body = self.request_body(request)
        # A task, so that the liveness probe can cut the wait for headers (``_sending``).
        post = asyncio.ensure_future(self._client.post(self.prefix + path, json=body))
        self._sending.add(post)
        try:
            await asyncio.wait((post,))
        except BaseException:            # the client left before the child answered
            _drop(post)
            self.abandon(None, body)
            raise
        finally:
            self._sending.discard(post)
        if post.cancelled():             # by the liveness probe: the child is hung
            raise await self._upstream_error(ConnectionAbortedError("cut: the engine is hung"))
        try:
            resp = post.result()
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            raise await self._upstream_error(exc) from exc
        if resp.status != 200:
            content = await resp.read()
            resp.release()
            raise error_answer(resp.status, content, resp.headers.get("Retry-After"))
        if not request.stream:
            self._open.add(resp)
            try:
                result = await resp.json()
            except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as exc:
                resp.close()
                raise await self._upstream_error(exc) from exc
            except BaseException:
                self.abandon(resp, body)   # the client left mid-answer
                raise
            finally:
                self._open.discard(resp)
            resp.release()
            return result
        # vLLM validates some input only once its stream has begun (a token id outside the
        # vocabulary comes back as a 200 whose first event is an error): read the first
        # event before answering, so such a request still gets its 4xx status.
        self._open.add(resp)
        chunks = resp.content.iter_any().__aiter__()
        first = b""
        try:
            while b"\n\n" not in first:
                first += await chunks.__anext__()
        except StopAsyncIteration:
            pass
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            self._open.discard(resp)
            resp.close()
            raise await self._upstream_error(exc) from exc
        except BaseException:
            self._open.discard(resp)
            self.abandon(resp, body)
            raise
        if first.startswith(_ERROR_EVENT):
            self._open.discard(resp)
            resp.close()
            raise _stream_error(first)
        return _Relay(self, resp, first, chunks, body)

    async def _upstream_error(self, exc: BaseException) -> EngineError | EngineDied:
        """What to tell the client when the child failed to answer."""
        code = None
        if self._child is not None and not isinstance(exc, asyncio.TimeoutError):
            # A lost connection is often the child dying: its sockets close a moment before
            # it is seen to have exited. Wait that moment, so the client learns why.
            deadline = time.monotonic() + 1.0
            while (self.state == SERVING and self._exit_code is None and not self._hung
                   and not self._stopping and time.monotonic() < deadline
                   and (code := self._child.exit_code()) is None):
                await asyncio.sleep(0.02)
        if code is not None and self.state == SERVING and not self._stopping:
            # it died under this request, before the watcher could say so
            return EngineDied(f"{self.name} engine process {_exit_words(code)} while serving "
                              "this request; /health says what the server does about it")
        try:
            self.check()
        except EngineRestarting as restarting:
            # this request died with the child and is not retried; a new one may be, later
            died = EngineDied(str(restarting))
            died.headers = restarting.headers
            return died
        except EngineDied as died:
            return died
        if isinstance(exc, asyncio.TimeoutError):
            return EngineError(504, f"{self.name} engine sent nothing for "
                               f"{self.config.upstream_read_timeout:.0f} s", "engine_timeout")
        what = ("could not connect to" if isinstance(exc, aiohttp.ClientConnectorError)
                else "lost the connection to")
        return EngineError(502, f"{what} the {self.name} engine: {type(exc).__name__}",
                           "engine_error")

    async def metrics_text(self) -> str:
        self.check()
        async with self._client.get(self.prefix + "/metrics", timeout=self._probe_timeout) as resp:
            resp.raise_for_status()
            return await resp.text()

    async def get_json(self, path: str) -> dict:
        async with self._client.get(self.prefix + path, timeout=self._probe_timeout) as resp:
            resp.raise_for_status()
            return await resp.json()

    async def post(self, path: str) -> int:
        """POST without a body; returns the status code."""
        async with self._client.post(self.prefix + path, timeout=self._probe_timeout) as resp:
            await resp.read()
            return resp.status

    async def post_json(self, path: str) -> tuple[int, Any]:
        """POST without a body; returns the status code and the JSON answer (None if not JSON)."""
        async with self._client.post(self.prefix + path, timeout=self._probe_timeout) as resp:
            try:
                return resp.status, await resp.json(content_type=None)
            except ValueError:
                return resp.status, None


_ERROR_EVENT = b'data: {"error"'     # how vLLM and SGLang send an error inside a stream


class _Relay:
    """The engine's SSE bytes, passed through untouched.

    A class rather than an async generator so that ``aclose`` frees the upstream answer even
    when iteration never began, and without awaiting (see ``LocalEngine.generate``):
    closing the connection early is how vLLM learns to abort the request.
    """

    def __init__(self, engine: ProxyEngine, resp: aiohttp.ClientResponse, first: bytes,
                 chunks: AsyncIterator[bytes], body: dict | None = None) -> None:
        self.engine, self.resp, self.first, self.chunks = engine, resp, first, chunks
        self.body = body
        self.done = False
        # Set once the engine has sent an error event inside its 200 (vLLM does when a
        # request fails mid-generation): relayed as it is, but the stream counts as failed.
        self.failed = False
        self._tail = b""      # the end of the last chunk: an event may straddle two
        self._scan(first)

    def __aiter__(self):
        return self

    async def __anext__(self) -> bytes:
        if self.first:
            first, self.first = self.first, b""
            return first
        if self.done:
            raise StopAsyncIteration
        try:
            chunk = await self.chunks.__anext__()
        except StopAsyncIteration:
            self._finish(clean=True)
            raise
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            self._finish(clean=False)
            raise await self.engine._upstream_error(exc) from exc
        if not self.failed:
            self._scan(chunk)
        return chunk

    def _scan(self, chunk: bytes) -> None:
        # The marker cannot occur inside an event (a JSON string escapes its quotes), so
        # finding it anywhere, even across two chunks, means an error event.
        n = len(_ERROR_EVENT)
        self.failed = _ERROR_EVENT in chunk or _ERROR_EVENT in self._tail + chunk[:n]
        self._tail = chunk[-n:]

    async def aclose(self) -> None:
        self._finish(clean=False)

    def _finish(self, clean: bool) -> None:
        if self.done:
            return
        self.done = True
        self.engine._open.discard(self.resp)
        if clean:
            self.resp.release()
        elif self.body is not None:
            self.engine.abandon(self.resp, self.body)
        else:
            self.resp.close()


def _exit_words(code: int) -> str:
    """How a process ended, as the log and the 503 say it."""
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name} (exit code {code})"
        except ValueError:
            pass
    return f"exited with code {code}"


def _drop(post: asyncio.Task) -> None:
    """Give up on a request to the child: cancel it, or close the answer it already got."""
    if post.done() and not post.cancelled() and post.exception() is None:
        post.result().close()
    else:
        post.cancel()


def _stream_error(first: bytes) -> EngineError:
    """The error a stream opened with, with the status its ``code`` names (vLLM's way)."""
    event = first.split(b"\n\n", 1)[0].removeprefix(b"data: ")
    try:
        code = json.loads(event)["error"].get("code")
        status = int(code) if 400 <= int(code) < 600 else 400
    except (ValueError, TypeError, KeyError, AttributeError):
        status = 400
    return error_answer(status, event)


# An engine's own refusal to take more, when its body is not an OpenAI error: the types our
# own server answers for the same conditions.
_BUSY_TYPES = {429: "server_overloaded", 503: "engine_unavailable"}


def error_answer(status: int, content: bytes, retry_after: str | None = None) -> EngineError:
    """The engine's error answer as ours. An engine (or a remote server's gateway) that is
    busy says when to come back: its ``Retry-After`` on a 429 or 503 goes to the client, who
    would otherwise retry at once or give up."""
    try:
        err = json.loads(content)
        err = err.get("error", err) if isinstance(err, dict) else {}
    except ValueError:
        err = {}
    if not isinstance(err, dict):     # SGLang's 401: {"error": "Unauthorized"}
        err = {"message": str(err)}
    message = err.get("message") or content.decode(errors="replace")[:500] or "engine error"
    relay = {"Retry-After": retry_after} if retry_after and status in _BUSY_TYPES else None
    return EngineError(status, message, type=err.get("type")
                       or _BUSY_TYPES.get(status, "invalid_request_error"),
                       param=err.get("param"), code=err.get("code") and str(err.get("code")),
                       headers=relay)
