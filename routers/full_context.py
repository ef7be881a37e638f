"""The full-context route: a corpus small enough to read whole is read whole.

Retrieval can only miss; when every chunk of the tenant fits the budget, the model sees all of
them (ordered by similarity to the question) and cites them like lookup sources. A question the
classifier called multi-hop gets the large tier: it has to combine facts, not find one.
"""

from __future__ import annotations

from backends.llm.base import Message, Tier
from backends.retrieval.access import Groups
from backends.retrieval.base import Hit, Retriever, SearchRequest, Vector
from routers.generation import citation_from_hit
from routers.prompts import LOOKUP_SYSTEM, format_sources, new_source_tag
from routers.rules import FullContextConfig
from routers.types import Generation, Route, RouteContext

# A cheap, conservative token estimate (English averages ~4 characters a token).
_CHARS_PER_TOKEN = 4


async def corpus_chunks(
    retriever: Retriever, tenant: str, groups: Groups, vector: Vector, config: FullContextConfig
) -> list[Hit] | None:
    """Every chunk of the tenant a reader in `groups` may read, most similar first, when they
    fit the budget; else None. The tenant's count of all its chunks bounds the search (those
    the reader may read are at most as many)."""
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
            groups=groups,
        )
    )
    if not hits:
        return None
    tokens = sum(len(h.title) + len(h.text) for h in hits) // _CHARS_PER_TOKEN
    return hits if tokens <= config.max_tokens else None


class FullContextExecutor:
    """Registered only where a model can read the corpus; `multihop_tier` is used when the
    classifier said multi-hop (it has to combine facts, not find one) and a model serves it."""

    def __init__(self, tier: Tier, multihop_tier: Tier | None) -> None:
        self._tier = tier
        self._multihop_tier = multihop_tier

    async def __call__(self, ctx: RouteContext) -> Generation:
        wanted_multihop = ctx.decision.classification.route is Route.MULTIHOP
        hits = ctx.corpus
        tag = new_source_tag()
        prompt = LOOKUP_SYSTEM.format(tag=tag, sources=format_sources(tag, list(hits)))
        return Generation(
            route=Route.FULL_CONTEXT,
            tier=self._multihop_tier if wanted_multihop and self._multihop_tier else self._tier,
            messages=(Message("system", prompt), *ctx.history, Message("user", ctx.query)),
            sources=tuple(citation_from_hit(h) for h in hits),
            source_tag=tag,
            options=ctx.options,
        )
