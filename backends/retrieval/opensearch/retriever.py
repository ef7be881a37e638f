"""`OpenSearchRetriever`: the `Retriever` seam over one cluster, assembled from the layout,
the reads, the writes and the generation counters that share its one pooled client."""

from __future__ import annotations

from collections.abc import Sequence

from backends.retrieval.access import NO_GROUPS, Groups
from backends.retrieval.base import Document, FusionMethod, Hit, SearchRequest
from backends.retrieval.opensearch.bulk import Bulk
from backends.retrieval.opensearch.config import OpenSearchConfig
from backends.retrieval.opensearch.generations import Generations
from backends.retrieval.opensearch.layout import IndexLayout
from backends.retrieval.opensearch.migrate import migrate_shared_to_per_tenant
from backends.retrieval.opensearch.queries import fusion_path
from backends.retrieval.opensearch.search import Search
from backends.retrieval.opensearch.sources import Sources
from backends.retrieval.opensearch.versions import OpenSearchVersions
from backends.retrieval.opensearch.writes import Writes


class OpenSearchRetriever(OpenSearchVersions):
    """`Retriever` over one OpenSearch cluster; one pooled async client per instance. Its
    index versions (`backends.retrieval.versions`) are `OpenSearchVersions`'."""

    name = "opensearch"

    def __init__(self, config: OpenSearchConfig) -> None:
        self.config = config
        layout = IndexLayout(config)
        generations = Generations(layout.client, config)
        writes = Writes(layout, Bulk(layout.client, config), generations)
        # Sets the parts every method below works with: _layout, _writes, _generations, _search.
        super().__init__(layout, writes, generations, Search(layout))
        self._sources = Sources(layout)

    # -- lifecycle ---------------------------------------------------------------------------

    async def __aenter__(self) -> OpenSearchRetriever:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._layout.aclose()

    async def ensure_index(self) -> None:
        """Create the layout if absent (idempotent; `IndexLayout.ensure_index`)."""
        await self._layout.ensure_index()

    async def drop_all(self) -> None:
        """Delete every index, template and pipeline of this alias (tests, teardown)."""
        await self._layout.drop_all()

    async def ping(self) -> str | None:
        return await self._layout.ping()

    # -- index versions ----------------------------------------------------------------------

    async def current_index(self, tenant: str | None = None) -> str:
        return await self._layout.current_index(tenant)

    async def drop_index(self, index: str, tenant: str | None = None) -> None:
        await self._layout.drop_index(index, tenant)

    async def migrate_shared_to_per_tenant(self, timeout_s: float = 3600.0) -> dict[str, int]:
        """The chunks copied per tenant; see `migrate.migrate_shared_to_per_tenant`."""
        return await migrate_shared_to_per_tenant(self._layout, timeout_s)

    # -- reads -------------------------------------------------------------------------------

    async def search(self, request: SearchRequest) -> list[Hit]:
        return await self._search.search(request)

    def fusion_path(self, method: FusionMethod) -> str:
        """Where hybrid search with `method` fuses, and why: what start-up logs. Known once
        the node was asked for its plugins (`ensure_index`)."""
        return fusion_path(self.config, self._layout.neural_search, method)

    async def document_chunks(
        self, tenant: str, doc_id: str, limit: int = 50, groups: Groups = NO_GROUPS
    ) -> list[Hit]:
        return await self._search.document_chunks(tenant, doc_id, limit, groups)

    async def stats(self, tenant: str) -> tuple[int, int]:
        return await self._search.stats(tenant)

    async def generation(self, tenant: str) -> int:
        await self._layout.ensure_ready()
        return await self._generations.read(tenant)

    async def content_hash(self, tenant: str, doc_id: str) -> str | None:
        return (await self.content_hashes(tenant, [doc_id])).get(doc_id)

    async def content_hashes(self, tenant: str, doc_ids: Sequence[str]) -> dict[str, str]:
        return await self._writes.content_hashes(tenant, doc_ids)

    async def sources(self, tenant: str, doc_ids: Sequence[str]) -> dict[str, str]:
        return await self._sources.sources(tenant, doc_ids)

    async def source_documents(self, tenant: str, source: str) -> list[str]:
        return await self._sources.source_documents(tenant, source)

    # -- writes ------------------------------------------------------------------------------

    async def upsert_document(self, tenant: str, document: Document) -> bool:
        return (await self.upsert_documents(tenant, [document]))[0]

    async def upsert_documents(self, tenant: str, documents: Sequence[Document]) -> list[bool]:
        return await self._writes.upsert_documents(tenant, documents)

    async def delete_document(self, tenant: str, doc_id: str) -> bool:
        return await self._writes.delete_document(tenant, doc_id)

    async def set_source(self, tenant: str, doc_ids: Sequence[str], source: str) -> None:
        await self._sources.set_source(tenant, doc_ids, source)
