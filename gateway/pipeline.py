"""The request pipeline: rewrite → exact cache → embed once → classify → policy → plan →
generate → store.

Data flows one way. `prepare` does everything up to the model call, so the same prepared
request can be answered whole (`complete`) or streamed (`stream`) by the HTTP layer.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace

from backends.cache.base import CacheStore
from backends.embeddings.base import Embedder
from backends.errors import BackendError
from backends.llm.base import LLM, Completion, Message, StreamDelta, Usage
from backends.retrieval.base import Hit, Retriever, Vector
from gateway.metrics import Metrics
from gateway.response_cache import CacheScope, ResponseCache, cache_key
from gateway.settings import Settings, TenantConfig
from gateway.timing import StageTimer
from gateway.wire import QueryResult, answer_from_cache, answer_to_cache, rewrite_fields
from routers.classifier import Classifier
from routers.direct import plan_direct
from routers.full_context import corpus_chunks, plan_full_context
from routers.generation import finish, usage_total, with_usage
from routers.grading import GradeThresholds
from routers.lookup import LookupParams, plan_lookup
from routers.policy import PolicyConfig, RouteDecision, decide
from routers.rewrite import looks_like_followup, rewrite_followup
from routers.types import Answer, Generation, Route, RouteContext

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Services:
    """The backends, built once per process and shared by every pipeline (and config)."""

    embedder: Embedder
    retriever: Retriever
    llm: LLM
    cache_store: CacheStore | None
    metrics: Metrics


@dataclass(frozen=True, slots=True)
class QueryRequest:
    id: str
    tenant: TenantConfig
    query: str
    history: tuple[Message, ...] = ()
    route: str = "auto"
    # Set when `query` is a rewrite of what the client sent.
    original_query: str | None = None


@dataclass(slots=True)
class Prepared:
    request: QueryRequest
    timer: StageTimer
    outcome: Answer | Generation
    route_reason: str
    cache: str
    key: str | None
    # Model calls made before the route's own (the follow-up rewrite).
    usage_before: dict[str, Usage] = field(default_factory=dict)
    # None for a cache hit: nothing was decided.
    decision: RouteDecision | None = None


def policy_for(settings: Settings, tenant: str, allow_force_route: bool) -> PolicyConfig:
    r = settings.retrieval
    return PolicyConfig(
        tenant=tenant,
        allow_force_route=allow_force_route,
        lexical_weight=r.lexical_weight,
        dense_weight=r.dense_weight,
        identifier_lexical_weight=r.identifier_lexical_weight,
        router=settings.router,
    )


class Pipeline:
    def __init__(self, services: Services, settings: Settings, classifier: Classifier) -> None:
        self._s = services
        self.settings = settings
        self._classifier = classifier
        self._cache = ResponseCache(
            services.cache_store if settings.cache.backend != "off" else None,
            settings.cache.ttl_s,
            services.metrics,
        )
        r, escalation = settings.retrieval, settings.router.escalation
        self._lookup = LookupParams(
            k=r.k,
            candidates=r.candidates,
            grading=GradeThresholds(escalation.min_coverage, escalation.min_agreement)
            if escalation.enabled
            else None,
        )

    @property
    def config_version(self) -> str:
        return self.settings.version

    async def decide(self, request: QueryRequest, timer: StageTimer) -> RouteDecision:
        """Classification and policy only: what /v1/route explains."""
        with timer.stage("embed"):
            vector = (await self._s.embedder.embed([request.query]))[0]
        return self._decide(request, vector, timer)

    def _decide(
        self, request: QueryRequest, vector: Vector, timer: StageTimer, corpus_fits: bool = False
    ) -> RouteDecision:
        with timer.stage("classify"):
            classification = self._classifier.classify(request.query, vector)
        with timer.stage("policy"):
            decision = decide(
                classification,
                request.route,
                request.query,
                replace(
                    policy_for(self.settings, request.tenant.id, request.tenant.allow_force_route),
                    corpus_fits=corpus_fits,
                ),
            )
        self._s.metrics.route_decisions.labels(decision.route.value, decision.reason).inc()
        return decision

    async def prepare(self, request: QueryRequest) -> Prepared:
        timer = StageTimer(self._s.metrics)
        request, usage_before = await self._rewrite(request, timer)
        key = await self._key(request) if self._cache.enabled else None
        if key is not None:
            # An exact hit needs no embedding: answer before paying for one.
            with timer.stage("cache_lookup"):
                cached = await self._cache.get(key)
            if cached is not None:
                answer, reason = answer_from_cache(cached)
                return Prepared(request, timer, answer, reason, "exact", None, usage_before)
        with timer.stage("embed"):
            vector = (await self._s.embedder.embed([request.query]))[0]
        corpus = await self._whole_corpus(request, vector, timer)
        decision = self._decide(request, vector, timer, corpus_fits=corpus is not None)
        ctx = RouteContext(request.tenant.id, request.query, vector, request.history, decision)
        retrieves = decision.route is Route.LOOKUP
        with timer.stage("retrieve" if retrieves else "plan"):
            outcome = await self._plan(ctx, corpus)
        if retrieves:
            self._s.metrics.retrieval_duration.labels(self._s.retriever.name, "hybrid").observe(
                timer.stages_ms["retrieve"] / 1000
            )
        return Prepared(
            request, timer, outcome, decision.explanation, "miss", key, usage_before, decision
        )

    async def _rewrite(
        self, request: QueryRequest, timer: StageTimer
    ) -> tuple[QueryRequest, dict[str, Usage]]:
        wanted = self.settings.router.rewrite_followups and self._s.llm.has_tier("small")
        if not wanted or not looks_like_followup(request.query, request.history):
            return request, {}
        with timer.stage("rewrite"):
            try:
                completion = await rewrite_followup(self._s.llm, request.query, request.history)
            except BackendError as exc:
                # The rewrite only sharpens the question; without it the original still works.
                log.warning("follow-up rewrite failed", extra={"error": str(exc)})
                return request, {}
        if completion is None:
            return request, {}
        self._record_llm(completion.tier, completion.model, completion.usage, "rewrite")
        rewritten = replace(request, query=completion.text, original_query=request.query)
        return rewritten, {completion.tier: completion.usage}

    async def _key(self, request: QueryRequest) -> str | None:
        try:
            generation = await self._s.retriever.generation(request.tenant.id)
        except BackendError as exc:
            # Without the generation no key is safe; serve uncached (routes that need no
            # retrieval still answer), never a possibly stale answer.
            log.warning("index generation unavailable, cache bypassed", extra={"error": str(exc)})
            self._s.metrics.cache_lookups.labels("error").inc()
            return None
        scope = CacheScope(
            tenant=request.tenant.id,
            requested_route=request.route,
            generation=generation,
            config_version=self.config_version,
            embedding_model=self._s.embedder.model_id,
        )
        return cache_key(scope, request.query, request.history)

    async def _whole_corpus(
        self, request: QueryRequest, vector: Vector, timer: StageTimer
    ) -> list[Hit] | None:
        """The tenant's every chunk when full-context answering applies to it, else None."""
        config = self.settings.router.full_context
        usable = config.enabled and self._s.llm.has_tier("small")
        if not usable or request.tenant.per_user_access:
            return None
        with timer.stage("corpus"):
            return await corpus_chunks(self._s.retriever, request.tenant.id, vector, config)

    async def _plan(self, ctx: RouteContext, corpus: list[Hit] | None) -> Answer | Generation:
        has_small = self._s.llm.has_tier("small")
        if ctx.decision.route is Route.DIRECT:
            return plan_direct(ctx, has_small)
        if ctx.decision.route is Route.FULL_CONTEXT and corpus is not None:
            return plan_full_context(ctx, corpus, self._s.llm.has_tier("large"))
        return await plan_lookup(ctx, self._s.retriever, self._lookup, has_small)

    async def complete(self, prepared: Prepared) -> QueryResult:
        outcome = prepared.outcome
        if isinstance(outcome, Generation):
            with prepared.timer.stage("generate"):
                completion = await self._call(outcome)
            outcome = finish(outcome, completion)
        return await self._conclude(prepared, outcome)

    async def stream(self, prepared: Prepared) -> AsyncIterator[str | QueryResult]:
        """Text deltas as the model writes them, then the QueryResult."""
        outcome = prepared.outcome
        if isinstance(outcome, Generation):
            with prepared.timer.stage("generate"):
                final: StreamDelta | None = None
                parts: list[str] = []
                async for delta in self._stream_call(outcome):
                    if delta.text:
                        parts.append(delta.text)
                        yield delta.text
                    if delta.done:
                        final = delta
            usage = final.usage if final and final.usage else Usage()
            completion = Completion(
                "".join(parts), outcome.tier, final.model if final else "", usage
            )
            outcome = finish(outcome, completion)
        else:
            yield outcome.text
        yield await self._conclude(prepared, outcome)

    async def _call(self, generation: Generation) -> Completion:
        try:
            completion = await self._s.llm.complete(
                generation.tier, list(generation.messages), route=generation.route.value
            )
        except BackendError:
            self._s.metrics.llm_requests.labels(generation.tier, "-", "error").inc()
            raise
        self._record_llm(
            generation.tier, completion.model, completion.usage, generation.route.value
        )
        return completion

    async def _stream_call(self, generation: Generation) -> AsyncIterator[StreamDelta]:
        try:
            async for delta in self._s.llm.stream(
                generation.tier, list(generation.messages), route=generation.route.value
            ):
                if delta.done:
                    usage = delta.usage or Usage()
                    self._record_llm(generation.tier, delta.model, usage, generation.route.value)
                yield delta
        except BackendError:
            self._s.metrics.llm_requests.labels(generation.tier, "-", "error").inc()
            raise

    def _record_llm(self, tier: str, model: str, usage: Usage, route: str) -> None:
        m = self._s.metrics
        m.llm_requests.labels(tier, model, "ok").inc()
        m.llm_tokens.labels(tier, model, "prompt").inc(usage.prompt_tokens)
        m.llm_tokens.labels(tier, model, "completion").inc(usage.completion_tokens)
        m.llm_cost.labels(tier, model, route).inc(usage.cost_usd)

    async def _conclude(self, prepared: Prepared, answer: Answer) -> QueryResult:
        reason = "; ".join((prepared.route_reason, *answer.notes))
        answer = with_usage(answer, prepared.usage_before)
        if prepared.key is not None and answer.complete:
            with prepared.timer.stage("cache_store"):
                await self._cache.put(prepared.key, answer_to_cache(answer, reason))
        result = QueryResult(
            id=prepared.request.id,
            answer=answer,
            query=prepared.request.query,
            original_query=prepared.request.original_query,
            route_reason=reason,
            decision=prepared.decision,
            cache=prepared.cache,
            timings_ms=prepared.timer.report(),
            config_version=self.config_version,
        )
        self._observe(prepared, result)
        return result

    def _observe(self, prepared: Prepared, result: QueryResult) -> None:
        route = result.answer.route.value
        m = self._s.metrics
        if result.answer.escalation_reason is not None and result.cache == "miss":
            m.escalations.labels(route, Route.MULTIHOP.value, result.answer.escalation_reason).inc()
        m.requests.labels(route, "ok", result.cache).inc()
        m.request_duration.labels(route).observe(prepared.timer.elapsed_s())
        total = usage_total(result.answer)
        log.info(
            "answered",
            extra={
                "request_id": result.id,
                "tenant": prepared.request.tenant.id,
                "route": route,
                "cache": result.cache,
                "cost_usd": total.cost_usd,
                "prompt_tokens": total.prompt_tokens,
                "completion_tokens": total.completion_tokens,
                "duration_ms": result.timings_ms["total"],
                **rewrite_fields(result),
            },
        )
