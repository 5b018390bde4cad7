"""``run_benchmark``: one run of one workload under one load against one server."""

from __future__ import annotations

import asyncio
import random
import time
from datetime import datetime, timezone
from typing import Any

from .client import Load, OpenAIClient, Runner
from .event_loop import run_sync
from .request_metrics import SLO, summarize
from .results import BenchResult, local_environment, server_environment
from .saturation import judge, offered_vs_asked
from .server_metrics import MetricsScraper
from .workloads import Request, Tokenizer, Workload, build_workload, exact_filler, token_stats


def _tokenizer_from_server(base_url: str, model: str, api_key: str | None) -> str | None:
    """The ``root`` that ``/v1/models`` gives for ``model``, when it is a folder on this machine."""
    import json
    import os
    import urllib.request
    req = urllib.request.Request(base_url.rstrip("/") + "/v1/models",
                                 headers={"Authorization": f"Bearer {api_key}"} if api_key else {})
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            data = json.loads(resp.read()).get("data", [])
    except Exception:
        return None
    for m in data:
        root = m.get("root")
        if m.get("id") == model and isinstance(root, str) and os.path.isdir(root):
            return root
    return None


RESET_PATHS = ("/reset_prefix_cache", "/flush_cache")   # ours and vLLM's; SGLang's own server
NO_PREFIX_CACHE = "no prefix cache"    # what reset_prefix_cache returns for a server without one


def reset_verdict(status: int, body: Any) -> str:
    """What a server's answer to a cache reset means: "emptied", "refused" (ask again: vLLM
    answers ``success: false`` while a request holds blocks, SGLang's ``/flush_cache`` a 400
    while requests run), "no cache" (ours answer ``prefix_caching: false``) or "absent" (no such
    endpoint: try the next). A 200 without a JSON object (an older server) says no more than
    "done"."""
    if status == 200:
        if not isinstance(body, dict):
            return "emptied"
        if body.get("prefix_caching") is False:
            return "no cache"
        return "refused" if body.get("success") is False else "emptied"
    return "refused" if status == 400 else "absent"


async def reset_prefix_cache(session, base_url: str, headers: dict[str, str], tries: int = 8,
                             pause_s: float = 0.25) -> str | None:
    """Empty the server's prefix cache, asking again after a refusal (up to ``tries`` times).

    Returns the endpoint that emptied it, ``NO_PREFIX_CACHE`` for a server that says it keeps
    none (nothing to empty), or None: no such endpoint, or a refusal every time (then the run
    starts with whatever is cached, and its ``cached_tokens`` show it).
    """
    for attempt in range(tries):
        if attempt:
            await asyncio.sleep(pause_s)
        verdict = "absent"
        for path in RESET_PATHS:
            try:
                async with session.post(base_url + path, headers=headers) as resp:
                    try:
                        body = await resp.json(content_type=None)
                    except ValueError:
                        body = None
                    verdict = reset_verdict(resp.status, body)
            except Exception:
                continue
            if verdict == "emptied":
                return path
            if verdict == "no cache":
                return NO_PREFIX_CACHE
            if verdict != "absent":
                break
        if verdict != "refused":
            return None
    return None


def _warmup_requests(tok: Tokenizer, n: int, seed: int, api: str) -> list[Request]:
    """Short requests on the workload's own API (a server may serve chat only)."""
    rng = random.Random(f"warmup/{seed}")
    texts = [exact_filler(tok, rng, 32) for _ in range(n)]
    if api == "completions":
        return [Request(8, prompt=t, tag="warmup") for t in texts]
    return [Request(8, messages=[{"role": "user", "content": t}], tag="warmup") for t in texts]


async def arun_benchmark(base_url: str, model: str, workload: str | Workload = "random",
                         num_requests: int = 32,
                         concurrency: int | None = 8, request_rate: float | None = None,
                         burstiness: float = 1.0,
                         api_key: str | None = None, seed: int = 0, warmup: int = 2,
                         slo: SLO | None = None, progress: bool = True,
                         output_dir: str | None = None, label: str | None = None,
                         tokenizer: str | None = None, timeout_s: float = 600.0,
                         ignore_eos: bool = True,
                         extra_body: dict | None = None, scrape_metrics: bool = True,
                         environment: bool = True, reset_cache: bool = False,
                         **workload_kwargs: Any) -> BenchResult:
    """The async form of ``run_benchmark`` (for code already inside an event loop)."""
    if isinstance(workload, Workload):
        wl = workload
        tok = wl.tokenizer or Tokenizer.load(model, tokenizer)
    else:
        tok = Tokenizer.load(model, tokenizer)
        if tok.hf is None and tokenizer is None:
            # The served name may not be a local model: the server may say where its weights are.
            root = await asyncio.to_thread(_tokenizer_from_server, base_url, model, api_key)
            if root is not None:
                tok = Tokenizer.load(None, root)
        wl = build_workload(workload, tok, num_requests=num_requests, seed=seed, **workload_kwargs)
    load = Load(concurrency=concurrency, request_rate=request_rate, burstiness=burstiness,
                seed=seed)
    slo = slo or SLO()
    config = {"label": label, "base_url": base_url, "model": model, "workload": wl.name,
              "workload_params": wl.params, "num_sessions": len(wl.sessions),
              "concurrency": concurrency,
              "request_rate": request_rate, "burstiness": burstiness, "seed": seed,
              "warmup": warmup,
              "slo": {k: v for k, v in vars(slo).items() if v is not None},
              "ignore_eos": ignore_eos,
              "extra_body": extra_body, "tokenizer": tok.name,
              "started_at": datetime.now(timezone.utc).isoformat(timespec="seconds")}

    bar = None
    if progress:
        from tqdm.auto import tqdm
        bar = tqdm(total=sum(s.expected_requests() for s in wl.sessions), desc=f"{wl.name}",
                   unit="req")

    def done(rec) -> None:
        if bar is not None and not rec.warmup:
            bar.update(1)
            if rec.error:
                bar.set_postfix(errors=sum(1 for r in runner.log.records if r.error
                                           and not r.warmup))

    async with OpenAIClient(base_url, model, api_key, timeout_s, ignore_eos, extra_body) as client:
        env: dict[str, Any] = {}
        if environment:
            env = local_environment()
            env["server"] = await server_environment(client.session, client.base_url,
                                                     client.headers)
        runner = Runner(client, done)
        if reset_cache:
            config["prefix_cache_reset"] = await reset_prefix_cache(client.session, client.base_url,
                                                                    client.headers)
        if warmup:
            await runner.warmup(_warmup_requests(tok, warmup, seed, wl.params.get("api", "chat")))
        scraper = MetricsScraper(client.session, client.base_url, client.headers)
        if scrape_metrics:
            scraper.samples.before = await scraper.scrape()
        stop = asyncio.Event()
        sampler = (asyncio.create_task(scraper.sample_until(stop, runner.clock)) if scrape_metrics
                   else None)
        wall0 = time.time()
        try:
            await runner.run(wl.sessions, load)
        finally:
            stop.set()
            if sampler is not None:
                await sampler
            if bar is not None:
                bar.close()
        if scrape_metrics:
            scraper.samples.after = await scraper.scrape()
    config["wall_seconds"] = time.time() - wall0

    records = runner.log.records
    summary = summarize(records, slo)
    summary["server"] = scraper.samples.summary()
    warm_failed = [r for r in records if r.warmup and r.error]
    if warm_failed:
        summary["warnings"].append(f"{len(warm_failed)} warm-up requests failed: "
                                   f"{warm_failed[0].error[:200]}")
    if reset_cache and config.get("prefix_cache_reset") is None:
        summary["warnings"].append("the server's prefix cache was not emptied before the run "
                                   "(no reset endpoint, or every reset refused)")
    measured = [s for s, r in zip(runner.log.sent, records) if not r.warmup and s is not None]
    summary["workload"] = {"workload": wl.name, "sessions": len(wl.sessions),
                           **token_stats(measured, tok)}
    if load.open_loop:
        summary["load"] = offered_vs_asked(records, request_rate, burstiness)
        _explain_load(summary)
        # A sweep judges again with its own baseline (an unloaded probe); alone, a run uses
        # its first sessions as the unloaded reference.
        summary["saturation"] = judge(records, summary["server"].get("series")).to_dict()
    result = BenchResult(config=config, summary=summary, records=records, environment=env)
    if output_dir is not None:
        result.save(output_dir)
    return result


def _explain_load(summary: dict[str, Any]) -> None:
    """Warn when the offered load differs from the asked one by more than chance explains."""
    ld = summary["load"]
    band, off, sch = ld.get("sampling_band_95"), ld.get("offered_rate"), ld.get("scheduled_rate")
    if off is None or band is None:
        return
    if sch and off < 0.95 * sch:
        summary["warnings"].append(f"offered {off:.3g}/s but the schedule asked {sch:.3g}/s: the "
                                   "client sent late")
    elif not band[0] <= off <= band[1]:
        summary["warnings"].append(
            f"offered {off:.3g}/s is outside the 95% range of a random schedule of "
            f"{ld['arrivals']} arrivals at {ld['asked_rate']:g}/s ({band[0]:.3g}-{band[1]:.3g})")


def run_benchmark(base_url: str, model: str, workload: str | Workload = "random",
                  num_requests: int = 32,
                  concurrency: int | None = 8, request_rate: float | None = None,
                  burstiness: float = 1.0,
                  api_key: str | None = None, seed: int = 0, warmup: int = 2,
                  slo: SLO | None = None, progress: bool = True, output_dir: str | None = None,
                  **kwargs: Any) -> BenchResult:
    """Benchmark one OpenAI-compatible server with one workload; see docs/benchmarking.md.

    ``base_url`` is the server root (no ``/v1``). Closed loop at ``concurrency`` when
    ``request_rate`` is None, else open loop (Poisson for ``burstiness`` 1, gamma otherwise),
    capped at ``concurrency`` unless that is None. ``warmup`` short requests go first and are
    excluded. ``slo``: the objectives goodput counts requests against (``metrics.SLO``). Extra
    keyword arguments go to ``arun_benchmark`` (``label``, ``tokenizer``, ``extra_body``,
    ``reset_cache`` (empty the server's prefix cache first), ...) or to the workload builder
    (``input_len``, ``output_len``, ``num_groups``, ``branches``, ...). Works inside Jupyter
    (``event_loop.run_sync``).
    """
    coro = arun_benchmark(base_url, model, workload, num_requests, concurrency, request_rate,
                          burstiness,
                          api_key, seed, warmup, slo, progress=progress,
                          output_dir=output_dir, **kwargs)
    return run_sync(coro)
