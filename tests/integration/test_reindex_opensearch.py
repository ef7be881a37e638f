"""`querygate reindex` on OpenSearch: a new physical index built from the stored texts while
the old one serves, writes of another client (another process's) reaching both, queries
running throughout, the alias swapped atomically, rollback and dropping the old version."""

from __future__ import annotations

import asyncio

import pytest

from backends.retrieval.access import access_list
from backends.retrieval.base import SearchRequest
from backends.retrieval.opensearch import OpenSearchRetriever
from backends.retrieval.versions import VersionError
from gateway.ingest import reindex
from gateway.ingest.chunker import ChunkingConfig
from gateway.ingest.pipeline import content_hash, ingest_documents
from gateway.ingest.readers import RawDocument
from tests.fixtures.embeddings import HashedWordsEmbedder
from tests.fixtures.opensearch import TEST_DIMENSION, RetrieverFactory

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]

TENANT = "acme"
SMALL_CHUNKS = ChunkingConfig(target_tokens=40, overlap=0.0, fit_window=False)


def raw(n: int, rev: int = 0) -> RawDocument:
    text = " ".join(f"Document {n} revision {rev} sentence {i} about topic{n}." for i in range(30))
    return RawDocument(f"doc-{n}", f"Title {n}", text)


def embedder(model_id: str = "hashed-words") -> HashedWordsEmbedder:
    return HashedWordsEmbedder(TEST_DIMENSION, model_id)


async def test_reindex_under_queries_and_writes_of_another_client(
    make_opensearch_retriever: RetrieverFactory,
) -> None:
    index = await make_opensearch_retriever()
    await ingest_documents(TENANT, [raw(n) for n in range(30)], embedder(), index)
    old = await index.current_index(TENANT)
    generation = await index.generation(TENANT)
    other = OpenSearchRetriever(index.config)  # its own client: as a gateway process
    acknowledged: dict[str, str | None] = {}
    searches: list[int] = []
    done = asyncio.Event()

    async def write_until_done() -> None:
        rev = 1
        while not done.is_set() or rev < 5:
            document = raw(rev % 35, rev)
            await ingest_documents(TENANT, [document], embedder(), other)
            acknowledged[document.doc_id] = content_hash(document.title, document.text)
            if rev % 6 == 0:
                gone = f"doc-{(rev + 2) % 35}"
                await other.delete_document(TENANT, gone)
                acknowledged[gone] = None
            rev += 1

    async def query_until_done() -> None:
        vector = (await embedder().embed(["topic3"]))[0]
        while not done.is_set():
            hits = await other.search(SearchRequest(TENANT, "topic3 sentence", vector, k=5))
            searches.append(len(hits))

    async def build() -> reindex.ReindexReport:
        try:
            return await reindex.reindex_tenant(
                TENANT, index, embedder("hashed-words-2"), chunking=SMALL_CHUNKS
            )
        finally:
            done.set()

    originals = {f"doc-{n}": content_hash(raw(n).title, raw(n).text) for n in range(30)}
    try:
        report, *_ = await asyncio.gather(build(), write_until_done(), query_until_done())
        expected = {**originals, **acknowledged}  # each document's last acknowledged state
        stored = await other.content_hashes(TENANT, list(expected))
    finally:
        await other.aclose()

    # What the copy wrote depends on how far the other client got first (a document it wrote
    # to both versions is already there); what the new version holds does not.
    assert report.switched and report.version == 2 and report.documents + report.caught_up > 0
    assert searches and all(n == 5 for n in searches)  # no query failed or came back short
    assert stored == {d: h for d, h in expected.items() if h is not None}
    assert (await index.stats(TENANT))[0] == len(stored)
    new = await index.current_index(TENANT)
    assert new == f"{index.config.tenant_alias(TENANT)}-v2" != old
    assert await index.generation(TENANT) > generation
    versions = await index.versions(TENANT)
    assert versions.serving.model == "hashed-words-2" and versions.serving.version == 2
    assert versions.previous is not None and versions.previous.version == 1
    assert versions.building is None


async def test_rollback_and_drop_old(make_opensearch_retriever: RetrieverFactory) -> None:
    index = await make_opensearch_retriever()
    await ingest_documents(TENANT, [raw(n) for n in range(5)], embedder(), index)
    _, chunks = await index.stats(TENANT)
    await reindex.reindex_tenant(TENANT, index, embedder(), chunking=SMALL_CHUNKS)
    docs, rebuilt = await index.stats(TENANT)
    assert docs == 5 and rebuilt > chunks
    # A write after the switch reaches the previous version too: a rollback keeps it.
    await ingest_documents(TENANT, [raw(9)], embedder(), index)
    with pytest.raises(VersionError, match="drop-old"):
        await index.begin_build(TENANT, "m", "c")
    generation = await index.generation(TENANT)

    versions = await index.rollback(TENANT)

    assert versions.serving.version == 1
    assert versions.previous is not None and versions.previous.version == 2
    assert await index.generation(TENANT) > generation
    assert await index.current_index(TENANT) == f"{index.config.tenant_alias(TENANT)}-v1"
    assert await index.content_hash(TENANT, "doc-9") == content_hash(raw(9).title, raw(9).text)
    assert (await index.stats(TENANT))[0] == 6
    versions = await index.drop_previous(TENANT)
    assert versions.previous is None
    with pytest.raises(VersionError, match="no previous"):
        await index.rollback(TENANT)
    freshness = await index.freshness(TENANT)
    assert (freshness.documents, freshness.version) == (6, 1)
    assert freshness.last_write is not None


async def test_a_rebuilt_document_keeps_its_access_list(
    make_opensearch_retriever: RetrieverFactory,
) -> None:
    index = await make_opensearch_retriever()
    private = RawDocument("private", "Private", raw(50).text, access_list(["staff", "admins"]))
    await ingest_documents(TENANT, [private, raw(1)], embedder(), index)

    report = await reindex.reindex_tenant(TENANT, index, embedder(), chunking=SMALL_CHUNKS)

    assert report.switched and report.caught_up == 0  # the same hashes: groups hash too
    by_id = {s.doc_id: s for s in await index.texts_of(TENANT, ["private", "doc-1"])}
    assert by_id["private"].groups == ("admins", "staff")
    assert by_id["doc-1"].groups is None


async def test_shared_tenancy_refuses_versions(make_opensearch_retriever: RetrieverFactory) -> None:
    index = await make_opensearch_retriever(tenancy="shared")
    await ingest_documents(TENANT, [raw(1)], embedder(), index)
    with pytest.raises(VersionError, match="tenancy shared"):
        await reindex.reindex_tenant(TENANT, index, embedder())
