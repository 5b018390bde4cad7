"""Prometheus text format: the metric names the project reads and writes, and one parser.

Names are the sample names as they appear on ``/metrics`` (counters with their ``_total``
suffix; ``prometheus_client`` accepts them so when registering and writes them back the
same). The reference server exports vLLM's names for every engine, so one reader and one
dashboard serve them all.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

# -- vLLM's names (the reference server's in-process engines export the same) ------------------
NUM_REQUESTS_RUNNING = "vllm:num_requests_running"
NUM_REQUESTS_WAITING = "vllm:num_requests_waiting"
KV_CACHE_USAGE = "vllm:kv_cache_usage_perc"                 # 0-1, despite the name
PREFIX_CACHE_QUERIES = "vllm:prefix_cache_queries_total"    # prompt tokens looked up
PREFIX_CACHE_HITS = "vllm:prefix_cache_hits_total"          # prompt tokens found
NUM_PREEMPTIONS = "vllm:num_preemptions_total"
PROMPT_TOKENS = "vllm:prompt_tokens_total"
GENERATION_TOKENS = "vllm:generation_tokens_total"
REQUEST_SUCCESS = "vllm:request_success_total"
TIME_TO_FIRST_TOKEN = "vllm:time_to_first_token_seconds"    # histogram
INTER_TOKEN_LATENCY = "vllm:inter_token_latency_seconds"    # histogram
E2E_REQUEST_LATENCY = "vllm:e2e_request_latency_seconds"    # histogram
CACHE_CONFIG_INFO = "vllm:cache_config_info"  # labels: block_size, num_gpu_blocks, ...
SPEC_DECODE_DRAFTS = "vllm:spec_decode_num_drafts_total"
SPEC_DECODE_DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
SPEC_DECODE_ACCEPTED_TOKENS = "vllm:spec_decode_num_accepted_tokens_total"
# Older vLLM releases (before the v1 engine's renames).
OLD_KV_CACHE_USAGE = "vllm:gpu_cache_usage_perc"
OLD_PREFIX_CACHE_QUERIES = "vllm:gpu_prefix_cache_queries_total"
OLD_PREFIX_CACHE_HITS = "vllm:gpu_prefix_cache_hits_total"

# -- SGLang's names for the same quantities ---------------------------------------------------
SGLANG_TOKEN_USAGE = "sglang:token_usage"
SGLANG_CACHE_HIT_RATE = "sglang:cache_hit_rate"             # a running rate, not a counter
SGLANG_NUM_RUNNING = "sglang:num_running_reqs"
SGLANG_NUM_QUEUED = "sglang:num_queue_reqs"
SGLANG_NUM_USED_TOKENS = "sglang:num_used_tokens"  # KV tokens held (exact; token_usage is rounded)
SGLANG_MAX_TOTAL_TOKENS = "sglang:max_total_num_tokens"     # KV-cache capacity in tokens
SGLANG_PROMPT_TOKENS = "sglang:prompt_tokens_total"
SGLANG_GENERATION_TOKENS = "sglang:generation_tokens_total"
SGLANG_CACHED_TOKENS = "sglang:cached_tokens_total"         # prompt tokens found in the radix cache
SGLANG_NUM_RETRACTED = "sglang:num_retracted_requests_total"  # SGLang's preemptions
SGLANG_TIME_TO_FIRST_TOKEN = "sglang:time_to_first_token_seconds"    # histogram
SGLANG_INTER_TOKEN_LATENCY = "sglang:inter_token_latency_seconds"    # histogram
SGLANG_E2E_REQUEST_LATENCY = "sglang:e2e_request_latency_seconds"    # histogram

# -- the reference server's HTTP layer ------------------------------------------------------
SERVER_PREFIX = "reference_server_"                          # every name below starts so
VLLM_PREFIX = "vllm:"
SERVER_REQUESTS = "reference_server_requests_total"          # labels: endpoint, status
SERVER_IN_FLIGHT = "reference_server_requests_in_flight"
SERVER_CLIENT_DISCONNECTS = "reference_server_client_disconnects_total"
SERVER_STREAM_FAILURES = "reference_server_stream_failures_total"
SERVER_ENGINE_UP = "reference_server_engine_up"
# new engine processes after a death
SERVER_ENGINE_RESTARTS = "reference_server_engine_restarts_total"


@dataclass(frozen=True)
class Sample:
    name: str
    labels: dict[str, str] = field(default_factory=dict)
    value: float = 0.0


_LABEL = re.compile(r'\s*([A-Za-z_][A-Za-z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?')
_UNESCAPE = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}


def parse(text: str) -> list[Sample]:
    """Every sample of a ``/metrics`` page, labels kept. Comments, blank and malformed lines
    are skipped; a trailing timestamp is ignored; NaN values are dropped."""
    out: list[Sample] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        labels: dict[str, str] = {}
        brace = line.find("{")
        if brace >= 0:
            name = line[:brace].strip()
            pos = brace + 1
            while True:
                m = _LABEL.match(line, pos)
                if not m:
                    break
                labels[m.group(1)] = re.sub(r'\\[\\"n]', lambda e: _UNESCAPE[e.group(0)],
                                            m.group(2))
                pos = m.end()
            if not line.startswith("}", pos):
                continue
            rest = line[pos + 1:].split()
        else:
            name, *rest = line.split()
        if not rest:
            continue
        try:
            value = float(rest[0])       # "+Inf", "NaN" parse too
        except ValueError:
            continue
        if not math.isnan(value):
            out.append(Sample(name, labels, value))
    return out


def totals(text: str) -> dict[str, float]:
    """Each sample name's values summed over its label sets: ``{name: value}``.

    What a notebook wants from a gauge or counter that several engine processes (or models)
    report separately; histogram samples keep their ``_bucket``/``_sum``/``_count`` names.
    """
    out: dict[str, float] = {}
    for s in parse(text):
        out[s.name] = out.get(s.name, 0.0) + s.value
    return out


def labels_of(text: str, name: str) -> dict[str, str]:
    """The labels of the first sample called ``name`` (an ``_info`` gauge); ``{}`` if none."""
    return next((s.labels for s in parse(text) if s.name == name), {})


def first(metrics: dict[str, float], names: tuple[str, ...]) -> float | None:
    """The value of the first of ``names`` present (the same quantity under several names)."""
    for n in names:
        if n in metrics:
            return metrics[n]
    return None


def without(text: str, prefix: str) -> str:
    """``text`` less every metric whose name starts with ``prefix``: its samples and its
    ``# HELP`` / ``# TYPE`` lines (so a page can be merged with another that has its own)."""
    keep = []
    for line in text.splitlines():
        words = line.split()
        name = words[2] if line.startswith("#") and len(words) > 2 else line
        if not name.startswith(prefix):
            keep.append(line)
    return "\n".join(keep) + ("\n" if keep else "")


__all__ = ["Sample", "parse", "totals", "labels_of", "first", "without"]
