"""Each production engine through the reference server against the same engine run bare, as its
own documentation runs it on this CPU, side by side: does the server cost an engine its speed?

    python benchmarks/as_documented.py                     # vLLM and SGLang, 3 rounds
    python benchmarks/as_documented.py --engines sglang --rounds 5 --out results/asdoc.json

For each engine both servers are up at once (the pair is the comparison; the engines are
measured one after the other): first the correctness gate on both (``workshop bench
verify``), then rounds of the shared-prefix load (SGLang's ``generated-shared-prefix`` shape:
4 groups x 8 prompts behind a 512-token system prompt, 64-token questions, 32 tokens out, 8 at
once), the two servers alternating within each round. Each round draws new prompts (its own
seed), so no round finds the previous one's prefixes cached, and both servers get the same.
It prints each round's output tok/s and mean TTFT, and the median ratio of the served engine to
the bare one.

Bare means the engine's own OpenAI server with the flags its documentation gives for a CPU:
vLLM-CPU in bf16 at its default (compiled) with the server's KV budget; SGLang's CPU recipe
(``intel_amx`` attention on a CPU with AMX, radix cache on, the CPU settings of
``shared/SGLANG_CPU.md`` but the served side's ``--mem-fraction-static`` rule, since the
recipe's 0.05 leaves no room for the KV cache beside another server, and ``--sleep-on-idle``
so that an idle server leaves the cores to the one measured). The served side runs with the
showdown's arguments for the engine (its request cap, ``showdown.MAX_RUNNING``), and both sides get
the same KV budget and request cap.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)        # run from a checkout

MODEL = "smollm2-135m"
LOAD = dict(workload="shared-prefix", num_requests=32, concurrency=8, num_groups=4,
            system_prompt_len=512, question_len=64, output_len=32)
KV_GIB = 1          # the reference server's default --kv-cache-gib


def bare_command(engine: str, model_path: str, port: int) -> tuple[list[str], dict[str, str]]:
    """The engine's own server as its documentation runs it here, and its environment."""
    from reference_server import dtypes
    from reference_server.engines import sglang as S
    from reference_server.kv import kv_bytes_per_token
    from reference_server.model_config import read_arch
    from workshop.bench.showdown import MAX_RUNNING
    env = dict(os.environ)
    common = ["--host", "127.0.0.1", "--port", str(port), "--served-model-name", MODEL]
    if engine == "vllm":
        env["VLLM_CPU_KVCACHE_SPACE"] = str(KV_GIB)
        return ([sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model_path,
                 "--dtype", "bfloat16", "--max-num-seqs", str(MAX_RUNNING), *common], env)
    import psutil
    env["SGLANG_USE_CPU_ENGINE"] = "1"
    tokens = S.kv_tokens_for(KV_GIB, kv_bytes_per_token(read_arch(model_path), "bfloat16"))
    # the recipe's 0.05 fails when other servers hold memory: the served side's rule instead
    fraction = S.cpu_mem_fraction(KV_GIB * 2**30, S.weight_bytes(model_path),
                                  psutil.virtual_memory().available)
    return ([S.default_python(), "-m", "sglang.launch_server", "--model-path", model_path,
             "--device", "cpu",
             "--attention-backend", S.cpu_attention(dtypes.cpu_has_amx()),
             "--disable-overlap-schedule",
             "--mem-fraction-static", str(fraction), "--max-total-tokens", str(tokens),
             "--max-running-requests", str(MAX_RUNNING), "--enable-metrics",
             "--enable-cache-report",
             "--sleep-on-idle", *common], env)


def showdown_args(engine: str) -> tuple[str, ...]:
    """The server arguments the showdown's CPU field gives this engine (its request cap)."""
    from workshop.bench.showdown import CPU_FIELD
    return next(c.server_args for c in CPU_FIELD if c.label == engine)


def start_pair(engine: str, model_path: str, logs: Path):
    """The bare server and the reference server over the same engine, both loading at once."""
    from reference_server import launch
    port = launch.free_port()
    cmd, env = bare_command(engine, model_path, port)
    bare = launch.start(cmd, port, log_path=logs / f"{engine}-bare.log", env=env)
    served = launch.launch(["--engine", engine, "--model", MODEL, *showdown_args(engine)],
                           log_path=logs / f"{engine}-served.log")
    return {"bare": bare, "served": served}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--engines", default="vllm,sglang")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", help="write every round's figures and both gates here (JSON)")
    ap.add_argument("--logs", default="/tmp/as_documented", help="server logs")
    args = ap.parse_args(argv)

    from reference_server.models import resolve_model
    from workshop.bench.run import run_benchmark
    from workshop.bench.showdown import machine
    from workshop.bench.verify import verify_server
    model_path = resolve_model(MODEL).path
    logs = Path(args.logs)
    logs.mkdir(parents=True, exist_ok=True)
    report: dict = {"machine": machine(), "load": LOAD, "rounds": args.rounds,
                    "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "engines": {}}
    for engine in [e for e in args.engines.split(",") if e]:
        t0 = time.monotonic()
        pair = start_pair(engine, model_path, logs)
        try:
            for side, server in pair.items():
                server.wait_ready(900, path="/health" if side == "bare" else "/ready")
            entry: dict = {"start_s": round(time.monotonic() - t0, 1), "gate": {}, "rounds": []}
            for side, server in pair.items():
                gate = verify_server(server.base_url, MODEL, api_key=server.api_key)
                entry["gate"][side] = gate.to_dict()
                print(f"{engine} {side}: gate {gate.summary()}", flush=True)
            for r in range(args.rounds):
                row = {}
                for side, server in (pair.items() if r % 2 == 0 else reversed(pair.items())):
                    res = run_benchmark(server.base_url, MODEL, api_key=server.api_key, seed=1000
                                        + r,
                                        warmup=0, progress=False, **LOAD)
                    s = res.summary
                    row[side] = {"output_tps": s["output_throughput"],
                                 "ttft_mean_ms": s["ttft_ms"]["mean"],
                                 "completed": s["completed"], "errors": s.get("errors", 0),
                                 "prefix_hit_rate": (s.get("server")
                                                     or {}).get("prefix_cache_hit_rate")}
                row["ratio"] = row["served"]["output_tps"] / row["bare"]["output_tps"]
                entry["rounds"].append(row)
                print(f"{engine} round {r + 1}: served {row['served']['output_tps']:.1f} tok/s "
                      f"(TTFT {row['served']['ttft_mean_ms']:.0f} ms), bare "
                      f"{row['bare']['output_tps']:.1f} (TTFT {row['bare']['ttft_mean_ms']:.0f} "
                      f"ms): {row['ratio']:.2f}x", flush=True)
            entry["median_ratio"] = statistics.median(r["ratio"] for r in entry["rounds"])
            print(f"{engine}: served / bare output tok/s, median of {args.rounds} rounds: "
                  f"{entry['median_ratio']:.2f}x", flush=True)
            report["engines"][engine] = entry
        finally:
            for server in pair.values():
                server.stop()
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=2, default=str))
        print(f"written: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
