"""EmbeddedRetriever: tenancy, identifiers, idempotent writes, generations, hostile queries."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator
from contextlib import closing
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from backends.errors import BackendUnavailable
from backends.retrieval import embedded
from backends.retrieval.base import (
    MAX_DOCUMENT_CHUNKS,
    RRF_K,
    Chunk,
    Document,
    EmptyDocument,
    Hit,
    RetrievalMode,
    SearchRequest,
)
from backends.retrieval.embedded import EmbeddedRetriever, fts_query
from backends.retrieval.embedded import state as embedded_state
from backends.retrieval.embedded import store as embedded_store
from backends.retrieval.embedded import versions as embedded_versions
from backends.retrieval.embedded import writes as embedded_writes
from backends.retrieval.embedded.search import search_hits
from tests.fixtures import tenancy
from tests.fixtures.documents import chunk_ids, make_doc
from tests.fixtures.embeddings import unit_vector
from tests.fixtures.provenance import check_provenance

MODES: tuple[RetrievalMode, ...] = ("bm25", "dense", "hybrid")


doc = make_doc
ids = chunk_ids


@pytest.fixture
async def index(tmp_path: Path) -> AsyncIterator[EmbeddedRetriever]:
    async with EmbeddedRetriever(tmp_path / "index.sqlite3") as retriever:
        yield retriever


@pytest.mark.parametrize("mode", MODES)
async def test_tenant_never_sees_another_tenants_perfect_match(
    index: EmbeddedRetriever, mode: RetrievalMode
) -> None:
    secret = "zanzibar quarterly revenue forecast"
    await index.upsert_document("tenant-b", doc("b1", [secret], [7]))
    await index.upsert_document("tenant-a", doc("a1", ["unrelated notes on gardening"], [8]))
    request = SearchRequest("tenant-a", secret, unit_vector(7), k=10, mode=mode)
    hits = await index.search(request)
    assert "b1#0" not in ids(hits)
    assert all(h.doc_id == "a1" for h in hits)


async def test_tenant_with_no_documents_gets_nothing(index: EmbeddedRetriever) -> None:
    await index.upsert_document("tenant-b", doc("b1", ["shared words"], [1]))
    assert await index.search(SearchRequest("tenant-a", "shared words", unit_vector(1))) == []


@pytest.mark.parametrize("identifier", ["ERR-4471", "SKU_123"])
async def test_identifier_matches_exactly_in_bm25(
    index: EmbeddedRetriever, identifier: str
) -> None:
    await index.upsert_document(
        "t",
        doc(
            "d",
            [f"the failure {identifier} appears at boot", "ERR-4472 and SKU_124 are neighbours"],
            [1, 2],
        ),
    )
    await index.upsert_document("t", doc("other", ["err 4471 sku 123 split apart"], [3]))
    hits = await index.search(SearchRequest("t", identifier, unit_vector(9), mode="bm25"))
    assert ids(hits) == ["d#0"]


async def test_title_outweighs_the_same_word_in_text(index: EmbeddedRetriever) -> None:
    await index.upsert_document("t", doc("body", ["notes about a volcano and lava"], [1]))
    await index.upsert_document("t", doc("titled", ["notes about lava"], [2], title="Volcano"))
    hits = await index.search(SearchRequest("t", "volcano", unit_vector(3), mode="bm25"))
    assert ids(hits)[0] == "titled#0"


async def test_dense_ranks_by_cosine(index: EmbeddedRetriever) -> None:
    await index.upsert_document("t", doc("d", ["one", "two", "three"], [1, 2, 3]))
    mix = unit_vector(2) + 0.3 * unit_vector(3)
    query = (mix / np.linalg.norm(mix)).astype(np.float32)
    hits = await index.search(SearchRequest("t", "", query, mode="dense"))
    assert ids(hits)[:2] == ["d#1", "d#2"]
    assert hits[0].dense_score == pytest.approx(float(unit_vector(2) @ query), abs=1e-5)


async def test_hybrid_scores_are_weighted_rrf(index: EmbeddedRetriever) -> None:
    await index.upsert_document("t", doc("d", ["alpha words", "beta words"], [1, 2]))
    request = SearchRequest(
        "t", "alpha", unit_vector(2), lexical_weight=2.0, dense_weight=0.5, fusion="rrf"
    )
    hits = {h.chunk_id: h for h in await index.search(request)}
    alpha, beta = hits["d#0"], hits["d#1"]
    assert (alpha.bm25_rank, alpha.dense_rank) == (1, 2)
    assert alpha.score == pytest.approx(2.0 / (RRF_K + 1) + 0.5 / (RRF_K + 2))
    assert (beta.bm25_rank, beta.score) == (None, pytest.approx(0.5 / (RRF_K + 1)))


async def test_hit_carries_title_section_and_text(index: EmbeddedRetriever) -> None:
    await index.upsert_document("t", doc("d", ["the body text"], [1], title="The Title"))
    (hit,) = await index.search(SearchRequest("t", "body", unit_vector(1), mode="bm25"))
    assert (hit.doc_id, hit.title, hit.section, hit.text) == (
        "d",
        "The Title",
        "section 0",
        "the body text",
    )


async def test_upsert_replaces_every_chunk_of_the_document(index: EmbeddedRetriever) -> None:
    await index.upsert_document("t", doc("d", ["old apple", "old pear", "old plum"], [1, 2, 3]))
    await index.search(SearchRequest("t", "old", unit_vector(1)))  # vectors now in memory
    assert await index.upsert_document("t", doc("d", ["new apple"], [4], rev="2"))
    hits = await index.search(SearchRequest("t", "old apple", unit_vector(2), k=10))
    assert [h.text for h in hits] == ["new apple"]
    assert await index.stats("t") == (1, 1)


async def test_same_content_hash_is_a_no_op(index: EmbeddedRetriever) -> None:
    assert await index.upsert_document("t", doc("d", ["text"], [1]))
    generation = await index.generation("t")
    assert not await index.upsert_document("t", doc("d", ["text"], [1]))
    assert await index.generation("t") == generation
    assert await index.content_hash("t", "d") == "d-1"


async def test_delete_removes_the_document_from_both_arms(index: EmbeddedRetriever) -> None:
    await index.upsert_document("t", doc("d", ["doomed words"], [1]))
    await index.upsert_document("t", doc("keep", ["kept words"], [2]))
    await index.search(SearchRequest("t", "words", unit_vector(1)))
    assert await index.delete_document("t", "d")
    assert not await index.delete_document("t", "d")
    for mode in MODES:
        hits = await index.search(SearchRequest("t", "doomed", unit_vector(1), mode=mode))
        assert "d#0" not in ids(hits)
    assert await index.content_hash("t", "d") is None
    assert await index.stats("t") == (1, 1)


async def test_generation_bumps_on_every_change_and_only_for_that_tenant(
    index: EmbeddedRetriever,
) -> None:
    assert await index.generation("t") == 0
    await index.upsert_document("t", doc("d", ["a"], [1]))
    await index.upsert_document("t", doc("d", ["b"], [1], rev="2"))
    await index.delete_document("t", "d")
    assert await index.generation("t") == 3
    assert await index.generation("other") == 0


def long_doc(doc_id: str, chunks: int, word: str = "part") -> Document:
    """A document of `chunks` chunks, stored last chunk first so storage order is no help."""
    texts = [f"{word} {n}" for n in range(chunks)]
    document = doc(doc_id, texts, list(range(chunks)))
    return replace(document, chunks=document.chunks[::-1])


async def test_document_chunks_come_in_numeric_reading_order(index: EmbeddedRetriever) -> None:
    await index.upsert_document("t", long_doc("d", 12))
    assert ids(await index.document_chunks("t", "d")) == [f"d#{n}" for n in range(12)]


async def test_document_chunks_without_a_number_come_last(index: EmbeddedRetriever) -> None:
    chunks = tuple(Chunk(i, i, "", unit_vector(n)) for n, i in enumerate(["d#x", "d#10", "d#2"]))
    await index.upsert_document("t", Document("d", "d", "h", chunks))
    assert ids(await index.document_chunks("t", "d")) == ["d#2", "d#10", "d#x"]


async def test_document_chunks_are_read_not_ranked(index: EmbeddedRetriever) -> None:
    await index.upsert_document("t", doc("d", ["the body text"], [1], title="The Title"))
    assert await index.document_chunks("t", "d") == [
        Hit("d", "d#0", "The Title", "section 0", "the body text", 0.0)
    ]


@pytest.mark.parametrize(
    ("limit", "expected"), [(5, 5), (0, 1), (-3, 1), (10_000, MAX_DOCUMENT_CHUNKS)]
)
async def test_document_chunks_stop_at_the_clamped_limit(
    index: EmbeddedRetriever, limit: int, expected: int
) -> None:
    await index.upsert_document("t", long_doc("d", MAX_DOCUMENT_CHUNKS + 5))
    hits = await index.document_chunks("t", "d", limit=limit)
    assert ids(hits) == [f"d#{n}" for n in range(expected)]


async def test_document_chunks_of_an_unknown_document_are_empty(index: EmbeddedRetriever) -> None:
    await index.upsert_document("t", doc("d", ["words"], [1]))
    assert await index.document_chunks("t", "missing") == []


async def test_document_chunks_never_cross_tenants(index: EmbeddedRetriever) -> None:
    await index.upsert_document("tenant-a", long_doc("shared", 3, "alpha"))
    await index.upsert_document("tenant-b", long_doc("shared", 2, "beta"))
    texts_a = [h.text for h in await index.document_chunks("tenant-a", "shared")]
    texts_b = [h.text for h in await index.document_chunks("tenant-b", "shared")]
    assert texts_a == ["alpha 0", "alpha 1", "alpha 2"]
    assert texts_b == ["beta 0", "beta 1"]
    assert await index.document_chunks("tenant-c", "shared") == []


@pytest.mark.parametrize(
    "text",
    ['"', "*", "NEAR(a b)", "title:secret", "(", ")", "a AND", "OR", "^x", "-", '"unclosed', ""],
)
@pytest.mark.parametrize("mode", MODES)
async def test_fts_syntax_in_a_query_never_raises(
    index: EmbeddedRetriever, text: str, mode: RetrievalMode
) -> None:
    await index.upsert_document("t", doc("d", ["near title secret words"], [1]))
    await index.search(SearchRequest("t", text, unit_vector(1), mode=mode))


def test_query_is_an_or_of_quoted_unique_terms_capped() -> None:
    assert fts_query('Reset "ERR-4471" NEAR(x) reset') == '"reset" OR "err-4471" OR "near" OR "x"'
    assert fts_query("?!... ---") == ""


def test_query_drops_stopwords_unless_nothing_else_is_left() -> None:
    assert fts_query("Who composed the Brandenburg Concertos?") == (
        '"composed" OR "brandenburg" OR "concertos"'
    )
    assert fts_query("The Who") == '"the" OR "who"'
    assert fts_query(" ".join(f"w{i}" for i in range(100))).count(" OR ") == 31


async def test_query_without_terms_has_no_bm25_arm(index: EmbeddedRetriever) -> None:
    await index.upsert_document("t", doc("d", ["words"], [1]))
    assert await index.search(SearchRequest("t", "?!", unit_vector(1), mode="bm25")) == []
    (hit,) = await index.search(SearchRequest("t", "?!", unit_vector(1)))
    assert (hit.bm25_rank, hit.dense_rank) == (None, 1)


async def test_index_persists_across_reopen(tmp_path: Path) -> None:
    path = tmp_path / "index.sqlite3"
    async with EmbeddedRetriever(path) as first:
        await first.upsert_document("t", doc("d", ["durable words"], [1]))
    async with EmbeddedRetriever(path) as second:
        hits = await second.search(SearchRequest("t", "durable", unit_vector(1)))
        assert ids(hits) == ["d#0"]
        assert (hits[0].bm25_rank, hits[0].dense_rank) == (1, 1)
        assert await second.generation("t") == 1
        assert await second.content_hash("t", "d") == "d-1"


async def test_writes_by_another_process_reach_the_dense_arm(tmp_path: Path) -> None:
    path = tmp_path / "index.sqlite3"
    async with EmbeddedRetriever(path) as server, EmbeddedRetriever(path) as ingest:
        await server.upsert_document("t", doc("old", ["old words"], [1]))
        await server.search(SearchRequest("t", "", unit_vector(1), mode="dense"))  # loaded
        await ingest.upsert_document("t", doc("new", ["new words"], [2]))
        await ingest.delete_document("t", "old")
        await server.upsert_document("t", doc("own", ["own words"], [3]))
        hits = await server.search(SearchRequest("t", "", unit_vector(2), k=10, mode="dense"))
        assert sorted(ids(hits)) == ["new#0", "own#0"]
        assert ids(hits)[0] == "new#0"


async def test_database_is_in_wal_mode(tmp_path: Path) -> None:
    path = tmp_path / "index.sqlite3"
    async with EmbeddedRetriever(path) as index:
        await index.ping()
    with closing(sqlite3.connect(path)) as db:
        assert db.execute("PRAGMA journal_mode").fetchone() == ("wal",)


async def test_vectors_of_another_dimension_are_refused(index: EmbeddedRetriever) -> None:
    await index.upsert_document("t", doc("d", ["a"], [1]))
    wrong = Document("e", "e", "h", (Chunk("e#0", "b", "", np.ones(8, dtype=np.float32)),))
    with pytest.raises(ValueError, match="384"):
        await index.upsert_document("t", wrong)


async def test_unopenable_file_is_backend_unavailable(tmp_path: Path) -> None:
    async with EmbeddedRetriever(tmp_path / "missing-dir" / "index.sqlite3") as index:
        with pytest.raises(BackendUnavailable):
            await index.ping()


async def test_closed_index_is_backend_unavailable(tmp_path: Path) -> None:
    index = EmbeddedRetriever(tmp_path / "index.sqlite3")
    await index.aclose()
    await index.aclose()
    with pytest.raises(BackendUnavailable):
        await index.ping()
    with pytest.raises(BackendUnavailable):
        await index.document_chunks("t", "d")


async def test_concurrent_writes_and_searches_stay_consistent(index: EmbeddedRetriever) -> None:
    docs = [doc(f"d{i}", [f"common word{i}"], [i]) for i in range(40)]
    searches = [index.search(SearchRequest("t", "common", unit_vector(0), k=50)) for _ in range(20)]
    await asyncio.gather(*(index.upsert_document("t", d) for d in docs), *searches)
    hits = await index.search(SearchRequest("t", "common", unit_vector(0), k=50))
    assert len(hits) == 40
    assert await index.stats("t") == (40, 40)


def test_a_snapshot_older_than_a_tenants_first_write_searches_no_table(tmp_path: Path) -> None:
    # A read whose snapshot began before another connection's first write of the tenant
    # committed: that write's table is not in the snapshot, whatever the process knows of it.
    path = tmp_path / "index.sqlite3"
    shared = embedded_state.Shared()
    writer = embedded_state.IndexState(embedded_store.open_file(path), shared)
    embedded_versions.create_tables(writer.db)
    reader = embedded_state.IndexState(embedded_store.open_reader(path), shared)
    request = SearchRequest("t", "common", unit_vector(0), k=5)
    with embedded_store.snapshot(reader.db):
        reader.db.execute("SELECT count(*) FROM chunks").fetchone()  # the snapshot begins
        assert embedded_writes.upsert(writer, "t", doc("d0", ["common word"], [0]))
        assert reader.fts("t") is None
        assert search_hits(reader, request, ["common"], "rrf", 100) == []
    with embedded_store.snapshot(reader.db):
        assert [h.doc_id for h in search_hits(reader, request, ["common"], "rrf", 100)] == ["d0"]


# -- tenancy of statistics, atomic writes, empty documents, the shared-table migration -------


async def test_another_tenants_documents_never_move_a_tenants_ranking(
    index: EmbeddedRetriever,
) -> None:
    """The membership oracle (tests/fixtures/tenancy.py) is closed: per-tenant FTS tables and
    per-tenant exact cosine leave the prober's scores, not only its order, exactly as they were."""
    await tenancy.seed_prober(index, 384)
    before = await tenancy.observe(index, 384)
    assert before.first == "p1#0"

    await tenancy.seed_other(index, 384)

    assert await tenancy.observe(index, 384) == before


async def test_an_empty_document_is_refused_and_nothing_of_its_batch_is_written(
    index: EmbeddedRetriever,
) -> None:
    empty = Document("headings-only", "Title", "h", ())
    with pytest.raises(EmptyDocument) as refused:
        await index.upsert_documents("t", [doc("fine", ["words"], [1]), empty])
    assert refused.value.doc_id == "headings-only"
    assert isinstance(refused.value, ValueError)
    with pytest.raises(EmptyDocument):
        await index.upsert_document("t", empty)
    assert await index.stats("t") == (0, 0)
    assert await index.generation("t") == 0


async def test_a_write_that_fails_leaves_the_old_version_whole_and_a_retry_converges(
    index: EmbeddedRetriever, monkeypatch: pytest.MonkeyPatch
) -> None:
    await index.upsert_document("t", doc("d", ["old one", "old two"], [1, 2]))
    before = await index.generation("t")
    real_bump = embedded_writes._bump_generation

    def fail_after_the_chunks(db: sqlite3.Connection, tenant: str) -> int:
        raise sqlite3.OperationalError("disk I/O error")  # every new chunk is written by now

    monkeypatch.setattr(embedded_writes, "_bump_generation", fail_after_the_chunks)
    new = doc("d", ["new one", "new two", "new three"], [3, 4, 5], rev="2")
    with pytest.raises(BackendUnavailable):
        await index.upsert_document("t", new)

    assert [h.text for h in await index.document_chunks("t", "d")] == ["old one", "old two"]
    assert await index.content_hash("t", "d") == "d-1"
    assert await index.generation("t") == before
    monkeypatch.setattr(embedded_writes, "_bump_generation", real_bump)
    assert await index.upsert_document("t", new) is True  # not "unchanged"
    assert [h.text for h in await index.document_chunks("t", "d")] == [
        "new one",
        "new two",
        "new three",
    ]
    hits = await index.search(SearchRequest("t", "old new", unit_vector(1), k=10))
    assert sorted(h.text for h in hits) == ["new one", "new three", "new two"]


_LEGACY_SCHEMA = """
CREATE TABLE tenants (tenant TEXT PRIMARY KEY, generation INTEGER NOT NULL);
CREATE TABLE documents (tenant TEXT NOT NULL, doc_id TEXT NOT NULL, title TEXT NOT NULL,
    content_hash TEXT NOT NULL, PRIMARY KEY (tenant, doc_id));
CREATE TABLE chunks (id INTEGER PRIMARY KEY, tenant TEXT NOT NULL, doc_id TEXT NOT NULL,
    chunk_id TEXT NOT NULL, section TEXT NOT NULL, embedding BLOB NOT NULL);
CREATE VIRTUAL TABLE chunks_fts USING fts5(tenant_key, title, section, text,
    tokenize = "unicode61 remove_diacritics 2 tokenchars '-_'");
"""


def write_legacy_index(path: Path, rows: list[tuple[str, str, str]]) -> None:
    """A file in the layout before per-tenant tables: one FTS table shared by every tenant."""
    with closing(sqlite3.connect(path)) as db, db:
        db.executescript(_LEGACY_SCHEMA)
        for n, (tenant, doc_id, text) in enumerate(rows, start=1):
            blob = unit_vector(n).tobytes()
            db.execute("INSERT INTO documents VALUES (?, ?, ?, ?)", (tenant, doc_id, doc_id, "h"))
            db.execute(
                "INSERT INTO chunks VALUES (?, ?, ?, ?, '', ?)",
                (n, tenant, doc_id, f"{doc_id}#0", blob),
            )
            db.execute(
                "INSERT INTO chunks_fts (rowid, tenant_key, title, section, text)"
                " VALUES (?, ?, ?, '', ?)",
                (n, embedded.tenant_key(tenant), doc_id, text),
            )
            db.execute(
                "INSERT INTO tenants VALUES (?, 1)"
                " ON CONFLICT (tenant) DO UPDATE SET generation = generation + 1",
                (tenant,),
            )


async def test_a_shared_fts_table_is_migrated_to_per_tenant_tables_on_open(
    tmp_path: Path,
) -> None:
    path = tmp_path / "index.sqlite3"
    write_legacy_index(
        path,
        [("a", "a1", "apple pie recipe"), ("a", "a2", "pear tart"), ("b", "b1", "apple cider")],
    )

    async with EmbeddedRetriever(path) as index:
        hits_a = await index.search(SearchRequest("a", "apple", unit_vector(1), mode="bm25"))
        hits_b = await index.search(SearchRequest("b", "apple", unit_vector(3), mode="bm25"))
        assert ids(hits_a) == ["a1#0"]
        assert ids(hits_b) == ["b1#0"]
        assert [h.text for h in await index.document_chunks("a", "a2")] == ["pear tart"]
        # Scores changed with the statistics: cached answers of both tenants retire.
        assert (await index.generation("a"), await index.generation("b")) == (3, 2)
        assert await index.upsert_document("b", doc("b2", ["apple juice"], [9]))
        assert await index.stats("b") == (2, 2)
        # Written before sources were recorded: no source, so never pruned.
        assert await index.sources("a", ["a1", "a2"]) == {"a1": "", "a2": ""}
        assert await index.source_documents("a", "") == ["a1", "a2"]

    with closing(sqlite3.connect(path)) as db:
        tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert "chunks_fts" not in tables
    assert {embedded.fts_table("a"), embedded.fts_table("b")} <= tables
    async with EmbeddedRetriever(path) as reopened:  # a second open has nothing to migrate
        assert await reopened.generation("a") == 3


async def test_sources_follow_the_provenance_contract(index: EmbeddedRetriever) -> None:
    """tests/fixtures/provenance.py; the OpenSearch twin is in test_opensearch_retriever.py."""
    await check_provenance(index, 384)
