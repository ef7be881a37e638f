"""The lookup route: one hybrid retrieval, a grade of the evidence, then the small model
answers with citations.

With no model configured the answer is extractive: the best passages, verbatim, cited. When
the grade says the evidence is too thin, the question escalates to the multihop route instead
of being answered from it; until that route exists the answer says, honestly, that the
documents did not give enough evidence, with the best citations found.
"""

from __future__ import annotations

from dataclasses import dataclass

from backends.llm.base import Message
from backends.retrieval.base import Retriever, SearchRequest
from routers.generation import citation_from_hit
from routers.grading import EvidenceGrade, GradeThresholds, best_possible_score, grade
from routers.prompts import LOOKUP_SYSTEM, format_sources
from routers.types import Answer, Citation, Generation, Route, RouteContext

NO_EVIDENCE_TEXT = "Not enough evidence in the documents to answer this question."
_EXTRACTIVE_PASSAGES = 3


@dataclass(frozen=True, slots=True)
class LookupParams:
    k: int
    candidates: int
    # None: escalation is off and every lookup is answered from what it found.
    grading: GradeThresholds | None


async def plan_lookup(
    ctx: RouteContext, retriever: Retriever, params: LookupParams, has_model: bool
) -> Answer | Generation:
    decision = ctx.decision
    hits = await retriever.search(
        SearchRequest(
            tenant=ctx.tenant,
            text=ctx.query,
            vector=ctx.vector,
            k=params.k,
            candidates=params.candidates,
            lexical_weight=decision.lexical_weight,
            dense_weight=decision.dense_weight,
        )
    )
    sources = tuple(citation_from_hit(h) for h in hits)
    if not hits:
        return _not_enough(sources, EvidenceGrade(False, 0.0, 0.0, "no_hits"))
    if params.grading is not None:
        best = best_possible_score(decision.lexical_weight, decision.dense_weight)
        evidence = grade(ctx.query, hits, params.grading, best)
        if not evidence.sufficient:
            return _not_enough(sources, evidence)
    if not has_model:
        return _extractive(sources)
    prompt = LOOKUP_SYSTEM.format(sources=format_sources([(h.title, h.text) for h in hits]))
    messages = (Message("system", prompt), *ctx.history, Message("user", ctx.query))
    return Generation(route=Route.LOOKUP, tier="small", messages=messages, sources=sources)


def _not_enough(sources: tuple[Citation, ...], evidence: EvidenceGrade) -> Answer:
    return Answer(
        NO_EVIDENCE_TEXT,
        Route.LOOKUP,
        citations=sources[:_EXTRACTIVE_PASSAGES],
        complete=False,
        escalated=True,
        escalation_reason=evidence.reason,
        notes=(
            f"escalated: evidence {evidence.reason.replace('_', ' ')} "
            f"(coverage {evidence.coverage:.2f}, agreement {evidence.agreement:.2f}); "
            "the multihop route is not available, so no answer was generated",
        ),
    )


def _extractive(sources: tuple[Citation, ...]) -> Answer:
    best = sources[:_EXTRACTIVE_PASSAGES]
    text = "\n\n".join(f"[{i}] {c.title}: {c.snippet}" for i, c in enumerate(best, 1))
    return Answer(text=text, route=Route.LOOKUP, citations=best, extractive=True)
