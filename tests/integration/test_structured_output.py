"""Issue 39, structured output: ``response_format`` through the reference server on every
engine, over real HTTP. vLLM and SGLang apply it themselves (xgrammar, their default); the
in-process engines mask their logits with ``mini_engine.grammar``. A schema that is not a
JSON schema is the same 400 on every engine, before anything is streamed."""

from __future__ import annotations

import json

import httpx
import jsonschema
import pytest

pytestmark = pytest.mark.engine

M = "smollm2-135m"
SCHEMA = {"type": "object",
          "properties": {"city": {"type": "string"}, "country": {"type": "string"},
                         "continent": {"enum": ["Africa", "America", "Asia", "Europe", "Oceania"]}},
          "required": ["city", "country", "continent"]}
FORMAT = {"type": "json_schema", "json_schema": {"name": "capital", "schema": SCHEMA}}
# Sampled, a free string may run on until max_tokens (SGLang once wrote '"Paris}...4608889'):
# valid so far, never finished. Closed values end within any budget.
CLOSED = {"type": "object",
          "properties": {"city": {"enum": ["Paris", "Lyon", "Rome"]},
                         "continent": SCHEMA["properties"]["continent"]},
          "required": ["city", "continent"]}
MSG = [{"role": "user", "content": "What is the capital of France? Answer in JSON."}]


def _chat(server, **body) -> httpx.Response:
    return httpx.post(server.base_url + "/v1/chat/completions", timeout=300,
                      json={"model": M, "messages": MSG, "max_tokens": 64, **body},
                      headers=server.headers)


def _content(r: httpx.Response) -> str:
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "stop", ("the value did not end within max_tokens", choice)
    return choice["message"]["content"]


def test_json_schema_answers_follow_the_schema(server):
    closed = {"type": "json_schema", "json_schema": {"name": "capital", "schema": CLOSED}}
    for schema, fmt, temperature in ((SCHEMA, FORMAT, 0), (CLOSED, closed, 0.8)):
        answer = json.loads(_content(_chat(server, response_format=fmt, temperature=temperature)))
        jsonschema.validate(answer, schema)


def test_json_object_answers_are_objects(server):
    assert isinstance(json.loads(_content(_chat(server, temperature=0,
                                                response_format={"type": "json_object"}))), dict)


def test_text_is_the_plain_answer(server):
    def answer(**extra) -> str:
        r = _chat(server, temperature=0, **extra)
        assert r.status_code == 200, r.text
        return r.json()["choices"][0]["message"]["content"]
    assert answer(response_format={"type": "text"}) == answer()


@pytest.mark.parametrize("bad", [{"type": "json_schema", "json_schema": {"name": "x"}},
                                 {"type": "json_schema",
                                  "json_schema": {"name": "x", "schema": {"type": "frob"}}},
                                 {"type": "yaml"}])
def test_a_format_that_is_not_one_is_a_400_before_any_byte(server, bad):
    r = _chat(server, response_format=bad, stream=True)
    assert r.status_code == 400, r.text
    assert "response_format" in json.dumps(r.json()["error"])
