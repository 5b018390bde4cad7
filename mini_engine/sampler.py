"""From logits to tokens: greedy, temperature, top-p, per-request seeds, logprobs.

Greedy rows are one batched ``argmax``; sampled rows go one by one because each request may
carry its own seed (its own ``torch.Generator``), which is what makes a seeded request
reproducible whatever else shares its batch.

Contract: ``sample_row`` returns a token id or raises ValueError (never samples from NaN
probabilities); a temperature below ``SAMPLING_EPS`` is greedy, as in vLLM.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from mini_engine.sequence import SamplingParams


@dataclass
class TokenLogprob:
    token_id: int
    logprob: float
    top: list[tuple[int, float]] = field(default_factory=list)   # best first


def sample_row(logits: torch.Tensor, params: SamplingParams,
               generator: torch.Generator | None) -> int:
    """One token from one row of fp32 logits ``[vocab]``."""
    if params.greedy:
        return int(logits.argmax())
    probs = torch.softmax(logits / params.temperature, dim=-1)
    if not bool(torch.isfinite(probs).all()):
        raise ValueError(f"no distribution to sample from at temperature {params.temperature}")
    if params.top_p < 1.0:
        p, idx = probs.sort(descending=True)
        # keep the smallest prefix whose mass reaches top_p (always at least one token)
        drop = (p.cumsum(0) - p) >= params.top_p
        p[drop] = 0.0
        choice = torch.multinomial(p, 1, generator=generator)
        return int(idx[choice])
    return int(torch.multinomial(probs, 1, generator=generator))


def logprob_of(logits: torch.Tensor, token_id: int, k: int) -> TokenLogprob:
    """Log-probability of ``token_id`` under the raw (untempered) distribution, plus the
    top ``k`` alternatives, like vLLM's default."""
    lp = torch.log_softmax(logits, dim=-1)
    top = []
    if k > 0:
        vals, ids = lp.topk(k)
        top = list(zip(ids.tolist(), vals.tolist()))
    return TokenLogprob(token_id, float(lp[token_id]), top)
