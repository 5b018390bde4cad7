"""Load sweeps and the knee.

The knee is the highest offered load at which the server still keeps up: achieved
throughput tracks offered load (within ``tolerance``) and the p99 TTFT / ITL objectives
hold, at that load and at every lower one. "Achieved" is the run's request throughput and
"offered" the throughput a server that keeps up would show on the schedule as realized
(``metrics.offered_rate``: the arrival span plus the median session length at the sweep's
lightest point, i.e. the drain of an unloaded server), so short runs are not mistaken for
saturated ones. For closed-loop sweeps over concurrency there is
no offered rate, so "keeps up" means adding concurrency still adds throughput (at least
``min_gain`` relative) while the objectives hold.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from .results import BenchResult
from .workloads import Tokenizer, Workload, build_workload


def find_knee(offered: Sequence[float], achieved: Sequence[float],
              p99_ttft_ms: Sequence[float | None] | None = None, p99_itl_ms: Sequence[float | None] | None = None,
              slo_ttft_ms: float | None = None, slo_itl_ms: float | None = None,
              tolerance: float = 0.9) -> int | None:
    """Index of the knee among points sorted by ``offered`` (rates), or None if even the lowest fails."""
    n = len(offered)
    knee = None
    for i in range(n):
        ok = achieved[i] >= tolerance * offered[i]
        ok = ok and _slo_holds(i, p99_ttft_ms, slo_ttft_ms) and _slo_holds(i, p99_itl_ms, slo_itl_ms)
        if not ok:
            break
        knee = i
    return knee


def find_knee_closed(concurrency: Sequence[int], achieved: Sequence[float],
                     p99_ttft_ms: Sequence[float | None] | None = None, p99_itl_ms: Sequence[float | None] | None = None,
                     slo_ttft_ms: float | None = None, slo_itl_ms: float | None = None,
                     min_gain: float = 0.1) -> int | None:
    """Knee of a concurrency sweep: last point whose throughput gain over the previous one is
    at least ``min_gain`` times the relative concurrency increase, with the objectives holding."""
    knee = None
    for i in range(len(concurrency)):
        ok = _slo_holds(i, p99_ttft_ms, slo_ttft_ms) and _slo_holds(i, p99_itl_ms, slo_itl_ms)
        if ok and i > 0:
            load_step = concurrency[i] / concurrency[i - 1] - 1
            gain = achieved[i] / achieved[i - 1] - 1 if achieved[i - 1] > 0 else 0.0
            ok = gain >= min_gain * load_step
        if not ok:
            break
        knee = i
    return knee


def _slo_holds(i: int, values: Sequence[float | None] | None, slo: float | None) -> bool:
    if slo is None or values is None:
        return True
    return values[i] is not None and values[i] <= slo


@dataclass
class SweepResult:
    """The runs of a sweep, in load order, and where the knee is."""

    mode: str                      # "rate" (open loop, req/s) or "concurrency" (closed loop)
    loads: list[float]
    points: list[BenchResult]
    knee_index: int | None
    config: dict[str, Any] = field(default_factory=dict)

    @property
    def knee(self) -> float | None:
        return None if self.knee_index is None else self.loads[self.knee_index]

    def offered(self) -> list[float]:
        """Offered load in requests/s as realized (session arrivals x requests per session);
        the loads themselves (concurrency) for closed-loop sweeps."""
        if self.mode != "rate":
            return list(self.loads)
        return _offered_all(self.loads, self.points, self.config.get("requests_per_session", 1.0))

    def achieved(self) -> list[float]:
        """Request throughput of each point, req/s."""
        return [_achieved(p, self.mode) for p in self.points]

    def table(self) -> str:
        head = (f"| {self.mode} | offered req/s | achieved req/s | output tok/s | TTFT p99 ms | ITL p99 ms "
                f"| errors | lag p99 ms |")
        rows = [head, "|" + "---|" * 8]
        for i, (l, p, o, a) in enumerate(zip(self.loads, self.points, self.offered(), self.achieved())):
            s = p.summary
            mark = " (knee)" if i == self.knee_index else ""
            rows.append(f"| {l:g}{mark} | {o:.2f} | {a:.2f} | {s['output_throughput']:.1f} | "
                        f"{_fmt(s['ttft_ms']['p99'])} | {_fmt(s['itl_ms']['p99'])} | {s['errors']} | "
                        f"{_fmt(s['schedule_lag_ms']['p99'], 2)} |")
        return "\n".join(rows)

    def save(self, folder: str | os.PathLike) -> Path:
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        names = []
        for i, p in enumerate(self.points):
            name = f"point-{i:02d}"
            p.save(folder / name)
            names.append(name)
        (folder / "sweep.json").write_text(json.dumps(
            {"mode": self.mode, "loads": self.loads, "points": names, "knee_index": self.knee_index,
             "knee": self.knee, "config": self.config}, indent=2, default=str))
        try:
            from .plots import plot_load_curve
            fig = plot_load_curve(self)
        except ImportError:  # matplotlib is optional
            return folder
        fig.savefig(folder / "load_curve.png", dpi=120, bbox_inches="tight")
        return folder

    @classmethod
    def load(cls, folder: str | os.PathLike) -> "SweepResult":
        folder = Path(folder)
        meta = json.loads((folder / "sweep.json").read_text())
        points = [BenchResult.load(folder / n) for n in meta["points"]]
        return cls(meta["mode"], meta["loads"], points, meta["knee_index"], meta.get("config", {}))


def _fmt(x: float | None, nd: int = 1) -> str:
    return "-" if x is None else f"{x:.{nd}f}"


def sweep_load(base_url: str, model: str, workload: str | Workload = "random",
               request_rates: Sequence[float] | None = None, concurrencies: Sequence[int] | None = None,
               num_requests: int = 32, burstiness: float = 1.0, max_concurrency: int | None = None,
               slo_ttft_ms: float | None = None, slo_itl_ms: float | None = None, tolerance: float = 0.9,
               min_gain: float = 0.1, seed: int = 0, warmup: int = 2, progress: bool = True,
               output_dir: str | None = None, stop_after_knee: bool = False, **kwargs: Any) -> SweepResult:
    """Run the same workload at increasing load and locate the knee.

    Open loop over ``request_rates`` (req/s; session arrivals/s for multi-turn workloads) or
    closed loop over ``concurrencies``. Each point uses the same seed, so the same requests.
    ``stop_after_knee`` stops at the first point past the knee (saves time on slow servers).
    Other keyword arguments go to ``run_benchmark`` / the workload.
    """
    from .run import run_benchmark
    if (request_rates is None) == (concurrencies is None):
        raise ValueError("give exactly one of request_rates or concurrencies")
    mode = "rate" if request_rates is not None else "concurrency"
    loads = sorted(request_rates if request_rates is not None else concurrencies)
    if isinstance(workload, str):
        tok = Tokenizer.load(model, kwargs.pop("tokenizer", None))
        workload_kwargs = {k: kwargs.pop(k) for k in list(kwargs) if k not in _RUN_KWARGS}
        workload = build_workload(workload, tok, num_requests=num_requests, seed=seed, **workload_kwargs)
    per_session = sum(s.expected_requests() for s in workload.sessions) / max(len(workload.sessions), 1)
    points: list[BenchResult] = []
    for i, load in enumerate(loads):
        res = run_benchmark(base_url, model, workload, num_requests=num_requests,
                            concurrency=(max_concurrency if mode == "rate" else int(load)),
                            request_rate=(load if mode == "rate" else None), burstiness=burstiness, seed=seed,
                            warmup=warmup if i == 0 else 0, slo_ttft_ms=slo_ttft_ms, slo_itl_ms=slo_itl_ms,
                            progress=progress, **kwargs)
        points.append(res)
        knee = _knee(mode, loads[:i + 1], points, per_session, slo_ttft_ms, slo_itl_ms, tolerance, min_gain)
        if stop_after_knee and knee is not None and knee < i:
            loads = loads[:i + 1]
            break
    knee = _knee(mode, loads, points, per_session, slo_ttft_ms, slo_itl_ms, tolerance, min_gain)
    config = {"workload": workload.name, "workload_params": workload.params, "requests_per_session": per_session,
              "slo_ttft_ms": slo_ttft_ms, "slo_itl_ms": slo_itl_ms, "tolerance": tolerance, "min_gain": min_gain,
              "burstiness": burstiness, "max_concurrency": max_concurrency, "num_requests": num_requests}
    result = SweepResult(mode, [float(l) for l in loads], points, knee, config)
    if output_dir is not None:
        result.save(output_dir)
    return result


_RUN_KWARGS = {"api_key", "label", "slo_tpot_ms", "slo_e2e_ms", "timeout_s", "ignore_eos", "extra_body",
               "scrape_metrics", "environment", "reset_cache"}


def _offered_all(loads: Sequence[float], points: Sequence[BenchResult], per_session: float) -> list[float]:
    drain = points[0].summary.get("session_median_s") if points else None
    out = []
    for l, p in zip(loads, points):
        s = p.summary
        n = s["completed"] + s["errors"]
        span = s.get("arrival_span_s")
        if drain is None or span is None or s.get("num_sessions", 0) < 2 or span + drain <= 0:
            out.append(l * per_session)
        else:
            out.append(n / (span + drain))
    return out


def _achieved(p: BenchResult, mode: str) -> float:
    return p.summary["request_throughput"]


def _knee(mode, loads, points, per_session, slo_ttft_ms, slo_itl_ms, tolerance, min_gain) -> int | None:
    achieved = [_achieved(p, mode) for p in points]
    ttft = [p.summary["ttft_ms"]["p99"] for p in points]
    itl = [p.summary["itl_ms"]["p99"] for p in points]
    if mode == "rate":
        offered = _offered_all(loads, points, per_session)
        return find_knee(offered, achieved, ttft, itl, slo_ttft_ms, slo_itl_ms, tolerance)
    return find_knee_closed(loads, achieved, ttft, itl, slo_ttft_ms, slo_itl_ms, min_gain)
