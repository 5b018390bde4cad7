"""Who runs this step, and with how many tokens: two schedulers over one set of queues.

``ContinuousScheduler``: continuous batching (Orca, vLLM). Every step, first keep the running
sequences going (decodes and unfinished prefill chunks), then admit waiting ones while the
token budget and the sequence cap allow. A long prompt is split into chunks so one arrival
cannot stall everybody's next token (chunked prefill). When the KV pool runs dry, the most
recently admitted sequence is *preempted by recompute*: its blocks are freed and it goes back
to the head of the queue, to be prefilled again (prompt + what it had generated) later.

``StaticScheduler``, the comparison mode: a batch is admitted only when the previous one has
completely finished, and prompts are prefilled whole. Short answers leave their seats empty
until the longest one in the batch is done.

``make_scheduler(config, block_manager, ...)`` picks one from ``EngineConfig.scheduler``.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from mini_engine.block_manager import BlockManager
from mini_engine.config import EngineConfig
from mini_engine.sequence import SeqStatus, Sequence


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
    """The queues and what both policies share: admission of one sequence, preemption by
    recompute, retirement, and lookahead slots for speculative drafts.

    Contract (both policies): ``schedule()`` returns sequences whose blocks already cover
    every token it asks to compute (lookahead included); at most ``max_num_seqs`` run.
    Waiting sequences are served first come, first served; a preempted one goes back to the
    front."""

    def __init__(self, block_manager: BlockManager, *, max_num_seqs: int = 64,
                 num_lookahead: int = 0, max_model_len: int = 2048):
        self.bm = block_manager
        self.max_num_seqs = max_num_seqs
        self.num_lookahead = num_lookahead
        self.max_model_len = max_model_len
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0

    def schedule(self) -> SchedulerOutput:
        raise NotImplementedError

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
        # drafts are verified against the raw argmax: a bias or penalty must not speculate
        if not self.num_lookahead or not seq.params.plain_greedy or seq.is_prefilling:
            return 0
        room = min(seq.params.max_tokens - seq.num_output_tokens,
                   self.max_model_len - seq.num_tokens) - 1
        return max(0, min(self.num_lookahead, room))

    def _preempt(self, out: SchedulerOutput) -> Sequence:
        victim = self.running.pop()
        self.bm.free(victim)
        victim.num_computed_tokens = 0
        victim.status = SeqStatus.WAITING
        victim.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(victim)
        out.preempted.append(victim)
        return victim

    def _schedule_running(self, out: SchedulerOutput, budget: float, chunked: bool) -> float:
        """Keep the running sequences going (they already hold memory), preempting the most
        recently admitted ones while blocks are short. Returns the budget left."""
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            n = seq.num_uncomputed
            if chunked:
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
        return budget

    def _admit(self, out: SchedulerOutput, budget: float, chunked: bool) -> None:
        """Admit waiting sequences, first come first served, while the budget, the sequence
        cap and the free blocks allow (prefix-cache hits count as computed)."""
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            hit = self.bm.match_prefix(seq)
            n = seq.num_uncomputed
            if chunked:
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


class ContinuousScheduler(Scheduler):
    """Every step: running sequences first, then admissions, all under a token budget of
    ``max_num_batched_tokens``, which the scheduled tokens (lookahead included) never
    exceed. With ``chunked_prefill`` a prompt larger than the budget left is split."""

    def __init__(self, block_manager: BlockManager, *, max_num_batched_tokens: int = 512,
                 chunked_prefill: bool = True, **kw):
        super().__init__(block_manager, **kw)
        self.max_num_batched_tokens = max_num_batched_tokens
        self.chunked_prefill = chunked_prefill

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self._schedule_running(out, self.max_num_batched_tokens, self.chunked_prefill)
        if not out.preempted:       # a step that had to preempt admits nobody: memory is short
            self._admit(out, budget, self.chunked_prefill)
        return out


class StaticScheduler(Scheduler):
    """A batch of up to ``max_num_seqs`` is admitted only when the previous batch has
    completely finished; prompts are prefilled whole, with no token budget."""

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        self._schedule_running(out, float("inf"), chunked=False)
        if not self.running and not out.preempted:
            self._admit(out, float("inf"), chunked=False)
        return out


def make_scheduler(config: EngineConfig, block_manager: BlockManager, *, num_lookahead: int = 0,
                   max_model_len: int | None = None) -> Scheduler:
    common = dict(max_num_seqs=config.max_num_seqs, num_lookahead=num_lookahead,
                  max_model_len=max_model_len or config.max_model_len)
    if config.scheduler == "continuous":
        return ContinuousScheduler(block_manager, chunked_prefill=config.chunked_prefill,
                                   max_num_batched_tokens=config.max_num_batched_tokens, **common)
    if config.scheduler == "static":
        return StaticScheduler(block_manager, **common)
    raise ValueError(f"unknown scheduling policy {config.scheduler!r}: continuous | static")
