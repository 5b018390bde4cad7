"""Notebook 09's helpers: the expected-speed-up formula (Leviathan et al. 2023), acceptance
counted from verify steps, the draft-length sweep, and the server workload runner (on a fake
server), with hand-computed values."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from reference_server import prometheus as P
from workshop.engine_lab import spec_decoding as sd

# -- the formula --------------------------------------------------------------------------------

def test_tokens_per_step_edges():
    # alpha = 0: every draft rejected, the step still emits the target's own token.
    assert sd.expected_tokens_per_step(0.0, 4) == 1.0
    # alpha = 1: every draft accepted, plus the bonus token.
    assert sd.expected_tokens_per_step(1.0, 4) == 5.0
    # just below 1 the closed form must approach k + 1 continuously
    assert sd.expected_tokens_per_step(1 - 1e-9, 4) == pytest.approx(5.0, rel=1e-6)
    # k = 0 is plain decoding
    assert sd.expected_tokens_per_step(0.7, 0) == 1.0


def test_tokens_per_step_hand_computed():
    # 1 + 0.5 + 0.25 + 0.125 = 1.875 = (1 - 0.5**4) / 0.5
    assert sd.expected_tokens_per_step(0.5, 3) == pytest.approx(1.875)
    # 1 + 0.8 + 0.64 = 2.44
    assert sd.expected_tokens_per_step(0.8, 2) == pytest.approx(2.44)


def test_speedup_hand_computed():
    # alpha 0.8, k 2, c 0.1: 2.44 / 1.2
    assert sd.expected_speedup(0.8, 2, 0.1) == pytest.approx(2.44 / 1.2)
    # free drafts (c = 0) with alpha 0.5, k 3: the tokens per step, 1.875
    assert sd.expected_speedup(0.5, 3, 0.0) == pytest.approx(1.875)
    # a verify step twice as dear as a decode halves it
    assert sd.expected_speedup(0.5, 3, 0.0, verify_cost=2.0) == pytest.approx(0.9375)
    # useless drafts cost: alpha 0, k 4, c 0.25 -> 1 / 2
    assert sd.expected_speedup(0.0, 4, 0.25) == pytest.approx(0.5)


def test_formula_rejects_nonsense():
    with pytest.raises(ValueError):
        sd.expected_tokens_per_step(1.5, 2)
    with pytest.raises(ValueError):
        sd.expected_tokens_per_step(0.5, -1)
    with pytest.raises(ValueError):
        sd.expected_speedup(0.5, 2, -0.1)


# -- acceptance ------------------------------------------------------------------------------------

STEPS = [(4, 4), (4, 1), (4, 0), (0, 0), (2, 2)]


def test_acceptance_rate_is_accepted_over_drafted():
    assert sd.acceptance_rate(STEPS) == pytest.approx(7 / 14)
    assert sd.acceptance_rate([]) == 0.0
    assert sd.acceptance_rate([(0, 0)]) == 0.0


def test_alpha_counts_only_compared_tokens():
    # compared: 4 (all accepted) + 2 (1 accepted, 1 rejected) + 1 (rejected) + 2 (all) = 9;
    # the step without drafts compares nothing
    assert sd.alpha_from_steps(STEPS) == pytest.approx(7 / 9)
    assert sd.alpha_from_steps([(3, 0), (3, 0)]) == 0.0
    assert sd.alpha_from_steps([(3, 3)]) == 1.0


def test_tokens_per_step():
    # (4+1) + (1+1) + (0+1) + (0+1) + (2+1) = 12 over 5 steps
    assert sd.tokens_per_step(STEPS) == pytest.approx(12 / 5)
    assert sd.tokens_per_step([]) == 0.0


# -- the sweep -------------------------------------------------------------------------------------

def test_draft_length_sweep_rows():
    def decode(k):
        # 12 tokens; with k drafts every step accepts all of them (k + 1 tokens per step)
        ids = list(range(12))
        steps = [(k, k)] * (12 // (k + 1))
        return ids, steps
    rows = sd.draft_length_sweep(decode, [2, 3], c=0.0, verify_costs={2: 1.0, 3: 2.0})
    assert [r["k"] for r in rows] == [0, 2, 3]
    base, two, three = rows
    assert base["target forwards"] == 12 and base["acceptance rate"] is None
    assert two["target forwards"] == 4 and two["tokens per step"] == 3.0
    assert two["alpha"] == 1.0 and two["formula speed-up"] == 3.0
    assert three["formula with measured verify cost"] == pytest.approx(2.0)
    assert all(r["same ids as k=0"] for r in rows)
    assert base["measured speed-up"] == 1.0


# -- the workload runner, on a fake server ---------------------------------------------------------

class _Chunk:
    def __init__(self, text=None, usage=None):
        self.usage = usage
        self.choices = [] if text is None else [
            type("C", (), {"delta": type("D", (), {"content": text})()})()]


class _FakeServer:
    """Counts like a server with n-gram drafts: each request drafts 8 tokens, accepts 6."""
    model = "fake"

    def __init__(self):
        self.counters = {P.SPEC_DECODE_DRAFTS: 10.0, P.SPEC_DECODE_DRAFT_TOKENS: 40.0,
                         P.SPEC_DECODE_ACCEPTED_TOKENS: 20.0}

    def metrics(self):
        return dict(self.counters)

    def openai(self):
        server = self

        class Completions:
            def create(self, **kw):
                server.counters[P.SPEC_DECODE_DRAFTS] += 2
                server.counters[P.SPEC_DECODE_DRAFT_TOKENS] += 8
                server.counters[P.SPEC_DECODE_ACCEPTED_TOKENS] += 6
                usage = type("U", (), {"completion_tokens": 3})()
                return iter([_Chunk("a"), _Chunk("b"), _Chunk("c"), _Chunk(usage=usage)])
        return type("Client", (), {"chat": type("Chat", (), {"completions": Completions()})()})()


def test_run_workload_reads_counter_deltas():
    row = sd.run_workload(_FakeServer(), ["p1", "p2"], 8, "fake", "w")
    assert row["requests"] == 2 and row["output tokens"] == 6
    assert row["draft tokens"] == 16 and row["accepted"] == 12
    assert row["acceptance rate"] == pytest.approx(0.75)
    assert row["accepted per draft"] == pytest.approx(3.0)
    assert row["texts"] == ["abc", "abc"]


def test_speedup_rows_pair_by_workload():
    base = [{"workload": "w", "decode tok/s": 10.0, "texts": ["x"]},
            {"workload": "v", "decode tok/s": 20.0, "texts": ["y"]}]
    spec = [{"server": "s", "workload": "v", "decode tok/s": 30.0, "texts": ["y"],
             "draft tokens": 8, "accepted": 4, "acceptance rate": 0.5,
             "accepted per draft": 2.0}]
    (row,) = sd.speedup_rows(spec, base)
    assert row["speed-up"] == pytest.approx(1.5) and row["same text as baseline"]
    # notebook 9 counts the rejected drafts of a run that slowed down from these two
    assert (row["draft tokens"], row["accepted"]) == (8, 4)


def test_acceptance_text_says_when_nothing_was_drafted():
    assert "no draft tokens" in sd.acceptance_text({"draft tokens": 0})
    text = sd.acceptance_text({"draft tokens": 40, "acceptance rate": 0.75,
                               "accepted per draft": 3.0})
    assert "75%" in text and "40 draft tokens" in text and "3.00 per draft" in text


def test_log_warnings_strips_colours_and_prefixes(tmp_path):
    log = tmp_path / "vllm.log"
    log.write_text(
        "(APIServer pid=1) \x1b[0;33mWARNING\x1b[0m 12-01 18:44:05 [vllm.py:1605] "
        "Async scheduling not supported with ngram-based Speculative decoding.\n"
        "(APIServer pid=1) INFO 12-01 18:44:05 [x.py:1] speculative config parsed\n"
        "(Worker pid=2) WARNING 12-01 18:44:06 [cpu_worker.py:130] Speculative decoding on "
        "CPU without Intel OpenMP\n"
        "(Worker pid=3) WARNING 12-01 18:44:06 [cpu_worker.py:130] Speculative decoding on "
        "CPU without Intel OpenMP\n"
        "(Worker pid=2) WARNING 12-01 18:44:07 [cpu.py:2] Triton is not installed.\n")
    assert sd.log_warnings(log, "speculative") == [
        "Async scheduling not supported with ngram-based Speculative decoding.",
        "Speculative decoding on CPU without Intel OpenMP"]


# -- the notebook's loop, on a fake model ----------------------------------------------------------

SOURCE = Path(__file__).resolve().parents[2] / "notebooks" / "src" / "09_speculative_decoding.py"


class _FakeModel:
    """A 'model' over a KV cache of token ids: the greedy token after position p is a hash of
    the tokens at 0..p as cached, so a stale (rejected) draft left in the cache changes the
    answer unless it is overwritten. With ``num_layers`` it answers a cheaper, often wrong
    guess, like a self-draft."""

    def __init__(self):
        self.cache: dict[int, int] = {}
        self.calls = 0

    def forward(self, start, token_ids, num_logits, num_layers=None):
        self.calls += num_layers is None
        for i, t in enumerate(token_ids):
            self.cache[start + i] = t
        end = start + len(token_ids)
        out = []
        for p in range(end - num_logits, end):
            prefix = [self.cache[q] for q in range(p + 1)]
            right = (sum(prefix) * 31 + prefix[-1]) % 11
            out.append(right if num_layers is None or prefix[-1] % 3 else (right + 1) % 11)
        return out


@pytest.fixture
def loop():
    """The notebook cell that defines the draft/verify loop, executed on the fake model."""
    cells = re.split(r"^# %%.*$", SOURCE.read_text(), flags=re.M)
    (cell,) = [c for c in cells if re.search(r"^def speculative_decode\(", c, flags=re.M)]
    from mini_engine.spec_decode import NgramProposer, accept_greedy
    model = _FakeModel()
    ns = {"forward": model.forward, "accept_greedy": accept_greedy,
          "NgramProposer": NgramProposer, "draft_layers": type("S", (), {"value": 2})()}
    exec(compile(cell, str(SOURCE), "exec"), ns)
    ns["model"] = model
    return ns


@pytest.mark.parametrize("drafter", ["ngram_draft", "self_draft"])
@pytest.mark.parametrize("k", [1, 2, 4])
def test_notebook_loop_matches_plain_decoding(loop, drafter, k):
    prompt = [1, 2, 3, 1, 2, 3, 1, 2]
    plain, plain_steps = loop["speculative_decode"](prompt, 30, 0, None)
    assert len(plain) == 30 and len(plain_steps) == 30        # one forward per token
    spec, steps = loop["speculative_decode"](prompt, 30, k, loop[drafter])
    assert spec == plain
    assert all(0 <= a <= d <= k for d, a in steps)
    # each step emits its accepted drafts plus one token (the last step may overshoot)
    assert sum(a + 1 for _, a in steps) >= 30


def test_notebook_loop_saves_forwards_when_drafts_are_right(loop):
    # a drafter that knows the answer (it runs the full fake model) is always accepted
    model = loop["model"]

    def oracle(tokens, k):
        saved = dict(model.cache)
        out = []
        for i in range(k):
            out += model.forward(len(tokens) - 1 + i, [out[-1] if out else tokens[-1]], 1)
        model.cache = saved
        return out
    plain, _ = loop["speculative_decode"]([5, 6, 7], 20, 0, None)
    spec, steps = loop["speculative_decode"]([5, 6, 7], 20, 4, oracle)
    assert spec == plain and len(steps) == 4 and all(a == 4 for _, a in steps)


def test_noise_note_only_where_nothing_was_accepted():
    row = {"workload": "open chat", "draft tokens": 54, "acceptance rate": 0.04, "speed-up": 1.3}
    assert "not speculation's doing" in sd.noise_note(row) and "almost no" in sd.noise_note(row)
    assert "no draft tokens" in sd.noise_note(dict(row, **{"draft tokens": 0,
                                                           "acceptance rate": None}))
    assert sd.noise_note(dict(row, **{"acceptance rate": 0.8})) == ""     # a real gain
    assert sd.noise_note(dict(row, **{"speed-up": 1.02})) == ""           # no change to explain
    assert sd.noise_note(dict(row, **{"speed-up": 0.8})) == ""            # rejected drafts cost


# -- notebook 9's tables and counts, as data -------------------------------------------------------

def test_step_counts_and_demo_rows():
    steps = [(4, 4), (0, 0), (4, 1)]
    assert sd.step_counts(steps) == {"steps": 3, "drafting steps": 2, "draft tokens": 8,
                                     "accepted": 5, "acceptance rate": 5 / 8}
    assert sd.step_counts([])["acceptance rate"] == 0.0
    plain, spec, wrong = [1, 2, 3, 4], [1, 2, 3, 4], [1, 2, 9, 4]
    rows = sd.demo_rows({"plain": (plain, [(0, 0)] * 4), "spec": (spec, [(4, 3)]),
                         "wrong": (wrong, [(2, 1), (2, 1)])})
    assert [r["run"] for r in rows] == ["plain", "spec", "wrong"]      # the first is the base
    assert [r["target forwards"] for r in rows] == [4, 1, 2]
    assert rows[1]["tokens per forward"] == 4.0 and rows[1]["accepted"] == 3
    assert [r["same token ids as plain"] for r in rows] == [True, True, False]


def test_split_runs_by_the_baseline_label():
    runs = [{"server": "base", "workload": "w"}, {"server": "spec", "workload": "w"},
            {"server": "base", "workload": "v"}]
    spec, base = sd.split_runs(runs, "base")
    assert spec == [runs[1]] and base == [runs[0], runs[2]]


def test_texts_until_eos_cut_after_the_first_eos():
    class Tok:
        eos_token_id = 0

        def decode(self, ids, skip_special_tokens):
            assert skip_special_tokens                    # the end-of-sequence token not shown
            return "".join(chr(96 + i) for i in ids if i != self.eos_token_id)

    assert sd.texts_until_eos(Tok(), [[1, 2, 0, 3], [3, 2], (1, 0)]) == ["ab", "cb", "a"]
