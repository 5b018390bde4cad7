"""Notebook 15's measurements: the distribution a server samples from, what temperature does
to it, and whether answers are valid JSON. Functions return data; the notebook words it.

The model's own distribution comes from the server's ``top_logprobs``: vLLM, and the
course's in-process engines, report the raw model's log-probabilities (before temperature and
any other sampling parameter), so the softmax at a temperature is computed here from them,
over the top ``k`` tokens (the mass outside them is left out and named in the notebook).
"""

from __future__ import annotations

import json
import math
from collections import Counter
from typing import Any, Callable, Iterable, Sequence

OTHER = "(any other token)"


def top_logprobs(client: Any, model: str, messages: list[dict], k: int = 20) -> dict[str, float]:
    """The first answer token's ``k`` most likely tokens and their raw log-probabilities."""
    r = client.chat.completions.create(model=model, messages=messages, max_tokens=1,
                                       temperature=0, logprobs=True, top_logprobs=k)
    first = r.choices[0].logprobs.content[0]
    return {t.token: t.logprob for t in first.top_logprobs}


def softmax_at(logprobs: dict[str, float], temperature: float) -> dict[str, float]:
    """softmax(logprob / T) over the given tokens, renormalised; T = 0 is the argmax alone."""
    if temperature <= 0:
        best = max(logprobs, key=logprobs.get)
        return {t: float(t == best) for t in logprobs}
    top = max(logprobs.values())
    w = {t: math.exp((lp - top) / temperature) for t, lp in logprobs.items()}
    z = sum(w.values())
    return {t: v / z for t, v in w.items()}


def choices(client: Any, model: str, messages: list[dict], count: int, per_request: int = 8,
            progress: Callable[[Iterable[int]], Iterable[int]] = iter, **params) -> list:
    """At least ``count`` answers to ``messages``, asked ``per_request`` at a time (``n``; a
    server caps it, ``/server_info``'s ``limits.max_n`` on the course's), with ``params``
    (``max_tokens``, ``temperature``, ``response_format``...)."""
    out: list = []
    for _ in progress(range(math.ceil(count / per_request))):
        out += client.chat.completions.create(model=model, messages=messages, n=per_request,
                                              **params).choices
    return out


def sample_first_tokens(client: Any, model: str, messages: list[dict], temperature: float,
                        samples: int, per_request: int = 8,
                        progress: Callable[[Iterable[int]], Iterable[int]] = iter) -> Counter:
    """How often each first token was drawn in ``samples`` draws (``n`` per request)."""
    return Counter(c.message.content or "" for c in choices(
        client, model, messages, samples, per_request, progress, max_tokens=1,
        temperature=temperature))


def frequencies(counts: Counter, tokens: Iterable[str]) -> dict[str, float]:
    """Shares of ``counts`` per token in ``tokens``, the rest pooled under ``OTHER``."""
    total = sum(counts.values())
    keep = list(tokens)
    out = {t: counts.get(t, 0) / total for t in keep}
    out[OTHER] = 1.0 - sum(out.values())
    return out


def total_variation(p: dict[str, float], q: dict[str, float]) -> float:
    """Half the summed absolute difference of two distributions over the union of their keys."""
    return 0.5 * sum(abs(p.get(k, 0.0) - q.get(k, 0.0)) for k in set(p) | set(q))


def entropy_bits(p: dict[str, float]) -> float:
    return max(0.0, -sum(v * math.log2(v) for v in p.values() if v > 0))


def distinct_n(texts: Sequence[str], n: int = 2) -> float:
    """Unique word n-grams over all word n-grams of ``texts`` (Li et al., 2016): 1.0 when no
    n-gram repeats across the answers, lower as they say the same things."""
    grams = [tuple(w[i:i + n]) for w in (t.split() for t in texts) for i in range(len(w) - n + 1)]
    return len(set(grams)) / len(grams) if grams else 0.0


def check_json(text: str, schema: dict) -> str:
    """'valid', 'wrong shape' (JSON, but not the schema's) or 'not JSON'."""
    import jsonschema
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return "not JSON"
    try:
        jsonschema.validate(value, schema)
    except jsonschema.ValidationError:
        return "wrong shape"
    return "valid"


def bundled_grammar(response_format: dict):
    """(tokenizer, compiled grammar, vocabulary size) for the bundled model, in this process:
    the same ``mini_engine.grammar`` the teaching engine masks with."""
    from transformers import AutoTokenizer

    from mini_engine.grammar import GrammarCompiler
    from reference_server.model_config import read_arch
    from reference_server.models import resolve_model
    path = resolve_model("smollm2-135m").path
    tokenizer = AutoTokenizer.from_pretrained(path)
    vocab = read_arch(path).vocab_size
    grammar = GrammarCompiler(tokenizer, vocab, [tokenizer.eos_token_id]).compile(response_format)
    return tokenizer, grammar, vocab


def mask_seconds_per_token(grammar, token_ids: Sequence[int], vocab_size: int,
                           repeats: int = 5) -> float:
    """Best-of-``repeats`` time per token to fill and apply the mask and advance the matcher
    along ``token_ids``: the grammar's own cost of one constrained token."""
    import torch

    from mini_engine.grammar import advance, apply_grammar
    from workshop.timing import best_time_s
    matcher, logits = grammar.matcher(), torch.zeros(1, vocab_size)

    def walk() -> None:
        matcher.reset()                 # back to the start of the automaton
        for t in token_ids:
            apply_grammar(logits, [matcher])
            advance(matcher, t)
    return best_time_s(walk, repeats) / len(token_ids)


def allowed_per_position(grammar, token_ids: Sequence[int], vocab_size: int) -> list[int]:
    """How many token ids the grammar allows before each token of ``token_ids`` (a walk of
    ``mini_engine.grammar``'s matcher along a valid answer)."""
    import torch

    from mini_engine.grammar import advance, apply_grammar
    matcher, out = grammar.matcher(), []
    for t in token_ids:
        logits = torch.zeros(1, vocab_size)
        apply_grammar(logits, [matcher])
        out.append(int(torch.isfinite(logits).sum()))
        advance(matcher, t)
    return out


def alone_and_in_a_batch(session: Any, messages: list[dict], fillers: Sequence[str],
                         max_tokens: int = 32) -> dict[str, Any]:
    """The same greedy request sent alone, then at once with one request per filler prompt;
    its two answers, and where they first differ (None when identical)."""
    import asyncio

    from workshop.bench.event_loop import run_sync

    def ask(client, msgs):
        return client.chat.completions.create(model=session.model, messages=msgs,
                                              max_tokens=max_tokens, temperature=0)

    async def batch() -> str:
        client = session.async_openai()
        answers = await asyncio.gather(ask(client, messages), *(
            ask(client, [{"role": "user", "content": f}]) for f in fillers))
        return answers[0].choices[0].message.content

    alone = ask(session.openai(), messages).choices[0].message.content
    batched = run_sync(batch())
    first = next((i for i, (a, b) in enumerate(zip(alone, batched)) if a != b),
                 None if alone == batched else min(len(alone), len(batched)))
    return {"alone": alone, "in a batch": batched, "first difference at character": first}


def distribution_figure(computed: dict[str, float], sampled: dict[str, float], temperature: float,
                        draws: int, engine: str):
    """The softmax computed from the raw log-probabilities beside the sampled shares."""
    import numpy as np

    from workshop.plots import figure
    keys = [k for k in computed if computed[k] >= 0.01 or sampled.get(k, 0) >= 0.01][:10]
    keys.append(OTHER)
    fig, ax = figure(f"First token at temperature {temperature:g}: computed vs {draws} draws "
                     f"({engine})", "token", "probability")
    x = np.arange(len(keys))
    ax.bar(x - 0.2, [computed.get(k, 0.0) for k in keys], 0.4,
           label="softmax(logprob / T), computed")
    ax.bar(x + 0.2, [sampled.get(k, 0.0) for k in keys], 0.4, label="share of draws, measured")
    ax.set_xticks(x, [repr(k) for k in keys], rotation=30, ha="right", fontsize=8)
    ax.legend(fontsize=8)
    return fig


def allowed_figure(pieces: Sequence[str], allowed: Sequence[int], vocab_size: int):
    """How many tokens the grammar allows before each token of a valid answer (log scale)."""
    from workshop.plots import figure
    fig, ax = figure("What the grammar allows, token by token", "next token of the answer",
                     f"tokens allowed (of {vocab_size:,})")
    ax.bar(range(len(allowed)), allowed, color="tab:purple")
    ax.set_yscale("log")
    ax.set_xticks(range(len(pieces)), [repr(p) for p in pieces], rotation=60, ha="right",
                  fontsize=7)
    return fig


__all__ = ["OTHER", "top_logprobs", "softmax_at", "choices", "sample_first_tokens",
           "frequencies", "total_variation", "entropy_bits", "distinct_n", "check_json",
           "bundled_grammar",
           "mask_seconds_per_token", "allowed_per_position", "distribution_figure",
           "allowed_figure", "alone_and_in_a_batch"]
