"""Paged vs contiguous KV memory, and static vs continuous batching: arithmetic and step traces.

Three ways to give a request KV memory, compared on the same request lengths:

* ``contiguous``: reserve ``max_len`` slots per request when it is admitted (what servers did
  before vLLM, and the teaching engine's ``--kv-layout contiguous``);
* ``exact``: reserve one contiguous region of the request's own final length (prompt + output),
  which needs the output length up front and leaves holes of odd sizes when requests leave;
* ``paged``: whole blocks of ``block_size`` slots, taken one at a time as tokens arrive, any
  free block will do (``reference_server.kv.blocks_for`` is the one rule for "whole blocks").

Wasted memory comes in two kinds: *internal* fragmentation, slots inside a reservation that
hold no token (the tail of the last block; the unreached part of a max-length reservation),
and *external* fragmentation, free slots that no waiting request can use because they lie in
holes too small for it. ``simulate`` replays a list of requests through a pool of a given size
step by step and measures both, with how many requests run at once.

The second part reads the teaching engine's own step trace (``mini_engine``'s
``LLMEngine.history`` of ``StepRecord``): when each request produced tokens, the gaps between
them, and a timeline picture; and a picture of what reading scattered blocks back costs
(``plot_gather_times``). Everything here is pure except ``sharegpt_lengths`` (reads the
installed ShareGPT file) and ``reschedule`` (swaps the scheduler of an idle engine).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

from reference_server import prometheus
from reference_server.kv import blocks_for

LAYOUTS = ("contiguous", "exact", "paged")
PREEMPTIONS = prometheus.NUM_PREEMPTIONS      # a counter: requests preempted since start


# -- one request's reservation ----------------------------------------------------------------

def reserved_slots(tokens: int, layout: str, block_size: int, max_len: int) -> int:
    """KV slots a request of ``tokens`` tokens (prompt + output) holds at its full length.

    ``contiguous`` rounds the max-length reservation to whole blocks, as the teaching engine
    does (``BlockManager.blocks_for``); ``exact`` reserves exactly its own length.
    """
    if layout == "contiguous":
        return blocks_for(max(tokens, max_len), block_size) * block_size
    if layout == "paged":
        return blocks_for(tokens, block_size) * block_size
    if layout == "exact":
        return tokens
    raise ValueError(f"unknown layout {layout!r}: {' | '.join(LAYOUTS)}")


def internal_waste(tokens: Sequence[int], layout: str, block_size: int, max_len: int) -> dict:
    """Slots reserved for these requests at their full length, slots holding a token, and the
    difference (internal fragmentation) as a share of what is reserved."""
    reserved = sum(reserved_slots(t, layout, block_size, max_len) for t in tokens)
    used = sum(tokens)
    return {"reserved": reserved, "used": used, "wasted": reserved - used,
            "wasted_pct": 100.0 * (reserved - used) / reserved if reserved else 0.0}


def fit_count(tokens: Sequence[int], capacity_slots: int, layout: str, block_size: int,
              max_len: int) -> int:
    """How many of these requests, taken in order, fit in the pool at once at full length.

    A paged pool holds whole blocks only (``capacity_slots // block_size`` of them).
    """
    if layout == "paged":
        capacity_slots = capacity_slots // block_size * block_size
    n, total = 0, 0
    for t in tokens:
        total += reserved_slots(t, layout, block_size, max_len)
        if total > capacity_slots:
            break
        n += 1
    return n


def length_summary(tokens: Sequence[int]) -> dict:
    """Mean, median, 90th percentile (nearest rank below) and longest of request lengths."""
    import statistics

    s = sorted(tokens)
    return {"mean": statistics.mean(s), "median": statistics.median(s),
            "p90": s[int(0.9 * (len(s) - 1))], "longest": s[-1]}


def server_rows(servers: dict[str, Any]) -> list[dict]:
    """One row per server (name -> a ``workshop.session`` handle of a teaching engine): its KV
    pool, block size and context limit from ``/server_info``, and its scheduling knobs."""
    return [{"server": name, **{k: s.info[k]
                                for k in ("kv_capacity_tokens", "block_size", "max_model_len")},
             **{k: s.info["extra"][k] for k in ("kv_layout", "scheduler", "chunked_prefill",
                                                "max_num_seqs",
                                                "max_num_batched_tokens")}}
            for name, s in servers.items()]


def predicted_burst(info: dict, layout: str, tokens_each: int, n: int) -> dict:
    """``n`` equal requests of ``tokens_each`` stored tokens on a server whose ``/server_info``
    is ``info``: how many run at once (``running``) and the share of its pool they hold
    (``usage``), by the block arithmetic above."""
    B, cap, L = int(info["block_size"]), int(info["kv_capacity_tokens"]), int(info["max_model_len"])
    fit = min(n, fit_count([tokens_each] * n, cap, layout, B, L))
    return {"running": fit, "usage": fit * reserved_slots(tokens_each, layout, B, L) / cap}


def burst_row(name: str, run: Any, info: dict, layout: str, prompt_tokens: int,
              max_tokens: int) -> dict:
    """One row for a burst of equal requests measured with ``kv_usage.measure_kv`` on a server
    whose ``/server_info`` is ``info``: the block arithmetic's prediction next to the gauges'
    peaks, the latest first token, the slowest request and how many completed."""
    n = len(run.requests)
    # at its peak a request stores prompt + answer - 1 tokens: the last token's KV is never written
    held = (run.requests[0].prompt_tokens or prompt_tokens) + max_tokens - 1
    pred = predicted_burst(info, layout, held, n)
    return {"server": name, "tokens stored per request": held,
            "predicted running": pred["running"], "peak running": run.peak_running,
            "peak waiting": run.peak_waiting, "predicted KV usage (%)": 100 * pred["usage"],
            "peak KV usage (%)": 100 * run.peak_usage,
            "latest first token (s)": max(r.ttft or 0.0 for r in run.requests),
            "slowest request (s)": max(r.end or 0.0 for r in run.requests),
            "completed": sum(r.error is None for r in run.requests)}


def external_fragmentation(holes: Iterable[int]) -> float:
    """Share of the free memory outside the largest free hole: 0 when all free memory is one
    region (a request as large as all free memory would fit), near 1 when it is crumbs."""
    holes = [h for h in holes if h > 0]
    free = sum(holes)
    return 0.0 if free == 0 else 1.0 - max(holes) / free


# -- a pool over time ---------------------------------------------------------------------------

@dataclass
class _Running:
    index: int
    prompt: int
    output: int
    start: int = 0            # first slot of the region (contiguous layouts)
    size: int = 0             # slots reserved (contiguous layouts) or blocks held (paged)
    held: int = 0             # tokens whose KV is stored
    generated: int = 0        # tokens sampled


@dataclass
class StepStats:
    running: int
    held: int                 # slots holding a token
    reserved: int             # slots owned by some request
    stranded: int             # free slots in holes too small for the request at the queue's head
    waiting: int


@dataclass
class SimResult:
    layout: str
    capacity: int
    steps: list[StepStats] = field(default_factory=list)
    preemptions: int = 0

    @property
    def busy_steps(self) -> list[StepStats]:
        """Steps with a request waiting: memory, not demand, was the limit (all steps if none)."""
        return [s for s in self.steps if s.waiting] or self.steps

    def _mean(self, f) -> float:
        steps = self.busy_steps
        return sum(f(s) for s in steps) / len(steps) if steps else 0.0

    @property
    def mean_running(self) -> float:
        """Requests running at once, mean over the busy steps."""
        return self._mean(lambda s: s.running)

    @property
    def peak_running(self) -> int:
        return max((s.running for s in self.steps), default=0)

    def pool_shares(self) -> dict[str, float]:
        """Mean share of the pool (%) per use over the busy steps: the four add up to 100."""
        c = self.capacity
        held = self._mean(lambda s: s.held) / c
        internal = self._mean(lambda s: s.reserved - s.held) / c
        external = self._mean(lambda s: s.stranded) / c
        return {"holding tokens": 100 * held, "internal waste": 100 * internal,
                "external waste": 100 * external,
                "free": max(0.0, 100 * (1 - held - internal - external))}   # not -1e-15


def _holes(regions: list[_Running], capacity: int) -> list[tuple[int, int]]:
    """Free (start, size) intervals of a contiguous pool, in address order."""
    out, at = [], 0
    for r in sorted(regions, key=lambda r: r.start):
        if r.start > at:
            out.append((at, r.start - at))
        at = r.start + r.size
    if at < capacity:
        out.append((at, capacity - at))
    return out


def simulate(requests: Sequence[tuple[int, int]], capacity_slots: int, layout: str,
             block_size: int = 16, max_len: int = 2048,
             max_num_seqs: int | None = None) -> SimResult:
    """Run ``(prompt tokens, output tokens)`` requests, all waiting at step 0, through a KV pool.

    One step: every running request stores the KV of its last sampled token (paged: taking a
    new block when it spills; with none free, the most recently admitted request is preempted
    and goes back to the head of the queue to start over, as vLLM does), then waiting requests
    are admitted first come first served while their memory fits (prefill + first token; a
    step that preempted admits nobody), then finished requests free their memory. Contiguous
    layouts reserve their region at admission, first fit; paged ones allocate the prompt's
    blocks. Measured after admission, when memory is fullest.
    """
    if layout not in LAYOUTS:
        raise ValueError(f"unknown layout {layout!r}: {' | '.join(LAYOUTS)}")
    paged = layout == "paged"
    capacity = capacity_slots // block_size * block_size if paged else capacity_slots
    num_blocks = capacity // block_size
    for p, o in requests:
        # the last sampled token's KV is never stored: paged needs room for p + o - 1
        need = (blocks_for(p + o - 1, block_size) if paged
                else reserved_slots(p + o, layout, block_size, max_len))
        if need > (num_blocks if paged else capacity):
            raise ValueError(f"a request of {p + o} tokens cannot fit a pool of {capacity} slots")
    waiting = [_Running(i, p, o) for i, (p, o) in enumerate(requests)]
    running: list[_Running] = []
    result = SimResult(layout, capacity)
    free_blocks = num_blocks

    def place(r: _Running) -> bool:
        nonlocal free_blocks
        if paged:
            need = blocks_for(r.prompt + r.generated, block_size)
            if need > free_blocks:
                return False
            free_blocks -= need
            r.size = need
            return True
        size = reserved_slots(r.prompt + r.output, layout, block_size, max_len)
        for start, hole in _holes(running, capacity):
            if hole >= size:
                r.start, r.size = start, size
                return True
        return False

    while waiting or running:
        preempted = False
        i = 0
        while i < len(running):                       # decode: store the last sampled token
            r = running[i]
            if paged and blocks_for(r.held + 1, block_size) > r.size:
                while free_blocks == 0 and r in running:
                    victim = running.pop()            # the most recently admitted
                    free_blocks += victim.size
                    victim.size = victim.held = 0     # keeps what it generated: recompute
                    waiting.insert(0, victim)
                    result.preemptions += 1
                    preempted = True
                if r not in running:
                    break                             # it was the last one, and went itself
                free_blocks -= 1
                r.size += 1
            r.held += 1
            r.generated += 1
            i += 1
        while (not preempted and waiting
               and (max_num_seqs is None or len(running) < max_num_seqs) and place(waiting[0])):
            r = waiting.pop(0)
            r.held = r.prompt + r.generated           # prefill every known token ...
            r.generated += 1                          # ... and sample the next one
            running.append(r)
        if paged:
            reserved = (num_blocks - free_blocks) * block_size
            stranded = 0                              # any free block serves any request
        else:
            reserved = sum(r.size for r in running)
            stranded = 0
            if waiting:
                need = reserved_slots(waiting[0].prompt + waiting[0].output, layout, block_size,
                                      max_len)
                stranded = sum(h for _, h in _holes(running, capacity) if h < need)
        result.steps.append(StepStats(len(running), sum(r.held for r in running), reserved,
                                      stranded, len(waiting)))
        for r in [r for r in running if r.generated >= r.output]:
            running.remove(r)
            if paged:
                free_blocks += r.size
    return result


def sim_rows(results: Sequence[SimResult]) -> list[dict]:
    """One row per simulated layout: steps to serve every request, requests running at once
    (mean over the busy steps, and peak), the pool's mean shares (%) and the preemptions."""
    return [{"layout": r.layout, "steps to serve all": len(r.steps), "mean running": r.mean_running,
             "peak running": r.peak_running, **{f"{k} (%)": v for k, v in r.pool_shares().items()},
             "preemptions": r.preemptions} for r in results]


def sharegpt_lengths(tok: Any, num_requests: int, seed: int = 0,
                     max_len: int = 2048) -> list[tuple[int, int]]:
    """``(prompt tokens, output tokens)`` of ShareGPT first turns, as the benchmark sends them
    (chat template applied; output = the recorded reply; vLLM's filters, total <= ``max_len``)."""
    from workshop.bench.workloads import sharegpt_workload

    wl = sharegpt_workload(tok, num_requests=num_requests, seed=seed, max_total_len=max_len,
                           max_prompt_len=min(1024, max_len // 2))
    out = []
    for s in wl.sessions:
        req = s.request
        out.append((len(tok.prompt_ids(req)), req.max_tokens))
    return [(p, o) for p, o in out if p + o <= max_len]


# -- the teaching engine's step trace ---------------------------------------------------------

def reschedule(engine: Any, **overrides: Any) -> Any:
    """Give an idle ``mini_engine.LLMEngine`` a new scheduler built from its config with
    ``overrides`` (``scheduler``, ``chunked_prefill``, ``max_num_batched_tokens``,
    ``max_num_seqs``): same weights and KV pool, another policy, no model reload. The step
    history starts empty."""
    from mini_engine.scheduler import make_scheduler

    if engine.has_unfinished():
        raise RuntimeError("reschedule an idle engine only: requests are still running")
    engine.config = dataclasses.replace(engine.config, **overrides)
    engine.config.validate()
    engine.scheduler = make_scheduler(engine.config, engine.block_manager,
                                      max_model_len=engine.max_model_len)
    engine.history.clear()
    return engine


def drive(engine: Any, requests: Sequence[tuple[list[int], int]],
          arrive_at: Sequence[int] | None = None) -> list[Any]:
    """Run ``(prompt ids, max_tokens)`` requests through a ``mini_engine.LLMEngine``; request
    i arrives once the engine has done ``arrive_at[i]`` steps (0: from the start), or at once
    when the engine would otherwise sit idle. Returns the engine's step records. This loop is
    a serving engine's main loop minus the HTTP."""
    from mini_engine.sequence import SamplingParams

    arrive_at = arrive_at or [0] * len(requests)
    pending = sorted((a, i) for i, a in enumerate(arrive_at))
    first = engine.num_steps
    while pending or engine.has_unfinished():
        while pending and (engine.num_steps - first >= pending[0][0]
                           or not engine.has_unfinished()):
            _, i = pending.pop(0)
            ids, max_tokens = requests[i]
            engine.add_request(ids, SamplingParams(max_tokens=max_tokens, ignore_eos=True),
                               request_id=f"r{i}")
        engine.step()
    return list(engine.history)


def decode_only(record: Any) -> bool:
    """A step record in which every scheduled request decoded (no prompt was computed)."""
    return all(kind == "decode" for _, _, kind in record.scheduled)


def step_cost_rows(runs: dict[str, Sequence[Any]], tokens: int) -> list[dict]:
    """Per run: its steps, those that computed a prompt, tokens per step, the engine's time,
    and that time re-priced at the mean cost of each kind of step over all the runs (what
    the step counts alone predict)."""
    steps = [r for h in runs.values() for r in h]
    prefill = [r.seconds for r in steps if not decode_only(r)]
    decode = [r.seconds for r in steps if decode_only(r)]
    mean_p = sum(prefill) / len(prefill) if prefill else 0.0
    mean_d = sum(decode) / len(decode) if decode else 0.0
    return [{"run": label, "steps": len(h),
             "steps with a prefill": sum(not decode_only(r) for r in h),
             "tokens per step": tokens / len(h) if h else 0.0,
             "engine time (s)": sum(r.seconds for r in h),
             "time at the mean step costs (s)": sum(mean_d if decode_only(r) else mean_p
                                                    for r in h),
             "mean prefill step (ms)": 1e3 * mean_p, "mean decode step (ms)": 1e3 * mean_d}
            for label, h in runs.items()]


def step_spans(history: Sequence[Any]) -> list[tuple[float, float]]:
    """(start, end) seconds of each step, steps laid end to end from 0 (an offline loop runs
    them back to back)."""
    out, t = [], 0.0
    for rec in history:
        out.append((t, t + rec.seconds))
        t += rec.seconds
    return out


def token_times(history: Sequence[Any], request_id: str) -> list[float]:
    """When ``request_id`` got each token: the end of the step that finished its prompt (the
    last prefill chunk before its first decode, or its last prefill if it never decoded), then
    the end of every step in which it decoded."""
    spans = step_spans(history)
    prefills, decodes = [], []
    for (_, end), rec in zip(spans, history):
        for rid, _, kind in rec.scheduled:
            if rid != request_id:
                continue
            if kind == "prefill":
                if decodes:           # preempted and recomputed: a new first token
                    prefills, decodes = [], []
                prefills.append(end)
            else:
                decodes.append(end)
    return prefills[-1:] + decodes


def max_gap(times: Sequence[float]) -> float:
    """The longest wait between two consecutive tokens (0 with fewer than two)."""
    return max((b - a for a, b in zip(times, times[1:])), default=0.0)


def chunk_row(label: str, history: Sequence[Any], short_ids: Sequence[str], long_id: str,
              arrival_step: int) -> dict:
    """One row for a long prompt arriving at step ``arrival_step`` among decoding requests
    (``short_ids``): the longest wait between two of their tokens, how long after its
    arrival the long prompt's first token came, and the steps taken."""
    return {"run": label,
            "short requests' longest gap (ms)": 1e3 * max(max_gap(token_times(history, r))
                                                          for r in short_ids),
            "long prompt's first token (ms after it arrived)": 1e3 * (
                token_times(history, long_id)[0] - step_spans(history)[arrival_step][0]),
            "steps": len(history)}


def bench_row(scheduler: str, result: Any) -> dict:
    """One row for a ``workshop.bench`` run against a server with ``scheduler``."""
    s = result.summary
    return {"scheduler": scheduler, "output tokens/s": s["output_throughput"],
            "requests/s": s["request_throughput"], "median TTFT (ms)": s["ttft_ms"]["median"],
            "median latency (ms)": s["e2e_ms"]["median"], "p90 latency (ms)": s["e2e_ms"]["p90"],
            "completed": s["completed"]}


def closed_loop_forecast(outputs: Sequence[int], seats: int, prefill_ms: float,
                         decode_ms: float) -> dict:
    """Static vs continuous batching of answers of ``outputs`` tokens (in the order they were
    sent) over ``seats`` seats, priced in steps. Continuous: the first ``seats`` requests join
    in one prefill step, every later one in a prefill step of its own; every token after a
    request's first comes from decode steps shared by all the seats. Static: one prefill step
    per batch of ``seats``, then as many decode steps as its longest answer needs. Returns the
    batches, the prefill steps continuous batching runs (``joins``), both times (s), the
    static share of continuous throughput those times forecast (%), and the share the token
    counts alone give (%)."""
    n, batches = len(outputs), [outputs[i:i + seats] for i in range(0, len(outputs), seats)]
    joins = 1 + max(n - seats, 0)
    cont_ms = joins * prefill_ms + (sum(outputs) - n) / seats * decode_ms
    stat_ms = sum(prefill_ms + (max(b) - 1) * decode_ms for b in batches)
    return {"batches": len(batches), "joins": joins, "continuous_s": cont_ms / 1e3,
            "static_s": stat_ms / 1e3,
            "forecast_pct": 100 * cont_ms / max(stat_ms, 1e-9),
            "steps_share_pct": 100 * sum(outputs) / seats / max(sum(max(b) for b in batches), 1)}


# -- reading a context's blocks back out of the pool ------------------------------------------

def gather_by_slot(pool: Any, blocks: Any, block_size: int) -> Any:
    """K (or V) of ``blocks``' slots, token by token: ``[kv_heads, len(blocks) x block_size, d]``
    from a pool ``[kv_heads, slots, d]``; one ``index_select`` row per token and KV head."""
    import torch

    slots = (blocks[:, None] * block_size + torch.arange(block_size)).reshape(-1)
    return pool.index_select(1, slots)


def gather_by_block(pool: Any, blocks: Any, block_size: int) -> Any:
    """The same, one whole block of one head per row: the pool viewed as a table
    ``[kv_heads x blocks, block_size x d]`` whose row ``h x num_blocks + b`` is block ``b`` of
    head ``h``, one contiguous piece of memory."""
    import torch

    kv_heads, num_slots, d = pool.shape
    num_blocks = num_slots // block_size
    table = pool.view(kv_heads * num_blocks, block_size * d)
    rows = (torch.arange(kv_heads)[:, None] * num_blocks + blocks).reshape(-1)
    return table.index_select(0, rows).view(kv_heads, -1, d)


GATHER_MS = "ms per step (all layers, K and V)"


def time_gathers(layers: Sequence[Sequence[Any]], placements: dict[str, Any], block_size: int,
                 threads: Sequence[int], repeats: int = 5) -> list[dict]:
    """Best-of-``repeats`` time of one decode step's gather (every layer's K and V read once,
    each copy dropped at once as attention drops it) per placement of the blocks, read slot
    by slot and block by block, on each number of torch threads (restored afterwards)."""
    import torch

    from workshop.timing import best_time_s

    def step(gather, blocks):
        for layer in layers:
            for pool in layer:
                gather(pool, blocks, block_size)

    before, rows = torch.get_num_threads(), []
    try:
        for n in threads:
            torch.set_num_threads(n)
            for where, blocks in placements.items():
                for name, gather in (("slot by slot", gather_by_slot),
                                     ("block by block", gather_by_block)):
                    seconds = best_time_s(lambda: step(gather, blocks), repeats=repeats)
                    rows.append({"blocks": where, "read": name, "threads": n,
                                 GATHER_MS: 1e3 * seconds})
    finally:
        torch.set_num_threads(before)
    return rows


def plot_timeline(runs: dict[str, Sequence[Any]], title: str):
    """One panel per run: a bar per request for every step it was scheduled in, coloured by
    what it computed (prefill chunk or decode), on the engine's own clock."""
    from matplotlib.patches import Patch

    from workshop.plots import figure

    fig, _ = figure(title, "", "", size=(8.5, 2.0 + 1.6 * len(runs)))
    fig.clear()
    axes = fig.subplots(len(runs), 1, sharex=True, squeeze=False)[:, 0]
    colours = {"prefill": "tab:orange", "decode": "tab:blue", "verify": "tab:green"}
    for ax, (label, history) in zip(axes, runs.items()):
        ids: list[str] = []
        for (start, end), rec in zip(step_spans(history), history):
            for rid, _, kind in rec.scheduled:
                if rid not in ids:
                    ids.append(rid)
                ax.broken_barh([(start, end - start)], (ids.index(rid) - 0.4, 0.8),
                               facecolors=colours.get(kind, "tab:gray"), edgecolors="white",
                               linewidth=0.3)
        ax.set_yticks(range(len(ids)), ids)
        ax.invert_yaxis()
        ax.set_ylabel("request")
        total = sum(r.seconds for r in history)
        ax.set_title(f"{label}: {len(history)} steps, {total:.2f} s", fontsize=10)
        ax.grid(True, axis="x", alpha=0.3)
    axes[-1].set_xlabel("time on the engine's clock (s)")
    fig.suptitle(title)
    # outside the panels, where no bar can hide under it
    fig.legend(handles=[Patch(color=colours[k], label=k) for k in ("prefill", "decode")],
               loc="outside upper right", ncol=2, fontsize=8)
    return fig


# -- plots of the arithmetic -----------------------------------------------------------------

def plot_pool_shares(results: Sequence[SimResult], title: str):
    """Stacked bars: how each layout's pool was used on average, with requests running at once."""
    from workshop.plots import figure

    fig, ax = figure(title, "share of the KV pool while requests wait, mean over steps (%)", "")
    colours = {"holding tokens": "tab:blue", "internal waste": "tab:orange",
               "external waste": "tab:red", "free": "lightgray"}
    for y, r in enumerate(results):
        left = 0.0
        for k, v in r.pool_shares().items():
            ax.barh(y, v, left=left, color=colours[k], label=k if y == 0 else None)
            left += v
        ax.text(101, y, f"{r.mean_running:.1f} running on average\n(peak {r.peak_running})",
                va="center", fontsize=8)
    ax.set_yticks(range(len(results)), [r.layout for r in results])
    ax.set_xlim(0, 130)
    ax.set_xticks(range(0, 101, 20))
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.15), ncol=4, fontsize=8)
    return fig


def plot_gauges(samples: Any, running: str, waiting: str, usage: str, title: str):
    """Running and waiting requests (left axis) and KV usage in % (right axis) over time."""
    from workshop.plots import figure

    fig, ax = figure(title, "time since the burst started (s)", "requests")
    t = samples.times
    ax.plot(t, samples.values[running], color="tab:blue", label="running")
    ax.plot(t, samples.values[waiting], color="tab:orange", label="waiting")
    ax2 = ax.twinx()
    ax2.plot(t, [100 * v for v in samples.values[usage]], color="tab:red", linestyle="--",
             label="KV cache usage")
    ax2.set_ylabel("KV cache usage (%)")
    # headroom above both curves, so the legend on top hides neither
    top = max([1.0] + samples.values[running] + samples.values[waiting])
    ax.set_ylim(0, 1.35 * top)
    ax2.set_ylim(0, 1.35 * max([0.1] + [100 * v for v in samples.values[usage]]))
    lines = ax.get_legend_handles_labels()
    lines2 = ax2.get_legend_handles_labels()
    ax.legend(lines[0] + lines2[0], lines[1] + lines2[1], loc="upper left", ncol=3, fontsize=8)
    return fig


def plot_gather_times(rows: Sequence[dict], title: str):
    """Grouped bars: the K/V gather's time per step, by where the blocks lie (groups) and how
    they are read on how many threads (bars); rows as notebook 7 builds them (``blocks``,
    ``read``, ``threads``, the time)."""
    from workshop.plots import figure

    value = GATHER_MS
    places = list(dict.fromkeys(r["blocks"] for r in rows))
    bars_of = list(dict.fromkeys((r["read"], r["threads"]) for r in rows))
    fig, ax = figure(title, "where each sequence's blocks lie in the pool", value, size=(8, 4.2))
    width = 0.8 / len(bars_of)
    for i, (read, threads) in enumerate(bars_of):
        xs = [p + (i - (len(bars_of) - 1) / 2) * width for p in range(len(places))]
        ys = [next(r[value] for r in rows
                   if r["blocks"] == pl and (r["read"], r["threads"]) == (read, threads))
              for pl in places]
        bars = ax.bar(xs, ys, width, label=f"{read}, {threads} thread(s)")
        ax.bar_label(bars, fmt="%.1f", fontsize=8)
    ax.set_xticks(range(len(places)), places)
    ax.set_ylim(0, 1.2 * max(r[value] for r in rows))
    ax.legend(loc="upper left", fontsize=8, ncol=2)
    return fig


__all__ = ["LAYOUTS", "PREEMPTIONS", "reserved_slots", "internal_waste", "fit_count",
           "predicted_burst", "burst_row", "external_fragmentation", "StepStats", "SimResult",
           "simulate",
           "sharegpt_lengths", "reschedule", "drive", "decode_only", "step_cost_rows", "step_spans",
           "token_times", "max_gap", "gather_by_slot", "gather_by_block", "GATHER_MS",
           "time_gathers",
           "plot_timeline", "plot_pool_shares", "plot_gauges",
           "plot_gather_times"]
