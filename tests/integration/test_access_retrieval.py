"""Document access lists on both backends: a reader never ranks nor reads a document outside
its groups, and each arm fills its top candidates from what the reader may see (the filter is
inside the arm, not after it). Real OpenSearch (tests/fixtures/opensearch.py) and the embedded
index on a file."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import pytest

from backends.retrieval.access import NO_GROUPS, Groups
from backends.retrieval.base import Document, RetrievalMode, Retriever, SearchRequest
from backends.retrieval.embedded.retriever import EmbeddedRetriever
from backends.retrieval.opensearch.layout import index_template
from tests.fixtures.documents import make_doc
from tests.fixtures.embeddings import unit_vector
from tests.fixtures.opensearch import TEST_DIMENSION, RetrieverFactory, opensearch_request

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]

HIDDEN_SEED = 7  # the vector of every restricted document: the query's nearest
HIDDEN_WORD = "zebra"  # many times in every restricted document: BM25's best
RESTRICTED = 6  # more than `candidates`: a filter after the arm would leave it empty
VISIBLE = 3
CANDIDATES = VISIBLE


def doc(doc_id: str, text: str, seed: int, groups: tuple[str, ...] | None) -> Document:
    made = make_doc(doc_id, [text], [seed], dimension=TEST_DIMENSION)
    return replace(made, groups=groups)


def corpus() -> list[Document]:
    """Restricted documents that are the best match of both arms, and a few others."""
    docs = [
        doc(f"fin-{i}", f"{HIDDEN_WORD} " * 8 + "finance ledger", HIDDEN_SEED, ("finance",))
        for i in range(RESTRICTED)
    ]
    docs.append(doc("hr-0", f"{HIDDEN_WORD} salaries review", 40, ("hr", "managers")))
    docs += [doc(f"pub-{i}", f"{HIDDEN_WORD} public notes {i}", 20 + i, None) for i in range(2)]
    return docs


@pytest.fixture(scope="module")
async def embedded_index(
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[tuple[Retriever, str]]:
    path: Path = tmp_path_factory.mktemp("access") / "index.sqlite"
    async with EmbeddedRetriever(path) as retriever:
        tenant = f"t{uuid.uuid4().hex[:8]}"
        await retriever.upsert_documents(tenant, corpus())
        yield retriever, tenant


@pytest.fixture(scope="module")
async def opensearch_index(
    make_opensearch_retriever: RetrieverFactory,
) -> tuple[Retriever, str]:
    retriever = await make_opensearch_retriever(server_side_fusion="off")
    tenant = f"t{uuid.uuid4().hex[:8]}"
    await retriever.upsert_documents(tenant, corpus())
    return retriever, tenant


@pytest.fixture(params=["embedded", "opensearch"], scope="module")
def index(request: pytest.FixtureRequest) -> tuple[Retriever, str]:
    """A retriever of each backend holding `corpus()` for a fresh tenant."""
    found: tuple[Retriever, str] = request.getfixturevalue(f"{request.param}_index")
    return found


async def _search(
    index: tuple[Retriever, str],
    mode: RetrievalMode,
    groups: Groups,
    k: int = 10,
    candidates: int = CANDIDATES,
) -> list[str]:
    retriever, tenant = index
    hits = await retriever.search(
        SearchRequest(
            tenant=tenant,
            text=HIDDEN_WORD,
            vector=unit_vector(HIDDEN_SEED, TEST_DIMENSION),
            k=k,
            mode=mode,
            candidates=candidates,
            groups=groups,
        )
    )
    return [h.doc_id for h in hits]


@pytest.mark.parametrize("mode", ["bm25", "dense", "hybrid"])
async def test_a_reader_in_no_group_ranks_public_documents_only(
    index: tuple[Retriever, str], mode: RetrievalMode
) -> None:
    found = await _search(index, mode, NO_GROUPS)
    assert sorted(found) == ["pub-0", "pub-1"]


@pytest.mark.parametrize("mode", ["bm25", "dense"])
async def test_each_arm_fills_its_candidates_from_what_the_reader_may_see(
    index: tuple[Retriever, str], mode: RetrievalMode
) -> None:
    """Six restricted documents are each arm's best; with three candidates per arm, an arm
    filtered after ranking would come back empty for an hr reader."""
    found = await _search(index, mode, frozenset({"hr"}))
    assert sorted(found) == ["hr-0", "pub-0", "pub-1"]


@pytest.mark.parametrize("mode", ["bm25", "dense", "hybrid"])
async def test_a_member_ranks_its_groups_documents_first(
    index: tuple[Retriever, str], mode: RetrievalMode
) -> None:
    found = await _search(index, mode, frozenset({"finance", "other"}))
    assert found and all(d.startswith("fin-") for d in found)
    deep = await _search(index, mode, frozenset({"finance"}), candidates=50)
    assert len(deep) == RESTRICTED + 2 and "hr-0" not in deep


async def test_reading_a_document_back_needs_a_shared_group(
    index: tuple[Retriever, str],
) -> None:
    retriever, tenant = index
    assert await retriever.document_chunks(tenant, "hr-0") == []
    assert await retriever.document_chunks(tenant, "hr-0", 50, frozenset({"finance"})) == []
    read = await retriever.document_chunks(tenant, "hr-0", 50, frozenset({"managers"}))
    assert [c.chunk_id for c in read] == ["hr-0#0"]
    assert [c.chunk_id for c in await retriever.document_chunks(tenant, "pub-0")] == ["pub-0#0"]


async def test_a_new_access_list_is_a_new_version(index: tuple[Retriever, str]) -> None:
    """Changing the list alone (the ingest hashes it into the content hash) re-files it."""
    retriever, tenant = index
    public = doc("pub-move", "walrus notes", 90, None)
    await retriever.upsert_document(tenant, public)
    assert await retriever.document_chunks(tenant, "pub-move") != []
    moved = replace(public, groups=("hr",), content_hash="pub-move-2")
    assert await retriever.upsert_document(tenant, moved)
    assert await retriever.document_chunks(tenant, "pub-move") == []
    hits = await retriever.search(
        SearchRequest(tenant, "walrus", unit_vector(90, TEST_DIMENSION), mode="hybrid")
    )
    assert "pub-move" not in [h.doc_id for h in hits]
    await retriever.delete_document(tenant, "pub-move")


async def test_opensearch_indices_made_before_access_lists_get_the_field(
    make_opensearch_retriever: RetrieverFactory, opensearch_url: str
) -> None:
    """An index whose mapping predates `groups` (dynamic: strict) would refuse a chunk with
    it: start-up adds the field to every index of the alias, as it did `pending`."""
    retriever = await make_opensearch_retriever()
    tenant = f"t{uuid.uuid4().hex[:8]}"
    await retriever.upsert_document(tenant, doc("old", "old text", 1, None))
    index = await retriever.current_index(tenant)
    client = retriever._layout.client
    # A fresh index laid out as before the field existed, behind the tenant's alias (the
    # template, which has the field, is put back by start-up).
    legacy = f"{index}-legacy"
    template = index_template(retriever.config)["template"]
    del template["mappings"]["properties"]["groups"]
    await client.indices.delete_index_template(name=retriever.config.alias)
    await client.indices.create(index=legacy, body=template)
    await client.indices.update_aliases(
        body={
            "actions": [
                {"remove": {"index": index, "alias": retriever.config.tenant_alias(tenant)}},
                {"add": {"index": legacy, "alias": retriever.config.tenant_alias(tenant)}},
            ]
        }
    )
    before = opensearch_request(opensearch_url, f"/{legacy}/_mapping")[legacy]["mappings"]
    assert "groups" not in before["properties"]
    await retriever._layout.bootstrap()
    fields = opensearch_request(opensearch_url, f"/{legacy}/_mapping")[legacy]["mappings"]
    assert fields["properties"]["groups"] == {"type": "keyword"}
    assert await retriever.upsert_document(tenant, doc("new", "kept text", 2, ("a",)))
    assert await retriever.document_chunks(tenant, "new", 50, frozenset({"a"})) != []
    assert await retriever.document_chunks(tenant, "new") == []
