"""The gateway's HTTP layer: keys, limits and routing in front of OpenAI-compatible replicas.

Thin on purpose: the decisions are the pure modules' (``bucket``, ``quota``, ``routing``,
``usage``, ``request_log``); this file reads the request, asks them, and relays. Every
refusal (401, 429 for the rate, 429 for the quota) is answered before a byte goes upstream.
Errors have the reference server's OpenAI shape (``reference_server.errors.error_response``).
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Callable, Sequence

import aiohttp
from fastapi import FastAPI, Request
from fastapi.responses import Response, StreamingResponse

from reference_server.engines.proxy import error_answer
from reference_server.errors import engine_error_response, error_response
from workshop.api_gateway import request_log
from workshop.api_gateway.bucket import TokenBucket
from workshop.api_gateway.keys import KeySpec, bearer_secret, digest
from workshop.api_gateway.quota import QuotaWindow
from workshop.api_gateway.routing import make_policy, prompt_text
from workshop.api_gateway.usage import UsageFilter, tokens_of, wants_usage, with_usage

MAX_BODY_BYTES = 4 * 2**20
ROUTES = ("/v1/chat/completions", "/v1/completions")


@dataclass
class Replica:
    url: str                        # root URL, without /v1
    api_key: str | None
    outstanding: int = 0
    served: int = 0                 # replies finished (any status)
    errors: int = 0                 # of which not 200, or cut short
    busy_s: float = 0.0             # time with at least one request outstanding
    load_s: float = 0.0             # integral of outstanding over time
    changed: float = 0.0            # when outstanding last changed (the gateway's clock)

    def move(self, delta: int, now: float) -> None:
        span = now - self.changed
        if self.outstanding > 0:
            self.busy_s += span
        self.load_s += self.outstanding * span
        self.outstanding += delta
        self.changed = now


@dataclass
class KeyState:
    spec: KeySpec
    bucket: TokenBucket
    quota: QuotaWindow | None
    requests: int = 0               # sent upstream
    rejected_rate: int = 0
    rejected_quota: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0


class Gateway:
    def __init__(self, upstreams: Sequence[tuple[str, str | None]], keys: dict[str, KeySpec],
                 policy: str = "spread", max_per_replica: int = 8, log_path: str | None = None,
                 clock: Callable[[], float] = time.monotonic, prefix_threshold: float = 0.5,
                 prefix_balance: int = 4) -> None:
        if not upstreams:
            raise ValueError("at least one upstream")
        self.replicas = [Replica(url.rstrip("/").removesuffix("/v1"), key, changed=clock())
                         for url, key in upstreams]
        self.keys = {d: KeyState(s, TokenBucket(s.requests_per_minute, s.burst),
                                 QuotaWindow(s.quota_tokens, s.quota_window_s)
                                 if s.quota_tokens is not None else None)
                     for d, s in keys.items()}
        self.policy = make_policy(policy, max_per_replica, prefix_threshold=prefix_threshold,
                                  prefix_balance=prefix_balance)
        self.decisions: dict[str, int] = {}     # prefix policy: why each replica was chosen
        self.max_per_replica = max_per_replica
        self.clock = clock
        self._log = open(log_path, "a", buffering=1) if log_path else None
        self.client: aiohttp.ClientSession | None = None

    # -- the decisions, in order -------------------------------------------------------------
    def authenticate(self, authorization: str | None) -> KeyState | None:
        secret = bearer_secret(authorization)
        return self.keys.get(digest(secret)) if secret else None

    def admit(self, key: KeyState) -> tuple[Response, str] | None:
        """(a 429, its code) if the key's quota is spent or it is over its rate, else None."""
        now = self.clock()
        if key.quota is not None:
            wait = key.quota.check(now)
            if wait > 0:
                key.rejected_quota += 1
                return error_response(
                    429, f"token quota of {key.quota.tokens} per {key.quota.window_s:g} s is "
                    "used up for this key; it renews when the window ends (Retry-After)",
                    "insufficient_quota", code="insufficient_quota",
                    headers={"Retry-After": str(math.ceil(wait))}), "insufficient_quota"
        wait = key.bucket.take(now)
        if wait > 0:
            key.rejected_rate += 1
            return error_response(
                429, f"rate limit of {key.spec.requests_per_minute:g} requests/min "
                f"(burst {key.spec.burst}) exceeded for this key; retry after "
                f"{math.ceil(wait)} s", "rate_limit_exceeded", code="rate_limit_exceeded",
                headers={"Retry-After": str(math.ceil(wait))}), "rate_limit_exceeded"
        return None

    def route(self, body: dict | None = None) -> int:
        """The replica for a request (``body``, its JSON; the prefix policy reads its prompt),
        counted as outstanding there from now."""
        prompt = prompt_text(body) if body is not None and self.policy.reads_prompt else None
        i = self.policy.choose([r.outstanding for r in self.replicas], prompt)
        why = getattr(self.policy, "last", {}).get("why")
        if why:
            self.decisions[why] = self.decisions.get(why, 0) + 1
        self.replicas[i].move(+1, self.clock())
        return i

    def finish(self, i: int, key: KeyState, status: int, usage: dict | None) -> None:
        r = self.replicas[i]
        r.move(-1, self.clock())
        r.served += 1
        r.errors += status != 200
        prompt, completion = tokens_of(usage)
        key.prompt_tokens += prompt
        key.completion_tokens += completion
        if key.quota is not None:
            key.quota.add(prompt + completion, self.clock())

    def log(self, **fields) -> None:
        if self._log is not None:
            self._log.write(request_log.line(**fields) + "\n")

    def stats(self) -> dict:
        now = self.clock()
        for r in self.replicas:
            r.move(0, now)          # bring busy_s and load_s up to now
        return {
            "policy": self.policy.name, "max_per_replica": self.max_per_replica,
            "decisions": dict(self.decisions),
            "replicas": [{"replica": i, "url": r.url, "outstanding": r.outstanding,
                          "served": r.served, "errors": r.errors, "busy_s": r.busy_s,
                          "load_s": r.load_s} for i, r in enumerate(self.replicas)],
            "keys": {k.spec.name: {
                "requests": k.requests, "rejected_rate": k.rejected_rate,
                "rejected_quota": k.rejected_quota, "prompt_tokens": k.prompt_tokens,
                "completion_tokens": k.completion_tokens,
                "quota_tokens": k.quota.tokens if k.quota else None,
                "quota_remaining": k.quota.remaining(now) if k.quota else None,
                "quota_used": k.quota.used if k.quota else None,    # remaining() rolled it
                "quota_resets_in_s": k.quota.resets_in(now) if k.quota else None}
                for k in self.keys.values()},
        }

    def close(self) -> None:
        if self._log is not None:
            self._log.close()


def create_app(gw: Gateway) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI):
        # aiohttp, as the reference server's proxy: less CPU per relayed chunk than httpx,
        # which matters when the gateway shares a small CPU with the replicas.
        gw.client = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=600))
        yield
        await gw.client.close()
        gw.close()

    app = FastAPI(title="LLM-inference workshop API gateway", lifespan=lifespan)
    app.state.gateway = gw

    def unauthorized() -> Response:
        return error_response(401, "missing or unknown API key: send "
                              "'Authorization: Bearer <key>'", "authentication_error",
                              code="invalid_api_key")

    @app.get("/health")
    async def health():
        return {"status": "ok", "replicas": len(gw.replicas)}

    @app.get("/gateway/stats")
    async def stats(request: Request):
        key = gw.authenticate(request.headers.get("authorization"))
        if key is None:
            return unauthorized()
        if not key.spec.admin:
            return error_response(403, "/gateway/stats needs an admin key",
                                  "permission_error", code="not_admin")
        return gw.stats()

    @app.get("/v1/models")
    async def models(request: Request):
        if gw.authenticate(request.headers.get("authorization")) is None:
            return unauthorized()
        r = gw.replicas[0]
        async with gw.client.get(r.url + "/v1/models", headers=_auth(r)) as resp:
            return Response(await resp.read(), resp.status,
                            media_type=resp.headers.get("content-type"))

    async def generate(request: Request) -> Response:
        t0 = gw.clock()
        key = gw.authenticate(request.headers.get("authorization"))
        base = {"key": key.spec.name if key else None, "model": None, "replica": None}
        if key is None:
            gw.log(**base, status=401, latency_s=gw.clock() - t0, error="invalid_api_key")
            return unauthorized()
        refused = gw.admit(key)
        if refused is not None:
            gw.log(**base, status=429, latency_s=gw.clock() - t0, error=refused[1])
            return refused[0]
        raw = await request.body()
        try:
            if len(raw) > MAX_BODY_BYTES:
                raise ValueError(f"request body exceeds {MAX_BODY_BYTES} bytes")
            body = json.loads(raw)
            if not isinstance(body, dict):
                raise ValueError("request body must be a JSON object")
        except ValueError as exc:
            gw.log(**base, status=400, latency_s=gw.clock() - t0, error="invalid_body")
            return error_response(400, str(exc)[:200])
        base["model"] = body.get("model") if isinstance(body.get("model"), str) else None
        stream = body.get("stream") is True
        i = gw.route(body)
        base["replica"] = i
        r = gw.replicas[i]
        key.requests += 1
        try:
            resp = await gw.client.post(r.url + request.url.path, json=with_usage(body),
                                        headers=_auth(r))
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            gw.finish(i, key, 502, None)
            gw.log(**base, status=502, latency_s=gw.clock() - t0, stream=stream,
                   error="upstream_unreachable")
            return error_response(502, f"replica {i} did not answer: {type(exc).__name__}",
                                  "upstream_error", code="upstream_unreachable")
        if not stream or resp.status != 200:
            status, usage = 499, None           # 499 unless the whole reply was read
            try:
                data = await resp.read()
                status = resp.status
                if status == 200:
                    try:
                        usage = json.loads(data).get("usage")
                    except (ValueError, AttributeError):
                        pass
            finally:
                # also when the client hung up meanwhile: the replica's count must drop
                resp.release()
                gw.finish(i, key, status, usage)
                p, c = tokens_of(usage)
                gw.log(**base, status=status, prompt_tokens=p, completion_tokens=c,
                       latency_s=gw.clock() - t0, stream=stream,
                       error=None if status == 200 else "upstream_status")
            if status != 200:
                # in OpenAI's shape whatever the replica sent (a proxy's plain text, SGLang's
                # bare strings), with its Retry-After when it is busy: the reference server's rule
                return engine_error_response(error_answer(status, data,
                                                          resp.headers.get("Retry-After")))
            return Response(data, status, media_type=resp.headers.get("content-type"))
        return StreamingResponse(_relay(gw, resp, i, key, base, t0, wants_usage(body)),
                                 media_type="text/event-stream")

    app.post("/v1/chat/completions")(generate)
    app.post("/v1/completions")(generate)
    return app


async def _relay(gw: Gateway, resp: aiohttp.ClientResponse, i: int, key: KeyState,
                 base: dict, t0: float, pass_usage: bool):
    filt = UsageFilter(pass_usage)
    ttft = None
    ok = False
    try:
        async for chunk in resp.content.iter_any():
            out = filt.feed(chunk)
            if ttft is None and filt.first_token_seen:
                ttft = gw.clock() - t0
            if out:
                yield out
        tail = filt.flush()
        if tail:
            yield tail
        ok = True
    finally:
        # also on a client that hung up (cancelled here): closing the upstream
        # connection cancels the request in the replica, which frees its KV cache
        resp.close()
        status = 200 if ok else 499
        gw.finish(i, key, status, filt.usage)
        p, c = tokens_of(filt.usage)
        gw.log(**base, status=status, prompt_tokens=p, completion_tokens=c,
               latency_s=gw.clock() - t0, ttft_s=ttft, stream=True,
               error=None if ok else "stream_cut")


def _auth(r: Replica) -> dict[str, str]:
    return {"Authorization": f"Bearer {r.api_key}"} if r.api_key else {}
