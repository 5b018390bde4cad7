"""Load sweeps and the knee.

The knee is the highest offered load at which the server still keeps up, at that load and
at every lower one. Each open-loop point is judged by ``saturation.judge`` over its steady
window (warm-up and drain left out, as GuideLLM does): throughput must track the offered
load beyond the noise of a stable system, the work in flight (the client's own count of
requests not finished) must not grow, nor the server's waiting queue, nor TTFT, across the
window; above the maximum the throughput probe measured, a shortfall or a growth counts
beyond one noise instead of 2.5 (the point must show it kept up, and its verdict says how);
the p99 TTFT / ITL objectives must hold; and the client
must have offered the load (schedule lag: a point where it could not is left out, neither
the knee nor a failure). A point too short for its throughput test to fail, with no sign of
overload (``saturation.judged``), is left out the same way: no knee is claimed from it.
Without given loads the sweep picks them as GuideLLM's sweep profile does: a synchronous
probe (one request at a time) and a maximum-throughput probe (closed loop at high
concurrency) first, then rates spaced evenly from the synchronous rate to a little past the
maximum throughput. For closed-loop sweeps over concurrency there is no offered rate, so
"keeps up" means adding concurrency still adds steady throughput (at least ``min_gain``
relative) while the objectives hold.
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from .request_metrics import SLO
from .results import BenchResult
from .run import run_benchmark
from .saturation import Baseline, closed_loop_throughput, judge, judged
from .workloads import Tokenizer, Workload, build_workload

# The objectives a sweep's knee holds its points' p99s to; the sweep's config stores each as
# ``slo_<name>`` (``slo_ttft_ms``, ``slo_itl_ms``), the keys its folders have always had.
KNEE_OBJECTIVES = ("ttft_ms", "itl_ms")


def find_knee(offered: Sequence[float], achieved: Sequence[float],
              p99: Mapping[str, Sequence[float | None]] | None = None, slo: SLO | None = None,
              tolerance: float = 0.9, overloaded: Sequence[bool] | None = None) -> int | None:
    """Index of the knee among points sorted by ``offered`` (rates), or None if even the lowest
    fails.

    ``p99``: per objective of ``slo`` (its field name: ``"ttft_ms"``, ``"e2e_ms"``, ...), each
    point's p99 in ms; an objective is checked where both its limit and its values are given.
    ``overloaded``: per point, the verdict of ``saturation.judge`` (which already holds the
    throughput test, with its noise); when given it replaces ``achieved >= tolerance x offered``.
    """
    n = len(offered)
    knee = None
    for i in range(n):
        ok = ((not overloaded[i]) if overloaded is not None
              else achieved[i] >= tolerance * offered[i])
        ok = ok and _slo_holds(i, p99, slo)
        if not ok:
            break
        knee = i
    return knee


def find_knee_closed(concurrency: Sequence[int], achieved: Sequence[float],
                     p99: Mapping[str, Sequence[float | None]] | None = None,
                     slo: SLO | None = None, min_gain: float = 0.1) -> int | None:
    """Knee of a concurrency sweep: last point whose throughput gain over the previous one is
    at least ``min_gain`` times the relative concurrency increase, with the objectives holding
    (``p99`` and ``slo`` as in ``find_knee``)."""
    knee = None
    for i in range(len(concurrency)):
        ok = _slo_holds(i, p99, slo)
        if ok and i > 0:
            load_step = concurrency[i] / concurrency[i - 1] - 1
            gain = achieved[i] / achieved[i - 1] - 1 if achieved[i - 1] > 0 else 0.0
            ok = gain >= min_gain * load_step
        if not ok:
            break
        knee = i
    return knee


def _slo_holds(i: int, p99: Mapping[str, Sequence[float | None]] | None,
               slo: SLO | None) -> bool:
    """Whether point ``i`` meets every objective of ``slo`` that ``p99`` has values for."""
    slo = slo or SLO()
    for name, values in (p99 or {}).items():
        limit = getattr(slo, name)  # a name that is no objective raises
        if limit is None or values is None:
            continue
        if values[i] is None or not values[i] <= limit:
            return False
    return True


@dataclass
class SweepResult:
    """The runs of a sweep, in load order, and where the knee is."""

    mode: str                      # "rate" (open loop, req/s) or "concurrency" (closed loop)
    loads: list[float]
    points: list[BenchResult]
    knee_index: int | None
    config: dict[str, Any] = field(default_factory=dict)
    probes: dict[str, BenchResult] = field(default_factory=dict)  # "synchronous", "throughput"

    @property
    def slo(self) -> SLO:
        """The objectives the knee was judged under (``KNEE_OBJECTIVES``, from the config)."""
        cfg = self.config or {}
        return SLO(**{name: cfg.get(f"slo_{name}") for name in KNEE_OBJECTIVES})

    @property
    def knee(self) -> float | None:
        """The knee as a load that was asked for (req/s, or concurrency)."""
        return None if self.knee_index is None else self.loads[self.knee_index]

    @property
    def knee_offered(self) -> float | None:
        """The knee as offered (req/s over its steady window): what the server was really given."""
        return None if self.knee_index is None else self.offered()[self.knee_index]

    def offered(self) -> list[float]:
        """Offered load in requests/s: arrivals over each point's steady window (sessions x
        requests per session); the loads themselves (concurrency) for closed-loop sweeps."""
        if self.mode != "rate":
            return list(self.loads)
        per = self.config.get("requests_per_session", 1.0)
        return [_steady(p, "offered_rate", load) * per for load, p in zip(self.loads, self.points)]

    def achieved(self) -> list[float]:
        """Throughput of each point in requests/s; see ``achieved_basis``."""
        return [rate for rate, _ in self.achieved_basis()]

    def achieved_basis(self) -> list[tuple[float, bool]]:
        """Each point's throughput in requests/s over its steady window (session ends x
        requests per session), with False; or, where there is no window, or it is flagged
        short or saw no completion, over the whole run (completed / duration, warm-up and drain
        included: an underestimate), with True. A small run's window can hold two arrivals and
        no completion, and 0 req/s would read as "served nothing"."""
        per = self.config.get("requests_per_session", 1.0)
        out = []
        for p in self.points:
            win = (p.summary.get("saturation") or {}).get("window")
            if win and win.get("achieved_rate") is not None and win.get("completions", 1) > 0 \
                    and not win.get("short"):
                out.append((win["achieved_rate"] * per, False))
            else:
                out.append((p.summary["request_throughput"], True))
        return out

    def under_objectives(self, slo: SLO) -> "SweepResult":
        """The same sweep with its knee (and config) as they are under other p99 objectives
        (those of ``slo`` in ``KNEE_OBJECTIVES``): the stored points re-judged by the sweep's own
        rule, nothing run again."""
        cfg = self.config or {}
        if all(cfg.get(f"slo_{name}") == getattr(slo, name) for name in KNEE_OBJECTIVES):
            return self
        k = _knee(self.mode, self.loads, self.points, slo, cfg.get("tolerance", 0.9),
                  cfg.get("min_gain", 0.1))
        return SweepResult(self.mode, self.loads, self.points, k, {**cfg, **_slo_config(slo)},
                           self.probes)

    def rejudged(self, tolerance: float | None = None) -> "SweepResult":
        """The same sweep with every open-loop point judged again from its stored records by
        today's rule (``saturation.judge``, with the sweep's baseline and, when its loads came
        from the probes, the throughput probe's maximum as the ceiling), and its knee with them.
        A folder keeps the verdicts of the rule it was written with; this is how an old one
        reads now. Nothing is run again; the points are copies."""
        import copy
        if self.mode != "rate":
            return self
        cfg = dict(self.config or {})
        tol = cfg.get("tolerance", 0.9) if tolerance is None else tolerance
        b = cfg.get("baseline")
        base = Baseline(**b) if b else None
        points = []
        for p in self.points:
            q = copy.copy(p)
            q.summary = dict(p.summary)
            if base is None:
                base = Baseline.from_records(p.records, "first sessions of the lightest point",
                                             first=5)
            _rejudge(q, base, tol, cfg.get("max_throughput_rate"))
            points.append(q)
        cfg["tolerance"] = tol
        k = _knee(self.mode, self.loads, points, self.slo, tol, cfg.get("min_gain", 0.1))
        return SweepResult(self.mode, self.loads, points, k, cfg, self.probes)

    def overloaded(self) -> list[bool | None]:
        """Each point's verdict (None for closed-loop points)."""
        return [(p.summary.get("saturation") or {}).get("overloaded") for p in self.points]

    def judged(self) -> list[bool | None]:
        """Per point, whether its verdict says anything (``saturation.judged``; None for
        closed-loop points): a point not judged is neither the knee nor past it."""
        return [judged(p.summary.get("saturation")) for p in self.points]

    def _left_out(self, i: int) -> str | None:
        """Why open-loop point ``i`` is not in the knee search, or None."""
        sat = self.points[i].summary.get("saturation") or {}
        if self.mode != "rate" or not sat:
            return None
        if sat.get("client_limited"):
            return "client-bound"
        return None if judged(sat) else "not judged"

    @property
    def load_unit(self) -> str:
        """What ``loads`` count: sessions/s for a rate sweep of multi-request sessions (an agent
        session is several requests), req/s for single requests, concurrent for closed loop."""
        if self.mode != "rate":
            return "concurrent"
        return "req/s" if self.config.get("requests_per_session", 1.0) == 1 else "sessions/s"

    def knee_note(self) -> str:
        """One line on where the knee is and why, for people."""
        out = [i for i in range(len(self.points)) if self._left_out(i)]
        if self.knee_index is None:
            kinds = {self._left_out(i) for i in out}
            if self.points and len(out) == len(self.points) and "not judged" in kinds:
                return ("knee: not judged (not enough requests per point to judge a knee: no "
                        "steady window held enough arrivals for a shortfall to show"
                        + ("; the client could not offer the other loads" if "client-bound" in kinds
                           else "")
                        + ")")
            first = next((i for i in range(len(self.points)) if i not in out), 0)
            reasons = ((self.points[first].summary.get("saturation") or {}).get("reasons")
                       if self.points else None)
            why = (reasons[0] if reasons else "; ".join(self._broken_objectives(first))
                   if self.points else "")
            lowest = ("even the lowest load" if first == 0
                      else f"the lowest load judged, {self.loads[first]:.3g},")
            return f"knee: none ({lowest} fails" + (f": {why}" if why else "") + ")"
        k = self.knee_index
        unit = self.load_unit
        at = f"{self.loads[k]:.3g} {unit}" + (f" asked, {self.knee_offered:.3g} req/s offered"
                                              if self.mode == "rate" else "")
        sat = self.points[k].summary.get("saturation") or {}
        # above the throughput probe's maximum, a point that keeps up says how
        how = (f"; at the knee: {sat['kept_up']}" if sat.get("above_ceiling") and sat.get("kept_up")
               else "")
        if k == len(self.loads) - 1:
            return (f"knee: {at} or more (no point tried was overloaded; "
                    f"the server's limit is higher than the highest load tried{how})")
        if k + 1 in out:
            above = {kind: ", ".join(f"{self.loads[i]:.3g}" for i in out if i > k
                                     and self._left_out(i) == kind)
                     for kind in ("client-bound", "not judged")}
            why = ([f"the client could not offer {above['client-bound']} {unit}: run again on a "
                    "quieter machine"]
                   if above["client-bound"] else [])
            why += ([f"not enough requests at {above['not judged']} {unit} to judge them"]
                    if above["not judged"] else [])
            return f"knee: {at} at least (" + "; ".join(why) + how + ")"
        nxt = self.points[k + 1].summary
        why = (nxt.get("saturation") or {}).get("reasons") or []
        if not why and any(getattr(self.slo, name) for name in KNEE_OBJECTIVES):
            why = self._broken_objectives(k + 1) or ["an objective fails (p99 TTFT / ITL)"]
        return f"knee: {at} (at {self.loads[k + 1]:.3g}: " + ("; ".join(why)
                                                              or "no gain") + how + ")"

    def _broken_objectives(self, i: int) -> list[str]:
        """The p99 objectives point ``i`` breaks, as "p99 TTFT 2,300 ms over the 1,000 ms
        objective"."""
        s = self.points[i].summary
        return [f"p99 {name} {s[key]['p99']:,.0f} ms over the {lim:,.0f} ms objective"
                for name, key, lim in (("TTFT", "ttft_ms", self.slo.ttft_ms),
                                       ("ITL", "itl_ms", self.slo.itl_ms))
                if lim is not None and s[key]["p99"] is not None and s[key]["p99"] > lim]

    def table(self) -> str:
        rate = self.mode == "rate"
        head = (f"| {self.mode} | offered req/s | achieved req/s | output tok/s | TTFT p99 ms | "
                "ITL p99 ms "
                f"| errors | lag p99 ms |" + (" waiting peak | verdict |" if rate else ""))
        rows = [head, "|" + "---|" * (10 if rate else 8)]
        for i, (load, p, o, a) in enumerate(zip(self.loads, self.points, self.offered(),
                                                self.achieved())):
            s = p.summary
            mark = " (knee)" if i == self.knee_index else ""
            row = (f"| {load:g}{mark} | {o:.2f} | {a:.2f} | {s['output_throughput']:.1f} | "
                   f"{_fmt(s['ttft_ms']['p99'])} | {_fmt(s['itl_ms']['p99'])} | {s['errors']} | "
                   f"{_fmt(s['schedule_lag_ms']['p99'], 2)} |")
            if rate:
                sat = s.get("saturation") or {}
                verdict = ("client-bound" if sat.get("client_limited") else
                           "overloaded" if sat.get("overloaded") else "-" if not sat else
                           "not judged (too few requests)" if not judged(sat) else
                           f"keeps up ({sat['kept_up']})" if sat.get("above_ceiling")
                           and sat.get("kept_up")
                           else "keeps up")
                row += f" {_fmt((s.get('server') or {}).get('peak_waiting'), 0)} | {verdict} |"
            rows.append(row)
        return "\n".join(rows)

    def save(self, folder: str | os.PathLike) -> Path:
        """Write the folder: ``sweep.json`` and a run folder per point and probe (data only;
        ``plots.save_sweep_plots`` draws its figures)."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        names = []
        for i, p in enumerate(self.points):
            name = f"point-{i:02d}"
            p.save(folder / name)
            names.append(name)
        probes = {}
        for kind, p in self.probes.items():
            p.save(folder / f"probe-{kind}")
            probes[kind] = f"probe-{kind}"
        (folder / "sweep.json").write_text(json.dumps(
            {"mode": self.mode, "loads": self.loads, "points": names, "knee_index": self.knee_index,
             "knee": self.knee, "config": self.config, "probes": probes,
             "overloaded": self.overloaded() if self.mode == "rate" else None,
             "offered": self.offered(), "achieved": self.achieved()}, indent=2, default=str))
        return folder

    @classmethod
    def load(cls, folder: str | os.PathLike) -> "SweepResult":
        folder = Path(folder)
        meta = json.loads((folder / "sweep.json").read_text())
        points = [BenchResult.load(folder / n) for n in meta["points"]]
        probes = {k: BenchResult.load(folder / n) for k, n in (meta.get("probes") or {}).items()}
        cfg = meta.get("config", {})
        # the knee re-derived from the stored verdicts by today's rule (a folder written before
        # points too short to judge were left out stored a knee claimed from one)
        sweep = cls(meta["mode"], meta["loads"], points, meta["knee_index"], cfg, probes)
        if points:
            sweep.knee_index = _knee(sweep.mode, sweep.loads, points, sweep.slo,
                                     cfg.get("tolerance", 0.9), cfg.get("min_gain", 0.1))
        return sweep


def _fmt(x: float | None, nd: int = 1) -> str:
    return "-" if x is None else f"{x:.{nd}f}"


def sweep_load(base_url: str, model: str, workload: str | Workload = "random",
               request_rates: Sequence[float] | None = None,
               concurrencies: Sequence[int] | None = None,
               num_requests: int = 32, burstiness: float = 1.0, max_concurrency: int | None = None,
               slo: SLO | None = None, tolerance: float = 0.9,
               min_gain: float = 0.1, seed: int = 0, warmup: int = 2, progress: bool = True,
               output_dir: str | None = None, stop_after_knee: bool = False,
               duration_s: float | None = None,
               sweep_points: int = 6, overshoot: float = 1.5, probe_requests: int = 10,
               probe_concurrency: int | None = None, client_retries: int = 1,
               log: Callable[[str], None] | None = None, **kwargs: Any) -> SweepResult:
    """Run the same workload at increasing load and locate the knee.

    Open loop over ``request_rates`` (req/s; session arrivals/s for multi-turn workloads) or
    closed loop over ``concurrencies``. With neither, the rates are chosen as GuideLLM's sweep
    profile does: a synchronous probe (``probe_requests`` one at a time; a workload's fixed
    ``num_sessions`` shrinks in the same proportion), a throughput probe
    (closed loop at ``probe_concurrency``, default ``max_concurrency`` or half of
    ``num_requests``; at least 3 rounds, and about ``duration_s`` long when given), then
    ``sweep_points`` rates evenly spaced from the synchronous rate (excluded) to ``overshoot`` x the
    maximum throughput. ``duration_s`` makes each open-loop point send at least rate x duration
    sessions (a longer run realises its asked rate more closely and has a longer steady window);
    otherwise every point sends the same ``num_requests`` with the same seed, so its realised rate
    is the same fraction of the asked one at every point. A point where the client could not offer
    the load (its machine stalled) is run again up to ``client_retries`` times. ``stop_after_knee``
    stops at the first point past the knee. With ``progress``, each run shows its bar and each point
    starts with a line (``log``, default ``print``) that says how long it and the rest of the
    sweep should take (``_TimeLeft``). ``slo``: every run's goodput counts the requests meeting
    all of it; the knee holds the points' p99s to its ``KNEE_OBJECTIVES`` (TTFT and ITL).
    Other keyword arguments go to ``run_benchmark`` / the workload (``reset_cache=True``:
    empty the server's prefix cache before every run, as the showdown and ``bench sweep`` do).
    """
    slo = slo or SLO()
    if request_rates is not None and concurrencies is not None:
        raise ValueError("give at most one of request_rates or concurrencies")
    mode = "concurrency" if concurrencies is not None else "rate"
    tok_name = kwargs.pop("tokenizer", None)
    workload_kwargs = {k: kwargs.pop(k) for k in list(kwargs) if k not in _RUN_KWARGS}
    name = workload if isinstance(workload, str) else None
    tok = Tokenizer.load(model, tok_name) if name else None
    cache: dict[int, Workload] = {}

    def build(n_requests: int) -> Workload:
        if name is None:
            return workload
        if n_requests not in cache:
            kw = workload_kwargs
            if kw.get("num_sessions") and n_requests < num_requests:
                # A fixed session count is the size of a load point; a smaller run (the
                # synchronous probe) gets its share, not every session one at a time.
                kw = {**kw, "num_sessions": max(
                    1, math.ceil(kw["num_sessions"] * n_requests / num_requests))}
            cache[n_requests] = build_workload(name, tok, num_requests=n_requests, seed=seed, **kw)
        return cache[n_requests]

    base = build(num_requests)
    per_session = sum(s.expected_requests() for s in base.sessions) / max(len(base.sessions), 1)
    first_warmup = [warmup]

    left = _TimeLeft(per_session)

    def point(n_requests: int, **load: Any) -> BenchResult:
        wl = build(n_requests)
        t0 = time.monotonic()
        res = run_benchmark(base_url, model, wl, num_requests=n_requests, burstiness=burstiness,
                            seed=seed,
                            warmup=first_warmup[0], slo=slo, progress=progress, **load,
                            **kwargs)
        first_warmup[0] = 0
        left.elapsed_s += time.monotonic() - t0
        return res

    say = (log or print) if progress else (lambda _: None)
    probes: dict[str, BenchResult] = {}
    baseline: Baseline | None = None
    ceiling: float | None = None
    if mode == "rate" and request_rates is None:
        say(f"sweep: synchronous probe ({min(num_requests, probe_requests)} requests, one at a "
            "time), then a "
            f"throughput probe, then {sweep_points} rates")
        probes["synchronous"] = point(min(num_requests, probe_requests), concurrency=1,
                                      request_rate=None)
        c = probe_concurrency or max_concurrency or max(2, num_requests // 2)
        baseline = Baseline.from_records(probes["synchronous"].records, "synchronous probe")
        sync_rate = _closed_rate(probes["synchronous"], baseline)
        n = max(num_requests, 3 * c)
        if duration_s:  # enough for about duration_s even if c streams went c times as fast as one
            n = max(n, min(20 * c, math.ceil(c * sync_rate * duration_s * per_session)))
        say(f"sweep: throughput probe ({n} requests, {c} at a time)")
        probes["throughput"] = point(n, concurrency=c, request_rate=None)
        max_rate = max(_closed_rate(probes["throughput"], baseline), sync_rate)
        ceiling = max_rate
        request_rates = [float(r) for r in np.linspace(sync_rate, overshoot * max_rate, sweep_points
                                                       + 1)[1:]]
        for kind, p in probes.items():
            p.config["probe"] = kind
    loads = sorted(request_rates if mode == "rate" else concurrencies)
    sizes = [max(num_requests, math.ceil(math.ceil(load * duration_s) * per_session))
             if mode == "rate" and duration_s
             else num_requests for load in loads]
    if baseline is not None:
        left.drain_s = baseline.session_p90_s
    points: list[BenchResult] = []
    for i, load in enumerate(loads):
        n = sizes[i]
        say(left.line(mode, loads[i:], sizes[i:], len(loads)))
        t0 = left.elapsed_s
        if mode == "rate":
            res = point(n, concurrency=max_concurrency, request_rate=load)
            if baseline is None:  # no probe: the lightest point's first sessions met an idle server
                baseline = Baseline.from_records(res.records,
                                                 "first sessions of the lightest point", first=5)
            _rejudge(res, baseline, tolerance, ceiling)
            for _ in range(client_retries):
                if not res.summary["saturation"]["client_limited"]:
                    break
                # The client (its machine) stalled: such a point says nothing about the server;
                # a busy machine's stalls pass, so try once more.
                res = point(n, concurrency=max_concurrency, request_rate=load)
                _rejudge(res, baseline, tolerance, ceiling)
                res.config["client_retry"] = True
        else:
            res = point(num_requests, concurrency=int(load), request_rate=None)
        left.measured(res, left.elapsed_s - t0)
        points.append(res)
        knee = _knee(mode, loads[:i + 1], points, slo, tolerance, min_gain)
        if stop_after_knee and knee is not None and knee < i:
            loads = loads[:i + 1]
            break
        if stop_after_knee and knee is None and i == 0:
            loads = loads[:1]
            break
    knee = _knee(mode, loads, points, slo, tolerance, min_gain)
    config = {"workload": base.name, "workload_params": base.params,
              "requests_per_session": per_session,
              **_slo_config(slo), "tolerance": tolerance,
              "min_gain": min_gain,
              "burstiness": burstiness, "max_concurrency": max_concurrency,
              "num_requests": num_requests,
              "duration_s": duration_s, "loads_from": "probes" if probes else "given",
              "baseline": vars(baseline) if baseline else None,
              "reset_cache": bool(kwargs.get("reset_cache"))}
    if probes:
        config.update(sweep_points=sweep_points, overshoot=overshoot,
                      synchronous_rate=sync_rate, max_throughput_rate=max_rate,
                      probe_concurrency=c)
    result = SweepResult(mode, [float(load) for load in loads], points, knee, config, probes)
    if output_dir is not None:
        result.save(output_dir)
    return result


_RUN_KWARGS = {"api_key", "label", "timeout_s", "ignore_eos", "extra_body", "scrape_metrics",
               "environment", "reset_cache"}


def _slo_config(slo: SLO) -> dict[str, float | None]:
    """The sweep config's entries for ``slo``'s knee objectives (``SweepResult.slo`` reads them)."""
    return {f"slo_{name}": getattr(slo, name) for name in KNEE_OBJECTIVES}


def _closed_rate(p: BenchResult, baseline: Baseline | None) -> float:
    """A closed-loop probe's throughput (sessions/s) over its steady window, else overall."""
    rate = closed_loop_throughput(p.records, baseline.session_p90_s if baseline else 0.0)
    if rate is None:  # every session started at once: no steady window, only the whole run
        d = p.summary["duration_s"]
        rate = p.summary["num_sessions"] / d if d > 0 else 0.0
    return rate


def _rejudge(p: BenchResult, baseline: Baseline, tolerance: float,
             ceiling: float | None = None) -> None:
    """Judge an open-loop point against the sweep's baseline and the throughput probe's maximum
    (``ceiling``, when the probes ran) (replaces the run's own verdict)."""
    series = (p.summary.get("server") or {}).get("series")
    p.summary["saturation"] = judge(p.records, series, baseline, tolerance, ceiling).to_dict()


class _TimeLeft:
    """How long the rest of a sweep should take, for the progress line before each point.

    An open-loop point lasts about its arrival span, (sessions - 1) / rate, then its drain; the
    drain is the last point's as measured (its length minus its arrival span), or the unloaded
    p90 session before any. A closed-loop point lasts as long as the last one took. The
    estimate is a schedule, not a promise: an overloaded point drains longer.
    """

    def __init__(self, per_session: float):
        self.per_session = max(per_session, 1.0)
        self.drain_s = 0.0
        self.last_s: float | None = None
        self.elapsed_s = 0.0

    def point_s(self, mode: str, load: float, n: int) -> float | None:
        if mode != "rate":
            return self.last_s
        return max(n / self.per_session - 1, 0) / load + self.drain_s if load > 0 else None

    def measured(self, res: BenchResult, seconds: float) -> None:
        """After a point that took ``seconds`` (``elapsed_s`` counts every run, probes too)."""
        self.last_s = seconds
        span = res.summary.get("arrival_span_s")
        if span is not None and res.summary.get("duration_s") is not None:
            self.drain_s = max(res.summary["duration_s"] - span, 0.0)

    def line(self, mode: str, loads: Sequence[float], sizes: Sequence[int], total: int) -> str:
        each = [self.point_s(mode, load, n) for load, n in zip(loads, sizes)]
        i = total - len(loads) + 1
        unit = ("req/s" if mode == "rate" and self.per_session == 1 else "sessions/s"
                if mode == "rate" else "concurrent")
        out = f"sweep: point {i} of {total}, {loads[0]:.3g} {unit}, {sizes[0]} requests"
        if each[0] is not None:
            out += f", about {_duration(each[0])}"
        if all(e is not None for e in each):
            out += f"; about {_duration(sum(each))} left in the sweep"
        return out + (f" ({_duration(self.elapsed_s)} so far)" if self.elapsed_s else "")


def _duration(s: float) -> str:
    return f"{s:.0f} s" if s < 90 else f"{s / 60:.1f} min" if s < 5400 else f"{s / 3600:.1f} h"


def _steady(p: BenchResult, key: str, default: float | None) -> float | None:
    win = (p.summary.get("saturation") or {}).get("window")
    return win[key] if win else default


def _knee(mode, loads, points, slo: SLO, tolerance, min_gain) -> int | None:
    p99 = {name: [p.summary[name]["p99"] for p in points] for name in KNEE_OBJECTIVES}
    if mode == "rate":
        # A point where the client could not offer the load, or too short for a shortfall to
        # show, says nothing about the server: it is left out (neither the knee nor a failure).
        verdicts = [(p.summary.get("saturation") or {}) for p in points]
        valid = [i for i, v in enumerate(verdicts) if not v.get("client_limited")
                 and judged(v) is not False]
        k = find_knee([loads[i] for i in valid], [loads[i] for i in valid],
                      {name: [v[i] for i in valid] for name, v in p99.items()}, slo, tolerance,
                      overloaded=[bool(verdicts[i].get("overloaded")) for i in valid])
        return None if k is None else valid[k]
    achieved = []
    for p in points:
        steady = closed_loop_throughput(p.records)
        achieved.append(steady if steady is not None else p.summary["request_throughput"])
    return find_knee_closed(loads, achieved, p99, slo, min_gain)
