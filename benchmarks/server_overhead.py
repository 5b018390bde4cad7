"""What does our HTTP layer cost? The reference server vs the vLLM server behind it.

Both are measured on the *same* vLLM process: the harness runs the reference server itself
(``--serve-proxy``), which hands it the child's address and private key in a file only this
user can read (the server never publishes them), and alternates between the two URLs, so
engine state, warm caches and machine load are shared and only the extra hop differs. Targets (issue
2): output tokens/s within 5 %, TTFT p50 within 3 ms.

``--engine mock`` puts the harness's mock streaming server (fixed 50 ms to first token, 20 ms
between tokens, almost no CPU) behind the same proxy code instead of vLLM: what remains is the
layer's own cost, without an engine competing for the same cores.

    python benchmarks/server_overhead.py [--engine vllm|mock] [--rounds 3] [--concurrency 1 32]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from reference_server import launch  # noqa: E402
from workshop.bench import run_benchmark  # noqa: E402


def serve_proxy(port: int, engine_name: str, model: str, upstream_file: str) -> None:
    """The reference server's app over vLLM or, for ``mock``, over a ProxyEngine whose child
    is the mock server; the child's address and key go to ``upstream_file``."""
    import json
    import os

    import uvicorn

    from reference_server.app import create_app
    from reference_server.config import ServerConfig
    from reference_server.engines.base import EngineInfo
    from reference_server.engines.proxy import ProxyEngine
    from reference_server.models import ModelSpec, resolve_model

    class MockProxy(ProxyEngine):
        name = "mock"
        health_path = "/v1/models"

        def command(self):
            return [sys.executable, "-m", "workshop.bench.mock_server", "--port", str(self.port),
                    "--chunk-delay-s", "0.02", "--first-token-delay-s", "0.05"]

        def info(self):
            return EngineInfo("mock", "0", "mock", "mock", "none", "cpu", 4096, None, None,
                              None, False)

        async def reset_prefix_cache(self):
            return False

    if engine_name == "mock":
        config = ServerConfig(served_model_name="mock")
        engine = MockProxy(config, ModelSpec("mock", "mock", False))
    else:
        from reference_server.engines.vllm import VLLMEngine
        config = ServerConfig(engine="vllm", model=model, port=port)
        engine = VLLMEngine(config, resolve_model(model))
    fd = os.open(upstream_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump({"url": engine.url, "key": engine.child_key}, f)
    app = create_app(config, engine=engine)
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


def start_server(port: int, model: str, engine: str, upstream_file: str) -> launch.Launched:
    log = Path(__file__).resolve().parent / "results" / f"server_overhead-{engine}.log"
    server = launch.start([sys.executable, __file__, "--serve-proxy", "--engine", engine,
                           "--model", model, "--port", str(port), "--upstream-file", upstream_file],
                          port, log_path=log)
    try:
        return server.wait_ready(600)
    except BaseException:
        server.stop()
        raise


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engine", choices=("vllm", "mock"), default="vllm")
    ap.add_argument("--serve-proxy", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--upstream-file", help=argparse.SUPPRESS)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--port", type=int, default=8310)
    ap.add_argument("--rounds", type=int, default=3, help="alternating A/B rounds per setting")
    ap.add_argument("--requests", type=int, default=64, help="per run at the highest "
                    "concurrency; a quarter of it at concurrency 1")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 32])
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=64)
    args = ap.parse_args()
    if args.serve_proxy:
        return serve_proxy(args.port, args.engine, args.model, args.upstream_file)

    import json
    import tempfile
    upstream_file = str(Path(tempfile.mkdtemp()) / "upstream.json")
    server = start_server(args.port, args.model, args.engine, upstream_file)
    try:
        ours = server.base_url
        info = httpx.get(ours + "/server_info").json()
        upstream = json.loads(Path(upstream_file).read_text())
        bare, keys = upstream["url"], {"ours": None, "vllm": upstream["key"]}
        print(f"engine {info['engine']} {info['engine_version']} on {info['device']}, "
              f"model {info['model']}; ours {ours} -> bare vLLM {bare}")
        rows = []
        for conc in args.concurrency:
            n = max(args.requests if conc > 1 else args.requests // 4, conc)
            got: dict[str, list[dict]] = {"vllm": [], "ours": []}
            for r in range(args.rounds):
                order = [("vllm", bare), ("ours", ours)]
                for name, url in (order if r % 2 == 0 else order[::-1]):
                    res = run_benchmark(url, info["model"], "random", num_requests=n,
                                        concurrency=conc, input_len=args.input_len,
                                        api_key=keys[name],
                                        output_len=args.output_len, seed=r, progress=False)
                    got[name].append(res.summary)
            med = {k: {"tput": statistics.median(s["output_throughput"] for s in v),
                       "ttft": statistics.median(s["ttft_ms"]["median"] for s in v)}
                   for k, v in got.items()}
            rows.append((conc, med))
        print(f"\n{'streams':>7} {'vLLM tok/s':>11} {'ours tok/s':>11} {'ratio':>7} "
              f"{'vLLM TTFT p50':>14} {'ours TTFT p50':>14} {'delta':>9}")
        for conc, m in rows:
            ratio = m["ours"]["tput"] / m["vllm"]["tput"]
            delta = m["ours"]["ttft"] - m["vllm"]["ttft"]
            print(f"{conc:>7} {m['vllm']['tput']:>11.1f} {m['ours']['tput']:>11.1f} {ratio:>7.3f} "
                  f"{m['vllm']['ttft']:>12.1f}ms {m['ours']['ttft']:>12.1f}ms {delta:>7.2f}ms")
        print("\ntargets: ratio >= 0.95, delta <= 3 ms (medians over rounds; "
              f"{args.rounds} rounds, {args.input_len} in / {args.output_len} out tokens)")
    finally:
        server.stop(60)


if __name__ == "__main__":
    main()
