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

    @property
    def greedy(self) -> bool:
        return self.temperature < SAMPLING_EPS


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
        self.num_cached_tokens = 0       # prompt tokens served by the prefix cache (first admission)
        self.status = SeqStatus.WAITING
        self.finish_reason: str | None = None
        self.logprobs: list = []         # TokenLogprob-like tuples, one per output token
        self.num_preemptions = 0
        self.num_blocks_offered = 0     # full blocks offered to the prefix cache (block manager)
        self.arrival_time = time.perf_counter()
        self.generator: torch.Generator | None = None
        if params.seed is not None:
            self.generator = torch.Generator().manual_seed(params.seed)

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
        if not p.ignore_eos and token_id in p.stop_token_ids:
            self.finish_reason = "stop"
        elif self.num_output_tokens >= p.max_tokens or self.num_tokens >= max_model_len:
            self.finish_reason = "length"
        return self.finish_reason is not None

    def __repr__(self) -> str:
        return (f"Sequence(id={self.seq_id}, status={self.status.value}, tokens={self.num_tokens}, "
                f"computed={self.num_computed_tokens}, blocks={self.block_table})")
