"""Notebook 16's measurements: routing that knows the prefix cache (issue 37).

A fleet of teaching-engine replicas, each with a small prefix cache (``num_blocks`` KV blocks,
which hold both the running requests and the cached prefixes), and one gateway process per
routing policy in front of the same replicas (``workshop.api_gateway``). A multi-turn chat
workload, each session with a long system prompt of its own, goes through each gateway in
turn, the replicas' caches emptied before each run; per run, from each replica's ``/metrics``
its prefix-cache hit rate (``vllm:prefix_cache_hits_total`` over ``..._queries_total``, prompt
tokens), from the gateway's ``/gateway/stats`` the requests each replica served, from the
harness (``workshop.bench``) TTFT percentiles and output throughput.

The harness's own multi-turn workloads do not fit: ``agentic`` gives every session the same
system prompt (one prefix for the whole fleet, which any policy finds), ``shared-prefix`` sends
single requests. ``session_workload`` builds the one this needs on the harness's ``Session``.

Data only: rows and figures, no prose.
"""

from __future__ import annotations

import asyncio
import copy
import random
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from reference_server import prometheus
from reference_server.kv import blocks_for
from workshop.bench import run_benchmark
from workshop.bench.server_metrics import PREFIX_HITS, PREFIX_QUERIES
from workshop.bench.tokenizer import Tokenizer, filler
from workshop.bench.workloads import Request, Send, Session, Workload


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
                   block_size: int = 16, template_tokens: int = 30, **_: Any) -> int:
    """KV blocks one session's last turn fills (prompt + reply), about: what a replica must
    keep to serve that session's next turn from its cache. ``template_tokens``: the chat
    template's role markers and the system prompt's opening words."""
    last = _prompt_tokens(turns - 1, prefix_len, question_len, output_len, template_tokens)
    return blocks_for(last + output_len, block_size)


# -- the fleet -------------------------------------------------------------------------------

@dataclass
class Fleet:
    replicas: list[Any]                     # workshop.session.Session, one per replica
    gateways: dict[str, Any]                # policy -> workshop.api_gateway.launch.RunningGateway
    num_blocks: int
    block_size: int = 16
    keys: list[dict] = field(default_factory=list)

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


def start_fleet(num_replicas: int, num_blocks: int, policies: Sequence[str], *,
                prefix_balance: int = 4, prefix_threshold: float = 0.5,
                threads: int = 1, max_model_len: int = 1024) -> Fleet:
    """``num_replicas`` teaching-engine servers side by side (``workshop.session.start_many``),
    each warmed up by one request, and a gateway per policy in front of all of them."""
    import secrets

    import workshop.session
    from workshop.api_gateway import launch

    replicas = list(workshop.session.start_many("mini", {
        f"replica {i}": replica_args(num_blocks, threads, max_model_len)
        for i in range(num_replicas)}).values())
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
    block = int(replicas[0].info.get("block_size") or 16)
    return Fleet(replicas, gateways, num_blocks, block, keys)


def _warm_up(replica: Any) -> None:
    import httpx
    httpx.post(replica.base_url + "/v1/completions", headers=replica.headers, timeout=120,
               json={"model": replica.model, "prompt": "Hello", "max_tokens": 2}).raise_for_status()


def _prefix_counts(replica: Any) -> tuple[float, float]:
    m = replica.metrics()
    return (prometheus.first(m, PREFIX_QUERIES) or 0.0, prometheus.first(m, PREFIX_HITS) or 0.0)


def imbalance(served: Sequence[int]) -> float | None:
    """Max over mean requests per replica: 1.0 is perfectly even, N is one replica of N."""
    total = sum(served)
    return max(served) / (total / len(served)) if total else None


def run_point(fleet: Fleet, policy: str, num_sessions: int, seed: int | None = None,
              **workload: Any) -> dict:
    """One run: ``num_sessions`` sessions (``session_workload``; ``seed`` defaults to the
    session count, so each count has prefixes of its own) through ``policy``'s gateway, all
    sessions at once, the replicas' prefix caches emptied first. One row of numbers."""
    from workshop.live_requests import reset_prefix_cache

    gw = fleet.gateways[policy]
    tok = Tokenizer.load(fleet.model, fleet.replicas[0].info.get("model_path"))
    wl = session_workload(tok, num_sessions, seed=num_sessions if seed is None else seed,
                          **workload)
    for r in fleet.replicas:
        reset_prefix_cache(r)
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
    row = {"policy": policy, "sessions": num_sessions, "requests": s["completed"],
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
                template_tokens: int = 30, block_size: int = 16, **_: Any) -> float:
    """The hit rate of a session served wholly from one replica with room for all of it: each
    turn after the first finds the previous turn's prompt and reply in the cache (rounded down
    to whole blocks); the first turn finds nothing. Prompt tokens found over prompt tokens."""
    sent = found = 0
    prev = 0
    for t in range(turns):
        prompt = _prompt_tokens(t, prefix_len, question_len, output_len, template_tokens)
        sent += prompt
        found += (prev // block_size) * block_size if t else 0
        prev = prompt + output_len
    return found / sent if sent else 0.0


def figure(rows: Sequence[dict], ceiling: float | None = None, keeps: float | None = None,
           replicas: int = 2):
    """Left: the fleet's prefix-cache hit rate against the number of sessions, per policy
    (dotted: ``ceiling``, every session at home on a replica with room; dashed, given
    ``keeps``, the sessions one replica's cache keeps: where a fleet that caches every session
    everywhere fills up, and ``replicas`` times that, where one that caches each once does).
    Right: p99 TTFT."""
    from workshop.plots import new_figure

    fig = new_figure((11.5, 4.2))
    ax1, ax2 = fig.subplots(1, 2)
    policies = list(dict.fromkeys(r["policy"] for r in rows))
    styles = {"prefix": ("tab:green", "o"), "spread": ("tab:blue", "s"),
              "round_robin": ("tab:orange", "^"), "concentrate": ("tab:red", "D")}
    for p in policies:
        mine = sorted((r for r in rows if r["policy"] == p), key=lambda r: r["sessions"])
        color, marker = styles.get(p, ("tab:grey", "x"))
        x = [r["sessions"] for r in mine]
        ax1.plot(x, [np.nan if r["hit rate"] is None else r["hit rate"] for r in mine],
                 marker=marker, color=color, label=p)
        ax2.plot(x, [np.nan if r["p99 TTFT ms"] is None else r["p99 TTFT ms"] / 1e3
                     for r in mine], marker=marker, color=color, label=p)
    if ceiling is not None:
        ax1.axhline(ceiling, color="grey", linestyle=":", linewidth=1,
                    label="every turn after the first at home")
    if keeps is not None:
        for x, what, style in ((keeps, "one cache's worth of sessions", "--"),
                               (replicas * keeps, f"{replicas} caches' worth", "-.")):
            if x <= max(r["sessions"] for r in rows) * 1.05:
                ax1.axvline(x, color="grey", linestyle=style, linewidth=1, label=what)
    ax1.set_title("Prefix-cache hit rate, whole fleet")
    ax1.set_ylabel("prompt tokens found in a cache")
    ax1.set_ylim(-0.02, 1.0)
    ax2.set_title("p99 time to first token")
    ax2.set_ylabel("seconds")
    ax2.set_ylim(bottom=0)
    for ax in (ax1, ax2):
        ax.set_xlabel("concurrent sessions")
        ax.set_xticks(sorted({r["sessions"] for r in rows}))
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
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


__all__ = ["ChatSession", "Fleet", "figure", "hit_ceiling", "imbalance", "replica_args",
           "run_point", "session_blocks", "session_workload", "start_fleet", "tenant_figure"]
