"""`querygate reindex` on the embedded index: a new version built from the stored texts,
writes of another connection (another process's) applied to both versions while it builds,
an atomic switch that bumps the generation, rollback and dropping the old version."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from backends.retrieval.access import access_list
from backends.retrieval.base import Chunk, Document, SearchRequest
from backends.retrieval.embedded import EmbeddedRetriever
from backends.retrieval.versions import VersionError
from gateway.ingest import reindex
from gateway.ingest.chunker import ChunkingConfig
from gateway.ingest.pipeline import content_hash, ingest_documents
from gateway.ingest.readers import RawDocument
from tests.fixtures.embeddings import HashedWordsEmbedder

TENANT = "acme"
SMALL_CHUNKS = ChunkingConfig(target_tokens=40, overlap=0.0, fit_window=False)


def text_of(n: int, rev: int = 0) -> str:
    sentences = [f"Document {n} revision {rev} sentence {i} about topic{n}." for i in range(30)]
    return " ".join(sentences)


def raw(n: int, rev: int = 0) -> RawDocument:
    return RawDocument(f"doc-{n}", f"Title {n}", text_of(n, rev))


async def stored_hashes(index: EmbeddedRetriever, ids: list[str]) -> dict[str, str]:
    return await index.content_hashes(TENANT, ids)


@pytest.fixture
async def index(tmp_path: Path) -> EmbeddedRetriever:
    retriever = EmbeddedRetriever(tmp_path / "index.sqlite3")
    await ingest_documents(TENANT, [raw(n) for n in range(20)], HashedWordsEmbedder(), retriever)
    return retriever


async def test_a_reindex_rechunks_from_the_stored_text_and_switches(
    index: EmbeddedRetriever,
) -> None:
    before_docs, before_chunks = await index.stats(TENANT)
    generation = await index.generation(TENANT)
    embedder = HashedWordsEmbedder(model_id="hashed-words-2")

    report = await reindex.reindex_tenant(TENANT, index, embedder, chunking=SMALL_CHUNKS)

    assert report.switched and report.version == 2 and report.documents == 20
    docs, chunks = await index.stats(TENANT)
    assert docs == before_docs == 20 and chunks == report.chunks > before_chunks
    assert await index.generation(TENANT) > generation  # cached answers retire
    versions = await index.versions(TENANT)
    assert versions.serving.version == 2 and versions.serving.model == "hashed-words-2"
    assert versions.previous is not None and versions.previous.version == 1
    assert versions.building is None
    freshness = await index.freshness(TENANT)
    assert (freshness.version, freshness.model, freshness.chunks) == (2, "hashed-words-2", chunks)
    vector = (await embedder.embed(["topic7"]))[0]
    hits = await index.search(SearchRequest(TENANT, "topic7", vector, k=3))
    assert hits and hits[0].doc_id == "doc-7"
    await index.aclose()


async def test_rollback_serves_the_old_version_and_drop_old_removes_it(
    index: EmbeddedRetriever,
) -> None:
    _, chunks = await index.stats(TENANT)
    await reindex.reindex_tenant(TENANT, index, HashedWordsEmbedder(), chunking=SMALL_CHUNKS)
    # A write after the switch reaches the previous version too: a rollback keeps it.
    await ingest_documents(TENANT, [raw(99)], HashedWordsEmbedder(), index)
    generation = await index.generation(TENANT)
    with pytest.raises(VersionError, match="drop-old"):
        await index.begin_build(TENANT, "m", "c")

    versions = await index.rollback(TENANT)

    assert versions.serving.version == 1
    assert versions.previous is not None and versions.previous.version == 2
    assert await index.generation(TENANT) > generation
    assert await index.content_hash(TENANT, "doc-99") == content_hash("Title 99", text_of(99))
    docs, now = await index.stats(TENANT)
    assert docs == 21 and now > chunks  # the old chunking, plus doc-99's chunks
    versions = await index.drop_previous(TENANT)
    assert versions.previous is None
    with pytest.raises(VersionError, match="no previous"):
        await index.rollback(TENANT)
    # Version numbers only grow: the next build is 3, not the dropped 2.
    assert (await index.begin_build(TENANT, "m", "c")).building == (
        await index.versions(TENANT)
    ).building
    building = (await index.versions(TENANT)).building
    assert building is not None and building.version == 3
    await index.abort_build(TENANT)
    assert (await index.versions(TENANT)).building is None
    await index.aclose()


async def test_writes_of_another_connection_during_the_build_are_all_in_the_new_version(
    index: EmbeddedRetriever, tmp_path: Path
) -> None:
    # A second retriever on the same file: its own connection and thread, as another process.
    other = EmbeddedRetriever(tmp_path / "index.sqlite3")
    embedder = HashedWordsEmbedder()
    acknowledged: dict[str, str | None] = {}
    done = asyncio.Event()
    writes: list[int] = []

    async def writer() -> None:
        rev = 1
        while not done.is_set() or rev < 5:
            n = rev % 25  # rewrites existing documents and adds new ones
            document = raw(n, rev)
            await ingest_documents(TENANT, [document], embedder, other)
            acknowledged[document.doc_id] = content_hash(document.title, document.text)
            if rev % 7 == 0:
                assert await other.delete_document(TENANT, f"doc-{(rev + 3) % 25}") in (True, False)
                acknowledged[f"doc-{(rev + 3) % 25}"] = None
            rev += 1
            await asyncio.sleep(0)
        writes.append(rev)

    async def build() -> reindex.ReindexReport:
        try:
            return await reindex.reindex_tenant(TENANT, index, embedder, chunking=SMALL_CHUNKS)
        finally:
            done.set()

    report, _ = await asyncio.gather(build(), writer())

    assert report.switched and writes[0] > 5  # writes went on while it built
    assert (await other.versions(TENANT)).serving.version == 2
    stored = await stored_hashes(other, list(acknowledged))
    for doc_id, digest in acknowledged.items():
        assert stored.get(doc_id) == digest, doc_id
    # The other connection searches the new version: its chunks, not the ones it had loaded.
    docs, chunks = await other.stats(TENANT)
    assert (docs, chunks) == await index.stats(TENANT)
    present = next(d for d, digest in acknowledged.items() if digest is not None)
    topic = present.replace("doc-", "topic")
    vector = (await embedder.embed([topic]))[0]
    hits = await other.search(SearchRequest(TENANT, topic, vector, k=1))
    assert [h.doc_id for h in hits] == [present]
    await other.aclose()
    await index.aclose()


async def test_a_document_stored_without_its_text_refuses_the_build(
    index: EmbeddedRetriever,
) -> None:
    chunk = Chunk("old#0", "text", "", np.ones(384, dtype=np.float32) / np.sqrt(384))
    await index.upsert_document(TENANT, Document("old", "old", "h", (chunk,)))

    with pytest.raises(VersionError, match="1 documents were stored without their text"):
        await reindex.reindex_tenant(TENANT, index, HashedWordsEmbedder())

    assert (await index.versions(TENANT)).building is None
    await index.aclose()


async def test_a_rebuilt_document_keeps_its_access_list_and_source(
    index: EmbeddedRetriever,
) -> None:
    kept = RawDocument(
        "private", "Private", text_of(50), access_list(["staff", "admins"]), source="/docs/hr"
    )
    await ingest_documents(TENANT, [kept], HashedWordsEmbedder(), index)

    report = await reindex.reindex_tenant(TENANT, index, HashedWordsEmbedder())

    assert report.switched and report.caught_up == 0  # the same hashes: groups hash too
    (stored,) = await index.texts_of(TENANT, ["private"])
    assert stored.groups == ("admins", "staff")
    # Its recorded source too: `ingest --prune` still knows where it came from.
    assert await index.sources(TENANT, ["private"]) == {"private": "/docs/hr"}
    (public,) = await index.texts_of(TENANT, ["doc-1"])
    assert public.groups is None
    await index.aclose()
