"""Finishing a prepared request: the final model call, whole or streamed, then the result.

`complete` and `stream` both end in `routers.generation.finish`, so an answer is built the
same way whichever path wrote it; then `conclude` stores it (the cache's policy permitting),
counts it and writes its log fields.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import AsyncIterator, Sequence
from dataclasses import replace

from backends.errors import BackendError, BackendUnavailable
from backends.llm.base import LLM, Completion, LLMCall, Message, StreamDelta, Tier, Usage
from gateway.cache.stages import CacheStages
from gateway.core.request import RequestContext
from gateway.core.result import QueryResult, rewrite_fields
from gateway.core.services import Services
from gateway.limits.metering import estimate_usage
from routers.generation import CitationStream, clients_fault, finish, usage_total, with_usage
from routers.types import Answer, Generation

log = logging.getLogger(__name__)


class Finisher:
    def __init__(self, services: Services, cache: CacheStages, config_version: str) -> None:
        self._s = services
        self._cache = cache
        self._version = config_version

    async def complete(self, ctx: RequestContext) -> QueryResult:
        outcome = ctx.outcome
        assert outcome is not None
        if isinstance(outcome, Generation):
            with ctx.timer.stage("generate"):
                try:
                    async with asyncio.timeout(outcome.timeout_s):
                        completion = await ctx.llm.complete(_llm_call(outcome))
                except TimeoutError:
                    outcome = self._fallback(outcome)
                except BackendError as failure:
                    outcome = _on_failure(outcome, failure)
                else:
                    outcome = finish(outcome, completion)
        return await self._conclude(ctx, outcome)

    async def stream(self, ctx: RequestContext) -> AsyncIterator[str | QueryResult]:
        """Text deltas as the model writes them (a cached answer replayed in pieces), then the
        QueryResult. The answer is stored only once the stream has completed."""
        outcome = ctx.outcome
        assert outcome is not None
        if isinstance(outcome, Generation):
            answer: Answer | None = None
            parts: list[str] = []
            shown: list[str] = []
            cited = CitationStream(outcome)  # the deltas' citations rewritten as finish's are
            with ctx.timer.stage("generate"):
                try:
                    async for delta in self._timed_stream(ctx.llm, outcome):
                        if delta.done:
                            answer = finish(outcome, _streamed_completion(outcome, parts, delta))
                            if not delta.ended:
                                # No finish_reason nor [DONE]: the body stopped, maybe mid-answer.
                                # Served as it came, never stored as a whole answer.
                                answer = replace(answer, complete=False)
                            if rest := cited.flush():
                                shown.append(rest)
                                yield rest
                            # What finish added (a note on dropped citations, "the documents do
                            # not say" for no text): the client reads what a complete answer says.
                            if tail := _beyond(answer.text, "".join(shown)):
                                yield tail
                        elif delta.text:
                            parts.append(delta.text)
                            if piece := cited.feed(delta.text):
                                shown.append(piece)
                                yield piece
                except BackendError as failure:
                    if parts:  # the client has part of an answer: it cannot be replaced
                        raise
                    answer = _on_failure(outcome, failure)
                    yield answer.text
            if answer is None:  # the generation's deadline came before any text
                answer = self._fallback(outcome)
                yield answer.text
        elif ctx.cache.tier != "miss":
            answer = outcome
            for piece in replay_pieces(answer.text):
                yield piece
        else:
            answer = outcome
            yield answer.text
        yield await self._conclude(ctx, answer)

    def cut_usage(self, tier: Tier, messages: Sequence[Message]) -> Usage:
        """A call cut before any text, as `MeteredLLM` and the budgets charged it."""
        return estimate_usage(self._s.llm, tier, messages, "")

    async def _timed_stream(self, llm: LLM, generation: Generation) -> AsyncIterator[StreamDelta]:
        """The stream under the generation's own deadline, applied to fetching each delta,
        never around the consumer's write to a slow client. Past the deadline before any text
        the stream just ends (the caller falls back); after some text it fails."""
        loop = asyncio.get_running_loop()
        when = None if generation.timeout_s is None else loop.time() + generation.timeout_s
        chunks = aiter(llm.stream(_llm_call(generation)))
        sent = False
        try:
            while True:
                try:
                    async with asyncio.timeout_at(when):
                        delta = await anext(chunks)
                except StopAsyncIteration:
                    return
                except TimeoutError as err:
                    if sent:
                        raise BackendUnavailable("llm", "the agent's deadline passed") from err
                    return
                sent = sent or bool(delta.text)
                yield delta
        finally:
            await chunks.aclose()  # type: ignore[attr-defined]  # an async generator

    def _fallback(self, generation: Generation) -> Answer:
        """`_fallback`, with the final call the deadline cut counted in its usage."""
        answer = _fallback(generation)
        cut = self.cut_usage(generation.tier, generation.messages)
        usage = with_usage(answer.usage_by_tier, {generation.tier: cut})
        return replace(answer, usage_by_tier=usage, usage_estimated=True)

    async def _conclude(self, ctx: RequestContext, answer: Answer) -> QueryResult:
        reason = "; ".join((ctx.route_reason, *answer.notes))
        answer = replace(answer, usage_by_tier=with_usage(answer.usage_by_tier, ctx.usage_before))
        if ctx.reranks is not None and ctx.reranks.failed:
            # Made from the fused order while the reranker was failing: served, never stored.
            answer = replace(answer, complete=False)
        await self._cache.store(ctx.cache, ctx.request, answer, reason, ctx.vector, ctx.timer)
        result = QueryResult(
            id=ctx.request.id,
            answer=answer,
            query=ctx.request.query,
            original_query=ctx.request.original_query,
            route_reason=reason,
            decision=ctx.decision,
            cache=ctx.cache.tier,
            cache_debug=ctx.cache.debug(),
            rerank_debug=ctx.reranks.debug() if ctx.reranks is not None else None,
            timings_ms=ctx.timer.report(),
            config_version=self._version,
            partial_index=self._s.ingests.partial_index(ctx.request.tenant.id),
        )
        self._observe(ctx, result)
        return result

    def _observe(self, ctx: RequestContext, result: QueryResult) -> None:
        answer = result.answer
        route = answer.route.value
        m = self._s.metrics
        if answer.steps:
            m.agent_steps.observe(len(answer.steps))
        if answer.cap is not None:
            m.agent_cap_hits.labels(answer.cap).inc()
        if answer.degraded is not None:
            m.agent_degraded.labels(answer.degraded).inc()
        m.requests.labels(route, "ok", result.cache).inc()
        m.request_duration.labels(route).observe(ctx.timer.elapsed_s())
        total = usage_total(answer)
        fields = {
            "request_id": result.id,
            "tenant": ctx.request.tenant.id,
            "route": route,
            "cache": result.cache,
            **ctx.cache.log_fields(),
            "escalated": answer.escalated,
            **({"degraded": answer.degraded} if answer.degraded else {}),
            "agent_steps": len(answer.steps),
            "cost_usd": total.cost_usd,
            "prompt_tokens": total.prompt_tokens,
            "completion_tokens": total.completion_tokens,
            "answer_ms": result.timings_ms["total"],
            **rewrite_fields(result),
            **({"partial_index": result.partial_index.header()} if result.partial_index else {}),
        }
        if ctx.scope is None:  # not over HTTP (CLI, benchmarks): the answer is the log line
            log.info("answered", extra=fields)
            return
        # Over HTTP the middleware writes the request's one log line, with these fields.
        ctx.scope.record.answered = True
        ctx.scope.record.fields.update(fields)


def _llm_call(generation: Generation) -> LLMCall:
    return LLMCall(
        generation.tier,
        tuple(generation.messages),
        max_tokens=generation.max_tokens,
        route=generation.route.value,
        options=generation.options,
    )


def _streamed_completion(
    generation: Generation, parts: list[str], final: StreamDelta
) -> Completion:
    return Completion(
        text="".join(parts),
        tier=generation.tier,
        model=final.model,
        usage=final.usage or Usage(),
        # "" (none came) reads as "stop" for the client; `stream` marks the answer incomplete
        # when the relay says the stream did not end (`ended` is False).
        finish_reason=final.finish_reason or "stop",
        usage_estimated=final.usage_estimated,
        tool_calls=final.tool_calls,
        cut=final.cut,
    )


def _beyond(text: str, streamed: str) -> str:
    """What an answer's text says past the text streamed (`finish` strips, then may add)."""
    sent, text = streamed.strip(), text.lstrip()
    return text[len(sent) :] if text.startswith(sent) else ""


def _on_failure(generation: Generation, failure: BackendError) -> Answer:
    """What answers a generation whose call failed, its tier's retries and fallbacks spent
    (the agent's quoted passages at a cap); otherwise, or when the client's own parameters
    were refused, the failure stands."""
    if generation.on_failure is None or clients_fault(failure, generation.options):
        raise failure
    log.warning(
        "final answer degraded: its model failed",
        extra={"tier": generation.tier, "route": generation.route.value, "error": str(failure)},
    )
    return generation.on_failure


def _fallback(generation: Generation) -> Answer:
    """What answers a generation whose own deadline passed (the agent's plain answer)."""
    if generation.fallback is None:
        raise BackendUnavailable("llm", "the final answer's deadline passed")
    return generation.fallback


def replay_pieces(text: str) -> list[str]:
    """A cached answer as stream deltas: runs of a few words, joined back exactly."""
    pieces = _REPLAY_PIECE.findall(text)
    return pieces if pieces and "".join(pieces) == text else [text]


# Leading space, up to four words, trailing space: the classes alternate, so it is linear.
_REPLAY_PIECE = re.compile(r"\s*\S+(?:\s+\S+){0,3}\s*")
