"""The full-context route: a corpus small enough to read whole is read whole.

Retrieval can only miss; when every chunk of the tenant fits the budget, the model sees all of
them (ordered by similarity to the question) and cites them like lookup sources. A question the
classifier called multi-hop gets the large tier: it has to combine facts, not find one.
"""

from __future__ import annotations

from backends.llm.base import Message
from backends.retrieval.base import Hit, Retriever, SearchRequest, Vector
from routers.generation import citation_from_hit
from routers.prompts import LOOKUP_SYSTEM, format_sources
from routers.rules import FullContextConfig
from routers.types import Generation, Route, RouteContext

# A cheap, conservative token estimate (English averages ~4 characters a token).
_CHARS_PER_TOKEN = 4


async def corpus_chunks(
    retriever: Retriever, tenant: str, vector: Vector, config: FullContextConfig
) -> list[Hit] | None:
    """Every chunk of the tenant, most similar first, when they fit the budget; else None."""
    _, chunks = await retriever.stats(tenant)
    if chunks == 0 or chunks > config.max_chunks:
        return None
    hits = await retriever.search(
        SearchRequest(
            tenant=tenant,
            text="",
            vector=vector,
            k=chunks,
            candidates=chunks,
            mode="dense",
        )
    )
    tokens = sum(len(h.title) + len(h.text) for h in hits) // _CHARS_PER_TOKEN
    return hits if tokens <= config.max_tokens else None


def plan_full_context(ctx: RouteContext, hits: list[Hit], has_large: bool) -> Generation:
    wanted_multihop = ctx.decision.classification.route is Route.MULTIHOP
    prompt = LOOKUP_SYSTEM.format(sources=format_sources([(h.title, h.text) for h in hits]))
    return Generation(
        route=Route.FULL_CONTEXT,
        tier="large" if wanted_multihop and has_large else "small",
        messages=(Message("system", prompt), *ctx.history, Message("user", ctx.query)),
        sources=tuple(citation_from_hit(h) for h in hits),
    )
