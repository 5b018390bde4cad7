"""Do two configurations of the teaching engine pick the same greedy tokens on real prompts?

The exactness tests (``tests/unit/test_mini_exactness.py``) hold the default float32 engine
to Hugging Face's tokens on 19 fixed prompts. A switch that changes the arithmetic (float32
weights packed for oneDNN, another dtype, another attention kernel) can keep those and still
flip a near tie elsewhere. This runs ShareGPT first turns (chat template, greedy,
``ignore_eos``) through both configurations and counts the prompts whose tokens depart; at
each departure it asks Hugging Face's float32 model (the engine's reference) for its top two
logits at that position, so a flip at a near tie reads differently from a real error.

    python benchmarks/greedy_agreement.py -- --prepack-fp32        # default against packed
    python benchmarks/greedy_agreement.py --prompts 100 --new-tokens 256 -- --prepack-fp32
    python benchmarks/greedy_agreement.py --a "--compute-dtype bf16" -- --compute-dtype bf16

The flags after ``--`` configure the second engine (``B``); ``--a`` the first (default: the
default engine). Both run offline in this process, one after the other, on the prompts of
``workshop.bench.workloads.sharegpt_pool`` (the local file, nothing downloaded).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time

# run from a checkout
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def first_departure(a: list[int], b: list[int]) -> int | None:
    """Index of the first token where ``a`` and ``b`` differ (the shorter one's length if one
    is a prefix of the other), or None if they are equal."""
    if a == b:
        return None
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def main() -> None:
    argv = sys.argv[1:]
    b_flags = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--a", default="", help="engine flags of the first configuration (quoted)")
    ap.add_argument("--prompts", type=int, default=200)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--max-prompt-tokens", type=int, default=512)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--out", default=None, help="also write the counts and departures as JSON")
    args = ap.parse_args(argv)

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from mini_engine import LLMEngine, SamplingParams
    from mini_engine.config import EngineConfig
    from reference_server.models import resolve_model
    from workshop.bench.workloads import sharegpt_pool

    if args.threads:
        torch.set_num_threads(args.threads)
    path = resolve_model("smollm2-135m", prepare=False).path
    tok = AutoTokenizer.from_pretrained(path)
    prompts = []
    for conv in sharegpt_pool():
        ids = tok.apply_chat_template([{"role": "user", "content": conv[0][0]}],
                                      add_generation_prompt=True, return_dict=True)["input_ids"]
        if 8 <= len(ids) <= args.max_prompt_tokens:
            prompts.append(list(ids))
        if len(prompts) == args.prompts:
            break
    params = SamplingParams(max_tokens=args.new_tokens, temperature=0.0, ignore_eos=True)
    outs = {}
    for name, flags in (("A", shlex.split(args.a)), ("B", b_flags)):
        config = EngineConfig.from_cli(flags)
        engine = LLMEngine(path, config)
        start = time.perf_counter()
        outs[name] = engine.generate(prompts, params)
        dtype = str(config.torch_dtype).removeprefix("torch.")
        layer = type(getattr(engine.runner.model.layers[0], "gate_up", None)).__name__
        print(f"{name} ({' '.join(flags) or 'defaults'}): {len(prompts)} prompts in "
              f"{time.perf_counter() - start:.0f} s, {dtype}, {layer}", flush=True)
        del engine

    departed = []
    hf = None
    for prompt, a, b in zip(prompts, outs["A"], outs["B"]):
        k = first_departure(a, b)
        if k is None:
            continue
        if hf is None:
            hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        with torch.no_grad():
            logits = hf(torch.tensor([prompt + a[:k]])).logits[0, -1]
        top = torch.topk(logits, 2)
        departed.append(dict(prompt_tokens=len(prompt), at=k, a=a[k] if k < len(a) else None,
                             b=b[k] if k < len(b) else None, hf_top2=top.indices.tolist(),
                             hf_gap=(top.values[0] - top.values[1]).item()))
        print(f"prompt of {len(prompt)} tokens departs at new token {k}: A {departed[-1]['a']}, "
              f"B {departed[-1]['b']}; HF's top two {top.indices.tolist()}, "
              f"{departed[-1]['hf_gap']:.2e} apart", flush=True)
    print(f"{len(prompts)} prompts x {args.new_tokens} new tokens: {len(departed)} departed "
          f"({len(prompts) - len(departed)} identical)")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(dict(argv=sys.argv[1:], prompts=len(prompts), new_tokens=args.new_tokens,
                           departed=departed, time=time.ctime()), f, indent=2)


if __name__ == "__main__":
    main()
