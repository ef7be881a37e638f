"""Documents' provenance in the cluster: every chunk carries its document's `source` (a keyword),
read back per document, rewritten in place by `set_source` and listed per source for a prune.
Chunks written before the field existed have none, which reads as "" (no source)."""

from __future__ import annotations

from collections.abc import Sequence

from backends.retrieval.opensearch.client import Json, translated
from backends.retrieval.opensearch.layout import IndexLayout
from backends.retrieval.opensearch.queries import VISIBLE
from backends.retrieval.opensearch.stored import read_stored

# Documents per update of their chunks' source, and document ids per page of a listing.
_UPDATE_DOCS = 500
_LIST_PAGE = 1000


class Sources:
    """The provenance reads and writes of one retriever."""

    def __init__(self, layout: IndexLayout) -> None:
        self._layout = layout

    async def sources(self, tenant: str, doc_ids: Sequence[str]) -> dict[str, str]:
        await self._layout.ensure_ready()
        stored = await read_stored(self._layout.client, self._layout.config, tenant, doc_ids)
        return {doc_id: entry.source for doc_id, entry in stored.items() if entry.visible_keys}

    async def set_source(self, tenant: str, doc_ids: Sequence[str], source: str) -> None:
        """One update-by-query per slice of documents, every chunk of each (hidden ones too, so
        a flip still to come shows the same source); refreshed, so a listing sees it at once."""
        await self._layout.ensure_ready()
        config = self._layout.config
        for start in range(0, len(doc_ids), _UPDATE_DOCS):
            part = list(doc_ids[start : start + _UPDATE_DOCS])
            body: Json = {
                "query": {
                    "bool": {"filter": [{"term": {"tenant": tenant}}, {"terms": {"doc_id": part}}]}
                },
                "script": {
                    "lang": "painless",
                    "source": "ctx._source.source = params.source",
                    "params": {"source": source},
                },
            }
            with translated("set_source"):
                await self._layout.client.update_by_query(
                    index=config.tenant_alias(tenant),
                    body=body,
                    conflicts="proceed",  # a chunk a concurrent write changed keeps its own
                    refresh=True,
                    ignore_unavailable=True,
                    request_timeout=config.write_timeout_s,
                )

    async def source_documents(self, tenant: str, source: str) -> list[str]:
        """Every visible document of the source, paged with a composite aggregation."""
        await self._layout.ensure_ready()
        config = self._layout.config
        composite: Json = {"size": _LIST_PAGE, "sources": [{"id": {"terms": {"field": "doc_id"}}}]}
        body: Json = {
            "size": 0,
            "query": {"bool": {"filter": [{"term": {"tenant": tenant}}, VISIBLE, _of(source)]}},
            "aggs": {"docs": {"composite": composite}},
        }
        found: list[str] = []
        while True:
            with translated("source_documents"):
                response = await self._layout.client.search(
                    index=config.tenant_alias(tenant),
                    body=body,
                    ignore_unavailable=True,
                    request_timeout=config.search_timeout_s,
                )
            # No aggregations at all when the tenant has no index yet.
            docs = response.get("aggregations", {}).get("docs", {})
            buckets = docs.get("buckets", [])
            found += [str(bucket["key"]["id"]) for bucket in buckets]
            if len(buckets) < _LIST_PAGE or "after_key" not in docs:
                return sorted(found)
            composite["after"] = docs["after_key"]


def _of(source: str) -> Json:
    """Chunks recorded with `source`; for "", chunks with no source field too."""
    if source:
        return {"term": {"source": source}}
    missing: Json = {"bool": {"must_not": {"exists": {"field": "source"}}}}
    return {"bool": {"should": [{"term": {"source": ""}}, missing], "minimum_should_match": 1}}
