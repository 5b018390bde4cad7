"""Is an engine that answers "L'Étoile, la Marseillaise, ..." to "What is the capital of France?"
broken? Print what Hugging Face float32 scores at each step of its own greedy answer on the
bundled model (the token it picks, the runner-up, the gap in logits), and, given a server,
what that server answers and how the correctness gate judges it.

    python docs/repro/near_tie.py
    python docs/repro/near_tie.py --base-url http://127.0.0.1:8000   # any OpenAI-compatible server
    python docs/repro/near_tie.py --question "What is the capital of Italy?" --repeats 3

Sending the question several times (``--repeats``) lets a prefix-caching server answer the
repeats from its cache, which changes the order of its sums and may flip a near tie.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--question", default="What is the capital of France?")
    ap.add_argument("--base-url", help="also ask this server (root URL, without /v1)")
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY"))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=12)
    args = ap.parse_args()

    import httpx

    from reference_server.models import resolve_model
    from workshop.bench.verify import Probe, compare, reference_for

    ref = reference_for(resolve_model(args.model, prepare=False).path)
    messages = (("user", args.question),)
    ids, logits = ref.generate(messages, args.tokens)
    print(f"Hugging Face float32 answers {ref.text(ids)!r}")
    for i, step in enumerate(logits):
        top = step.topk(2)
        a, b = (ref.tok.decode([t]) for t in top.indices.tolist())
        print(f"  token {i:2d}: {a!r:14} over {b!r:14} by "
              f"{float(top.values[0] - top.values[1]):6.3f} logits")
    if not args.base_url:
        return
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    for r in range(args.repeats):
        probe = Probe("short", messages, r)
        answer = httpx.post(args.base_url.rstrip("/") + "/v1/chat/completions", headers=headers,
                            timeout=300,
                            json=probe.body(args.model, args.tokens)).json()
        check = compare(ref, probe, answer["choices"][0]["message"]["content"] or "", args.tokens)
        cached = ((answer.get("usage") or {}).get("prompt_tokens_details")
                  or {}).get("cached_tokens")
        print(f"server, send {r + 1} ({cached} prompt tokens cached): {check.verdict}: "
              f"{check.got!r}"
              + (f" (departs at token {check.departed_at}, {check.gap:.3f} logits below the "
                 "reference's choice)"
                 if check.departed_at is not None else ""))


if __name__ == "__main__":
    main()
