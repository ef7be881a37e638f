"""The request pipeline: named stages over one per-request context, then one finisher.

    rewrite → exact cache (→ single flight) → embed → semantic cache → decide
    → corpus (full context only) → execute → complete | stream → conclude (cache store,
    metrics, log)

Each stage takes the `RequestContext` and either adds to it or returns the outcome, which ends
the stages early (a cache hit). The routing stages are `gateway.core.stages`', the cache's
`gateway.cache.stages`', the finishing `gateway.core.finish`'s; this module puts them in order
and ends each request's single-flight lead on every path.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Awaitable, Callable

from gateway.cache.stages import CacheStages, Served
from gateway.core.finish import Finisher
from gateway.core.request import Outcome, QueryRequest, RequestContext
from gateway.core.result import QueryResult
from gateway.core.routing import registry_config
from gateway.core.scope import RequestScope
from gateway.core.services import Services
from gateway.core.stages import RouteStages
from gateway.limits.budget import BudgetedLLM
from gateway.limits.metering import MeteredLLM
from gateway.obs import tracing
from gateway.obs.timing import StageTimer
from gateway.settings import Settings
from routers.agent import AgentDeps
from routers.classifier import Classifier
from routers.executors import build_registry
from routers.rerank import RerankStage
from routers.types import Route, RouteDecision

Stage = Callable[[RequestContext], Awaitable[Outcome | None]]


class Pipeline:
    def __init__(self, services: Services, settings: Settings, classifier: Classifier) -> None:
        self._s = services
        self.settings = settings
        self._cache = CacheStages(
            services.cache_store, services.retriever, services.embedder, services.metrics, settings
        )
        llm = self._llm = MeteredLLM(services.llm, services.metrics)
        # Settings.version dumps and hashes the whole configuration: once, not per answer. A
        # reload builds a new pipeline.
        self._version = settings.version
        self._finisher = Finisher(services, self._cache, self._version)
        registry = build_registry(
            AgentDeps(
                llm,
                services.retriever,
                services.embedder,
                settings.retrieval.candidates,
                estimate=self._finisher.cut_usage,
                rerank=RerankStage(settings.retrieval.rerank, services.reranker),
                fusion=settings.retrieval.fusion,
                span=tracing.child,
            ),
            registry_config(settings),
        )
        self._route = RouteStages(services, settings, classifier, llm, registry, self._cache)
        self._stages: tuple[Stage, ...] = (
            self._route.rewrite,
            self._cached,
            self._route.embed,
            self._cached_semantic,
            self._route.decide_route,
            self._route.whole_corpus,
            self._route.execute,
        )

    @property
    def config_version(self) -> str:
        return self._version

    @property
    def routes(self) -> frozenset[Route]:
        """The routes this deployment can execute."""
        return self._route.routes

    async def decide(self, request: QueryRequest, timer: StageTimer) -> RouteDecision:
        """Classification and policy only: what /v1/route explains."""
        ctx = RequestContext(request, timer, self._bound(request, None))
        await self._route.embed(ctx)
        await self._route.decide_route(ctx)
        assert ctx.decision is not None
        self._route.count_decision(ctx.decision)
        return ctx.decision

    async def prepare(
        self, request: QueryRequest, scope: RequestScope | None = None
    ) -> RequestContext:
        """Every stage up to the final model call; `complete` or `stream` finishes it.
        `scope`: the request's over HTTP (None from the CLI, benchmarks and tests)."""
        # From the request's arrival: the time it queued for admission is part of its latency
        # (the route latency SLO and its alerts would not see an overloaded worker otherwise).
        arrived = scope.record.started if scope is not None else None
        timer = StageTimer(self._s.metrics, arrived)
        ctx = RequestContext(request, timer, self._bound(request, scope), scope)
        if self.settings.tracing.record_question:
            tracing.annotate({"querygate.question": request.query})
        try:
            for stage in self._stages:
                if (outcome := await stage(ctx)) is not None:
                    ctx.outcome = outcome
                    break
        except BaseException:
            await self.release(ctx)
            raise
        if ctx.cache.tier != "miss":  # a hit: this request's followers get it too
            await self.release(ctx)
        return ctx

    def _bound(self, request: QueryRequest, scope: RequestScope | None) -> BudgetedLLM:
        """The LLM seam as `request` sees it: its tenant's calls, inside its budget; the
        arrival's budget check (`scope.budget`) stands for its first call, and the budget
        checks share the request's Redis time (`scope.spend`)."""
        if scope is None:
            return BudgetedLLM(self._llm, self._s.quotas, request.tenant)
        return BudgetedLLM(self._llm, self._s.quotas, request.tenant, scope.budget, scope.spend)

    async def release(self, ctx: RequestContext) -> None:
        """End the request's single-flight lead, if it holds one: followers get its stored
        answer or compute their own, and the store's claim is given back. Idempotent; every
        path that prepared a request calls it when done (complete, stream, or a client gone
        before either)."""
        await self._cache.release(ctx.cache)

    async def complete(self, ctx: RequestContext) -> QueryResult:
        try:
            return await self._finisher.complete(ctx)
        finally:
            await self.release(ctx)

    async def stream(self, ctx: RequestContext) -> AsyncGenerator[str | QueryResult, None]:
        """Text deltas as the model writes them (a cached answer replayed in pieces), then the
        QueryResult. The answer is stored only once the stream has completed."""
        try:
            async for item in self._finisher.stream(ctx):
                yield item
        finally:
            await self.release(ctx)

    async def _cached(self, ctx: RequestContext) -> Outcome | None:
        scope = ctx.scope
        deadline, spend = (scope.deadline, scope.spend) if scope is not None else (None, None)
        found = await self._cache.exact(
            ctx.cache, ctx.request, ctx.groups, ctx.timer, deadline, spend
        )
        return _served(ctx, found)

    async def _cached_semantic(self, ctx: RequestContext) -> Outcome | None:
        spend = ctx.scope.spend if ctx.scope is not None else None
        found = await self._cache.semantic(ctx.cache, ctx.request, ctx.vector, ctx.timer, spend)
        return _served(ctx, found)


def _served(ctx: RequestContext, served: Served | None) -> Outcome | None:
    """A cache hit's answer ends the stages, with the route reason it was stored with."""
    if served is None:
        return None
    answer, ctx.route_reason = served
    return answer
