"""The lookup route: one hybrid retrieval, the rerank stage (`routers.rerank`: the fused hits
reordered by a cross-encoder when the policy says the ranking is uncertain), a grade of the
evidence, then the small model answers with citations.

With no model configured the answer is extractive: the sentences of the passages found that
best match the question, verbatim, cited (`routers.extractive`). When
the grade says the evidence is too thin, the lookup returns an `Escalation` instead of an
answer: the pipeline hands the question to the multihop route, or, where this deployment
cannot run it, answers honestly that the documents did not give enough evidence.
"""

from __future__ import annotations

from dataclasses import dataclass

from backends.llm.base import Message, Tier
from backends.retrieval.base import FusionMethod, Hit, Retriever, SearchRequest
from routers.extractive import Extractor
from routers.generation import citation_from_hit
from routers.grading import EvidenceGrade, assess, best_possible_score
from routers.prompts import LOOKUP_SYSTEM, format_sources, new_source_tag
from routers.rerank import RERANK_OFF, RerankCall, RerankStage
from routers.rules import EscalationConfig
from routers.types import Answer, Citation, Escalation, Generation, Route, RouteContext

NO_EVIDENCE_TEXT = "Not enough evidence in the documents to answer this question."
# The passages an escalation hands on: the best of what the lookup found.
_ESCALATION_PASSAGES = 3


@dataclass(frozen=True, slots=True)
class LookupParams:
    k: int
    candidates: int
    # None: escalation is off and every lookup is answered from what it found.
    grading: EscalationConfig | None
    # How the search fuses its arms: the active configuration's `retrieval.fusion`, so a
    # reload changes it (None: the retriever's own, from start).
    fusion: FusionMethod | None = None


class LookupExecutor:
    """`tier` None: no model; `extractor` quotes the best sentences of the passages found;
    `rerank` is the second stage of the search."""

    def __init__(
        self,
        retriever: Retriever,
        params: LookupParams,
        tier: Tier | None,
        extractor: Extractor,
        rerank: RerankStage = RERANK_OFF,
    ) -> None:
        self._retriever = retriever
        self._params = params
        self._tier = tier
        self._extractor = extractor
        self._rerank = rerank

    async def __call__(self, ctx: RouteContext) -> Answer | Generation | Escalation:
        evidence = await gather_evidence(ctx, self._retriever, self._params, self._rerank)
        if not isinstance(evidence, list):
            return evidence
        if self._tier is None:
            return await self._extractor.answer(
                ctx.query, ctx.vector, evidence, ctx.options.max_tokens
            )
        tag = new_source_tag()
        prompt = LOOKUP_SYSTEM.format(tag=tag, sources=format_sources(tag, evidence))
        messages = (Message("system", prompt), *ctx.history, Message("user", ctx.query))
        return Generation(
            route=Route.LOOKUP,
            tier=self._tier,
            messages=messages,
            sources=tuple(citation_from_hit(h) for h in evidence),
            source_tag=tag,
            options=ctx.options,
        )


async def gather_evidence(
    ctx: RouteContext,
    retriever: Retriever,
    params: LookupParams,
    rerank: RerankStage = RERANK_OFF,
) -> list[Hit] | Answer | Escalation:
    """The hits to answer from (reranked where the stage reranked them: the grade reads them
    so), or what a lookup ends in without them: the honest answer to a search that found
    nothing, or the escalation its grade calls for."""
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
            fusion=params.fusion,
            groups=ctx.groups,
        )
    )
    call = RerankCall(ctx.tenant, ctx.query, fused, params.k, "lookup", ctx.reranks, ctx.deadline)
    hits = await rerank.rerank(call)
    # A route the client forced is answered as asked: escalation would override its choice.
    escalates = params.grading is not None and decision.reason != "forced"
    if not hits:
        if escalates:  # other searches, by the agent, may still find something
            return _escalation((), EvidenceGrade(False, 0.0, 0.0, "no_hits"))
        return Answer(NO_EVIDENCE_TEXT, Route.LOOKUP, complete=False, notes=("no passage matched",))
    if escalates and params.grading is not None:
        best = best_possible_score(decision.lexical_weight, decision.dense_weight)
        evidence = assess(ctx.query, hits, decision.classification, best, params.grading)
        if not evidence.sufficient:
            return _escalation(tuple(citation_from_hit(h) for h in hits), evidence)
    return hits


def _escalation(sources: tuple[Citation, ...], evidence: EvidenceGrade) -> Escalation:
    note = (
        f"escalated: evidence {evidence.reason.replace('_', ' ')} "
        f"(coverage {evidence.coverage:.2f}, agreement {evidence.agreement:.2f})"
    )
    return Escalation(evidence.reason, note, sources[:_ESCALATION_PASSAGES])


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
