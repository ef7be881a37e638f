"""The pipeline's routing stages: the follow-up rewrite, the embedding, the route decision,
the whole corpus (full context only) and the route's execution.

Each stage takes the `RequestContext` and adds to it; `execute` returns the outcome. Routes are
executors in a registry (`routers.executors`); a lookup that escalates is handed to the
multihop executor here, so routes never call each other.
"""

from __future__ import annotations

import logging
from dataclasses import replace

import numpy as np

from backends.errors import BackendError
from backends.retrieval.base import Vector
from gateway.cache.stages import CacheStages
from gateway.core.request import Outcome, RequestContext
from gateway.core.reranks import RequestReranks
from gateway.core.routing import TenantPolicies
from gateway.core.services import Services
from gateway.limits.metering import MeteredLLM
from gateway.obs import tracing
from gateway.obs.timing import Stage, StageTimer
from gateway.settings import Settings
from gateway.text import InvalidText, clean_text
from routers.classifier import Classifier
from routers.executors import Registry
from routers.full_context import corpus_chunks
from routers.lookup import not_enough
from routers.policy import (
    decide,
    decide_forced_direct,
    needs_classification,
    with_full_context,
)
from routers.rewrite import looks_like_followup, rewrite_followup
from routers.small_talk import small_talk
from routers.types import Escalation, Generation, Route, RouteContext, RouteDecision

log = logging.getLogger(__name__)

# What a route that reads no vector (direct, forced) gets when none was computed.
NO_VECTOR: Vector = np.zeros(0, dtype=np.float32)
# A follow-up with no model to rewrite it: answered as the client wrote it, and it says so.
NOT_REWRITTEN = (
    "This follow-up was searched as written: no small model is configured to rewrite it into "
    "a self-contained question."
)


class RouteStages:
    def __init__(
        self,
        services: Services,
        settings: Settings,
        classifier: Classifier,
        llm: MeteredLLM,
        registry: Registry,
        cache: CacheStages,
    ) -> None:
        self._s = services
        self._settings = settings
        self._classifier = classifier
        self._llm = llm
        self._registry = registry
        self._cache = cache
        self.routes = frozenset(registry)
        self._policies = TenantPolicies(settings, self.routes)
        # Without its model the direct route looks up what is not small talk: a vector it reads.
        self._direct_model = llm.has_tier(settings.models.routes[Route.DIRECT])

    async def rewrite(self, ctx: RequestContext) -> None:
        request = ctx.request
        wanted = self._settings.router.rewrite_followups
        if not wanted or not looks_like_followup(request.query, request.history):
            return
        if not self._llm.has_tier("small"):
            if small_talk(request.query) is None:  # "thanks!" needs no rewrite to be answered
                ctx.notes.append(NOT_REWRITTEN)
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

    async def embed(self, ctx: RequestContext) -> None:
        semantic = self._cache.wants_vector(ctx.cache)
        forced_direct = not needs_classification(ctx.request.route, self.routes)
        if not semantic and forced_direct and self._direct_model:
            return  # a forced direct route outside the semantic cache: nothing reads a vector
        with ctx.timer.stage("embed"):
            ctx.vector = (await self._s.embedder.embed([ctx.request.query]))[0]

    async def decide_route(self, ctx: RequestContext) -> None:
        request = ctx.request
        if ctx.vector is None:  # see embed
            with ctx.timer.stage("policy"):
                ctx.decision = decide_forced_direct(self._policies.of(request.tenant))
            return
        with ctx.timer.stage("classify"):
            classification = self._classifier.classify(request.query, ctx.vector)
        with ctx.timer.stage("policy"):
            ctx.decision = decide(
                classification, request.route, request.query, self._policies.of(request.tenant)
            )
            if tracing.recording():  # off, not even the attributes are built
                route, reason = ctx.decision.route.value, ctx.decision.reason
                tracing.annotate({"querygate.route": route, "querygate.reason": reason})

    async def whole_corpus(self, ctx: RequestContext) -> None:
        """Read the tenant's every chunk only when the decision says full context may apply."""
        assert ctx.decision is not None
        if not ctx.decision.full_context_candidate:
            return
        assert ctx.vector is not None
        with ctx.timer.stage("corpus"):
            corpus = await corpus_chunks(
                self._s.retriever,
                ctx.request.tenant.id,
                ctx.groups,
                ctx.vector,
                self._settings.router.full_context,
            )
        if corpus is not None:
            ctx.corpus = tuple(corpus)
            ctx.decision = with_full_context(ctx.decision)

    async def execute(self, ctx: RequestContext) -> Outcome:
        decision, request = ctx.decision, ctx.request
        assert decision is not None
        self.count_decision(decision)
        ctx.route_reason = decision.explanation
        ctx.reranks = reranks = self._reranks(ctx)
        route_ctx = RouteContext(
            request.tenant.id,
            request.query,
            ctx.vector if ctx.vector is not None else NO_VECTOR,  # direct reads none
            request.history,
            decision,
            groups=ctx.groups,
            corpus=ctx.corpus,
            options=request.options,
            trailing=request.trailing,
            llm=ctx.llm,
            reranks=reranks,
            deadline=ctx.scope.deadline if ctx.scope is not None else None,
        )
        outcome = await self._run(decision.route, route_ctx, ctx.timer)
        if isinstance(outcome, Escalation):
            outcome = await self._escalate(route_ctx, outcome, ctx.timer)
        # A failed rerank is said where the answer says how it was made; its cost is the
        # request's, beside the model calls'.
        ctx.route_reason = "; ".join((ctx.route_reason, *reranks.notes()))
        ctx.usage_before = {**ctx.usage_before, **reranks.usage()}
        return said(outcome, ctx.notes, in_text=request.options.max_tokens is None)

    def _reranks(self, ctx: RequestContext) -> RequestReranks:
        reranker = self._s.reranker
        model = reranker.model_id if reranker is not None else ""
        quotas, metrics = self._s.quotas, self._s.metrics
        return RequestReranks(metrics, ctx.timer, ctx.request.tenant, quotas, model)

    def count_decision(self, decision: RouteDecision) -> None:
        self._s.metrics.route_decisions.labels(decision.route.value, decision.reason).inc()

    async def _run(
        self, route: Route, route_ctx: RouteContext, timer: StageTimer
    ) -> Outcome | Escalation:
        stages: dict[Route, Stage] = {Route.LOOKUP: "retrieve", Route.MULTIHOP: "agent"}
        stage = stages.get(route, "plan")
        with timer.stage(stage):
            outcome = await self._registry[route](route_ctx)
        if route is Route.LOOKUP:
            # The retrieval's own time: the rerank inside the lookup has its own histogram.
            retrieve_ms = timer.stages_ms["retrieve"] - timer.stages_ms.get("rerank", 0.0)
            self._s.metrics.retrieval_duration.labels(self._s.retriever.name, "hybrid").observe(
                retrieve_ms / 1000
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


def said(outcome: Outcome, notes: list[str], *, in_text: bool = True) -> Outcome:
    """The outcome with what the stages before it have to tell the client: in the notes
    (`route_reason`) and, for an answer already written, at the end of its text too, which
    is all an OpenAI client shows. Not `in_text` when the client capped the answer's tokens:
    the text was cut to fit the cap, and a note after it would not."""
    if not notes:
        return outcome
    if isinstance(outcome, Generation) or not in_text:
        return replace(outcome, notes=(*outcome.notes, *notes))
    told = "\n\n".join(f"({note})" for note in notes)
    return replace(outcome, text=f"{outcome.text}\n\n{told}", notes=(*outcome.notes, *notes))
