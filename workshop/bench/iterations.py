"""Where a server's time went, step by step, read from its log.

vLLM logs one line per engine step with ``--enable-logging-iteration-details`` (at INFO:
``VLLM_LOGGING_LEVEL=INFO`` under the reference server), and the teaching engine logs the
same line with the knob of the same name (``reference-server --engine mini --log-level info
-- --enable-logging-iteration-details``)::

    Iteration(12): 1 context requests, 122 context tokens, 7 generation requests,
    7 generation tokens, iteration elapsed time: 460.12 ms

A context request is one still in its prompt (a prefill chunk), a generation request one
past it. ``parse`` reads those lines out of any log; ``by_kind`` splits the steps into
decode-only ones and mixed ones (at least one prefill chunk): on a multi-turn workload the
two cost differently, and which of them an engine is slow at says where to look.
The two engines time slightly different spans (vLLM the forward pass and sampling, the
teaching engine its whole step), so compare each kind's share and median, not sums to the
millisecond.
"""

from __future__ import annotations

import re
import statistics
from collections import Counter
from dataclasses import dataclass

LINE = re.compile(r"Iteration\((\d+)\): (\d+) context requests, (\d+) context tokens, "
                  r"(\d+) generation requests, (\d+) generation tokens, "
                  r"iteration elapsed time: ([\d.]+) ms")


@dataclass(frozen=True)
class Iteration:
    index: int
    context_requests: int
    context_tokens: int
    generation_requests: int
    generation_tokens: int
    ms: float


def parse(text: str) -> list[Iteration]:
    """Every iteration line in ``text``, in order; other lines are skipped."""
    return [Iteration(*(int(g) for g in m.groups()[:5]), float(m.group(6)))
            for m in LINE.finditer(text)]


def by_kind(steps: list[Iteration]) -> dict[str, dict]:
    """Decode-only and mixed steps: how many, their seconds in all and their median ms; for
    decode-only steps also the most common batch and its median, for mixed steps the median
    prefill tokens. A kind with no step is left out."""
    out = {}
    decode = [s for s in steps if s.context_requests == 0]
    mixed = [s for s in steps if s.context_requests > 0]
    for kind, group in (("decode-only", decode), ("mixed", mixed)):
        if not group:
            continue
        row = {"steps": len(group), "seconds": sum(s.ms for s in group) / 1e3,
               "median_ms": statistics.median(s.ms for s in group)}
        if kind == "decode-only":
            batch = Counter(s.generation_requests for s in group).most_common(1)[0][0]
            row["common_batch"] = batch
            row["common_batch_median_ms"] = statistics.median(
                s.ms for s in group if s.generation_requests == batch)
        else:
            row["median_context_tokens"] = statistics.median(s.context_tokens for s in group)
        out[kind] = row
    return out


def table(summaries: dict[str, dict[str, dict]]) -> str:
    """One line per server (``summaries``: label -> ``by_kind``'s result)."""
    width = max([len(label) for label in summaries] + [6])
    lines = [f"{'server':<{width}}  {'decode-only steps':>17} {'s':>6} {'batch':>5} "
             f"{'ms':>6}  {'mixed steps':>11} {'s':>6} {'ms':>7} {'prefill tok':>11}"]
    for label, kinds in summaries.items():
        d, m = kinds.get("decode-only"), kinds.get("mixed")
        left = (f"{d['steps']:>17} {d['seconds']:6.1f} {d['common_batch']:>5} "
                f"{d['common_batch_median_ms']:6.1f}" if d else f"{'-':>17} {'':6} {'':5} {'':6}")
        right = (f"{m['steps']:>11} {m['seconds']:6.1f} {m['median_ms']:7.1f} "
                 f"{m['median_context_tokens']:>11.0f}" if m else f"{'-':>11}")
        lines.append(f"{label:<{width}}  {left}  {right}")
    return "\n".join(lines)
