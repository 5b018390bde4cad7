"""Time single requests by hand: when the first token arrives, how fast the rest follow.

This is the stopwatch of notebook 0 (and of every "one request" number later): it sends a
streaming request, notes the arrival time of every chunk that carries text, and reads the
token count from the server's final usage chunk. The benchmark harness (``workshop.bench``)
does the same for many requests at once.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

from workshop.live.live_requests import cached_tokens_of


@dataclass
class StreamTiming:
    """One streamed request. Times are seconds after the request was sent."""

    text: str = ""
    chunk_times: list[float] = field(default_factory=list)   # arrival of each text chunk
    end: float = 0.0
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None     # prompt tokens the server found in its prefix cache
    finish_reason: str | None = None

    @property
    def ttft(self) -> float | None:
        """Time to first token: request sent -> first chunk that carries text."""
        return self.chunk_times[0] if self.chunk_times else None

    @property
    def tokens(self) -> int:
        """Output tokens: the server's count if it sent usage, else one per text chunk."""
        return (self.completion_tokens if self.completion_tokens is not None
                else len(self.chunk_times))

    @property
    def decode_tokens_per_s(self) -> float | None:
        return decode_rate(self.chunk_times, self.tokens, self.end)

    @property
    def e2e_tokens_per_s(self) -> float | None:
        """Output tokens / whole request time: what a user waiting for the full answer sees."""
        return self.tokens / self.end if self.end > 0 and self.tokens else None


def decode_rate(chunk_times: Sequence[float], tokens: int, end: float) -> float | None:
    """Tokens per second after the first one: (tokens - 1) / (end - first chunk).

    The first token is excluded because its wait is the prompt's prefill (that is TTFT); what
    is left is the steady generation speed. ``None`` when there is nothing to divide.
    """
    if not chunk_times or tokens < 2 or end <= chunk_times[0]:
        return None
    return (tokens - 1) / (end - chunk_times[0])


def stream_chat(client: Any, model: str, messages: list[dict], max_tokens: int = 128,
                echo: bool = False, **extra: Any) -> StreamTiming:
    """Send one streaming chat request with an ``openai`` client and time it."""
    t = StreamTiming()
    start = time.perf_counter()
    stream = client.chat.completions.create(
        model=model, messages=messages, max_tokens=max_tokens, stream=True,
        stream_options={"include_usage": True}, **extra)
    for chunk in stream:
        now = time.perf_counter() - start
        if chunk.usage is not None:
            t.prompt_tokens = chunk.usage.prompt_tokens
            t.completion_tokens = chunk.usage.completion_tokens
            t.cached_tokens = cached_tokens_of(chunk.usage)
        for choice in chunk.choices:
            piece = choice.delta.content or ""
            if piece:
                t.chunk_times.append(now)
                t.text += piece
                if echo:
                    print(piece, end="", flush=True)
            if choice.finish_reason:
                t.finish_reason = choice.finish_reason
    t.end = time.perf_counter() - start
    if echo:
        print()
    return t


def summarize(runs: Sequence[StreamTiming]) -> dict[str, float]:
    """Median and spread of TTFT (ms) and decode speed over repeated runs."""
    ttfts = [r.ttft * 1000 for r in runs if r.ttft is not None]
    rates = [r.decode_tokens_per_s for r in runs if r.decode_tokens_per_s is not None]
    out: dict[str, float] = {"runs": float(len(runs))}
    if ttfts:
        out.update(ttft_ms_median=statistics.median(ttfts), ttft_ms_min=min(ttfts),
                   ttft_ms_max=max(ttfts))
    if rates:
        out.update(decode_tok_s_median=statistics.median(rates), decode_tok_s_min=min(rates),
                   decode_tok_s_max=max(rates))
    return out


def plot_stream(t: StreamTiming, title: str = "One streamed answer, chunk by chunk"):
    """Cumulative text chunks against arrival time, with TTFT and the decode rate marked."""
    from workshop.plots import figure

    fig, ax = figure(title, "time since the request was sent (s)", "text chunks received")
    counts = list(range(1, len(t.chunk_times) + 1))
    ax.step(t.chunk_times, counts, where="post", label="chunks as they arrived")
    if t.ttft is not None:
        ax.axvline(t.ttft, color="tab:red", linestyle="--",
                   label=f"time to first token = {t.ttft * 1000:.0f} ms")
    rate = decode_rate(t.chunk_times, len(t.chunk_times), t.end)
    if rate and t.ttft is not None:
        ax.plot([t.ttft, t.end], [1, 1 + rate * (t.end - t.ttft)], color="tab:green",
                linestyle=":", label=f"steady decode: {rate:.1f} chunks/s")
    ax.set_xlim(left=0)
    ax.set_ylim(bottom=0)
    ax.legend(loc="upper left")
    return fig


def check_endpoints(session: Any, paths: Sequence[str] = ("/health", "/ready", "/v1/models",
                                                          "/server_info",
                                                          "/metrics")) -> list[dict]:
    """GET each endpoint once: status code, time taken, and the start of the body."""
    import httpx

    rows = []
    for path in paths:
        start = time.perf_counter()
        try:
            r = httpx.get(session.base_url + path, headers=session.headers, timeout=10.0)
            status, body = str(r.status_code), r.text
        except httpx.HTTPError as e:
            status, body = "error", f"{type(e).__name__}: {e}"
        ms = (time.perf_counter() - start) * 1000
        first = " ".join(body.split())[:70]
        rows.append({"endpoint": path, "status": status, "time (ms)": round(ms, 1),
                     "body starts with": first + ("…" if len(body) > 70 else "")})
    return rows


INFO_LABELS = {
    "engine": "engine", "engine_version": "engine version", "model": "model name (send this)",
    "model_path": "weights from", "dtype": "weight dtype", "device": "device",
    "max_model_len": "max context (tokens)", "kv_capacity_tokens": "KV cache capacity (tokens)",
    "kv_bytes_per_token": "KV bytes per token", "block_size": "KV block size (tokens)",
    "prefix_caching": "prefix caching",
}


def info_rows(info: dict) -> list[dict]:
    """``/server_info`` as (field, meaning, value) rows, known fields first."""
    rows = [{"field": k, "meaning": label, "value": info[k]}
            for k, label in INFO_LABELS.items() if k in info]
    rows += [{"field": k, "meaning": "", "value": v} for k, v in info.items()
             if k not in INFO_LABELS]
    return rows
