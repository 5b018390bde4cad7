"""One quantized variant of a model, measured end to end: memory, quality and decode speed.

``evaluate_variant`` loads a fresh bf16 copy, applies a scheme from ``quantization``, and
measures it with ``model_quality`` and ``model_memory``; ``decode_tokens_per_s`` times greedy
generation in this process, ``SPEED_REPEATS`` times per variant, and ``speed_verdict`` compares
two variants' speeds only beyond the spread of those repeats.
"""

from __future__ import annotations

import statistics
import time
from typing import Callable, Sequence

import torch
from torch import nn

from workshop.precision.model_quality import (
    QUESTIONS,
    forced_greedy_agreement,
    greedy_answers,
    perplexity,
)
from workshop.sizing.model_memory import release_memory, rss_bytes, state_dict_bytes
from workshop.timing import best_time_s


@torch.inference_mode()
def decode_tokens_per_s(model: nn.Module, tokenizer, prompt: str = QUESTIONS[0],
                        new_tokens: int = 32) -> float:
    """Greedy generation speed at batch 1, prefill excluded: (n - 1) tokens / time after the
    first."""
    ids = tokenizer(prompt, return_tensors="pt")["input_ids"]
    kwargs = dict(do_sample=False, attention_mask=torch.ones_like(ids),
                  pad_token_id=tokenizer.eos_token_id)
    # The 1-token run, the one to subtract, as the best of two: on a shared machine a single
    # disturbed run could swallow the difference (seen: 3e+09 tok/s). If it still does, the
    # speed was not measured (nan), not infinite.
    first = best_time_s(lambda: model.generate(ids, max_new_tokens=1, min_new_tokens=1, **kwargs),
                        repeats=2)
    t0 = time.perf_counter()           # already warm: best_time_s warmed up the 1-token run
    model.generate(ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens, **kwargs)
    total = time.perf_counter() - t0
    return (new_tokens - 1) / (total - first) if total > first else float("nan")


SPEED_REPEATS = 3      # decode timings per variant: their spread is this run's noise


def decode_speed_runs(model: nn.Module, tokenizer, new_tokens: int = 32,
                      repeats: int = SPEED_REPEATS) -> list[float]:
    """``decode_tokens_per_s`` ``repeats`` times; the runs that measured a speed (no nan)."""
    runs = [decode_tokens_per_s(model, tokenizer, new_tokens=new_tokens) for _ in range(repeats)]
    return [r for r in runs if r == r]


def speed_verdict(row: dict, reference: dict) -> str:
    """How ``row``'s decode speed compares with ``reference``'s, from their repeated runs:
    "faster" or "slower" only when the ranges (min to max) do not overlap, "within the spread"
    when they do, "not measured" when either has fewer than two runs."""
    if row.get("speed runs", 0) < 2 or reference.get("speed runs", 0) < 2:
        return "not measured"
    if row["decode tok/s (min)"] > reference["decode tok/s (max)"]:
        return "faster"
    if row["decode tok/s (max)"] < reference["decode tok/s (min)"]:
        return "slower"
    return "within the spread"


def load_bf16(path: str) -> nn.Module:
    """The model in bf16, copied out of the memory-mapped checkpoint.

    ``from_pretrained`` may leave tensors as views of the mapped file; the mapping then stays
    (and counts in RSS) as long as any one of them lives, so replacing layers by quantized ones
    would not visibly free anything. Owning copies make RSS tell the truth.
    """
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).eval()
    with torch.no_grad():
        for p in model.parameters():          # shared (tied) parameters appear once
            p.data = p.data.clone()
    return model


def evaluate_variant(name: str, make: Callable[[nn.Module], nn.Module], path: str, tokenizer,
                     texts: Sequence[str], questions: Sequence[str],
                     reference: Sequence[Sequence[int]] | None = None, max_tokens: int = 2048,
                     new_tokens: int = 24, speed_tokens: int = 32) -> tuple[dict, list[list[int]]]:
    """Load a fresh bf16 model, apply ``make``, measure, free it, and prove it was freed.

    ``reference`` are the reference model's greedy answers; when None (the reference itself)
    they are generated here. Agreement is then measured by ``forced_greedy_agreement`` for
    every variant, the reference included (its row shows the noise floor of comparing a full
    forward pass with step-by-step decoding). Returns the row and the reference answers.
    RSS is this process's resident memory: measured before loading, with the variant loaded
    and used once, and after ``del`` + ``release_memory``; the last should return to about
    the first.
    """
    release_memory()
    rss_before = rss_bytes()
    model = make(load_bf16(path))
    weights = state_dict_bytes(model)
    ppl = perplexity(model, tokenizer, texts, max_tokens=max_tokens)
    # Measured after a forward pass: weights loaded from a memory-mapped file only count
    # towards RSS once they have been touched.
    release_memory()
    rss_loaded = rss_bytes()
    if reference is None:
        reference = greedy_answers(model, tokenizer, questions, new_tokens)
    agreement = forced_greedy_agreement(model, tokenizer, questions, reference)
    speeds = decode_speed_runs(model, tokenizer, new_tokens=speed_tokens)
    del model
    release_memory()
    rss_after = rss_bytes()
    return {
        "variant": name,
        "weights (MiB)": weights / 2**20,
        "RSS in use (MiB, +)": (rss_loaded - rss_before) / 2**20,
        "RSS after free (MiB, +)": (rss_after - rss_before) / 2**20,
        "perplexity": ppl,
        "answers identical": f"{agreement.exact:.0%}",
        "tokens before divergence": f"{agreement.prefix:.0%}",
        "decode tok/s (batch 1)": statistics.median(speeds) if speeds else float("nan"),
        "decode tok/s (min)": min(speeds, default=float("nan")),
        "decode tok/s (max)": max(speeds, default=float("nan")),
        "speed runs": len(speeds),
    }, [list(a) for a in reference]


__all__ = [
    "decode_tokens_per_s", "decode_speed_runs", "speed_verdict", "SPEED_REPEATS", "load_bf16",
    "evaluate_variant",
]
