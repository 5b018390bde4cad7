"""A request as the engine sees it: token ids, how far the KV cache has caught up, and the
blocks that hold that KV.

The one number to understand is ``num_computed_tokens``: tokens ``[0, num_computed_tokens)``
have their keys/values written into the paged cache. Everything the scheduler does is move
that number forward (prefill chunks, decode steps, accepted draft tokens) or back to zero
(preemption by recompute).
"""

from __future__ import annotations

import enum
import itertools
import time
from dataclasses import dataclass, field

import torch

from mini_engine.grammar import Grammar, advance

SAMPLING_EPS = 1e-5   # vLLM's: a temperature below it is greedy (dividing by it would overflow)


@dataclass
class SamplingParams:
    """How to pick tokens. ``temperature < SAMPLING_EPS`` is greedy (0, the default here, so
    offline runs are reproducible). ``ignore_eos`` disables every stop token, as the server's
    adapter expects."""

    max_tokens: int = 16
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    ignore_eos: bool = False
    stop_token_ids: list[int] = field(default_factory=list)
    logprobs: int | None = None     # None: none; k >= 0: chosen token plus top k
    # vLLM's meanings, applied by mini_engine.sampler (its docstring has the order)
    top_k: int = 0                  # keep the k most likely tokens; 0 or -1: all
    min_p: float = 0.0              # drop tokens less likely than min_p x the most likely
    presence_penalty: float = 0.0   # subtracted once from every token already output
    frequency_penalty: float = 0.0  # subtracted per occurrence in the output so far
    repetition_penalty: float = 1.0  # divides (positive) logits of prompt and output tokens
    logit_bias: dict[int, float] = field(default_factory=dict)   # token id -> added to its logit
    grammar: Grammar | None = None  # structured output (mini_engine.grammar): masks the logits
    # Not sampling but the request's prefix-cache namespace (vLLM keeps it on the request): only
    # requests with the same salt share cached blocks; None is the shared one.
    cache_salt: str | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature < SAMPLING_EPS

    @property
    def penalized(self) -> bool:
        return self.presence_penalty != 0.0 or self.frequency_penalty != 0.0 or \
            self.repetition_penalty != 1.0

    @property
    def changes_logits(self) -> bool:
        """A bias, a penalty or a grammar moves the model's logits, so even greedy may pick
        another token."""
        return bool(self.logit_bias) or self.penalized or self.grammar is not None

    @property
    def plain_greedy(self) -> bool:
        """The token is the argmax of the model's own logits: the batched argmax gives it, and
        speculative drafts can be verified against that argmax."""
        return self.greedy and not self.changes_logits

    def validate(self, vocab_size: int) -> None:
        """ValueError naming the first parameter the engine cannot apply (the server refuses
        these earlier, with a 400; this guards offline use)."""
        if self.top_k < -1:
            raise ValueError(f"top_k must be -1 or 0 (all tokens) or at least 1, got {self.top_k}")
        if not 0.0 <= self.min_p <= 1.0:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")
        if not self.repetition_penalty > 0.0:
            raise ValueError(f"repetition_penalty must be above 0, got {self.repetition_penalty}")
        bad = [t for t in self.logit_bias if not 0 <= t < vocab_size]
        if bad:
            raise ValueError(f"logit_bias token id {bad[0]} is outside the vocabulary "
                             f"[0, {vocab_size})")


class SeqStatus(enum.Enum):
    WAITING = "waiting"      # in the queue, owns no blocks (or only prefix-cache hits)
    RUNNING = "running"      # owns blocks, gets tokens computed every step it is scheduled
    FINISHED = "finished"


_ids = itertools.count()


class Sequence:
    """One prompt and its growing output. Mutated only by the engine thread."""

    def __init__(self, prompt_token_ids: list[int], params: SamplingParams,
                 request_id: str | None = None):
        if not prompt_token_ids:
            raise ValueError("empty prompt")
        self.seq_id = next(_ids)
        self.request_id = request_id if request_id is not None else str(self.seq_id)
        self.params = params
        self.token_ids: list[int] = list(prompt_token_ids)
        self.num_prompt_tokens = len(prompt_token_ids)
        self.num_computed_tokens = 0
        self.block_table: list[int] = []
        self.num_cached_tokens = 0  # prompt tokens served by the prefix cache (first admission)
        self.status = SeqStatus.WAITING
        self.finish_reason: str | None = None
        self.logprobs: list = []         # TokenLogprob-like tuples, one per output token
        self.num_preemptions = 0
        self.num_blocks_offered = 0     # full blocks offered to the prefix cache (block manager)
        self.arrival_time = time.perf_counter()
        self.generator: torch.Generator | None = None
        if params.seed is not None:
            self.generator = torch.Generator().manual_seed(params.seed)
        self.grammar = params.grammar.matcher() if params.grammar is not None else None

    @property
    def cache_salt(self) -> str | None:
        return self.params.cache_salt

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens:]

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def num_uncomputed(self) -> int:
        return len(self.token_ids) - self.num_computed_tokens

    @property
    def is_prefilling(self) -> bool:
        """More than the one freshly sampled token is missing from the cache."""
        return self.num_uncomputed > 1

    @property
    def finished(self) -> bool:
        return self.status is SeqStatus.FINISHED

    def append_token(self, token_id: int, max_model_len: int) -> bool:
        """Add one generated token; set ``finish_reason`` and return True if it ends the
        sequence."""
        self.token_ids.append(token_id)
        p = self.params
        if self.grammar is not None and advance(self.grammar, token_id):
            self.finish_reason = "stop"        # the structured answer is complete
        elif not p.ignore_eos and token_id in p.stop_token_ids:
            self.finish_reason = "stop"
        elif self.num_output_tokens >= p.max_tokens or self.num_tokens >= max_model_len:
            self.finish_reason = "length"
        return self.finish_reason is not None

    def __repr__(self) -> str:
        return (f"Sequence(id={self.seq_id}, status={self.status.value}, tokens={self.num_tokens}, "
                f"computed={self.num_computed_tokens}, blocks={self.block_table})")
