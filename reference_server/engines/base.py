"""The contract between the HTTP layer and an inference engine.

Two families implement it:

* ``ProxyEngine`` (``proxy.py``): the engine is another process that already speaks the
  OpenAI API (vLLM's or SGLang's own server). We start it, supervise it, and forward the
  already-validated request bodies to it.
* ``LocalEngine`` (``local.py``): the engine lives in this process and only knows about
  token ids (the naive Hugging Face baseline, the teaching engine). ``local.py`` turns its
  token stream into OpenAI responses, so a local engine implements ``generate`` and nothing
  HTTP-shaped.

Either way the server sees the same object: start it, ask whether it is ready, describe it,
hand it requests, read its metrics, stop it.
"""

from __future__ import annotations

import abc
from dataclasses import asdict, dataclass, field
from typing import Any, AsyncIterator, Union

from reference_server.protocol import ChatCompletionRequest, CompletionRequest, error_body

# A non-streaming answer is one JSON object; a streaming answer is the sequence of chunk
# objects (without the SSE framing, which the HTTP layer adds) or, for proxies, raw SSE bytes.
EngineResponse = Union[dict, AsyncIterator[dict], AsyncIterator[bytes]]


class EngineError(Exception):
    """A request the engine refused or failed; carries the HTTP status and OpenAI error body,
    and ``headers`` for the answer (an upstream's ``Retry-After``)."""

    def __init__(self, status_code: int, message: str, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status_code = status_code
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers

    def body(self) -> dict:
        return error_body(self.message, self.type, self.param, self.code)


def engine_fault(exc: BaseException) -> EngineError:
    """The 500 for an engine that failed one request (input was fine, the engine was not)."""
    return EngineError(500, f"the engine failed this request: {type(exc).__name__}: {exc}",
                       "engine_error")


class EngineDied(RuntimeError):
    """The engine process or loop stopped unexpectedly; the server reports it, never hides it."""

    type = "engine_died"
    status_code = 503
    headers: dict[str, str] | None = None

    def body(self) -> dict:
        return error_body(str(self), self.type)


class EngineHung(EngineDied):
    """The engine process is alive but stopped answering its liveness probe."""

    type = "engine_unresponsive"


class EngineRestarting(EngineDied):
    """The engine's process died (or hung) and a new one is starting: come back later, at the
    time ``Retry-After`` says."""

    type = "engine_restarting"

    def __init__(self, message: str, retry_after: int) -> None:
        super().__init__(message)
        self.headers = {"Retry-After": str(retry_after)}


@dataclass
class EngineInfo:
    """What ``/server_info`` reports. Sizes are in tokens; ``None`` means unknown."""

    engine: str
    engine_version: str
    model: str                      # the name clients put in "model"
    model_path: str                 # where the weights came from (folder or hub id)
    dtype: str
    device: str
    max_model_len: int
    kv_capacity_tokens: int | None
    kv_bytes_per_token: int | None
    block_size: int | None
    prefix_caching: bool
    extra: dict[str, Any] = field(default_factory=dict)
    # The effective configuration a comparison must show beside the numbers (None: unknown).
    attention: str | None = None        # the attention kernel or backend in use
    prefix_cache: str | None = None     # the cache's design when on, e.g. "radix tree, page 1"
    compiled: bool | None = None        # a graph compiler (torch.compile, CUDA graphs) or eager

    def to_dict(self) -> dict:
        return asdict(self)


class Engine(abc.ABC):
    """An inference engine behind the reference server.

    Contract:

    * ``start()`` returns only once the engine can serve, or raises. ``ready`` is then True.
    * ``chat`` / ``complete`` receive requests that already passed schema validation
      (``protocol.py``). They return the OpenAI response object, or for ``stream=True`` an
      async iterator of chunks. Semantic problems only the engine can see (prompt longer than
      the context, ...) raise ``EngineError`` with a 4xx status *before* the first chunk.
      A stream that fails later raises; a proxied one that relays the engine's own error
      event instead sets ``failed`` on itself, so the server counts it as failed.
    * Closing a returned stream early (the client went away) must cancel the request inside
      the engine and free its KV cache.
    * ``metrics_text()`` returns Prometheus exposition text using vLLM's metric names
      (``vllm:num_requests_running``, ``vllm:kv_cache_usage_perc``, ...) whatever the engine,
      so one dashboard or notebook reads every engine.
    * A failure while serving one request fails that request alone (``EngineError``: 4xx when
      the input was at fault, 500 ``engine_error`` otherwise); the engine keeps serving.
    * ``check()`` raises ``EngineDied`` if the engine has crashed since it started (or
      ``EngineHung`` while it does not answer).
    * ``max_running`` is how many requests the engine runs at once; the server admits at
      most that many plus ``--max-queued-requests`` more.
    * ``stop()`` releases everything (child processes, memory) and is safe to call twice.
    * ``supervision()`` says what became of the engine's process (an engine that restarts
      its own: ``ProxyEngine``); ``restarts`` counts the new processes it started.
    """

    name: str = "abstract"
    restarts: int = 0

    @abc.abstractmethod
    async def start(self) -> None: ...

    @abc.abstractmethod
    async def stop(self) -> None: ...

    @property
    @abc.abstractmethod
    def ready(self) -> bool: ...

    @abc.abstractmethod
    def info(self) -> EngineInfo: ...

    @abc.abstractmethod
    async def chat(self, request: ChatCompletionRequest) -> EngineResponse: ...

    @abc.abstractmethod
    async def complete(self, request: CompletionRequest) -> EngineResponse: ...

    @abc.abstractmethod
    async def metrics_text(self) -> str: ...

    @abc.abstractmethod
    async def reset_prefix_cache(self) -> bool:
        """Drop every cached prefix not in use; True if the engine has such a cache."""

    def check(self) -> None:
        """Raise ``EngineDied`` if the engine is no longer alive. Default: nothing to check."""

    def supervision(self) -> dict | None:
        """``state`` (serving, restarting, gave up, ...), ``restarts`` and ``last_death`` of
        an engine that supervises a process of its own; None for one that does not."""
        return None

    @property
    def max_running(self) -> int:
        """How many requests run at once (the rest wait in the engine's queue)."""
        return 1
