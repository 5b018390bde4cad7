"""The engine showdown: every engine, the same model, the same workloads, each swept to its knee.

One ``run_showdown`` call serves each contender in turn (a reference server of its own, or one
already running), runs a load sweep (``sweep.sweep_load``: synchronous and throughput probes,
then open-loop rates up to past the maximum) for every workload, and writes one results folder:

    <root>/showdown.json                 what ran: command, machine, date, engines, workloads,
                                         the objectives used and where they came from
    <root>/<engine>/<workload>/          a SweepResult (sweep.json, point-NN/, probe-*/)

**Objectives** (p99 TTFT and p99 ITL) are used as stated (``Plan.slo``, a ``metrics.SLO``: its
``ttft_ms`` / ``itl_ms``). One not stated is derived from the run itself once every contender
has run, by ``derive_objectives``: ``Plan.slo_factor`` x the best contender's unloaded latency
(its synchronous probe, one request at a time: p99 TTFT for the TTFT objective, p99 ITL + p99
TTFT for the ITL objective, see ``DERIVED_FROM``) on each workload, the highest of those over
the workloads, so that the fastest engine, unloaded, meets it on every workload. A fixed number
would be met by everything on a GPU and by nothing on a 2-core CPU. Every sweep is then judged
under the objectives used (its knee re-scored from its stored points) and ``showdown.json``
records them under ``slo``: the values, which were stated and which derived, and from what.

``workshop.finale.decision`` draws the decision chart from such folders, any number of them and any
subset of engines. ``benchmarks/showdown.py`` is the command; notebook 10 calls this module
with a smaller plan.

Fairness rules, the same for every contender:
- answers first: before any sweep, the correctness gate (``verify.verify_server``) compares the
  contender's greedy answers with Hugging Face float32 on the same checkpoint; a contender
  that answers wrongly is recorded (``engines[label]["gate"]``, its runs "wrong answers") and
  not swept, since its speed is not a speed to rank;
- the same prompts (same seed) at every load point, and the prefix cache emptied before each
  point (``reset_cache``), so a point never hits what the previous one left behind;
- each engine as its own documentation runs it on the hardware found (the reference server's
  rules: vLLM in bf16 and compiled on a CPU that computes bf16 natively, SGLang with its
  ``intel_amx`` backend and radix cache on an AMX CPU), with the same limits: the KV budget
  and context length (server defaults) and ``MAX_RUNNING`` requests at once where the engine
  takes a cap; "tuned"
  contenders on a GPU add only the flags their documentation names for these workloads, and
  ``showdown.json`` keeps each one's effective configuration (its ``/server_info``);
- one engine at a time on the machine: the next one starts after the previous one stopped.
"""

from __future__ import annotations

import json
import math
import platform
import shlex
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from reference_server.engines.sglang import CPU_MAX_RUNNING
from workshop import hardware, session

from .request_metrics import SLO
from .sweep import sweep_load
from .verify import verify_server
from .workloads import build_workload, describe
from .workloads import plan as planned_requests

FORMAT = 1
WORKLOADS = ("sharegpt", "agentic", "shared-prefix")


@dataclass(frozen=True)
class Contender:
    """One engine configuration in the showdown: ``engine`` with ``server_args`` under ``label``.

    ``base_url`` (with ``api_key``) uses a server that is already running instead of starting
    one. ``request_scale`` shrinks the number of requests per point for an engine that serves
    one request at a time (its knee is at its synchronous rate, so a few requests show it).
    """

    label: str
    engine: str
    server_args: tuple[str, ...] = ()
    base_url: str | None = None
    api_key: str | None = None
    request_scale: float = 1.0
    note: str = ""


# One cap on requests run at once for every CPU contender that takes one: SGLang's CPU recipe's,
# given to vLLM and the teaching engine too.
MAX_RUNNING = CPU_MAX_RUNNING
# The CPU field: both production engines, the teaching engine with each prefix cache, and the
# naive baseline.
CPU_FIELD = (
    Contender("vllm", "vllm", ("--", "--max-num-seqs", str(MAX_RUNNING))),
    Contender("sglang", "sglang", ("--", "--max-running-requests", str(MAX_RUNNING))),
    Contender("mini-hash", "mini",
              ("--", "--max-num-seqs", str(MAX_RUNNING), "--prefix-cache", "hash"),
              note="teaching engine, hashed blocks"),
    Contender("mini-radix", "mini",
              ("--", "--max-num-seqs", str(MAX_RUNNING), "--prefix-cache", "radix"),
              note="teaching engine, radix tree"),
    Contender("hf", "hf", request_scale=1 / 3, note="one request at a time, no prefix cache"),
)
# On a GPU: vLLM and SGLang at their defaults and with the scheduling flags their documents
# point to for shared prefixes (SGLang: longest-prefix-match scheduling; vLLM: a larger
# prefill chunk). Untested here: no GPU was lent to the project's CI.
GPU_FIELD = (
    Contender("vllm", "vllm"),
    Contender("vllm-tuned", "vllm", ("--", "--max-num-batched-tokens", "8192"),
              note="larger prefill chunk"),
    Contender("sglang", "sglang"),
    Contender("sglang-tuned", "sglang", ("--", "--schedule-policy", "lpm"),
              note="longest-prefix-match scheduling"),
)


@dataclass(frozen=True)
class Plan:
    """How hard to push each contender. ``full()`` is the committed reference run's plan;
    ``quick()`` is what a notebook runs in quick mode (CI)."""

    workloads: tuple[str, ...] = WORKLOADS
    num_requests: int = 24             # requests per point, at least (sessions: workload_args)
    sweep_points: int = 4              # open-loop rates between the synchronous and 1.5 x max rate
    probe_requests: int = 6            # one at a time, for the synchronous rate and the baseline
    probe_concurrency: int = 12        # the closed-loop throughput probe
    # p99 objectives (ttft_ms, itl_ms); one not stated (None) is derived from the run (the
    # module docstring)
    slo: SLO = SLO()
    # A derived objective is this x the best unloaded latency: queueing alone at the lightest
    # open-loop point can make p99 TTFT several times the unloaded one (docs/measured_here.md,
    # "Why the showdown's plans are sized so").
    slo_factor: float = 5.0
    seed: int = 0
    # ShareGPT replies clipped to this many tokens: the recorded ones average ~300, which would
    # make the one-request-at-a-time baseline's sweep alone take most of an hour on 2 cores.
    sharegpt_max_output: int | None = 128
    workload_args: dict[str, dict[str, Any]] = field(default_factory=dict)
    # The correctness gate before each contender's sweeps (verify.py): on, and its size.
    gate: bool = True
    gate_sharegpt: int = 4
    gate_tokens: int = 24

    @classmethod
    def full(cls) -> "Plan":
        # Sized for the whole CPU field on 2 cores in a few hours (docs/measured_here.md).
        # ShareGPT's replies are clipped at 64 tokens and an agent session is 6 requests (two
        # main turns, a fork into two one-turn branches, a summary, a final answer), so that a
        # load point holds enough arrivals to be judged: 24 requests, or 20 sessions
        # (saturation.py, "too short to judge").
        return cls(num_requests=24, sweep_points=3, probe_requests=4, probe_concurrency=8,
                   sharegpt_max_output=64,
                   workload_args={"agentic": {"num_sessions": 20, "main_turns": 2,
                                              "branch_turns": 0,
                                              "turn_output": (16, 32), "summary_output": 24,
                                              "final_output": 32}})

    @classmethod
    def quick(cls) -> "Plan":
        # One workload, the one whose cache effect is largest per request sent.
        # Sized for CI's 2 slow cores (docs/measured_here.md): two groups, so each point's four
        # requests have two that find their group's prompt cached.
        return cls(workloads=("shared-prefix",), num_requests=4, sweep_points=2, probe_requests=2,
                   probe_concurrency=3, sharegpt_max_output=32, gate_sharegpt=1, gate_tokens=16,
                   workload_args={"shared-prefix": {"num_groups": 2, "system_prompt_len": 128,
                                                    "question_len": 16,
                                                    "output_len": 8},
                                  "agentic": {"num_sessions": 3, "system_prompt_len": 300,
                                              "main_turns": 2,
                                              "branch_turns": 0, "turn_output": (8, 16),
                                              "summary_output": 16,
                                              "final_output": 16, "tool_result_len": (20, 40)}})

    def kwargs_for(self, workload: str, scale: float = 1.0) -> dict[str, Any]:
        """The workload's arguments; ``scale`` shrinks a fixed session count like the requests."""
        kw = dict(self.workload_args.get(workload, {}))
        if "num_sessions" in kw:
            kw["num_sessions"] = max(2, math.ceil(kw["num_sessions"] * scale))
        if workload == "sharegpt" and self.sharegpt_max_output:
            kw.setdefault("max_output_len", self.sharegpt_max_output)
        return kw


def sglang_installed() -> bool:
    """SGLang lives in its own environment (``.venv-sglang``): does it import there?"""
    from reference_server.engines.sglang import not_installed
    return not_installed() is None


def default_field(gpu: bool | None = None, running: Iterable[str] = ()) -> tuple[Contender, ...]:
    """The contenders this machine can run: the GPU field on a GPU, else the CPU field
    (SGLang only where its environment, kernel included, imports, or where its label is in
    ``running``: a server already up, wherever its engine was installed)."""
    if gpu is None:
        gpu = hardware.gpu_name() is not None
    field_ = GPU_FIELD if gpu else CPU_FIELD
    if not sglang_installed():
        field_ = tuple(c for c in field_ if c.engine != "sglang" or c.label in set(running))
    return field_


def field_rows(field: Sequence[Contender], running: Iterable[str] = ()) -> list[dict[str, Any]]:
    """A row per contender: label, engine, server arguments, whether its server is already
    running (``running``: labels) or started here, and its note."""
    running = set(running)
    return [{"label": c.label, "engine": c.engine, "server args": " ".join(c.server_args)
             or "(defaults)",
             "server": "already running" if c.label in running else "started here", "note": c.note}
            for c in field]


def known_contenders(gpu: bool | None = None) -> dict[str, Contender]:
    """Every contender by label. The two fields share labels ("vllm", "sglang") with other
    arguments: this machine's field wins (the GPU field on a GPU, else the CPU field)."""
    if gpu is None:
        gpu = hardware.gpu_name() is not None
    other, here = (CPU_FIELD, GPU_FIELD) if gpu else (GPU_FIELD, CPU_FIELD)
    return {c.label: c for c in (*other, *here)}


OBJECTIVES = (("ttft_ms", "TTFT"), ("itl_ms", "ITL"))
# What each derived objective is a multiple of: unloaded p99s of one engine, added. An ITL
# objective of a few unloaded gaps would fail at any load where two requests overlap, however
# light: a continuous batcher runs a newcomer's prefill (its whole prompt, up to one chunk) in
# the same step as everybody's next token, so a running answer's longest gap is about one
# decode step plus one prefill, and the unloaded TTFT is about one prefill.
DERIVED_FROM = {"ttft_ms": ("ttft_ms",), "itl_ms": ("itl_ms", "ttft_ms")}


def unloaded_latency(sweeps: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Per workload and contender (``sweeps``: workload -> label -> ``SweepResult``), the
    synchronous probe's p99 TTFT and ITL in ms: each engine's latency with nothing else to do."""
    rows = []
    for w, by_label in sweeps.items():
        for label, sw in by_label.items():
            probe = (sw.probes or {}).get("synchronous")
            if probe is None or not probe.summary.get("completed"):
                continue
            rows.append({"workload": w, "engine": label,
                         **{key: probe.summary[key]["p99"] for key, _ in OBJECTIVES}})
    return rows


def describe_workloads(
        plan: "Plan", tok: Any,
) -> tuple[list[dict[str, Any]], dict[str, list[tuple[list[int], list[int]]]]]:
    """The plan's workloads before any engine sees them: a row each (sessions, requests, mean
    prompt and output tokens, prefix reuse: the share of prompt tokens a perfect prefix cache
    could skip), and per workload the (prompt ids, reply ids) of each request in send order."""
    rows, sequences = [], {}
    for w in plan.workloads:
        wl = build_workload(w, tok, num_requests=plan.num_requests, seed=plan.seed,
                            **plan.kwargs_for(w))
        d = describe(wl)
        sequences[w] = [(tok.prompt_ids(s.request), tok.encode(s.reply))
                        for s in planned_requests(wl)]
        rows.append({"workload": w, "sessions": d["sessions"], "requests": d.get("requests"),
                     "mean prompt (tok)": d["prompt_tokens_mean"],
                     "mean output (tok)": d["output_tokens_mean"],
                     "prefix reuse": d.get("prefix_reuse_ratio")})
    return rows, sequences


def derive_objectives(unloaded: Sequence[dict[str, Any]],
                      factor: float) -> dict[str, dict[str, Any] | None]:
    """For each objective: ``factor`` x the best (lowest) engine's unloaded p99s named in
    ``DERIVED_FROM`` (TTFT: its p99 TTFT; ITL: its p99 ITL + p99 TTFT), on the workload where
    that best value is highest. Each comes with the engine, workload and terms it was taken
    from; None where no probe measured them."""
    out: dict[str, dict[str, Any] | None] = {}
    for key, _ in OBJECTIVES:
        terms = DERIVED_FROM[key]
        best: dict[str, tuple[float, dict[str, Any]]] = {}
        for r in unloaded:
            if any(r.get(t) is None for t in terms):
                continue
            base = sum(r[t] for t in terms)
            if r["workload"] not in best or base < best[r["workload"]][0]:
                best[r["workload"]] = (base, r)
        if not best:
            out[key] = None
            continue
        base, r = max(best.values(), key=lambda b: b[0])
        out[key] = {"ms": factor * base, "engine": r["engine"], "workload": r["workload"],
                    "unloaded_p99_ms": {t: r[t] for t in terms}}
    return out


def objectives_entry(plan: "Plan",
                     derived: dict[str, dict[str, Any] | None] | None = None) -> dict[str, Any]:
    """``showdown.json``'s ``slo``: the values used (ms, None: none), and for each how it was
    set: ``{"stated": true}``, or derived (``factor``, ``engine``, ``workload``,
    ``unloaded_p99_ms``), or ``{"derived": null}`` (no probe to derive it from, or not yet)."""
    entry: dict[str, Any] = {"factor": plan.slo_factor, "how": {}}
    for key, _ in OBJECTIVES:
        stated = getattr(plan.slo, key)
        if stated is not None:
            entry[key], entry["how"][key] = float(stated), {"stated": True}
            continue
        d = (derived or {}).get(key)
        entry[key] = d["ms"] if d else None
        entry["how"][key] = {"derived": {k: v for k, v in d.items() if k != "ms"} if d else None}
    return entry


def objectives_text(entry: dict[str, Any]) -> str:
    """One line on a ``showdown.json`` ``slo`` entry: the values and where each came from."""
    parts = []
    for key, name in OBJECTIVES:
        value, how = entry.get(key), (entry.get("how") or {}).get(key) or {}
        if how.get("stated"):
            parts.append(f"p99 {name} ≤ {value:,.0f} ms (stated)")
        elif how.get("derived"):
            d = how["derived"]
            terms = d.get("unloaded_p99_ms")
            # a manifest is read from anyone's folder: an entry of another shape still reads
            basis = (f": {entry.get('factor', '?'):g} x ("
                     + " + ".join(f"p99 {dict(OBJECTIVES).get(t, t)} {v:,.0f} ms"
                                  for t, v in terms.items())
                     + f"), {d.get('engine')} unloaded on {d.get('workload')}"
                     ) if isinstance(terms, dict) else ""
            parts.append(f"p99 {name} ≤ {value:,.0f} ms (derived{basis})")
        elif value is not None:
            parts.append(f"p99 {name} ≤ {value:,.0f} ms")
        else:
            parts.append(f"no {name} objective")
    return "; ".join(parts)


def machine() -> dict[str, Any]:
    return {"cpu": hardware.cpu_name(), "cores": hardware.cores(),
            "memory_gib": round(hardware.memory_gib() or 0.0, 1),
            "cpu_features": hardware.cpu_features(),
            "gpu": hardware.gpu_name(), "platform": platform.platform(),
            "python": platform.python_version()}


@dataclass
class Showdown:
    """A showdown folder's manifest (``showdown.json``), kept up to date as runs finish."""

    root: Path
    manifest: dict[str, Any]

    def write(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        (self.root / "showdown.json").write_text(json.dumps(self.manifest, indent=2, default=str))

    @classmethod
    def load(cls, root: str | Path) -> "Showdown":
        root = Path(root)
        return cls(root, json.loads((root / "showdown.json").read_text()))

    def folder(self, engine: str, workload: str) -> Path:
        return self.root / engine / workload


def run_showdown(root: str | Path, contenders: Sequence[Contender] | None = None,
                 plan: Plan | None = None,
                 model: str = "smollm2-135m", mode: str = "full", command: str | None = None,
                 progress: bool = True, log: Callable[[str], None] = print,
                 start_timeout_s: float = 900.0) -> Showdown:
    """Run every contender on every workload of ``plan``; write and return the folder.

    A contender that fails to start, or a sweep that fails, is recorded in ``runs`` with its
    reason and the showdown goes on with the others.
    """
    plan = plan or Plan.full()
    contenders = list(contenders if contenders is not None else default_field())
    show = Showdown(Path(root), {
        "format": FORMAT,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "command": command or " ".join(shlex.quote(a) for a in sys.argv),
        "mode": mode, "machine": machine(), "model": model,
        "slo": objectives_entry(plan),
        "plan": asdict(plan),
        "engines": {}, "workloads": {w: {"params": plan.kwargs_for(w)} for w in plan.workloads},
        "runs": []})
    show.write()
    finished: dict[tuple[str, str], Any] = {}     # (label, workload) -> SweepResult
    for c in contenders:
        t0 = time.monotonic()
        log(f"== {c.label}: {'using ' + c.base_url if c.base_url else 'starting ' + c.engine} ==")
        try:
            server = _serve(c, model, start_timeout_s)
        except Exception as e:  # noqa: BLE001 - one engine that cannot start must not end the showdown
            log(f"   {c.label} did not start: {e}")
            show.manifest["engines"][c.label] = {**_describe(c),
                                                 "status": f"did not start: {e}"[:500]}
            show.manifest["runs"] += [{"engine": c.label, "workload": w, "folder": None,
                                       "status": "engine did not start", "seconds": 0.0}
                                       for w in plan.workloads]
            show.write()
            continue
        try:
            show.manifest["engines"][c.label] = {**_describe(c), "status": "ok",
                                                 "start_seconds": round(time.monotonic() - t0, 1),
                                                 "server_info": server.info}
            show.write()
            wrong = _gate(show, c.label, server, plan, model, log) if plan.gate else None
            if wrong:
                show.manifest["runs"] += [{"engine": c.label, "workload": w, "folder": None,
                                           "status": wrong, "seconds": 0.0} for w in plan.workloads]
                show.write()
                continue
            n = max(2, math.ceil(plan.num_requests * c.request_scale))
            for w in plan.workloads:
                t1 = time.monotonic()
                run = {"engine": c.label, "workload": w, "folder": f"{c.label}/{w}"}
                try:
                    result = sweep_load(
                        server.base_url, server.model, w, num_requests=n, api_key=server.api_key,
                        sweep_points=plan.sweep_points,
                        probe_requests=max(2, math.ceil(plan.probe_requests * c.request_scale)),
                        probe_concurrency=plan.probe_concurrency, slo=plan.slo, seed=plan.seed,
                        progress=progress, reset_cache=True, label=c.label,
                        **plan.kwargs_for(w, c.request_scale))
                    result.save(show.folder(c.label, w))
                    finished[(c.label, w)] = result
                    run["status"] = "ok"
                    run["knee"] = result.knee_note()
                    log(f"   {w}: {result.knee_note()}  ({time.monotonic() - t1:.0f} s)")
                except Exception as e:  # noqa: BLE001 - recorded; the other runs go on
                    run["status"] = f"failed: {type(e).__name__}: {e}"[:500]
                    run["folder"] = None
                    log(f"   {w}: failed: {e}")
                run["seconds"] = round(time.monotonic() - t1, 1)
                show.manifest["runs"].append(run)
                show.write()
        finally:
            if not c.base_url:
                server.stop()
    _judge(show, plan, finished, log)
    show.manifest["finished"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    show.write()
    return show


WRONG_ANSWERS = "wrong answers"


def _gate(show: Showdown, label: str, server: Any, plan: Plan, model: str,
          log: Callable[[str], None]) -> str | None:
    """Run the correctness gate on a contender and record it; the runs' status when it failed
    ("wrong answers (correctness gate): ..."), else None. A model whose checkpoint is not on
    this machine cannot be checked: recorded as such, and the contender is swept."""
    from reference_server.models import ModelError, resolve_model

    entry = show.manifest["engines"][label]
    t0 = time.monotonic()
    try:
        gate = verify_server(server.base_url, server.model, api_key=server.api_key,
                             reference=resolve_model(model, prepare=False).path,
                             new_tokens=plan.gate_tokens, sharegpt=plan.gate_sharegpt)
    except (ModelError, ValueError) as e:
        entry["gate_skipped"] = str(e)[:300]
        log(f"   correctness gate skipped, answers not checked: {e}")
        show.write()
        return None
    entry["gate"] = {**gate.to_dict(), "seconds": round(time.monotonic() - t0, 1)}
    show.write()
    log("   correctness gate: " + gate.summary().replace("\n", "\n   "))
    if gate.passed:
        return None
    return f"{WRONG_ANSWERS} (correctness gate): {gate.failures[0].line()}"[:500]


def _judge(show: Showdown, plan: Plan, finished: dict[tuple[str, str], Any],
           log: Callable[[str], None]) -> None:
    """Derive the objectives not stated, record them, and re-judge every sweep under them."""
    sweeps: dict[str, dict[str, Any]] = {}
    for (label, w), sw in finished.items():
        sweeps.setdefault(w, {})[label] = sw
    entry = objectives_entry(plan, derive_objectives(unloaded_latency(sweeps), plan.slo_factor))
    show.manifest["slo"] = entry
    log(f"objectives: {objectives_text(entry)}")
    runs = {(r["engine"], r["workload"]): r for r in show.manifest["runs"]}
    for (label, w), sw in finished.items():
        judged = sw.under_objectives(SLO(ttft_ms=entry["ttft_ms"], itl_ms=entry["itl_ms"]))
        if judged is not sw:
            judged.save(show.folder(label, w))
        runs[(label, w)]["knee"] = judged.knee_note()
        log(f"   {label} / {w}: {judged.knee_note()}")
    show.write()


def _describe(c: Contender) -> dict[str, Any]:
    return {"engine": c.engine, "server_args": list(c.server_args), "note": c.note,
            "request_scale": c.request_scale, "started_here": c.base_url is None}


def _serve(c: Contender, model: str, timeout_s: float):
    if c.base_url:
        return session.connect(c.engine, base_url=c.base_url, api_key=c.api_key, verbose=False)
    return session.start(c.engine, c.server_args, model=model, verbose=False)


def with_servers(contenders: Sequence[Contender], running: dict[str, Any]) -> list[Contender]:
    """``contenders`` with each label in ``running`` (label -> a connected ``Session``) pointed
    at that server instead of starting a new one (a notebook's shared servers)."""
    out = []
    for c in contenders:
        s = running.get(c.label)
        out.append(replace(c, base_url=s.base_url, api_key=s.api_key) if s is not None else c)
    return out


def results_dir() -> Path:
    """``results/`` of the checkout the working directory is in (a notebook runs in
    ``notebooks/``), else ``./results``: where showdowns go and notebook 11 looks."""
    here = Path.cwd().resolve()
    repo = next((p for p in (here, *here.parents) if (p / "workshop" / "session.py").exists()),
                here)
    return repo / "results"


def new_root() -> Path:
    return results_dir() / time.strftime("showdown-%Y%m%d-%H%M%S")


def find_roots(*places: str | Path) -> list[Path]:
    """Every showdown folder at or directly under ``places`` (one holding ``showdown.json``),
    oldest first by its ``created`` stamp; places that do not exist, and manifests that cannot
    be read, are skipped."""
    roots: dict[Path, str] = {}
    for place in places:
        p = Path(place)
        candidates = ([p] if (p / "showdown.json").exists()
                      else sorted(q.parent for q in p.glob("*/showdown.json")))
        for c in candidates:
            try:
                roots[c.resolve()] = str(json.loads((c / "showdown.json").read_text())
                                         .get("created", ""))
            except (OSError, json.JSONDecodeError):
                continue
    return sorted(roots, key=lambda r: (roots[r], str(r)))


__all__ = ["Contender", "Plan", "Showdown", "CPU_FIELD", "GPU_FIELD", "WORKLOADS", "MAX_RUNNING",
           "WRONG_ANSWERS",
           "default_field", "known_contenders",
           "run_showdown", "with_servers", "find_roots", "results_dir", "new_root",
           "sglang_installed", "machine",
           "OBJECTIVES", "DERIVED_FROM", "unloaded_latency", "derive_objectives",
           "objectives_entry",
           "objectives_text"]
