"""Every model call counted and costed, whichever stage or route makes it.

`MeteredLLM` wraps the LLM seam once per pipeline: the rewrite, the routes' final answers and
each turn of the agent loop all go through it, streamed or not, so no caller has to remember
to record a call, and a failed call is counted as one too.

A call cut before its usage arrived is still costed (`estimate_usage`): a stream that ends
without its final delta (the client hung up and the request was cancelled, or the upstream
failed after some text) is charged its prompt plus the text received so far (one that failed
before any text is not: the upstream answered nothing); a completion
cancelled while it waits is charged its prompt (its completion is unknown: the upstream may
bill more than that). Those tokens are counted here, at the tier's prices (the dearest model
of its chain), not reported by the upstream.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Sequence
from contextlib import aclosing
from typing import Protocol

from opentelemetry.trace import SpanKind

from backends.errors import BackendError
from backends.llm.base import (
    LLM,
    Completion,
    Cut,
    LLMCall,
    Message,
    StreamDelta,
    Tier,
    Usage,
    WrappedLLM,
)
from backends.llm.wire import count_tokens, to_wire
from gateway.obs import tracing
from gateway.obs.metrics import Metrics

log = logging.getLogger(__name__)


class Priced(Protocol):
    def prices(self, tier: Tier) -> tuple[float, float]: ...


def estimate_usage(
    llm: Priced, tier: Tier, messages: Sequence[Message], text: str, model: str = ""
) -> Usage:
    """The usage of a call whose upstream never reported it: its prompt plus the completion
    text received so far, at the tier's prices."""
    prompt = count_tokens(model, messages=[to_wire(m) for m in messages])
    completion = count_tokens(model, text=text)
    per_prompt, per_completion = llm.prices(tier)
    return Usage(prompt, completion, prompt * per_prompt + completion * per_completion)


async def settled(
    stream: AsyncIterator[StreamDelta],
    on_done: Callable[[StreamDelta], Awaitable[None]],
    on_cut: Callable[[str, str], None],
    on_failed: Callable[[], None] = lambda: None,
) -> AsyncGenerator[StreamDelta, None]:
    """`stream` relayed, its cost settled once: `on_done` with the final delta, or, cut before
    its usage came (cancelled, closed, failed after some text), `on_cut` with the text so far
    and the model. `on_cut` must not await, so a cancellation cannot lose it. A call that failed
    before any text was not answered: neither is called (`on_failed` is)."""
    parts: list[str] = []
    model = ""
    done = failed = False
    try:
        async for delta in stream:
            if delta.done:
                done = True
                await on_done(delta)
            else:
                parts.append(delta.text)
                model = delta.model or model
            yield delta
    except BackendError:
        failed = True
        on_failed()
        raise
    finally:
        if not done and (parts or not failed):
            on_cut("".join(parts), model)


def _call_span(call: LLMCall) -> tuple[str, dict[str, str]]:
    """A model call's span: its name and what is known before the upstream answers."""
    attributes = {"gen_ai.operation.name": "chat", "querygate.tier": call.tier}
    return f"llm {call.tier}", {**attributes, "querygate.route": call.route}


def _answer_attributes(model: str, usage: Usage) -> dict[str, str | int | float]:
    return {
        "gen_ai.response.model": model,
        "gen_ai.usage.input_tokens": usage.prompt_tokens,
        "gen_ai.usage.output_tokens": usage.completion_tokens,
        "querygate.cost_usd": usage.cost_usd,
    }


class MeteredLLM(WrappedLLM):
    """Each call also a client span of the current one's (`gateway.obs.tracing`), with its
    tier, model, tokens and cost, current while the upstream is asked so the request to it
    carries its `traceparent`."""

    def __init__(self, inner: LLM, metrics: Metrics) -> None:
        super().__init__(inner)
        self._metrics = metrics

    async def complete(self, call: LLMCall) -> Completion:
        # The span's attributes are built only when it records: off, nothing is allocated.
        traced = tracing.recording()
        opened = tracing.child(*_call_span(call), SpanKind.CLIENT) if traced else tracing.UNTRACED
        with opened as span:
            try:
                completion = await self._inner.complete(call)
            except BackendError:
                self._failed(call.tier)
                raise
            except asyncio.CancelledError:
                usage = estimate_usage(self._inner, call.tier, call.messages, "")
                self._cut(call.tier, "-", usage, call.route)
                raise
            if span is not None:
                span.set_attributes(_answer_attributes(completion.model, completion.usage))
        self._answered(call.tier, completion.model, completion.usage, call.route)
        self._bounded(call.tier, completion.cut)
        return completion

    async def stream(self, call: LLMCall) -> AsyncIterator[StreamDelta]:
        traced = tracing.recording()
        span = tracing.detached(*_call_span(call), SpanKind.CLIENT) if traced else None

        async def done(delta: StreamDelta) -> None:
            usage = delta.usage or Usage()
            if span is not None:
                span.set_attributes(_answer_attributes(delta.model, usage))
            self._answered(call.tier, delta.model, usage, call.route)
            self._bounded(call.tier, delta.cut)

        def cut(text: str, model: str) -> None:
            usage = estimate_usage(self._inner, call.tier, call.messages, text, model)
            self._cut(call.tier, model or "-", usage, call.route)

        stream = self._inner.stream(call)
        if span is not None:
            stream = tracing.within(span, stream)
        failed = functools.partial(self._failed, call.tier)
        async with aclosing(settled(stream, done, cut, failed)) as deltas:
            async for delta in deltas:
                yield delta

    def _answered(self, tier: str, model: str, usage: Usage, route: str) -> None:
        m = self._metrics
        m.llm_requests.labels(tier, model, "ok").inc()
        m.llm_tokens.labels(tier, model, "prompt").inc(usage.prompt_tokens)
        m.llm_tokens.labels(tier, model, "completion").inc(usage.completion_tokens)
        m.llm_cost.labels(tier, model, route).inc(usage.cost_usd)

    def _bounded(self, tier: str, cut: Cut | None) -> None:
        """A reply cut at its bound (`backends.llm.bounds`): "bytes" or "tokens"."""
        if cut is not None:
            self._metrics.llm_replies_cut.labels(tier, cut).inc()

    def _cut(self, tier: str, model: str, usage: Usage, route: str) -> None:
        """A call that ended without its usage: its estimated tokens and cost (its outcome,
        if it failed, is counted by `_failed`)."""
        m = self._metrics
        m.llm_tokens.labels(tier, model, "prompt").inc(usage.prompt_tokens)
        m.llm_tokens.labels(tier, model, "completion").inc(usage.completion_tokens)
        m.llm_cost.labels(tier, model, route).inc(usage.cost_usd)

    def _failed(self, tier: str) -> None:
        # Which model failed last is the tier's business; "-" keeps the label set bounded.
        self._metrics.llm_requests.labels(tier, "-", "error").inc()
