"""In-process engines: they see token ids; this module speaks OpenAI for them.

A ``LocalEngine`` implements ``generate`` (prompt token ids in, a stream of new token ids
out), ``stats`` and the lifecycle methods. Everything OpenAI-shaped (chat templates, stop
strings, logprobs formatting, usage, ``n`` > 1, streaming chunks) and the vLLM-named
metrics are done here once, for every local engine.
"""

from __future__ import annotations

import abc
import asyncio
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any, AsyncIterator

# One sampler for every in-process engine: the teaching engine's parameters and logprob type
# (the HF baseline samples with mini_engine.sampler too), and its grammars.
from mini_engine.grammar import Grammar, GrammarCompiler, GrammarError
from mini_engine.sampler import TokenLogprob
from mini_engine.sequence import SamplingParams
from reference_server.config import ServerConfig
from reference_server.engines.base import Engine, EngineDied, EngineError, engine_fault
from reference_server.exported_metrics import EngineMetrics
from reference_server.models import ModelSpec
from reference_server.protocol import (
    AssistantMessage,
    ChatChoice,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatStreamChoice,
    CompletionChoice,
    CompletionChunk,
    CompletionRequest,
    CompletionResponse,
    DeltaMessage,
    Usage,
    unsupported_fields,
)

__all__ = ["EngineStats", "GenerationStep", "LocalEngine", "SamplingParams", "TokenLogprob",
           "torch_thread"]

# vLLM's _SAMPLING_EPS: a temperature below it is greedy (dividing logits by 1e-40 would
# give inf - inf = NaN probabilities).
SAMPLING_EPS = 1e-5


@dataclass
class GenerationStep:
    """New output of one request since the previous step.

    ``finish_reason`` is set on the last step only: ``"stop"`` (EOS or a stop token) or
    ``"length"`` (``max_tokens`` reached). ``cached_tokens`` (prompt tokens served from a
    prefix cache) is read from the first step.
    """

    token_ids: list[int]
    logprobs: list[TokenLogprob] | None = None
    finish_reason: str | None = None
    cached_tokens: int = 0


@dataclass
class EngineStats:
    """A snapshot for ``/metrics``; counters are totals since start."""

    num_running: int = 0
    num_waiting: int = 0
    kv_cache_usage: float = 0.0          # fraction 0..1 of KV capacity in use
    prefix_cache_queries: int = 0        # prompt tokens looked up in the prefix cache
    prefix_cache_hits: int = 0           # of those, tokens found
    num_preemptions: int = 0


def torch_thread(name: str) -> ThreadPoolExecutor:
    """The one thread an in-process engine runs all its PyTorch work in: loading the model and
    every step after it. The HF baseline uses this executor; the teaching engine's server
    does the same with a daemon thread of its own, which loads and then loops
    (``mini.MiniEngine.start``: an executor's thread would be waited for at exit).

    Why one: on CPU, PyTorch runs a parallel op on an OpenMP team led by the calling thread,
    and each thread that ever ran one keeps its own team. GNU libgomp (PyTorch's OpenMP)
    counts the threads of all teams; once they outnumber the cores it stops letting idle
    workers spin between parallel regions, so they sleep and must be woken again at each
    of a step's hundreds of regions. Loading in one thread (``asyncio.to_thread``) and
    stepping in another was enough: served decode steps then kept the two cores of a 2-core
    machine busy 1.2-1.6 of 2 instead of 2 (docs/runs/mini_engine_speed.md, "One thread for all of
    PyTorch's work")."""
    return ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)


def _given(value, default):
    """A request field's value, or ``default`` where the client sent null or nothing."""
    return default if value is None else value


class LocalEngine(Engine):
    """An engine running in this process. Subclasses set ``tokenizer``, ``max_model_len``,
    ``vocab_size`` and ``model_name`` in ``start`` and implement ``generate`` and ``stats``."""

    tokenizer: Any
    max_model_len: int
    model_name: str
    vocab_size: int | None = None     # rows of the embedding: larger prompt ids are refused

    def __init__(self, config: ServerConfig, model: ModelSpec) -> None:
        self.config = config
        self.spec = model
        self.device = config.resolved_device()
        self.model_name = config.served_model_name or model.name
        self.max_model_len = config.max_model_len
        self.tokenizer = None            # loaded by start()
        self._ready = False
        self.metrics = EngineMetrics()
        self._grammars: GrammarCompiler | None = None
        self._grammar_lock = threading.Lock()

    @abc.abstractmethod
    def generate(self, request_id: str, prompt_token_ids: list[int],
                 params: SamplingParams) -> AsyncIterator[GenerationStep]:
        """Stream the continuation of ``prompt_token_ids``.

        Contract: yields at least one step; the last step has ``finish_reason`` set; the
        caller may stop iterating at any time (``aclose()``, or a cancellation thrown in at
        an ``await``), and the engine must then abort the request and free its KV cache.
        Do that cleanup without awaiting: the server runs on anyio, which cancels a
        cancelled task again at every suspension, so code after an ``await`` in a
        ``finally`` may never run. The prompt already fits: ``len(prompt) +
        params.max_tokens <= max_model_len`` was checked by the caller.
        """

    @abc.abstractmethod
    def stats(self) -> EngineStats: ...

    # ---- OpenAI adapter -------------------------------------------------------------

    def _refuse_unsupported(self, request, kind: str) -> None:
        bad = unsupported_fields(request, kind)
        if bad:
            raise EngineError(400, f"{', '.join(bad)}: not supported by the {self.name} engine "
                              "(it would be ignored); remove it or use --engine vllm",
                              param=bad[0], code="unsupported_parameter")

    async def chat(self, request: ChatCompletionRequest):
        self._refuse_unsupported(request, "chat")
        # Role and content only: any other field was refused above, or is null.
        messages = [m.model_dump(include={"role", "content"}, exclude_none=True)
                    for m in request.messages]
        for m in messages:
            if isinstance(m.get("content"), list):   # [{"type": "text", "text": ...}, ...]
                m["content"] = "".join(p.get("text", "") for p in m["content"])
        try:
            prompt_ids = self.tokenizer.apply_chat_template(
                messages, add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]
        except Exception as exc:  # a template may reject e.g. two system messages
            raise EngineError(400, f"chat template rejected the messages: {exc}") from exc
        return await self._serve(request, list(prompt_ids), request.num_logprobs, chat=True)

    async def complete(self, request: CompletionRequest):
        self._refuse_unsupported(request, "complete")
        prompt = request.prompt
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], int):
            prompt_ids = list(prompt)
            top = max(prompt_ids)
            if self.vocab_size is not None and top >= self.vocab_size:
                raise EngineError(400, f"token id {top} is out of vocabulary (this model has "
                                  f"{self.vocab_size} token ids)", param="prompt")
        elif isinstance(prompt, list):
            if len(prompt) != 1:
                raise EngineError(400, "this engine takes one prompt per request", param="prompt")
            prompt_ids = self.tokenizer.encode(prompt[0])
        else:
            prompt_ids = self.tokenizer.encode(prompt)
        if not prompt_ids:
            raise EngineError(400, "prompt is empty", param="prompt")
        return await self._serve(request, prompt_ids, request.num_logprobs, chat=False)

    def _sampling_params(self, request, prompt_len: int, logprobs: int | None) -> SamplingParams:
        room = self.max_model_len - prompt_len
        if room <= 0:
            raise EngineError(400, f"This model's maximum context length is {self.max_model_len} "
                              f"tokens. However, your prompt has {prompt_len} tokens.",
                              param="messages" if hasattr(request, "messages") else "prompt")
        max_tokens = request.effective_max_tokens
        if max_tokens is None:
            max_tokens = room
        elif max_tokens > room:
            raise EngineError(400, f"This model's maximum context length is {self.max_model_len} "
                              f"tokens. However, you requested {prompt_len + max_tokens} tokens "
                              f"({prompt_len} in the prompt, {max_tokens} for the completion).",
                              param="max_tokens")
        eos = self.tokenizer.eos_token_id
        stop_ids = [eos] if eos is not None and not request.ignore_eos else []
        temperature = 1.0 if request.temperature is None else request.temperature
        bias = request.logit_bias_ids
        vocab = self.vocab_size
        outside = [t for t in bias if t < 0 or vocab is not None and t >= vocab]
        if outside:
            raise EngineError(400, f"logit_bias: token id {outside[0]} is out of vocabulary (this "
                              f"model has {vocab} token ids)", param="logit_bias")
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=0.0 if temperature < SAMPLING_EPS else temperature,
            top_p=_given(request.top_p, 1.0),
            seed=request.seed, ignore_eos=bool(request.ignore_eos),
            stop_token_ids=stop_ids + list(request.stop_token_ids or []), logprobs=logprobs,
            top_k=max(_given(request.top_k, 0), 0), min_p=_given(request.min_p, 0.0),
            presence_penalty=_given(request.presence_penalty, 0.0),
            frequency_penalty=_given(request.frequency_penalty, 0.0),
            repetition_penalty=_given(request.repetition_penalty, 1.0), logit_bias=bias,
            cache_salt=request.cache_salt)

    async def _serve(self, request, prompt_ids: list[int], logprobs: int | None, chat: bool):
        params = self._sampling_params(request, len(prompt_ids), logprobs)
        if request.response_format is not None:
            params.grammar = await asyncio.to_thread(self._grammar, request.response_format)
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        created = int(time.time())
        stops = request.stop_list
        n = request.n or 1
        streams = [self._run_one(f"{rid}-{i}", prompt_ids, params, stops) for i in range(n)]
        shape = _ChunkShape(rid, created, self.model_name, chat)
        if request.stream:
            opts = request.stream_options
            include_usage = bool(opts and opts.include_usage)
            continuous = bool(include_usage and opts.continuous_usage_stats)
            return await _Primed.start(_stream(streams, shape, len(prompt_ids), include_usage,
                                               continuous))
        return await _collect(streams, shape, len(prompt_ids))

    def _grammar(self, response_format) -> Grammar | None:
        """The compiled grammar of a response format (a 400 if it cannot be compiled). The
        compiler reads the whole vocabulary once (a fraction of a second), at first use."""
        with self._grammar_lock:
            if self._grammars is None:
                eos = self.tokenizer.eos_token_id
                self._grammars = GrammarCompiler(self.tokenizer, self.vocab_size
                                                 or len(self.tokenizer),
                                                 [eos] if eos is not None else [])
        try:
            return self._grammars.compile(response_format.model_dump(by_alias=True))
        except GrammarError as exc:
            raise EngineError(400, str(exc), param="response_format") from exc

    async def _run_one(self, request_id: str, prompt_ids: list[int], params: SamplingParams,
                       stops: list[str]) -> AsyncIterator[SeqDelta]:
        """One sequence, as the text it adds at each engine step.

        Decoding is incremental (``IncrementalDetokenizer``: constant work per token, UTF-8
        characters split across tokens come out whole); stop strings are searched in the
        text not yet sent, of which the longest stop's length is held back.
        """
        t_start = time.perf_counter()
        t_last = None
        detok = IncrementalDetokenizer(self.tokenizer, prompt_ids, params.stop_token_ids)
        unsent = ""
        cached = 0
        pending = 0       # tokens generated but not yet reported
        lps: list[dict] = []   # their logprob entries
        hold = max((len(s) for s in stops), default=0)  # keep back what could start a stop
        self.metrics.prompt_tokens.inc(len(prompt_ids))
        gen = self.generate(request_id, prompt_ids, params)
        finish = None
        try:
            async for step in gen:
                now = time.perf_counter()
                if t_last is None:
                    self.metrics.ttft.observe(now - t_start)
                    cached = step.cached_tokens
                elif step.token_ids:
                    self.metrics.itl.observe(now - t_last)
                if step.token_ids:
                    t_last = now
                self.metrics.generation_tokens.inc(len(step.token_ids))
                pending += len(step.token_ids)
                finish = step.finish_reason
                unsent += detok.add(step.token_ids, final=bool(finish))
                cut = _find_stop(unsent, stops, 0)
                if cut is not None:
                    unsent, finish = unsent[:cut], "stop"
                safe = len(unsent) if finish else max(0, len(unsent) - hold)
                if step.logprobs:
                    lps += _format_logprobs(self.tokenizer, step.logprobs)
                if not safe and not finish and detok.holding:
                    continue  # half a UTF-8 character: report with the next token
                delta, unsent = unsent[:safe], unsent[safe:]
                yield SeqDelta(delta, lps, finish, cached, pending)
                pending, lps = 0, []
                if finish:
                    break
        except (EngineError, EngineDied):
            raise
        except Exception as exc:  # an engine bug fails this request only, as a 500
            raise engine_fault(exc) from exc
        finally:
            await gen.aclose()   # on early exit this is what aborts the request in the engine
            self.metrics.e2e.observe(time.perf_counter() - t_start)
            if finish:
                self.metrics.requests_success.labels(finished_reason=finish).inc()

    async def metrics_text(self) -> str:
        return self.metrics.render(self.stats())


class _Primed:
    """A stream whose first chunk is already in hand.

    The engine may still refuse a request once it sees it (mini: more KV blocks than its
    pool); waiting for the first chunk before answering lets that refusal be a 4xx status
    instead of an error event after a 200. ``aclose`` closes the stream even if iteration
    never began.
    """

    def __init__(self, first: dict, rest: AsyncIterator[dict]) -> None:
        self.first: dict | None = first
        self.rest = rest

    @classmethod
    async def start(cls, stream: AsyncIterator[dict]) -> "_Primed":
        try:
            first = await stream.__anext__()
        except BaseException:
            await stream.aclose()
            raise
        return cls(first, stream)

    def __aiter__(self):
        return self

    async def __anext__(self) -> dict:
        if self.first is not None:
            first, self.first = self.first, None
            return first
        return await self.rest.__anext__()

    async def aclose(self) -> None:
        await self.rest.aclose()


@dataclass
class SeqDelta:
    """What one sequence adds at one engine step."""

    text: str
    logprobs: list[dict]            # OpenAI chat-style entries, one per new token
    finish_reason: str | None
    cached_tokens: int              # prompt tokens served from the prefix cache
    num_new_tokens: int             # tokens generated since the previous delta


# Prompt tokens decoded with the first output tokens: a tokenizer may render a token
# differently at the start of a text (SentencePiece's leading space), so the window starts
# inside the prompt, as vLLM's does.
_CONTEXT_TOKENS = 5


class IncrementalDetokenizer:
    """The text of a growing token sequence, for constant work per token.

    Each step decodes only a short window: tokens from ``prefix`` (already rendered, kept as
    context) to the end. The window's text minus the context's is the new text; it is
    released only when it does not end in U+FFFD, i.e. when no UTF-8 character is still
    missing bytes that the next token carries. This is the algorithm of vLLM's and Hugging
    Face's streaming detokenizers.
    """

    def __init__(self, tokenizer, prompt_ids: list[int], skip_ids=()) -> None:
        self.tokenizer = tokenizer
        self.skip = set(skip_ids)          # stop tokens: not part of the text
        self.ids = [t for t in prompt_ids[-_CONTEXT_TOKENS:] if t not in self.skip]
        self.prefix = 0                    # window start
        self.read = len(self.ids)          # end of what is already rendered

    @property
    def holding(self) -> bool:
        """Tokens were added whose text is not released yet."""
        return self.read < len(self.ids)

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def add(self, token_ids: list[int], final: bool = False) -> str:
        """Append tokens; return the text they complete (everything left, if ``final``)."""
        self.ids.extend(t for t in token_ids if t not in self.skip)
        if not self.holding:
            return ""
        context = self._decode(self.ids[self.prefix:self.read])
        text = self._decode(self.ids[self.prefix:])
        if len(text) <= len(context) or (text.endswith("\ufffd") and not final):
            return ""
        self.prefix, self.read = self.read, len(self.ids)
        return text[len(context):]


def _find_stop(text: str, stops: list[str], start: int) -> int | None:
    """Index where the earliest stop string begins in the unsent part, if any."""
    best = None
    for s in stops:
        i = text.find(s, max(0, start - len(s) + 1))
        if i != -1 and (best is None or i < best):
            best = i
    return best


def _format_logprobs(tokenizer, entries: list[TokenLogprob]) -> list[dict]:
    def piece(tid: int) -> str:
        return tokenizer.decode([tid])
    return [{"token": piece(e.token_id), "logprob": e.logprob,
             "bytes": list(piece(e.token_id).encode()),
             "top_logprobs": [{"token": piece(t), "logprob": lp, "bytes": list(piece(t).encode())}
                              for t, lp in e.top]} for e in entries]


@dataclass
class _ChunkShape:
    id: str
    created: int
    model: str
    chat: bool

    def chunk(self, index: int, delta: str, logprobs: list, finish: str | None,
              first: bool) -> ChatCompletionChunk | CompletionChunk:
        if self.chat:
            d = DeltaMessage(role="assistant", content=delta) if first else \
                DeltaMessage(content=delta)
            return ChatCompletionChunk(
                id=self.id, created=self.created, model=self.model,
                choices=[ChatStreamChoice(index=index, delta=d, finish_reason=finish,
                                          logprobs={"content": logprobs} if logprobs else None)])
        return CompletionChunk(
            id=self.id, created=self.created, model=self.model,
            choices=[CompletionChoice(index=index, text=delta, finish_reason=finish,
                                      logprobs=_completion_logprobs(logprobs) if logprobs
                                      else None)])

    def usage(self, prompt_tokens: int, completion_tokens: int, cached: int) -> Usage:
        return Usage(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
                     total_tokens=prompt_tokens + completion_tokens,
                     prompt_tokens_details={"cached_tokens": cached})


def _completion_logprobs(entries: list[dict]) -> dict:
    """The legacy completions layout: parallel lists instead of one object per token."""
    return {"tokens": [e["token"] for e in entries],
            "token_logprobs": [e["logprob"] for e in entries],
            "top_logprobs": [{t["token"]: t["logprob"] for t in e["top_logprobs"]}
                             for e in entries],
            "text_offset": []}


async def _merge(streams: list[AsyncIterator]) -> AsyncIterator[tuple[int, SeqDelta]]:
    """Interleave n sequence streams as their items arrive; close all of them on exit."""
    if len(streams) == 1:
        try:
            async for item in streams[0]:
                yield 0, item
        finally:
            await streams[0].aclose()
        return
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(i: int, s: AsyncIterator) -> None:
        try:
            async with aclosing(s):
                async for item in s:
                    queue.put_nowait((i, item))
            queue.put_nowait((i, None))
        except Exception as exc:  # handed to the consumer: an engine error must not vanish
            queue.put_nowait((i, exc))

    tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(streams)]
    try:
        live = len(streams)
        while live:
            i, item = await queue.get()
            if isinstance(item, Exception):
                raise item
            if item is None:
                live -= 1
                continue
            yield i, item
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def _stream(streams, shape: _ChunkShape, prompt_tokens: int, include_usage: bool,
                  continuous: bool = False) -> AsyncIterator[dict]:
    completion_tokens = 0
    cached = 0
    first = [True] * len(streams)
    # With include_usage every chunk carries "usage": null and a last chunk the totals; with
    # vLLM's continuous_usage_stats too, every chunk carries the counts so far, as vLLM's do.
    exclude = None if include_usage else {"usage"}
    # aclosing: when the client leaves, this generator is closed, and the close must reach
    # the engine now (an abandoned inner generator is only finalized later, by the GC)
    async with aclosing(_merge(streams)) as merged:
        async for i, d in merged:
            cached = d.cached_tokens
            completion_tokens += d.num_new_tokens
            chunk = shape.chunk(i, d.text, d.logprobs, d.finish_reason, first[i])
            first[i] = False
            if continuous:
                chunk.usage = shape.usage(prompt_tokens, completion_tokens, cached)
            yield chunk.model_dump(exclude=exclude)
    if include_usage:
        final = shape.chunk(0, "", [], None, False)
        final.choices = []
        final.usage = shape.usage(prompt_tokens, completion_tokens, cached)
        yield final.model_dump()


async def _collect(streams, shape: _ChunkShape, prompt_tokens: int) -> dict:
    texts = [""] * len(streams)
    lps: list[list] = [[] for _ in streams]
    finishes: list[str | None] = [None] * len(streams)
    cached = 0
    completion_tokens = 0
    async with aclosing(_merge(streams)) as merged:
        async for i, d in merged:
            completion_tokens += d.num_new_tokens
            texts[i] += d.text
            lps[i].extend(d.logprobs)
            finishes[i] = d.finish_reason or finishes[i]
            cached = d.cached_tokens
    usage = shape.usage(prompt_tokens, completion_tokens, cached)
    if shape.chat:
        return ChatCompletionResponse(
            id=shape.id, created=shape.created, model=shape.model, usage=usage,
            choices=[ChatChoice(index=i, message=AssistantMessage(content=text),
                                finish_reason=finishes[i],
                                logprobs={"content": lps[i]} if lps[i] else None)
                     for i, text in enumerate(texts)]).model_dump()
    return CompletionResponse(
        id=shape.id, created=shape.created, model=shape.model, usage=usage,
        choices=[CompletionChoice(index=i, text=text, finish_reason=finishes[i],
                                  logprobs=_completion_logprobs(lps[i]) if lps[i] else None)
                 for i, text in enumerate(texts)]).model_dump()
