"""`FakeLLM`: the LLM seam (backends/llm/base.py) in memory, as httpx's MockTransport is a
transport: a handler decides each call's reply, and every call is recorded for the test to read.

The handler gets the `Call` and returns the answer's text (or a whole `Completion`), or raises
what the tiers raise (`backends.errors.BackendUnavailable` when no model could answer). A stream
is the same reply cut into words, its usage and finish reason on the last delta.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from backends.llm.base import (
    Completion,
    GenerationOptions,
    LLMCall,
    Message,
    StreamDelta,
    Tier,
    Usage,
)

PRICES = (1e-6, 2e-6)  # USD per prompt, completion token: the suite's configured tiers'


@dataclass(frozen=True, slots=True)
class Call:
    """One call as the seam received it, with the tenant it was made for."""

    tier: Tier
    messages: tuple[Message, ...]
    tools: tuple[dict[str, Any], ...] | None
    max_tokens: int | None
    route: str
    options: GenerationOptions
    tenant: str
    stream: bool

    @property
    def prompt(self) -> str:
        """The last message's text: the question or tool result the call answers."""
        return self.messages[-1].content if self.messages else ""


Reply = str | Completion
Handler = Callable[[Call], Reply | Awaitable[Reply]]


def echo(call: Call) -> str:
    """The default reply: the call's last message back."""
    return f"echo: {call.prompt}"


class FakeLLM:
    def __init__(self, handler: Handler = echo, tiers: tuple[Tier, ...] = ("small", "large")):
        self.handler = handler
        self.tiers = tiers
        self.calls: list[Call] = []

    def has_tier(self, tier: Tier) -> bool:
        return tier in self.tiers

    def prices(self, tier: Tier) -> tuple[float, float]:
        return PRICES

    async def complete(self, call: LLMCall) -> Completion:
        return await self._reply(call, stream=False)

    async def stream(self, call: LLMCall) -> AsyncIterator[StreamDelta]:
        done = await self._reply(call, stream=True)
        for i, word in enumerate(done.text.split(" ")):
            yield StreamDelta(text=f" {word}" if i else word, model=done.model)
        yield StreamDelta(
            done=True,
            usage=done.usage,
            model=done.model,
            finish_reason=done.finish_reason,
            tool_calls=done.tool_calls,
        )

    async def warm_up(self) -> None:
        return None

    async def aclose(self) -> None:
        return None

    async def _reply(self, llm_call: LLMCall, *, stream: bool) -> Completion:
        c = llm_call
        call = Call(c.tier, c.messages, c.tools, c.max_tokens, c.route, c.options, c.tenant, stream)
        self.calls.append(call)
        reply = self.handler(call)
        if isinstance(reply, Awaitable):
            reply = await reply
        return reply if isinstance(reply, Completion) else completion(call, reply)


def completion(call: Call, text: str) -> Completion:
    """`text` as the model of `call`'s tier answered it: a token a word, priced at PRICES."""
    prompt = sum(len(m.content.split()) for m in call.messages)
    answer = len(text.split())
    usage = Usage(prompt, answer, prompt * PRICES[0] + answer * PRICES[1])
    return Completion(text, call.tier, f"fake-{call.tier}", usage)
