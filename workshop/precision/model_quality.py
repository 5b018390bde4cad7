"""How good a model's outputs are, measured the same way for every variant of it.

* ``perplexity`` on held-out text (``heldout_texts``: assistant replies from ShareGPT, read
  through the benchmark harness's one ShareGPT reader);
* greedy agreement with a reference model's answers to a fixed question set (``QUESTIONS``):
  ``greedy_answers`` generates them, ``forced_greedy_agreement`` checks another model against
  them in one forward pass per question;
* ``linear_input_ranges``: how far the largest input of each linear layer stands above the
  typical one, which decides whether per-tensor int8 activations can work.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

import torch
from torch import nn

from workshop.bench.workloads import sharegpt_conversations
from workshop.engine_lab.prefix_caching import common_prefix

QUESTIONS: tuple[str, ...] = (
    "What is the capital of France?",
    "How many days are there in a week?",
    "What is the chemical symbol for water?",
    "Name the largest planet in the solar system.",
    "What does a thermometer measure?",
    "Give me one tip for sleeping better.",
    "What is 12 plus 7?",
    "Translate 'thank you' into Spanish.",
    "What colour do you get by mixing blue and yellow?",
    "Who wrote the play Romeo and Juliet?",
    "What is the boiling point of water at sea level in Celsius?",
    "Write a short sentence about the sea.",
)


def heldout_texts(n: int = 20, skip: int = 1000, min_chars: int = 400,
                  path: Path | None = None) -> list[str]:
    """``n`` assistant replies from ShareGPT, read lazily from the start of the 125 MB file.

    Conversations before ``skip`` are passed over, and only mostly-ASCII replies of at least
    ``min_chars`` are kept, so the set is English prose and code, the same on every machine.
    Nothing here trains or tunes on them; whether SmolLM2's pre-training corpus contained
    ShareGPT is not documented, so treat the perplexities as relative, not absolute.
    """
    texts: list[str] = []
    for index, turns in enumerate(sharegpt_conversations(path)):
        if len(texts) >= n:
            break
        if index < skip:
            continue
        for turn in turns:
            text = turn.get("value", "")
            if (turn.get("from") == "gpt" and len(text) >= min_chars
                    and sum(c.isascii() for c in text) > 0.98 * len(text)):
                texts.append(text)
                break
    return texts


@torch.inference_mode()
def perplexity(model: nn.Module, tokenizer, texts: Iterable[str], max_tokens: int = 4096,
               window: int = 512) -> float:
    """exp(mean negative log-likelihood) over the first ``max_tokens`` tokens of ``texts``.

    Texts are joined with the end-of-text token and cut into non-overlapping windows; every
    token but the first of each window is predicted. Same texts + same tokenizer = comparable.
    """
    sep = tokenizer.eos_token or "\n\n"
    ids = tokenizer(sep.join(texts), return_tensors="pt")["input_ids"][0][:max_tokens]
    total_nll, count = 0.0, 0
    for start in range(0, len(ids) - 1, window):
        chunk = ids[start:start + window].unsqueeze(0)
        if chunk.shape[1] < 2:
            break
        logits = model(chunk).logits.float()
        nll = nn.functional.cross_entropy(logits[0, :-1], chunk[0, 1:], reduction="sum")
        total_nll += nll.item()
        count += chunk.shape[1] - 1
    return math.exp(total_nll / count)


def chat_ids(tokenizer, question: str) -> torch.Tensor:
    return tokenizer.apply_chat_template([{"role": "user", "content": question}],
                                         add_generation_prompt=True, return_tensors="pt",
                                         return_dict=True)["input_ids"]


@torch.inference_mode()
def greedy_answers(model: nn.Module, tokenizer, questions: Sequence[str] = QUESTIONS,
                   max_new_tokens: int = 24) -> list[list[int]]:
    """Greedy (deterministic) answer token ids for each question, chat template applied."""
    answers = []
    for q in questions:
        ids = chat_ids(tokenizer, q)
        out = model.generate(ids, max_new_tokens=max_new_tokens, do_sample=False,
                             attention_mask=torch.ones_like(ids),
                             pad_token_id=tokenizer.eos_token_id)
        answers.append(out[0, ids.shape[1]:].tolist())
    return answers


@dataclass(frozen=True)
class Agreement:
    exact: float          # share of answers identical to the reference, token for token
    prefix: float         # mean share of each reference answer reproduced before diverging

    def __str__(self) -> str:
        return f"{self.exact:.0%} identical, {self.prefix:.0%} of tokens before divergence"


def greedy_agreement(reference: Sequence[Sequence[int]],
                     candidate: Sequence[Sequence[int]]) -> Agreement:
    if len(reference) != len(candidate) or not reference:
        raise ValueError("need the same, non-zero number of answers")
    exact = sum(list(r) == list(c) for r, c in zip(reference, candidate)) / len(reference)
    prefix = sum(common_prefix(r, c) / max(len(r), 1)
                 for r, c in zip(reference, candidate)) / len(reference)
    return Agreement(exact, prefix)


@torch.inference_mode()
def forced_greedy_agreement(model: nn.Module, tokenizer, questions: Sequence[str],
                            reference: Sequence[Sequence[int]]) -> Agreement:
    """Would ``model`` reproduce the reference's greedy answers? One forward per question.

    Feed question + reference answer and take the model's top token at every answer
    position. Greedy decoding reproduces the answer exactly iff every one of those is the
    reference token, and diverges at the first position where one is not: the same two
    numbers as generating and comparing, without a forward pass per generated token.
    """
    rows = []
    for q, ref in zip(questions, reference):
        ids = chat_ids(tokenizer, q)
        if not ref:
            rows.append([])
            continue
        full = torch.cat([ids, torch.tensor([list(ref)], dtype=ids.dtype)], dim=1)
        logits = model(full).logits[0, ids.shape[1] - 1:-1]
        rows.append(logits.argmax(-1).tolist())
    return greedy_agreement(reference, rows)


@torch.inference_mode()
def linear_input_ranges(model: nn.Module, tokenizer, text: str,
                        max_tokens: int = 256) -> list[dict]:
    """For every ``nn.Linear``: the largest and the mean absolute value of its input.

    Per-tensor int8 activation quantization spends its 127 steps on the largest value; when
    that is hundreds of times the typical value, typical activations get only a few levels.
    """
    stats: dict[str, tuple[float, float]] = {}
    hooks = []
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear):
            def hook(_mod, args, name=name):
                x = args[0].float().abs()
                stats[name] = (x.max().item(), x.mean().item())
            hooks.append(module.register_forward_pre_hook(hook))
    try:
        ids = tokenizer(text, return_tensors="pt")["input_ids"][:, :max_tokens]
        model(ids)
    finally:
        for h in hooks:
            h.remove()
    return [{"layer input": n, "max |x|": mx, "mean |x|": mean, "max / mean": mx / mean,
             "int8 levels for a typical value": mean / (mx / 127)}
            for n, (mx, mean) in stats.items()]


__all__ = [
    "QUESTIONS", "heldout_texts", "perplexity", "chat_ids", "greedy_answers", "Agreement",
    "greedy_agreement", "forced_greedy_agreement", "linear_input_ranges",
]
