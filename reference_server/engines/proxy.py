"""Engines that run as a child process speaking the OpenAI API (vLLM's or SGLang's server).

Why a child process and not an import: vLLM and SGLang pin conflicting versions of shared
packages, so each may live in its own virtual environment (``--engine-python``); and a
crash in the engine must not take the HTTP layer down with it, so the server can say what
happened instead of vanishing.
"""

from __future__ import annotations

import abc
import asyncio
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from typing import AsyncIterator

import aiohttp

from reference_server.engines.base import Engine, EngineDied, EngineError

log = logging.getLogger("reference_server")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:
    # Linux: if this server is killed outright, the kernel sends the engine SIGTERM too,
    # so no orphaned engine keeps holding the model's memory.
    try:
        import ctypes
        ctypes.CDLL("libc.so.6").prctl(1, signal.SIGTERM)   # PR_SET_PDEATHSIG
    except OSError:
        pass


class ProxyEngine(Engine):
    """Start, supervise and forward to an OpenAI-compatible engine server.

    Subclasses say how to launch it (``command``, ``env``) and describe it (``info``); this
    class owns the process, readiness, crash detection and the forwarding itself.
    """

    health_path = "/health"    # answers 200 once the engine can serve

    def __init__(self, config, model) -> None:
        self.config = config
        self.model = model
        self.served_name = config.served_model_name or model.name
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.python = config.engine_python or sys.executable
        self._proc: subprocess.Popen | None = None
        self._ready = False
        self._exit_code: int | None = None
        self._stopping = False
        self._watch: asyncio.Task | None = None
        self._client: aiohttp.ClientSession | None = None

    @abc.abstractmethod
    def command(self) -> list[str]: ...

    def env(self) -> dict[str, str]:
        return dict(os.environ)

    @property
    def ready(self) -> bool:
        return self._ready and self._exit_code is None

    def check(self) -> None:
        if self._exit_code is not None and not self._stopping:
            raise EngineDied(f"{self.name} engine process exited with code {self._exit_code}; "
                             "see the server log above for its last words")

    async def start(self) -> None:
        cmd = self.command()
        log.info("starting %s engine: %s", self.name, " ".join(cmd))
        self._proc = subprocess.Popen(cmd, env=self.env(), start_new_session=True,
                                      preexec_fn=_die_with_parent)
        # aiohttp rather than httpx: its C HTTP parser costs less CPU per relayed chunk, and
        # on a small CPU every cycle the proxy spends is taken from the engine. No pool
        # limit: one connection per in-flight stream, as the client would have had.
        self._client = aiohttp.ClientSession(
            base_url=self.url, connector=aiohttp.TCPConnector(limit=0),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=10))
        deadline = time.monotonic() + self.config.engine_start_timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                self._exit_code = self._proc.returncode
                raise EngineDied(f"{self.name} engine exited with code {self._exit_code} "
                                 "while starting; see its log above")
            try:
                async with self._client.get(self.health_path,
                                            timeout=aiohttp.ClientTimeout(total=2)) as resp:
                    if resp.status == 200:
                        break
            except (aiohttp.ClientError, asyncio.TimeoutError):
                pass
            await asyncio.sleep(0.5)
        else:
            await self.stop()
            raise EngineDied(f"{self.name} engine not ready after {self.config.engine_start_timeout} s")
        await self.on_ready()
        self._ready = True
        self._watch = asyncio.create_task(self._watch_process())

    async def on_ready(self) -> None:
        """Hook: read whatever ``info`` needs from the running engine."""

    async def _watch_process(self) -> None:
        code = await asyncio.to_thread(self._proc.wait)
        self._exit_code = code
        if not self._stopping:
            log.error("%s engine process died with exit code %s", self.name, code)

    async def stop(self) -> None:
        self._stopping = True
        self._ready = False
        proc = self._proc
        if proc is not None and proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                await asyncio.to_thread(proc.wait, 30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                await asyncio.to_thread(proc.wait)
        if self._watch is not None:
            await asyncio.gather(self._watch, return_exceptions=True)
        if self._client is not None:
            await self._client.close()
            self._client = None

    # ---- forwarding ------------------------------------------------------------------

    async def chat(self, request):
        return await self._forward("/v1/chat/completions", request)

    async def complete(self, request):
        return await self._forward("/v1/completions", request)

    async def _forward(self, path: str, request):
        self.check()
        body = request.model_dump(exclude_unset=True)
        body["model"] = self.served_name
        resp = await self._client.post(path, json=body)
        if resp.status != 200:
            content = await resp.read()
            resp.release()
            raise _engine_error(resp.status, content)
        if not request.stream:
            try:
                result = await resp.json()
            except BaseException:
                resp.close()     # the client left mid-answer: drop the connection, vLLM aborts
                raise
            resp.release()
            return result
        return _relay(resp)

    async def metrics_text(self) -> str:
        self.check()
        async with self._client.get("/metrics") as resp:
            resp.raise_for_status()
            return await resp.text()

    async def get_json(self, path: str) -> dict:
        async with self._client.get(path) as resp:
            resp.raise_for_status()
            return await resp.json()

    async def post(self, path: str) -> int:
        """POST without a body; returns the status code."""
        async with self._client.post(path) as resp:
            await resp.read()
            return resp.status


async def _relay(resp: aiohttp.ClientResponse) -> AsyncIterator[bytes]:
    """Pass the engine's SSE bytes through untouched. Leaving early closes the upstream
    connection (``close``, which needs no await: see ``LocalEngine.generate``), which is how
    vLLM learns to abort the request."""
    finished = False
    try:
        async for chunk in resp.content.iter_any():
            yield chunk
        finished = True
    finally:
        if finished:
            resp.release()
        else:
            resp.close()


def _engine_error(status: int, content: bytes) -> EngineError:
    try:
        err = json.loads(content)
        err = err.get("error", err) if isinstance(err, dict) else {}
    except ValueError:
        err = {}
    message = err.get("message") or content.decode(errors="replace")[:500] or "engine error"
    return EngineError(status, message, type=err.get("type") or "invalid_request_error",
                       param=err.get("param"), code=err.get("code") and str(err.get("code")))
