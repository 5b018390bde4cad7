"""``LLMEngine``: the step loop that ties scheduler, block manager, model runner, sampler,
prefix cache and speculative decoding together.

``step()`` is the whole engine in twenty lines: schedule, (draft), build chunks, one
forward, sample or verify, append tokens, cache full blocks, retire finished sequences.
It is synchronous and single-threaded; the server runs it in a background thread.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import asdict, dataclass
from typing import Iterable

import torch

from mini_engine.block_manager import BlockManager
from mini_engine.model_runner import Chunk, ModelRunner
from mini_engine.prefix_cache import make_prefix_cache
from mini_engine.sampler import TokenLogprob, logprob_of, sample_row
from mini_engine.scheduler import Scheduler
from mini_engine.sequence import SamplingParams, Sequence
from mini_engine.spec_decode import (NgramProposer, SelfDraftProposer, SpecStats,
                                     accept_greedy)

_DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
           "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}


@dataclass
class EngineConfig:
    """Every mechanism's switch. Defaults: the vLLM-like configuration."""
    dtype: str = "float32"                 # CPU: fp32 is exact vs HF and often faster than bf16
    device: str = "cpu"
    block_size: int = 16
    num_blocks: int | None = None          # default: from kv_cache_gib
    kv_cache_gib: float = 1.0
    max_model_len: int = 2048
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 512
    scheduler: str = "continuous"          # continuous | static
    chunked_prefill: bool = True
    kv_layout: str = "paged"               # paged | contiguous
    prefix_cache: str | None = None        # None | hash | radix
    spec: str | None = None                # None | ngram | self
    num_spec_tokens: int = 4
    draft_layers: int = 8
    ngram_max: int = 3
    attention: str = "gqa"                 # gqa | mqa | mla
    mla_rank: int = 64
    quant: str | None = None               # None | int8 | int4
    num_threads: int | None = None
    history: int = 2000                    # steps of introspection kept


@dataclass
class RequestOutput:
    """What one step produced for one request."""
    request_id: str
    new_token_ids: list[int]
    logprobs: list[TokenLogprob] | None
    finish_reason: str | None
    cached_tokens: int


@dataclass
class StepRecord:
    """One step, for pictures: who ran with how many tokens, and the memory afterwards."""
    step: int
    seconds: float
    scheduled: list[tuple[str, int, str]]   # (request id, tokens computed, prefill|decode|verify)
    num_batched_tokens: int
    preempted: list[str]
    free_blocks: int
    used_blocks: int
    num_waiting: int
    accepted: int = 0
    drafted: int = 0


class LLMEngine:
    def __init__(self, model_path: str, config: EngineConfig | None = None, **overrides):
        cfg = config or EngineConfig()
        for k, v in overrides.items():
            setattr(cfg, k, v)
        self.config = cfg
        if cfg.num_threads:
            torch.set_num_threads(cfg.num_threads)
        self.runner = ModelRunner(
            model_path, dtype=_DTYPES[cfg.dtype], device=cfg.device, block_size=cfg.block_size,
            num_blocks=cfg.num_blocks, kv_cache_bytes=int(cfg.kv_cache_gib * (1 << 30)),
            attention=cfg.attention, mla_rank=cfg.mla_rank, quant=cfg.quant)
        self.max_model_len = min(cfg.max_model_len, self.runner.cfg.max_position_embeddings)
        self.block_manager = BlockManager(self.runner.num_blocks, cfg.block_size,
                                          mode=cfg.kv_layout, max_model_len=self.max_model_len)
        self.block_manager.prefix_cache = make_prefix_cache(
            cfg.prefix_cache, self.block_manager.allocator, cfg.block_size)
        if cfg.kv_layout == "contiguous" and cfg.prefix_cache:
            raise ValueError("contiguous layout is the no-sharing baseline: no prefix cache")
        self.proposer = None
        if cfg.spec == "ngram":
            self.proposer = NgramProposer(max_n=cfg.ngram_max)
        elif cfg.spec == "self":
            self.proposer = SelfDraftProposer(self.runner, cfg.draft_layers)
        elif cfg.spec not in (None, "none"):
            raise ValueError(f"unknown speculative method {cfg.spec!r}: ngram | self")
        self.scheduler = Scheduler(
            self.block_manager, max_num_seqs=cfg.max_num_seqs,
            max_num_batched_tokens=cfg.max_num_batched_tokens, policy=cfg.scheduler,
            chunked_prefill=cfg.chunked_prefill,
            num_lookahead=cfg.num_spec_tokens if self.proposer else 0,
            max_model_len=self.max_model_len)
        self.spec_stats = SpecStats()
        self.requests: dict[str, Sequence] = {}
        self.history: deque[StepRecord] = deque(maxlen=cfg.history)
        self.num_steps = 0
        self.num_generated = 0

    # -- requests ------------------------------------------------------------------------

    def add_request(self, prompt_token_ids: list[int], params: SamplingParams | None = None,
                    request_id: str | None = None) -> Sequence:
        params = params or SamplingParams()
        if len(prompt_token_ids) >= self.max_model_len:
            raise ValueError(f"prompt of {len(prompt_token_ids)} tokens does not fit "
                             f"max_model_len={self.max_model_len}")
        need = self.block_manager.blocks_for(min(len(prompt_token_ids) + params.max_tokens,
                                                 self.max_model_len))
        if need > self.block_manager.num_blocks:
            raise ValueError(f"request needs {need} KV blocks; the pool has "
                             f"{self.block_manager.num_blocks}")
        seq = Sequence(prompt_token_ids, params, request_id)
        if seq.request_id in self.requests:
            raise ValueError(f"duplicate request id {seq.request_id!r}")
        self.requests[seq.request_id] = seq
        self.scheduler.add(seq)
        return seq

    def abort(self, request_id: str) -> bool:
        seq = self.requests.pop(request_id, None)
        if seq is None:
            return False
        self.scheduler.finish(seq)
        seq.finish_reason = seq.finish_reason or "abort"
        return True

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    # -- the step ------------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        t0 = time.perf_counter()
        sched = self.scheduler.schedule()
        if not sched.scheduled:
            return []
        seqs = [s.seq for s in sched.scheduled]
        drafts = [[] for _ in seqs]
        if self.proposer is not None and any(s.lookahead for s in sched.scheduled):
            drafts = self.proposer.propose(seqs, [s.lookahead for s in sched.scheduled])
        chunks = []
        for s, d in zip(sched.scheduled, drafts):
            seq, start = s.seq, s.seq.num_computed_tokens
            completes = start + s.num_tokens == seq.num_tokens
            chunks.append(Chunk(seq.block_table, start, seq.token_ids[start:start + s.num_tokens] + d,
                                1 + len(d) if completes else 0))
        logits = self.runner.forward(chunks)
        greedy = logits.argmax(-1).tolist()

        outputs, record = [], []
        row = 0
        accepted_total = drafted_total = 0
        for s, d, c in zip(sched.scheduled, drafts, chunks):
            seq = s.seq
            kind = "verify" if d else ("decode" if s.num_tokens == 1 and seq.num_output_tokens else "prefill")
            record.append((seq.request_id, len(c.token_ids), kind))
            seq.num_computed_tokens += s.num_tokens
            if c.num_logits == 0:
                self._cache_blocks(seq)
                continue
            rows = logits[row:row + c.num_logits]
            if d:
                new = accept_greedy(d, greedy[row:row + c.num_logits])
                seq.num_computed_tokens += len(new) - 1     # accepted drafts' KV is valid
                self.spec_stats.record(len(d), len(new) - 1)
                accepted_total += len(new) - 1
                drafted_total += len(d)
            elif seq.params.greedy:
                new = [greedy[row]]
            else:
                new = [sample_row(rows[0], seq.params, seq.generator)]
            row += c.num_logits
            emitted, lps = [], []
            for i, t in enumerate(new):
                emitted.append(t)
                if seq.params.logprobs is not None:
                    lps.append(logprob_of(rows[i], t, seq.params.logprobs))
                if seq.append_token(t, self.max_model_len):
                    break
            seq.logprobs.extend(lps)
            self.num_generated += len(emitted)
            self._cache_blocks(seq)
            if seq.finish_reason:
                self.scheduler.finish(seq)
                self.requests.pop(seq.request_id, None)
            outputs.append(RequestOutput(seq.request_id, emitted,
                                         lps if seq.params.logprobs is not None else None,
                                         seq.finish_reason, seq.num_cached_tokens))
        self.num_steps += 1
        bm = self.block_manager
        self.history.append(StepRecord(
            self.num_steps, time.perf_counter() - t0, record, sched.num_batched_tokens,
            [p.request_id for p in sched.preempted], bm.allocator.num_free, bm.num_used_blocks(),
            len(self.scheduler.waiting), accepted_total, drafted_total))
        return outputs

    def _cache_blocks(self, seq: Sequence) -> None:
        full = seq.num_computed_tokens // self.config.block_size
        if full > seq.num_blocks_offered:
            self.block_manager.cache_full_blocks(seq)
            seq.num_blocks_offered = full

    # -- offline use ---------------------------------------------------------------------

    def generate(self, prompts: Iterable[list[int]], params: SamplingParams | list[SamplingParams]
                 | None = None) -> list[list[int]]:
        """Run prompts to completion; return the generated token ids of each, in order."""
        prompts = list(prompts)
        plist = params if isinstance(params, list) else [params or SamplingParams()] * len(prompts)
        seqs = [self.add_request(p, sp) for p, sp in zip(prompts, plist)]
        while any(not s.finished for s in seqs):
            self.step()
        return [s.output_token_ids for s in seqs]

    def reset_prefix_cache(self) -> bool:
        pc = self.block_manager.prefix_cache
        if pc is None:
            return False
        pc.reset()
        return True

    # -- introspection -------------------------------------------------------------------

    def stats(self) -> dict:
        bm = self.block_manager
        pc = bm.prefix_cache
        return {
            "num_running": len(self.scheduler.running),
            "num_waiting": len(self.scheduler.waiting),
            "kv_cache_usage": bm.usage(),
            "num_blocks": bm.num_blocks,
            "free_blocks": bm.allocator.num_free,
            "cached_blocks": pc.num_cached_blocks() if pc is not None else 0,
            "prefix_cache_queries": bm.prefix_queries,
            "prefix_cache_hits": bm.prefix_hits,
            "num_preemptions": self.scheduler.num_preemptions,
            "fragmentation": bm.fragmentation(self.scheduler.running, bm.block_size),
            "spec": asdict(self.spec_stats) | {"acceptance_rate": self.spec_stats.acceptance_rate},
            "num_steps": self.num_steps,
            "num_generated_tokens": self.num_generated,
        }

    def snapshot(self) -> dict:
        """Block tables and memory right now, as plain data (for drawing the paged cache)."""
        bm = self.block_manager
        return {
            "block_size": bm.block_size,
            "num_blocks": bm.num_blocks,
            "free_blocks": bm.allocator.num_free,
            "ref_counts": list(bm.allocator.ref_count),
            "sequences": [{"request_id": s.request_id, "status": s.status.value,
                           "num_tokens": s.num_tokens, "num_computed": s.num_computed_tokens,
                           "block_table": list(s.block_table)}
                          for s in list(self.scheduler.running) + list(self.scheduler.waiting)],
            "radix_tree": bm.prefix_cache.dump() if hasattr(bm.prefix_cache, "dump") else None,
            **self.stats(),
        }
