"""Figures for the slides, taken from executed notebooks (a labelled reference run).

A slide never shows a redrawn plot: it shows the PNG a notebook drew in a run. This script

* executes notebooks (``--execute``) the way CI does (nbclient, ``WORKSHOP_QUICK=1`` unless
  ``--full``), against the servers named by ``WORKSHOP_BASE_URL`` / ``WORKSHOP_HF_BASE_URL``
  (or the ones ``workshop.session.connect()`` finds or starts), and records each plot's
  title through an IPython start-up file (the notebook sources are not touched);
* or reads notebooks executed elsewhere (``--from DIR`` holding ``NN_slug.executed.ipynb``,
  e.g. the ones ``tests/notebooks/test_execute.py`` writes);

then, for every notebook named in ``FIGURES`` that has an executed copy, writes

* ``slides/figures/NN_slug/NAME.png``, the PNG output of the one cell that draws it;
* ``slides/reference_run/NN_slug.html``, the whole executed notebook as one self-contained
  page, headed by the machine, date and mode of the run;
* ``slides/figures/manifest.json``: per notebook the run's machine, date, engine and mode
  (the slides' captions are generated from it), and per figure the cell it came from, the
  notebook section it sits in, the plot's title when the run recorded it, and a SHA-256.

A figure is found by the call that draws it (a regular expression on the cell's source,
e.g. ``fa\\.memory_figure\\(``), which survives edits to prose, cell order and plot titles
that carry measured numbers; exactly one cell must match and it must have exactly one PNG,
otherwise the export stops and says which figure and why. When the run recorded titles, the
title must also match the figure's ``title`` pattern.

    python slides/export_figures.py --from /tmp/workshop-test-logs/notebooks --mode quick
    python slides/export_figures.py --execute               # quick mode, every notebook
    python slides/export_figures.py --execute --only 06_flash_attention
"""

from __future__ import annotations

import argparse
import base64
import datetime as dt
import hashlib
import html
import inspect
import json
import os
import re
import sys
import tempfile
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SLIDES = ROOT / "slides"
NOTEBOOKS = ROOT / "notebooks"
FIGURES_DIR = SLIDES / "figures"
REFERENCE_DIR = SLIDES / "reference_run"
MANIFEST = FIGURES_DIR / "manifest.json"
# The display data our IPython start-up file adds beside every matplotlib Figure's PNG.
FIGURE_MIME = "application/vnd.workshop.figure+json"


@dataclass(frozen=True)
class FigureSpec:
    name: str       # file name (no extension) under slides/figures/NN_slug/
    source: str     # regex matched against code cell sources: the call that draws the plot
    title: str      # regex the plot's title must match (checked when the run recorded titles)
    about: str      # what the figure shows, for the manifest and the reader of this file


# Which figures the decks use, per notebook. A notebook absent from the run is skipped; a
# figure listed here but missing from a notebook's run is an error.
FIGURES: dict[str, list[FigureSpec]] = {
    "00_setup_first_request": [
        FigureSpec("next_token", r"next_token\.plot_top_probabilities\(", r"^Next token after ",
                   "the model's most likely next tokens and their probabilities"),
        FigureSpec("stream", r"probe\.plot_stream\(", r"^One streamed answer",
                   "one streamed answer: arrival time of every token (TTFT, then decode)"),
    ],
    "01_pain_points": [
        FigureSpec("kv_vs_context", r"^context_plot\s*$",
                   r"KV cache of one request grows with its context",
                   "KV-cache memory vs tokens held: engine gauge next to the formula"),
        FigureSpec("kv_vs_users", r"^users_plot\s*$", r"KV cache grows with simultaneous users",
                   "KV-cache memory vs simultaneous users"),
        FigureSpec("ttft_vs_prompt", r"^ttft_plot\s*$",
                   r"Time to first token grows with the prompt",
                   "time to first token vs prompt length"),
        FigureSpec("engines", r"^engines_plot\s*$", r"Same requests, four ways",
                   "Hugging Face baseline vs vLLM, sequential and concurrent"),
    ],
    "02_kv_cache_capacity": [
        FigureSpec("users_vs_context", r"^capacity_plot\s*$", r" on \d+ x .+, weights ",
                   "users that fit per GPU vs context length (calculator)"),
        FigureSpec("tpot_vs_batch", r"^slo_plot\s*$", r": weights .+, KV .+ tokens per user",
                   "time per output token vs batch size against a latency target"),
    ],
    "03_prefill_decode_roofline": [
        FigureSpec("roofline_measured", r"measured_points\}", r"measured on the live server",
                   "this machine's roofline with prefill and decode measured on the live server"),
        FigureSpec("roofline_gpu", r"gpu_machines \+ \[roof\]", r"predicted \(datasheet roofs\)",
                   "the same roofline predicted for common GPUs (datasheet roofs)"),
    ],
    "04_quantization": [
        FigureSpec("tradeoff", r"^plot_tradeoff\(", r"^Memory vs quality",
                   "memory, decode speed and quality per weight format"),
    ],
    "05_attention_variants": [
        FigureSpec("bytes", r"av\.bytes_figure\(", r"^KV cache per token",
                   "KV bytes per token of real model configs as MHA, as shipped and as MQA"),
        FigureSpec("quality", r"av\.quality_figure\(", r"^Quality vs KV cache",
                   "untrained GQA -> MQA / MLA conversions served live: cache size and quality"),
        FigureSpec("time", r"av\.time_figure\(", r"^Decode attention time vs KV heads",
                   "decode attention time vs the number of KV heads on this machine"),
    ],
    "06_flash_attention": [
        FigureSpec("memory", r"fa\.memory_figure\(", r"^Peak memory of one attention head",
                   "peak memory of naive vs tiled attention as the sequence grows"),
        FigureSpec("traffic", r"fa\.traffic_figure\(", r"^Bytes moved to and from slow memory",
                   "slow-memory traffic counted for naive vs tiled attention"),
        FigureSpec("timing", r"fa\.timing_figure\(", r"^Attention time on this machine",
                   "naive vs tiled (NumPy) vs fused SDPA attention time"),
        FigureSpec("prefill", r"fa\.prefill_figure\(", r"^Prefill on the live ",
                   "prefill time vs prompt length on the live server"),
    ],
    "07_paged_attention_batching": [
        FigureSpec("pool_shares", r"batching\.plot_pool_shares\(",
                   r"ShareGPT requests through a pool",
                   "KV pool shares (tokens, internal and external waste) per layout, simulated"),
        FigureSpec("timeline", r"plot_timeline\(\s*timeline_runs", r"^static, .+ \| continuous, ",
                   "static vs continuous batching: the engine's step trace as a timeline"),
        FigureSpec("chunked", r"plot_timeline\(\s*chunk_runs", r"^no chunking: .+ \| chunked, ",
                   "a long prompt arriving among decodes, without and with chunked prefill"),
    ],
    "08_prefix_caching": [
        FigureSpec("pool", r"prefix_caching\.pool_figure\(",
                   r"^Prefix-cache hit rate as the KV pool shrinks",
                   "hit rate vs KV pool size, hash vs radix eviction (replay)"),
        FigureSpec("vllm", r"prefix_caching\.per_request_figure\(", r"^vLLM: time to first token",
                   "vLLM: TTFT of each request with its prefix cache emptied vs kept"),
    ],
    "09_speculative_decoding": [
        FigureSpec("formula", r"sd\.formula_figure\(", r"^Expected speed-up \(Leviathan",
                   "expected speed-up vs draft length for several acceptance rates (formula)"),
        FigureSpec("sweep", r"sd\.sweep_figure\(", r"^Speculative decoding on this machine",
                   "measured speed-up and acceptance vs draft length, next to the formula"),
        FigureSpec("workloads", r"sd\.workload_figure\(", r"drafts: repetitive vs open-chat",
                   "n-gram drafts on an editing and an open-chat workload, teaching engine "
                   "and vLLM"),
    ],
    # The showdown's panels are titled by workload only (the figure's own title is a suptitle,
    # which the run does not record): the pattern accepts any of the harness's workloads.
    "10_engine_showdown": [
        FigureSpec("ttft", r"plot_showdown\(showdown_sweeps, \"ttft_ms\"\)",
                   r"^(sharegpt|agentic|shared-prefix)( \| |$)",
                   "achieved vs offered load and p99 TTFT vs load, every contender, per workload"),
        FigureSpec("itl", r"plot_showdown\(showdown_sweeps, \"itl_ms\"\)",
                   r"^(sharegpt|agentic|shared-prefix)( \| |$)",
                   "achieved vs offered load and p99 ITL vs load, every contender, per workload"),
        FigureSpec("switches", r"engine_switches\.switches_figure\(",
                   r"^Decode steps of \d+ sequences",
                   "the teaching engine's decode step with each speed technique switched off"),
    ],
    "11_decision_chart": [
        FigureSpec("chart", r"decision_chart\.plot_decision\(",
                   r"^winner and margin \(best / runner-up\)",
                   "winner and margin per workload and constraint, and throughput at each knee"),
    ],
    "12_shared_queue": [
        FigureSpec("sweep", r"qfig\.sweep_figure\(", r"^Throughput \(dotted: each route's knee\)",
                   "pull from a shared queue vs round-robin push: throughput and p99 vs load"),
        FigureSpec("zipf", r"qfig\.zipf_figure\(", r"^Hit rate: requests whose model was resident",
                   "LRU packing: hit rate vs Zipf skew (replay, Che) and the live run's latencies"),
        FigureSpec("encoding", r"qfig\.encoding_figure\(", r"^Bytes on the wire / raw bytes",
                   "JSON numbers vs base64-in-JSON vs MessagePack bin: size and encode+decode "
                   "time"),
        FigureSpec("kill", r"qfig\.kill_figure\(", r"^A worker killed mid-request",
                   "every request of a burst when one worker is SIGKILLed: redelivery after "
                   "ack_wait"),
    ],
    "13_cold_starts": [
        FigureSpec("formats", r"cs\.formats_figure\(",
                   r"^Loading the same checkpoint, every byte read",
                   "cold and warm load time of one checkpoint in four formats"),
        FigureSpec("fit", r"cs\.fit_figure\(", r"^Cold load time vs checkpoint size",
                   "cold load time vs checkpoint size, the fitted fixed cost + size / bandwidth"),
        FigureSpec("migration", r"cs\.migration_figure\(", r"^What crosses the network",
                   "live migration: bytes sent and time to the next token, token ids vs KV copy"),
    ],
    "14_production_gateway": [
        FigureSpec("policies", r"gx\.figure\(", r"^Latency through the gateway",
                   "spread vs concentrate routing: latency and each replica's busy time vs load"),
    ],
    "15_sampling_structured_output": [
        FigureSpec("distribution", r"sampling\.distribution_figure\(",
                   r"^First token at temperature",
                   "the first token's softmax at T computed from the log-probabilities vs the "
                   "draws"),
        FigureSpec("grammar", r"sampling\.allowed_figure\(", r"^What the grammar allows",
                   "tokens a JSON schema's grammar allows before each token of a valid answer"),
    ],
    "16_cache_aware_routing": [
        FigureSpec("routing", r"car\.figure\(", r"[Pp]refix-cache hit rate, whole fleet",
                   "hit rate and p99 TTFT per routing policy as the sessions outgrow the caches"),
        FigureSpec("tenants", r"car\.tenant_figure\(", r"no salts",
                   "another tenant's probe TTFT, with and without a salt per tenant"),
    ],
    "17_disaggregated_prefill_decode": [
        FigureSpec("gaps", r"dg\.gaps_figure\(", r"disaggregated",
                   "gaps between running streams' tokens while long prompts arrive, per set-up"),
    ],
}

# Notebooks 10 and 11 print each contender's configuration as a table (decision.setup_rows:
# engine | answers | dtype | attention | prefix cache | compiled | max running | KV tokens | CPU
# | notes). A cell of it, by engine and column; the answers column (the correctness gate's
# verdict) starts with right, wrong or not checked, which no other table of theirs does.
SETUP_COLUMNS = ("answers", "dtype", "attention", "prefix cache", "compiled", "max running",
                 "KV tokens", "CPU")
# Notebook 10's field on a CPU: the full plan runs all five; the quick plan (CI, --refresh)
# the teaching engine twice and the engine the first cell connected to (vLLM there).
CPU_FIELD = ("vllm", "sglang", "mini-hash", "mini-radix", "hf")
NOT_IN_RUN = "not in this run"
# The line naming a run's engines, {} one of them: notebook 10's contenders, notebook 11's
# comparison. A value of one engine is required only where this line names it.
SHOWDOWN_FIELD = r"^\*\*\d+ contenders\*\* \((?:[^)]*, )?{}(?:, [^)]*)?\)"
CHART_FIELD = r"^Comparing \*\*(?:[^*]*, )?{}(?:, [^*]*)?\*\* on"


def _of(engine: str, regex: str, about: str, field: str = SHOWDOWN_FIELD) -> tuple[str, ...]:
    """A value of one engine: "not in this run" where the run left that engine out."""
    return regex, about, field.format(re.escape(engine))


def _setup_cell(engine: str, column: str, field: str = SHOWDOWN_FIELD) -> tuple[str, ...]:
    i = SETUP_COLUMNS.index(column)
    return _of(engine, rf"^\| {re.escape(engine)} \| (?=right|wrong|not checked)(?:[^|\n]*\| "
                       rf"){{{i}}}([^|\n]*?) \|",
               f"{engine}'s {column}, as its server reported it (the setup table)", field)


def _setup_values(engines, columns, field: str = SHOWDOWN_FIELD) -> dict[str, tuple[str, ...]]:
    return {f"{e.replace('-', '_')}_{c.replace(' ', '_').lower()}": _setup_cell(e, c, field)
            for e in engines for c in columns}


# Numbers the slides quote, read from a run's text outputs: (regex with one group, what it is),
# and for a value of one contender a third regex, the run's contenders line naming it. The
# first match in the notebook wins; a listed value missing from a run is an error, unless its
# contender was not in the run.
VALUES: dict[str, dict[str, tuple[str, ...]]] = {
    "00_setup_first_request": {
        "kv_capacity_tokens": (r"KV capacity=(\d+) tokens", "KV capacity the engine reported"),
        "max_model_len": (r"max_model_len=(\d+)", "context length the engine serves"),
        "model": (r"model:\s+(\S+)", "model served"),
    },
    "05_attention_variants": {
        "mla_vs_mha": (r"\*\*([\d.]+)x\*\* less\. This is where",
                       "DeepSeek-V3 as MHA with its own heads / its MLA cache, per token"),
        "mla_vs_gqa": (r"\*\*([\d.]+)x\*\* DeepSeek-V3's",
                       "the chosen GQA model's cache per token / DeepSeek-V3's"),
        "gqa_model": (r"\*\*Against a GQA model\*\* \(([^,]+),", "the GQA model compared"),
        "equivalent_kv_heads": (r"\*\*([\d.]+) KV heads\*\*",
                                "DeepSeek-V3's latent in KV heads of 128 (paper: 2.25 groups)"),
    },
    "07_paged_attention_batching": {
        "contiguous_waste_pct": (r"^\| contiguous \| \d+ \| \d+ \| \d+ \| ([\d.]+) \|",
                                 "share of max-length reservations never holding a token"),
        "paged_waste_pct": (r"^\| paged \| \d+ \| \d+ \| \d+ \| ([\d.]+) \|",
                            "share of paged reservations (block tails) never holding a token"),
        "requests": (r"^([\d,]+) ShareGPT requests \(tokenizer", "ShareGPT requests in the sample"),
    },
    "08_prefix_caching": {
        "formula_terms": (r"= (\(\d+ − \d+\) × \d+ / \(\d+ × \d+\)) = \*\*",
                          "the hit-rate formula with this run's numbers"),
        "formula_hit_rate": (r"\(\d+ × \d+\) = \*\*([\d.]+)\*\*", "hit rate the formula predicts"),
        "measured_hit_rate": (r"hash server's counters "
                              r"\(`vllm:prefix_cache_hits_total`.*?\*\*([\d.]+)\*\*",
                              "hit rate the hash-cache server counted on /metrics"),
        "vllm_block": (r"block size \*\*(\d+) tokens\*\*, prefix",
                       "vLLM's block size on this server"),
        "off_ms": (r"^\| cache off \| (?:[^|\n]*\| ){4}([\d.,]+) \|",
                   "median TTFT with a reset before every request (ms)"),
        "on_miss_ms": (r"^\| cache on \| (?:[^|\n]*\| ){6}([\d.,]+) \|",
                       "median TTFT of the cache-on run's misses (ms)"),
    },
    "09_speculative_decoding": {
        "tokens_per_step_08_4": (r"= \*\*([\d.]+)\*\* tokens for one target forward",
                                 "formula: tokens per step at alpha 0.8, k 4"),
        "verify_tokens": (r"Verifying (\d+) tokens in one forward took",
                          "tokens in the longest verify forward timed"),
        "verify_cost": (r"in one forward took \*\*([\d.]+)x\*\* a one-token decode",
                        "measured cost of one verify forward of k+1 tokens, in decode forwards"),
    },
    "10_engine_showdown": {
        "model": (r"^model:\s+(\S+)", "model served"),
        "contenders": (r"^\*\*\d+ contenders\*\* \(([^)]+)\)", "the contenders of this run"),
        "workloads": (r"contenders\*\* \([^)]+\) x \*\*\d+ workloads?\*\* \(([^)]+)\)",
                      "the workloads of this run"),
        "plan": (r"workloads?\*\* \([^)]+\), the (\w+) plan", "quick or full plan"),
        **{f"{e.replace('-', '_')}_args": _of(
            e, rf"^\| {re.escape(e)} \| \w+ \| ([^|\n]+?) \| (?:already running|started here) \|",
            f"{e}'s server arguments (section 1's field)") for e in CPU_FIELD},
        **_setup_values(CPU_FIELD, SETUP_COLUMNS[:-1]),
        "cpu_flags": _setup_cell("vllm", "CPU"),
        "gate_prompts": (r"correctness gate: \w+: (\d+) answers",
                         "prompts each contender answered for the correctness gate"),
        "gate_margin": (r"against the gate's margin of ([\d.]+):", "near-tie margin, in logits"),
        "france_gap": (r"its top two first tokens are \*\*([\d.]+) logits\*\* apart",
                       "the reference's top-two logit gap on 'What is the capital of France?'"),
        "slo_ttft": (r"^\| p99 TTFT \(ms\) \| [^|\n]* \| ([\d,.]+) \|",
                     "p99 TTFT objective used (ms)"),
        "slo_itl": (r"^\| p99 ITL \(ms\) \| [^|\n]* \| ([\d,.]+) \|",
                    "p99 ITL objective used (ms)"),
        "slo_factor": (r"^Objectives of this run: [^(]*\(derived: ([\d.]+) x",
                       "the factor a derived objective puts on the best unloaded latency"),
        "slo_how": (r"^\| p99 TTFT \(ms\) \| [^|\n]* \| [^|\n]* \| (\w+) \|", "stated or derived"),
        **{f"{e.replace('-', '_')}_capacity": _of(
            e, rf"^\| shared-prefix \| {re.escape(e)} \| (?:[^|\n]*\| ){{3}}([^|\n]+?) \|",
            f"{e}'s capacity on shared-prefix (output tok/s, any load tried)")
            for e in CPU_FIELD},
        "prefix_reuse": (r"prefix reuse \(the ceiling\) was \*\*([\d.]+)\*\*",
                         "shared-prefix workload's prefix reuse (ceiling of any hit rate)"),
        "radix_over_hash": (r"radix / hash capacity \(output tok/s\), shared-prefix: ([\d.]+)",
                            "exercise 1: radix / hash capacity"),
        "radix_expected": (r"Expected: \([\d.,]+ \+ [\d.,]+\) / \([\d.,]+ \+ [\d.,]+\) = "
                           r"\*\*([\d.]+)\*\*",
                           "exercise 1: radix / hash capacity the work per request predicts"),
        "batching_engine": (r"(\S+)'s capacity / its one-at-a-time output tok/s",
                            "exercise 2: the contender with the most capacity"),
        "batching_gain": (r"capacity / its one-at-a-time output tok/s, shared-prefix: ([\d.]+)",
                          "exercise 2: its capacity / its one-at-a-time output tok/s"),
        "hit_engine": (r"measured (\S+) prefix hit rate at .+?, shared-prefix: [\d.]+",
                       "exercise 3: the engine the first cell connected to"),
        "hit_rate_at": (r"prefix hit rate at (.+?), shared-prefix: [\d.]+",
                        "exercise 3: the load the hit rate was read at"),
        "hit_rate": (r"prefix hit rate at .+?, shared-prefix: ([\d.]+)",
                     "exercise 3: the connected engine's prefix hit rate"),
        "switch_defaults_ms": (r"^\| defaults \| True \| ([\d.]+) \|",
                               "teaching engine's decode step with every technique on (ms)"),
        "switch_worst": (r"step time without `([^`]+)`'s technique / the defaults'",
                         "exercise 4: the switch whose technique mattered most"),
        "switch_worst_ratio": (r"step time without `[^`]+`'s technique / the defaults': ([\d.]+) x",
                               "exercise 4: its step time / the defaults'"),
    },
    "11_decision_chart": {
        # bold when the folders are yours, a warning heading when they are the committed ones
        "data": (r"^(?:\*\*|## ⚠ )(Your showdown data|These are not your measurements)",
                 "whose data the chart is drawn from"),
        "newest_model": (r"These numbers come from \*\*([^*]+)\*\* on",
                         "model of the newest folder"),
        "newest_mode": (r"These numbers come from .+?, in a \*\*(\w+)\*\* run",
                        "mode of the newest folder"),
        "objectives": (r"^Comparing \*\*[^*]+\*\* on \*\*[^*]+\*\*, objectives (.+?), ties within",
                       "objectives the chart judged with"),
        "engines": (r"^Comparing \*\*([^*]+)\*\* on", "engines compared"),
        "machine": (r"These numbers come from \*\*[^*]+\*\* on \*\*([^*]+)\*\*",
                    "the machine of the newest showdown folder"),
        **_setup_values(CPU_FIELD, ("answers",), CHART_FIELD),
        "verdict_shared_prefix": (r"^- \*\*shared-prefix\*\*[^:]*: (.+)\.$",
                                  "the verdicts on shared-prefix, one per constraint"),
        "amx_run": (r"^\| Xeon with AMX \| `showdown-amx`: ([^|\n]+?) \|",
                    "the AMX reference stage's run"),
        "amx_answers": (r"^\| Xeon with AMX \| `showdown-amx`: [^|\n]+ \| [^|\n]+ \| ([^|\n]+?) \|",
                        "the AMX stage's correctness gate results"),
        "amx_fair": (r"^\| Xeon with AMX \| `showdown-amx`: (?:[^|\n]*\| ){5}(\w+) \|",
                     "is the AMX stage fair (computed)"),
        "epyc_run": (r"^\| EPYC with AVX2 only \| `showdown-cpu`: ([^|\n]+?) \|",
                     "the AVX2 reference stage's run"),
        "epyc_answers": (r"^\| EPYC with AVX2 only \| `showdown-cpu`: [^|\n]+ \| [^|\n]+ \| "
                         r"([^|\n]+?) \|",
                         "the AVX2 stage's correctness gate results"),
        "epyc_differ": (r"^\| EPYC with AVX2 only \| `showdown-cpu`: "
                        r"(?:[^|\n]*\| ){4}([^|\n]+?) \|",
                        "how the AVX2 stage's set-ups differ"),
        "epyc_outside": (r"^\| EPYC with AVX2 only \| `showdown-cpu`: "
                         r"(?:[^|\n]*\| ){3}([^|\n]+?) \|",
                         "who ran outside its supported hardware on the AVX2 stage"),
        "epyc_fair": (r"^\| EPYC with AVX2 only \| `showdown-cpu`: (?:[^|\n]*\| ){5}(\w+) \|",
                      "is the AVX2 stage fair"),
        **{f"stage_{w.replace('-', '_')}_{c}_{s}": (
            # a row of the two-stage table, which ends with "same winner" (not section 4's)
            rf"^\| {w} \| {label} \| (?=(?:[^|\n]*\| ){{2}}(?:yes|no) \|$)"
            + r"(?:[^|\n]*\| )" * i + r"([^|\n]+?) \|",
            f"{w} / {label}: winner on the {stage} stage")
           for w in ("sharegpt", "agentic", "shared-prefix")
           for c, label in (("throughput", "throughput"), ("ttft", "TTFT p99"))
           for i, (s, stage) in enumerate((("amx", "Xeon with AMX"),
                                           ("epyc", "EPYC with AVX2 only")))},
        "ex_source": (r"^Exercises 1 and 2 read \*\*([^*]+)\*\*",
                      "the data exercises 1 and 2 read"),
        "ex_workload": (r"^Exercises 1 and 2 read \*\*[^*]+\*\* \(`[^`]+`\), workload "
                        r"\*\*([^*]+)\*\*",
                        "the workload exercises 1 and 2 read"),
        "ex1_pair": (r"computed throughput margin on \S+ \(([^)]*)\)",
                     "exercise 1: which engine over which"),
        "ex1_margin": (r"computed throughput margin on \S+ \([^)]*\): ([\d.]+) x",
                       "exercise 1: the margin"),
        "ex3_ratio": (r"computed mini-hash one at a time on shared-prefix, [^:]+: ([\d.]+) x",
                      "exercise 3: mini-hash one at a time, Xeon / EPYC"),
        "ex3_expected": (r"Expected: \d+ / \d+ = \*\*([\d.]+)x\*\*",
                         "exercise 3: what bytes per weight predict"),
        "stage_changes": (r"The winner changes with the CPU in (\d+ of \d+) cells",
                          "cells whose winner differs between the two stages"),
    },
    "12_shared_queue": {
        "system": (r"\), (\d+ workers, \d+ models of \d+ layers), each",
                   "workers, models and layers"),
        "model_mib": (r"models of \d+ layers, each \*\*(\d+) MiB\*\* resident",
                      "one model's resident size"),
        "capacity": (r"^Capacity: \*\*([\d.]+) requests/s\*\*",
                     "the workers' capacity, pulled burst"),
        "requests_per_point": (r"^The sweep sends (\d+) requests per route and load",
                               "requests per point"),
        # the sweep's table (route | asked | offered | achieved | requests | no reply | p50 |
        # p99 | ...), its last row of a route: the highest load
        "top_rate": (r"^\| pull \(shared queue\) \| ([\d.]+) \|(?![\s\S]*^\| pull \(shared queue\) "
                     r"\|)",
                     "highest load asked (req/s)"),
        "p99_pull": (r"^\| pull \(shared queue\) \| (?:[^|\n]*\| ){6}([^|\n]+?) \|"
                     r"(?![\s\S]*^\| pull \(shared queue\) \|)",
                     "p99 pulled at the highest load (s)"),
        "p99_rr": (r"^\| push: round-robin \| (?:[^|\n]*\| ){6}([^|\n]+?) \|"
                   r"(?![\s\S]*^\| push: round-robin \|)",
                   "p99 pushed round-robin at the highest load (s)"),
        "p99_ratio": (r"p99 of round-robin push / p99 of the shared queue: ([\d.]+) x",
                      "exercise 1: p99 round-robin / p99 pulled at the highest load"),
        "hit_live": (r"measured hit rate \(live\): ([\d.]+)", "exercise 2: live hit rate"),
        "hit_replay": (r"replayed over each worker's own sequence(?: gives)? (\d+%)",
                       "the same policy replayed"),
        "hit_che": (r"Che's approximation (?:\(the formula above\) gives )?\*{0,2}(\d+%)",
                    "Che's approximation"),
        "b64_size": (r"base64 in JSON (?:took )?\*{0,2}([\d.]+)x\*{0,2} the raw bytes",
                     "embeddings: base64-in-JSON bytes / raw"),
        "b64_cost": (r"(?:encoding and decoding cost |MessagePack [\d.]+x, and )(\d+)x (?:as "
                     r"much|the time)",
                     "embeddings: base64-in-JSON / MessagePack encode + decode time"),
        "ids_list_size": (r"JSON list of numbers(?: took|:) ([\d.]+)x",
                          "token ids as a JSON list / their 4-byte form"),
        "ack_wait": (r"^`ack_wait` = ([\d.]+) s", "the queue's ack_wait"),
        "kill_requests": (r"^\*{0,2}(\d+) requests(?:, \d+ lost|; `)",
                          "requests in the kill burst"),
        "kill_held": (r"killed holding (\d+)", "requests the victim held"),
        "kill_lost": (r"\*\*(?:\d+ requests, )?(\d+|None)(?: lost| was lost)",
                      "requests that got no reply"),
        "kill_recovery": (r"seconds from the kill to the last redelivered reply: ([\d.]+) s",
                          "exercise 3: kill to the last redelivered reply"),
    },
    "13_cold_starts": {
        "file_mib": (r"^\| model\.packed \| packed \| ([\d,.]+) \|", "checkpoint size (MiB)"),
        "first_read": (r"first read (?:ran at |\()([\d.]+) GB/s", "cold read speed after the drop"),
        "second_read": (r"the second (?:at |\()([\d.]+) GB/s", "warm (page cache) read speed"),
        "cold_forecast": (r"Forecast: \*\*([\d.]+) s\*\*", "exercise 1: cold torch.load forecast"),
        "cold_measured": (r"seconds for a cold torch\.load of the whole checkpoint: ([\d.]+) s",
                          "exercise 1: cold torch.load measured"),
        "packed_fixed_ms": (r"^\| packed \| ([\d.]+) \| [\d.]+ \|", "packed line: fixed cost (ms)"),
        "packed_gbps": (r"^\| packed \| [\d.]+ \| ([\d.]+) \|", "packed line: bandwidth (GB/s)"),
        "big_measured": (r"measured cold packed load of [\d,]+ MiB: ([\d.]+) s",
                         "exercise 2: measured"),
        "big_predicted": (r"The packed line predicted ([\d.]+) s",
                          "exercise 2: the line's prediction"),
        "load_8b": (r"predicts \*\*(\d+) s\*\* to load Llama-3\.1-8B",
                    "extrapolated load of Llama-3.1-8B"),
        "load_70b": (r"\*\*(\d+) s\*\* for Llama-3\.1-70B", "extrapolated load of Llama-3.1-70B"),
        "engine_start": (r"One teaching engine started in \*\*([\d.]+) s\*\*",
                         "teaching engine start"),
        "kv_per_token": (r"KV ([\d,]+) bytes per token, measured",
                         "KV bytes per token, teaching engine"),
        "migrate_tokens": (r"^For ([\d,]+) tokens the KV copy sends", "longest request moved"),
        "kv_over_ids": (r"the KV copy sends \*\*([\d,]+)x\*\*", "KV copy bytes / token-id bytes"),
        "next_after_copy": (r"next token ([\d,]+) ms after a copy",
                            "next token after a KV copy (ms)"),
        "next_after_recompute": (r"against ([\d,]+) ms after recomputing",
                                 "next token after recomputing (ms)"),
        "break_even": (r"break even at \*\*([\d.e+]+) Gb/s\*\*",
                       "link speed where the two ways tie"),
    },
    "14_production_gateway": {
        "admitted": (r"requests admitted out of 12: (\d+)",
                     "exercise 1: trial requests admitted of 12"),
        "trial_burst": (r"(?:The bucket starts full, |the burst of )(\d+)(?: tokens|, plus one)",
                        "the trial key's burst"),
        "unknown_key": (r"[Uu]nknown key gets (\d+ `\w+`)", "status for an unknown key"),
        "quota_requests": (r"^\*\*(\d+) requests\*\* used", "requests the metered quota admitted"),
        "quota_used": (r"requests\*\* used \*\*(\d+)\*\* tokens", "tokens they used"),
        "quota": (r"tokens of a quota of (\d+)", "the metered key's quota"),
        "log_marker": (r"appears in it \*\*(\d+)\*\* times",
                       "times the prompt's marker is in the log"),
        "p99_ratio": (r"p99 concentrate / p99 spread at the highest load: ([\d.]+) x",
                      "exercise 2: p99 concentrate / p99 spread at the highest load"),
        "top_rate": (r"(?:At the highest \(|At )([\d.]+) req/s(?:\)| the p99 ratio)",
                     "the highest load offered"),
        "tokens_per_replica": (r"The best: \*\*([\d.]+) output tokens/s per replica\*\*",
                               "output tok/s per replica within the objective"),
        "peak_replicas": (r"computed replicas at the peak: (\d+)",
                          "exercise 3: replicas at the peak"),
        "mean_tps": (r"a mean of ([\d,.]+) tokens/s", "the plan's mean demand (output tok/s)"),
        "peak_tps": (r"(?:and a peak of |that, )([\d,.]+)(?: for| tokens/s)",
                     "the plan's peak demand (output tok/s)"),
        "peak_hours": (r"FloatSlider\(value=([\d.]+), description='hours a day at the peak'",
                       "hours a day at the peak (the control's value)"),
        "base_replicas": (r"(?:at the peak and |the day's total\), needs )(\d+)",
                          "replicas off the peak"),
        "cheapest": (r"Cheapest at your prices: \*{0,2}([^*$]+?)\*{0,2}, \$[\d,]+ a month",
                     "the cheapest way to pay"),
        "cheapest_per_m": (r"Cheapest at your prices: [^$]+\$[\d,]+ a month, \$([\d,.]+) per "
                           r"million",
                           "its cost per million output tokens (USD)"),
        "price_on_demand": (r"\*\*\$([\d.]+)/h on demand\*\*", "H100 on-demand price (gpus.json)"),
        "price_reserved": (r"\*\*\$([\d.]+)/h on a one-year commitment\*\*",
                           "H100 reserved price (gpus.json)"),
    },
    "15_sampling_structured_output": {
        "temperature": (r"Dividing every log-probability by T = ([\d.]+)",
                        "the slider's temperature"),
        "top_computed": (r"top \d+ tokens gives \*\*([\d.]+)\*\*",
                         "exercise 1: top token's share computed"),
        "top_drawn": (r"Measured: \*\*([\d.]+)\*\* in \d+ draws",
                      "exercise 1: top token's share drawn"),
        "draws": (r"Measured: \*\*[\d.]+\*\* in (\d+) draws", "draws"),
        "allowed_min": (r"the grammar allowed as few as \*\*([\d,]+)\*\*", "fewest tokens allowed"),
        "allowed_max": (r"as many as \*\*([\d,]+)\*\* \(inside a free string\)",
                        "most tokens allowed"),
        "valid_off": (r"Measured on [^:]+: \*\*(\d+%)\*\* valid",
                      "exercise 2: valid without the grammar"),
        "mask_ms": (r"The grammar alone: \*\*([\d.]+) ms\*\*",
                    "the grammar's own cost per token (ms)"),
        "added_ms": (r"Measured through the server: \*\*([+\-\d.]+) ms\*\* per token",
                     "exercise 3: ms per token added, teaching engine"),
    },
    "16_cache_aware_routing": {
        "verdict": (r"^Teaching engine: \*\*(Prefix-aware routing won|Prefix-aware routing lost"
                    r"|No clear winner)\*\*",
                    "the verdict at the largest session count (the teaching engine's fleet)"),
        "sessions": (r"\*\* at (\d+) sessions: it found", "sessions at the largest point"),
        "hit_prefix": (r"sessions: it found \*\*(\d+%)\*\* of prompt tokens",
                       "prefix-aware hit rate"),
        "hit_other": (r"in a cache against (\d+%) for", "hit rate of the best other policy"),
        "other": (r"\d+% for (\S+) \(the best of the rest\)", "the best other policy"),
        "p99_prefix": (r"p99 time to first token of ([\d.]+) s against",
                       "prefix-aware p99 TTFT (s)"),
        "p99_other": (r"p99 time to first token of [\d.]+ s against ([\d.]+) s",
                      "the other's p99 TTFT (s)"),
        "lead_pp": (r"largest lead in hit rate over the best of the rest: ([+\-]\d+) percentage",
                    "prefix-aware routing's largest lead in hit rate (percentage points)"),
        "lead_sessions": (r"over the best of the rest: [+\-]\d+ percentage points, at (\d+) "
                          r"sessions",
                          "sessions where that lead was measured"),
        "cmp_baseline": (r"^Prefix-aware routing against (\S+) at \d+ sessions:",
                         "the policy the engines' comparison is against"),
        "cmp_sessions": (r"^Prefix-aware routing against \S+ at (\d+) sessions:",
                         "the session count of the engines' comparison"),
        "vllm_hits": (r"^- \*\*vLLM\*\*: .*?\((\d+% against \d+%)\), p99 TTFT",
                      "on vLLM's replicas: prefix-aware hit rate against the baseline's"),
        "vllm_p99": (r"^- \*\*vLLM\*\*: .*p99 TTFT \*\*([\d.]+ s)\*\* against",
                     "on vLLM's replicas: prefix-aware p99 TTFT"),
        "vllm_p99_other": (r"^- \*\*vLLM\*\*: .*p99 TTFT \*\*[\d.]+ s\*\* against ([\d.]+ s)",
                           "on vLLM's replicas: the baseline's p99 TTFT"),
        "told_plain": (r"told A's prompts apart (\d+%) of the time", "probes told apart, no salts"),
        "told_salted": (r"with a salt per tenant (\d+%)\*\*",
                        "probes told apart, a salt per tenant"),
        "cached_plain": (r"found (\d+%) of it cached without salts",
                         "probe tokens cached, no salts"),
    },
    "17_disaggregated_prefill_decode": {
        "kv_per_token": (r"\*\*([\d,]+) bytes of KV per token\*\*",
                         "KV bytes per token, measured on the pool"),
        "kv_mib": (r"tokens: \d[\d,]* x [\d,]+ = \*\*([\d.]+) MiB\*\*",
                   "exercise 1: KV handed off, long prompt"),
        "best_setup": (r"\*\*Lowest p99 gap of the running streams: ([^,]+), [\d,]+ ms\*\*",
                       "set-up with the lowest p99 stream gap"),
        "p99_disagg": (r"\(disaggregated ([\d,]+) ms, colocated", "p99 gap, disaggregated (ms)"),
        "p99_chunked": (r"colocated chunked ([\d,]+) ms, whole", "p99 gap, colocated chunked (ms)"),
        "p99_whole": (r"whole prompts ([\d,]+) ms\)", "p99 gap, colocated whole prompts (ms)"),
        "busy_prefill": (r"prefill process was busy (\d+%) of the run",
                         "prefill process busy share"),
        "busy_decode": (r"the decode process (\d+%)\.\*\*", "decode process busy share"),
        "break_even": (r"= \*\*([\d.]+) Gb/s\*\*", "exercise 3: break-even link (Gb/s)"),
        "death_s": (r"heard of the death after ([\d.]+) s",
                    "seconds until the caller heard of the death"),
    },
}


class ExportError(RuntimeError):
    """A figure or fact the slides need is missing from, or ambiguous in, a run."""


# -- reading an executed notebook ----------------------------------------------------------

def _join(value) -> str:
    # .ipynb files store multi-line strings either whole or as a list of lines
    return "".join(value) if isinstance(value, list) else (value or "")


def _text(output: dict) -> str:
    if output.get("output_type") == "stream":
        return _join(output.get("text"))
    data = output.get("data", {})
    return _join(data.get("text/markdown")) or _join(data.get("text/plain"))


def read_notebook(path: Path) -> dict:
    return json.loads(Path(path).read_text())


def run_metadata(nb: dict) -> dict:
    """Machine, date, engine and mode of an executed notebook, from the notebook itself.

    The machine and engine come from the lines ``workshop.session.connect()`` prints in the
    first cells; the date from nbclient's per-cell timestamps; the mode from the metadata
    ``--execute`` writes (``None`` when the run does not say).
    """
    meta: dict = {"machine": None, "engine": None, "date": None, "started": None,
                  "wall_s": None,
                  "mode": nb.get("metadata", {}).get("workshop_run", {}).get("mode")}
    last = None
    for cell in nb.get("cells", []):
        if cell.get("cell_type") != "code":
            continue
        timing = cell.get("metadata", {}).get("execution", {})
        stamp = timing.get("iopub.execute_input")
        if stamp and meta["started"] is None:
            meta["started"] = stamp
            meta["date"] = stamp[:10]
        last = timing.get("shell.execute_reply") or last
        for out in cell.get("outputs", []):
            text = _text(out)
            if meta["machine"] is None and (m := re.search(r"^hardware:\s*(.+)$", text, re.M)):
                meta["machine"] = m.group(1).strip()
            if meta["engine"] is None and (m := re.search(r"^engine:\s*(\S+ \S+)", text, re.M)):
                meta["engine"] = m.group(1).strip()
    if meta["started"] and last:
        # first cell's start to last cell's reply: the notebook's own run time, kernel
        # start-up excluded
        t0, t1 = (dt.datetime.fromisoformat(s.replace("Z", "+00:00"))
                  for s in (meta["started"], last))
        meta["wall_s"] = round((t1 - t0).total_seconds(), 1)
    recorded = nb.get("metadata", {}).get("workshop_run", {})
    for key in ("machine", "date", "started"):
        meta[key] = meta[key] or recorded.get(key)
    return meta


def section_of(cells: list[dict], index: int) -> str | None:
    """The last markdown heading above cell ``index`` (the notebook section it belongs to)."""
    for cell in reversed(cells[:index]):
        if cell.get("cell_type") != "markdown":
            continue
        src = _join(cell.get("source"))
        heads = re.findall(r"^#{1,4}\s+(.+)$", src, re.M)
        if heads:
            return heads[-1].strip()
    return None


def find_figure(nb: dict, spec: FigureSpec) -> tuple[int, bytes, str | None]:
    """(cell index, PNG bytes, recorded title) of the one cell that draws ``spec``."""
    cells = nb.get("cells", [])
    pattern = re.compile(spec.source, re.M)
    hits = [i for i, c in enumerate(cells)
            if c.get("cell_type") == "code" and pattern.search(_join(c.get("source")))]
    if len(hits) != 1:
        raise ExportError(f"figure {spec.name!r}: {len(hits)} code cells match /{spec.source}/ "
                          f"(cells {hits}); exactly one must")
    i = hits[0]
    pngs = [o for o in cells[i].get("outputs", []) if "image/png" in o.get("data", {})]
    if len(pngs) != 1:
        errors = [o.get("ename") for o in cells[i].get("outputs", [])
                  if o.get("output_type") == "error"]
        raise ExportError(f"figure {spec.name!r}: cell {i} has {len(pngs)} PNG outputs, not 1"
                          + (f" (it raised {errors})" if errors else ""))
    out = pngs[0]
    info = out.get("data", {}).get(FIGURE_MIME)
    title = None
    if info:
        title = " | ".join(t for t in info.get("titles", []) if t) or None
        if title is None or not re.search(spec.title, title):
            raise ExportError(f"figure {spec.name!r}: cell {i} drew a plot titled {title!r}, "
                              f"which does not match /{spec.title}/")
    png = base64.b64decode(_join(out["data"]["image/png"]))
    if not png.startswith(b"\x89PNG"):
        raise ExportError(f"figure {spec.name!r}: cell {i}'s image/png output is not a PNG")
    return i, png, title


def find_values(nb: dict, specs: dict[str, tuple[str, ...]]) -> dict[str, str]:
    texts = [_text(o) for c in nb.get("cells", []) if c.get("cell_type") == "code"
             for o in c.get("outputs", [])]
    values = {}
    for key, (regex, _about, *in_run) in specs.items():
        for text in texts:
            if m := re.search(regex, text, re.M):
                values[key] = m.group(1)
                break
        else:
            if in_run and not any(re.search(in_run[0], text, re.M) for text in texts):
                values[key] = NOT_IN_RUN
                continue
            raise ExportError(f"value {key!r}: no output matches /{regex}/")
    return values


# -- a self-contained HTML page of an executed notebook ------------------------------------

def notebook_html(nb: dict, name: str, meta: dict) -> str:
    """The executed notebook as one page: prose, code, text and image outputs, run label."""
    from markdown_it import MarkdownIt

    md = MarkdownIt("commonmark").enable("table")
    label = (f"Reference run of <code>{html.escape(name)}</code>: "
             f"{html.escape(str(meta.get('machine')))}; started "
             f"{html.escape(str(meta.get('started')))}; engine "
             f"{html.escape(str(meta.get('engine')))}; mode {html.escape(str(meta.get('mode')))}")
    parts = ["<!doctype html><html><head><meta charset='utf-8'>",
             f"<title>{html.escape(name)}: reference run</title><style>",
             "body{font-family:sans-serif;max-width:60rem;margin:auto;padding:1rem;"
             "line-height:1.4}",
             ".run{background:#fff3cd;padding:.5rem 1rem;border-radius:4px}",
             "pre{background:#f6f8fa;padding:.5rem;overflow-x:auto;font-size:.85rem}",
             "pre.out{background:#fff;border-left:3px solid #ccc}",
             ".err{border-left-color:#c00} img{max-width:100%}",
             ".cell{margin:1rem 0} .idx{color:#888;font-size:.75rem}</style></head><body>",
             f"<p class='run'>{label}</p>"]
    for i, cell in enumerate(nb.get("cells", [])):
        src = _join(cell.get("source"))
        parts.append(f"<div class='cell' id='cell-{i}'><div class='idx'>cell {i}</div>")
        if cell.get("cell_type") == "markdown":
            parts.append(md.render(src))
        else:
            parts.append(f"<pre>{html.escape(src)}</pre>")
            for out in cell.get("outputs", []):
                parts.append(_output_html(out, md))
        parts.append("</div>")
    parts.append("</body></html>")
    return "\n".join(parts)


def _output_html(out: dict, md) -> str:
    kind = out.get("output_type")
    if kind == "stream":
        return f"<pre class='out'>{html.escape(_join(out.get('text')))}</pre>"
    if kind == "error":
        tb = re.sub(r"\x1b\[[0-9;]*m", "", "\n".join(out.get("traceback", [])))
        return f"<pre class='out err'>{html.escape(tb)}</pre>"
    data = out.get("data", {})
    if "image/png" in data:
        b64 = _join(data["image/png"]).replace("\n", "")
        return f"<img alt='figure' src='data:image/png;base64,{b64}'>"
    if "text/html" in data:
        return _join(data["text/html"])
    if "text/markdown" in data:
        return md.render(_join(data["text/markdown"]))
    if "text/plain" in data:
        return f"<pre class='out'>{html.escape(_join(data['text/plain']))}</pre>"
    return ""


# -- executing -----------------------------------------------------------------------------

def figure_titles(fig) -> dict:
    """What the kernel records beside a Figure's PNG: each axes' titles at every position
    (left, centre, right), then the suptitle."""
    return {"titles": [ax.get_title(loc) for ax in fig.axes
                       for loc in ("left", "center", "right")] + [fig.get_suptitle()]}


# Loaded by the kernel before any cell: beside each Figure's PNG, record its titles with
# figure_titles (its source is copied in: the kernel does not import this script).
_STARTUP = f'''
try:
    from IPython import get_ipython
    from matplotlib.figure import Figure

{textwrap.indent(inspect.getsource(figure_titles), "    ")}
    _workshop_titles = figure_titles
    _f = get_ipython().display_formatter
    from IPython.core.formatters import JSONFormatter

    class _WorkshopFigureFormatter(JSONFormatter):
        format_type = "{FIGURE_MIME}"

    _f.formatters["{FIGURE_MIME}"] = _WorkshopFigureFormatter(parent=_f)
    _f.formatters["{FIGURE_MIME}"].for_type(Figure, _workshop_titles)
except Exception as _e:  # a missing title record must not break the run
    print("slides: cannot record figure titles:", _e)
'''


def execute(name: str, out_dir: Path, quick: bool, timeout_s: int) -> Path:
    """Run notebooks/NAME.ipynb in a fresh kernel; write NAME.executed.ipynb to out_dir."""
    import nbformat
    from nbclient import NotebookClient

    sys.path.insert(0, str(ROOT))
    from workshop.hardware import hardware

    nb = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)
    with tempfile.TemporaryDirectory() as ipydir:
        startup = Path(ipydir) / "profile_default" / "startup"
        startup.mkdir(parents=True)
        (startup / "00-workshop-figure-titles.py").write_text(_STARTUP)
        env = {"IPYTHONDIR": ipydir, "WORKSHOP_QUICK": "1" if quick else "0",
               "MPLBACKEND": "Agg", "HF_HUB_OFFLINE": "1",
               "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH"))
                                             if p)}
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)   # the kernel inherits this process's environment
        started = dt.datetime.now(dt.timezone.utc)
        t0 = time.monotonic()
        try:
            NotebookClient(nb, timeout=timeout_s, kernel_name="python3",
                           resources={"metadata": {"path": str(NOTEBOOKS)}}).execute()
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
            nb.metadata["workshop_run"] = {
                "mode": "quick" if quick else "full", "machine": hardware(),
                "started": started.isoformat(timespec="seconds"),
                "date": started.date().isoformat()}
            out_dir.mkdir(parents=True, exist_ok=True)
            path = out_dir / f"{name}.executed.ipynb"
            nbformat.write(nb, path)
    print(f"executed {name} in {time.monotonic() - t0:.0f} s -> {path}")
    return path


# -- exporting -----------------------------------------------------------------------------

def export(runs: dict[str, Path], mode: str | None, figures_dir: Path = FIGURES_DIR,
           reference_dir: Path = REFERENCE_DIR, manifest_path: Path | None = None,
           figures: dict[str, list[FigureSpec]] = FIGURES,
           values: dict[str, dict[str, tuple[str, ...]]] = VALUES) -> dict:
    """Write figures, reference pages and the manifest for the executed notebooks in ``runs``.

    Notebooks not in ``runs`` keep what the existing manifest says about them, so one
    notebook can be re-run alone. Raises ExportError naming every missing figure or value.
    """
    manifest_path = manifest_path or figures_dir / "manifest.json"
    manifest = (json.loads(manifest_path.read_text()) if manifest_path.exists()
                else {"runs": {}, "figures": {}, "values": {}})
    problems, ready = [], []
    for name, path in sorted(runs.items()):
        nb = read_notebook(path)
        meta = run_metadata(nb)
        meta["mode"] = meta["mode"] or mode
        missing = [k for k in ("machine", "date") if not meta.get(k)]
        if missing:
            problems.append(f"{name}: the run does not say its {' or '.join(missing)}")
            continue
        errors = [(i, o.get("ename")) for i, c in enumerate(nb.get("cells", []))
                  for o in c.get("outputs", []) if o.get("output_type") == "error"]
        if errors:
            problems.append(f"{name}: the run has errors in cells {errors}")
            continue
        found = {}
        for spec in figures.get(name, []):
            try:
                found[spec] = find_figure(nb, spec)
            except ExportError as e:
                problems.append(f"{name}: {e}")
        try:
            vals = find_values(nb, values.get(name, {}))
        except ExportError as e:
            problems.append(f"{name}: {e}")
        else:
            ready.append((name, nb, meta, found, vals))
    if problems:
        # nothing is written: the committed figures stay consistent with their manifest
        raise ExportError("the slides' figures cannot be exported:\n  " + "\n  ".join(problems))
    for name, nb, meta, found, vals in ready:
        manifest["runs"][name] = {**meta, "reference_page": f"reference_run/{name}.html"}
        manifest["values"][name] = vals
        for key in [k for k in manifest["figures"] if k.startswith(name + "/")]:
            del manifest["figures"][key]
        out = figures_dir / name
        if out.exists():
            for old in out.glob("*.png"):
                old.unlink()
        out.mkdir(parents=True, exist_ok=True)
        for spec, (cell, png, title) in found.items():
            (out / f"{spec.name}.png").write_bytes(png)
            manifest["figures"][f"{name}/{spec.name}"] = {
                "file": f"figures/{name}/{spec.name}.png", "notebook": name, "cell": cell,
                "section": section_of(nb["cells"], cell), "selector": spec.source,
                "title": title, "title_pattern": spec.title, "about": spec.about,
                "sha256": hashlib.sha256(png).hexdigest()}
        reference_dir.mkdir(parents=True, exist_ok=True)
        (reference_dir / f"{name}.html").write_text(notebook_html(nb, name, meta))
        print(f"{name}: {len(found)} figures, run on {meta['machine']} ({meta['date']}, "
              f"{meta['mode']} mode)")
    manifest_path.parent.mkdir(parents=True, exist_ok=True)
    manifest_path.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    return manifest


def existing_notebooks() -> list[str]:
    return sorted(p.stem for p in (NOTEBOOKS / "src").glob("[0-9]*.py"))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--execute", action="store_true",
                     help="execute the notebooks now (against WORKSHOP_BASE_URL etc.)")
    src.add_argument("--from", dest="from_dir", type=Path,
                     help="a folder of NN_slug.executed.ipynb files executed elsewhere")
    p.add_argument("--only", nargs="+", help="these notebooks only (default: every one)")
    p.add_argument("--full", action="store_true", help="with --execute: full mode, not quick")
    p.add_argument("--mode", choices=["quick", "full"],
                   help="with --from: the mode those runs used, when they do not record it")
    p.add_argument("--runs-dir", type=Path, default=Path(tempfile.gettempdir()) / "slides-runs",
                   help="with --execute: where the executed notebooks go")
    p.add_argument("--timeout", type=int, default=900, help="per notebook, seconds")
    a = p.parse_args(argv)
    names = a.only or existing_notebooks()
    unknown = [n for n in names if n not in existing_notebooks()]
    if unknown:
        p.error(f"no such notebook: {unknown}")
    runs = {}
    if a.execute:
        for name in names:
            runs[name] = execute(name, a.runs_dir, quick=not a.full, timeout_s=a.timeout)
    else:
        for name in names:
            path = a.from_dir / f"{name}.executed.ipynb"
            if path.exists():
                runs[name] = path
            else:
                print(f"{name}: no executed copy in {a.from_dir}, keeping the committed figures")
    try:
        export(runs, a.mode)
    except ExportError as e:
        print(e, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
