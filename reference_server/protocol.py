"""The OpenAI request schema we accept, validated strictly before any engine sees it.

Strict here means: wrong types, unknown roles, empty message lists and out-of-range sampling
values are refused with a clear 400 by the server itself, whatever the engine would have
done with them. Unknown extra fields are allowed and passed on (engines have their own
extensions, e.g. vLLM's ``min_tokens``).
"""

from __future__ import annotations

from typing import Literal, Union

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, field_validator

Role = Literal["system", "developer", "user", "assistant", "tool"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)   # name, tool_calls, tool_call_id...

    role: Role
    content: Union[str, list[TextPart], None] = None


class StreamOptions(_Strict):
    include_usage: StrictBool = False
    continuous_usage_stats: StrictBool = False


# Hard schema bounds; the server's configured limits (max n, max logprobs) are checked in
# ``check_limits`` because they are settings, not part of the API.
Temperature = Field(default=None, ge=0.0, le=2.0)
TopP = Field(default=None, gt=0.0, le=1.0)
Penalty = Field(default=None, ge=-2.0, le=2.0)


class _SamplingFields(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)

    model: str
    max_tokens: StrictInt | None = Field(default=None, ge=1)
    temperature: float | None = Temperature
    top_p: float | None = TopP
    n: StrictInt | None = Field(default=None, ge=1)
    seed: StrictInt | None = None
    stop: Union[str, list[str], None] = None
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    presence_penalty: float | None = Penalty
    frequency_penalty: float | None = Penalty
    ignore_eos: StrictBool | None = None
    stop_token_ids: list[StrictInt] | None = None
    user: str | None = None

    @field_validator("temperature", "top_p", "presence_penalty", "frequency_penalty",
                     mode="before")
    @classmethod
    def _number(cls, v):
        # strict mode would refuse an int like 1 for a float field; JSON has one number type
        if isinstance(v, bool):
            raise ValueError("must be a number")
        return float(v) if isinstance(v, int) else v

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

    @property
    def effective_max_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    @property
    def num_logprobs(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None


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


class RequestLimits(BaseModel):
    max_n: int
    max_logprobs: int


def check_limits(req: ChatCompletionRequest | CompletionRequest, limits: RequestLimits
                 ) -> tuple[str, str] | None:
    """Return (param, message) for the first configured limit the request breaks, or None."""
    if req.n is not None and req.n > limits.max_n:
        return "n", f"n must be at most {limits.max_n} on this server, got {req.n}"
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
