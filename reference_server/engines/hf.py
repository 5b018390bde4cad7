"""The naive baseline: Hugging Face ``transformers``, one request at a time.

This is what "just call the model" looks like when put behind an API: requests queue behind
a lock, each runs alone from prefill to last token, nothing is shared between them. It does
use the model's KV cache (a decode step feeds only the newest token), so what the course
measures against vLLM is batching and scheduling, not a strawman that recomputes the prompt.
"""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import AsyncIterator, Callable

from mini_engine.grammar import advance
from mini_engine.sampler import Row, logprob_of, sample
from reference_server import dtypes
from reference_server.config import ServerConfig
from reference_server.engines.base import EngineInfo
from reference_server.engines.local import (
    EngineStats,
    GenerationStep,
    LocalEngine,
    SamplingParams,
    torch_thread,
)
from reference_server.kv import kv_bytes_per_token
from reference_server.model_config import read_arch
from reference_server.models import ModelSpec


class HFEngine(LocalEngine):
    name = "hf"

    def __init__(self, config: ServerConfig, model: ModelSpec) -> None:
        super().__init__(config, model)
        self.dtype = dtypes.cpu_compute_dtype(config.dtype, self.device)
        self._lock = asyncio.Lock()       # the whole point: one request at a time
        self._waiting = 0
        self._running = 0
        self._kv_tokens = 0
        self.model = None
        self._torch: ThreadPoolExecutor | None = None    # loads, then runs every request

    @property
    def ready(self) -> bool:
        return self._ready

    async def start(self) -> None:
        self._torch = torch_thread("hf-engine")
        await asyncio.get_running_loop().run_in_executor(self._torch, self._load)
        self.metrics.set_model_name(self.model_name)
        self._ready = True

    def _load(self) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(self.spec.path)
        self.model = AutoModelForCausalLM.from_pretrained(
            self.spec.path, dtype=getattr(torch,
                                          dtypes.canonical(self.dtype))).to(self.device).eval()
        limit = getattr(self.model.config, "max_position_embeddings", None)
        if limit:
            self.max_model_len = min(self.max_model_len, limit)
        self.vocab_size = self.model.get_input_embeddings().num_embeddings

    async def stop(self) -> None:
        self._ready = False
        self.model = None
        if self._torch is not None:
            self._torch.shutdown(wait=False)
            self._torch = None

    def info(self) -> EngineInfo:
        return EngineInfo(
            engine="hf", engine_version=_version("transformers"), model=self.model_name,
            model_path=self.spec.path, dtype=self.dtype, device=self.device,
            max_model_len=self.max_model_len,
            # one sequence at a time, grown on demand: its capacity is one context window
            kv_capacity_tokens=self.max_model_len,
            kv_bytes_per_token=int(kv_bytes_per_token(read_arch(self.model.config.to_dict()),
                                                      self.dtype)),
            block_size=None, prefix_caching=False, compiled=False,
            attention=getattr(self.model.config, "_attn_implementation", None),
            extra={"concurrency": 1})

    def stats(self) -> EngineStats:
        return EngineStats(num_running=self._running, num_waiting=self._waiting,
                           kv_cache_usage=self._kv_tokens / self.max_model_len)

    async def reset_prefix_cache(self) -> bool:
        return False

    async def generate(self, request_id: str, prompt_token_ids: list[int],
                       params: SamplingParams) -> AsyncIterator[GenerationStep]:
        # params.cache_salt is accepted and needs nothing: no prefix cache, nothing is shared
        self._waiting += 1
        try:
            await self._lock.acquire()
        finally:
            self._waiting -= 1
        self._running = 1
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()
        cancel = threading.Event()

        def put(item) -> None:
            loop.call_soon_threadsafe(queue.put_nowait, item)

        def release(_) -> None:
            self._running = 0
            self._lock.release()

        work = loop.run_in_executor(self._torch, self._decode, prompt_token_ids, params, put,
                                    cancel)
        # The lock is released when the decode thread has really stopped, not when the
        # client leaves: a cancelled request must not overlap with the next one.
        work.add_done_callback(release)
        try:
            while True:
                item = await queue.get()
                if isinstance(item, BaseException):
                    raise item
                yield item
                if item.finish_reason:
                    break
        finally:
            cancel.set()   # no await here: a cancelled task is re-cancelled at every await

    def _decode(self, prompt: list[int], params: SamplingParams,
                put: Callable[[object], None], cancel: threading.Event) -> None:
        import torch

        try:
            gen = torch.Generator(device=self.device)
            if params.seed is not None:
                gen.manual_seed(params.seed)
            else:
                gen.seed()
            stop = set(params.stop_token_ids)
            grammar = params.grammar.matcher() if params.grammar is not None else None
            history = Row(params, gen, list(prompt), len(prompt), grammar)  # penalties count it
            with torch.inference_mode():
                out = self.model(input_ids=torch.tensor([prompt], device=self.device),
                                 use_cache=True)
                self._kv_tokens = len(prompt)
                for i in range(params.max_tokens):
                    if cancel.is_set():
                        return
                    logits = out.logits[0, -1].float()
                    token = sample(logits.unsqueeze(0), [history])[0]
                    history.token_ids.append(token)
                    done = grammar is not None and advance(grammar, token)
                    finish = ("stop" if done or token in stop else
                              "length" if i + 1 == params.max_tokens else None)
                    lps = (None if params.logprobs is None else
                           [logprob_of(logits, token, params.logprobs)])
                    put(GenerationStep([token], lps, finish))
                    if finish:
                        return
                    out = self.model(input_ids=torch.tensor([[token]], device=self.device),
                                     past_key_values=out.past_key_values, use_cache=True)
                    self._kv_tokens += 1
        except Exception as exc:  # fails this request (a 500), never the engine
            put(exc)
        finally:
            self._kv_tokens = 0


def _version(dist: str) -> str:
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version(dist)
    except PackageNotFoundError:
        return "unknown"
