"""Speculative decoding, measured: the expected speed-up, acceptance statistics, two workloads
sent to live servers, and the plots of notebook 09.

The draft/verify loop itself is written in the notebook, where reading it is the lesson; the
engine's version is ``mini_engine/spec_decode.py`` (``accept_greedy``, ``NgramProposer``,
``SelfDraftProposer``) driven by ``mini_engine/engine.py``. This module holds what the loop is
measured with:

* the **expected speed-up** of Leviathan, Kalman and Matias 2023 ("Fast Inference from
  Transformers via Speculative Decoding", arXiv:2211.17192, section 3): with a per-token
  acceptance probability ``alpha`` and ``k`` draft tokens per step, a step emits
  ``(1 - alpha**(k+1)) / (1 - alpha)`` tokens on average, and costs
  ``k * c + 1`` target forwards, where ``c`` is the cost of one draft forward relative to one
  target forward: a speed-up of ``(1 - alpha**(k+1)) / ((1 - alpha)(k c + 1))``.
  The paper assumes the verify forward of ``k + 1`` tokens costs as much as a one-token
  decode, which holds while decoding is memory-bound; ``verify_cost`` lets a notebook put in
  what it measured instead;
* **acceptance** counted two ways from ``(drafted, accepted)`` pairs, one per verify step:
  vLLM's acceptance rate (accepted / drafted tokens) and the per-token probability ``alpha``
  that the formula needs (a draft token is only compared when every earlier one was accepted);
* **costs** timed interleaved (``timing.interleaved_times``: every candidate once per round, so a
  burst of other work on a shared machine slows all of them, not one), the share of a forward's
  work that a self-draft does (``draft_share``, from the architecture), and the physical checks
  on both (``cost_violations``, ``sweep_violations``);
* **workloads** (our own text and prompts) and a runner that streams them through a server
  and reads its speculative-decoding counters from ``/metrics`` before and after.
"""

from __future__ import annotations

import math
import re
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from reference_server import prometheus as P
from workshop import sanity

LEVIATHAN_2023 = "https://arxiv.org/abs/2211.17192"

Step = tuple[int, int]      # (draft tokens proposed, draft tokens accepted) in one verify step


# -- the formula -------------------------------------------------------------------------------

def expected_tokens_per_step(alpha: float, k: int) -> float:
    """Tokens one verify step emits on average: the accepted drafts plus the target's own
    token, ``1 + alpha + ... + alpha**k = (1 - alpha**(k+1)) / (1 - alpha)``."""
    if not 0 <= alpha <= 1:
        raise ValueError(f"alpha={alpha}: an acceptance probability is in [0, 1]")
    if k < 0:
        raise ValueError(f"k={k}: the number of draft tokens is >= 0")
    if alpha == 1:
        return float(k + 1)
    return (1 - alpha ** (k + 1)) / (1 - alpha)


def expected_speedup(alpha: float, k: int, c: float, verify_cost: float = 1.0) -> float:
    """Expected speed-up over plain decoding: tokens per step / cost of a step in target
    forwards (``k`` drafts at ``c`` each, one verify at ``verify_cost``; 1 in the paper)."""
    if c < 0 or verify_cost <= 0:
        raise ValueError("costs must be positive")
    return expected_tokens_per_step(alpha, k) / (k * c + verify_cost)


# -- acceptance, counted from the steps ----------------------------------------------------------

def acceptance_rate(steps: Iterable[Step]) -> float:
    """Accepted / proposed draft tokens: what vLLM's counters give
    (``spec_decode_num_accepted_tokens / spec_decode_num_draft_tokens``)."""
    steps = list(steps)
    drafted = sum(d for d, _ in steps)
    return sum(a for _, a in steps) / drafted if drafted else 0.0


def alpha_from_steps(steps: Iterable[Step]) -> float:
    """Per-token acceptance probability: accepted / compared. Verification stops at the first
    rejected draft, so a step that accepted ``a`` of ``d`` drafts compared ``a + 1`` tokens
    (``a`` if all were accepted). The estimate of the formula's ``alpha``."""
    accepted = compared = 0
    for d, a in steps:
        if d == 0:
            continue
        accepted += a
        compared += a + (a < d)
    return accepted / compared if compared else 0.0


def tokens_per_step(steps: Iterable[Step]) -> float:
    """Tokens emitted per target forward: each step emits its accepted drafts plus one."""
    steps = list(steps)
    return sum(a + 1 for _, a in steps) / len(steps) if steps else 0.0


def step_counts(steps: Iterable[Step]) -> dict:
    """Steps, steps that drafted anything, draft tokens, accepted tokens and their rate."""
    steps = list(steps)
    return {"steps": len(steps), "drafting steps": sum(1 for d, _ in steps if d),
            "draft tokens": sum(d for d, _ in steps), "accepted": sum(a for _, a in steps),
            "acceptance rate": acceptance_rate(steps)}


def demo_rows(runs: dict[str, tuple[list[int], list[Step]]]) -> list[dict]:
    """One table row per ``name: (ids, steps)`` run; the first run is the baseline whose ids
    the others are compared with."""
    base = next(iter(runs.values()))[0]
    counts = {name: step_counts(steps) for name, (_, steps) in runs.items()}
    return [{"run": name, "tokens": len(ids), "target forwards": len(steps),
             "tokens per forward": len(ids) / len(steps) if steps else 0.0,
             "draft tokens": counts[name]["draft tokens"], "accepted": counts[name]["accepted"],
             "same token ids as plain": ids == base} for name, (ids, steps) in runs.items()]


# -- what a draft and a verify forward cost ------------------------------------------------------

def forward_flops(cfg: Any, layers: int, context: int, tokens: int = 1) -> float:
    """FLOPs of a forward of ``tokens`` new tokens through the first ``layers`` layers, each
    attending to ``context`` cached tokens, then the output layer for every one of them (as the
    notebook's loop asks logits of each): 2 per weight of the q/k/v, o, gate/up and down
    projections, 4 x heads x head_dim per attended token per layer (scores and the weighted sum
    of V), 2 x hidden x vocabulary for the logits. ``cfg``: the engine's ``ModelConfig``."""
    h, q = cfg.hidden_size, cfg.num_heads * cfg.head_dim
    kv = cfg.num_kv_heads * cfg.head_dim
    weights = 2 * (h * (q + 2 * kv) + q * h + 3 * h * cfg.intermediate_size)
    attention = 4 * cfg.num_heads * cfg.head_dim * context
    return tokens * (layers * (weights + attention) + 2 * h * cfg.vocab_size)


def draft_share(cfg: Any, draft_layers: int, context: int) -> float:
    """The share of a full one-token forward's FLOPs that a self-draft forward of the first
    ``draft_layers`` layers does: its layers plus the output layer it runs too."""
    return forward_flops(cfg, draft_layers, context) / forward_flops(cfg, cfg.num_layers, context)


def cost_rows(decode_s: float, parts: dict[str, tuple[float, float]],
              verify_s: dict[int, float]) -> list[dict]:
    """The cost table: a one-token decode forward, each ``what: (seconds, FLOPs share)`` part,
    and a verify forward of k + 1 tokens per ``verify_s[k]``, each in ms and relative to the
    decode forward."""
    rows = [("one decode forward (all layers, 1 token)", decode_s, 1.0), *(
        (what, s, share) for what, (s, share) in parts.items())]
    rows += [(f"one verify forward of {k + 1} tokens", s, float(k + 1))
             for k, s in verify_s.items()]
    return [{"what": what, "ms": s * 1e3, "time relative to a decode forward": s / decode_s,
             "FLOPs relative to a decode forward": share} for what, s, share in rows]


def cost_violations(label: str, c: float, layer_share: float,
                    verify_costs: dict[int, float]) -> list[sanity.Violation]:
    """What the measured costs (relative to one one-token forward) may not do. A self-draft of
    k of L layers does all of a full forward's work except L - k of its identical layers, so
    its cost lies between the layers' share k / L (were everything but the layers free) and 1
    (were the layers free): beyond the error on either side it was mis-measured. (Its share
    of the FLOPs, ``draft_share``, is no bound: the output layer's one large matmul runs nearer
    the machine's roof than the layers' small ones.) A verify forward of k + 1 tokens costs at
    most k + 1 one-token forwards (it does that work or less: the weights are read once) and at
    least one (it does all of that work and more). Between two verify sizes there is no order:
    the matmul kernels block by shape, so 3 tokens may take longer than 5
    (docs/measured_here.md)."""
    out = sanity.within(label, c, 1.0, "of the whole", "a part costs more than the whole",
                        ("busy", "few", "count"))
    out += sanity.within(f"the share of {label}'s layers, {layer_share:.3g}, against its "
                         f"measured cost {c:.3g}", layer_share, c, "of the whole",
                         "a part costs less than its share", ("busy", "few"))
    for k, cost in sorted(verify_costs.items()):
        out += sanity.within(f"a verify forward of {k + 1} tokens", cost, k + 1,
                             "one-token forwards", "a part costs more than its share",
                             ("busy", "few"))
        out += sanity.within(f"a one-token forward against a verify forward of {k + 1} tokens",
                             1.0, cost, "of the verify forward", "more work in less time",
                             ("busy", "few"))
    return out


def sweep_violations(rows: Sequence[dict]) -> list[sanity.Violation]:
    """A speculative run cannot beat plain decoding by more than its tokens per target forward:
    plain decoding does one forward per token, the run one per step, and a verify forward
    costs at least a one-token forward (both include the same prefill)."""
    out = []
    for r in rows:
        if r["k"] and r["target forwards"]:
            out += sanity.within(f"the measured speed-up at k = {r['k']}", r["measured speed-up"],
                                 r["tokens"] / r["target forwards"], "x",
                                 "faster than its forward passes allow", ("busy", "few"))
    return out


# -- a sweep over the draft length ---------------------------------------------------------------

Decode = Callable[[int], tuple[list[int], list[Step]]]


def draft_length_sweep(decode: Decode, ks: Sequence[int], c: float,
                       verify_costs: dict[int, float] | None = None,
                       progress: Callable[[Sequence[int]], Iterable[int]] = iter,
                       rounds: int = 1) -> list[dict]:
    """Run ``decode(k)`` for k = 0 (plain decoding, the baseline) and every k in ``ks``, timing
    each; one row per k with acceptance, tokens per step, the measured speed-up over k = 0 and
    the formula's (with ``c``, and with the measured ``verify_costs[k]`` when given).
    ``decode(k)`` returns the generated ids and one ``(drafted, accepted)`` pair per step.
    With ``rounds`` > 1 every k runs once per round, in turn, and keeps its fastest run: a
    burst of other work on the machine then cannot land on one k alone."""
    runs: dict[int, tuple] = {}
    order = [0, *[k for k in ks if k != 0]]
    for k in progress(order * rounds):
        start = time.perf_counter()
        ids, steps = decode(k)
        seconds = time.perf_counter() - start
        if k not in runs or seconds < runs[k][2]:
            runs[k] = (ids, steps, seconds)
    base_ids, _, base_s = runs[0]
    rows = []
    for k, (ids, steps, seconds) in runs.items():
        alpha = alpha_from_steps(steps)
        row = {"k": k, "tokens": len(ids), "target forwards": len(steps),
               "seconds": seconds, "same ids as k=0": ids == base_ids,
               "acceptance rate": acceptance_rate(steps) if k else None,
               "alpha": alpha if k else None,
               "tokens per step": tokens_per_step(steps),
               "measured speed-up": base_s / seconds,
               "formula speed-up": expected_speedup(alpha, k, c) if k else 1.0}
        if verify_costs is not None:
            row["formula with measured verify cost"] = (
                expected_speedup(alpha, k, c, verify_costs[k]) if k else 1.0)
        rows.append(row)
    return rows


def sweep_summary(rows: Sequence[dict], error: float) -> dict:
    """What the sweep's closing sentence needs, from ``draft_length_sweep`` rows (with the
    measured verify cost): the acceptance range and the ks of the speculative runs, the best
    run, the mean ratio of each formula to the measurement, whether acceptance fell from the
    first k to the last and all ids matched k = 0, and ``gap``: "matches" (the formula with
    the measured verify cost within ``error`` of the measurement), "explained" (it closes over
    half of the paper formula's gap) or "unexplained"."""
    spec = [r for r in rows if r["k"]]
    best = max(spec, key=lambda r: r["measured speed-up"])
    over = mean(r["formula speed-up"] / r["measured speed-up"] for r in spec)
    over_v = mean(r["formula with measured verify cost"] / r["measured speed-up"] for r in spec)
    gap = ("matches" if abs(over_v - 1) <= error else
           "explained" if abs(over_v - 1) < 0.5 * abs(over - 1) else "unexplained")
    return {"ks": ", ".join(str(r["k"]) for r in spec),
            "acceptance": (min(r["acceptance rate"] for r in spec),
                           max(r["acceptance rate"] for r in spec)),
            "best k": best["k"], "best speed-up": best["measured speed-up"],
            "formula / measured": over, "with verify cost / measured": over_v, "gap": gap,
            "acceptance fell": spec[0]["acceptance rate"] > spec[-1]["acceptance rate"],
            "same ids": all(r["same ids as k=0"] for r in rows)}


# -- workloads ----------------------------------------------------------------------------------

# Our own paragraph: a task whose answer repeats most of the prompt (edit, fix, quote).
SOURCE_TEXT = (
    "Speculative decoding lets a cheap draft guess the next few tokens, and the large model "
    "checks all of the guesses in a single forward pass. When the guesses are right, several "
    "tokens come out of one step; when they are wrong, nothing is lost but some arithmetic.")

WORKLOADS: dict[str, list[str]] = {
    "repetitive (edit a given text)": [
        "Fix the grammar of this text and return it in full:\n\n" + SOURCE_TEXT,
        "Repeat the following text exactly, then say nothing more:\n\n" + SOURCE_TEXT,
    ],
    "open chat": [
        "Write a short story about a robot who learns to paint.",
        "What should I pack for a week of hiking in the mountains?",
    ],
}


def spec_counters(session: Any) -> dict[str, float]:
    """The server's speculative-decoding counters (0 where it exports none)."""
    m = session.metrics()
    return {"drafts": m.get(P.SPEC_DECODE_DRAFTS, 0.0),
            "draft tokens": m.get(P.SPEC_DECODE_DRAFT_TOKENS, 0.0),
            "accepted": m.get(P.SPEC_DECODE_ACCEPTED_TOKENS, 0.0)}


def stream_chat(client: Any, model: str, prompt: str, max_tokens: int) -> dict:
    """One greedy chat request, streamed: its text, output tokens, TTFT and end (seconds)."""
    start = time.perf_counter()
    ttft, parts, tokens = None, [], None
    stream = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": prompt}], max_tokens=max_tokens,
        temperature=0.0, stream=True, stream_options={"include_usage": True})
    for chunk in stream:
        if chunk.usage is not None:
            tokens = chunk.usage.completion_tokens
        if chunk.choices and chunk.choices[0].delta.content:
            ttft = ttft if ttft is not None else time.perf_counter() - start
            parts.append(chunk.choices[0].delta.content)
    return {"text": "".join(parts), "tokens": tokens or 0, "ttft": ttft or 0.0,
            "end": time.perf_counter() - start}


def run_workload(session: Any, prompts: Sequence[str], max_tokens: int, label: str,
                 workload: str) -> dict:
    """Send ``prompts`` one at a time (greedy) and return one table row: output tokens, decode
    rate (tokens after the first / time after the first), the server's spec counters' change,
    and the texts (under ``"texts"``, for comparing runs)."""
    client = session.openai()
    before = spec_counters(session)
    done = [stream_chat(client, session.model, p, max_tokens) for p in prompts]
    after = spec_counters(session)
    d = {key: after[key] - before[key] for key in after}
    decode_s = sum(r["end"] - r["ttft"] for r in done)
    decode_tokens = sum(max(r["tokens"] - 1, 0) for r in done)
    return {"server": label, "workload": workload, "requests": len(done),
            "output tokens": sum(r["tokens"] for r in done),
            "decode tok/s": decode_tokens / decode_s if decode_s > 0 else float("nan"),
            "draft tokens": int(d["draft tokens"]), "accepted": int(d["accepted"]),
            "acceptance rate": d["accepted"] / d["draft tokens"] if d["draft tokens"] else None,
            "accepted per draft": d["accepted"] / d["drafts"] if d["drafts"] else None,
            "texts": [r["text"] for r in done]}


def split_runs(runs: Sequence[dict], base_label: str) -> tuple[list[dict], list[dict]]:
    """(the speculative runs, the baseline runs): those whose server is ``base_label``."""
    return ([r for r in runs if r["server"] != base_label],
            [r for r in runs if r["server"] == base_label])


def speedup_rows(spec: Sequence[dict], base: Sequence[dict]) -> list[dict]:
    """Pair each speculative run with the baseline run of the same workload: decode speed-up
    and whether the texts were identical."""
    by_workload = {b["workload"]: b for b in base}
    rows = []
    for s in spec:
        b = by_workload[s["workload"]]
        rows.append({"server": s["server"], "workload": s["workload"],
                     "draft tokens": s["draft tokens"], "accepted": s["accepted"],
                     "acceptance rate": s["acceptance rate"],
                     "accepted per draft": s["accepted per draft"],
                     "decode tok/s (spec)": s["decode tok/s"],
                     "decode tok/s (baseline)": b["decode tok/s"],
                     "speed-up": s["decode tok/s"] / b["decode tok/s"],
                     "same text as baseline": s["texts"] == b["texts"]})
    return rows


def acceptance_text(row: dict) -> str:
    """'**79%** of 43 draft tokens accepted (3.09 per draft)', or that none were proposed."""
    if not row["draft tokens"]:
        return "**no draft tokens proposed** (no n-gram of the context matched)"
    return (f"**{row['acceptance rate']:.0%}** of {row['draft tokens']} draft tokens accepted "
            f"({row['accepted per draft']:.2f} per draft)")


def noise_note(row: dict, low: float = 0.1) -> str:
    """A sentence for a run that sped up (or slowed down) with almost nothing accepted: that
    change is not speculation's doing (what else made it, the run does not measure)."""
    if (row["acceptance rate"] or 0.0) >= low or abs(row["speed-up"] - 1) <= 0.05:
        return ""
    if row["speed-up"] < 1 and row["draft tokens"]:
        return ""       # rejected drafts do cost time: the caller explains that one
    return (f"With {'no' if not row['draft tokens'] else 'almost no'} draft tokens accepted, "
            f"speculation saved (almost) no forward pass, so the {row['speed-up']:.2f}x on "
            f"{row['workload']} is not speculation's doing. ")


_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_LOG_MESSAGE = re.compile(r"WARNING.*?\[[\w.]+:\d+\]\s*(.*)")


def log_warnings(path: Any, word: str) -> list[str]:
    """The WARNING messages of a vLLM log that mention ``word`` (case-insensitive), colour
    codes and prefixes stripped, each once."""
    found: list[str] = []
    for line in Path(path).read_text(errors="replace").splitlines():
        m = _LOG_MESSAGE.search(_ANSI.sub("", line))
        if m and word.lower() in m.group(1).lower() and m.group(1) not in found:
            found.append(m.group(1).strip())
    return found


def texts_until_eos(tokenizer: Any, id_lists: Iterable[Sequence[int]]) -> list[str]:
    """Each id list decoded up to its first end-of-sequence token, special tokens skipped: the
    text a server would have returned for it."""
    eos, out = tokenizer.eos_token_id, []
    for ids in map(list, id_lists):
        out.append(tokenizer.decode(ids[:ids.index(eos) + 1] if eos in ids else ids,
                                    skip_special_tokens=True))
    return out


def without_texts(rows: Sequence[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k != "texts"} for r in rows]


# -- plots ----------------------------------------------------------------------------------------

def formula_curve(alpha: float, c: float, k_max: int) -> tuple[list[int], list[float]]:
    ks = list(range(0, k_max + 1))
    return ks, [expected_speedup(alpha, k, c) for k in ks]


def sweep_figure(rows: Sequence[dict], proposer: str, c: float):
    """Speed-up against k: measured, the paper's formula, and (when present) the formula with
    the measured verify cost; acceptance on a second axis."""
    from workshop.plots import figure
    fig, ax = figure(f"Speculative decoding on this machine ({proposer} draft, c = {c:.2g})",
                     "draft tokens per step k", "speed-up over plain decoding (x)")
    ks = [r["k"] for r in rows]
    ax.plot(ks, [r["measured speed-up"] for r in rows], "o-", label="measured speed-up")
    ax.plot(ks, [r["formula speed-up"] for r in rows], "s--",
            label="Leviathan et al. formula (measured alpha, c)")
    if "formula with measured verify cost" in rows[0]:
        ax.plot(ks, [r["formula with measured verify cost"] for r in rows], "^:",
                label="formula with the measured verify cost")
    ax.axhline(1.0, color="k", lw=0.8)
    ax2 = ax.twinx()
    spec = [r for r in rows if r["k"]]
    ax2.bar([r["k"] for r in spec], [r["acceptance rate"] for r in spec], width=0.3,
            alpha=0.25, color="tab:green", label="acceptance rate (accepted / drafted)")
    ax2.set_ylim(0, 1.05)
    ax2.set_ylabel("acceptance rate")
    lines, labels = ax.get_legend_handles_labels()
    lines2, labels2 = ax2.get_legend_handles_labels()
    ax.legend(lines + lines2, labels + labels2, fontsize=8, loc="best")
    ax.set_xticks(ks)
    return fig


def formula_figure(alphas: Sequence[float], c: float, k_max: int = 10):
    """The formula alone: expected speed-up against k for a few acceptance probabilities."""
    from workshop.plots import figure
    fig, ax = figure(f"Expected speed-up (Leviathan et al. 2023), draft cost c = {c:.2f}",
                     "draft tokens per step k", "expected speed-up (x)")
    for a in alphas:
        ks, s = formula_curve(a, c, k_max)
        ax.plot(ks, s, ".-", label=f"alpha = {a:.2f}")
    ax.axhline(1.0, color="k", lw=0.8)
    ax.legend(fontsize=8)
    return fig


def workload_figure(rows: Sequence[dict]):
    """Acceptance rate and speed-up per (server, workload), as grouped bars."""
    from workshop.plots import figure
    fig, ax = figure("n-gram (prompt lookup) drafts: repetitive vs open-chat workload",
                     "server and workload", "acceptance rate / speed-up (x)", size=(8.5, 4.4))
    x = range(len(rows))
    acc = ax.bar([i - 0.2 for i in x], [r["acceptance rate"] or 0.0 for r in rows], width=0.4,
                 label="acceptance rate (accepted / drafted)")
    up = ax.bar([i + 0.2 for i in x], [r["speed-up"] for r in rows], width=0.4,
                label="decode speed-up over the same engine without spec (x)")
    ax.bar_label(acc, labels=[f"{r['acceptance rate']:.2f}" if r.get("draft tokens") else
                              "no drafts" for r in rows], fontsize=7)
    ax.bar_label(up, fmt="%.2f", fontsize=7)
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xticks(list(x))
    ax.set_xticklabels([f"{r['server']}\n{r['workload'].split(' (')[0]}" for r in rows],
                       fontsize=8)
    ax.legend(fontsize=8)
    return fig


def mean(xs: Iterable[float]) -> float:
    xs = [x for x in xs if x is not None and not math.isnan(x)]
    return sum(xs) / len(xs) if xs else float("nan")
