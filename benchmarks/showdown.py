"""The engine showdown in one command: every engine this machine can run, the same model, the
ShareGPT, agentic and shared-prefix workloads, each swept to its knee; then the decision chart.

    python benchmarks/showdown.py                          # the full CPU (or GPU) field
    python benchmarks/showdown.py --engines vllm,mini-radix --workloads agentic
    python benchmarks/showdown.py --quick                  # a few minutes: the notebook's plan
    python benchmarks/showdown.py --chart-only results/showdown-*   # redraw from folders

Each engine is started on its own (one at a time on the machine) through the reference
server, swept with ``workshop bench``'s method (synchronous and throughput probes, then
open-loop rates to 1.5 x the maximum; each point judged over its steady window), and stopped.
The folder (default ``results/showdown-<time>``) holds ``showdown.json`` (command, machine,
date, engines and their server arguments, the plan) and one sweep per engine and workload;
``decision.png`` and ``decision.md`` beside it are drawn from every showdown folder given.
Notebook 11 draws the same chart from the same folders. The committed example is
``benchmarks/reference_results/showdown-cpu/`` (see its README for when and where it ran).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import replace

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)        # run from a checkout
from workshop.bench import showdown  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--engines", help="comma-separated labels from the field "
                   f"(CPU: {','.join(c.label for c in showdown.CPU_FIELD)}; "
                   f"GPU: {','.join(c.label for c in showdown.GPU_FIELD)}); default: all this "
                   "machine runs")
    p.add_argument("--workloads", help=f"comma-separated, of {','.join(showdown.WORKLOADS)}; "
                   "default: the plan's (all three; --quick: shared-prefix)")
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--quick", action="store_true",
                   help="the notebooks' quick plan (minutes, not an hour)")
    p.add_argument("--num-requests", type=int, help="requests (sessions) per load point")
    p.add_argument("--sweep-points", type=int)
    p.add_argument("--slo-ttft-ms", type=float,
                   help="p99 TTFT objective; default: derived from the run")
    p.add_argument("--slo-itl-ms", type=float,
                   help="p99 ITL objective; default: derived from the run")
    p.add_argument("--slo-factor", type=float,
                   help="an objective not given is this x the best contender's unloaded p99 "
                   f"(default {showdown.Plan().slo_factor:g})")
    p.add_argument("--gpu", action="store_true", help="the GPU field even if no GPU is found")
    p.add_argument("--output-dir", help="default results/showdown-<time>")
    p.add_argument("--chart-only", nargs="*", metavar="FOLDER",
                   help="run nothing: draw the chart from these showdown folders")
    args = p.parse_args(argv)

    if args.chart_only is not None:
        folders = args.chart_only or [str(showdown.results_dir())]
        return _chart(folders, out=folders[0])

    plan = showdown.Plan.quick() if args.quick else showdown.Plan.full()
    changes = {k: v for k, v in (("num_requests", args.num_requests),
                                 ("sweep_points", args.sweep_points),
                                 ("slo_factor", args.slo_factor)) if v}
    stated = {k: v for k, v in (("ttft_ms", args.slo_ttft_ms), ("itl_ms", args.slo_itl_ms)) if v}
    if stated:
        changes["slo"] = replace(plan.slo, **stated)
    if args.workloads:
        changes["workloads"] = tuple(w for w in args.workloads.split(",") if w)
    plan = replace(plan, **changes)
    unknown = set(plan.workloads) - set(showdown.WORKLOADS)
    if unknown:
        p.error(f"unknown workload(s) {sorted(unknown)}; choose from "
                f"{', '.join(showdown.WORKLOADS)}")
    field = showdown.default_field(gpu=True if args.gpu else None)
    if args.engines:
        known = showdown.known_contenders(gpu=True if args.gpu else None)
        wanted = [e for e in args.engines.split(",") if e]
        missing = [e for e in wanted if e not in known]
        if missing:
            p.error(f"unknown engine label(s) {missing}; known: {', '.join(known)}")
        field = [known[e] for e in wanted]
    out = args.output_dir or str(showdown.new_root())
    print(f"showdown -> {out}\n  engines: {', '.join(c.label for c in field)}\n"
          f"  workloads: {', '.join(plan.workloads)}  ({'quick' if args.quick else 'full'} plan)")
    t0 = time.monotonic()
    showdown.run_showdown(out, field, plan, model=args.model, mode="quick" if args.quick
                          else "full",
                          command="python benchmarks/showdown.py "
                          + " ".join(sys.argv[1:] if argv is None else argv))
    print(f"showdown done in {(time.monotonic() - t0) / 60:.1f} min")
    return _chart([out], out=out)


def _chart(folders: list[str], out: str) -> int:
    from workshop.finale import decision_chart
    roots = showdown.find_roots(*folders)
    if not roots:
        print(f"no showdown folder under {folders}", file=sys.stderr)
        return 1
    return decision_chart.write_report(roots, out)


if __name__ == "__main__":
    sys.exit(main())
