"""Disaggregated prefill and decode: the teaching engine in two processes, measured live.

Notebook 17's helpers. Three set-ups run the same workload (``make_workload``: a few
**running streams** that decode from the start, plus **long prompts** arriving at set times):

* ``colocated, chunked``: one process, one ``LLMEngine`` with 2 torch threads, chunked
  prefill with a step budget of ``chunk_tokens`` tokens (a long prompt is split over steps,
  each shared with the streams' decodes);
* ``colocated, whole prompts``: the same engine with chunked prefill off (and a step budget
  of ``max_model_len``, as vLLM does without chunking, so a long prompt is admitted at once
  and prefilled in one step while the streams wait);
* ``disaggregated``: a **prefill process** and a **decode process**, one ``LLMEngine`` and one
  torch thread each (so both kinds of set-up use the machine's 2 cores). Every request is
  prefilled by the prefill process, which samples its first token, then sends its token ids
  and the KV cache of its prompt (``cold_start.kv_to_bytes``, bytes counted) over a Unix
  socket pair (``multiprocessing.Pipe``) to the decode process, which writes it into its own
  blocks (``LLMEngine.add_request_with_kv``) and decodes the rest.

Processes start with multiprocessing's ``spawn`` context; the driver (the caller's process)
sends each request at its arrival time and records every token's time, stamped by the
process that produced it with ``time.perf_counter`` (CLOCK_MONOTONIC on Linux: one clock for
every process on the machine). If a worker process dies, the driver raises ``WorkerDied``
at once (it waits on the processes' sentinels, not only on their sockets); if no worker
says anything for ``stall_s`` seconds, ``TimeoutError``: nothing hangs.

Definitions used by the rows (all times in seconds unless the key says ms):

* **gap**: time between two consecutive tokens of one running stream (its ITL);
* **TTFT**: a request's first token time minus the time the driver sent it;
* **goodput**: requests per second (over the run's wall time) that met both objectives:
  TTFT <= ``ttft_ms`` and every gap <= ``itl_ms``;
* **stall per long prompt**: decode time the running streams lost to the long prompts, per
  long prompt: for each stream, the sum over its gaps of how much each exceeds the stream's
  median gap (its steady pace: most of its gaps are plain decode steps), averaged over the
  streams and divided by the number of long prompts. In the disaggregated set-up it is what
  taking in the KV, and sharing the machine with the prefill process, cost the decode
  process. Noise (other work on the machine) adds to it in every set-up alike;
* **break-even link speed**: the hand-off avoids ``stall(colocated) - stall(disaggregated)``
  seconds of the streams' time per long prompt. If the decode process must wait for the KV
  bytes to arrive (no overlap of transfer and decoding), the hand-off pays while
  ``KV bytes / link < that saving``, so it stops paying below
  ``break-even = 8 x KV bytes per long prompt / saving`` bits per second. With a saving of
  0 or less it never pays. (An engine that overlaps the transfer with decoding, writing the
  KV into pre-allocated blocks by RDMA, makes the streams never wait: the link then delays
  only the long request's second token.)
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from multiprocessing import get_context
from multiprocessing.connection import wait
from typing import Callable, Sequence

from workshop.bench.request_metrics import percentile
from workshop.engine_lab.cold_start import kv_from_bytes, kv_to_bytes, network_seconds  # noqa: F401  (notebook 17's)

SETUPS = ("colocated, chunked", "colocated, whole prompts", "disaggregated")
COLORS = {"colocated, chunked": "#1f77b4", "colocated, whole prompts": "#d62728",
          "disaggregated": "#2ca02c"}


class WorkerDied(RuntimeError):
    """A worker process ended while requests were unfinished."""


@dataclass(frozen=True)
class Request:
    request_id: str
    prompt: list[int]
    max_tokens: int
    arrival_s: float          # streams: after the run's start; long prompts: after every
    kind: str                 # stream has its first token ("stream" | "long")


def make_workload(vocab_size: int, streams: int = 2, stream_prompt: int = 32,
                  stream_tokens: int = 40, long_prompts: int = 1, long_len: int = 256,
                  long_tokens: int = 4, first_arrival_s: float = 1.0, spacing_s: float = 1.5,
                  seed: int = 0) -> list[Request]:
    """``streams`` short prompts at time 0, each decoding ``stream_tokens`` tokens, and
    ``long_prompts`` prompts of ``long_len`` tokens arriving ``first_arrival_s``,
    ``first_arrival_s + spacing_s``, ... seconds after every stream has its first token (so
    the streams are running when they come, whatever the set-up's start-up pace), each
    asking for ``long_tokens`` tokens. Token ids are random (seeded); greedy decoding, no
    stop token."""
    import torch
    gen = torch.Generator().manual_seed(seed)

    def prompt(n: int) -> list[int]:
        return torch.randint(0, vocab_size, (n,), generator=gen).tolist()
    out = [Request(f"stream-{i}", prompt(stream_prompt), stream_tokens, 0.0, "stream")
           for i in range(streams)]
    out += [Request(f"long-{i}", prompt(long_len), long_tokens, first_arrival_s + i * spacing_s,
                    "long") for i in range(long_prompts)]
    return out


# -- the worker processes ---------------------------------------------------------------------

def _engine(spec: dict):
    from mini_engine import LLMEngine, SamplingParams
    engine = LLMEngine(spec["model_path"], kv_cache_gib=spec["kv_cache_gib"],
                       num_threads=spec["threads"], chunked_prefill=spec["chunked"],
                       max_num_batched_tokens=spec["budget"], history=16)
    # first steps pay one-time set-up (allocations, kernel choices): not in the measurement
    engine.generate([list(range(1, 65)), [5, 6, 7]], SamplingParams(max_tokens=3, ignore_eos=True))
    return engine


def _worker(role: str, spec: dict, control, kv_link) -> None:
    """One process's loop. ``control``: to and from the driver (requests in; "ready", token
    events and stats out). ``kv_link``: prefill -> decode socket (None when colocated)."""
    from mini_engine import SamplingParams
    engine = _engine(spec)
    control.send(("ready", role))
    stats = {"role": role, "threads": spec["threads"], "busy_s": 0.0, "steps": 0,
             "prompt_tokens": 0, "generated_tokens": 0}
    handoffs: list[dict] = []
    waiting_first: set[str] = set()      # prefill: requests whose first token is not out yet
    wants: dict[str, int] = {}           # prefill: each request's max_tokens
    inputs = [control] + ([kv_link] if role == "decode" else [])
    while True:
        ready = wait(inputs, timeout=0 if engine.has_unfinished() else None)
        for conn in ready:
            if conn is kv_link:          # a prefilled request arrives with its KV
                t0 = time.perf_counter()
                header = json.loads(kv_link.recv_bytes())
                payload = kv_link.recv_bytes()
                kv = kv_from_bytes(payload, _kv_like(engine, header["kv_tokens"]))
                engine.add_request_with_kv(header["token_ids"], kv, SamplingParams(
                    max_tokens=header["max_tokens"], ignore_eos=True), header["request_id"])
                handoffs.append({"request_id": header["request_id"], "receive_s":
                                 time.perf_counter() - t0, "kv_bytes": len(payload)})
                continue
            msg = control.recv()
            if msg[0] == "stop":
                control.send(("stats", stats, handoffs))
                return
            req: Request = msg[1]
            if role == "prefill":
                wants[req.request_id] = req.max_tokens
                waiting_first.add(req.request_id)
            engine.add_request(req.prompt, SamplingParams(
                max_tokens=min(req.max_tokens, 2) if role == "prefill" else req.max_tokens,
                ignore_eos=True), req.request_id)
        if not engine.has_unfinished():
            continue
        t0 = time.perf_counter()
        outputs = engine.step()
        stamp = time.perf_counter()
        stats["busy_s"] += stamp - t0
        stats["steps"] += 1
        stats["prompt_tokens"] += sum(n for _, n, kind in engine.history[-1].scheduled
                                      if kind == "prefill" and n > 1)
        new = [(o.request_id, o.new_token_ids, o.finish_reason) for o in outputs if o.new_token_ids]
        stats["generated_tokens"] += sum(len(t) for _, t, _ in new)
        if role == "prefill":
            new = [(rid, toks, fin if fin or wants[rid] <= 1 else None) for rid, toks, fin in new]
        if new:
            control.send(("tokens", stamp, new))
        if role != "prefill":
            continue
        for rid, _, _ in new:            # hand off every request that has its first token
            waiting_first.discard(rid)
            if wants[rid] <= 1:
                continue
            t0 = time.perf_counter()
            token_ids, kv = engine.export_kv(rid)
            engine.abort(rid)
            payload = kv_to_bytes(kv)
            header = json.dumps({"request_id": rid, "token_ids": token_ids,
                                 "kv_tokens": len(token_ids) - 1,
                                 "max_tokens": wants[rid] - 1}).encode()
            try:
                kv_link.send_bytes(header)
                kv_link.send_bytes(payload)
            except OSError:              # the decode process is gone: the driver says so
                return
            handoffs.append({"request_id": rid, "send_s": time.perf_counter() - t0,
                             "kv_bytes": len(payload), "header_bytes": len(header),
                             "kv_tokens": len(token_ids) - 1})


def _kv_like(engine, tokens: int):
    """Empty tensors shaped like ``tokens`` tokens of this engine's exported KV (what
    ``kv_from_bytes`` needs to cut the bytes back into tensors)."""
    import torch
    cache = engine.runner.kv_cache
    out = []
    for layer in cache.layers:
        row = []
        for i, t in enumerate(layer):
            shape = list(t.shape)
            shape[cache.layout.slot_axis(i)] = tokens
            row.append(torch.empty(shape, dtype=t.dtype, device="meta"))
        out.append(row)
    return out


# -- the driver -----------------------------------------------------------------------------------

@dataclass
class Run:
    """One set-up's run: per request, when it was sent and when each token came (seconds
    after the start), the tokens, and each process's counters and hand-offs."""
    setup: str
    requests: list[Request]
    sent: dict[str, float] = field(default_factory=dict)
    times: dict[str, list[float]] = field(default_factory=dict)
    tokens: dict[str, list[int]] = field(default_factory=dict)
    processes: list[dict] = field(default_factory=list)
    handoffs: list[dict] = field(default_factory=list)
    wall_s: float = 0.0


class Cluster:
    """The processes of one set-up (``SETUPS``), started by ``start`` (or ``with``), each
    warmed up before ``run`` sends anything. ``processes``: role -> ``Process``."""

    def __init__(self, setup: str, model_path: str | None = None, chunk_tokens: int = 128,
                 colocated_threads: int = 2, kv_cache_gib: float = 0.25,
                 max_model_len: int = 2048):
        if setup not in SETUPS:
            raise ValueError(f"unknown set-up {setup!r}: one of {', '.join(SETUPS)}")
        if model_path is None:
            from reference_server.models import resolve_model
            model_path = resolve_model("smollm2-135m").path
        self.setup = setup
        base = {"model_path": str(model_path), "kv_cache_gib": kv_cache_gib}
        whole = {"chunked": False, "budget": max_model_len}
        if setup == "disaggregated":
            self.specs = {"prefill": {**base, **whole, "threads": 1},
                          "decode": {**base, "chunked": True, "budget": 512, "threads": 1}}
        else:
            chunked = setup == "colocated, chunked"
            self.specs = {"colocated": {**base, "threads": colocated_threads,
                                        **({"chunked": True, "budget": chunk_tokens} if chunked
                                           else whole)}}
        self.processes: dict = {}
        self.controls: dict = {}

    def start(self, timeout_s: float = 180) -> "Cluster":
        ctx = get_context("spawn")
        kv_ends = ctx.Pipe() if self.setup == "disaggregated" else (None, None)
        for role, spec in self.specs.items():
            mine, theirs = ctx.Pipe()
            link = {"prefill": kv_ends[0], "decode": kv_ends[1]}.get(role)
            p = ctx.Process(target=_worker, args=(role, spec, theirs, link),
                            name=f"disagg-{role}", daemon=True)
            p.start()
            theirs.close()
            self.processes[role], self.controls[role] = p, mine
        for end in kv_ends:
            if end is not None:
                end.close()          # only the workers hold the KV socket now
        deadline = time.monotonic() + timeout_s
        for role in self.specs:
            self._expect(role, "ready", deadline, set())
        return self

    def _expect(self, role: str, what: str, deadline: float, unfinished: set[str]):
        conn, proc = self.controls[role], self.processes[role]
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"the {role} process sent no {what!r} in time")
            if wait([conn, proc.sentinel], timeout=left) and conn.poll():
                try:
                    msg = conn.recv()
                except EOFError:
                    self._died(role, unfinished)
                if msg[0] == what:
                    return msg
            elif not proc.is_alive():
                self._died(role, unfinished)

    def _died(self, role: str, unfinished: set[str]):
        """Raise ``WorkerDied`` naming the process that ended (``role``, or one that ended
        with an error before it: a prefill process whose decode peer is gone exits cleanly
        after it) and what was unfinished."""
        proc = self.processes[role]
        proc.join(timeout=1)
        others = [r for r, p in self.processes.items()
                  if r != role and not p.is_alive() and p.exitcode not in (None, 0)]
        if proc.exitcode == 0 and others:
            role, proc = others[0], self.processes[others[0]]
        raise WorkerDied(f"the {role} process (pid {proc.pid}) died with exit code "
                         f"{proc.exitcode}" + (f" while {len(unfinished)} request(s) were "
                                               f"unfinished: {sorted(unfinished)}"
                                               if unfinished else " before it was ready"))

    def run(self, requests: Sequence[Request], timeout_s: float = 600, stall_s: float = 60,
            on_tokens: Callable[["Cluster", str, list[int]], None] | None = None) -> Run:
        """Send each request at its arrival time to the process that takes requests (the
        prefill one, or the colocated one) and collect every token until all are done.
        Raises ``WorkerDied`` as soon as a worker process ends, ``TimeoutError`` after
        ``stall_s`` seconds without any token or ``timeout_s`` in all."""
        entry = "prefill" if self.setup == "disaggregated" else "colocated"
        out = Run(self.setup, list(requests))
        todo = sorted(requests, key=lambda r: r.arrival_s)
        want = {r.request_id: r.max_tokens for r in requests}
        unfinished = set(want)
        roles = list(self.controls)
        by_conn = {self.controls[r]: r for r in roles}
        by_sentinel = {self.processes[r].sentinel: r for r in roles}
        streams = {r.request_id for r in requests if r.kind == "stream"}
        t0 = time.perf_counter()
        last_heard = t0
        running_at = t0 if not streams else None     # when every stream has a token

        def due(r: Request) -> float:                # seconds after t0; inf: not yet known
            if r.kind == "stream":
                return r.arrival_s
            return running_at - t0 + r.arrival_s if running_at is not None else float("inf")
        while unfinished:
            now = time.perf_counter()
            todo.sort(key=due)
            while todo and due(todo[0]) <= now - t0:
                req = todo.pop(0)
                try:
                    self.controls[entry].send(("request", req))
                except OSError:
                    self._died(entry, unfinished)
                out.sent[req.request_id] = time.perf_counter() - t0
            if now - last_heard > stall_s or now - t0 > timeout_s:
                raise TimeoutError(f"{self.setup}: no token for {now - last_heard:.0f} s "
                                   f"({len(unfinished)} request(s) unfinished after "
                                   f"{now - t0:.0f} s)")
            limit = min(stall_s - (now - last_heard),
                        (due(todo[0]) - (now - t0)) if todo else stall_s)
            for ready in wait(list(by_conn) + list(by_sentinel), timeout=max(0.0, limit)):
                if ready in by_sentinel:
                    self._died(by_sentinel[ready], unfinished)
                try:
                    msg = ready.recv()
                except EOFError:
                    self._died(by_conn[ready], unfinished)
                if msg[0] != "tokens":
                    continue
                last_heard = time.perf_counter()
                _, stamp, new = msg
                for rid, toks, _fin in new:
                    out.times.setdefault(rid, []).extend([stamp - t0] * len(toks))
                    out.tokens.setdefault(rid, []).extend(toks)
                    if len(out.tokens[rid]) >= want[rid]:
                        unfinished.discard(rid)
                    if on_tokens is not None:
                        on_tokens(self, rid, toks)
                if running_at is None and all(s in out.times for s in streams):
                    running_at = t0 + max(out.times[s][0] for s in streams)
        out.wall_s = max(t[-1] for t in out.times.values())
        deadline = time.monotonic() + 30
        for role in roles:
            self.controls[role].send(("stop",))
            _, stats, handoffs = self._expect(role, "stats", deadline, set())
            out.processes.append(stats)
            if role == "prefill":
                out.handoffs = handoffs
            elif role == "decode":
                received = {h["request_id"]: h["receive_s"] for h in handoffs}
                for h in out.handoffs:
                    h["receive_s"] = received.get(h["request_id"])
        return out

    def close(self) -> None:
        """End this cluster's processes (the ones it started), however the run went."""
        for conn in self.controls.values():
            try:
                conn.send(("stop",))
            except OSError:
                pass
        for p in self.processes.values():
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
        for conn in self.controls.values():
            conn.close()

    def __enter__(self) -> "Cluster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()


def run_setup(setup: str, requests: Sequence[Request], **cluster_args) -> Run:
    """Start ``setup``'s processes, run ``requests`` on them, stop them."""
    with Cluster(setup, **cluster_args) as cluster:
        return cluster.run(requests)


# -- rows -----------------------------------------------------------------------------------------

def stream_gaps(run: Run) -> dict[str, list[tuple[float, float]]]:
    """Per running stream: (time of the token, gap since the previous one), seconds."""
    return {r.request_id: [(b, b - a) for a, b in zip(run.times[r.request_id],
                                                       run.times[r.request_id][1:])]
            for r in run.requests if r.kind == "stream"}


def stall_per_long_prompt(run: Run) -> float:
    """Seconds of the streams' decoding lost per long prompt (module docstring)."""
    longs = sum(r.kind == "long" for r in run.requests)
    lost = []
    for gaps in stream_gaps(run).values():
        if gaps:
            pace = percentile([g for _, g in gaps], 50)
            lost.append(sum(max(0.0, g - pace) for _, g in gaps))
    return sum(lost) / len(lost) / max(longs, 1) if lost else float("nan")


def request_row(run: Run, r: Request) -> dict:
    times = run.times.get(r.request_id, [])
    gaps = [b - a for a, b in zip(times, times[1:])]
    return {"request": r.request_id, "kind": r.kind, "ttft_s": times[0] - run.sent[r.request_id]
            if times else float("inf"), "max_gap_s": max(gaps, default=0.0), "tokens": len(times)}


def summary_rows(runs: Sequence[Run], ttft_ms: float, itl_ms: float) -> list[dict]:
    """One row per set-up: the streams' gaps, the long prompts' TTFT, goodput under
    (``ttft_ms``, ``itl_ms``), and KV bytes per request handed off."""
    rows = []
    for run in runs:
        gaps = [g for v in stream_gaps(run).values() for _, g in v]
        reqs = [request_row(run, r) for r in run.requests]
        longs = [q["ttft_s"] for q in reqs if q["kind"] == "long"]
        met = [q for q in reqs if q["ttft_s"] * 1e3 <= ttft_ms and q["max_gap_s"] * 1e3 <= itl_ms]
        kv = [h["kv_bytes"] for h in run.handoffs]
        rows.append({
            "set-up": run.setup,
            "stream gap p50 (ms)": percentile(gaps, 50) * 1e3,
            "stream gap p99 (ms)": percentile(gaps, 99) * 1e3,
            "long-prompt TTFT mean (ms)": sum(longs) / len(longs) * 1e3 if longs else float("nan"),
            "long-prompt TTFT max (ms)": max(longs, default=float("nan")) * 1e3,
            "met objective": f"{len(met)} of {len(reqs)}",
            "goodput (req/s)": len(met) / run.wall_s if run.wall_s else 0.0,
            "KV bytes per request": sum(kv) / len(kv) if kv else 0,
            "stall per long prompt (ms)": stall_per_long_prompt(run) * 1e3,
            "wall (s)": run.wall_s})
    return rows


def process_rows(runs: Sequence[Run]) -> list[dict]:
    """One row per process: its threads, what it computed, and its rates over the run."""
    return [{"set-up": run.setup, "process": p["role"], "threads": p["threads"],
             "prompt tokens": p["prompt_tokens"], "generated tokens": p["generated_tokens"],
             "prompt tokens/s": p["prompt_tokens"] / run.wall_s,
             "generated tokens/s": p["generated_tokens"] / run.wall_s,
             "busy share": p["busy_s"] / run.wall_s}
            for run in runs for p in run.processes]


def handoff_rows(run: Run) -> list[dict]:
    """Per handed-off request: tokens whose KV moved, bytes, and the two ends' seconds."""
    return [{"request": h["request_id"], "KV tokens": h["kv_tokens"], "KV bytes": h["kv_bytes"],
             "header bytes": h["header_bytes"],
             "prefill side: export + send (ms)": h["send_s"] * 1e3,
             "decode side: receive + write (ms)": (h["receive_s"] or float("nan")) * 1e3}
            for h in run.handoffs]


def breakeven(colocated: Run, disaggregated: Run, long_request: str | None = None) -> dict:
    """The link speed below which handing off the KV stops paying (module docstring): the
    saving is the colocated run's stall per long prompt minus the disaggregated run's."""
    saved = stall_per_long_prompt(colocated) - stall_per_long_prompt(disaggregated)
    kv = [h["kv_bytes"] for h in disaggregated.handoffs
          if long_request is None and h["request_id"].startswith("long")
          or h["request_id"] == long_request]
    kv_bytes = sum(kv) / len(kv) if kv else 0.0
    return {"against": colocated.setup, "KV bytes per long prompt": kv_bytes,
            "stall avoided per long prompt (ms)": saved * 1e3,
            "break-even link (Gb/s)": kv_bytes * 8 / saved / 1e9 if saved > 0 else None}


# -- figure ---------------------------------------------------------------------------------------

def gaps_figure(runs: Sequence[Run]):
    """The running streams' gaps over time, one panel per set-up, the long prompts' arrivals
    (dashed) and first tokens (dotted) marked."""
    from workshop.plots import new_figure
    fig = new_figure((9, 2.3 * len(runs) + 0.6))
    axes = fig.subplots(len(runs), 1, sharex=True, sharey=True, squeeze=False)[:, 0]
    top = max((g for run in runs for v in stream_gaps(run).values() for _, g in v), default=1)
    for ax, run in zip(axes, runs):
        c = COLORS.get(run.setup, "grey")
        gaps = stream_gaps(run)
        for i, (rid, pts) in enumerate(gaps.items()):
            ax.plot([t for t, _ in pts], [g * 1e3 for _, g in pts], ".-", color=c,
                    alpha=0.9 - 0.5 * i / max(1, len(gaps)), lw=1, ms=4,
                    label="running streams" if i == 0 else None)
        for j, r in enumerate(x for x in run.requests if x.kind == "long"):
            ax.axvline(run.sent[r.request_id], color="black", ls="--", lw=1,
                       label="long prompt sent" if j == 0 else None)
            if run.times.get(r.request_id):
                ax.axvline(run.times[r.request_id][0], color="black", ls=":", lw=1,
                           label="its first token" if j == 0 else None)
        ax.set_title(run.setup, fontsize=10, loc="left")
        ax.set_ylabel("gap (ms)")
        ax.set_ylim(0, top * 1e3 * 1.1)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8, loc="upper right")
    axes[-1].set_xlabel("seconds since the run began")
    fig.suptitle("Gaps between the running streams' tokens while long prompts arrive")
    return fig
