"""Structured output: a grammar masks the logits, so every token drawn keeps the answer valid.

A JSON schema (OpenAI's ``response_format``) is compiled once against the tokenizer's
vocabulary into a pushdown automaton: states of a JSON parser, and for each state which token
ids may come next (a token is a byte string, so "may come next" means every byte of it is a
legal continuation). Per request a *matcher* walks that automaton:

1. before each sampling step, ``fill`` writes a bitmask of the allowed token ids (one bit per
   id, 32 ids per int32) and the sampler sets every other logit to -inf;
2. the sampler draws as usual (greedy, temperature, top-p: all within the allowed set);
3. ``advance`` moves the matcher by the chosen token. Once the value is complete the only
   allowed tokens are the stop tokens, and accepting one ends the grammar (``finish_reason``
   "stop", even with ``ignore_eos``).

The library is xgrammar (the default backend of vLLM and SGLang): it precomputes, per
automaton state, which tokens are decided by the state alone, so a step's mask costs a
fraction of a millisecond on a CPU. ``benchmarks/grammar_backends.py`` measures it beside
llguidance and outlines-core on this machine.

Conventions, as vLLM's xgrammar backend: ``json_object`` is the schema ``{"type": "object"}``.
One choice of ours: no free whitespace (``any_whitespace=False``, separators "," and ":"), so
a small model cannot fill its token budget with newlines inside a valid object (vLLM's
``--structured-outputs-config.disable_any_whitespace`` does the same).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import torch

KINDS = ("text", "json_object", "json_schema")


class GrammarError(ValueError):
    """The response format cannot be compiled (the server answers 400)."""


@dataclass(frozen=True)
class Grammar:
    """A compiled grammar: immutable, shared by every sequence of a request (``n`` > 1)."""
    compiled: Any           # xgrammar.CompiledGrammar
    kind: str

    def matcher(self):
        """A fresh walker over the automaton, one per sequence."""
        import xgrammar as xgr
        return xgr.GrammarMatcher(self.compiled)


class GrammarCompiler:
    """Compiles response formats for one tokenizer; ``vocab_size`` is the logits' width
    (it may exceed the tokenizer's: padding rows are never allowed)."""

    def __init__(self, tokenizer, vocab_size: int, stop_token_ids: list[int]) -> None:
        import xgrammar as xgr
        info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size,
                                                  stop_token_ids=list(stop_token_ids))
        self._compiler = xgr.GrammarCompiler(info, max_threads=1)
        self.vocab_size = vocab_size

    def compile(self, response_format: dict[str, Any] | None) -> Grammar | None:
        """The grammar of an OpenAI ``response_format`` (None for plain text)."""
        kind = (response_format or {}).get("type", "text")
        if kind == "text":
            return None
        if kind == "json_object":
            schema: Any = {"type": "object"}
        elif kind == "json_schema":
            schema = ((response_format or {}).get("json_schema") or {}).get("schema")
            if not isinstance(schema, dict):
                raise GrammarError("response_format.json_schema.schema must be a JSON object")
        else:
            raise GrammarError(f"response_format type {kind!r} is not supported here "
                               f"(one of {', '.join(KINDS)})")
        try:
            compiled = self._compiler.compile_json_schema(
                json.dumps(schema), any_whitespace=False, separators=(",", ":"))
        except Exception as exc:  # xgrammar raises RuntimeError for a schema it cannot read
            raise GrammarError(f"response_format: the JSON schema cannot be compiled: "
                               f"{str(exc)[:300]}") from exc
        return Grammar(compiled, kind)


def apply_grammar(logits: torch.Tensor, matchers: list[Any]) -> None:
    """Set to -inf, in place, every logit its row's matcher does not allow (rows whose matcher
    is None are left alone). ``logits`` is float32 on the CPU, ``[len(matchers), vocab]``."""
    rows = [i for i, m in enumerate(matchers) if m is not None]
    if not rows:
        return
    import xgrammar as xgr
    mask = xgr.allocate_token_bitmask(len(logits), logits.shape[1])
    for i in rows:
        matchers[i].fill_next_token_bitmask(mask, i)
    xgr.apply_token_bitmask_inplace(logits, mask.to(logits.device), indices=rows)


def advance(matcher, token_id: int) -> bool:
    """Move ``matcher`` by the sampled token; True once the grammar is complete. A token the
    grammar refuses raises (the mask makes that impossible unless a row had no allowed token)."""
    if not matcher.accept_token(token_id):
        raise ValueError(f"token {token_id} breaks the response format's grammar")
    return matcher.is_terminated()
