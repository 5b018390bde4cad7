"""From logits to tokens: a grammar's mask, logit bias, penalties, greedy, temperature, min-p,
top-k, top-p, per-request seeds, logprobs.

``sample`` takes one row of logits per sequence and applies each request's own parameters,
in vLLM's order (``vllm/v1/sample/sampler.py``):

0. A grammar (structured output, ``mini_engine.grammar``): tokens it does not allow get -inf.
1. ``logit_bias``: the bias is added to the token's logit (vLLM clamps biases to [-100, 100];
   the server refuses values outside that range instead).
2. Penalties (``vllm/model_executor/layers/utils.py``, ``apply_penalties``):
   ``repetition_penalty`` r scales the logit of every token seen in the prompt OR the output
   so far (a positive logit is divided by r, a negative one multiplied by r); then
   ``frequency_penalty`` is subtracted once per occurrence in the output, and
   ``presence_penalty`` once for any occurrence in the output (the OpenAI definition).
3. Greedy (temperature below ``SAMPLING_EPS``): the argmax of these logits.
4. Otherwise: divide by the temperature, drop tokens whose probability is below ``min_p``
   times the most likely one's, keep the ``top_k`` largest logits (ties at the k-th value
   stay, as in vLLM; 0 or -1 keeps all), keep the smallest set of most likely tokens whose
   mass reaches ``top_p`` (renormalized after the two before), and draw.

Where engines differ:

* Which tokens count. Presence and frequency penalties count output tokens only, everywhere.
  The repetition penalty counts prompt and output tokens in vLLM and here; SGLang (0.5.x,
  ``srt/sampling/penaltylib/repetition_penalty.py``) counts output tokens only, so its
  answers differ from ours once a prompt token is a candidate. Hugging Face's
  ``RepetitionPenaltyLogitsProcessor`` counts every token of ``input_ids`` (prompt and
  output), as vLLM does.
* Order. vLLM, SGLang and this sampler apply bias and penalties before the temperature;
  Hugging Face's ``generate`` applies the repetition penalty, then temperature, top-k,
  top-p, and has no presence or frequency penalty.
* Ranges. vLLM takes any ``repetition_penalty`` > 0, SGLang (0, 2]; SGLang takes -1 but not
  0 for "every token" in ``top_k``. The server refuses values outside the narrower range for
  every engine and passes ``top_k`` 0 on as -1 (``reference_server/protocol.py``).
* Logprobs are always those of the model's raw logits (vLLM's default
  ``logprobs_mode="raw_logprobs"``), before bias, penalties and temperature.

Greedy requests without a bias or penalty (``plain_greedy``) never come here in the engine:
its one batched ``argmax`` over the step's logits is their token. Everything else is one
batched call; only the final draw goes row by row, because each request may carry its own
seed (its own ``torch.Generator``), which is what makes a seeded request reproducible
whatever else shares its batch.

Contract: ``sample`` returns one token id per row or raises ValueError before drawing any
(never samples from NaN probabilities, so a retry row by row draws the same tokens); a
temperature below ``SAMPLING_EPS`` is greedy, as in vLLM.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from mini_engine.grammar import apply_grammar
from mini_engine.sequence import SamplingParams


@dataclass
class TokenLogprob:
    token_id: int
    logprob: float
    top: list[tuple[int, float]] = field(default_factory=list)   # best first


class Sampled(Protocol):
    """What the sampler reads of a sequence (``mini_engine.sequence.Sequence`` has it)."""
    params: SamplingParams
    generator: torch.Generator | None
    token_ids: list[int]            # prompt, then the output so far
    num_prompt_tokens: int
    grammar: Any                    # its structured-output matcher, or None


@dataclass
class Row:
    """A ``Sampled`` for callers without a ``Sequence`` (the HF baseline, ``sample_row``)."""
    params: SamplingParams
    generator: torch.Generator | None = None
    token_ids: list[int] = field(default_factory=list)
    num_prompt_tokens: int = 0
    grammar: Any = None


def sample(logits: torch.Tensor, seqs: list[Sampled]) -> list[int]:
    """One token per row of fp32 ``logits [len(seqs), vocab]``, row i with ``seqs[i]``'s
    parameters. ``logits`` is not modified."""
    params = [s.params for s in seqs]
    if all(p.plain_greedy for p in params):
        return logits.argmax(-1).tolist()
    logits = logits.float().clone()        # the caller still needs the raw rows (logprobs)
    apply_grammar(logits, [s.grammar for s in seqs])
    apply_logit_bias(logits, params)
    apply_penalties(logits, seqs)
    tokens = logits.argmax(-1)             # the greedy rows' answer
    rows = [i for i, p in enumerate(params) if not p.greedy]
    if not rows:
        return tokens.tolist()
    chosen = [params[i] for i in rows]
    dev = logits.device
    x = logits[rows] / torch.tensor([p.temperature for p in chosen], device=dev).unsqueeze(1)
    x = apply_min_p(x, torch.tensor([p.min_p for p in chosen], device=dev))
    x = apply_top_k(x, [p.top_k for p in chosen])
    probs = torch.softmax(x, dim=-1)
    finite = torch.isfinite(probs).all(dim=-1)
    if not bool(finite.all()):
        bad = chosen[int((~finite).nonzero()[0])]
        raise ValueError(f"no distribution to sample from at temperature {bad.temperature}")
    for j, i in enumerate(rows):
        tokens[i] = _draw(probs[j], params[i].top_p, seqs[i].generator)
    return tokens.tolist()


def _draw(probs: torch.Tensor, top_p: float, generator: torch.Generator | None) -> int:
    """One token from one row of probabilities, within its top-p nucleus."""
    if top_p < 1.0:
        p, idx = probs.sort(descending=True)
        # keep the smallest prefix whose mass reaches top_p (always at least one token)
        drop = (p.cumsum(0) - p) >= top_p
        p[drop] = 0.0
        return int(idx[torch.multinomial(p, 1, generator=generator)])
    return int(torch.multinomial(probs, 1, generator=generator))


def apply_logit_bias(logits: torch.Tensor, params: list[SamplingParams]) -> None:
    """Add each request's ``logit_bias`` to its row, in place."""
    rows, cols, vals = [], [], []
    for i, p in enumerate(params):
        for token, bias in p.logit_bias.items():
            rows.append(i)
            cols.append(token)
            vals.append(bias)
    if rows:
        dev = logits.device
        logits.index_put_((torch.tensor(rows, device=dev), torch.tensor(cols, device=dev)),
                          torch.tensor(vals, dtype=logits.dtype, device=dev), accumulate=True)


def apply_penalties(logits: torch.Tensor, seqs: list[Sampled]) -> None:
    """Repetition, frequency and presence penalties, in place, as vLLM's ``apply_penalties``
    (rows without penalties are left exactly as they are)."""
    rows = [i for i, s in enumerate(seqs) if s.params.penalized]
    if not rows:
        return
    vocab = logits.shape[1]

    def counts(ids: list[int]) -> torch.Tensor:   # occurrences of each token id
        return torch.bincount(torch.tensor(ids, dtype=torch.long, device=logits.device),
                              minlength=vocab)[:vocab]

    out_counts = torch.stack([counts(seqs[i].token_ids[seqs[i].num_prompt_tokens:])
                              for i in rows]).to(logits.dtype)
    in_prompt = torch.stack([counts(seqs[i].token_ids[:seqs[i].num_prompt_tokens]) > 0
                             for i in rows])
    rep, freq, pres = (torch.tensor([getattr(seqs[i].params, name) for i in rows],
                                    dtype=logits.dtype, device=logits.device).unsqueeze(1)
                       for name in ("repetition_penalty", "frequency_penalty",
                                    "presence_penalty"))
    x = logits[rows]
    r = torch.where(in_prompt | (out_counts > 0), rep, 1.0)
    x *= torch.where(x > 0, 1.0 / r, r)        # vLLM's exact arithmetic: a multiply either way
    x -= freq * out_counts
    x -= pres * (out_counts > 0)
    logits[rows] = x


def apply_min_p(x: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """Mask (-inf) the tokens whose probability is below ``min_p`` x the row's largest."""
    if not bool((min_p > 0).any()):
        return x
    probs = torch.softmax(x, dim=-1)
    floor = probs.amax(dim=-1, keepdim=True) * min_p.unsqueeze(1)
    return x.masked_fill(probs < floor, float("-inf"))


def apply_top_k(x: torch.Tensor, top_k: list[int]) -> torch.Tensor:
    """Mask (-inf) every logit below the row's k-th largest (k <= 0 or >= vocab: keep all)."""
    vocab = x.shape[1]
    k = torch.tensor([t if 0 < t < vocab else 0 for t in top_k], device=x.device)  # 0: keep all
    if not bool((k > 0).any()):
        return x
    kth = x.topk(int(k.max()), dim=-1).values.gather(1, (k.clamp(min=1) - 1).unsqueeze(1))
    kth[k == 0] = float("-inf")
    return x.masked_fill(x < kth, float("-inf"))


def sample_row(logits: torch.Tensor, params: SamplingParams,
               generator: torch.Generator | None) -> int:
    """One token from one row of fp32 logits ``[vocab]`` with no history (penalties see
    neither prompt nor output)."""
    return sample(logits.unsqueeze(0), [Row(params, generator)])[0]


def logprob_of(logits: torch.Tensor, token_id: int, k: int) -> TokenLogprob:
    """Log-probability of ``token_id`` under the raw (untempered) distribution, plus the
    top ``k`` alternatives, like vLLM's default."""
    lp = torch.log_softmax(logits, dim=-1)
    top = []
    if k > 0:
        vals, ids = lp.topk(k)
        top = list(zip(ids.tolist(), vals.tolist()))
    return TokenLogprob(token_id, float(lp[token_id]), top)
