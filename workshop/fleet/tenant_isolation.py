"""Tenant isolation: can one tenant tell from its own time to first token whether another
tenant recently sent a prompt? (issue 37)

A shared prefix cache serves a prompt's blocks to whoever sends that prompt next, so a probe
of a prompt someone else just sent starts sooner than a probe of one nobody sent. Here tenant
A sends a prompt, then tenant B probes either that prompt or one A did not send and times its
first token. With a ``cache_salt`` per tenant the server keeps the two tenants' cached blocks
apart, and both kinds of probe should take as long.

``measure`` sends the requests and returns one row per probe; ``best_threshold`` and
``summarize`` are the pure part: the single TTFT threshold that best separates probes of
prompts A sent from probes of prompts it did not, and the share of probes it classifies
right (0.5: a coin flip; 1.0: told apart every time). Data only: no prose, no plots.
"""

from __future__ import annotations

import random
import secrets
import statistics
from typing import Any, Callable, Sequence

from workshop.live.live_requests import PromptMaker, Timed, reset_prefix_cache, stream_completion

# send(prompt, cache_salt) -> Timed: one timed request (tests pass a fake one)
Send = Callable[[str, "str | None"], Timed]


def best_threshold(sent: Sequence[float], unsent: Sequence[float]
                   ) -> tuple[float | None, float]:
    """The TTFT threshold at or below which a probe is guessed "A sent this prompt", chosen to
    classify the most probes right, and that share of probes. Thresholds are tried at every
    measured value and below all of them (None: every probe guessed "not sent"). The guess is
    fitted to the same probes it is scored on, so with few probes even two identical
    distributions score above 0.5; compare the salted and unsalted accuracy, not each with 0.5.
    """
    total = len(sent) + len(unsent)
    if total == 0:
        return None, 0.0
    best_t, best_right = None, len(unsent)          # below every value: all guessed "not sent"
    for t in sorted({*sent, *unsent}):
        right = sum(x <= t for x in sent) + sum(x > t for x in unsent)
        if right > best_right:
            best_t, best_right = t, right
    return best_t, best_right / total


def probe_plan(n_probes: int, seed: int = 0) -> list[bool]:
    """Whether A sends the probed prompt, per probe: half of each, in a shuffled order so that
    drift in the machine's speed falls on both kinds alike."""
    plan = [i % 2 == 0 for i in range(n_probes)]
    random.Random(seed).shuffle(plan)
    return plan


def probe(send: Send, plan: Sequence[bool], prompts: Callable[[], str],
          salts: tuple[str | None, str | None], salted: bool) -> list[dict]:
    """Run ``plan``: per probe A sends one prompt, then B probes that one (A sent it) or a
    fresh one (A did not). ``salts`` are A's and B's ``cache_salt``; one row per probe."""
    rows = []
    for i, a_sent in enumerate(plan):
        target = prompts()
        send(target if a_sent else prompts(), salts[0])    # A: the same work either way
        t = send(target, salts[1])
        rows.append({"salts": salted, "probe": i, "sent_by_a": a_sent,
                     "ttft_ms": None if t.ttft is None else t.ttft * 1e3,
                     "cached_tokens": t.cached_tokens, "error": t.error})
    return rows


def summarize(rows: Sequence[dict]) -> list[dict]:
    """One row per setting (without, then with salts): probes, B's probes that found cached
    tokens, median TTFT of probes of sent and unsent prompts, the best threshold and its
    accuracy. Probes that failed or got no first token are left out."""
    out = []
    for salted in sorted({r["salts"] for r in rows}):
        ok = [r for r in rows if r["salts"] == salted and r["ttft_ms"] is not None
              and not r["error"]]
        sent = [r["ttft_ms"] for r in ok if r["sent_by_a"]]
        unsent = [r["ttft_ms"] for r in ok if not r["sent_by_a"]]
        threshold, accuracy = best_threshold(sent, unsent)
        out.append({
            "salts": salted, "probes": len(ok),
            "probes with cached tokens": sum(1 for r in ok if r["cached_tokens"]),
            "median TTFT, A sent it (ms)": statistics.median(sent) if sent else None,
            "median TTFT, A did not (ms)": statistics.median(unsent) if unsent else None,
            "threshold (ms)": threshold, "accuracy": accuracy})
    return out


def sender(session: Any, max_tokens: int = 2) -> Send:
    """``send`` over ``session``'s server: one streamed completion, timed."""
    client = session.openai()

    def send(prompt: str, salt: str | None) -> Timed:
        extra = {} if salt is None else {"cache_salt": salt}
        return stream_completion(client, session.model, prompt, max_tokens, extra_body=extra)
    return send


def measure(session: Any, n_probes: int, prompt_tokens: int, seed: int = 0,
            max_tokens: int = 2, send: Send | None = None,
            prompts: Callable[[], str] | None = None) -> dict:
    """Probe without salts, then with a random salt per tenant, ``n_probes`` each, prompts of
    ``prompt_tokens`` tokens (all different from their first word on). The prefix cache is
    emptied before each setting and one unrecorded request warms the server up.
    Returns ``{"rows": [...], "summary": summarize(rows)}``."""
    send = send or sender(session, max_tokens)
    if prompts is None:
        maker = PromptMaker(session.model, session.info.get("model_path"), seed=seed)
        prompts = lambda: maker.make(prompt_tokens)      # noqa: E731
    # random and unguessable, as vLLM asks of a salt (vLLM refuses '/' and '@': none here)
    salted_pair = (secrets.token_urlsafe(16), secrets.token_urlsafe(16))
    send(prompts(), None)
    rows: list[dict] = []
    for salted, salts in ((False, (None, None)), (True, salted_pair)):
        if session is not None:
            reset_prefix_cache(session, tries=8)
        rows += probe(send, probe_plan(n_probes, seed), prompts, salts, salted)
    return {"rows": rows, "summary": summarize(rows)}


__all__ = ["best_threshold", "measure", "probe", "probe_plan", "sender", "summarize"]
