"""The correctness gate's judgement (workshop/bench/verify.py), on a stand-in reference whose
tokens are characters: agreement, a near tie, a wrong answer, an early stop, the probe order."""

from __future__ import annotations

import torch

from workshop.bench import verify as V

VOCAB = 128
EOS = 0


class CharTokenizer:
    eos_token_id = EOS

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(i) for i in ids if not (skip_special_tokens and i == EOS))

    def encode(self, text, add_special_tokens=False):
        return [ord(c) for c in text]


class CharReference(V.Reference):
    """Answers ``answer`` to every prompt; at each step its top logit is the answer's character
    and ``runner_up`` (if any) scores ``gap`` below it."""

    def __init__(self, answer: str, runner_up: dict[int, tuple[str, float]] | None = None) -> None:
        self.tok = CharTokenizer()
        self.ids = [ord(c) for c in answer] + [EOS]
        self.logits = torch.full((len(self.ids), VOCAB), -10.0)
        for i, t in enumerate(self.ids):
            self.logits[i, t] = 5.0
        for i, (ch, gap) in (runner_up or {}).items():
            self.logits[i, ord(ch)] = 5.0 - gap

    def generate(self, messages, new_tokens):
        return self.ids[:new_tokens], self.logits[:new_tokens]


PROBE = V.Probe("short", (("user", "capital of France?"),))


def test_the_same_answer_agrees():
    c = V.compare(CharReference("Paris"), PROBE, "Paris", 16)
    assert (c.verdict, c.matched, c.compared) == ("agree", 6, 6)


def test_a_departure_to_the_references_close_second_is_a_near_tie():
    ref = CharReference("Paris.", runner_up={5: ("!", 0.2)})
    c = V.compare(ref, PROBE, "Paris!", 16)
    assert (c.verdict, c.departed_at, c.server_token) == ("near tie", 5, "!")
    assert abs(c.gap - 0.2) < 1e-6 and c.reference_top2[0] == "."


def test_a_departure_far_from_the_references_choice_is_wrong():
    c = V.compare(CharReference("Paris"), PROBE, "L'Etoile", 16)
    assert (c.verdict, c.departed_at, c.matched) == ("wrong", 0, 0)
    assert c.gap == 15.0 and c.expected == "Paris" and c.got == "L'Etoile"


def test_stopping_early_or_going_on_past_the_end_is_judged_at_that_token():
    early = V.compare(CharReference("Paris"), PROBE, "Par", 16)      # the server chose its end
    assert (early.verdict, early.departed_at, early.server_token) == ("wrong", 3, "")
    late = V.compare(CharReference("Paris"), PROBE, "Paris is", 16)  # the reference chose its end
    assert (late.verdict, late.departed_at) == ("wrong", 5)


def test_a_gate_passes_only_with_checks_and_none_wrong_or_failed():
    ok = V.Check("short", "q", 0, "agree", 4, 4)
    tie = V.Check("short", "q", 1, "near tie", 2, 4, gap=0.1)
    bad = V.Check("sharegpt", "q", 0, "wrong", 0, 4, gap=9.0)
    err = V.Check("short", "q", 0, "error", 0, 4, error="HTTPStatusError")
    gate = lambda *cs: V.Gate("u", "m", "p", 4, V.TIE_MARGIN, list(cs))   # noqa: E731
    assert gate(ok, tie).passed and not gate().passed
    assert not gate(ok, bad).passed and not gate(ok, err).passed
    g = gate(ok, tie, bad)
    assert g.counts == {"agree": 1, "near tie": 1, "wrong": 1, "error": 0}
    assert g.failures == [bad] and g.agreement == 6 / 12
    back = V.Gate.from_dict(g.to_dict())
    assert back.checks == g.checks and back.passed is False


def test_repeats_are_sent_back_to_back_and_the_system_prompt_is_long():
    ps = V.probes(sharegpt=0)
    shorts = [p for p in ps if p.kind == "short"]
    assert [p.repeat for p in shorts[:V.SHORT_REPEATS]] == list(range(V.SHORT_REPEATS))
    assert len({p.messages for p in shorts[:V.SHORT_REPEATS]}) == 1
    system = [p for p in ps if p.kind == "system prompt"]
    assert len(system) == len(V.SYSTEM_QUESTIONS) and len({p.messages[0] for p in system}) == 1
    assert len(V.system_prompt().split()) > 350  # several hundred tokens, cached after the first
