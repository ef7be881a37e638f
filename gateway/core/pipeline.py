"""The request pipeline: named stages over one per-request context, then one completion builder.

    rewrite → exact cache (→ single flight) → embed → semantic cache → decide
    → corpus (full context only) → execute → complete | stream → conclude (cache store,
    metrics, log)

Each stage takes the `RequestContext` and either adds to it or returns the outcome, which ends
the stages early (a cache hit). The cache stages are here, the cache's rules in
`gateway.cache.response` and `gateway.cache`: the exact tier needs no embedding, so it runs
before one is paid for; the semantic tier reuses the embedding the router needs anyway.

Routes are executors in a registry (`routers.executors`); the routes a deployment can execute
are that registry's keys. A lookup that escalates is handed to
the multihop executor here, so routes never call each other. `complete` and `stream` both end
in `routers.generation.finish`, so an answer is built the same way whichever path wrote it.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from backends.cache.base import CacheStore
from backends.embeddings.base import Embedder, token_window
from backends.errors import BackendError, BackendUnavailable
from backends.llm.base import (
    LLM,
    NO_OPTIONS,
    Completion,
    GenerationOptions,
    LLMCall,
    Message,
    StreamDelta,
    Tier,
    Usage,
)
from backends.retrieval.base import Hit, Retriever, Vector
from gateway.cache import policy as cache_policy
from gateway.cache.guards import MAX_SEMANTIC_CHARS
from gateway.cache.keys import (
    CacheScope,
    answer_config_version,
    display_question,
    exact_key,
    history_digest,
    options_digest,
)
from gateway.cache.response import ResponseCache, SemanticLookup, StoreFailed
from gateway.cache.single_flight import Lease, Payload, Shared
from gateway.http.wire import QueryResult, answer_from_cache, answer_to_cache, rewrite_fields
from gateway.limits.budget import BudgetedLLM
from gateway.limits.metering import MeteredLLM, estimate_usage
from gateway.limits.quotas import BudgetCheck, Quotas
from gateway.obs.accounting import current_record
from gateway.obs.metrics import Metrics
from gateway.obs.timing import StageTimer
from gateway.settings import Settings, TenantConfig
from gateway.text import InvalidText, clean_text
from routers.agent import AgentDeps
from routers.classifier import Classifier
from routers.executors import RegistryConfig, build_registry, route_tiers
from routers.full_context import corpus_chunks
from routers.generation import CitationStream, clients_fault, finish, usage_total, with_usage
from routers.lookup import LookupParams, not_enough
from routers.policy import (
    PolicyConfig,
    RouteDecision,
    decide,
    decide_forced_direct,
    needs_classification,
    with_full_context,
)
from routers.rewrite import looks_like_followup, rewrite_followup
from routers.types import Answer, Escalation, Generation, Route, RouteContext

log = logging.getLogger(__name__)

Outcome = Answer | Generation
# What a route that reads no vector (direct, forced) gets when none was computed.
NO_VECTOR: Vector = np.zeros(0, dtype=np.float32)


@dataclass(frozen=True, slots=True)
class Services:
    """The backends, built once per process and shared by every pipeline (and config)."""

    embedder: Embedder
    retriever: Retriever
    llm: LLM
    cache_store: CacheStore | None
    metrics: Metrics
    quotas: Quotas | None = None  # the tenants' rate limits and budgets (gateway/limits/quotas.py)


@dataclass(frozen=True, slots=True)
class QueryRequest:
    id: str
    tenant: TenantConfig
    query: str
    history: tuple[Message, ...] = ()
    route: str = "auto"
    # Set when `query` is a rewrite of what the client sent.
    original_query: str | None = None
    # `Cache-Control: no-cache`: answer afresh (the answer may still be stored);
    # `no-store`: do not store it.
    cache_lookup: bool = True
    cache_store: bool = True
    # The client's parameters for the calls that write the answer (the chat endpoint's).
    options: GenerationOptions = NO_OPTIONS
    # What followed the question: the model's calls of the client's tools and their results.
    trailing: tuple[Message, ...] = ()
    # The budget check the request passed on arrival: it stands for its first model call.
    budget: BudgetCheck | None = None


@dataclass(slots=True)
class RequestContext:
    """One request as it flows through the stages; each stage adds what it learns."""

    request: QueryRequest
    timer: StageTimer
    # The LLM seam bound to the request's tenant: every model call it makes goes through it.
    llm: BudgetedLLM
    # Model calls made before the route's own (the follow-up rewrite).
    usage_before: dict[str, Usage] = field(default_factory=dict)
    # The cache: the key and scope while this request may be stored, the tier that answered
    # it (miss, exact, semantic), and what the semantic tier saw.
    key: str | None = None
    scope: str | None = None
    question: str | None = None
    cache: str = "miss"
    cache_result: str | None = None  # the lookup result counted, once
    looking: bool = False  # the exact tier missed cleanly: the semantic tier may look
    # The question's vector may be compared (not too long, no token its embedder did not
    # know): else it is looked up and stored for the exact tier only.
    searchable: bool = True
    semantic: SemanticLookup | None = None
    flight: Lease | None = None  # this request leads its key's single flight
    shared: Shared | None = None  # what its followers get: the answer it stored or was served
    vector: Vector | None = None
    # None for a cache hit: nothing was decided.
    decision: RouteDecision | None = None
    corpus: tuple[Hit, ...] = ()
    route_reason: str = ""
    outcome: Outcome | None = None


Stage = Callable[[RequestContext], Awaitable[Outcome | None]]


class Pipeline:
    def __init__(self, services: Services, settings: Settings, classifier: Classifier) -> None:
        self._s = services
        self.settings = settings
        self._classifier = classifier
        self._cache = ResponseCache(
            services.cache_store if settings.cache.backend != "off" else None,
            settings.cache,
            services.metrics,
            # A leader's claim outlives no request: past its deadline nobody waits for it.
            lease_s=settings.server.request_timeout_s,
        )
        # Settings.version dumps and hashes the whole configuration (~50 us): once, not per
        # answer. A reload builds a new pipeline.
        self._version = settings.version
        self._answer_configs: dict[str, str] = {}  # per tenant: what answers depend on
        self._policies: dict[tuple[str, bool, bool], PolicyConfig] = {}  # per tenant
        self._llm = MeteredLLM(services.llm, services.metrics)
        self._registry = build_registry(
            AgentDeps(
                self._llm,
                services.retriever,
                services.embedder,
                settings.retrieval.candidates,
                estimate=self._cut_usage,
            ),
            registry_config(settings),
        )
        self._routes = frozenset(self._registry)
        self._stages: tuple[Stage, ...] = (
            self._rewrite,
            self._cached,
            self._embed,
            self._cached_semantic,
            self._decide_route,
            self._whole_corpus,
            self._execute,
        )

    @property
    def config_version(self) -> str:
        return self._version

    @property
    def routes(self) -> frozenset[Route]:
        """The routes this deployment can execute."""
        return self._routes

    async def decide(self, request: QueryRequest, timer: StageTimer) -> RouteDecision:
        """Classification and policy only: what /v1/route explains."""
        ctx = RequestContext(request, timer, self._bound(request))
        await self._embed(ctx)
        await self._decide_route(ctx)
        assert ctx.decision is not None
        self._count_decision(ctx.decision)
        return ctx.decision

    async def prepare(self, request: QueryRequest) -> RequestContext:
        """Every stage up to the final model call; `complete` or `stream` finishes it."""
        # From the request's arrival: the time it queued for admission is part of its latency
        # (the route latency SLO and its alerts would not see an overloaded worker otherwise).
        record = current_record.get()
        arrived = record.started if record is not None else None
        ctx = RequestContext(request, StageTimer(self._s.metrics, arrived), self._bound(request))
        try:
            for stage in self._stages:
                if (outcome := await stage(ctx)) is not None:
                    ctx.outcome = outcome
                    break
        except BaseException:
            await self.release(ctx)
            raise
        if ctx.cache != "miss":  # a hit: this request's followers get it too
            await self.release(ctx)
        return ctx

    def _bound(self, request: QueryRequest) -> BudgetedLLM:
        """The LLM seam as `request` sees it: its tenant's calls, inside its budget."""
        return BudgetedLLM(self._llm, self._s.quotas, request.tenant, request.budget)

    async def release(self, ctx: RequestContext) -> None:
        """End the request's single-flight lead, if it holds one: followers get its stored
        answer or compute their own, and the store's claim is given back. Idempotent; every
        path that prepared a request calls it when done (complete, stream, or a client gone
        before either)."""
        if self._cache.flights is None or ctx.flight is None:
            return
        shared = ctx.shared
        ctx.flight, lease = None, ctx.flight
        await self._cache.flights.finish(lease, shared)

    # -- stages ---------------------------------------------------------------------------

    async def _rewrite(self, ctx: RequestContext) -> None:
        request = ctx.request
        wanted = self.settings.router.rewrite_followups and self._llm.has_tier("small")
        if not wanted or not looks_like_followup(request.query, request.history):
            return
        with ctx.timer.stage("rewrite"):
            try:
                completion = await rewrite_followup(ctx.llm, request.query, request.history)
            except BackendError as exc:
                # The rewrite only sharpens the question; without it the original still works.
                log.warning("follow-up rewrite failed", extra={"error": str(exc)})
                return
        ctx.usage_before = {completion.tier: completion.usage}
        try:
            # The model's text stands for the client's from here on: cleaned as the edge
            # cleans the client's, or not used (a lone surrogate broke the tokenizer: a 500).
            question = clean_text(completion.text).strip()
        except InvalidText:
            question = ""
        if not question:
            return
        # The self-contained question replaces the turns it was rewritten from: the executors
        # get the client's system messages and it, so its answer (and its cache key) does not
        # depend on the conversation's wording. A conversation with tool calls keeps its
        # turns (a tool result must follow its call; such a request is never cached).
        history = request.history
        if not any(m.role == "tool" or m.tool_calls for m in history):
            history = tuple(m for m in history if m.role == "system")
        ctx.request = replace(
            request, query=question, original_query=request.query, history=history
        )

    async def _cached(self, ctx: RequestContext) -> Answer | None:
        """The exact tier. An exact hit needs no embedding: answer before paying for one. A
        miss waits for the same question's answer when another request is computing it, or
        leads that computation itself."""
        request = ctx.request
        if not self._cache.enabled:
            return None
        if request.original_query is None and looks_like_followup(request.query, request.history):
            # Not rewritten: its meaning lies in a conversation no key holds.
            self._count(ctx, "bypass")
            return None
        tool_turns = request.trailing or any(
            m.role == "tool" or m.tool_calls for m in request.history
        )
        if request.options.tools or tool_turns:
            # The client's own tools: the answer may be a call of them, or rest on their
            # results, for this client only.
            self._count(ctx, "bypass")
            return None
        with ctx.timer.stage("cache_lookup"):
            scope = await self._scope(request)
            if scope is None:
                self._count(ctx, "error")
                return None
            ctx.question = display_question(request.query)
            ctx.key, ctx.scope = exact_key(scope, ctx.question), scope.digest
            if not request.cache_lookup:
                self._count(ctx, "bypass")
                return None
            try:
                found = await self._exact_or_flight(ctx, request.tenant.id, ctx.key)
            except (StoreFailed, BackendError) as exc:
                if isinstance(exc, BackendError):  # the claim; StoreFailed is logged already
                    log.warning("cache claim failed, serving uncached", extra={"error": str(exc)})
                self._count(ctx, "error")
                ctx.key = None  # nor store into a store that fails: serve uncached
                return None
        if found is not None:
            return self._hit(ctx, *found)
        ctx.looking = True
        return None

    async def _exact_or_flight(
        self, ctx: RequestContext, tenant: str, key: str
    ) -> tuple[Payload, str] | None:
        """The exact tier's answer and the tier that made it, or None: this request computes."""
        ctx.flight, found = await self._cache.exact_or_lead(tenant, key)
        return found

    async def _cached_semantic(self, ctx: RequestContext) -> Answer | None:
        """The semantic tier, on the embedding the router needs anyway: the nearest cached
        question's answer when it is close enough for its route and no guard objects."""
        if not ctx.looking:
            return None
        ctx.looking = False
        assert ctx.question is not None and ctx.scope is not None
        ctx.searchable = self._searchable(ctx.question)
        if not self._cache.semantic_enabled or not ctx.searchable:
            self._count(ctx, "miss")
            return None
        assert ctx.vector is not None
        with ctx.timer.stage("cache_semantic"):
            try:
                found = await self._cache.semantic(
                    ctx.request.tenant.id, ctx.scope, ctx.question, ctx.vector
                )
            except StoreFailed:
                self._count(ctx, "error")
                ctx.key = None
                return None
        ctx.semantic = found
        log.debug(
            "semantic cache lookup",
            extra={
                "request_id": ctx.request.id,
                "cache_nearest_similarity": found.nearest,
                "cache_similarity": found.similarity,
                "cache_refused": found.refused,
            },
        )
        if found.payload is None:
            self._count(ctx, "miss")
            return None
        return self._hit(ctx, found.payload, "semantic")

    def _searchable(self, question: str) -> bool:
        """Whether the semantic tier may compare this question's vector: not past the guards'
        bound, and every token known to the embedder's tokenizer (text in a script it does not
        know, Thai, Amharic, emoji only, becomes [UNK] tokens whose vectors are all alike)."""
        if len(question) > MAX_SEMANTIC_CHARS:
            return False
        window = token_window(self._s.embedder)
        return window is None or window.unknown is None or window.unknown(question) == 0

    def _hit(self, ctx: RequestContext, payload: Payload, tier: str) -> Answer:
        answer, ctx.route_reason = answer_from_cache(payload)
        ctx.cache, ctx.key, ctx.shared = tier, None, Shared(payload, tier)
        self._count(ctx, tier)
        return answer

    def _count(self, ctx: RequestContext, result: str) -> None:
        if ctx.cache_result is None:
            ctx.cache_result = result
            self._cache.count(result)

    async def _embed(self, ctx: RequestContext) -> None:
        semantic = self._cache.semantic_enabled and ctx.key is not None
        if not semantic and not needs_classification(ctx.request.route, self.routes):
            return  # a forced direct route outside the semantic cache: nothing reads a vector
        with ctx.timer.stage("embed"):
            ctx.vector = (await self._s.embedder.embed([ctx.request.query]))[0]

    async def _decide_route(self, ctx: RequestContext) -> None:
        request = ctx.request
        if ctx.vector is None:  # see _embed
            with ctx.timer.stage("policy"):
                ctx.decision = decide_forced_direct(self._policy(request.tenant))
            return
        with ctx.timer.stage("classify"):
            classification = self._classifier.classify(request.query, ctx.vector)
        with ctx.timer.stage("policy"):
            ctx.decision = decide(
                classification, request.route, request.query, self._policy(request.tenant)
            )

    async def _whole_corpus(self, ctx: RequestContext) -> None:
        """Read the tenant's every chunk only when the decision says full context may apply."""
        assert ctx.decision is not None
        if not ctx.decision.full_context_candidate:
            return
        assert ctx.vector is not None
        with ctx.timer.stage("corpus"):
            corpus = await corpus_chunks(
                self._s.retriever,
                ctx.request.tenant.id,
                ctx.vector,
                self.settings.router.full_context,
            )
        if corpus is not None:
            ctx.corpus = tuple(corpus)
            ctx.decision = with_full_context(ctx.decision)

    async def _execute(self, ctx: RequestContext) -> Outcome:
        decision, request = ctx.decision, ctx.request
        assert decision is not None
        self._count_decision(decision)
        ctx.route_reason = decision.explanation
        route_ctx = RouteContext(
            request.tenant.id,
            request.query,
            ctx.vector if ctx.vector is not None else NO_VECTOR,  # direct reads none
            request.history,
            decision,
            corpus=ctx.corpus,
            options=request.options,
            trailing=request.trailing,
            llm=ctx.llm,
        )
        outcome = await self._run(decision.route, route_ctx, ctx.timer)
        if isinstance(outcome, Escalation):
            return await self._escalate(route_ctx, outcome, ctx.timer)
        return outcome

    async def _run(
        self, route: Route, route_ctx: RouteContext, timer: StageTimer
    ) -> Outcome | Escalation:
        stage = {Route.LOOKUP: "retrieve", Route.MULTIHOP: "agent"}.get(route, "plan")
        with timer.stage(stage):
            outcome = await self._registry[route](route_ctx)
        if route is Route.LOOKUP:
            self._s.metrics.retrieval_duration.labels(self._s.retriever.name, "hybrid").observe(
                timer.stages_ms["retrieve"] / 1000
            )
        return outcome

    async def _escalate(
        self, route_ctx: RouteContext, escalation: Escalation, timer: StageTimer
    ) -> Outcome:
        """A lookup with thin evidence goes to multihop, or says honestly that it cannot."""
        runs = Route.MULTIHOP in self._registry
        to_route = Route.MULTIHOP.value if runs else "none"
        self._s.metrics.escalations.labels(Route.LOOKUP.value, to_route, escalation.reason).inc()
        if not runs:
            return not_enough(escalation)
        outcome = await self._run(Route.MULTIHOP, replace(route_ctx, escalation=escalation), timer)
        if isinstance(outcome, Escalation):  # the agent never escalates; a registry mix-up
            raise TypeError("the multihop executor returned an escalation")
        return outcome

    # -- finishing: one completion builder for both paths ---------------------------------

    async def complete(self, ctx: RequestContext) -> QueryResult:
        try:
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
        finally:
            await self.release(ctx)

    async def stream(self, ctx: RequestContext) -> AsyncGenerator[str | QueryResult, None]:
        """Text deltas as the model writes them (a cached answer replayed in pieces), then the
        QueryResult. The answer is stored only once the stream has completed."""
        try:
            async for item in self._stream(ctx):
                yield item
        finally:
            await self.release(ctx)

    async def _stream(self, ctx: RequestContext) -> AsyncIterator[str | QueryResult]:
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
        elif ctx.cache != "miss":
            answer = outcome
            for piece in replay_pieces(answer.text):
                yield piece
        else:
            answer = outcome
            yield answer.text
        yield await self._conclude(ctx, answer)

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

    def _cut_usage(self, tier: Tier, messages: Sequence[Message]) -> Usage:
        """A call cut before any text, as `MeteredLLM` and the budgets charged it."""
        return estimate_usage(self._s.llm, tier, messages, "")

    def _fallback(self, generation: Generation) -> Answer:
        """`_fallback`, with the final call the deadline cut counted in its usage."""
        answer = _fallback(generation)
        cut = self._cut_usage(generation.tier, generation.messages)
        usage = with_usage(answer.usage_by_tier, {generation.tier: cut})
        return replace(answer, usage_by_tier=usage, usage_estimated=True)

    async def _conclude(self, ctx: RequestContext, answer: Answer) -> QueryResult:
        reason = "; ".join((ctx.route_reason, *answer.notes))
        answer = replace(answer, usage_by_tier=with_usage(answer.usage_by_tier, ctx.usage_before))
        await self._store(ctx, answer, reason)
        result = QueryResult(
            id=ctx.request.id,
            answer=answer,
            query=ctx.request.query,
            original_query=ctx.request.original_query,
            route_reason=reason,
            decision=ctx.decision,
            cache=ctx.cache,
            cache_debug=_cache_debug(ctx),
            timings_ms=ctx.timer.report(),
            config_version=self.config_version,
        )
        self._observe(ctx, result)
        return result

    # -- helpers --------------------------------------------------------------------------

    def _policy(self, tenant: TenantConfig) -> PolicyConfig:
        # One per tenant for this pipeline's life (a reload builds a new pipeline), not one
        # per request.
        key = (tenant.id, tenant.allow_force_route, tenant.allow_full_context)
        policy = self._policies.get(key)
        if policy is None:
            policy = self._policies[key] = policy_for(
                self.settings,
                tenant.id,
                self.routes,
                allow_force_route=tenant.allow_force_route,
                whole_corpus_allowed=tenant.allow_full_context,
            )
        return policy

    async def _scope(self, request: QueryRequest) -> CacheScope | None:
        try:
            generation = await self._s.retriever.generation(request.tenant.id)
        except BackendError as exc:
            # Without the generation no key is safe; serve uncached (routes that need no
            # retrieval still answer), never a possibly stale answer.
            log.warning("index generation unavailable, cache bypassed", extra={"error": str(exc)})
            return None
        return CacheScope(
            requested_route=request.route,
            generation=generation,
            config_version=self._answer_config(request.tenant),
            embedding_model=self._s.embedder.model_id,
            options=options_digest(request.options),
            history=history_digest(request.history),
        )

    def _answer_config(self, tenant: TenantConfig) -> str:
        version = self._answer_configs.get(tenant.id)
        if version is None:
            version = self._answer_configs[tenant.id] = answer_config_version(self.settings, tenant)
        return version

    async def _store(self, ctx: RequestContext, answer: Answer, reason: str) -> None:
        """Store a computed answer the policy accepts, unless the client said no-store."""
        if ctx.key is None or ctx.cache != "miss" or not ctx.request.cache_store:
            return
        assert ctx.scope is not None and ctx.question is not None
        if (refused := cache_policy.refusal(answer)) is not None:
            log.debug("answer not cached", extra={"request_id": ctx.request.id, "why": refused})
            return
        payload = answer_to_cache(answer, reason)
        with ctx.timer.stage("cache_store"):
            vector = ctx.vector if ctx.searchable else None
            await self._cache.put(
                ctx.request.tenant.id, ctx.scope, ctx.key, ctx.question, payload, vector
            )
        ctx.shared = Shared(payload, "exact")

    def _count_decision(self, decision: RouteDecision) -> None:
        self._s.metrics.route_decisions.labels(decision.route.value, decision.reason).inc()

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
            **({"cache_lookup": ctx.cache_result} if ctx.cache_result else {}),
            **_semantic_fields(ctx.semantic),
            "escalated": answer.escalated,
            **({"degraded": answer.degraded} if answer.degraded else {}),
            "agent_steps": len(answer.steps),
            "cost_usd": total.cost_usd,
            "prompt_tokens": total.prompt_tokens,
            "completion_tokens": total.completion_tokens,
            "answer_ms": result.timings_ms["total"],
            **rewrite_fields(result),
        }
        record = current_record.get()
        if record is None:  # not over HTTP (CLI, benchmarks): the answer is the log line
            log.info("answered", extra=fields)
            return
        # Over HTTP the middleware writes the request's one log line, with these fields.
        record.answered = True
        record.fields.update(fields)


def policy_for(
    settings: Settings,
    tenant: str,
    executable: frozenset[Route],
    *,
    allow_force_route: bool = True,
    whole_corpus_allowed: bool = True,
) -> PolicyConfig:
    r = settings.retrieval
    return PolicyConfig(
        tenant=tenant,
        allow_force_route=allow_force_route,
        lexical_weight=r.lexical_weight,
        dense_weight=r.dense_weight,
        identifier_lexical_weight=r.identifier_lexical_weight,
        executable=executable,
        router=settings.router,
        whole_corpus_allowed=whole_corpus_allowed,
    )


def configured_routes(settings: Settings) -> frozenset[Route]:
    """The routes `settings` can execute, without building any backend (for the CLI)."""
    tiers = route_tiers(
        registry_config(settings), lambda tier: getattr(settings.models, tier) is not None
    )
    return frozenset(tiers)


def registry_config(settings: Settings) -> RegistryConfig:
    r, escalation = settings.retrieval, settings.router.escalation
    return RegistryConfig(
        tiers=settings.models.routes,
        lookup=LookupParams(
            k=r.k,
            candidates=r.candidates,
            grading=escalation if escalation.enabled else None,
        ),
        agent=settings.agent,
        full_context=settings.router.full_context.enabled,
    )


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
        # "" (none came) reads as "stop" for the client; `_stream` marks the answer incomplete
        # when the relay says the stream did not end (`ended` is False).
        finish_reason=final.finish_reason or "stop",
        usage_estimated=final.usage_estimated,
        tool_calls=final.tool_calls,
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


def _semantic_fields(found: SemanticLookup | None) -> dict[str, Any]:
    """The semantic lookup on the request's log line: what thresholds are tuned from."""
    if found is None:
        return {}
    fields: dict[str, Any] = {"cache_nearest_similarity": found.nearest}
    if found.refused:
        fields["cache_refused_by"] = found.refused
    return fields


def _cache_debug(ctx: RequestContext) -> dict[str, Any] | None:
    """For `debug`: the lookup's result and, for the semantic tier, what it compared."""
    if ctx.cache_result is None:
        return None
    body: dict[str, Any] = {"lookup": ctx.cache_result}
    if (found := ctx.semantic) is not None:
        body["nearest_similarity"] = found.nearest
        body["refused_by"] = found.refused
        if found.payload is not None:
            body["similarity"] = found.similarity
            body["cached_question"] = found.question
    return body
