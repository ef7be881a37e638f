"""Request bodies as strict models: wrong types are refused, never coerced."""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)

from gateway.text import clean_text, is_blank

RequestedRoute = Literal["auto", "direct", "lookup", "multihop"]
# Texts one /v1/embeddings request may carry (OpenAI's limit is 2048; the body limit, 64 KiB by
# default, binds first for texts of any length).
MAX_EMBEDDING_INPUTS = 256


def _clean(value: object) -> object:
    # Before the type check, so max_length counts the clean text; a non-string is left for the
    # strict type check to refuse.
    return clean_text(value) if isinstance(value, str) else value


def _not_blank(value: str) -> str:
    if is_blank(value):  # invisible characters alone are blank too
        raise ValueError("must not be empty")
    return value


def _finite(value: dict[str, Any]) -> dict[str, Any]:
    """A JSON object passed on to the model as sent: `load_json` refuses NaN and Infinity, but
    a number past a float's range (`1e999`) parses as infinity, which the upstream would get
    as the non-standard token `Infinity` (a provider's 400, after every fallback is tried)."""
    stack: list[object] = [value]
    while stack:  # no recursion: load_json already bounds the nesting, this need not
        item = stack.pop()
        if isinstance(item, float) and not math.isfinite(item):
            raise ValueError("a number is out of range (a JSON number must be finite)")
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return value


def _integral(value: object) -> object:
    """JSON has one number type: `5.0` is the integer 5 (JSON Schema's `integer` says so too),
    so an integral float is taken as that integer; `5.5`, a string or a bool is left for the
    strict type check to refuse."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


# An integer as JSON writes it: `5` or `5.0`.
JsonInt = Annotated[int, BeforeValidator(_integral)]

# A client's JSON object that goes to the model as it is (a tool's parameters, a schema).
FiniteObject = Annotated[dict[str, Any], AfterValidator(_finite)]


def sent_at_most(limit: int) -> BeforeValidator:
    """At most `limit` characters as sent, before cleaning (a before-validator listed after
    `_clean` runs first): JSON Schema's `maxLength` counts those, so the document can state it."""

    def check(value: object) -> object:
        if isinstance(value, str) and len(value) > limit:
            raise ValueError(f"at most {limit} characters")
        return value

    return BeforeValidator(check)


# Every text a client sends is one of these: normalised once, here (see gateway/text.py).
CleanStr = Annotated[str, BeforeValidator(_clean)]
NonBlankStr = Annotated[str, BeforeValidator(_clean), AfterValidator(_not_blank)]
# Who the end user is, for the log line (never a metric label).
EndUser = Annotated[str, BeforeValidator(_clean), sent_at_most(256)]


class HistoryMessage(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    role: Literal["system", "user", "assistant"]
    content: CleanStr


class RouteBody(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    query: NonBlankStr
    route: RequestedRoute = "auto"


class QueryBody(RouteBody):
    history: list[HistoryMessage] = Field(default_factory=list)
    stream: bool = False
    debug: bool = False


class TextPart(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow", frozen=True)

    type: Literal["text"]
    text: CleanStr


class CalledFunction(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    name: str
    arguments: str


class MessageToolCall(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    id: str
    type: Literal["function"]
    function: CalledFunction


class ChatMessage(BaseModel):
    # OpenAI clients send fields we do not use (name, refusal, ...): accept and ignore.
    model_config = ConfigDict(strict=True, extra="allow", frozen=True)

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    # An assistant's calls of the client's tools, and a tool message's answer to one of them.
    tool_calls: list[MessageToolCall] | None = None
    tool_call_id: str | None = None

    # Cleaned here rather than by the union's str member, so an error names just the field.
    _clean_content = field_validator("content", mode="before")(_clean)

    def text(self) -> str:
        if isinstance(self.content, list):
            return "\n".join(part.text for part in self.content)
        return self.content or ""


class StreamOptions(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow", frozen=True)

    include_usage: bool = False


class FunctionSpec(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: str | None = None
    parameters: FiniteObject | None = None
    strict: bool | None = None


class ToolSpec(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    type: Literal["function"]
    function: FunctionSpec


class NamedFunction(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    name: str


class NamedToolChoice(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    type: Literal["function"]
    function: NamedFunction


class ResponseFormat(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    type: Literal["text", "json_object", "json_schema"]
    # {"name", "schema"?, "strict"?, "description"?}, as OpenAI takes it (type json_schema).
    json_schema: FiniteObject | None = None

    @model_validator(mode="after")
    def _schema_with_its_type(self) -> ResponseFormat:
        if (self.type == "json_schema") != (self.json_schema is not None):
            raise ValueError("json_schema is required with type json_schema, and only with it")
        if self.json_schema is not None and not isinstance(self.json_schema.get("name"), str):
            raise ValueError("json_schema.name must be a string")
        return self


class GenerationBody(BaseModel):
    """What OpenAI's chat and completion requests share. The parameters declared here are
    honoured (see gateway/http/chat_params.py for where); any other one is refused there with
    400 naming it, unless it is at the value that asks for nothing (`n: 1`, ...)."""

    model_config = ConfigDict(strict=True, extra="allow", frozen=True)

    model: str
    stream: bool = False
    stream_options: StreamOptions | None = None
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, ge=0, le=1)
    max_tokens: JsonInt | None = Field(default=None, ge=1)
    stop: str | list[str] | None = None
    seed: JsonInt | None = None
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2)
    presence_penalty: float | None = Field(default=None, ge=-2, le=2)
    user: EndUser | None = None

    @field_validator("stop")
    @classmethod
    def _up_to_four(cls, value: str | list[str] | None) -> str | list[str] | None:
        if isinstance(value, list) and not 1 <= len(value) <= 4:
            raise ValueError("at most 4 stop sequences, and at least one in a list")
        return value

    def end_user(self) -> str | None:
        return self.user


class ChatBody(GenerationBody):
    """OpenAI's chat completion request."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: JsonInt | None = Field(default=None, ge=1)
    response_format: ResponseFormat | None = None
    tools: list[ToolSpec] | None = Field(default=None, max_length=128)
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    safety_identifier: EndUser | None = None

    def end_user(self) -> str | None:
        return self.user or self.safety_identifier


class CompletionBody(GenerationBody):
    """OpenAI's (legacy) text completion request: the prompt is asked as one user message. A
    list holds exactly one prompt (one choice is written per request); token arrays are not
    text and are refused by the strict type check."""

    prompt: NonBlankStr | Annotated[list[NonBlankStr], Field(min_length=1, max_length=1)]

    def text(self) -> str:
        return self.prompt if isinstance(self.prompt, str) else self.prompt[0]


class EmbeddingBody(BaseModel):
    """OpenAI's embeddings request, served by the gateway's own embedder."""

    model_config = ConfigDict(strict=True, extra="allow", frozen=True)

    model: str
    input: (
        NonBlankStr
        | Annotated[list[NonBlankStr], Field(min_length=1, max_length=MAX_EMBEDDING_INPUTS)]
    )
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: JsonInt | None = Field(default=None, ge=1)
    user: EndUser | None = None

    def texts(self) -> list[str]:
        return [self.input] if isinstance(self.input, str) else list(self.input)
