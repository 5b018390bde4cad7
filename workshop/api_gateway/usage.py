"""Counting a streamed reply's tokens without changing what the client asked for.

The gateway asks the upstream for ``stream_options.include_usage`` on every stream, so it can
charge the key's quota. A client that did not ask must get the stream it would have got
without the gateway: no final usage-only chunk, and no ``"usage": null`` in every chunk
(what OpenAI-compatible servers add with ``include_usage``). ``UsageFilter`` takes the
upstream's bytes as they come (an SSE event may be split across reads), keeps the usage,
and returns the bytes to pass on.
"""

from __future__ import annotations

import json


def wants_usage(body: dict) -> bool:
    opts = body.get("stream_options")
    return isinstance(opts, dict) and opts.get("include_usage") is True


def with_usage(body: dict) -> dict:
    """The request body as sent upstream: a stream always asks for usage."""
    if not body.get("stream"):
        return body
    opts = body.get("stream_options") if isinstance(body.get("stream_options"), dict) else {}
    return {**body, "stream_options": {**opts, "include_usage": True}}


class UsageFilter:
    def __init__(self, pass_usage: bool) -> None:
        self.pass_usage = pass_usage        # the client asked for usage: relay it untouched
        self.usage: dict | None = None
        self.first_token_seen = False       # an event carrying text went by
        self._buf = b""

    def feed(self, data: bytes) -> bytes:
        self._buf += data.replace(b"\r\n", b"\n")
        out = []
        while True:
            end = self._buf.find(b"\n\n")
            if end < 0:
                break
            event, self._buf = self._buf[:end + 2], self._buf[end + 2:]
            kept = self._event(event)
            if kept:
                out.append(kept)
        return b"".join(out)

    def flush(self) -> bytes:
        """Whatever trailed the last complete event (a stream cut short)."""
        rest, self._buf = self._buf, b""
        return self._event(rest) if rest.strip() else b""

    def _event(self, event: bytes) -> bytes:
        line = event.strip()
        if not line.startswith(b"data:") or b"\n" in line:
            return event                # comments, [DONE] handled below, multi-line: as is
        payload = line[5:].strip()
        if payload == b"[DONE]" or not payload.startswith(b"{"):
            return event
        try:
            msg = json.loads(payload)
        except ValueError:
            return event
        if not isinstance(msg, dict):
            return event
        if not self.first_token_seen and any(
                isinstance(c, dict) and ((c.get("delta") or {}).get("content") or c.get("text"))
                for c in msg.get("choices") or []):
            self.first_token_seen = True    # not a role-only first chunk: time to first token
        if isinstance(msg.get("usage"), dict):
            self.usage = msg["usage"]
        if self.pass_usage or "usage" not in msg:
            return event
        del msg["usage"]
        if not msg.get("choices"):
            return b""                  # the usage-only chunk the client did not ask for
        return b"data: " + json.dumps(msg, separators=(",", ":")).encode() + b"\n\n"


def tokens_of(usage: dict | None) -> tuple[int, int]:
    """(prompt, completion) tokens of an OpenAI ``usage`` object; (0, 0) without one."""
    if not isinstance(usage, dict):
        return 0, 0
    return int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0)
