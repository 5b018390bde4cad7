"""Issue 39, structured output: the teaching engine masks its logits with an xgrammar grammar
(``mini_engine/grammar.py``), on the bundled model; the server's schema for
``response_format``."""

from __future__ import annotations

import json

import jsonschema
import pytest
import torch

from reference_server.models import ModelError, resolve_model

SCHEMA = {"type": "object",
          "properties": {"city": {"type": "string"}, "country": {"type": "string"},
                         "continent": {"enum": ["Africa", "America", "Asia", "Europe", "Oceania"]}},
          "required": ["city", "country", "continent"]}
FORMAT = {"type": "json_schema", "json_schema": {"name": "capital", "schema": SCHEMA}}
QUESTION = [{"role": "user", "content": "What is the capital of France? Answer in JSON."}]


@pytest.fixture(scope="module")
def path() -> str:
    torch.set_num_threads(1)
    try:
        return resolve_model("smollm2-135m", prepare=False).path
    except ModelError as exc:
        pytest.skip(f"bundled model not prepared: {exc}")


@pytest.fixture(scope="module")
def tokenizer(path):
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(path)


@pytest.fixture(scope="module")
def compiler(tokenizer):
    from mini_engine.grammar import GrammarCompiler
    return GrammarCompiler(tokenizer, 49152, [tokenizer.eos_token_id])


@pytest.fixture(scope="module")
def engine(path):
    from mini_engine import LLMEngine
    return LLMEngine(path, kv_cache_gib=0.05, num_threads=1)


@pytest.fixture(scope="module")
def prompt(tokenizer) -> list[int]:
    return list(tokenizer.apply_chat_template(QUESTION, add_generation_prompt=True, tokenize=True,
                                              return_dict=True)["input_ids"])


def _params(tokenizer, grammar=None, **kw):
    from mini_engine import SamplingParams
    return SamplingParams(**{"max_tokens": 48, "stop_token_ids": [tokenizer.eos_token_id],
                             "grammar": grammar, **kw})


def _answer(tokenizer, ids: list[int]) -> str:
    return tokenizer.decode([t for t in ids if t != tokenizer.eos_token_id])


def test_the_answer_follows_the_schema_greedy_and_sampled_and_leaves_its_neighbours_alone(
        engine, compiler, tokenizer, prompt):
    grammar = compiler.compile(FORMAT)
    free = _params(tokenizer)
    alone = engine.generate([prompt], free)[0]
    # a batch: constrained greedy, unconstrained greedy, constrained sampled (seeded)
    got = engine.generate([prompt] * 3, [_params(tokenizer, grammar), free,
                                         _params(tokenizer, grammar, temperature=1.0, seed=3)])
    for ids in (got[0], got[2]):
        assert ids[-1] == tokenizer.eos_token_id, "a complete value, then the stop token"
        jsonschema.validate(json.loads(_answer(tokenizer, ids)), SCHEMA)
    assert got[1] == alone, "the grammar rows changed an unconstrained neighbour's answer"


def test_greedy_under_a_grammar_keeps_the_models_own_tokens_until_one_breaks_the_schema(
        engine, compiler, tokenizer, prompt):
    # The mask only removes tokens: where the model's own greedy token is allowed it stays
    # the argmax, so the two answers agree up to the first token the grammar refuses.
    free = engine.generate([prompt], _params(tokenizer))[0]
    forced = engine.generate([prompt], _params(tokenizer, compiler.compile(FORMAT)))[0]
    m, k = compiler.compile(FORMAT).matcher(), 0
    while k < len(free) and m.accept_token(free[k]):
        k += 1
    assert k < len(free), "the model's own answer already fits the schema: no test"
    assert forced[:k] == free[:k] and forced[k] != free[k]


def test_json_object_gives_an_object_and_ends_even_with_ignore_eos(engine, compiler, tokenizer,
                                                                   prompt):
    grammar = compiler.compile({"type": "json_object"})
    ids = engine.generate([prompt], _params(tokenizer, grammar, ignore_eos=True,
                                            max_tokens=120))[0]
    assert isinstance(json.loads(_answer(tokenizer, ids)), dict)
    assert len(ids) < 120, "the grammar's end is the sequence's end"


def test_text_is_no_grammar_and_bad_formats_are_refused(compiler):
    from mini_engine.grammar import GrammarError
    assert compiler.compile({"type": "text"}) is None and compiler.compile(None) is None
    with pytest.raises(GrammarError, match="must be a JSON object"):
        compiler.compile({"type": "json_schema", "json_schema": {"name": "x", "schema": []}})
    with pytest.raises(GrammarError, match="structural_tag"):
        compiler.compile({"type": "structural_tag"})


def test_the_mask_allows_exactly_what_the_matcher_allows(compiler, tokenizer):
    from mini_engine.grammar import advance, apply_grammar
    grammar = compiler.compile(FORMAT)
    m = grammar.matcher()
    logits = torch.zeros(2, 49152)
    apply_grammar(logits, [m, None])
    allowed = torch.isfinite(logits[0]).nonzero().flatten().tolist()
    assert torch.isfinite(logits[1]).all(), "a row without a grammar is untouched"
    assert allowed and len(allowed) < 100
    assert all(tokenizer.decode([t]).startswith("{") for t in allowed)
    # walk a valid answer; a token that breaks it is refused
    text = json.dumps({"city": "Paris", "country": "France", "continent": "Europe"},
                      separators=(",", ":"))
    done = [advance(m, t) for t in tokenizer.encode(text) + [tokenizer.eos_token_id]]
    assert done[-1] and not any(done[:-1])
    with pytest.raises(ValueError, match="breaks"):
        advance(compiler.compile(FORMAT).matcher(), tokenizer.encode("hello")[0])


def test_the_server_schema_for_response_format():
    from pydantic import ValidationError

    from reference_server.protocol import ChatCompletionRequest, unsupported_fields
    req = ChatCompletionRequest.model_validate({"model": "m", "messages": QUESTION,
                                                "response_format": FORMAT})
    assert req.response_format.json_schema.schema_ == SCHEMA
    # passed on to vLLM and SGLang under its JSON name, and not refused by a local engine
    assert req.model_dump(exclude_unset=True, by_alias=True)["response_format"] == FORMAT
    assert unsupported_fields(req, "chat") == []
    for bad in ({"type": "json_schema"}, {"type": "json_schema", "json_schema": {"name": "x"}},
                {"type": "yaml"}, {"type": "json_schema", "json_schema": {"schema": SCHEMA}},
                {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "frob"}}}):
        with pytest.raises(ValidationError):
            ChatCompletionRequest.model_validate({"model": "m", "messages": QUESTION,
                                                  "response_format": bad})
