"""Speculative decoding: guess a few tokens cheaply, check them all in one forward.

The target model scores ``[last token, d1 .. dk]`` in one pass (``k + 1`` logit rows). With
greedy decoding a draft token is accepted exactly when it equals the target's argmax at
its position, so the output is *identical* to plain decoding; each step emits the accepted
drafts plus one token from the target (a correction, or a bonus if all were accepted).
Only greedy requests speculate here; sampled ones decode normally.

Two proposers:

* ``NgramProposer`` (prompt lookup): find the latest earlier occurrence of the last ``n``
  tokens and propose what followed it. Free, and good when answers quote the prompt.
* ``SelfDraftProposer``: the model's first ``draft_layers`` layers plus its own final norm
  and LM head (LayerSkip-style). Its KV for those layers is exactly the target's, so it
  reads and writes the same paged cache; the verify pass then overwrites the draft
  positions with full-model KV.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from mini_engine.attention_metadata import Chunk
from mini_engine.model_runner import ModelRunner
from mini_engine.sequence import Sequence


@dataclass
class SpecStats:
    num_drafts: int = 0              # (sequence, step) pairs that proposed at least one token
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_position: list[int] = field(default_factory=list)

    def record(self, proposed: int, accepted: int) -> None:
        if proposed == 0:
            return
        self.num_drafts += 1
        self.num_draft_tokens += proposed
        self.num_accepted_tokens += accepted
        while len(self.accepted_per_position) < proposed:
            self.accepted_per_position.append(0)
        for i in range(accepted):
            self.accepted_per_position[i] += 1

    @property
    def acceptance_rate(self) -> float:
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0


def accept_greedy(drafts: list[int], target_argmax: list[int]) -> list[int]:
    """Tokens to emit: the longest prefix of ``drafts`` that matches the target, then the
    target's own token at the first mismatch (or after the last draft)."""
    a = 0
    while a < len(drafts) and drafts[a] == target_argmax[a]:
        a += 1
    return target_argmax[:a + 1]


class NgramProposer:
    def __init__(self, max_n: int = 3, min_n: int = 1):
        self.max_n, self.min_n = max_n, min_n

    def propose_one(self, tokens: list[int], k: int) -> list[int]:
        arr = np.asarray(tokens, dtype=np.int64)
        for n in range(min(self.max_n, len(arr) - 1), self.min_n - 1, -1):
            suffix = arr[-n:]
            windows = np.lib.stride_tricks.sliding_window_view(arr[:-1], n)
            hits = np.flatnonzero((windows == suffix).all(axis=1))
            if hits.size:
                j = int(hits[-1]) + n           # most recent occurrence wins
                return arr[j:j + k].tolist()
        return []

    def propose(self, seqs: list[Sequence], ks: list[int]) -> list[list[int]]:
        return [self.propose_one(s.token_ids, k) if k else [] for s, k in zip(seqs, ks)]


class SelfDraftProposer:
    def __init__(self, runner: ModelRunner, draft_layers: int = 8):
        if not 0 < draft_layers < runner.cfg.num_layers:
            raise ValueError(f"draft_layers must be in 1..{runner.cfg.num_layers - 1}")
        self.runner, self.draft_layers = runner, draft_layers

    def propose(self, seqs: list[Sequence], ks: list[int]) -> list[list[int]]:
        drafts: list[list[int]] = [[] for _ in seqs]
        live = [i for i, k in enumerate(ks) if k > 0]
        for step in range(max(ks, default=0)):
            live = [i for i in live if ks[i] > step]
            if not live:
                break
            chunks = []
            for i in live:
                s = seqs[i]
                last = s.token_ids[-1] if step == 0 else drafts[i][-1]
                chunks.append(Chunk(s.block_table, s.num_computed_tokens + step, [last], 1))
            logits = self.runner.forward(chunks, num_layers=self.draft_layers)
            for i, t in zip(live, logits.argmax(-1).tolist()):
                drafts[i].append(t)
        return drafts
