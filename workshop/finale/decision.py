"""The decision chart: which engine wins, on which workload, under which constraint, on the data
in one or more showdown folders (``workshop/bench/showdown.py`` writes them; the format is in
its docstring), with facts cited from the engines' own documents beside it.
``workshop.finale.decision_chart`` draws the chart from what this module returns.

Everything here returns data (rows, ``Verdict`` objects); what the data means is for the
notebook's prose. The rules, written down once:

* **Merging folders.** ``load`` reads any number of showdown roots. Each (engine, workload)
  appears once: a run that finished beats one that failed, and between two of the same kind the
  root with the later ``created`` wins. The runs replaced are listed (``Results.replaced``), and
  roots that differ in machine, model, mode or SLO are flagged (``Results.warnings``): their
  numbers sit in one table but were not measured under the same conditions.
* **The knee** is the sweep's own (``SweepResult.knee_index``: the highest load kept up at, that
  load and every lower one) under the SLO in force. Re-scoring with other objectives recomputes
  it with the sweep's own rule (``sweep._knee``) from the stored per-point verdicts and p99s.
* **Throughput** at the knee: the achieved request rate over the point's steady window times
  the mean output tokens of its completed requests (output tok/s). A knee at the highest load
  tried is a lower bound: the margin is then "at least" (winner) or "at most" (runner-up).
* **Latency and memory** are compared at one **common load** per workload: the lowest of the
  compared engines' knees (offered req/s), i.e. the highest load *every* one of them sustained.
  Comparing each at its own knee would penalise the engine that was pushed harder. Each
  engine's p99 TTFT, p99 ITL and peak KV use are interpolated linearly in offered load between
  its two kept-up points around that load (clamped to its lowest point, and flagged, when the
  common load lies below every point it ran).
* **Not judged**: a sweep none of whose points was long enough to judge (``saturation.judged``:
  too few arrivals in the steady window for a shortfall to show, as with four requests per
  point) has no knee, and says "not enough requests per point to judge a knee"; it is left out
  of the comparisons at the knee, and keeps the capacity-alone ranking below from claiming
  that no engine kept up.
* **Capacity alone** when no engine kept up within the objectives at any load on a workload:
  the throughput verdict then ranks each engine's *capacity*, the most output tok/s it
  delivered at any load tried (its closed-loop throughput probe included), objectives and
  saturation ignored, and says so (``Verdict.ignores_objectives``).
* **Goodput**: requests per second that met every objective = steady achieved rate x the
  fraction of the point's measured requests that met them (failed ones count as misses), best
  over the sweep's points (the client-bound ones left out). Re-scored from ``BenchResult.records``
  (``RequestRecord`` ttft / itls), so any SLO can be tried without running anything again.
* **Winner and margin**: the margin is best / runner-up (lower-is-better values inverted, so it
  is always >= 1). Below ``1 + TIE_WITHIN`` (10 %) it is a **tie**: on this kind of machine the
  same vLLM process measured twice differed by 5 % (docs/measured_here.md), and a knee is only
  resolved to the sweep's load step. A p99 from a few dozen requests is noisier still: the
  notebook lets the reader widen the band.
* **Answers before speed.** A contender that failed the correctness gate (``showdown.json``'s
  ``engines[label]["gate"]``; its runs say "wrong answers") has no sweep: it appears in the
  tables as "wrong answers" with its failing prompt and is left out of every ranking.
* **What ran** sits beside every number (``setup_of``: dtype, attention, prefix cache,
  compiled or eager, requests run at once, KV tokens, and any note the server gave, such as
  SGLang outside its supported CPUs). A verdict between engines whose set-ups differ in a way
  that can favour one lists the differences (``Verdict.setup``).
* Operational needs (structured output, multi-LoRA, hardware) are not measured: they come from
  ``workshop/data/engines_cited.json``, with a source for every cell.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

from reference_server.engines import sglang
from workshop import CHECKOUT_DIR, DATA_DIR, hardware
from workshop.bench.request_metrics import SLO
from workshop.bench.showdown import (
    WRONG_ANSWERS,  # noqa: F401 (re-exported: workshop.finale.decision_chart imports it from here)
    find_roots,
    objectives_text,
    results_dir,
)
from workshop.bench.sweep import SweepResult

TIE_WITHIN = 0.10
DATA_FILE = DATA_DIR / "engines_cited.json"
# The committed full showdowns, by the CPU they ran on (notebook 11 sets them side by side).
_REFERENCE_RESULTS = Path("benchmarks") / "reference_results"
REFERENCE_STAGES = {"Xeon with AMX": _REFERENCE_RESULTS / "showdown-amx",
                    "EPYC with AVX2 only": _REFERENCE_RESULTS / "showdown-cpu"}
# The fallback is the fair stage: every engine as documented there, every answer checked.
REFERENCE_RUN = REFERENCE_STAGES["Xeon with AMX"]
ENV_DIRS = "WORKSHOP_SHOWDOWN_DIRS"

# constraint -> (column title, what is compared, unit, which way is better)
CONSTRAINTS: dict[str, tuple[str, str, str, str]] = {
    "throughput": ("throughput", "output tok/s at each engine's knee", "tok/s", "higher"),
    "ttft_p99": ("TTFT p99", "p99 time to first token at the common load", "ms", "lower"),
    "itl_p99": ("ITL p99", "p99 gap between tokens at the common load", "ms", "lower"),
    "goodput": ("goodput", "most requests/s meeting the SLO at any load tried", "req/s", "higher"),
    "kv_memory": ("KV memory", "peak KV cache in use at the common load", "tokens", "lower"),
}
FEATURES = ("structured_output", "multi_lora", "speculative_decoding", "prefix_caching")
HARDWARE = ("nvidia", "amd", "cpu", "apple")


# ---------------------------------------------------------------------------------------------
# Finding and loading showdown folders
# ---------------------------------------------------------------------------------------------

def default_places() -> list[Path]:
    """Where a learner's showdown folders are looked for: ``results/`` (the runner's default
    output, ``results/showdown-*``: the checkout's, else the working directory's) and every
    folder named in ``$WORKSHOP_SHOWDOWN_DIRS`` (``os.pathsep``-separated)."""
    places = [results_dir()]
    places += [Path(p).expanduser() for p in os.environ.get(ENV_DIRS, "").split(os.pathsep)
               if p.strip()]
    return places


def reference_run() -> Path | None:
    """The project's committed example folder, when this is a checkout that has it."""
    found = CHECKOUT_DIR / REFERENCE_RUN
    return found if (found / "showdown.json").exists() else None


PRODUCTION = ("vllm", "sglang")


def reference_stages() -> dict[str, Path]:
    """The committed reference runs this checkout has, by stage name."""
    return {name: CHECKOUT_DIR / p for name, p in REFERENCE_STAGES.items()
            if (CHECKOUT_DIR / p / "showdown.json").exists()}


def choose_roots() -> tuple[list[Path], str]:
    """The folders a notebook should draw from, and whose they are: ``"yours"`` (found in
    ``default_places``), ``"reference"`` (none found: the committed example run) or ``"none"``."""
    roots = find_roots(*default_places())
    if roots:
        return roots, "yours"
    ref = reference_run()
    return ([ref], "reference") if ref else ([], "none")


@dataclass
class Root:
    """One showdown folder and its manifest."""

    path: Path
    manifest: dict[str, Any]

    @property
    def created(self) -> str:
        return str(self.manifest.get("created", ""))

    @property
    def mode(self) -> str:
        return str(self.manifest.get("mode", "?"))

    @property
    def slo(self) -> dict[str, float | None]:
        s = self.manifest.get("slo") or {}
        return {"ttft_ms": s.get("ttft_ms"), "itl_ms": s.get("itl_ms")}

    @property
    def objectives(self) -> str:
        """The objectives its knees were judged with, and where each came from."""
        return objectives_text(self.manifest.get("slo") or {})

    @property
    def machine(self) -> str:
        return machine_text(self.manifest.get("machine") or {})

    def describe(self) -> str:
        return (f"`{self.path.name}`: {self.mode} run of {self.manifest.get('model', '?')} on "
                f"{self.machine}, {self.created[:16].replace('T', ' ')} UTC")


def machine_text(m: dict[str, Any]) -> str:
    """One line for a showdown's ``machine`` entry."""
    cpu = m.get("cpu") or "unknown CPU"
    kind = hardware.cpu_kind(m["cpu_features"]) if m.get("cpu_features") is not None else None
    parts = [kind, f"{m['cores']} cores" if m.get("cores") else None,
             f"{m['memory_gib']:g} GiB" if m.get("memory_gib") else None]
    inner = ", ".join(p for p in parts if p)
    return (f"{cpu}" + (f" ({inner})" if inner else "")
            + (f", GPU {m['gpu']}" if m.get("gpu") else ", no GPU"))


@dataclass
class Run:
    """One (engine, workload) of one root: its sweep when it finished, else why not."""

    engine: str
    workload: str
    root: Root
    status: str
    sweep: SweepResult | None = None

    @property
    def ok(self) -> bool:
        return self.sweep is not None and self.status.startswith("ok")

    @property
    def kind(self) -> str:
        """The engine behind the label (``mini`` for ``mini-radix``), from the manifest."""
        info = (self.root.manifest.get("engines") or {}).get(self.engine) or {}
        return str(info.get("engine") or self.engine.split("-")[0])

    @property
    def gate(self) -> dict[str, Any] | None:
        """The correctness gate's result for this engine (``verify.Gate.to_dict``), or None
        when the run predates the gate or skipped it."""
        info = (self.root.manifest.get("engines") or {}).get(self.engine) or {}
        return info.get("gate")

    @property
    def setup(self) -> dict[str, Any]:
        return setup_of(self.server_info, self.gate, (self.root.manifest.get("machine") or {}))

    @property
    def server_info(self) -> dict[str, Any]:
        info = (self.root.manifest.get("engines") or {}).get(self.engine) or {}
        si = info.get("server_info") or {}
        if not si and self.sweep is not None and self.sweep.points:
            si = (((self.sweep.points[0].environment or {}).get("server") or {}).get("server_info")
                  or {})
        return si if isinstance(si, dict) else {}


@dataclass
class Results:
    """The merged runs of several roots (see the module docstring for the merge rule)."""

    roots: list[Root]
    runs: dict[tuple[str, str], Run]
    replaced: list[tuple[Run, Run]] = field(default_factory=list)    # (dropped, kept)
    warnings: list[str] = field(default_factory=list)

    @property
    def engines(self) -> list[str]:
        """Engine labels with a run, in the order the manifests list them."""
        listed = [e for root in self.roots for e in (root.manifest.get("engines") or {})]
        return [e for e in dict.fromkeys(listed + [k[0] for k in self.runs])
                if any(k[0] == e for k in self.runs)]

    @property
    def workloads(self) -> list[str]:
        listed = [w for root in self.roots for w in (root.manifest.get("workloads") or {})]
        return [w for w in dict.fromkeys(listed + [k[1] for k in self.runs])
                if any(k[1] == w for k in self.runs)]

    @property
    def newest(self) -> Root | None:
        return self.roots[-1] if self.roots else None

    @property
    def slo(self) -> dict[str, float | None]:
        """The objectives of the newest root (what its knees and goodput were judged with)."""
        return self.newest.slo if self.newest else {"ttft_ms": None, "itl_ms": None}

    def first_run(self, engine: str) -> Run | None:
        """Any one run of ``engine`` (what is the same across its workloads: kind, gate, set-up)."""
        return next((r for r in self.runs.values() if r.engine == engine), None)

    def kind(self, engine: str) -> str:
        run = self.first_run(engine)
        return run.kind if run else engine.split("-")[0]

    def sweeps(self) -> dict[str, dict[str, SweepResult]]:
        """workload -> engine -> the finished sweep (``plots.plot_showdown``'s input)."""
        return {w: {e: self.runs[(e, w)].sweep for e in self.engines
                    if (e, w) in self.runs and self.runs[(e, w)].ok}
                for w in self.workloads}

    def select(self, engines: Iterable[str] | None = None,
               workloads: Iterable[str] | None = None) -> "Results":
        """The same results limited to some engines and workloads."""
        es = set(engines) if engines is not None else None
        ws = set(workloads) if workloads is not None else None
        runs = {k: r for k, r in self.runs.items() if (es is None or k[0] in es)
                and (ws is None or k[1] in ws)}
        return dataclasses.replace(self, runs=runs)


def load(*roots_or_places: str | os.PathLike) -> Results:
    """Read showdown roots (or folders that hold them) and merge their runs."""
    roots = [Root(p, json.loads((p / "showdown.json").read_text()))
             for p in find_roots(*roots_or_places)]
    runs: dict[tuple[str, str], Run] = {}
    replaced: list[tuple[Run, Run]] = []
    for root in roots:                       # oldest first: a later root replaces an earlier one
        for run in _runs_of(root):
            key = (run.engine, run.workload)
            old = runs.get(key)
            if old is None:
                runs[key] = run
            elif run.ok or not old.ok:       # finished beats failed; same kind: the later root wins
                runs[key] = run
                replaced.append((old, run))
            else:
                replaced.append((run, old))
    return Results(roots, runs, replaced, _warnings(roots))


def _runs_of(root: Root) -> list[Run]:
    out: list[Run] = []
    seen: set[str] = set()
    for entry in root.manifest.get("runs") or []:
        engine, workload = str(entry.get("engine")), str(entry.get("workload"))
        folder = entry.get("folder")
        status = str(entry.get("status") or "unknown")
        sweep = None
        if folder:
            seen.add(str(Path(folder)))
            sweep, status = _read_sweep(root.path / folder, status)
        elif status.startswith("ok"):
            status = "no folder recorded"
        out.append(Run(engine, workload, root, status, sweep))
    # sweeps added by hand (or by a runner that died before writing the manifest)
    for sj in sorted(root.path.glob("*/*/sweep.json")):
        rel = sj.parent.relative_to(root.path)
        if str(rel) in seen:
            continue
        sweep, status = _read_sweep(sj.parent, "ok (not listed in showdown.json)")
        out.append(Run(rel.parts[0], rel.parts[1], root, status, sweep))
    return out


def _read_sweep(folder: Path, status: str) -> tuple[SweepResult | None, str]:
    if not status.startswith("ok"):
        return None, status
    if not (folder / "sweep.json").exists():
        return None, f"sweep folder missing ({folder.name})"
    try:
        sweep = SweepResult.load(folder)
    except Exception as e:  # noqa: BLE001 - a broken folder is reported, not fatal
        return None, f"unreadable: {type(e).__name__}: {e}"[:200]
    if not sweep.points:
        return None, "sweep has no load points"
    return sweep, status


def _warnings(roots: list[Root]) -> list[str]:
    out = []
    for what, get in (("machines", lambda r: r.machine),
                      ("models", lambda r: str(r.manifest.get("model"))),
                      ("modes", lambda r: r.mode),
                      ("SLOs", lambda r: json.dumps(r.slo, sort_keys=True))):
        values = sorted({get(r) for r in roots})
        if len(values) > 1:
            out.append(f"the folders were measured on different {what} ({'; '.join(values)}): "
                       "their numbers share one table but not one set of conditions")
    return out


# ---------------------------------------------------------------------------------------------
# What ran
# ---------------------------------------------------------------------------------------------

SETUP_NOTES = ("support_note", "dtype_note", "compile_note")


def answers_of(gate: dict[str, Any] | None) -> str:
    """The gate's outcome in a few words: "right", "wrong answers", or "not checked"."""
    if not gate:
        return "not checked"
    return "right" if gate.get("passed") else "wrong answers"


def setup_of(server_info: dict[str, Any], gate: dict[str, Any] | None = None,
             machine: dict[str, Any] | None = None) -> dict[str, Any]:
    """One engine's effective configuration, from its ``/server_info`` (None: not reported)."""
    si = server_info or {}
    extra = si.get("extra") or {}
    compiled = si.get("compiled")
    return {
        "answers": answers_of(gate),
        "dtype": si.get("dtype"),
        # runs from before the field: SGLang's own setting, where the server repeated it
        "attention": si.get("attention") or (extra.get("sglang") or {}).get("attention_backend"),
        "prefix cache": (si.get("prefix_cache") or "on") if si.get("prefix_caching")
        else ("off" if si else None),
        "compiled": None if compiled is None else ("compiled" if compiled else "eager"),
        "max running": (si.get("limits") or {}).get("max_running"),
        "KV tokens": si.get("kv_capacity_tokens"),
        "CPU": ", ".join((machine or {}).get("cpu_features") or []) or None,
        "notes": [extra[k] for k in SETUP_NOTES if extra.get(k)] + _support_note(si, machine),
    }


def _support_note(si: dict[str, Any], machine: dict[str, Any] | None) -> list[str]:
    """For a run from before the server reported it: the server's own rule
    (``sglang.support_note``) applied to the CPU the run recorded."""
    features = (machine or {}).get("cpu_features")
    if ((si.get("extra") or {}).get("support_note") or features is None
            or si.get("engine") != "sglang"):
        return []
    note = sglang.support_note(si.get("device"), "amx_bf16" in features)
    return [note] if note else []


def setup_label(setup: dict[str, Any]) -> str:
    """A compact one-line label of ``setup_of``'s fields, for legends: "bfloat16, intel_amx,
    radix tree, page 1, eager, 32 at once, 46,603 KV tokens"."""
    parts = [setup.get("dtype"), setup.get("attention"),
             None if setup.get("prefix cache") is None else
             "no prefix cache" if setup["prefix cache"] == "off" else setup["prefix cache"],
             setup.get("compiled"),
             f"{setup['max running']} at once" if setup.get("max running") else None,
             f"{setup['KV tokens']:,} KV tokens" if setup.get("KV tokens") else None]
    label = ", ".join(str(p) for p in parts if p)
    if any("outside" in n for n in setup.get("notes") or []):
        label += "; outside its supported CPUs"
    if setup.get("answers") == "wrong answers":
        label += "; WRONG ANSWERS"
    return label


def setup_rows(results: "Results") -> list[dict[str, Any]]:
    """One row per engine: whether it answered right (the gate) and what ran."""
    out = []
    for e in results.engines:
        run = results.first_run(e)
        gate = run.gate or {}
        n = gate.get("counts") or {}
        failed = (gate.get("checks")
                  and [c for c in gate["checks"] if c.get("verdict") in ("wrong", "error")])
        row = {"engine": e, **{k: ("-" if v is None else v) for k, v in run.setup.items()
                               if k != "notes"}}
        row["answers"] = (f"right ({n.get('agree', 0)} as the reference, {n.get('near tie', 0)} "
                          "near ties)"
                          if gate.get("passed") else
                          f"wrong answers: {_check_line(failed[0])}" if failed else row["answers"])
        row["notes"] = "; ".join(run.setup["notes"]) or "-"
        out.append(row)
    return out


def departure_rows(results: "Results") -> list[dict[str, Any]]:
    """One row per gate answer that departed from the reference (a near tie, a wrong answer,
    a failed request): engine, prompt, where it departed, the reference's top-two gap there
    (logits), the reference's top two tokens and what came back (truncated)."""
    rows = []
    for e in results.engines:
        for c in (results.first_run(e).gate or {}).get("checks") or []:
            if c.get("verdict") == "agree":
                continue
            rows.append({"engine": e, "prompt": c["kind"]
                         + (f" (repeat {c['repeat']})" if c.get("repeat") else ""),
                         "question": c["question"][:50], "verdict": c["verdict"],
                         "at token": c.get("departed_at"),
                         "gap (logits)": c.get("gap"),
                         "reference's top two": " / ".join(map(repr, c.get("reference_top2")
                                                               or ())),
                         "got": (c.get("got") or "")[:60]})
    return rows


def _check_line(c: dict[str, Any]) -> str:
    if c.get("verdict") == "error":
        return f"{c.get('question')!r}: request failed: {c.get('error')}"
    return f"{c.get('question')!r}: expected {c.get('expected')!r}, got {c.get('got')!r}"


# Setup fields in which two contenders may differ to one's advantage.
COMPARED_SETUP = ("dtype", "prefix cache", "compiled", "max running")


def setup_differences(setups: dict[str, dict[str, Any]],
                      fields: Sequence[str] = COMPARED_SETUP) -> list[str]:
    """How the set-ups of the engines compared differ where it can favour one: ``fields``
    (dtype, prefix cache on/off, compiled or eager, requests run at once), KV tokens (beyond
    10 %), and the engines' own notes (e.g. run outside their supported hardware)."""
    out = []
    for key in fields:
        values = {e: s.get(key) for e, s in setups.items() if s.get(key) is not None}
        if key == "prefix cache":
            values = {e: ("off" if v == "off" else "on") for e, v in values.items()}
        if len(set(map(str, values.values()))) > 1:
            out.append(f"{key}: " + ", ".join(f"{e} {v}" for e, v in values.items()))
    kv = {e: s["KV tokens"] for e, s in setups.items() if s.get("KV tokens")}
    if kv and max(kv.values()) > 1.1 * min(kv.values()):
        out.append("KV tokens: " + ", ".join(f"{e} {v:,}" for e, v in kv.items()))
    out += [f"{e}: {n}" for e, s in setups.items() for n in s.get("notes") or [] if "outside" in n]
    return out


def stage_fairness(results: "Results", engines: Sequence[str] = PRODUCTION) -> dict[str, Any]:
    """Is this run a fair stage for ``engines``: every one's answers checked and right, none run
    outside its supported hardware, and equal limits (dtype, prefix cache on, requests at once,
    KV tokens)? Compiled or eager and the attention kernel are each engine's own documented
    choice, so they may differ. The facts, and ``fair`` (True, False)."""
    setups = {e: r.setup for (e, _), r in results.runs.items() if e in engines}
    answers = {e: s["answers"] for e, s in setups.items()}
    outside = [e for e, s in setups.items() if any("outside" in n for n in s["notes"])]
    limits = tuple(f for f in COMPARED_SETUP if f != "compiled")
    differ = [d for d in setup_differences(setups, limits) if ": outside" not in d]
    return {"engines": ", ".join(setups) or "-",
            "answers": "; ".join(f"{e} {a}" for e, a in answers.items()) or "-",
            "outside supported hardware": ", ".join(outside) or "none",
            "set-ups differ": "; ".join(differ) or "no",
            "fair": bool(setups) and all(a == "right" for a in answers.values()) and not outside
            and not differ}


def compare_stages(stages: dict[str, "Results"]) -> list[dict[str, Any]]:
    """Per workload and constraint, each stage's verdict and whether the winner is the same."""
    verdicts = {name: {(v.workload, v.constraint): v for v in decisions(knee_table(r))}
                for name, r in stages.items()}
    keys = list(dict.fromkeys(k for vs in verdicts.values() for k in vs))
    rows = []
    for w, c in keys:
        got = {name: vs.get((w, c)) for name, vs in verdicts.items()}
        winners = {name: (v.winner or ("tie: " + ", ".join(v.tied) if v.tied else None)) if v
                   else None
                   for name, v in got.items()}
        rows.append({"workload": w, "constraint": CONSTRAINTS[c][0],
                     **{name: (v.label if v else "not run") for name, v in got.items()},
                     "same winner": "yes" if len(set(winners.values())) == 1 else "no"})
    return rows


# ---------------------------------------------------------------------------------------------
# Per point, per knee
# ---------------------------------------------------------------------------------------------

def slo_of(ttft_ms: float | None, itl_ms: float | None) -> SLO:
    return SLO(ttft_ms=ttft_ms, itl_ms=itl_ms)


def point_metrics(sweep: SweepResult, i: int, slo: SLO) -> dict[str, Any]:
    """What a learner compares at load point ``i``, goodput re-scored under ``slo``."""
    achieved, whole_run = achieved_rate(sweep, i)
    m = _metrics(sweep.points[i], sweep.offered()[i] if sweep.mode == "rate" else achieved,
                 achieved, slo)
    m["whole_run"] = whole_run
    return m


def achieved_rate(sweep: SweepResult, i: int) -> tuple[float, bool]:
    """Requests/s point ``i`` completed, and whether over the whole run (``achieved_basis``)."""
    if sweep.mode != "rate":
        return sweep.achieved()[i], False
    return sweep.achieved_basis()[i]


def probe_metrics(sweep: SweepResult, slo: SLO) -> dict[str, Any] | None:
    """The synchronous probe (one request at a time) as a point: its offered load is the rate
    one-at-a-time serving completes, below which the server is idle between requests, so its
    latency and KV use stand for every lighter load. None when the sweep ran no probe."""
    probe = (sweep.probes or {}).get("synchronous")
    if probe is None or not probe.summary.get("completed"):
        return None
    cfg = sweep.config or {}
    per = cfg.get("requests_per_session", 1.0)
    rate = cfg.get("synchronous_rate")
    rate = rate * per if rate else probe.summary.get("request_throughput") or 0.0
    m = _metrics(probe, rate, rate, slo)
    m["probe"] = True
    return m


def probe_throughput(sweep: SweepResult) -> float | None:
    """Output tok/s of the closed-loop throughput probe: its steady session rate (what the
    sweep's loads were drawn from) x requests per session x mean output tokens per request."""
    probe = (sweep.probes or {}).get("throughput")
    cfg = sweep.config or {}
    completed = probe.summary.get("completed") if probe is not None else None
    if not completed or not cfg.get("max_throughput_rate"):
        return None
    per_request = (probe.summary.get("total_output_tokens") or 0) / completed
    return cfg["max_throughput_rate"] * cfg.get("requests_per_session", 1.0) * per_request


def capacity(points: Sequence[dict[str, Any]],
             probe_tps: float | None) -> tuple[float | None, str | None]:
    """The most output tok/s delivered at any load tried (``points``, client-bound ones left
    out) or by the throughput probe, objectives ignored; and where: "<x> req/s offered" or
    "throughput probe"."""
    best = max(points, key=lambda p: p["output_tps"], default=None)
    if probe_tps is not None and (best is None or probe_tps > best["output_tps"]):
        return probe_tps, "throughput probe"
    if best is None:
        return None, None
    return best["output_tps"], f"{best['offered']:.3g} req/s offered"


def _metrics(p: Any, offered: float, achieved: float, slo: SLO) -> dict[str, Any]:
    s = p.summary
    measured = [r for r in p.records if not r.warmup]
    met = sum(1 for r in measured if slo.met_by(r))
    completed = s.get("completed") or 0
    out_per_req = (s.get("total_output_tokens") or 0) / completed if completed else 0.0
    srv = s.get("server") or {}
    sat = s.get("saturation") or {}
    return {
        "offered": offered,
        "achieved": achieved,
        "output_tps": achieved * out_per_req,
        "ttft_p50": s["ttft_ms"]["median"], "ttft_p99": s["ttft_ms"]["p99"],
        "itl_p50": s["itl_ms"]["median"], "itl_p99": s["itl_ms"]["p99"],
        "slo_met": met / len(measured) if measured else None,
        "goodput": achieved * met / len(measured) if measured else 0.0,
        "prefix_hit_rate": srv.get("prefix_cache_hit_rate"),
        "peak_kv": srv.get("peak_kv_usage"),
        "client_limited": bool(sat.get("client_limited")),
        "errors": s.get("errors", 0),
    }


def knee_under(sweep: SweepResult, slo: SLO) -> SweepResult:
    """The sweep with its knee (and config objectives) as they are under ``slo``."""
    return sweep.under_objectives(slo)


def knee_row(run: Run, slo: SLO) -> dict[str, Any]:
    """One tidy row for an (engine, workload) at its knee; ``status`` says why values are missing.
    ``knee_asked`` is in sessions/s as the sweep asked (a session is one request on single-turn
    workloads, a whole conversation on multi-turn ones); every other rate is in requests/s."""
    row: dict[str, Any] = {"engine": run.engine, "workload": run.workload, "kind": run.kind,
                           "root": run.root.path.name, "status": run.status, "no_knee": True,
                           "lower_bound": False, "note": "", "knee_asked": None,
                           "knee_offered": None,
                           "next_offered": None, "output_tps": None, "ttft_p50": None,
                           "ttft_p99": None,
                           "itl_p50": None, "itl_p99": None, "goodput_at_knee": None,
                           "slo_met_at_knee": None,
                           "best_goodput": None, "best_goodput_at": None, "prefix_hit_rate": None,
                           "peak_kv": None, "kv_capacity_tokens": None, "knee_index": None,
                           "points": [],
                           "curve": [], "capacity_tps": None, "capacity_at": None,
                           "synchronous_tps": None,
                           "not_judged": False, "answers": answers_of(run.gate), "setup": run.setup}
    if not run.ok:
        row["note"] = run.status
        return row
    sw = knee_under(run.sweep, slo)
    pts = [point_metrics(sw, i, slo) for i in range(len(sw.points))]
    row["points"] = pts
    row["note"] = sw.knee_note()
    cap = run.server_info.get("kv_capacity_tokens")
    row["kv_capacity_tokens"] = cap if isinstance(cap, (int, float)) and cap > 0 else None
    usable = [p for p in pts if not p["client_limited"]]
    row["capacity_tps"], row["capacity_at"] = capacity(usable, probe_throughput(sw))
    probe = probe_metrics(sw, slo)
    row["synchronous_tps"] = probe["output_tps"] if probe else None
    if usable:
        best = max(usable, key=lambda p: p["goodput"])
        row["best_goodput"], row["best_goodput_at"] = best["goodput"], best["offered"]
    k = sw.knee_index
    if k is None:
        # points too short to judge, and no other point offered as scheduled: the sweep says
        # nothing about a knee
        judged = sw.judged()
        row["not_judged"] = (False in judged and all(j is False or p["client_limited"] for j,
                                                     p in zip(judged, pts)))
        return row
    at = pts[k]
    row.update(no_knee=False, lower_bound=k == len(sw.points) - 1,
               knee_asked=sw.loads[k],
               knee_offered=at["offered"],
               next_offered=pts[k + 1]["offered"] if k + 1 < len(pts) else None,
               output_tps=at["output_tps"], ttft_p50=at["ttft_p50"], ttft_p99=at["ttft_p99"],
               itl_p50=at["itl_p50"], itl_p99=at["itl_p99"], goodput_at_knee=at["goodput"],
               slo_met_at_knee=at["slo_met"], prefix_hit_rate=at["prefix_hit_rate"],
               peak_kv=at["peak_kv"],
               knee_index=k)
    if at["whole_run"]:
        row["note"] += " [rates over the whole run: the steady window was too short]"
    row["curve"] = ([probe] if probe else []) + pts[:k + 1]
    return row


def knee_table(results: Results, slo: SLO | None = None) -> list[dict[str, Any]]:
    """A row per (engine, workload) present, in workload then engine order."""
    slo = slo or slo_of(**results.slo)
    rows = []
    for w in results.workloads:
        for e in results.engines:
            run = results.runs.get((e, w))
            if run is not None:
                rows.append(knee_row(run, slo))
    return rows


def display_rows(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The knee table as a learner reads it (units in the headers, missing values as '-')."""
    def f(x: Any) -> str:
        return "-" if x is None else _num(float(x))

    out = []
    for r in rows:
        knee = ("not judged" if r["not_judged"] else "none" if r["no_knee"] else
                _num(r["knee_offered"]) + ("+" if r["lower_bound"] else ""))
        out.append({
            "workload": r["workload"], "engine": r["engine"],
            "knee sessions/s (asked)": f(r["knee_asked"]), "knee req/s (offered)": knee,
            "output tok/s": f(r["output_tps"]), "capacity tok/s": f(r["capacity_tps"]),
            "TTFT p50 ms": f(r["ttft_p50"]), "TTFT p99 ms": f(r["ttft_p99"]),
            "ITL p50 ms": f(r["itl_p50"]), "ITL p99 ms": f(r["itl_p99"]),
            "goodput req/s": f(r["goodput_at_knee"]),
            "SLO met": "-" if r["slo_met_at_knee"] is None
            else f"{100 * r['slo_met_at_knee']:.0f}%",
            "prefix hits": "-" if r["prefix_hit_rate"] is None
            else f"{100 * r['prefix_hit_rate']:.0f}%",
            "peak KV": "-" if r["peak_kv"] is None else f"{100 * r['peak_kv']:.0f}%",
            "note": r["note"] if r["status"].startswith("ok") else f"run {r['status']}",
        })
    return out


def row_of(rows: Sequence[dict[str, Any]], workload: str, engine: str) -> dict[str, Any] | None:
    """The knee-table row of ``engine`` on ``workload`` (None when it did not run there)."""
    return next((r for r in rows if r["workload"] == workload and r["engine"] == engine), None)


def mean_hit_rate(row: dict[str, Any] | None) -> float | None:
    """The mean prefix hit rate a row's server reported over its load points (None: none)."""
    rates = [p["prefix_hit_rate"] for p in (row or {}).get("points") or []
             if p["prefix_hit_rate"] is not None]
    return sum(rates) / len(rates) if rates else None


def hit_rate_reading(row: dict[str, Any] | None) -> tuple[bool | None, float | None, float | None]:
    """Where to read a row's prefix hit rate, and the rate: (True, None, rate at the knee); without
    a knee (False, offered req/s of the lightest load point, the rate there); (None, None, None)
    without points."""
    if not row or not row["points"]:
        return None, None, None
    if not row["no_knee"]:
        return True, None, row["prefix_hit_rate"]
    return False, row["points"][0]["offered"], row["points"][0]["prefix_hit_rate"]


def capacity_leaders(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per workload, the engine with the most capacity (output tok/s at any load tried), that
    capacity, the runner-up and best / runner-up (None without one). Workloads where no
    engine delivered anything are left out."""
    out = []
    for w in dict.fromkeys(r["workload"] for r in rows):
        by = sorted((r for r in rows if r["workload"] == w and r["capacity_tps"]),
                    key=lambda r: -r["capacity_tps"])
        if by:
            out.append({"workload": w, "engine": by[0]["engine"],
                        "capacity tok/s": by[0]["capacity_tps"],
                        "runner-up": by[1]["engine"] if len(by) > 1 else None,
                        "x runner-up": by[0]["capacity_tps"] / by[1]["capacity_tps"] if len(by) > 1
                        else None})
    return out


def cache_work_rows(rows: Sequence[dict[str, Any]], workload: str, engines: Sequence[str],
                    prompt_tokens: float) -> list[dict[str, Any]]:
    """Per engine on ``workload``: its mean prefix hit rate, the prompt tokens it computed per
    request of ``prompt_tokens`` (those the cache did not skip), its one-at-a-time output tok/s,
    its capacity and where it reached it. Engines without a row are left out."""
    out = []
    for e in engines:
        r = row_of(rows, workload, e)
        if r is None:
            continue
        hit = mean_hit_rate(r)
        out.append({"engine": e, "prefix hit rate": hit,
                    "prompt tokens computed per request": prompt_tokens * (1 - (hit or 0)),
                    "one-at-a-time tok/s": r["synchronous_tps"],
                    "capacity tok/s": r["capacity_tps"],
                    "capacity at": r["capacity_at"]})
    return out


def in_flight_at_capacity(sweep: SweepResult | None, row: dict[str, Any] | None) -> float | None:
    """Requests in flight (the client's mean) where ``row`` reached its capacity: the
    throughput probe or the open-loop point that delivered the most (None: not known)."""
    if sweep is None or not row or row.get("capacity_tps") is None:
        return None
    if row["capacity_at"] == "throughput probe":
        at = (sweep.probes or {}).get("throughput")
    else:
        at = next((sweep.points[i] for i, p in enumerate(row["points"])
                   if p["output_tps"] == row["capacity_tps"]), None)
    return at.summary.get("mean_concurrency") if at is not None else None


def ttft_growth(sweeps: dict[str, dict[str, SweepResult]]) -> list[dict[str, Any]]:
    """Per workload and engine with points: p99 TTFT at its lightest and its heaviest load
    point (ms), and heaviest / lightest."""
    out = []
    for w, per in sweeps.items():
        for e, sw in per.items():
            if not sw.points:
                continue
            light, heavy = (sw.points[i].summary["ttft_ms"]["p99"] for i in (0, -1))
            out.append({"workload": w, "engine": e, "p99 TTFT, lightest load (ms)": light,
                        "p99 TTFT, heaviest load (ms)": heavy, "growth": heavy / light if light
                        else None})
    return out


# ---------------------------------------------------------------------------------------------
# Winners
# ---------------------------------------------------------------------------------------------

def short_margin(margin: float, bound: str, over: str = "") -> str:
    """A margin and its bound (``Verdict.bound``) in a label: "x2.1", "x>=2.1 over vllm",
    "x<=2.1", or "x2.1 at the loads tried" when both sides are lower bounds."""
    sign = {"at least": ">=", "at most": "<="}.get(bound, "")
    m = f"{margin:.2g}" if margin < 10 else f"{margin:.0f}"
    return (f"x{sign}{m}" + (f" over {over}" if over else "")
            + (" at the loads tried" if bound == "unknown" else ""))


@dataclass
class Verdict:
    """Who wins one workload under one constraint, and by how much."""

    workload: str
    constraint: str
    values: dict[str, float]                 # engine -> value (only engines that qualify)
    unit: str
    better: str                              # "higher" or "lower"
    winner: str | None = None                # None: a tie, or nobody qualifies
    runner_up: str | None = None
    margin: float | None = None              # best / runner-up, >= 1 (None: fewer than two)
    tied: list[str] = field(default_factory=list)
    bound: str = ""                          # "", "at least", "at most", "unknown"
    basis: str = ""                          # where it was measured
    excluded: dict[str, str] = field(default_factory=dict)   # engine -> why it is not compared
    flags: dict[str, str] = field(default_factory=dict)      # engine -> caveat on its value
    setup: list[str] = field(default_factory=list)  # set-up differences that may favour one
    ignores_objectives: bool = False         # ranked by capacity: nobody met the objectives
    # a tie's lead over the best engine outside it: (that engine, the weakest tied engine's
    # margin over it, its bound as in ``bound``); None when the tie is everybody
    lead: tuple[str, float, str] | None = None

    @property
    def outcome(self) -> str:
        """"win", "tie", "only" (one engine qualifies) or "none"."""
        if self.tied:
            return "tie"
        if self.winner is None:
            return "none"
        return "only" if self.runner_up is None else "win"

    @property
    def label(self) -> str:
        """A short cell label: "vllm x2.1", "vllm x>=2.1", "vllm x2.1 at the loads tried" (both
        knees lower bounds), "tie: a, b", "only a", "-"."""
        o = self.outcome
        why = " (capacity, objectives ignored)" if self.ignores_objectives else ""
        if o == "win":
            return f"{self.winner} {short_margin(self.margin, self.bound)}{why}"
        if o == "tie":
            return "tie: " + ", ".join(self.tied) + self.lead_text + why
        if o == "only":
            return f"only {self.winner}{why}"
        return "-"

    @property
    def lead_text(self) -> str:
        """A tie's lead in a few words: " (each x>=1.3 over vllm)", or "" when it has none."""
        if self.lead is None:
            return ""
        other, m, bound = self.lead
        return f" (each {short_margin(m, bound, over=other)})"

    @property
    def margin_text(self) -> str:
        """The winner's margin in prose: "1.15x", "at least 1.15x", "at most 1.15x", or for two
        knees both at the highest load tried "1.15x at the loads tried (both could go higher,
        so the true margin is unknown)"."""
        m = "∞" if self.margin == float("inf") else f"{self.margin:.2f}"
        if self.bound == "unknown":
            return (f"{m}x at the loads tried (both could go higher, so the true margin is "
                    "unknown)")
        return f"{self.bound} {m}x" if self.bound else f"{m}x"


def rank(values: dict[str, float], better: str, tie_within: float = TIE_WITHIN) -> dict[str, Any]:
    """Winner, runner-up, margin (>= 1) and the engines tied with the best."""
    if not values:
        return {"winner": None, "runner_up": None, "margin": None, "tied": []}
    order = sorted(values, key=lambda e: values[e], reverse=(better == "higher"))
    best = order[0]

    def ratio(a: str, b: str) -> float:    # how much better a is than b, >= 1 when a is better
        va, vb = values[a], values[b]
        num, den = (va, vb) if better == "higher" else (vb, va)
        if den <= 0:
            return math.inf if num > 0 else 1.0
        return num / den

    if len(order) == 1:
        return {"winner": best, "runner_up": None, "margin": None, "tied": []}
    margin = ratio(best, order[1])
    tied = [e for e in order if ratio(best, e) < 1 + tie_within]
    if len(tied) > 1:
        return {"winner": None, "runner_up": order[1], "margin": margin, "tied": tied}
    return {"winner": best, "runner_up": order[1], "margin": margin, "tied": []}


def interpolate(curve: Sequence[dict[str, Any]], key: str, load: float) -> tuple[float | None, str]:
    """``key`` at offered ``load`` along ``curve`` (the loads kept up at, with the synchronous
    probe first when there is one), linear in offered load. Below the synchronous probe the
    server idles between requests, so the probe's value holds. Returns (value, caveat); the
    caveat is non-empty when the load lies below every point measured."""
    pts = sorted([p for p in curve if p.get(key) is not None and not p["client_limited"]],
                 key=lambda p: p["offered"])
    if not pts:
        return None, "not reported"
    if load <= pts[0]["offered"]:
        exact = math.isclose(load, pts[0]["offered"], rel_tol=1e-6)
        caveat = "" if exact or pts[0].get("probe") else \
            f"measured at {pts[0]['offered']:.3g} req/s, its lowest load, above the common load"
        return pts[0][key], caveat
    for a, b in zip(pts, pts[1:]):
        if a["offered"] <= load <= b["offered"]:
            span = b["offered"] - a["offered"]
            t = 0.0 if span <= 0 else (load - a["offered"]) / span
            return a[key] + t * (b[key] - a[key]), ""
    return pts[-1][key], ""


def decide(rows: Sequence[dict[str, Any]], workload: str, constraint: str,
           tie_within: float = TIE_WITHIN) -> Verdict:
    """The verdict for one workload and constraint from ``knee_table`` rows."""
    title, what, unit, better = CONSTRAINTS[constraint]
    mine = [r for r in rows if r["workload"] == workload]
    v = Verdict(workload, constraint, {}, unit, better)
    for r in mine:
        if not r["status"].startswith("ok"):
            v.excluded[r["engine"]] = f"run {r['status']}"
        elif r["no_knee"] and constraint != "goodput":
            v.excluded[r["engine"]] = r["note"] or "no knee"
    live = [r for r in mine if r["engine"] not in v.excluded]
    finished = [r for r in mine if r["status"].startswith("ok")]
    # Capacity alone only when every engine was judged to miss at every load: an engine whose
    # points were too short to judge might have kept up.
    if constraint == "throughput" and finished and all(r["no_knee"] and not r["not_judged"]
                                                       for r in finished):
        v.excluded = {e: why for e, why in v.excluded.items() if why.startswith("run ")}
        v.values = {r["engine"]: r["capacity_tps"] for r in finished
                    if r["capacity_tps"] is not None}
        v.ignores_objectives = True
        v.basis = ("capacity alone, the most output tok/s at any load tried (throughput probe "
                   "included): no engine kept up within the objectives at any load, so this "
                   "ranking ignores the latency objectives")
    elif constraint == "throughput":
        v.values = {r["engine"]: r["output_tps"] for r in live if r["output_tps"] is not None}
        v.basis = "at each engine's knee"
    elif constraint == "goodput":
        v.values = {r["engine"]: r["best_goodput"] for r in live if r["best_goodput"] is not None}
        v.basis = "best over the loads tried"
    else:
        common = common_load(rows, workload)
        v.basis = (f"at {common:.3g} req/s, the highest load all sustained" if common is not None
                   else "")
        if common is not None:
            key = {"ttft_p99": "ttft_p99", "itl_p99": "itl_p99", "kv_memory": "peak_kv"}[constraint]
            for r in live:
                val, caveat = interpolate(r["curve"], key, common)
                if val is None:
                    v.excluded[r["engine"]] = "no KV gauge" if key == "peak_kv" else "not measured"
                    continue
                v.values[r["engine"]] = val
                if caveat:
                    v.flags[r["engine"]] = caveat
            if constraint == "kv_memory":
                caps = {r["engine"]: r["kv_capacity_tokens"] for r in live
                        if r["engine"] in v.values}
                if caps and all(caps.values()):
                    v.values = {e: f * caps[e] for e, f in v.values.items()}
                else:
                    v.unit = "fraction of own pool"
                    v.basis += " (pool sizes unknown: fractions of each engine's own pool)"
    if better == "higher":               # nothing delivered is not a contender for "most"
        for e in [e for e, x in v.values.items() if x <= 0]:
            v.excluded[e] = "no request met the objectives" if constraint == "goodput" else "zero"
            del v.values[e]
    r_ = rank(v.values, better, tie_within)
    v.winner, v.runner_up, v.margin, v.tied = (r_["winner"], r_["runner_up"], r_["margin"],
                                               r_["tied"])
    v.setup = setup_differences({r["engine"]: r.get("setup") or {} for r in mine
                                 if r["engine"] in v.values})
    lb = {r["engine"]: r["lower_bound"] for r in live}

    def bound(ahead: str, behind: str) -> str:
        """A throughput margin between two knees: one at the highest load tried is a lower bound."""
        if constraint != "throughput" or v.ignores_objectives:
            return ""
        w, ru = lb.get(ahead, False), lb.get(behind, False)
        return "unknown" if w and ru else "at least" if w else "at most" if ru else ""

    if v.outcome == "win":
        v.bound = bound(v.winner, v.runner_up)
    rest = [e for e in v.values if e not in v.tied]
    if v.outcome == "tie" and rest:
        # The tie hides how far its members lead the others: the weakest of them against the
        # best of the rest is the lead every one of them has.
        r_ = rank({e: v.values[e] for e in rest + [v.tied[-1]]}, better, 0.0)
        if r_["winner"] == v.tied[-1] and r_["margin"] is not None:
            v.lead = (r_["runner_up"], r_["margin"], bound(v.tied[-1], r_["runner_up"]))
    return v


def common_load(rows: Sequence[dict[str, Any]], workload: str) -> float | None:
    """The lowest knee (offered req/s) among the engines with one: every one of them kept up
    at it. None when fewer than one engine has a knee."""
    knees = [r["knee_offered"] for r in rows if r["workload"] == workload and not r["no_knee"]
             and r["status"].startswith("ok") and r["knee_offered"] is not None]
    return min(knees) if knees else None


def decisions(rows: Sequence[dict[str, Any]], constraints: Sequence[str] = tuple(CONSTRAINTS),
              tie_within: float = TIE_WITHIN) -> list[Verdict]:
    """Every workload in ``rows`` x every constraint."""
    workloads = list(dict.fromkeys(r["workload"] for r in rows))
    return [decide(rows, w, c, tie_within) for w in workloads for c in constraints]


def _num(x: float) -> str:
    """3 significant digits without scientific notation for the sizes met here."""
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.3g}"


def verdict_rows(verdicts: Sequence[Verdict]) -> list[dict[str, Any]]:
    """The verdicts as a table (the figures only; the notebook says what they mean)."""
    out = []
    for v in verdicts:
        vals = ", ".join(f"{e} {_num(x)}" for e, x in sorted(v.values.items(), key=lambda kv: -kv[1]
                                                            if v.better == "higher" else kv[1]))
        out.append({"workload": v.workload, "constraint": CONSTRAINTS[v.constraint][0],
                    "result": v.label, "margin": "-" if v.margin is None else
                    ("inf" if math.isinf(v.margin) else f"{v.margin:.2f}"),
                    "values": vals + (f" {v.unit}" if vals else ""), "measured": v.basis,
                    "left out": "; ".join(f"{e}: {why}" for e, why in v.excluded.items()) or "-",
                    "caveats": "; ".join(f"{e}: {c}" for e, c in v.flags.items()) or "-",
                    "set-ups differ": "; ".join(v.setup) or "-"})
    return out


# ---------------------------------------------------------------------------------------------
# Cited facts (not measured here)
# ---------------------------------------------------------------------------------------------

def load_cited(path: str | os.PathLike | None = None) -> dict[str, Any]:
    return json.loads(Path(path or DATA_FILE).read_text())


def cited_engine(kind: str, cited: dict[str, Any] | None = None) -> dict[str, Any] | None:
    cited = cited or load_cited()
    return next((e for e in cited["engines"] if e["id"] == kind or kind in e.get("aliases", [])),
                None)


def feature_rows(kinds: Sequence[str] | None = None, cited: dict[str, Any] | None = None,
                 measured: Sequence[str] = ()) -> list[dict[str, Any]]:
    """The operational matrix: one row per engine (all in the data file, or ``kinds``)."""
    cited = cited or load_cited()
    engines = (cited["engines"] if kinds is None
               else [e for k in kinds if (e := cited_engine(k, cited))])
    out = []
    for e in engines:
        row = {"engine": e["name"], "here": "measured" if e["id"] in measured else e["here"]}
        for f in FEATURES + HARDWARE:
            c = e["features"].get(f)
            row[f.replace("_", " ")] = c["value"] if c else "?"
        row["status"] = e.get("status", "")
        out.append(row)
    return out


def supporting(needs: Sequence[str], kinds: Sequence[str],
               cited: dict[str, Any] | None = None) -> dict[str, list[str]]:
    """For each engine kind, the needs it does not meet ("yes" counts as met, "partial" not)."""
    cited = cited or load_cited()
    out = {}
    for k in kinds:
        e = cited_engine(k, cited)
        if e is None:
            out[k] = list(needs)
            continue
        out[k] = [n for n in needs if (e["features"].get(n) or {}).get("value") != "yes"]
    return out


def figure_rows(cited: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Published figures, each with what it is and where it comes from."""
    cited = cited or load_cited()
    return [{"engine": f["engine"], "claim": f["claim"],
             "setting": f"{f['hardware']}; {f['model']}; {f['workload']}",
             "date": f["date"], "source": f"[{f['source_title']}]({f['source_url']})"}
            for f in cited["figures"]]
