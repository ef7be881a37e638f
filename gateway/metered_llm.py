"""Every model call counted and costed, whichever stage or route makes it.

`MeteredLLM` wraps the LLM seam once per pipeline: the rewrite, the routes' final answers and
each turn of the agent loop all go through it, streamed or not, so no caller has to remember
to record a call, and a failed call is counted as one too.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from backends.errors import BackendError
from backends.llm.base import (
    LLM,
    NO_OPTIONS,
    Completion,
    GenerationOptions,
    Message,
    StreamDelta,
    Tier,
    Usage,
)
from gateway.metrics import Metrics


class MeteredLLM:
    def __init__(self, inner: LLM, metrics: Metrics) -> None:
        self._inner = inner
        self._metrics = metrics

    def has_tier(self, tier: Tier) -> bool:
        return self._inner.has_tier(tier)

    def prices(self, tier: Tier) -> tuple[float, float]:
        return self._inner.prices(tier)

    async def complete(
        self,
        tier: Tier,
        messages: list[Message],
        *,
        tools: list[dict[str, Any]] | None = None,
        max_tokens: int | None = None,
        route: str = "",
        options: GenerationOptions = NO_OPTIONS,
    ) -> Completion:
        try:
            completion = await self._inner.complete(
                tier, messages, tools=tools, max_tokens=max_tokens, route=route, options=options
            )
        except BackendError:
            self._failed(tier)
            raise
        self._answered(tier, completion.model, completion.usage, route)
        return completion

    async def stream(
        self,
        tier: Tier,
        messages: list[Message],
        *,
        max_tokens: int | None = None,
        route: str = "",
        options: GenerationOptions = NO_OPTIONS,
    ) -> AsyncIterator[StreamDelta]:
        try:
            async for delta in self._inner.stream(
                tier, messages, max_tokens=max_tokens, route=route, options=options
            ):
                if delta.done:
                    self._answered(tier, delta.model, delta.usage or Usage(), route)
                yield delta
        except BackendError:
            self._failed(tier)
            raise

    async def warm_up(self) -> None:
        await self._inner.warm_up()

    async def aclose(self) -> None:
        await self._inner.aclose()

    def _answered(self, tier: str, model: str, usage: Usage, route: str) -> None:
        m = self._metrics
        m.llm_requests.labels(tier, model, "ok").inc()
        m.llm_tokens.labels(tier, model, "prompt").inc(usage.prompt_tokens)
        m.llm_tokens.labels(tier, model, "completion").inc(usage.completion_tokens)
        m.llm_cost.labels(tier, model, route).inc(usage.cost_usd)

    def _failed(self, tier: str) -> None:
        # Which model failed last is the tier's business; "-" keeps the label set bounded.
        self._metrics.llm_requests.labels(tier, "-", "error").inc()
