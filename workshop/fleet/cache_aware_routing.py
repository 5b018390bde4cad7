"""Notebook 16's measurements: routing that knows the prefix cache (issue 37).

A fleet of replicas of one engine (the teaching engine, or vLLM), each with a small prefix
cache (``num_blocks`` of the teaching engine's 16-token KV blocks, or as many tokens in vLLM's
blocks; the blocks hold both the running requests and the cached prefixes), and one gateway
process per routing policy in front of the same replicas (``workshop.api_gateway``). A
multi-turn chat workload, each session with a long system prompt of its own, goes through each
gateway in turn, the replicas' caches emptied before each run; per run, from each replica's
``/metrics`` its prefix-cache hit rate (``vllm:prefix_cache_hits_total`` over
``..._queries_total``, prompt tokens: both engines report these names), from the gateway's
``/gateway/stats`` the requests each replica served, from the harness (``workshop.bench``)
TTFT percentiles and output throughput.

The harness's own multi-turn workloads do not fit: ``agentic`` gives every session the same
system prompt (one prefix for the whole fleet, which any policy finds), ``shared-prefix`` sends
single requests. ``session_workload`` builds the one this needs on the harness's ``Session``.

Data only: rows and figures, no prose.
"""

from __future__ import annotations

import asyncio
import copy
import os
import random
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from reference_server import prometheus
from reference_server.kv import blocks_for
from workshop import hardware
from workshop.bench import run_benchmark
from workshop.bench.server_metrics import PREFIX_HITS, PREFIX_QUERIES
from workshop.bench.tokenizer import Tokenizer, filler
from workshop.bench.workloads import Request, Send, Session, Workload
from workshop.live.live_requests import reset_prefix_cache


@dataclass
class ChatSession(Session):
    """A conversation with a system prompt of its own: each turn sends the whole history
    (system, earlier questions and the model's real replies) and a new question, after a
    pause of ``think_s`` on average (a user reading, an agent's tool running: 0.5x to 1.5x,
    seeded) that lets the fleet's load change between a session's turns."""

    system: str
    questions: Sequence[str]
    output_len: int
    think_s: float = 0.0
    seed: str = ""

    def expected_requests(self) -> int:
        return len(self.questions)

    async def run(self, send: Send) -> None:
        rng = random.Random(self.seed)
        messages: list[dict] = [{"role": "system", "content": self.system}]
        for t, q in enumerate(self.questions):
            if t and self.think_s > 0:
                await asyncio.sleep(rng.uniform(0.5, 1.5) * self.think_s)
            messages.append({"role": "user", "content": q})
            reply = await send(Request(self.output_len, messages=copy.deepcopy(messages),
                                       tag=f"turn-{t}"))
            if not reply.ok:
                return
            messages.append({"role": "assistant", "content": reply.text})


def session_workload(tok: Tokenizer, num_sessions: int, prefix_len: int = 256, turns: int = 3,
                     question_len: int = 24, output_len: int = 8, think_s: float = 0.0,
                     seed: int = 0, hot: bool = False) -> Workload:
    """``num_sessions`` conversations of ``turns`` turns, each opening with its own system
    prompt of about ``prefix_len`` tokens (different from its first word: no two sessions
    share a cache block), questions of about ``question_len`` tokens, replies of
    ``output_len`` (end of sequence ignored), ``think_s`` between a session's turns.
    ``hot``: every session has the same system prompt instead (one hot prefix)."""
    rng = random.Random(f"cache-aware/{seed}")
    sessions: list[Session] = []
    shared = f"Fleet {seed}. You assist one user. " + filler(tok, rng, prefix_len)
    for s in range(num_sessions):
        system = shared if hot else (f"Session {seed}-{s}. You assist one user. "
                                     + filler(tok, rng, prefix_len))
        questions = [f"Question {t}: " + filler(tok, rng, question_len) for t in range(turns)]
        sessions.append(ChatSession(system, questions, output_len, think_s,
                                    f"cache-aware/{seed}/session-{s}"))
    return Workload("cache-aware-sessions", sessions,
                    dict(num_sessions=num_sessions, prefix_len=prefix_len, turns=turns,
                         question_len=question_len, output_len=output_len, think_s=think_s,
                         seed=seed, hot=hot), tok)


def _prompt_tokens(turn: int, prefix_len: int, question_len: int, output_len: int,
                   template_tokens: int) -> int:
    """About the prompt tokens of a session's turn ``turn`` (from 0): the template and system
    prompt, ``turn + 1`` questions (each with some 8 tokens of label and role markers) and
    ``turn`` replies."""
    return template_tokens + prefix_len + (turn + 1) * (question_len + 8) + turn * output_len


def session_blocks(prefix_len: int, turns: int, question_len: int, output_len: int,
                   block_size: int = 16, template_tokens: int = 30,
                   prompt_tokens: Sequence[int] | None = None, **_: Any) -> int:
    """KV blocks one session's last turn fills (prompt + reply), about: what a replica must
    keep to serve that session's next turn from its cache. ``template_tokens``: the chat
    template's role markers and the system prompt's opening words. ``prompt_tokens``: each
    turn's prompt measured (``turn_prompt_tokens``) instead of estimated."""
    last = (prompt_tokens[-1] if prompt_tokens else
            _prompt_tokens(turns - 1, prefix_len, question_len, output_len, template_tokens))
    return blocks_for(last + output_len, block_size)


def turn_prompt_tokens(tok: Tokenizer, turns: int, prefix_len: int, question_len: int,
                       output_len: int, **_: Any) -> list[int]:
    """Each turn's prompt tokens in a session of ``session_workload``, its chat template
    applied by ``tok``, with replies of ``output_len`` tokens of filler: what the estimate in
    ``hit_ceiling`` guesses, measured. With 128-token blocks a guess a few tokens long moves a
    whole block."""
    s = session_workload(tok, 1, prefix_len, turns, question_len, output_len).sessions[0]
    rng = random.Random("cache-aware/replies")
    messages: list[dict] = [{"role": "system", "content": s.system}]
    out = []
    for q in s.questions:
        messages.append({"role": "user", "content": q})
        out.append(len(tok.prompt_ids(Request(output_len, messages=messages))))
        messages.append({"role": "assistant", "content": filler(tok, rng, output_len)})
    return out


# -- the fleet -------------------------------------------------------------------------------

# The slider's unit: the teaching engine's KV block; a vLLM replica gets as many tokens.
SLIDER_BLOCK = 16
# vLLM-CPU's default block size (vllm/platforms/cpu.py); a started replica's /server_info says.
VLLM_CPU_BLOCK = 128
# vLLM holds one block back for good (its block pool's null block), and counts it in
# /server_info's capacity, so a replica gets one more than the slider's tokens fill.
VLLM_NULL_BLOCKS = 1


@dataclass
class Fleet:
    replicas: list[Any]                     # workshop.session.Session, one per replica
    gateways: dict[str, Any]                # policy -> workshop.api_gateway.launch.RunningGateway
    num_blocks: int                         # per replica, in the replicas' own blocks
    block_size: int = 16
    keys: list[dict] = field(default_factory=list)
    engine: str = "mini"

    @property
    def kv_tokens(self) -> int:
        """Tokens one replica's cache holds."""
        return self.num_blocks * self.block_size

    @property
    def model(self) -> str:
        return self.replicas[0].model

    def stop(self) -> None:
        for gw in self.gateways.values():
            gw.stop()
        for r in self.replicas:
            r.stop()


def replica_args(num_blocks: int, threads: int = 1, max_model_len: int = 1024,
                 max_num_seqs: int = 16) -> list[str]:
    """The teaching engine's server flags for one replica: a pool of ``num_blocks`` blocks."""
    return ["--max-model-len", str(max_model_len), "--", "--threads", str(threads),
            "--max-num-seqs", str(max_num_seqs), "--num-blocks", str(num_blocks)]


def vllm_blocks(tokens: int, block_size: int = VLLM_CPU_BLOCK) -> int:
    """vLLM blocks for a cache that serves about ``tokens`` tokens: the nearest whole number
    (one at least), and the null block."""
    return max(1, round(tokens / block_size)) + VLLM_NULL_BLOCKS


def vllm_kv_gib(tokens: int, bytes_per_token: float, block_size: int = VLLM_CPU_BLOCK) -> float:
    """``--kv-cache-gib`` for a vLLM replica of ``vllm_blocks(tokens)`` blocks. vLLM divides
    its KV space by a block's bytes and rounds down, and the server turns a fraction of a GiB
    into whole bytes: half a block more keeps that rounding from losing a block."""
    return (vllm_blocks(tokens, block_size) + 0.5) * block_size * bytes_per_token / 2**30


def vllm_replica_args(tokens: int, bytes_per_token: float, block_size: int = VLLM_CPU_BLOCK,
                      max_model_len: int = 1024, max_num_seqs: int = 16) -> list[str]:
    """vLLM's server flags for one replica whose KV cache holds about ``tokens`` tokens.
    vLLM refuses a cache smaller than one request of ``max_model_len``, so that is capped at
    the cache. Eager: a third of a compiled start on a CPU, and the teaching engine beside it
    is not compiled either."""
    held = (vllm_blocks(tokens, block_size) - VLLM_NULL_BLOCKS) * block_size
    return ["--max-model-len", str(min(max_model_len, held)),
            "--kv-cache-gib", f"{vllm_kv_gib(tokens, bytes_per_token, block_size):.9g}", "--",
            "--max-num-seqs", str(max_num_seqs), "--enforce-eager"]


def replica_cores(index: int, threads: int, cores: Sequence[int]) -> str:
    """The cores replica ``index`` of a fleet is bound to, ``threads`` of them, in turn from
    ``cores`` (wrapping round), as ``VLLM_CPU_OMP_THREADS_BIND`` writes them: "0" or "2,3".
    vLLM-CPU binds every replica to all cores otherwise, and they would take turns on each."""
    return ",".join(str(cores[(index * threads + k) % len(cores)]) for k in range(threads))


def vllm_kv_bytes_per_token(model_path: str) -> int:
    """Bytes one token takes in a vLLM-CPU replica's KV cache, by the rules the server reports
    in ``/server_info`` (``reference_server.engines.vllm``): the served dtype (float32 on a CPU
    without native bfloat16) times the model's KV values per token (``reference_server.kv``)."""
    from reference_server import dtypes
    from reference_server.config import ServerConfig
    from reference_server.engines.vllm import served_dtype
    from reference_server.kv import kv_bytes_per_token
    from reference_server.model_config import read_arch

    arch = read_arch(model_path)
    dtype = served_dtype(ServerConfig().dtype, "cpu", [], arch.torch_dtype,
                         native_bf16=dtypes.cpu_has_bf16())
    return int(kv_bytes_per_token(arch, dtypes.canonical("auto", dtype, arch.torch_dtype)))


def vllm_unavailable(session_engine: str) -> str | None:
    """Why a fleet of vLLM replicas cannot be measured here, or None where it can."""
    import importlib.util

    import workshop.session
    if session_engine != "vllm":
        return (f"the course's server runs {workshop.session.engine_name(session_engine)}; "
                "this notebook starts vLLM only beside a vLLM server")
    if importlib.util.find_spec("vllm") is None:
        return "vLLM is not installed in this Python (a server elsewhere does the serving)"
    if hardware.gpu_name() is not None:
        return ("on a GPU the server sizes vLLM's KV cache by a share of GPU memory, not "
                "`--kv-cache-gib`, so a replica's cache cannot be made this small")
    return None


def start_fleet(num_replicas: int, num_blocks: int, policies: Sequence[str], *,
                engine: str = "mini", prefix_balance: int = 4, prefix_threshold: float = 0.5,
                threads: int = 1, max_model_len: int = 1024) -> Fleet:
    """``num_replicas`` servers of ``engine`` ("mini" or "vllm") side by side
    (``workshop.session.start_many``), each warmed up by one request, and a gateway per policy
    in front of all of them. Each replica's cache holds ``num_blocks`` blocks of
    ``SLIDER_BLOCK`` tokens: that many blocks on the teaching engine, as many tokens in
    vLLM's blocks (``vllm_replica_args``), each vLLM replica on ``threads`` cores of its own."""
    import secrets

    import workshop.session
    from workshop.api_gateway import launch

    names = [f"replica {i}" for i in range(num_replicas)]
    tokens = num_blocks * SLIDER_BLOCK
    if engine == "vllm":
        from reference_server.models import BUNDLED_MODEL, resolve_model

        per_token = vllm_kv_bytes_per_token(resolve_model(BUNDLED_MODEL).path)
        cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else [0]
        started = workshop.session.start_many("vllm", {
            n: vllm_replica_args(tokens, per_token, max_model_len=max_model_len)
            for n in names}, envs={
            n: {"VLLM_CPU_OMP_THREADS_BIND": replica_cores(i, threads, cores)}
            for i, n in enumerate(names)})
    elif engine == "mini":
        started = workshop.session.start_many("mini", {
            n: replica_args(num_blocks, threads, max_model_len) for n in names})
    else:
        raise ValueError(f"no fleet of {engine!r} replicas here: use 'mini' or 'vllm'")
    replicas = [started[n] for n in names]
    keys = [{"name": "bench", "key": "sk-bench-" + secrets.token_hex(8),
             "requests_per_minute": 600_000, "burst": 10_000, "admin": True}]
    upstreams = [(r.base_url, r.api_key) for r in replicas]
    try:
        with ThreadPoolExecutor(len(policies) + len(replicas)) as pool:
            warm = [pool.submit(_warm_up, r) for r in replicas]
            futures = {p: pool.submit(launch.start, upstreams, keys, policy=p,
                                      prefix_balance=prefix_balance,
                                      prefix_threshold=prefix_threshold) for p in policies}
            gateways = {p: f.result() for p, f in futures.items()}
            for w in warm:
                w.result()
    except BaseException:
        for r in replicas:
            r.stop()
        raise
    # What the replicas report, not what was asked: the figures' arithmetic follows it.
    block = int(replicas[0].info.get("block_size") or SLIDER_BLOCK)
    held = int(replicas[0].info.get("kv_capacity_tokens") or tokens)
    usable = held // block - (VLLM_NULL_BLOCKS if engine == "vllm" else 0)
    return Fleet(replicas, gateways, usable, block, keys, engine)


def _warm_up(replica: Any) -> None:
    import httpx
    httpx.post(replica.base_url + "/v1/completions", headers=replica.headers, timeout=120,
               json={"model": replica.model, "prompt": "Hello", "max_tokens": 2}).raise_for_status()


def _prefix_counts(replica: Any) -> tuple[float, float]:
    m = replica.metrics()
    return (prometheus.first(m, PREFIX_QUERIES) or 0.0, prometheus.first(m, PREFIX_HITS) or 0.0)


RESET_TRIES = 20


def empty_cache(replica: Any, tries: int = RESET_TRIES, pause_s: float = 0.25) -> None:
    """Empty ``replica``'s prefix cache, asking again while it refuses, or raise: a cache left
    full would hand the next policy's run the previous one's prompts."""
    if not reset_prefix_cache(replica, tries, pause_s):
        raise RuntimeError(f"{replica.base_url} refused to empty its prefix cache {tries} times")


def imbalance(served: Sequence[int]) -> float | None:
    """Max over mean requests per replica: 1.0 is perfectly even, N is one replica of N."""
    total = sum(served)
    return max(served) / (total / len(served)) if total else None


def run_point(fleet: Fleet, policy: str, num_sessions: int, seed: int | None = None,
              **workload: Any) -> dict:
    """One run: ``num_sessions`` sessions (``session_workload``; ``seed`` defaults to the
    session count, so each count has prefixes of its own) through ``policy``'s gateway, all
    sessions at once, the replicas' prefix caches emptied first. One row of numbers."""
    gw = fleet.gateways[policy]
    tok = Tokenizer.load(fleet.model, fleet.replicas[0].info.get("model_path"))
    wl = session_workload(tok, num_sessions, seed=num_sessions if seed is None else seed,
                          **workload)
    for r in fleet.replicas:
        empty_cache(r)
    before = [_prefix_counts(r) for r in fleet.replicas]
    stats0 = gw.stats()
    result = run_benchmark(gw.base_url, fleet.model, wl, concurrency=None,
                           api_key=gw.admin_key, warmup=0, progress=False,
                           scrape_metrics=False, environment=False)
    stats1 = gw.stats()
    after = [_prefix_counts(r) for r in fleet.replicas]
    s = result.summary
    served = [a["served"] - b["served"] for a, b in zip(stats1["replicas"], stats0["replicas"])]
    queries = [a[0] - b[0] for a, b in zip(after, before)]
    hits = [a[1] - b[1] for a, b in zip(after, before)]
    decisions = {k: v - stats0.get("decisions", {}).get(k, 0)
                 for k, v in stats1.get("decisions", {}).items()}
    row = {"engine": fleet.engine, "policy": policy, "sessions": num_sessions,
           "requests": s["completed"],
           "errors": s["errors"],
           "hit rate": sum(hits) / sum(queries) if sum(queries) else None,
           "p50 TTFT ms": s["ttft_ms"]["median"], "p99 TTFT ms": s["ttft_ms"]["p99"],
           "output tok/s": s["output_throughput"], "imbalance": imbalance(served),
           "wall s": result.config.get("wall_seconds")}
    for i, (q, h, n) in enumerate(zip(queries, hits, served)):
        row[f"r{i} requests"] = n
        row[f"r{i} hit rate"] = h / q if q else None
    row["decisions"] = ", ".join(f"{k} {v}" for k, v in sorted(decisions.items()) if v) or "-"
    return row


def hit_ceiling(turns: int, prefix_len: int, question_len: int, output_len: int,
                template_tokens: int = 30, block_size: int = 16,
                prompt_tokens: Sequence[int] | None = None, **_: Any) -> float:
    """The hit rate of a session served wholly from one replica with room for all of it: each
    turn after the first finds the previous turn's prompt and reply in the cache (rounded down
    to whole blocks); the first turn finds nothing. Prompt tokens found over prompt tokens.
    ``prompt_tokens``: each turn's prompt measured (``turn_prompt_tokens``), not estimated."""
    sent = found = 0
    prev = 0
    for t in range(turns):
        prompt = (prompt_tokens[t] if prompt_tokens else
                  _prompt_tokens(t, prefix_len, question_len, output_len, template_tokens))
        sent += prompt
        found += (prev // block_size) * block_size if t else 0
        prev = prompt + output_len
    return found / sent if sent else 0.0


def capacity(fleet: Fleet, workload: dict) -> dict:
    """What one replica of ``fleet`` keeps of ``workload`` (``session_workload``'s arguments),
    in the blocks it reports: a session's last turn in blocks (``session_blocks``), sessions
    its cache holds, and the hit rate of a session served wholly at home (``hit_ceiling``),
    from prompts measured with the served model's tokenizer (estimated for a fleet without
    replicas)."""
    measured = (turn_prompt_tokens(Tokenizer.load(fleet.model, fleet.replicas[0].info.get(
        "model_path")), **workload) if fleet.replicas else None)
    per_session = session_blocks(block_size=fleet.block_size, prompt_tokens=measured,
                                 **workload)
    return {"engine": fleet.engine, "block size": fleet.block_size, "KV blocks": fleet.num_blocks,
            "KV tokens": fleet.kv_tokens, "session blocks": per_session,
            "sessions it keeps": fleet.num_blocks / per_session,
            "hit ceiling": hit_ceiling(block_size=fleet.block_size, prompt_tokens=measured,
                                       **workload)}


def engine_comparison(rows: Sequence[dict], baseline: str) -> list[dict]:
    """Per engine in ``rows`` (``run_point``'s), at its largest session count: prefix-aware
    routing's hit rate and ``baseline``'s, their ratio, and both p99 TTFTs in seconds."""
    out = []
    for engine in dict.fromkeys(r.get("engine", "mini") for r in rows):
        mine = [r for r in rows if r.get("engine", "mini") == engine]
        n = max(r["sessions"] for r in mine)
        top = {r["policy"]: r for r in mine if r["sessions"] == n}
        pre, base = top["prefix"], top[baseline]
        ph, bh = pre["hit rate"] or 0.0, base["hit rate"] or 0.0
        out.append({"engine": engine, "sessions": n, "prefix hit rate": ph,
                    f"{baseline} hit rate": bh, "hit-rate ratio": ph / bh if bh else None,
                    "prefix p99 TTFT s": (pre["p99 TTFT ms"] or 0.0) / 1e3,
                    f"{baseline} p99 TTFT s": (base["p99 TTFT ms"] or 0.0) / 1e3})
    return out


def _per_engine(value: Any, engine: str) -> Any:
    return value.get(engine) if isinstance(value, dict) else value


def figure(rows: Sequence[dict], ceiling: float | dict | None = None,
           keeps: float | dict | None = None, replicas: int = 2):
    """Per engine in ``rows`` (a row of panels each; rows without "engine" are the teaching
    engine's), left: the fleet's prefix-cache hit rate against the number of sessions, per
    policy (dotted: ``ceiling``, every session at home on a replica with room; dashed, given
    ``keeps``, the sessions one replica's cache keeps: where a fleet that caches every session
    everywhere fills up, and ``replicas`` times that, where one that caches each once does).
    Right: p99 TTFT, on one scale for every engine. ``ceiling`` and ``keeps``: one number, or
    one per engine."""
    from workshop.plots import new_figure
    from workshop.session import engine_name

    engines = list(dict.fromkeys(r.get("engine", "mini") for r in rows))
    fig = new_figure((11.5, 4.2 * len(engines)))
    grid = fig.subplots(len(engines), 2, squeeze=False, sharex=True, sharey="col")
    styles = {"prefix": ("tab:green", "o"), "spread": ("tab:blue", "s"),
              "round_robin": ("tab:orange", "^"), "concentrate": ("tab:red", "D")}
    for (ax1, ax2), engine in zip(grid, engines):
        mine_all = [r for r in rows if r.get("engine", "mini") == engine]
        for p in dict.fromkeys(r["policy"] for r in mine_all):
            mine = sorted((r for r in mine_all if r["policy"] == p), key=lambda r: r["sessions"])
            color, marker = styles.get(p, ("tab:grey", "x"))
            x = [r["sessions"] for r in mine]
            ax1.plot(x, [np.nan if r["hit rate"] is None else r["hit rate"] for r in mine],
                     marker=marker, color=color, label=p)
            ax2.plot(x, [np.nan if r["p99 TTFT ms"] is None else r["p99 TTFT ms"] / 1e3
                         for r in mine], marker=marker, color=color, label=p)
        top = _per_engine(ceiling, engine)
        if top is not None:
            ax1.axhline(top, color="grey", linestyle=":", linewidth=1,
                        label="every turn after the first at home")
        kept = _per_engine(keeps, engine)
        if kept is not None:
            for x, what, style in ((kept, "one cache's worth of sessions", "--"),
                                   (replicas * kept, f"{replicas} caches' worth", "-.")):
                if x <= max(r["sessions"] for r in rows) * 1.05:
                    ax1.axvline(x, color="grey", linestyle=style, linewidth=1, label=what)
        who = f"{engine_name(engine)}: " if len(engines) > 1 else ""
        ax1.set_title(f"{who}prefix-cache hit rate, whole fleet" if who else
                      "Prefix-cache hit rate, whole fleet")
        ax1.set_ylabel("prompt tokens found in a cache")
        ax1.set_ylim(-0.02, 1.0)
        ax2.set_title(f"{who}p99 time to first token" if who else "p99 time to first token")
        ax2.set_ylabel("seconds")
        for ax in (ax1, ax2):
            ax.set_xticks(sorted({r["sessions"] for r in rows}))
            ax.tick_params(labelbottom=True)
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=8)
    for ax in grid[-1]:
        ax.set_xlabel("concurrent sessions")
    # Set once all engines are drawn: the column shares it, and a row's own top would clip.
    p99 = [r["p99 TTFT ms"] / 1e3 for r in rows if r["p99 TTFT ms"] is not None]
    grid[0][1].set_ylim(0, max(p99, default=1.0) * 1.08)
    return fig


def tenant_figure(rows: Sequence[dict], threshold_ms: Sequence[float | None] = ()):
    """Tenant B's time to first token per probe (``tenant_isolation.measure``'s rows): probes
    of a prompt A had just sent against fresh ones, without salts (left) and with a salt per
    tenant (right); dashed, per setting, the best threshold if given (``threshold_ms``, in the
    settings' order: without, then with)."""
    from workshop.plots import new_figure

    fig = new_figure((10.5, 3.8))
    axes = fig.subplots(1, 2, sharey=True)
    rng = np.random.default_rng(0)                  # horizontal jitter only
    for k, (ax, salted) in enumerate(zip(axes, (False, True))):
        for x, sent, color, what in ((0, True, "tab:red", "A had sent it"),
                                     (1, False, "tab:blue", "fresh prompt")):
            y = [r["ttft_ms"] for r in rows if r["salts"] == salted and r["sent_by_a"] == sent
                 and r["ttft_ms"] is not None]
            ax.scatter(x + rng.uniform(-0.12, 0.12, len(y)), y, color=color, alpha=0.7,
                       label=what)
        t = threshold_ms[k] if k < len(threshold_ms) else None
        if t is not None:
            ax.axhline(t, color="grey", linestyle="--", linewidth=1, label="best threshold")
        ax.set_xticks([0, 1], ["A had sent it", "fresh"])
        ax.set_xlim(-0.5, 1.5)
        ax.set_title("a salt per tenant" if salted else "no salts (one shared cache)")
        ax.set_xlabel("what tenant B probed")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    axes[0].set_ylabel("B's time to first token (ms)")
    axes[0].set_ylim(bottom=0)
    return fig


__all__ = ["ChatSession", "Fleet", "capacity", "empty_cache", "engine_comparison", "figure",
           "hit_ceiling", "imbalance", "replica_args", "replica_cores", "run_point",
           "session_blocks", "session_workload", "start_fleet", "tenant_figure",
           "turn_prompt_tokens", "vllm_blocks",
           "vllm_kv_bytes_per_token", "vllm_kv_gib", "vllm_replica_args", "vllm_unavailable"]
