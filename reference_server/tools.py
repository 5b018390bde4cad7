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
   ``content``. A stream is read as it grows (``Streamed``): a call's name goes out once it is
   whole, its arguments as their JSON text arrives, as OpenAI streams them; a direct answer's
   text as it arrives.

``tool_choice: "none"`` sends the conversation without the tools. A constrained answer
drops ``ignore_eos`` (a call ends where its JSON does); every other field goes on as sent.
At most ``MAX_PARALLEL_CALLS`` calls per answer (one with ``parallel_tool_calls: false``), so
a small model cannot spend its whole budget listing calls.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

MAX_PARALLEL_CALLS = 4


class ToolError(ValueError):
    """A request whose tools cannot be served (the server answers 400)."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


def _call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


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
                    {"id": _call_id(), "type": "function",
                     "function": {"name": c["name"],
                                  "arguments": json.dumps(c["arguments"], separators=(",", ":"))}}
                    for c in parsed["tool_calls"]]
                choice["finish_reason"] = "tool_calls"
            elif isinstance(parsed, dict) and "content" in parsed:
                message["content"] = parsed["content"]
        return response

    def relay(self, stream: Any) -> Any:
        """The engine's stream of the JSON answer, as a stream of tool calls or content."""
        return _CallRelay(stream) if self.calls else stream


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
    drop = {"tools", "tool_choice", "parallel_tool_calls", "messages"}
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
    return ToolPlan(engine_request, calls=choice != "none")


# ---------------------------------------------------------------------------------------------
# Streams: the constrained JSON read as it grows
# ---------------------------------------------------------------------------------------------

def _string(text: str, i: int) -> tuple[str, int, bool]:
    """The JSON string starting at ``text[i]`` (a quote): its decoded text so far, the index
    after what was read, and whether it is closed. An escape not yet whole is left unread."""
    out, j, n = [], i + 1, len(text)
    while j < n:
        c = text[j]
        if c == '"':
            return "".join(out), j + 1, True
        if c != "\\":
            out.append(c)
            j += 1
            continue
        end = j + 6 if text[j + 1:j + 2] == "u" else j + 2
        # a high surrogate waits for its pair: the two decode together
        if end == j + 6 and text[j + 2:j + 4].lower() in ("d8", "d9", "da", "db"):
            end = j + 12
        if end > n:
            break
        try:
            out.append(json.loads('"' + text[j:end] + '"'))
        except json.JSONDecodeError:        # no pair after all: the one escape alone
            end = j + 6
            out.append(json.loads('"' + text[j:end] + '"'))
        j = end
    return "".join(out), j, False


@dataclass
class _Call:
    name: str | None = None
    args_start: int | None = None      # where the arguments' JSON text begins in the answer
    args_end: int | None = None


def scan(text: str) -> tuple[str | None, str, list[_Call]]:
    """What a prefix of a constrained answer already says: its kind (the first key:
    ``"tool_calls"`` or ``"content"``, None until it is whole), the direct answer's text so
    far, and the calls begun (a name once it is whole, where the arguments' text lies)."""
    stack: list[list] = []           # [kind "o" or "a", the key being read in an object]
    expect_key, kind, content, calls = False, None, "", []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == '"':
            value, i, whole = _string(text, i)
            if expect_key:
                if not whole:
                    break
                stack[-1][1], expect_key = value, False
                if len(stack) == 1 and kind is None:
                    kind = value
            elif len(stack) == 1 and stack[0][1] == "content":
                content = value
            elif (len(stack) == 3 and kind == "tool_calls" and stack[2][1] == "name" and whole
                  and calls):
                calls[-1].name = value
            if not whole:
                break
            continue
        if c in "{[":
            if len(stack) == 2 and kind == "tool_calls" and c == "{":
                calls.append(_Call())
            elif len(stack) == 3 and kind == "tool_calls" and stack[2][1] == "arguments" \
                    and calls and calls[-1].args_start is None:
                calls[-1].args_start = i
            stack.append(["o" if c == "{" else "a", None])
            expect_key = c == "{"
        elif c in "}]":
            if stack:
                stack.pop()
            if len(stack) == 3 and kind == "tool_calls" and stack[2][1] == "arguments" \
                    and calls:
                calls[-1].args_end = i + 1
            expect_key = False
        elif c == ",":
            expect_key = bool(stack) and stack[-1][0] == "o"
        elif c == ":":
            expect_key = False
        i += 1
    return kind, content, calls


class Streamed:
    """One choice of a streamed constrained answer, turned into OpenAI deltas as it grows."""

    def __init__(self) -> None:
        self.text = ""
        self.sent_content = 0
        self.sent_calls: list[int] = []     # per call begun: characters of arguments sent

    def feed(self, piece: str) -> list[dict[str, Any]]:
        """Deltas for the answer grown by ``piece``."""
        self.text += piece
        kind, content, calls = scan(self.text)
        out: list[dict[str, Any]] = []
        if kind == "content" and len(content) > self.sent_content:
            out.append({"content": content[self.sent_content:]})
            self.sent_content = len(content)
        for k, call in enumerate(calls):
            if call.name is None or call.args_start is None:
                continue            # a call goes out once its name is whole and its arguments begun
            if k == len(self.sent_calls):
                self.sent_calls.append(0)
                out.append({"tool_calls": [{"index": k, "id": _call_id(),
                                            "type": "function",
                                            "function": {"name": call.name, "arguments": ""}}]})
            args = self.text[call.args_start:call.args_end or len(self.text)]
            if len(args) > self.sent_calls[k]:
                out.append({"tool_calls": [{"index": k,
                                            "function": {"arguments": args[self.sent_calls[k]:]}}]})
                self.sent_calls[k] = len(args)
        return out

    def finish(self, reason: str | None) -> tuple[list[dict[str, Any]], str | None]:
        """Deltas still owed at the end, and the finish reason to report."""
        try:
            whole = json.loads(self.text)
        except json.JSONDecodeError:
            whole = None
        if isinstance(whole, dict) and "tool_calls" in whole and self.sent_calls:
            return [], "tool_calls"
        if not self.sent_calls and not self.sent_content and self.text:
            # not an answer of either shape (cut short): the raw text is the answer
            return [{"content": self.text}], reason
        return [], reason


class _CallRelay:
    """An engine's stream (its SSE bytes, or chunk dicts) as chunks of tool calls or content.
    A class, so that ``failed`` (a proxied engine's own error event) and ``aclose`` reach the
    engine's stream."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream
        self.choices: dict[int, Streamed] = {}
        self._buffer = b""
        self._pending: list[dict[str, Any]] = []

    @property
    def failed(self) -> bool:
        return getattr(self.stream, "failed", False)

    def __aiter__(self):
        return self

    async def __anext__(self) -> dict[str, Any]:
        while not self._pending:
            item = await self.stream.__anext__()      # StopAsyncIteration ends this one too
            for event in self._events(item):
                self._pending.extend(self._convert(event))
        return self._pending.pop(0)

    def _events(self, item: Any) -> list[dict[str, Any]]:
        if not isinstance(item, bytes):
            return [item]
        self._buffer += item
        *whole, self._buffer = self._buffer.split(b"\n\n")
        out = []
        for event in whole:
            for line in event.splitlines():
                if line.startswith(b"data:") and line[5:].strip() != b"[DONE]":
                    out.append(json.loads(line[5:]))
        return out

    def _convert(self, chunk: dict[str, Any]) -> list[dict[str, Any]]:
        if not chunk.get("choices"):
            return [chunk]         # usage, or an error event: as it came
        out = []
        for choice in chunk["choices"]:
            state = self.choices.setdefault(choice.get("index", 0), Streamed())
            delta = choice.get("delta") or {}
            deltas = state.feed(delta.get("content") or "")
            reason = choice.get("finish_reason")
            if reason is not None:
                more, reason = state.finish(reason)
                deltas += more
            if "role" in delta:
                deltas = [{"role": delta["role"], **(deltas[0] if deltas else {})}, *deltas[1:]]
            for k, d in enumerate(deltas or [{}]):
                last = k == max(len(deltas), 1) - 1
                out.append({**chunk, "choices": [{"index": choice.get("index", 0), "delta": d,
                                                  "finish_reason": reason if last else None}]})
        return [c for c in out if c["choices"][0]["delta"] or c["choices"][0]["finish_reason"]]

    async def aclose(self) -> None:
        await self.stream.aclose()
