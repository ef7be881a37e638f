"""The lookup route: one hybrid retrieval, the rerank stage (`routers.rerank`: the fused hits
reordered by a cross-encoder when the policy says the ranking is uncertain), a grade of the
evidence, then the small model answers with citations.

With no model configured the answer is extractive: the best passages, verbatim, cited. When
the grade says the evidence is too thin, the lookup returns an `Escalation` instead of an
answer: the pipeline hands the question to the multihop route, or, where this deployment
cannot run it, answers honestly that the documents did not give enough evidence.
"""

from __future__ import annotations

from dataclasses import dataclass

from backends.llm.base import Message, Tier
from backends.retrieval.base import Hit, Retriever, SearchRequest
from routers.generation import citation_from_hit, inert_citations
from routers.grading import EvidenceGrade, assess, best_possible_score
from routers.prompts import LOOKUP_SYSTEM, format_sources, new_source_tag
from routers.rerank import RERANK_OFF, RerankCall, RerankStage
from routers.rules import EscalationConfig
from routers.types import Answer, Citation, Escalation, Generation, Route, RouteContext

NO_EVIDENCE_TEXT = "Not enough evidence in the documents to answer this question."
_EXTRACTIVE_PASSAGES = 3


@dataclass(frozen=True, slots=True)
class LookupParams:
    k: int
    candidates: int
    # None: escalation is off and every lookup is answered from what it found.
    grading: EscalationConfig | None


class LookupExecutor:
    def __init__(
        self, retriever: Retriever, params: LookupParams, tier: Tier | None, rerank: RerankStage
    ) -> None:
        self._retriever = retriever
        self._params = params
        self._tier = tier  # None: no model, extractive answers
        self._rerank = rerank

    async def __call__(self, ctx: RouteContext) -> Answer | Generation | Escalation:
        return await plan_lookup(ctx, self._retriever, self._params, self._tier, self._rerank)


async def plan_lookup(
    ctx: RouteContext,
    retriever: Retriever,
    params: LookupParams,
    tier: Tier | None,
    rerank: RerankStage = RERANK_OFF,
) -> Answer | Generation | Escalation:
    hits = await lookup_hits(ctx, retriever, params, rerank)
    return _answer(ctx, hits, params, tier)


async def lookup_hits(
    ctx: RouteContext, retriever: Retriever, params: LookupParams, rerank: RerankStage
) -> list[Hit]:
    """The lookup's evidence: the hybrid search, then the rerank stage (which may reorder it)."""
    decision = ctx.decision
    fused = await retriever.search(
        SearchRequest(
            tenant=ctx.tenant,
            text=ctx.query,
            vector=ctx.vector,
            k=rerank.fetch_k(params.k),
            candidates=params.candidates,
            lexical_weight=decision.lexical_weight,
            dense_weight=decision.dense_weight,
        )
    )
    best = best_possible_score(decision.lexical_weight, decision.dense_weight)
    call = RerankCall(
        ctx.tenant, ctx.query, fused, params.k, best, "lookup", ctx.reranks, ctx.deadline
    )
    return await rerank.rerank(call)


def _answer(
    ctx: RouteContext, hits: list[Hit], params: LookupParams, tier: Tier | None
) -> Answer | Generation | Escalation:
    """Grade the evidence (reranked, where the stage reranked it), then answer or escalate."""
    decision = ctx.decision
    sources = tuple(citation_from_hit(h) for h in hits)
    # A route the client forced is answered as asked: escalation would override its choice.
    escalates = params.grading is not None and decision.reason != "forced"
    if not hits:
        if escalates:  # other searches, by the agent, may still find something
            return _escalation(sources, EvidenceGrade(False, 0.0, 0.0, "no_hits"))
        return Answer(NO_EVIDENCE_TEXT, Route.LOOKUP, complete=False, notes=("no passage matched",))
    if escalates and params.grading is not None:
        best = best_possible_score(decision.lexical_weight, decision.dense_weight)
        evidence = assess(ctx.query, hits, decision.classification, best, params.grading)
        if not evidence.sufficient:
            return _escalation(sources, evidence)
    if tier is None:
        return _extractive(sources)
    tag = new_source_tag()
    prompt = LOOKUP_SYSTEM.format(tag=tag, sources=format_sources(tag, hits))
    messages = (Message("system", prompt), *ctx.history, Message("user", ctx.query))
    return Generation(
        route=Route.LOOKUP,
        tier=tier,
        messages=messages,
        sources=sources,
        source_tag=tag,
        options=ctx.options,
    )


def _escalation(sources: tuple[Citation, ...], evidence: EvidenceGrade) -> Escalation:
    note = (
        f"escalated: evidence {evidence.reason.replace('_', ' ')} "
        f"(coverage {evidence.coverage:.2f}, agreement {evidence.agreement:.2f})"
    )
    return Escalation(evidence.reason, note, sources[:_EXTRACTIVE_PASSAGES])


def not_enough(escalation: Escalation) -> Answer:
    """The honest answer to an escalation no multihop route can take."""
    return Answer(
        NO_EVIDENCE_TEXT,
        Route.LOOKUP,
        citations=escalation.sources,
        complete=False,
        escalated=True,
        escalation_reason=escalation.reason,
        notes=(
            escalation.note,
            "the multihop route is not available, so no answer was generated",
        ),
    )


def _extractive(sources: tuple[Citation, ...]) -> Answer:
    best = sources[:_EXTRACTIVE_PASSAGES]
    return Answer(text=extractive_text(best), route=Route.LOOKUP, citations=best, extractive=True)


def extractive_text(citations: tuple[Citation, ...]) -> str:
    """Passages quoted as an answer citing them, [i] for the i-th (the agent's, too, when its
    model fails mid-loop)."""
    # The answer's [i] are its citations; the passages' own brackets must not read as more.
    return "\n\n".join(
        f"[{i}] {inert_citations(c.title)}: {inert_citations(c.snippet)}"
        for i, c in enumerate(citations, 1)
    )
