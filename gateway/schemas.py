"""Request bodies as strict models: wrong types are refused, never coerced."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    field_validator,
)

from gateway.text import clean_text

RequestedRoute = Literal["auto", "direct", "lookup", "multihop"]


def _clean(value: object) -> object:
    # Before the type check, so max_length counts the clean text; a non-string is left for the
    # strict type check to refuse.
    return clean_text(value) if isinstance(value, str) else value


def _not_blank(value: str) -> str:
    if not value.strip():
        raise ValueError("must not be empty")
    return value


# Every text a client sends is one of these: normalised once, here (see gateway/text.py).
CleanStr = Annotated[str, BeforeValidator(_clean)]
NonBlankStr = Annotated[str, BeforeValidator(_clean), AfterValidator(_not_blank)]


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


class ChatMessage(BaseModel):
    # OpenAI clients send fields we do not use (name, tool_call_id, ...): accept and ignore.
    model_config = ConfigDict(strict=True, extra="allow", frozen=True)

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None

    # Cleaned here rather than by the union's str member, so an error names just the field.
    _clean_content = field_validator("content", mode="before")(_clean)

    def text(self) -> str:
        if isinstance(self.content, list):
            return "\n".join(part.text for part in self.content)
        return self.content or ""


class ChatBody(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow", frozen=True)

    model: str
    messages: list[ChatMessage] = Field(min_length=1)
    stream: bool = False
    stream_options: dict[str, Any] | None = None
