"""What is stored of a tenant's documents, as a write needs it: every chunk's key, each
version's visible keys and flip stamp, and which versions have hidden (pending) chunks."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field

from opensearchpy import AsyncOpenSearch

from backends.retrieval.opensearch.client import Json, translated
from backends.retrieval.opensearch.config import OpenSearchConfig

# Documents per stored-state lookup, and hits per page of it.
_LOOKUP_DOCS = 500
_LOOKUP_PAGE = 1000


@dataclass
class Stored:
    """A stored document as a write needs it: its chunks' keys, hashes and visibility."""

    chunk_keys: list[str] = field(default_factory=list)
    # Visible chunks' keys by content hash, and the highest flip stamp (the generation the flip
    # expected to produce) among each hash's visible chunks.
    visible: dict[str, list[str]] = field(default_factory=dict)
    stamps: dict[str, int] = field(default_factory=dict)
    hidden_hashes: set[str] = field(default_factory=set)
    source: str = ""  # as its visible chunks record it ("": none, or chunks from before sources)

    @property
    def visible_keys(self) -> set[str]:
        return {key for keys in self.visible.values() for key in keys}

    @property
    def content_hash(self) -> str:
        """The hash of the version readers see whole; "" when what they see is not one whole
        version (a flip that failed part-way), so that a retry writes the document again.
        Hidden chunks of another version (staging that failed) do not count: they are invisible
        and the next write of the document deletes them."""
        if len(self.visible) != 1:
            return ""
        (visible,) = self.visible
        return "" if visible in self.hidden_hashes else visible

    def losers(self) -> list[str]:
        """Visible keys of every version but the winner's (highest stamp, then hash): what
        two writers that both flipped leave, and what settling deletes."""
        if len(self.visible) < 2:
            return []
        winner = max(self.visible, key=lambda h: (self.stamps.get(h, 0), h))
        return [key for h, keys in self.visible.items() if h != winner for key in keys]


async def read_stored(
    client: AsyncOpenSearch,
    config: OpenSearchConfig,
    tenant: str,
    doc_ids: Sequence[str],
    index: str | None = None,
) -> dict[str, Stored]:
    """What is stored of these documents, hidden chunks included, by doc id: behind the
    tenant's alias, or in `index` (one version of it)."""
    found: dict[str, Stored] = {}
    for start in range(0, len(doc_ids), _LOOKUP_DOCS):
        part = list(dict.fromkeys(doc_ids[start : start + _LOOKUP_DOCS]))
        async for hit in _hits_of(
            client, config, index or config.tenant_alias(tenant), tenant, part
        ):
            source = hit["_source"]
            entry = found.setdefault(source["doc_id"], Stored())
            key = str(hit["_id"])
            entry.chunk_keys.append(key)
            content_hash = str(source["content_hash"])
            if source.get("pending", False):
                entry.hidden_hashes.add(content_hash)
            else:
                entry.visible.setdefault(content_hash, []).append(key)
                entry.source = str(source.get("source", ""))
                stamp = int(source.get("generation", 0))
                entry.stamps[content_hash] = max(entry.stamps.get(content_hash, 0), stamp)
    return found


async def _hits_of(
    client: AsyncOpenSearch, config: OpenSearchConfig, index: str, tenant: str, doc_ids: list[str]
) -> AsyncIterator[Json]:
    """Every chunk of the documents, paged with search_after (no result-window limit)."""
    body: Json = {
        "size": _LOOKUP_PAGE,
        "_source": ["doc_id", "content_hash", "pending", "generation", "source"],
        "query": {
            "bool": {"filter": [{"term": {"tenant": tenant}}, {"terms": {"doc_id": doc_ids}}]}
        },
        "sort": [{"doc_id": "asc"}, {"chunk_id": "asc"}, {"content_hash": "asc"}],
    }
    while True:
        with translated("stored"):
            response = await client.search(
                index=index,
                body=body,
                ignore_unavailable=True,
                request_timeout=config.write_timeout_s,
            )
        hits = response["hits"]["hits"]
        for hit in hits:
            yield hit
        if len(hits) < _LOOKUP_PAGE:
            return
        body["search_after"] = hits[-1]["sort"]
