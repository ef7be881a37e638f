"""The LLM seam: a tier name in, text (or tool calls) plus exact usage and cost out.

Tiers are "small" and "large". An implementation owns retries (exactly one retry layer),
fallbacks between a tier's models, timeouts and price accounting; it raises
`backends.errors.BackendUnavailable` when no model of the tier could answer.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from pydantic import BaseModel, Field, field_validator

from backends.sections import SECTION

Tier = Literal["small", "large"]
# Which bound on what is read of a reply cut it (`backends.llm.bounds`).
Cut = Literal["bytes", "tokens"]


def _one_level_schema(schema: dict[str, Any]) -> None:
    """The published schema of `fallbacks`: its items are tiers without fallbacks."""
    one_level = {"properties": {"fallbacks": {"maxItems": 0}}}
    schema["items"] = {"allOf": [schema["items"], one_level]}


class TierConfig(BaseModel):
    """One model tier as configured: a litellm model string plus prices and limits."""

    model_config = SECTION

    model: str = Field(min_length=1, description="litellm model string, e.g. 'openai/gpt-4o-mini'")
    api_base: str | None = None
    api_key_env: str | None = Field(
        default=None, description="name of the environment variable holding the API key"
    )
    input_cost_per_token: float = Field(default=0.0, ge=0)
    output_cost_per_token: float = Field(default=0.0, ge=0)
    timeout_s: float = Field(default=30.0, gt=0)
    max_tokens: int = Field(default=512, gt=0)
    temperature: float = Field(default=0.0, ge=0, le=2)
    retries: int = Field(default=2, ge=0, le=5)
    max_reply_bytes: int = Field(
        default=4 * 1024 * 1024,
        ge=64 * 1024,
        description="the most bytes of one reply read from this model, whatever its token "
        "limit: a reply past it is cut there (finish_reason length, `reply_cut` bytes)",
    )
    reply_token_margin: float = Field(
        default=0.5,
        ge=0,
        le=10,
        description="the share of a call's token limit a reply may pass it by (the gateway's "
        "token count is an estimate) before it is cut (finish_reason length, `reply_cut` tokens)",
    )
    cooldown_after: int = Field(
        default=3,
        ge=0,
        description="consecutive failed calls (each after its retries) that make this model be "
        "skipped for cooldown_s: a tenant's own calls for that tenant alone, any tenants' calls "
        "(from two tenants at least, or the only one seen) for every tenant; 0 never skips it",
    )
    cooldown_s: float = Field(
        default=30.0,
        gt=0,
        description="how long a failing model is skipped before one request may probe it",
    )
    # Tried in order once this model fails. One level only: a fallback listing fallbacks of its
    # own is refused (which of them would come when, after it or after the whole list, is not
    # for the gateway to guess; the tier's list says the order in full).
    fallbacks: tuple[TierConfig, ...] = Field(default=(), json_schema_extra=_one_level_schema)

    @field_validator("fallbacks")
    @classmethod
    def _one_level(cls, value: tuple[TierConfig, ...]) -> tuple[TierConfig, ...]:
        if nested := [f"{n}.fallbacks" for n, fallback in enumerate(value) if fallback.fallbacks]:
            raise ValueError(
                f"{', '.join(nested)}: a fallback's own fallbacks would never be tried; list "
                "every model of the tier in its fallbacks, in the order to try them"
            )
        return value


@dataclass(frozen=True, slots=True)
class Message:
    role: Literal["system", "user", "assistant", "tool"]
    content: str
    tool_call_id: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()


@dataclass(frozen=True, slots=True)
class ToolCall:
    id: str
    name: str
    arguments: dict[str, Any]
    # Why the model's arguments could not be parsed (then `arguments` is empty): the caller
    # tells the model, rather than failing the whole call.
    error: str | None = None
    # The arguments as the model wrote them, for a client that gets its own tool calls back
    # verbatim (None: `arguments` is all there is). Not part of the call's identity.
    raw_arguments: str | None = field(default=None, compare=False)


@dataclass(frozen=True, slots=True)
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            self.prompt_tokens + other.prompt_tokens,
            self.completion_tokens + other.completion_tokens,
            self.cost_usd + other.cost_usd,
        )


@dataclass(frozen=True, slots=True)
class Completion:
    text: str
    tier: Tier
    model: str  # the model that actually answered (after fallbacks)
    usage: Usage
    tool_calls: tuple[ToolCall, ...] = ()
    finish_reason: str = "stop"
    usage_estimated: bool = False  # the upstream reported no usage; tokens were counted here
    # The reply passed its bound (`backends.llm.bounds`) and was cut there.
    cut: Cut | None = None


@dataclass(frozen=True, slots=True)
class GenerationOptions:
    """What a client asked of the call that writes its answer (OpenAI's parameters of that
    name), sent upstream as given. None or empty: the tier's own setting. `max_tokens` caps the
    call's own limit; `tools` are the client's (a caller's own `tools` argument wins)."""

    temperature: float | None = None
    top_p: float | None = None
    max_tokens: int | None = None
    stop: tuple[str, ...] = ()
    seed: int | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    response_format: dict[str, Any] | None = None
    tools: tuple[dict[str, Any], ...] = ()
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None

    def cap(self, max_tokens: int) -> int:
        """The completion limit of a call whose own limit is `max_tokens`."""
        return max_tokens if self.max_tokens is None else min(max_tokens, self.max_tokens)

    def wire(self) -> dict[str, Any]:
        """The parameters set, as an OpenAI request carries them (without max_tokens)."""
        params: dict[str, Any] = {
            "temperature": self.temperature,
            "top_p": self.top_p,
            "seed": self.seed,
            "frequency_penalty": self.frequency_penalty,
            "presence_penalty": self.presence_penalty,
            "response_format": self.response_format,
            "tool_choice": self.tool_choice,
            "parallel_tool_calls": self.parallel_tool_calls,
            "stop": list(self.stop) or None,
            "tools": list(self.tools) or None,
        }
        return {k: v for k, v in params.items() if v is not None}


NO_OPTIONS = GenerationOptions()


@dataclass(frozen=True, slots=True)
class LLMCall:
    """One model call, as every layer of the seam passes it on (metering, budgets, the tiers).

    `route` labels the gateway's metrics. `tenant` is who the call is for: an implementation
    keeps its failure accounting per tenant (a tenant's own failures must not cool a model down
    for the others); the gateway's per-request view of the seam fills it in, so a router never
    names it; "" outside a request (the CLI, benchmarks): one anonymous tenant."""

    tier: Tier
    messages: tuple[Message, ...]
    tools: tuple[dict[str, Any], ...] | None = None
    max_tokens: int | None = None
    route: str = ""
    options: GenerationOptions = NO_OPTIONS
    tenant: str = ""


@dataclass(frozen=True, slots=True)
class StreamDelta:
    """A piece of a streamed answer; the last one has `done=True`, the final usage and what
    the model said besides its text."""

    text: str = ""
    done: bool = False
    usage: Usage | None = None
    model: str = ""
    # The final delta's: why the model stopped ("" when no reason came), whether the body
    # ended (False: neither a finish reason nor the body's own end came, so it may have been
    # cut mid-answer), whether its usage was estimated, and the tool calls the model made
    # (the client's, on the direct route).
    finish_reason: str = ""
    ended: bool = True
    usage_estimated: bool = False
    tool_calls: tuple[ToolCall, ...] = ()
    cut: Cut | None = None  # as `Completion.cut`


class LLM(Protocol):
    def has_tier(self, tier: Tier) -> bool:
        """Whether a model is configured for this tier (no model: generation is off)."""
        ...

    def prices(self, tier: Tier) -> tuple[float, float]:
        """USD per (prompt, completion) token: the dearest model of the tier's chain, so a
        budget projected with it holds whichever model answers."""
        ...

    async def complete(self, call: LLMCall) -> Completion: ...

    def stream(self, call: LLMCall) -> AsyncIterator[StreamDelta]:
        """Deltas of the answer; usage comes with the final delta (usage chunk requested), with
        the tool calls the model made, whole, in its `tool_calls`."""
        ...

    async def warm_up(self) -> None:
        """Pay the first call's one-off costs (imports, tokenizers) before traffic arrives."""
        ...

    async def aclose(self) -> None: ...


class WrappedLLM:
    """An `LLM` around another, for wrappers that change only `complete` and `stream` (metering,
    budgets, timing): the rest passes through."""

    def __init__(self, inner: LLM) -> None:
        self._inner = inner

    def has_tier(self, tier: Tier) -> bool:
        return self._inner.has_tier(tier)

    def prices(self, tier: Tier) -> tuple[float, float]:
        return self._inner.prices(tier)

    async def warm_up(self) -> None:
        await self._inner.warm_up()

    async def aclose(self) -> None:
        await self._inner.aclose()
