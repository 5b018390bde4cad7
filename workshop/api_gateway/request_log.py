"""The gateway's request log: one JSON line per request, and never what was said.

``line`` takes only named, non-text fields, so a prompt or a reply cannot reach the log by a
careless ``**request``: the key's name (never its secret), the model, the replica, the status,
token counts and times. Those are what billing, capacity planning and incident work need;
prompt text in logs is a privacy and compliance liability that most of them do not need.
"""

from __future__ import annotations

import json
import time


def line(*, key: str | None, model: str | None, replica: int | None, status: int,
         prompt_tokens: int = 0, completion_tokens: int = 0, latency_s: float,
         ttft_s: float | None = None, stream: bool = False, error: str | None = None,
         at: float | None = None) -> str:
    record = {"time": round(time.time() if at is None else at, 3), "key": key,
              "model": model[:200] if isinstance(model, str) else None, "replica": replica,
              "status": status, "stream": stream, "prompt_tokens": prompt_tokens,
              "completion_tokens": completion_tokens, "latency_s": round(latency_s, 4),
              "ttft_s": None if ttft_s is None else round(ttft_s, 4), "error": error}
    return json.dumps(record, separators=(",", ":"))


def read(path) -> list[dict]:
    with open(path) as f:
        return [json.loads(s) for s in f if s.strip()]
