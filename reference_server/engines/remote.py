"""An OpenAI-compatible server someone else runs, fronted like a child engine.

``--engine remote --upstream URL`` puts this server in front of any OpenAI-compatible
endpoint: a vLLM or SGLang deployment (behind Ray Serve, KServe, llm-d or SGLang's router),
or another reference server. It is ``ProxyEngine`` without the child: the same validation,
auth, admission limits, timeouts, liveness probe, relaying and metrics names, and no process
to start or watch. Liveness is the remote server's own health: ``/health`` where it answers
one, else ``/v1/models``.

What differs from a child, and why:

* The key. A child gets a random key of ours; a remote server has its own, given by
  ``WORKSHOP_UPSTREAM_API_KEY`` (``--upstream-api-key`` shows in ``ps``). It is sent on every
  call to the remote server and nowhere else: never logged, never in ``/server_info``, and
  scrubbed from error messages. A client's key is never forwarded. When the remote server
  refuses our key, clients get a 502 that says so, not its 401 (their key was fine).
* The model is the remote server's: ``--model`` picks one when it serves several.
* ``/server_info`` says engine ``remote``. What it knows of the remote engine (KV capacity,
  dtype, limits) comes from the remote server's ``/server_info`` when that is a reference
  server; otherwise those fields are unknown. The remote server's address is not shown.
* Metrics: the remote page with vLLM's names (SGLang's translated, as for a child), without
  the remote reference server's own ``reference_server_*`` counters: ours replace them.
* The remote server protects itself: what our validation lets through (a token id outside
  the vocabulary, say) reaches it, as it would reach it directly. A raw SGLang server is
  safer behind a reference server of its own (see docs/reference_server.md, SGLang).
"""

from __future__ import annotations

import logging
from urllib.parse import urlsplit

from reference_server import prometheus
from reference_server.config import ServerConfig
from reference_server.engines.base import EngineDied, EngineError, EngineInfo
from reference_server.engines.proxy import ProxyEngine
from reference_server.models import ModelSpec
from reference_server.protocol import OpenAIRequest

log = logging.getLogger("reference_server")

DEFAULT_MAX_RUNNING = 256   # vLLM's default on a GPU, when the remote server does not say
# What /server_info may repeat from a remote reference server's own (no address, no arguments).
INFO_FIELDS = ("engine", "engine_version", "server_version", "dtype", "device", "max_model_len",
               "kv_capacity_tokens", "kv_bytes_per_token", "block_size", "prefix_caching",
               "attention", "prefix_cache", "compiled")


def split_upstream(url: str) -> tuple[str, str]:
    """``(origin, prefix)`` of an OpenAI base URL: ``http://h:8000/v1`` and ``http://h:8000``
    give ``("http://h:8000", "")``; ``https://h/openai/v1`` gives ``("https://h", "/openai")``."""
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("--upstream must be an http(s) URL such as http://host:8000/v1, not "
                         f"{url!r}")
    if parts.username or parts.password:
        raise ValueError("--upstream must not carry credentials (they would be logged): give the "
                         "remote server's key in WORKSHOP_UPSTREAM_API_KEY")
    if parts.query or parts.fragment:
        raise ValueError("--upstream takes a base URL without query or fragment")
    path = parts.path.rstrip("/")
    if path.endswith("/v1"):
        path = path[:-3]
    return f"{parts.scheme}://{parts.netloc}", path


class RemoteEngine(ProxyEngine):
    name = "remote"
    hung_hint = "the remote server is down, unreachable or overloaded"

    def __init__(self, config: ServerConfig, model: ModelSpec | None = None) -> None:
        if not config.upstream:
            raise ValueError("--engine remote needs --upstream URL (the remote server's base URL)")
        if config.engine_args:
            raise ValueError("arguments after `--` go to a child engine, and the remote engine "
                             "starts none: configure the remote server itself")
        self.origin, prefix = split_upstream(config.upstream)
        super().__init__(config, model)
        self.prefix = prefix
        self.remote_model = ""           # the name the remote server serves
        self._models: list[dict] = []    # its /v1/models
        self._remote: dict = {}          # INFO_FIELDS of its /server_info, if a reference server's
        self._remote_limits: dict = {}

    def target(self) -> tuple[str, str | None]:
        return self.origin, self.config.upstream_api_key

    def command(self) -> list[str]:
        raise NotImplementedError("the remote engine starts no process")

    def spawn(self) -> None:
        log.info("remote engine at %s%s: waiting until it serves", self.origin, self.prefix)
        return None

    async def serving(self) -> bool:
        """Ready once the remote server lists its models (a reference server's ``/health``
        answers while its engine still loads; ``/v1/models`` does not)."""
        async with self._client.get(self.prefix + "/v1/models",
                                    timeout=self._probe_timeout) as resp:
            if resp.status in (401, 403):
                raise EngineDied(self._refused())
            if resp.status != 200:
                return False
            body = await resp.json(content_type=None)
        self._models = [m for m in (body or {}).get("data") or [] if isinstance(m, dict)
                        and m.get("id")]
        return bool(self._models)

    def _refused(self) -> str:
        return ("the remote server refused this server's key: set WORKSHOP_UPSTREAM_API_KEY to "
                "the key it expects" if self.child_key else
                "the remote server requires a key: set WORKSHOP_UPSTREAM_API_KEY")

    async def on_ready(self) -> None:
        ids = [m["id"] for m in self._models]
        if self.config.model in ids:
            chosen = self.config.model
        elif len(ids) == 1:
            chosen = ids[0]
        else:
            raise EngineDied(f"the remote server serves {', '.join(ids)}: choose one with --model")
        card = next(m for m in self._models if m["id"] == chosen)
        self.remote_model = chosen
        self.served_name = self.config.served_model_name or chosen
        self._root = str(card.get("root") or chosen)
        self._card_len = card.get("max_model_len")
        # Liveness: the remote server's /health if it has one (vLLM, SGLang, ours), else the
        # model list, which every OpenAI-compatible server answers.
        try:
            async with self._client.get(self.prefix + "/health",
                                        timeout=self._probe_timeout) as resp:
                has_health = resp.status == 200
        except Exception:
            has_health = False
        if not has_health:
            self.health_path = "/v1/models"
            log.info("the remote server has no /health: probing /v1/models for liveness")
        try:
            info = await self.get_json("/server_info")
        except Exception:      # not every server has one; it is only descriptive
            info = {}
        if isinstance(info, dict) and "server_version" in info:   # a reference server's
            self._remote = {k: info[k] for k in INFO_FIELDS if k in info}
            self._remote_limits = info.get("limits") or {}
        else:
            try:
                version = (await self.get_json("/version")).get("version")
                self._remote = {"engine_version": str(version)} if version else {}
            except Exception:
                pass

    def info(self) -> EngineInfo:
        r = self._remote
        return EngineInfo(
            engine="remote", engine_version=str(r.get("engine_version", "unknown")),
            model=self.served_name, model_path=self._root,
            dtype=str(r.get("dtype", "unknown")), device=str(r.get("device", "unknown")),
            max_model_len=int(r.get("max_model_len") or self._card_len
                              or self.config.max_model_len),
            kv_capacity_tokens=r.get("kv_capacity_tokens"),
            kv_bytes_per_token=r.get("kv_bytes_per_token"), block_size=r.get("block_size"),
            prefix_caching=bool(r.get("prefix_caching", False)),
            attention=r.get("attention"), prefix_cache=r.get("prefix_cache"),
            compiled=r.get("compiled"),
            extra={"remote": {"engine": r.get("engine", "unknown"),
                              "server_version": r.get("server_version"),
                              "model": self.remote_model}})

    @property
    def max_running(self) -> int:
        # The remote server's own count: admitting more than it runs only moves its queue here.
        return int(self._remote_limits.get("max_running") or DEFAULT_MAX_RUNNING)

    def request_body(self, request: OpenAIRequest) -> dict:
        body = super().request_body(request)
        body["model"] = self.remote_model
        return body

    async def _forward(self, path: str, request: OpenAIRequest):
        try:
            return await super()._forward(path, request)
        except EngineError as exc:
            raise self._own_error(exc) from None

    def _own_error(self, exc: EngineError) -> EngineError:
        if exc.status_code in (401, 403):
            log.error("remote server answered %d: %s", exc.status_code, self._refused())
            return EngineError(502, self._refused(), "engine_error", code="remote_auth_failed")
        key = self.child_key
        if key and key in exc.message:     # a server that quotes the key it refused
            exc.message = exc.message.replace(key, "***")
        return exc

    async def metrics_text(self) -> str:
        from reference_server.engines.sglang import vllm_metrics

        text = prometheus.without(await super().metrics_text(), prometheus.SERVER_PREFIX)
        return text if prometheus.VLLM_PREFIX in text else vllm_metrics(text, self.served_name)

    async def reset_prefix_cache(self) -> bool:
        """The remote server's reset: ours and vLLM's ``/reset_prefix_cache`` (``success``
        false while requests hold blocks), SGLang's ``/flush_cache``."""
        self.check()
        status, body = await self.post_json("/reset_prefix_cache")
        if status == 404:
            return await self.post("/flush_cache") == 200
        return status == 200 and isinstance(body, dict) and body.get("success") is True
