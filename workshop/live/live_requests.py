"""Sending requests to a live server and timing them.

What the measuring notebooks share: prompts of an exact token length, one streamed completion
timed to its first token and its end, several sent at once, and emptying the server's prefix
cache so that a measurement starts from nothing. No arithmetic and no plots here; the topics
that use these (``kv_usage``, ``prompt_latency``) keep their own.
"""

from __future__ import annotations

import random
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence


class PromptMaker:
    """Prompts of exactly ``n`` tokens, each one different from the first word on.

    Different first words mean no two prompts share a prefix, so prefix caching cannot make
    two users share memory (prefix caching, later in the course, is about when they can).
    """

    def __init__(self, model: str, model_path: str | None = None, seed: int = 0) -> None:
        from workshop.bench.workloads import Tokenizer
        tokenizer = model_path if model_path and Path(model_path).is_dir() else None
        self.tok = Tokenizer.load(model, tokenizer)
        self.rng = random.Random(seed)

    @property
    def exact(self) -> bool:
        return self.tok.hf is not None

    def make(self, n_tokens: int) -> str:
        from workshop.bench.workloads import exact_filler
        return exact_filler(self.tok, self.rng, n_tokens)


def cached_tokens_of(usage: Any) -> int | None:
    """``usage.prompt_tokens_details.cached_tokens`` of an ``openai`` usage object: prompt
    tokens the server's prefix cache served (None where the server does not report it)."""
    details = getattr(usage, "prompt_tokens_details", None)
    cached = getattr(details, "cached_tokens", None)
    return None if cached is None else int(cached)


@dataclass
class Timed:
    """One streamed completion. Times are seconds after it was sent."""

    ttft: float | None = None
    end: float = 0.0
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    # usage.prompt_tokens_details.cached_tokens: prompt tokens the server's prefix cache served
    # (None where the server does not report it)
    cached_tokens: int | None = None
    error: str | None = None


def stream_completion(client: Any, model: str, prompt: str, max_tokens: int,
                      ignore_eos: bool = True, extra_body: dict | None = None) -> Timed:
    """Stream one ``/v1/completions`` request and time its first token and its end;
    ``extra_body`` adds request fields (``cache_salt``, ...)."""
    t = Timed()
    start = time.perf_counter()
    try:
        stream = client.completions.create(
            model=model, prompt=prompt, max_tokens=max_tokens, temperature=0.0, stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": ignore_eos, **(extra_body or {})})
        for chunk in stream:
            if chunk.usage is not None:
                t.prompt_tokens = chunk.usage.prompt_tokens
                t.completion_tokens = chunk.usage.completion_tokens
                t.cached_tokens = cached_tokens_of(chunk.usage)
            if t.ttft is None and chunk.choices and chunk.choices[0].text:
                t.ttft = time.perf_counter() - start
    except Exception as e:   # reported in the table, not raised: one failure must not hide the rest
        t.error = f"{type(e).__name__}: {e}"
    t.end = time.perf_counter() - start
    return t


def run_together(fn: Callable[[str], Timed], prompts: Sequence[str]) -> list[Timed]:
    """Send every prompt at once (one thread each) and wait for all of them."""
    with ThreadPoolExecutor(max_workers=max(len(prompts), 1)) as pool:
        return list(pool.map(fn, prompts))


def reset_prefix_cache(session: Any, tries: int = 1, pause_s: float = 0.25) -> bool:
    """Ask the server to empty its prefix cache; True once it says it did. With ``tries`` > 1
    a refusal is asked again: vLLM answers ``success: false`` and keeps its cache while a
    request still holds blocks (one just finished may, briefly). False at once for a server
    that says it has no prefix cache (ours answer ``prefix_caching: false``) or lacks the
    endpoint. The answer is read as the harness reads it (``workshop.bench.run.reset_verdict``)."""
    import httpx

    from workshop.bench.run import reset_verdict
    for attempt in range(tries):
        if attempt:
            time.sleep(pause_s)
        try:
            r = httpx.post(session.base_url + "/reset_prefix_cache", headers=session.headers,
                           timeout=30)
        except httpx.HTTPError:
            return False
        try:
            body = r.json()
        except ValueError:
            body = None
        verdict = reset_verdict(r.status_code, body)
        if verdict != "refused":
            return verdict == "emptied"
    return False


__all__ = ["PromptMaker", "Timed", "stream_completion", "run_together", "reset_prefix_cache"]
