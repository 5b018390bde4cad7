"""Issue 39, tool calls: how the server turns ``tools`` into a JSON-schema request for any
engine and the engine's JSON answer back into OpenAI tool calls (``reference_server/tools.py``).
Over HTTP on every engine: tests/integration/test_tool_calls.py."""

from __future__ import annotations

import json

import jsonschema
import pytest
from pydantic import ValidationError

from reference_server import tools
from reference_server.protocol import ChatCompletionRequest

ADD = {"type": "function", "function": {
    "name": "add", "description": "Add two integers.",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer"},
                                                    "b": {"type": "integer"}},
                   "required": ["a", "b"]}}}
CAPITAL = {"type": "function", "function": {
    "name": "capital", "parameters": {"type": "object",
                                      "properties": {"country": {"type": "string"}},
                                      "required": ["country"]}}}
USER = {"role": "user", "content": "What is 2 + 3?"}


def req(**kw) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({"model": "m", "messages": [USER], **kw})


def schema_of(plan: tools.ToolPlan) -> dict:
    return plan.request.response_format.json_schema.schema_


def test_required_allows_exactly_calls_of_the_given_tools_with_their_arguments():
    plan = tools.plan(req(tools=[ADD, CAPITAL], tool_choice="required"))
    schema = schema_of(plan)
    ok = {"tool_calls": [{"name": "add", "arguments": {"a": 2, "b": 3}},
                         {"name": "capital", "arguments": {"country": "France"}}]}
    jsonschema.validate(ok, schema)
    for bad in ({"tool_calls": []}, {"content": "5"},
                {"tool_calls": [{"name": "mul", "arguments": {"a": 2, "b": 3}}]},
                {"tool_calls": [{"name": "add", "arguments": {"a": "2", "b": 3}}]},
                {"tool_calls": [ok["tool_calls"][0]] * (tools.MAX_PARALLEL_CALLS + 1)}):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, schema)
    # the engine's request: no tools, not streamed, the tools described in a system message
    sent = plan.request
    assert sent.tools is None and sent.tool_choice is None and not sent.stream
    assert (sent.messages[0].role == "system"
            and "add: Add two integers." in sent.messages[0].content)


def test_auto_also_allows_a_plain_answer_and_a_named_tool_one_call_of_it():
    jsonschema.validate({"content": "5"}, schema_of(tools.plan(req(tools=[ADD]))))
    named = schema_of(tools.plan(req(tools=[ADD, CAPITAL], parallel_tool_calls=True,
                                     tool_choice={"type": "function",
                                                  "function": {"name": "capital"}})))
    jsonschema.validate({"tool_calls": [{"name": "capital", "arguments": {"country": "x"}}]}, named)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"tool_calls": [{"name": "add", "arguments": {"a": 1, "b": 2}}]}, named)
    one = schema_of(tools.plan(req(tools=[ADD], tool_choice="required", parallel_tool_calls=False)))
    assert one["properties"]["tool_calls"]["maxItems"] == 1


def test_no_tools_is_no_plan_and_impossible_choices_are_refused():
    assert tools.plan(req()) is None and tools.plan(req(tools=[], tool_choice="none")) is None
    for kw, param in [({"tool_choice": "required"}, "tool_choice"),
                      ({"tools": [ADD], "tool_choice": {"type": "function",
                                                        "function": {"name": "mul"}}},
                                                        "tool_choice"),
                      ({"tools": [ADD], "response_format": {"type": "json_object"}},
                       "response_format")]:
        with pytest.raises(tools.ToolError) as e:
            tools.plan(req(**kw))
        assert e.value.param == param
    for bad in ([{"type": "function", "function": {"name": "has space"}}],
                [{"type": "function", "function": {"name": "f", "parameters": {"type": "frob"}}}],
                [{"type": "retrieval"}]):
        with pytest.raises(ValidationError):
            req(tools=bad)


def test_a_conversation_with_calls_and_results_is_sent_as_text():
    history = [USER,
               {"role": "assistant", "content": None, "tool_calls": [
                   {"id": "call_1", "type": "function",
                    "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}}]},
               {"role": "tool", "tool_call_id": "call_1", "content": "5"}]
    plan = tools.plan(ChatCompletionRequest.model_validate(
        {"model": "m", "messages": history, "tools": [ADD], "tool_choice": "none"}))
    sent = [m.model_dump(exclude_none=True) for m in plan.request.messages]
    assert sent == [USER, {"role": "assistant",
                           "content": '{"tool_calls":[{"name":"add","arguments":{"a":2,"b":3}}]}'},
                    {"role": "tool", "content": "5"}]
    assert plan.request.response_format is None       # "none": a plain answer,
    kept = ChatCompletionRequest.model_validate(
        {"model": "m", "messages": history, "tool_choice": "none", "ignore_eos": True})
    assert tools.plan(kept).request.ignore_eos is True     # nothing the client set is lost
    text = {"choices": [{"message": {"role": "assistant", "content": '{"tool_calls": []}'}}]}
    assert plan.answer(text) == text                   # even one that looks like a call
    # fields the conversion does not consume stay, for the engine to use or refuse by name
    named = [{**USER, "name": "bob"}, *history[1:]]
    sent = tools.plan(ChatCompletionRequest.model_validate(
        {"model": "m", "messages": named, "tools": [ADD]})).request.messages
    assert sent[1].model_extra == {"name": "bob"} or sent[1].model_dump()["name"] == "bob"
    # a user message's tool_calls is no tool conversation: left for the engine to refuse
    odd = {"model": "m", "messages": [{**USER, "tool_calls": [{"id": "c1"}]}]}
    assert tools.plan(ChatCompletionRequest.model_validate(odd)) is None
    bad = [USER, {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function"}]}]
    with pytest.raises(tools.ToolError) as e:
        tools.plan(ChatCompletionRequest.model_validate({"model": "m", "messages": bad}))
    assert e.value.param == "messages[1].tool_calls"


def test_the_engines_json_becomes_tool_calls_or_content():
    plan = tools.plan(req(tools=[ADD]))
    calls = {"tool_calls": [{"name": "add", "arguments": {"a": 2, "b": 3}}]}
    response = {"id": "x", "created": 1, "model": "m", "usage": {"total_tokens": 9},
                "choices": [{"index": 0, "finish_reason": "stop",
                             "message": {"role": "assistant", "content": json.dumps(calls)}},
                            {"index": 1, "finish_reason": "stop",
                             "message": {"role": "assistant", "content": '{"content": "five"}'}},
                            {"index": 2, "finish_reason": "length",
                             "message": {"role": "assistant", "content": '{"tool_calls": [{"na'}}]}
    out = plan.answer(response)["choices"]
    (call,) = out[0]["message"]["tool_calls"]
    assert out[0]["finish_reason"] == "tool_calls" and out[0]["message"]["content"] is None
    assert call["function"] == {"name": "add", "arguments": '{"a":2,"b":3}'}
    assert call["id"].startswith("call_") and call["type"] == "function"
    assert out[1]["message"]["content"] == "five" and out[1]["finish_reason"] == "stop"
    assert (out[2]["message"]["content"] == '{"tool_calls": [{"na'
            and out[2]["finish_reason"] == "length")


ANSWER_TEXT = ('{"tool_calls": [{"name": "add", "arguments": {"a": 2, "b": {"x": "}\\"é"}}}, '
               '{"name": "capital", "arguments": {"country": "France"}}]}')


def _pieces(text: str, size: int) -> list[str]:
    return [text[i:i + size] for i in range(0, len(text), size)]


@pytest.mark.parametrize("size", [1, 3, 7, 1000])
def test_a_streamed_answer_sends_each_call_once_its_name_is_whole_and_its_arguments_as_they_come(
        size):
    state, deltas = tools.Streamed(), []
    for piece in _pieces(ANSWER_TEXT, size):
        deltas += state.feed(piece)
        # a name goes out whole, and no argument text before it has arrived
        for d in deltas:
            for c in d.get("tool_calls", []):
                assert c["function"].get("name", "add") in ("add", "capital")
        sent = "".join(c["function"]["arguments"] for d in deltas for c in d["tool_calls"])
        assert len(sent) <= len(state.text)
    more, reason = state.finish("stop")
    calls: dict[int, dict] = {}
    for d in deltas + more:
        for c in d["tool_calls"]:
            call = calls.setdefault(c["index"], {"arguments": ""})
            call.update({k: v for k, v in c.items() if k not in ("function", "index")})
            call["name"] = c["function"].get("name", call.get("name"))
            call["arguments"] += c["function"]["arguments"]
    assert reason == "tool_calls" and set(calls) == {0, 1}
    assert [c["name"] for c in calls.values()] == ["add", "capital"]
    assert [json.loads(c["arguments"]) for c in calls.values()] == \
        [c["arguments"] for c in json.loads(ANSWER_TEXT)["tool_calls"]]
    assert all(c["id"].startswith("call_") and c["type"] == "function" for c in calls.values())


def test_a_streamed_direct_answer_is_its_text_and_a_cut_one_the_raw_text():
    state = tools.Streamed()
    text = "".join(d["content"] for p in _pieces('{"content": "5, \\u00e9\\n ok"}', 2)
                   for d in state.feed(p))
    assert text == "5, é\n ok" and state.finish("stop") == ([], "stop")
    pair = tools.Streamed()        # a surrogate pair split across pieces decodes as one
    text = "".join(d["content"] for p in _pieces('{"content": "\\ud83d\\ude00!"}', 3)
                   for d in pair.feed(p))
    assert text == "\U0001F600!"
    cut = tools.Streamed()
    assert cut.feed('{"tool_calls": [{"na') == []
    assert cut.finish("length") == ([{"content": '{"tool_calls": [{"na'}], "length")


def test_the_relay_turns_an_engines_chunks_or_sse_bytes_into_calls_and_keeps_usage():
    import asyncio

    def chunk(content, reason=None, **extra):
        return {"id": "x", "object": "chat.completion.chunk", "created": 1, "model": "m",
                "choices": [{"index": 0, "delta": {"content": content, **extra},
                             "finish_reason": reason}]}
    parts = [chunk("", role="assistant")] + [chunk(p) for p in _pieces(ANSWER_TEXT, 5)]
    parts += [chunk("", "stop"), {"id": "x", "choices": [], "usage": {"total_tokens": 9}}]

    class Engine:               # an engine's stream: dicts (local) or SSE bytes (proxied)
        def __init__(self, items):
            self.items, self.closed, self.failed = iter(items), False, False

        def __aiter__(self):
            return self

        async def __anext__(self):
            try:
                return next(self.items)
            except StopIteration:
                raise StopAsyncIteration from None

        async def aclose(self):
            self.closed = True

    sse = b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in parts) + \
        b"data: [DONE]\n\n"
    plan = tools.plan(req(tools=[ADD, CAPITAL], stream=True))
    assert plan.request.stream is True          # the engine streams as the client asked
    for items in (parts, [sse[i:i + 37] for i in range(0, len(sse), 37)]):
        engine = Engine(items)
        relay = plan.relay(engine)

        async def drain(relay=relay):
            out = [c async for c in relay]
            await relay.aclose()
            return out
        out = asyncio.run(drain())
        assert out[0]["choices"][0]["delta"]["role"] == "assistant" and engine.closed
        assert out[-1] == {"id": "x", "choices": [], "usage": {"total_tokens": 9}}
        assert [c["choices"][0]["finish_reason"] for c in out[:-1]][-1] == "tool_calls"
        names = [t["function"].get("name") for c in out[:-1]
                 for t in c["choices"][0]["delta"].get("tool_calls", [])]
        assert [n for n in names if n] == ["add", "capital"]
    none = tools.plan(req(tools=[ADD], tool_choice="none", stream=True))
    engine = Engine(parts)
    assert none.relay(engine) is engine          # no calls asked for: the engine's own stream


def test_arguments_before_the_name_wait_for_the_whole_name():
    state = tools.Streamed()
    text = '{"tool_calls": [{"arguments": {"a": 1, "b": 2}, "name": "add"}]}'
    sent = [d for p in _pieces(text, 2) for d in state.feed(p)]
    names = [c["function"]["name"] for d in sent for c in d["tool_calls"]
             if "name" in c["function"]]
    assert names == ["add"]
    assert json.loads("".join(c["function"]["arguments"] for d in sent
                              for c in d["tool_calls"])) == {"a": 1, "b": 2}
    assert state.finish("stop") == ([], "tool_calls")
