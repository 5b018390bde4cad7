"""Benchmark harness for OpenAI-compatible LLM servers (ours, vLLM's, SGLang's, any).

    from workshop.bench import run_benchmark, sweep_load, BenchResult
    res = run_benchmark("http://127.0.0.1:8000", "smollm2-135m", workload="random",
                        num_requests=32, concurrency=8, input_len=128, output_len=32)
    res.summary["ttft_ms"]["p99"]

See docs/benchmarking.md for the metric definitions and the workloads.
"""

from .request_metrics import SLO, RequestRecord, summarize
from .results import BenchResult
from .run import arun_benchmark, run_benchmark
from .sweep import SweepResult, find_knee, sweep_load
from .workloads import WORKLOADS, Tokenizer, Workload, build_workload, describe

__all__ = ["run_benchmark", "arun_benchmark", "sweep_load", "find_knee", "BenchResult",
           "SweepResult",
           "RequestRecord", "SLO", "summarize", "Workload", "Tokenizer", "build_workload",
           "describe", "WORKLOADS"]
