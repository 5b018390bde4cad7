"""Everything the server is told at start-up, in one typed place (flags map 1:1 to fields)."""

from __future__ import annotations

import argparse
import os
import re
from dataclasses import dataclass, field, fields

ENGINES = ("vllm", "sglang", "hf", "mini", "remote")


@dataclass
class ServerConfig:
    engine: str = "vllm"
    model: str = "smollm2-135m"            # bundled name, folder, or Hugging Face id
    served_model_name: str | None = None  # what clients send as "model"; default: derived
    host: str = "127.0.0.1"
    port: int = 8000
    device: str = "auto"                  # auto | cpu | cuda
    dtype: str = "bfloat16"
    max_model_len: int = 2048
    kv_cache_gib: float = 1.0             # CPU: KV space; GPU: ignored (memory fraction rules)
    gpu_memory_utilization: float | None = None   # default: 0.3 on CPU, 0.85 on GPU
    enable_prefix_caching: bool = True
    api_key: str | None = None            # from $WORKSHOP_API_KEY: a flag shows in `ps`
    max_body_bytes: int = 4 * 1024 * 1024
    max_n: int = 8                        # largest "n" accepted
    max_logprobs: int = 20                # largest top-logprobs count accepted
    # Sequences (prompts x n) one request may start; 64: mini's whole batch, half vLLM's on CPU
    max_sequences_per_request: int = 64
    # Back-pressure: requests admitted beyond what the engine runs at once; more get a 429.
    max_queued_requests: int = 256
    # Upstream (child engine) timeouts, seconds. Read: the longest silence while a request
    # runs (a stream sends a chunk per token; a long non-streamed answer sends nothing until
    # the end). Probe: /health, /metrics and the like, which answer at once when all is well.
    upstream_read_timeout: float = 600.0
    upstream_probe_timeout: float = 5.0
    # Liveness: a child that fails this many probes in a row, one every interval, is hung.
    liveness_interval: float = 5.0
    liveness_failures: int = 3
    engine_python: str | None = None      # interpreter for a child engine (own venv for SGLang)
    # --engine remote: the OpenAI-compatible server to front, and its key (from
    # $WORKSHOP_UPSTREAM_API_KEY: a flag shows in `ps`)
    upstream: str | None = None
    upstream_api_key: str | None = None
    engine_start_timeout: float = 600.0
    engine_args: list[str] = field(default_factory=list)   # passed verbatim to a child engine
    log_level: str = "info"

    def public_engine_args(self) -> list[str]:
        return redact_args(self.engine_args)

    def resolved_device(self) -> str:
        if self.device != "auto":
            return self.device
        try:
            import torch
            return "cuda" if torch.cuda.is_available() else "cpu"
        except ImportError:
            return "cpu"


_SECRET_FLAG = re.compile(r"key|token|secret|passw|auth|credential", re.I)


def redact_args(args: list[str]) -> list[str]:
    """A command line safe to show: the values of any flag whose name suggests a secret
    (``--api-key X``, ``--hf-token=X``) replaced by ``***``; every value up to the next flag,
    since such a flag may take several (vLLM's ``--api-key A B``)."""
    out: list[str] = []
    hiding = False
    for a in args:
        if a.startswith("-"):
            hiding = False
            name, eq, _ = a.partition("=")
            if _SECRET_FLAG.search(name):
                if eq:
                    a = name + "=***"
                else:
                    hiding = True
        elif hiding:
            a = "***"
        out.append(a)
    return out


def parse_args(argv: list[str] | None = None) -> ServerConfig:
    d = ServerConfig()
    p = argparse.ArgumentParser(
        prog="reference-server",
        description="OpenAI-compatible server over vLLM, SGLang, the Hugging Face "
                    "baseline, the teaching engine or a remote OpenAI-compatible server. "
                    "Extra arguments after `--` go to the child engine.")
    p.add_argument("--engine", choices=ENGINES, default=d.engine)
    p.add_argument("--model", default=d.model,
                   help="'smollm2-135m' (bundled, offline), a model folder, or a Hugging Face id")
    p.add_argument("--served-model-name", default=None)
    p.add_argument("--host", default=d.host)
    p.add_argument("--port", type=int, default=d.port)
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default=d.device)
    p.add_argument("--dtype", default=d.dtype)
    p.add_argument("--max-model-len", type=int, default=d.max_model_len)
    p.add_argument("--kv-cache-gib", type=float, default=d.kv_cache_gib)
    p.add_argument("--gpu-memory-utilization", type=float, default=None)
    p.add_argument("--no-prefix-caching", dest="enable_prefix_caching", action="store_false")
    p.add_argument("--api-key", default=os.environ.get("WORKSHOP_API_KEY"),
                   help="require 'Authorization: Bearer KEY' on everything but /health and "
                        "/ready. Prefer $WORKSHOP_API_KEY: a flag is visible to every user "
                        "in `ps`")
    p.add_argument("--max-body-bytes", type=int, default=d.max_body_bytes)
    p.add_argument("--max-n", type=int, default=d.max_n)
    p.add_argument("--max-logprobs", type=int, default=d.max_logprobs)
    p.add_argument("--max-sequences-per-request", type=int, default=d.max_sequences_per_request,
                   help="most sequences (prompts x n) one request may start; more get a 400 "
                        "before the engine sees them")
    p.add_argument("--max-queued-requests", type=int, default=d.max_queued_requests,
                   help="requests admitted beyond what the engine runs at once; the next "
                        "gets a 429 with Retry-After")
    p.add_argument("--upstream", default=None,
                   help="--engine remote: base URL of the OpenAI-compatible server to front "
                        "(e.g. http://gpu-node:8000/v1)")
    p.add_argument("--upstream-api-key", default=os.environ.get("WORKSHOP_UPSTREAM_API_KEY"),
                   help="--engine remote: the key the remote server expects. Prefer "
                        "$WORKSHOP_UPSTREAM_API_KEY: a flag is visible to every user in `ps`")
    p.add_argument("--upstream-read-timeout", type=float, default=d.upstream_read_timeout,
                   help="child or remote engine: longest silence (s) while a request runs")
    p.add_argument("--upstream-probe-timeout", type=float, default=d.upstream_probe_timeout,
                   help="child or remote engine: timeout (s) of /health, /metrics and similar "
                        "calls")
    p.add_argument("--liveness-interval", type=float, default=d.liveness_interval)
    p.add_argument("--liveness-failures", type=int, default=d.liveness_failures,
                   help="failed liveness probes in a row after which the child is hung")
    p.add_argument("--engine-python", default=None,
                   help="Python interpreter that runs a child engine (default: this one; for "
                        "sglang, .venv-sglang's when scripts/setup.sh --with-sglang built it)")
    p.add_argument("--engine-start-timeout", type=float, default=d.engine_start_timeout)
    p.add_argument("--log-level", default=d.log_level)
    p.add_argument("--help-engine", action="store_true",
                   help="list the teaching engine's knobs (what follows `--` with --engine "
                        "mini) and exit; vLLM's are `vllm serve --help`, SGLang's "
                        "`python -m sglang.launch_server --help`")
    argv = list(argv if argv is not None else __import__("sys").argv[1:])
    extra: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, extra = argv[:i], argv[i + 1:]
    ns = p.parse_args(argv)
    if ns.max_sequences_per_request < 1:
        p.error("--max-sequences-per-request must be at least 1")
    if (ns.engine == "remote") != bool(ns.upstream):
        p.error("--engine remote needs --upstream URL" if ns.engine == "remote" else
                "--upstream is for --engine remote")
    if ns.help_engine:
        from reference_server.engines.mini import engine_arg_parser
        engine_arg_parser().print_help()
        raise SystemExit(0)
    cfg = ServerConfig(**{f.name: getattr(ns, f.name) for f in fields(ServerConfig)
                          if hasattr(ns, f.name)})
    cfg.engine_args = extra
    return cfg
