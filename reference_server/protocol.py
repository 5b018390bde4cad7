"""The OpenAI API at the server's edge: the request schema we accept (validated strictly
before any engine sees it), the response shapes we send, and the one error body.

Strict here means: wrong types, unknown roles, empty message lists and out-of-range sampling
values are refused with a clear 400 by the server itself, whatever the engine would have
done with them. Unknown extra fields pass the schema so a proxied engine can answer its own
extensions (vLLM's ``min_tokens``, ...); an in-process engine refuses every field it does not
implement (``unsupported_fields``), so nothing is accepted and silently ignored.

The sampling fields vLLM, SGLang and the in-process engines all implement (``top_k``,
``min_p``, the three penalties, ``logit_bias``) have one range here for every engine, the
narrowest of theirs (``mini_engine/sampler.py`` says where their meanings differ).
"""

from __future__ import annotations

import re
from typing import Any, Generic, Literal, TypeVar, Union

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    field_validator,
    model_validator,
)

# ---- errors ----------------------------------------------------------------------------


class ErrorInfo(BaseModel):
    message: str
    type: str = "invalid_request_error"
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorInfo


def error_body(message: str, type: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict:
    """The one OpenAI error body every part of the server sends."""
    return ErrorResponse(error=ErrorInfo(message=message, type=type, param=param,
                                         code=code)).model_dump()

Role = Literal["system", "developer", "user", "assistant", "tool"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    # name, tool_calls, tool_call_id, ...: passed on to a child engine; a local one refuses them
    model_config = ConfigDict(extra="allow", strict=True)

    role: Role
    content: Union[str, list[TextPart], None] = None


class StreamOptions(_Strict):
    include_usage: StrictBool = False
    continuous_usage_stats: StrictBool = False


class JsonSchemaFormat(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True, populate_by_name=True)

    name: str = Field(min_length=1, max_length=64)
    description: str | None = None
    # "schema" would shadow a BaseModel attribute; the JSON name is "schema", as OpenAI's
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: StrictBool | None = None


def check_json_schema(schema: dict[str, Any], where: str) -> None:
    """ValueError unless ``schema`` is a JSON schema (checked against its meta-schema), so a
    bad one is the same 400 on every engine, whatever its grammar library would have said."""
    import jsonschema
    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as exc:
        raise ValueError(f"{where} is not a valid JSON schema: {exc.message}") from None


class FunctionDef(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)

    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: StrictBool | None = None

    @field_validator("parameters")
    @classmethod
    def _parameters(cls, v):
        if v is not None:
            check_json_schema(v, "parameters")
        return v


class ToolDef(_Strict):
    type: Literal["function"]
    function: FunctionDef


class _FunctionName(_Strict):
    name: str


class NamedToolChoice(_Strict):
    type: Literal["function"]
    function: _FunctionName


class ResponseFormat(BaseModel):
    """OpenAI's ``response_format``; ``structural_tag`` (a vLLM and SGLang extension, more
    fields) is passed on to them, and refused by the in-process engines."""
    model_config = ConfigDict(extra="allow", strict=True)

    type: Literal["text", "json_object", "json_schema", "structural_tag"]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_given(self):
        if self.type != "json_schema":
            return self
        if self.json_schema is None or self.json_schema.schema_ is None:
            raise ValueError('type "json_schema" needs json_schema.schema, a JSON schema object')
        check_json_schema(self.json_schema.schema_, "json_schema.schema")
        return self


# Hard schema bounds; the server's configured limits (max n, max logprobs, sequences per
# request) are checked in ``check_limits`` because they are settings, not part of the API.
Temperature = Field(default=None, ge=0.0, le=2.0)
TopP = Field(default=None, gt=0.0, le=1.0)
Penalty = Field(default=None, ge=-2.0, le=2.0)
# SGLang's range: vLLM takes any r > 0, SGLang only (0, 2]
RepetitionPenalty = Field(default=None, gt=0.0, le=2.0)
MinP = Field(default=None, ge=0.0, le=1.0)
LOGIT_BIAS_LIMIT = 100.0     # OpenAI's range; vLLM clamps to it, we refuse outside it
# vLLM 0.32's rule for cache_salt (vllm/entrypoints/generate/base/protocol.py): one rule for
# every engine; SGLang takes any string, and treats "" as no salt
CACHE_SALT_MAX_CHARS = 128
CACHE_SALT_FORBIDDEN = "@/\\\x00"


class _SamplingFields(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)

    model: str
    max_tokens: StrictInt | None = Field(default=None, ge=1)
    temperature: float | None = Temperature
    top_p: float | None = TopP
    n: StrictInt | None = Field(default=None, ge=1)
    # vLLM's range (a C long); torch would take more, but one rule for every engine
    seed: StrictInt | None = Field(default=None, ge=-2**63, le=2**63 - 1)
    stop: Union[str, list[str], None] = None
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    presence_penalty: float | None = Penalty
    frequency_penalty: float | None = Penalty
    ignore_eos: StrictBool | None = None
    stop_token_ids: list[StrictInt] | None = None
    user: str | None = None
    top_k: StrictInt | None = Field(default=None, ge=-1)   # 0 or -1: every token (vLLM)
    min_p: float | None = MinP
    repetition_penalty: float | None = RepetitionPenalty
    logit_bias: dict[str, float] | None = None             # token id (a string) -> bias
    response_format: ResponseFormat | None = None
    # Prefix-cache namespace: only requests with the same salt reuse each other's cached
    # prompt blocks, so one tenant's time to first token cannot reveal another's prompts.
    cache_salt: str | None = None

    @field_validator("temperature", "top_p", "presence_penalty", "frequency_penalty",
                     "min_p", "repetition_penalty", mode="before")
    @classmethod
    def _number(cls, v):
        # strict mode would refuse an int like 1 for a float field; JSON has one number type
        if isinstance(v, bool):
            raise ValueError("must be a number")
        return float(v) if isinstance(v, int) else v

    @field_validator("top_k")
    @classmethod
    def _top_k(cls, v):
        # SGLang refuses 0 and takes -1 for "all tokens"; vLLM takes both
        return -1 if v == 0 else v

    @field_validator("logit_bias", mode="before")
    @classmethod
    def _logit_bias(cls, v):
        if not isinstance(v, dict):
            return v
        out = {}
        for key, bias in v.items():
            if not isinstance(key, str) or not re.fullmatch(r"\s*-?[0-9]+\s*", key):
                raise ValueError(f"keys must be token ids, got {key!r}")
            if isinstance(bias, bool) or not isinstance(bias, (int, float)) \
                    or not -LOGIT_BIAS_LIMIT <= bias <= LOGIT_BIAS_LIMIT:
                raise ValueError(f"bias of token {key} must be a number in "
                                 f"[-{LOGIT_BIAS_LIMIT:g}, {LOGIT_BIAS_LIMIT:g}], got {bias!r}")
            out[key] = float(bias)
        return out

    @field_validator("cache_salt")
    @classmethod
    def _cache_salt(cls, v):
        if v is None:
            return v
        if not v:
            raise ValueError("Parameter 'cache_salt' must be a non-empty string if provided.")
        if len(v) > CACHE_SALT_MAX_CHARS or any(c in CACHE_SALT_FORBIDDEN for c in v):
            raise ValueError(f"Parameter 'cache_salt' must be at most {CACHE_SALT_MAX_CHARS} "
                             "characters and must not contain '@', '/', '\\', or NUL.")
        return v

    @property
    def logit_bias_ids(self) -> dict[int, float]:
        """``logit_bias`` with integer token ids (negative ones included: the engine says
        they are outside its vocabulary)."""
        return {int(k): b for k, b in (self.logit_bias or {}).items()}

    @field_validator("stop")
    @classmethod
    def _stop(cls, v):
        if isinstance(v, list) and len(v) > 4:
            raise ValueError("at most 4 stop sequences")
        if isinstance(v, list) and any(s == "" for s in v) or v == "":
            raise ValueError("stop sequences must not be empty")
        return v

    @property
    def stop_list(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    @property
    def effective_max_tokens(self) -> int | None:
        return self.max_tokens


class ChatCompletionRequest(_SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: StrictInt | None = Field(default=None, ge=1)
    logprobs: StrictBool | None = None
    top_logprobs: StrictInt | None = Field(default=None, ge=0)
    # served by reference_server.tools on every engine
    tools: list[ToolDef] | None = None
    tool_choice: Union[Literal["none", "auto", "required"], NamedToolChoice, None] = None
    parallel_tool_calls: StrictBool | None = None

    @property
    def effective_max_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    @property
    def num_logprobs(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None

    @property
    def num_prompts(self) -> int:
        return 1          # the whole conversation is one prompt


class CompletionRequest(_SamplingFields):
    prompt: Union[str, list[str], list[StrictInt]]
    logprobs: StrictInt | None = Field(default=None, ge=0)
    echo: StrictBool | None = None

    @field_validator("prompt")
    @classmethod
    def _prompt(cls, v):
        if isinstance(v, list) and not v:
            raise ValueError("prompt must not be empty")
        if isinstance(v, list) and any(isinstance(t, int) and t < 0 for t in v):
            raise ValueError("token ids must be non-negative")
        return v

    @property
    def num_logprobs(self) -> int | None:
        return self.logprobs

    @property
    def num_prompts(self) -> int:
        """A string or one list of token ids is one prompt; a list of strings (or of token-id
        lists) is one prompt per item, each of which the engine runs ``n`` times."""
        p = self.prompt
        return 1 if isinstance(p, str) or isinstance(p[0], int) else len(p)


OpenAIRequest = Union[ChatCompletionRequest, CompletionRequest]


# ---- what an in-process engine implements -----------------------------------------------

# "user" is accepted and ignored, the one such field (docs/reference_server.md, "Every engine gets
# the same answers"): an end-user id for the provider's abuse monitoring, which never reaches the
# model, so ignoring it is all a server without such monitoring can do with it.
_COMMON = {"model", "max_tokens", "temperature", "top_p", "n", "seed", "stop", "stream",
           "stream_options", "ignore_eos", "stop_token_ids", "user", "logprobs",
           "top_k", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty",
           "logit_bias", "response_format", "cache_salt"}
LOCAL_FIELDS = {
    "chat": _COMMON | {"messages", "max_completion_tokens", "top_logprobs"},
    "complete": _COMMON | {"prompt"},
}
# Values that ask for nothing: a client library that always sends them is not refused.
_NEUTRAL: dict[str, tuple] = {
    "echo": (False,), "best_of": (1,),
    "parallel_tool_calls": (False,), "tools": ([],), "tool_choice": ("none",),
}


def unsupported_fields(req: ChatCompletionRequest | CompletionRequest, kind: str) -> list[str]:
    """Fields of ``req`` an in-process engine would ignore: every field outside
    ``LOCAL_FIELDS[kind]`` that the client set to something other than null or a neutral
    value, ``stream_options.continuous_usage_stats`` without ``include_usage`` (vLLM's
    extension: counts in every chunk, which vLLM, and so the local engines, give only with
    ``include_usage``), and any field of a message but ``role`` and ``content``
    (``messages[1].tool_calls``): a message's ``name`` is meant for the model, and the engines
    give it only role and content."""
    values = {**{k: getattr(req, k) for k in req.model_fields_set}, **(req.model_extra or {})}
    out = [k for k, v in values.items() if k not in LOCAL_FIELDS[kind] and v is not None
           and v not in _NEUTRAL.get(k, ())]
    opts = req.stream_options
    if opts is not None and opts.continuous_usage_stats and not opts.include_usage:
        out.append("stream_options.continuous_usage_stats")
    out = sorted(out)
    for i, m in enumerate(getattr(req, "messages", ())):
        out += [f"messages[{i}].{k}" for k, v in (m.model_extra or {}).items()
                if v is not None and v != []]
    return out


# ---- responses -------------------------------------------------------------------------
# Logprob entries stay plain dicts: their layout differs between the two APIs and they are
# built once per token.

class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: dict[str, int] | None = None


class _Choice(BaseModel):
    index: int
    finish_reason: str | None = None
    logprobs: dict[str, Any] | None = None


ChoiceT = TypeVar("ChoiceT", bound=_Choice)


class _Envelope(BaseModel, Generic[ChoiceT]):
    """What every completion, chat completion and streamed chunk carries around its choices;
    each subclass fixes ``object``."""
    id: str
    object: str
    created: int
    model: str
    choices: list[ChoiceT]
    usage: Usage | None = None


class CompletionChoice(_Choice):
    text: str


class CompletionResponse(_Envelope[CompletionChoice]):
    object: Literal["text_completion"] = "text_completion"


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class ChatChoice(_Choice):
    message: AssistantMessage


class ChatCompletionResponse(_Envelope[ChatChoice]):
    object: Literal["chat.completion"] = "chat.completion"


class DeltaMessage(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None


class ChatStreamChoice(_Choice):
    delta: DeltaMessage


class ChatCompletionChunk(_Envelope[ChatStreamChoice]):
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"


class CompletionChunk(_Envelope[CompletionChoice]):
    object: Literal["text_completion"] = "text_completion"


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "llm-inference-workshop"
    root: str
    parent: str | None = None
    max_model_len: int


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


# ---- server limits ---------------------------------------------------------------------

class RequestLimits(BaseModel):
    max_n: int
    max_logprobs: int
    max_sequences_per_request: int     # prompts x n


def check_limits(req: ChatCompletionRequest | CompletionRequest, limits: RequestLimits
                 ) -> tuple[str, str] | None:
    """Return (param, message) for the first configured limit the request breaks, or None."""
    if req.n is not None and req.n > limits.max_n:
        return "n", f"n must be at most {limits.max_n} on this server, got {req.n}"
    prompts, n = req.num_prompts, req.n or 1
    cap = limits.max_sequences_per_request
    if prompts * n > cap:
        # the prompt list alone is too long, or n multiplies it past the cap
        return ("prompt" if prompts > cap else "n",
                f"this request would start {prompts * n} sequences ({prompts} prompt"
                f"{'s' if prompts != 1 else ''} x n={n}); this server starts at most {cap} "
                f"per request")
    k = req.top_logprobs if isinstance(req, ChatCompletionRequest) else req.logprobs
    if k is not None and k > limits.max_logprobs:
        name = "top_logprobs" if isinstance(req, ChatCompletionRequest) else "logprobs"
        return name, f"{name} must be at most {limits.max_logprobs}, got {k}"
    if isinstance(req, ChatCompletionRequest):
        if req.top_logprobs and not req.logprobs:
            return "top_logprobs", "top_logprobs requires logprobs=true"
        if all(not _has_text(m) for m in req.messages):
            return "messages", "every message is empty"
    return None


def _has_text(m: ChatMessage) -> bool:
    if isinstance(m.content, str):
        return bool(m.content.strip())
    if isinstance(m.content, list):
        return any(p.text.strip() for p in m.content)
    return False
