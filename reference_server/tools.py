"""Tool calls on every engine, by constraining the answer to a tool-call schema.

A model calls a tool by writing the call as text; a server turns that text into OpenAI's
``tool_calls``. vLLM and SGLang do it with a parser written for each model family's own
format (``--tool-call-parser hermes``, ``llama3_json``, ...); vLLM refuses ``tool_choice:
"auto"`` without one, and its chat template is what shows the model the tools. The bundled
SmolLM2-135M has neither a parser nor a template that reads ``tools``, so this server does it
the way small-model agent frameworks do, the same on every engine:

1. The tools are described in a system message, and earlier calls and their results are
   written into the conversation as plain text (the chat template never sees ``tools``).
2. The request goes to the engine as an ordinary chat request whose ``response_format`` is a
   JSON schema of the allowed answers, so every engine's grammar (xgrammar in vLLM, SGLang
   and ``mini_engine.grammar``) makes the answer a valid call, whatever the model's size:
   - ``tool_choice: "required"``: ``{"tool_calls": [{"name": ..., "arguments": {...}}, ...]}``
     where each item matches one tool's name and its ``parameters`` schema;
   - a named function: the same, with that tool alone and one call;
   - ``"auto"`` (the default when tools are given): that, or ``{"content": "..."}``.
3. The JSON answer becomes ``message.tool_calls`` (``finish_reason`` "tool_calls") or plain
   ``content``. A stream is answered once the answer is complete (the call must be whole to
   be parsed), as OpenAI-shaped chunks.

``tool_choice: "none"`` sends the conversation without the tools. A constrained answer
drops ``ignore_eos`` (a call ends where its JSON does); every other field goes on as sent.
At most ``MAX_PARALLEL_CALLS`` calls per answer (one with ``parallel_tool_calls: false``), so
a small model cannot spend its whole budget listing calls.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from typing import Any

MAX_PARALLEL_CALLS = 4


class ToolError(ValueError):
    """A request whose tools cannot be served (the server answers 400)."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


def _tool(t) -> dict[str, Any]:
    return t.model_dump(exclude_none=True)["function"]


def call_schema(tools: list[dict[str, Any]], max_calls: int) -> dict[str, Any]:
    """The JSON schema of ``{"tool_calls": [...]}`` with 1 to ``max_calls`` calls of ``tools``."""
    items = [{"type": "object",
              "properties": {"name": {"type": "string", "enum": [t["name"]]},
                             "arguments": t.get("parameters") or {"type": "object"}},
              "required": ["name", "arguments"], "additionalProperties": False}
             for t in tools]
    calls = {"type": "array", "items": items[0] if len(items) == 1 else {"anyOf": items},
             "minItems": 1, "maxItems": max_calls}
    return {"type": "object", "properties": {"tool_calls": calls}, "required": ["tool_calls"],
            "additionalProperties": False}


ANSWER = {"type": "object", "properties": {"content": {"type": "string"}},
          "required": ["content"], "additionalProperties": False}


def describe(tools: list[dict[str, Any]], choice: str) -> str:
    """The system message that tells the model its tools and the answer's shape."""
    lines = ["You can call these tools:"]
    for t in tools:
        params = json.dumps(t.get("parameters") or {"type": "object"}, separators=(",", ":"))
        about = f" {t['description']}" if t.get("description") else ""
        lines.append(f"- {t['name']}:{about} Arguments: {params}")
    shape = '{"tool_calls":[{"name":"<tool>","arguments":{...}}]}'
    lines.append(f"To call tools, answer {shape}." + (
        ' To answer directly, answer {"content":"<your answer>"}.' if choice == "auto" else ""))
    return "\n".join(lines)


def _as_text(message: dict[str, Any], where: str) -> dict[str, Any]:
    """A message of a tool conversation with its calls (assistant) or its call id (tool)
    written as plain content. Any other field stays, for the engine to use or refuse."""
    out = dict(message)
    role, content = out["role"], out.get("content")
    if isinstance(content, list):
        content = "".join(p.get("text", "") for p in content)
    if role == "assistant" and out.get("tool_calls"):
        try:
            calls = [{"name": c["function"]["name"],
                      "arguments": json.loads(c["function"].get("arguments") or "{}")}
                     for c in out.pop("tool_calls")]
        except (KeyError, TypeError, AttributeError, json.JSONDecodeError) as exc:
            raise ToolError(f"{where}.tool_calls: each call needs function.name and "
                            f"function.arguments (a JSON string): {exc}", f"{where}.tool_calls")
        return {**out, "content": json.dumps({"tool_calls": calls}, separators=(",", ":"))}
    if role == "tool":
        out.pop("tool_call_id", None)
    return {**out, "content": content or ""}


@dataclass
class ToolPlan:
    """What the server sends the engine for a request with tools, and how it reads the answer."""
    request: Any               # the engine's request: no tools, a JSON-schema response_format
    stream: bool               # the client asked for a stream (the engine is not streamed)
    include_usage: bool
    calls: bool = True         # False for tool_choice "none": the answer is plain text

    def answer(self, response: dict[str, Any]) -> dict[str, Any]:
        """The engine's JSON answer as OpenAI tool calls (or content), in place."""
        for choice in response.get("choices", []) if self.calls else ():
            message = choice.get("message") or {}
            try:
                parsed = json.loads(message.get("content") or "")
            except json.JSONDecodeError:
                continue       # cut short (finish_reason "length"): the raw text is the answer
            if isinstance(parsed, dict) and "tool_calls" in parsed:
                message["content"] = None
                message["tool_calls"] = [
                    {"id": "call_" + uuid.uuid4().hex[:24], "type": "function",
                     "function": {"name": c["name"],
                                  "arguments": json.dumps(c["arguments"], separators=(",", ":"))}}
                    for c in parsed["tool_calls"]]
                choice["finish_reason"] = "tool_calls"
            elif isinstance(parsed, dict) and "content" in parsed:
                message["content"] = parsed["content"]
        return response

    def chunks(self, response: dict[str, Any]) -> list[dict[str, Any]]:
        """A complete answer as the chunks of a stream: role, then content or tool calls,
        then the finish reason (and usage, if asked for)."""
        base = {"id": response.get("id", "chatcmpl-" + uuid.uuid4().hex),
                "object": "chat.completion.chunk",
                "created": response.get("created", int(time.time())),
                "model": response.get("model", "")}
        out = []
        for choice in response.get("choices", []):
            i, message = choice.get("index", 0), choice.get("message") or {}
            delta: dict[str, Any] = {"role": "assistant", "content": message.get("content")}
            if message.get("tool_calls"):
                delta["tool_calls"] = [{"index": k, **c}
                                       for k, c in enumerate(message["tool_calls"])]
            out.append({**base, "choices": [{"index": i, "delta": delta, "finish_reason": None}]})
            out.append({**base, "choices": [{"index": i, "delta": {},
                                             "finish_reason": choice.get("finish_reason")}]})
        if self.include_usage and response.get("usage"):
            out.append({**base, "choices": [], "usage": response["usage"]})
        return out


def plan(request) -> ToolPlan | None:
    """How to serve a chat request's tools; None when it has none to serve. Raises ToolError
    for a named tool that is not among ``tools``."""
    tools = [_tool(t) for t in request.tools or []]
    choice = request.tool_choice
    if choice is None:
        choice = "auto" if tools else "none"       # OpenAI's defaults
    has_history = any(m.role == "tool" or (m.role == "assistant" and
                                           (m.model_extra or {}).get("tool_calls"))
                      for m in request.messages)
    if not tools and not has_history:
        if not isinstance(choice, str) or choice == "required":
            raise ToolError("tool_choice asks for a tool call, but no tools were given",
                            "tool_choice")
        return None
    if request.response_format is not None and request.response_format.type != "text" \
            and choice != "none":
        raise ToolError("response_format cannot be combined with tools (the answer's shape is "
                        "the tool-call schema); send one of them", "response_format")
    max_calls = 1 if request.parallel_tool_calls is False else MAX_PARALLEL_CALLS
    if not isinstance(choice, str):                      # {"type": "function", "function": {...}}
        name = choice.function.name
        chosen = [t for t in tools if t["name"] == name]
        if not chosen:
            raise ToolError(f"tool_choice names {name!r}, which is not among tools "
                            f"({', '.join(t['name'] for t in tools) or 'none given'})",
                            "tool_choice")
        tools, max_calls, choice = chosen, 1, "required"
    messages = [_as_text(m.model_dump(exclude_none=True), f"messages[{i}]")
                for i, m in enumerate(request.messages)]
    drop = {"tools", "tool_choice", "parallel_tool_calls", "stream", "stream_options", "messages"}
    fields: dict[str, Any] = {}
    if choice != "none":
        # a call ends where its JSON does (a benchmark client sends ignore_eos)
        drop.add("ignore_eos")
        schema = call_schema(tools, max_calls)
        if choice == "auto":
            schema = {"anyOf": [schema, ANSWER]}
        system = {"role": "system", "content": describe(tools, choice)}
        if messages and messages[0]["role"] == "system":
            system["content"] = messages[0]["content"] + "\n\n" + system["content"]
            messages = messages[1:]
        messages = [system, *messages]
        fields["response_format"] = {"type": "json_schema",
                                     "json_schema": {"name": "tool_calls", "schema": schema}}
        drop.add("response_format")
    engine_request = type(request).model_validate(
        {**request.model_dump(exclude_unset=True, by_alias=True, exclude=drop),
         **fields, "messages": messages})
    include_usage = bool(request.stream_options and request.stream_options.include_usage)
    return ToolPlan(engine_request, bool(request.stream), include_usage, calls=choice != "none")
