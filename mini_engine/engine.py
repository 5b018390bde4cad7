"""``LLMEngine``: the step loop that ties scheduler, model runner, sampler, prefix cache and
speculative decoding together.

``step()`` is schedule -> run -> postprocess: the scheduler picks sequences and token counts
(``scheduler.py``), a proposer may add draft tokens (``spec_decode.py``), one forward runs
every new token of every scheduled sequence (``model_runner.py``), and ``_postprocess`` turns
the logits into tokens, one sequence at a time, in named parts: spec verification, sampling
(one batched call for every row that is not plain greedy), appending and finishing,
logprobs, prefix-cache offers, then one ``StepRecord`` for the step.

Contract: one request never harms another. ``add_request`` rejects what cannot run
(ValueError: empty prompt, token ids outside the vocabulary, too long for the model or the
pool); if post-processing one sequence raises, that sequence alone finishes with
``finish_reason="error"`` and ``RequestOutput.error`` set, its blocks are freed and the others
go on. Synchronous and single-threaded; the server runs it in a background thread.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections import deque
from dataclasses import asdict, dataclass
from typing import Iterable

import torch

from mini_engine.attention_metadata import Chunk
from mini_engine.block_manager import BlockManager
from mini_engine.config import EngineConfig
from mini_engine.model_runner import ModelRunner
from mini_engine.prefix_cache import make_prefix_cache
from mini_engine.sampler import TokenLogprob, logprob_of, sample
from mini_engine.scheduler import ScheduledSeq, SchedulerOutput, make_scheduler
from mini_engine.sequence import SamplingParams, SeqStatus, Sequence
from mini_engine.spec_decode import NgramProposer, SelfDraftProposer, SpecStats, accept_greedy

__all__ = ["EngineConfig", "LLMEngine", "RequestOutput", "StepRecord"]

log = logging.getLogger("mini_engine")


@dataclass
class RequestOutput:
    """What one step produced for one request."""
    request_id: str
    new_token_ids: list[int]
    logprobs: list[TokenLogprob] | None
    finish_reason: str | None
    cached_tokens: int
    error: str | None = None        # set with finish_reason "error": why this request failed


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
        self.config = cfg = dataclasses.replace(config or EngineConfig(), **overrides)
        cfg.validate()
        self.runner = ModelRunner(model_path, cfg)
        self.max_model_len = min(cfg.max_model_len, self.runner.cfg.max_position_embeddings)
        self.block_manager = BlockManager(self.runner.num_blocks, cfg.block_size,
                                          mode=cfg.kv_layout, max_model_len=self.max_model_len,
                                          block_order=cfg.block_order)
        self.block_manager.prefix_cache = make_prefix_cache(
            cfg.prefix_cache, self.block_manager.allocator, cfg.block_size)
        self.proposer = None
        if cfg.spec == "ngram":
            self.proposer = NgramProposer(max_n=cfg.ngram_max)
        elif cfg.spec == "self":
            self.proposer = SelfDraftProposer(self.runner, cfg.draft_layers)
        self.scheduler = make_scheduler(cfg, self.block_manager, max_model_len=self.max_model_len,
                                        num_lookahead=cfg.num_spec_tokens if self.proposer else 0)
        self.spec_stats = SpecStats()
        self.requests: dict[str, Sequence] = {}
        self.history: deque[StepRecord] = deque(maxlen=cfg.history)
        self.num_steps = 0
        self.num_generated = 0

    # -- requests ------------------------------------------------------------------------

    def add_request(self, prompt_token_ids: list[int], params: SamplingParams | None = None,
                    request_id: str | None = None) -> Sequence:
        params = params or SamplingParams()
        if not prompt_token_ids:
            raise ValueError("empty prompt")
        vocab = self.runner.cfg.vocab_size
        lo, hi = min(prompt_token_ids), max(prompt_token_ids)
        if lo < 0 or hi >= vocab:
            raise ValueError(f"prompt token id {lo if lo < 0 else hi} is outside the "
                             f"vocabulary [0, {vocab})")
        params.validate(vocab)
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

    # -- live migration: a running request's state out of one engine and into another ----

    def export_kv(self, request_id: str) -> tuple[list[int], list[list[torch.Tensor]]]:
        """What another engine needs to continue ``request_id`` without recomputing: its
        token ids and the KV of its computed tokens (per layer, the layout's entries, slot
        axis in token order). Read-only: the request keeps running here."""
        seq = self.requests[request_id]
        cache = self.runner.kv_cache
        slots = self._slots(seq, seq.num_computed_tokens)
        return list(seq.token_ids), [cache.read(layer, slots) for layer in range(len(cache.layers))]

    def _slots(self, seq: Sequence, n: int) -> torch.Tensor:
        """The pool slots of ``seq``'s first ``n`` tokens (block_manager.py's formula)."""
        bs = self.block_manager.block_size
        return torch.tensor([seq.block_table[i // bs] * bs + i % bs for i in range(n)],
                            dtype=torch.long, device=self.runner.kv_cache.layers[0][0].device)

    def add_request_with_kv(self, token_ids: list[int], kv: list[list[torch.Tensor]],
                            params: SamplingParams | None = None,
                            request_id: str | None = None) -> Sequence:
        """``add_request`` for a request migrated here with its KV cache (``export_kv`` of
        another engine with the same model, layout and dtype): the KV of the first
        ``len(kv[0][0])`` tokens is written into fresh blocks instead of being recomputed,
        and the request joins the running batch. At least the last token must lack KV (its
        logits give the next token). ``params.max_tokens`` counts from here."""
        seq = self.add_request(token_ids, params, request_id)
        cache = self.runner.kv_cache
        n = 0
        try:
            n = kv[0][0].shape[cache.layout.slot_axis(0)] if kv else 0
            if len(kv) != len(cache.layers) or not 0 <= n < len(token_ids):
                raise ValueError(f"KV for {n} tokens over {len(kv)} layers does not fit a "
                                 f"{len(token_ids)}-token request on {len(cache.layers)} layers")
            if len(self.scheduler.running) >= self.scheduler.max_num_seqs \
                    or not self.block_manager.allocate(seq, len(token_ids)):
                raise ValueError("no room for the migrated request (sequences or KV blocks)")
            slots = self._slots(seq, n)
            for layer, values in enumerate(kv):
                cache.write(layer, slots, *values)
        except Exception:
            self.abort(seq.request_id)
            raise
        self.scheduler.waiting.remove(seq)
        seq.num_computed_tokens = n
        seq.status = SeqStatus.RUNNING
        self.scheduler.running.append(seq)
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
        started = time.perf_counter()
        batch = self.scheduler.schedule()
        if not batch.scheduled:
            return []
        drafts = self._propose(batch)
        chunks = [self._chunk(s, d) for s, d in zip(batch.scheduled, drafts)]
        logits = self.runner.forward(chunks)
        return self._postprocess(batch, drafts, chunks, logits, started)

    def _propose(self, batch: SchedulerOutput) -> list[list[int]]:
        """Draft tokens per scheduled sequence (empty without speculative decoding)."""
        looks = [s.lookahead for s in batch.scheduled]
        if self.proposer is None or not any(looks):
            return [[] for _ in batch.scheduled]
        return self.proposer.propose([s.seq for s in batch.scheduled], looks)

    @staticmethod
    def _chunk(s: ScheduledSeq, drafts: list[int]) -> Chunk:
        """The tokens to compute for ``s``; logits are wanted once it reaches its last known
        token (for it and each draft)."""
        seq, start = s.seq, s.seq.num_computed_tokens
        completes = start + s.num_tokens == seq.num_tokens
        return Chunk(seq.block_table, start, seq.token_ids[start:start + s.num_tokens] + drafts,
                     1 + len(drafts) if completes else 0)

    # -- postprocess: from logits to outputs, one sequence at a time ----------------------

    def _postprocess(self, batch: SchedulerOutput, drafts: list[list[int]], chunks: list[Chunk],
                     logits: torch.Tensor, started: float) -> list[RequestOutput]:
        argmax = logits.argmax(-1).tolist()     # one batched argmax: greedy rows and verification
        sampled = self._sample(batch, drafts, chunks, logits)    # every other row, batched
        spec_before = (self.spec_stats.num_accepted_tokens, self.spec_stats.num_draft_tokens)
        outputs, record, row = [], [], 0
        for s, d, c in zip(batch.scheduled, drafts, chunks):
            seq = s.seq
            kind = "verify" if d else ("decode" if s.num_tokens == 1 and seq.num_output_tokens
                                       else "prefill")
            record.append((seq.request_id, len(c.token_ids), kind))
            seq.num_computed_tokens += s.num_tokens
            if c.num_logits == 0:               # a prefill chunk short of the prompt's end
                self.block_manager.cache_full_blocks(seq)
                continue
            rows, top = logits[row:row + c.num_logits], argmax[row:row + c.num_logits]
            row += c.num_logits
            try:
                new = self._verify(seq, d, top) if d else [sampled.get(seq.seq_id, top[0])]
                if isinstance(new[0], Exception):
                    raise new[0]
                outputs.append(self._emit(seq, new, rows))
            except Exception as exc:            # this request fails; the batch goes on
                outputs.append(self._fail(seq, exc))
        self._record(batch, record, started, spec_before)
        return outputs

    def _verify(self, seq: Sequence, drafts: list[int], target: list[int]) -> list[int]:
        """Speculative verification: accepted drafts plus the target's next token."""
        new = accept_greedy(drafts, target)
        seq.num_computed_tokens += len(new) - 1     # accepted drafts' KV is valid
        self.spec_stats.record(len(drafts), len(new) - 1)
        return new

    @staticmethod
    def _sample(batch: SchedulerOutput, drafts: list[list[int]], chunks: list[Chunk],
                logits: torch.Tensor) -> dict[int, int | Exception]:
        """Tokens (by ``seq_id``) of the sequences that need the sampler: those that end
        their chunk without drafts and are not plain greedy (that is the batched argmax).
        One batched call; if it raises, row by row, so only the culprit fails."""
        seqs, rows, row = [], [], 0
        for s, d, c in zip(batch.scheduled, drafts, chunks):
            if c.num_logits and not d and not s.seq.params.plain_greedy:
                seqs.append(s.seq)
                rows.append(row)
            row += c.num_logits
        if not seqs:
            return {}
        try:
            return dict(zip((q.seq_id for q in seqs), sample(logits[rows], seqs)))
        except Exception:
            out: dict[int, int | Exception] = {}
            for q, r in zip(seqs, rows):
                try:
                    out[q.seq_id] = sample(logits[r:r + 1], [q])[0]
                except Exception as exc:
                    out[q.seq_id] = exc
            return out

    def _emit(self, seq: Sequence, new: list[int], rows: torch.Tensor) -> RequestOutput:
        emitted = self._append(seq, new)
        lps = self._logprobs(seq, rows, emitted)
        self.num_generated += len(emitted)
        self.block_manager.cache_full_blocks(seq)          # prefix-cache offers
        if seq.finish_reason:
            self._retire(seq)
        return RequestOutput(seq.request_id, emitted, lps, seq.finish_reason,
                             seq.num_cached_tokens)

    def _append(self, seq: Sequence, new: list[int]) -> list[int]:
        """Append tokens until one finishes the sequence (stop token or length)."""
        for i, t in enumerate(new):
            if seq.append_token(t, self.max_model_len):
                return new[:i + 1]
        return new

    @staticmethod
    def _logprobs(seq: Sequence, rows: torch.Tensor,
                  tokens: list[int]) -> list[TokenLogprob] | None:
        k = seq.params.logprobs
        if k is None:
            return None
        lps = [logprob_of(rows[i], t, k) for i, t in enumerate(tokens)]
        seq.logprobs.extend(lps)
        return lps

    def _retire(self, seq: Sequence) -> None:
        self.scheduler.finish(seq)
        self.requests.pop(seq.request_id, None)

    def _fail(self, seq: Sequence, exc: Exception) -> RequestOutput:
        seq.finish_reason = "error"
        self._retire(seq)
        return RequestOutput(seq.request_id, [], None, "error", seq.num_cached_tokens,
                             error=f"{type(exc).__name__}: {exc}")

    def _record(self, batch: SchedulerOutput, record: list[tuple[str, int, str]],
                started: float, spec_before: tuple[int, int]) -> None:
        self.num_steps += 1
        bm = self.block_manager
        rec = StepRecord(
            self.num_steps, time.perf_counter() - started, record, batch.num_batched_tokens,
            [p.request_id for p in batch.preempted], bm.allocator.num_free, bm.num_used_blocks(),
            len(self.scheduler.waiting),
            self.spec_stats.num_accepted_tokens - spec_before[0],
            self.spec_stats.num_draft_tokens - spec_before[1])
        self.history.append(rec)
        if self.config.log_iteration_details:
            # vLLM's line (``--enable-logging-iteration-details``): a request still in its
            # prompt is a context request, decodes and verifications are generation ones.
            # Its time covers the forward pass and sampling, ours the whole step.
            ctx = [n for _, n, kind in record if kind == "prefill"]
            gen = [n for _, n, kind in record if kind != "prefill"]
            log.info("Iteration(%d): %d context requests, %d context tokens, %d generation "
                     "requests, %d generation tokens, iteration elapsed time: %.2f ms",
                     rec.step, len(ctx), sum(ctx), len(gen), sum(gen), rec.seconds * 1e3)

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
            "kv_bytes_per_token": self.runner.kv_bytes_per_token(),   # measured on the pool
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
