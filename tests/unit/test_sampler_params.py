"""Issue 39: top-k, min-p, presence / frequency / repetition penalties and logit_bias in the
teaching engine's sampler (vLLM's semantics), the server's schema for them, and the request
-> SamplingParams mapping every in-process engine shares."""

from __future__ import annotations

import asyncio
import math

import pytest
import torch

from mini_engine.sampler import Row, apply_penalties, sample, sample_row
from mini_engine.sequence import SamplingParams
from reference_server.engines.base import EngineError
from reference_server.protocol import ChatCompletionRequest, CompletionRequest, unsupported_fields

NEG = float("-inf")


def _row(params: SamplingParams, prompt=(), output=(), seed: int | None = None) -> Row:
    gen = None if seed is None else torch.Generator().manual_seed(seed)
    return Row(params, gen, [*prompt, *output], len(prompt))


def _penalized(logits: list[float], params: SamplingParams, prompt=(), output=()) -> list[float]:
    x = torch.tensor([logits])
    apply_penalties(x, [_row(params, prompt, output)])
    return x[0].tolist()


# ---- penalties and bias, against hand-computed values --------------------------------

def test_repetition_penalty_counts_prompt_and_output_and_divides_positive_logits():
    logits = [2.0, -1.0, 3.0, -2.0, 1.0]
    # token 0 (positive) in the prompt: 2 / 2; token 1 (negative) in the output: -1 * 2;
    # token 2 unseen; token 3 in both (once): -2 * 2; token 4 twice in the output: 1 / 2
    got = _penalized(logits, SamplingParams(repetition_penalty=2.0), prompt=[0, 3],
                     output=[1, 3, 4, 4])
    assert got == [1.0, -2.0, 3.0, -4.0, 0.5]
    # below 1 it rewards repetition the same way
    assert _penalized(logits, SamplingParams(repetition_penalty=0.5), prompt=[0]) == \
        [4.0, -1.0, 3.0, -2.0, 1.0]


def test_frequency_and_presence_penalties_count_output_tokens_only():
    logits = [0.0, 0.0, 0.0, 0.0]
    p = SamplingParams(frequency_penalty=0.5, presence_penalty=0.25)
    # token 0 only in the prompt: untouched; token 1 once, token 2 three times in the output
    got = _penalized(logits, p, prompt=[0, 0], output=[1, 2, 2, 2])
    assert got == [0.0, -(0.5 + 0.25), -(3 * 0.5 + 0.25), 0.0]
    # negative values encourage repetition
    assert _penalized(logits, SamplingParams(presence_penalty=-1.0), output=[3]) == \
        [0.0, 0.0, 0.0, 1.0]


def test_repetition_then_frequency_then_presence_in_vllms_order():
    # 3 / 2 (repetition) - 2 * 0.5 (frequency) - 1 (presence) = -0.5
    got = _penalized([3.0, 0.0], SamplingParams(repetition_penalty=2.0, frequency_penalty=0.5,
                                                presence_penalty=1.0), output=[0, 0])
    assert got == [-0.5, 0.0]


def test_logit_bias_comes_before_penalties_and_decides_greedy():
    logits = torch.tensor([[1.0, 0.5, -3.0]])
    assert sample(logits, [_row(SamplingParams(logit_bias={2: 100.0}))]) == [2]
    # bias first: token 2 becomes -3 + 5 = 2, positive, so the penalty divides it: 2 / 3 =
    # 0.67 beats token 1's 0.5 (penalizing first would give -3 * 3 + 5 = -4)
    p = SamplingParams(logit_bias={2: 5.0, 0: -0.6}, repetition_penalty=3.0)
    assert sample(logits, [_row(p, prompt=[2])]) == [2]       # 0.4, 0.5, 0.67
    p = SamplingParams(logit_bias={2: 5.0, 0: -0.6}, repetition_penalty=5.0)
    assert sample(logits, [_row(p, prompt=[2])]) == [1]       # 0.4, 0.5, 0.4
    assert logits.tolist() == [[1.0, 0.5, -3.0]]              # the caller's logits untouched


def test_penalties_match_vllms_own_function():
    utils = pytest.importorskip("vllm.model_executor.layers.utils")
    torch.manual_seed(0)
    vocab = 50
    logits = torch.randn(4, vocab) * 3
    prompts = [[1, 2, 3, 3], [7], [0, 49, 5], [10, 11]]
    outputs = [[3, 4, 4, 4], [7, 7, 8], [], [12, 10, 13, 13]]
    params = [SamplingParams(repetition_penalty=1.3, frequency_penalty=0.4, presence_penalty=0.2),
              SamplingParams(repetition_penalty=0.7, frequency_penalty=-0.5),
              SamplingParams(presence_penalty=1.5, repetition_penalty=2.0),
              SamplingParams()]
    ours = logits.clone()
    apply_penalties(ours, [_row(p, pr, out) for p, pr, out in zip(params, prompts, outputs)])

    def padded(lists):   # vLLM pads with vocab_size, an id no token has
        width = max(len(x) for x in lists)
        return torch.tensor([x + [vocab] * (width - len(x)) for x in lists])
    theirs = utils.apply_penalties(
        logits.clone(), padded(prompts), padded(outputs),
        torch.tensor([p.presence_penalty for p in params]),
        torch.tensor([p.frequency_penalty for p in params]),
        torch.tensor([p.repetition_penalty for p in params]))
    assert torch.allclose(ours, theirs, rtol=0, atol=1e-6)
    assert torch.equal(ours[3], logits[3])                     # neutral row: untouched


# ---- top-k, min-p, top-p ------------------------------------------------------------

def test_top_k_one_is_greedy_and_top_k_keeps_only_k_tokens():
    torch.manual_seed(1)
    logits = torch.randn(200)
    best = int(logits.argmax())
    for seed in range(20):
        p = SamplingParams(temperature=1.5, top_k=1)
        assert sample_row(logits, p, torch.Generator().manual_seed(seed)) == best
    top3 = set(logits.topk(3).indices.tolist())
    drawn = {sample_row(logits, SamplingParams(temperature=2.0, top_k=3),
                        torch.Generator().manual_seed(s)) for s in range(200)}
    assert drawn == top3
    for off in (0, -1, 200, 10**6):          # 0 / -1: all tokens (vLLM); k >= vocab: all too
        assert sample_row(logits, SamplingParams(temperature=1.0, top_k=off, seed=3),
                          torch.Generator().manual_seed(3)) == \
            sample_row(logits, SamplingParams(temperature=1.0, seed=3),
                       torch.Generator().manual_seed(3))


def test_min_p_keeps_tokens_at_least_min_p_times_the_most_likely():
    # probabilities 0.5, 0.25, 0.15, 0.1: min_p 0.4 keeps >= 0.2, i.e. tokens 0 and 1
    logits = torch.tensor([0.5, 0.25, 0.15, 0.1]).log()
    drawn = {sample_row(logits, SamplingParams(temperature=1.0, min_p=0.4),
                        torch.Generator().manual_seed(s)) for s in range(200)}
    assert drawn == {0, 1}
    # after the temperature, as vLLM: at T=0.5 the probabilities become 0.72, 0.18, 0.065,
    # 0.029 and min_p 0.2 keeps >= 0.145, tokens 0 and 1 (at T=1 it would keep all four)
    drawn = {sample_row(logits, SamplingParams(temperature=0.5, min_p=0.2),
                        torch.Generator().manual_seed(s)) for s in range(300)}
    assert drawn == {0, 1}
    assert {sample_row(logits, SamplingParams(temperature=1.0, min_p=1.0),
                       torch.Generator().manual_seed(s)) for s in range(50)} == {0}


def test_top_p_applies_to_what_top_k_and_min_p_left():
    # 0.4, 0.3, 0.2, 0.1: top_p 0.55 keeps tokens 0 and 1; after top_k 2 renormalized them
    # to 0.57 and 0.43, token 0 alone reaches 0.55
    logits = torch.tensor([0.4, 0.3, 0.2, 0.1]).log()
    assert {sample_row(logits, SamplingParams(temperature=1.0, top_p=0.55),
                       torch.Generator().manual_seed(s)) for s in range(200)} == {0, 1}
    assert {sample_row(logits, SamplingParams(temperature=1.0, top_p=0.55, top_k=2),
                       torch.Generator().manual_seed(s)) for s in range(200)} == {0}


def test_top_k_keeps_ties_at_the_kth_value_like_vllm():
    logits = torch.tensor([2.0, 1.0, 1.0, 0.0])
    drawn = {sample_row(logits, SamplingParams(temperature=1.0, top_k=2),
                        torch.Generator().manual_seed(s)) for s in range(300)}
    assert drawn == {0, 1, 2}


# ---- batches, greedy, seeds ----------------------------------------------------------

def test_mixed_batch_equals_each_row_alone():
    torch.manual_seed(2)
    logits = torch.randn(6, 300)
    rows = [
        lambda: _row(SamplingParams()),                                          # plain greedy
        lambda: _row(SamplingParams(temperature=0.8, top_k=5), seed=1),
        lambda: _row(SamplingParams(repetition_penalty=1.8), prompt=[4, 5], output=[6]),
        lambda: _row(SamplingParams(temperature=1.2, min_p=0.1, top_p=0.9,
                                    frequency_penalty=1.0, presence_penalty=0.5),
                     prompt=[1], output=[2, 2], seed=2),
        lambda: _row(SamplingParams(temperature=0.7, logit_bias={17: 100.0}), seed=3),
        lambda: _row(SamplingParams(temperature=1.0), seed=4),
    ]
    together = sample(logits, [make() for make in rows])
    alone = [sample(logits[i:i + 1], [make()])[0] for i, make in enumerate(rows)]
    assert together == alone
    assert together[0] == int(logits[0].argmax())
    assert together[4] == 17
    # a seeded row draws the same whatever shares its batch
    again = sample(logits[[5, 1]], [rows[5](), rows[1]()])
    assert again == [together[5], together[1]]


def test_plain_greedy_is_the_raw_argmax_even_beside_processed_rows():
    torch.manual_seed(3)
    logits = torch.randn(3, 1000)
    got = sample(logits, [_row(SamplingParams()),
                          _row(SamplingParams(repetition_penalty=2.0), prompt=range(1000)),
                          _row(SamplingParams(temperature=1.0, top_k=2), seed=0)])
    assert got[0] == int(logits[0].argmax())
    assert SamplingParams().plain_greedy and SamplingParams(top_k=5, min_p=0.5).plain_greedy
    for p in (SamplingParams(repetition_penalty=1.1), SamplingParams(logit_bias={1: 1.0}),
              SamplingParams(presence_penalty=0.1), SamplingParams(temperature=1.0)):
        assert not p.plain_greedy


def test_greedy_with_a_penalty_is_the_argmax_of_the_penalized_logits():
    logits = torch.tensor([[3.0, 2.0, 1.0]])
    # token 0 was output twice: 3 - 2 * 0.8 = 1.4 < 2.0
    assert sample(logits, [_row(SamplingParams(frequency_penalty=0.8), output=[0, 0])]) == [1]
    assert sample(logits, [_row(SamplingParams(), output=[0, 0])]) == [0]


def test_a_row_without_a_distribution_raises_before_any_draw():
    logits = torch.randn(2, 10)
    g = torch.Generator().manual_seed(5)
    state = g.get_state()
    with pytest.raises(ValueError):
        sample(logits, [_row(SamplingParams(temperature=1.0)),
                        Row(SamplingParams(temperature=float("nan")), g)])
    assert torch.equal(g.get_state(), state)    # nothing drawn: a retry row by row is exact


def test_sampling_params_validate_names_the_parameter():
    SamplingParams(top_k=-1, logit_bias={0: 1.0, 9: -1.0}).validate(10)
    for bad, name in [(SamplingParams(top_k=-2), "top_k"), (SamplingParams(min_p=1.5), "min_p"),
                      (SamplingParams(repetition_penalty=0.0), "repetition_penalty"),
                      (SamplingParams(logit_bias={10: 1.0}), "logit_bias")]:
        with pytest.raises(ValueError, match=name):
            bad.validate(10)


# ---- the server's schema and the shared request -> SamplingParams mapping ---------------

NEUTRAL = {"repetition_penalty": 1.0, "presence_penalty": 0, "frequency_penalty": 0.0,
           "top_k": -1, "min_p": 0, "logit_bias": {}}


@pytest.mark.parametrize("schema,extra", [(CompletionRequest, {"prompt": "hi"}),
                                          (ChatCompletionRequest,
                                           {"messages": [{"role": "user", "content": "hi"}]})])
def test_neutral_and_real_values_are_accepted_by_every_in_process_engine(schema, extra):
    kind = "complete" if schema is CompletionRequest else "chat"
    for body in (NEUTRAL, {"top_k": 0}, {"repetition_penalty": 1.3, "top_k": 40, "min_p": 0.05,
                                         "presence_penalty": -2, "frequency_penalty": 2,
                                         "logit_bias": {"5": -100, "6": 100}}):
        req = schema.model_validate({"model": "m", **extra, **body})
        assert unsupported_fields(req, kind) == []
    # SGLang takes -1, not 0, for "all tokens"; vLLM takes both
    assert schema.model_validate({"model": "m", **extra, "top_k": 0}).top_k == -1


@pytest.mark.parametrize("field,value", [
    ("top_k", -2), ("top_k", 1.5), ("top_k", "5"), ("min_p", -0.1), ("min_p", 1.01),
    ("repetition_penalty", 0), ("repetition_penalty", 2.5), ("repetition_penalty", "x"),
    ("presence_penalty", 2.5), ("frequency_penalty", -3), ("logit_bias", {"a": 1}),
    ("logit_bias", {"5": 101}), ("logit_bias", {"5": "1"}), ("logit_bias", [5])])
def test_out_of_range_values_are_refused_naming_the_field(field, value):
    from pydantic import ValidationError
    with pytest.raises(ValidationError) as e:
        CompletionRequest.model_validate({"model": "m", "prompt": "hi", field: value})
    assert e.value.errors()[0]["loc"][0] == field


def _mapped(**body) -> SamplingParams:
    from test_server_logic import ScriptedEngine
    engine = ScriptedEngine("ab")
    req = CompletionRequest.model_validate({"model": "m", "prompt": "x", "max_tokens": 2, **body})
    asyncio.run(engine.complete(req))
    return engine.params


def test_request_fields_reach_sampling_params():
    p = _mapped(top_k=40, min_p=0.05, presence_penalty=0.5, frequency_penalty=-0.5,
                repetition_penalty=1.2, logit_bias={"5": 10, "7": -100.0}, temperature=0.7)
    assert (p.top_k, p.min_p, p.presence_penalty, p.frequency_penalty, p.repetition_penalty,
            p.logit_bias) == (40, 0.05, 0.5, -0.5, 1.2, {5: 10.0, 7: -100.0})
    neutral = _mapped(**NEUTRAL, temperature=0)
    assert neutral.plain_greedy and neutral.top_k == 0
    null = _mapped(top_k=None, min_p=None, repetition_penalty=None, logit_bias=None)
    assert (null.top_k, null.min_p, null.repetition_penalty, null.logit_bias) == (0, 0.0, 1.0, {})
    assert math.isclose(_mapped().repetition_penalty, 1.0)


def test_logit_bias_outside_the_vocabulary_is_a_400_naming_it():
    for key in ("1114112", "-1"):                 # ScriptedEngine's vocabulary: 0x110000 ids
        with pytest.raises(EngineError) as e:
            _mapped(logit_bias={key: 1})
        assert e.value.status_code == 400 and e.value.param == "logit_bias"


# ---- the teaching engine, on the bundled model ----------------------------------------

@pytest.fixture(scope="module")
def model_path() -> str:
    from reference_server.models import ModelError, resolve_model
    try:
        return resolve_model("smollm2-135m", prepare=False).path
    except ModelError as exc:
        pytest.skip(f"bundled model not prepared: {exc}")


def _run(engine, requests) -> dict[str, list[int]]:
    got = {rid: [] for rid, _, _ in requests}
    for rid, prompt, params in requests:
        engine.add_request(prompt, params, rid)
    while engine.has_unfinished():
        for out in engine.step():
            assert out.error is None, out.error
            got[out.request_id] += out.new_token_ids
    return got


PROMPT = [1, 504, 3458, 28, 253, 1978, 42]


def test_engine_batch_with_mixed_parameters(model_path):
    from mini_engine import LLMEngine
    torch.set_num_threads(1)
    engine = LLMEngine(model_path, kv_cache_gib=0.02, num_threads=1)
    n = 8
    plain = SamplingParams(max_tokens=n, ignore_eos=True)
    requests = [
        ("greedy", PROMPT, plain),
        ("bias", PROMPT, SamplingParams(max_tokens=n, ignore_eos=True, logit_bias={1978: 100.0})),
        ("repeat", PROMPT, SamplingParams(max_tokens=n, ignore_eos=True, repetition_penalty=2.0)),
        ("freq", PROMPT, SamplingParams(max_tokens=n, ignore_eos=True, frequency_penalty=2.0,
                                        presence_penalty=2.0)),
        ("top1", PROMPT, SamplingParams(max_tokens=n, ignore_eos=True, temperature=1.0, top_k=1,
                                        seed=1)),
        ("seeded", PROMPT, SamplingParams(max_tokens=n, ignore_eos=True, temperature=1.0,
                                          top_k=20, min_p=0.05, seed=7)),
    ]
    together = _run(engine, requests)
    alone = {rid: _run(engine, [(rid, p, sp)])[rid] for rid, p, sp in requests}
    assert together == alone                      # parameters stay with their own request
    assert together["top1"] == together["greedy"]
    assert together["bias"] == [1978] * n
    for rid in ("repeat", "freq"):                # the penalties change what greedy picks
        assert together[rid] != together["greedy"]
    # no token of the prompt or of its own output again under a 2x repetition penalty is
    # not guaranteed, but the greedy answer's repeats must have dropped
    assert len(set(together["freq"])) > len(set(together["greedy"]))


def test_penalized_greedy_does_not_speculate(model_path):
    """Speculation verifies drafts against the raw argmax: a request whose logits a bias or
    penalty moves must decode normally and give what the engine without drafts gives."""
    from mini_engine import LLMEngine
    torch.set_num_threads(1)
    base = LLMEngine(model_path, kv_cache_gib=0.02, num_threads=1)
    spec = LLMEngine(model_path, kv_cache_gib=0.02, num_threads=1, spec="ngram")
    prompt = PROMPT * 3                          # repeats: the n-gram proposer has drafts
    # plain greedy repeats the prompt: [..., 28, 253, 1978, 42, ...]; banning 1978 leaves the
    # drafts after "28 253" proposing it, which the raw argmax would accept
    params = [SamplingParams(max_tokens=12, ignore_eos=True),
              SamplingParams(max_tokens=12, ignore_eos=True, logit_bias={1978: -100.0}),
              SamplingParams(max_tokens=12, ignore_eos=True, repetition_penalty=1.5),
              SamplingParams(max_tokens=12, ignore_eos=True, frequency_penalty=1.0)]
    outs = [_run(spec, [("r", prompt, p)])["r"] for p in params]
    assert outs == [_run(base, [("r", prompt, p)])["r"] for p in params]
    assert 1978 in outs[0] and 1978 not in outs[1]
    assert spec.spec_stats.num_draft_tokens > 0   # the plain greedy one did speculate
