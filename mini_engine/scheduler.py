"""Who runs this step, and with how many tokens.

Continuous batching (Orca, vLLM): every step, first keep the running sequences going
(decodes and unfinished prefill chunks), then admit waiting ones while the token budget and
the sequence cap allow. A long prompt is split into chunks so one arrival cannot stall
everybody's next token (chunked prefill). When the KV pool runs dry, the most recently
admitted sequence is *preempted by recompute*: its blocks are freed and it goes back to the
head of the queue, to be prefilled again (prompt + what it had generated) later.

Static batching, the comparison mode: a batch is admitted only when the previous one has
completely finished, and prompts are prefilled whole. Short answers leave their seats empty
until the longest one in the batch is done.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from mini_engine.block_manager import BlockManager
from mini_engine.sequence import Sequence, SeqStatus


@dataclass
class ScheduledSeq:
    seq: Sequence
    num_tokens: int          # known tokens to compute: [num_computed, num_computed + num_tokens)
    lookahead: int = 0       # extra slots reserved for speculative draft tokens


@dataclass
class SchedulerOutput:
    scheduled: list[ScheduledSeq] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)

    @property
    def num_batched_tokens(self) -> int:
        return sum(s.num_tokens + s.lookahead for s in self.scheduled)


class Scheduler:
    """Contract: ``schedule()`` returns sequences whose blocks already cover every token
    it asks to compute (lookahead included); the total of those tokens never exceeds
    ``max_num_batched_tokens`` (continuous mode), and at most ``max_num_seqs`` run.
    Waiting sequences are served first come, first served; a preempted one goes back to
    the front."""

    def __init__(self, block_manager: BlockManager, *, max_num_seqs: int = 64,
                 max_num_batched_tokens: int = 512, policy: str = "continuous",
                 chunked_prefill: bool = True, num_lookahead: int = 0,
                 max_model_len: int = 2048):
        if policy not in ("continuous", "static"):
            raise ValueError(f"unknown scheduling policy {policy!r}")
        self.bm = block_manager
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.policy = policy
        self.chunked_prefill = chunked_prefill and policy == "continuous"
        self.num_lookahead = num_lookahead
        self.max_model_len = max_model_len
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def finish(self, seq: Sequence) -> None:
        """Take a finished or aborted sequence out and give its blocks back."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.bm.free(seq)
        seq.status = SeqStatus.FINISHED

    def _lookahead(self, seq: Sequence) -> int:
        if not self.num_lookahead or not seq.params.greedy or seq.is_prefilling:
            return 0
        room = min(seq.params.max_tokens - seq.num_output_tokens,
                   self.max_model_len - seq.num_tokens) - 1
        return max(0, min(self.num_lookahead, room))

    def _preempt(self, out: SchedulerOutput) -> Sequence:
        victim = self.running.pop()
        self.bm.free(victim)
        victim.num_computed_tokens = 0
        victim.num_blocks_offered = 0
        victim.status = SeqStatus.WAITING
        victim.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(victim)
        out.preempted.append(victim)
        return victim

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        static = self.policy == "static"
        budget = float("inf") if static else self.max_num_batched_tokens

        # 1. Running sequences first: they already hold memory.
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            n = seq.num_uncomputed
            if self.chunked_prefill:
                n = min(n, budget)
            look = min(self._lookahead(seq), max(0, budget - n))
            while not self.bm.allocate(seq, seq.num_computed_tokens + n + look):
                if self._preempt(out) is seq:
                    break
            if seq.status is SeqStatus.WAITING:
                break                       # it was the last one and got preempted itself
            out.scheduled.append(ScheduledSeq(seq, n, look))
            budget -= n + look
            i += 1

        # 2. Admit waiting sequences (not in a step that had to preempt: memory is short).
        if out.preempted or (static and self.running):
            return out
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            hit = self.bm.match_prefix(seq)
            n = seq.num_uncomputed
            if self.chunked_prefill:
                n = min(n, budget)
            elif n > budget and out.scheduled:
                self.bm.free(seq)
                seq.num_computed_tokens = 0
                break
            if not self.bm.allocate(seq, seq.num_computed_tokens + n):
                self.bm.free(seq)
                seq.num_computed_tokens = 0
                break
            self.waiting.popleft()
            self.bm.count_prefix_query(seq, hit)
            if seq.num_preemptions == 0:
                seq.num_cached_tokens = hit
            seq.status = SeqStatus.RUNNING
            self.running.append(seq)
            out.scheduled.append(ScheduledSeq(seq, n))
            budget -= n
        return out
