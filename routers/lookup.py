"""The lookup route: one hybrid retrieval, then the small model answers with citations.

With no model configured the answer is extractive: the best passages, verbatim, cited. When
the evidence is too thin the route says so instead of guessing.
"""

from __future__ import annotations

from dataclasses import dataclass

from backends.llm.base import Message
from backends.retrieval.base import Hit, Retriever, SearchRequest
from routers.generation import citation_from_hit
from routers.prompts import LOOKUP_SYSTEM, format_sources
from routers.types import Answer, Citation, Generation, Route, RouteContext

NO_EVIDENCE_TEXT = "Not enough evidence in the documents to answer this question."
_EXTRACTIVE_PASSAGES = 3


@dataclass(frozen=True, slots=True)
class LookupParams:
    k: int
    candidates: int
    min_top_score: float


async def plan_lookup(
    ctx: RouteContext, retriever: Retriever, params: LookupParams, has_model: bool
) -> Answer | Generation:
    hits = await retriever.search(
        SearchRequest(
            tenant=ctx.tenant,
            text=ctx.query,
            vector=ctx.vector,
            k=params.k,
            candidates=params.candidates,
            lexical_weight=ctx.decision.lexical_weight,
            dense_weight=ctx.decision.dense_weight,
        )
    )
    sources = tuple(citation_from_hit(h) for h in hits)
    if not _sufficient(hits, params):
        return Answer(NO_EVIDENCE_TEXT, Route.LOOKUP, citations=sources, complete=False)
    if not has_model:
        return _extractive(sources)
    prompt = LOOKUP_SYSTEM.format(sources=format_sources([(h.title, h.text) for h in hits]))
    messages = (Message("system", prompt), *ctx.history, Message("user", ctx.query))
    return Generation(route=Route.LOOKUP, tier="small", messages=messages, sources=sources)


def _sufficient(hits: list[Hit], params: LookupParams) -> bool:
    return bool(hits) and hits[0].score >= params.min_top_score


def _extractive(sources: tuple[Citation, ...]) -> Answer:
    best = sources[:_EXTRACTIVE_PASSAGES]
    text = "\n\n".join(f"[{i}] {c.title}: {c.snippet}" for i, c in enumerate(best, 1))
    return Answer(text=text, route=Route.LOOKUP, citations=best, extractive=True)
