"""OpenSearchRetriever against a real node (see tests/fixtures/opensearch.py)."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal

import aiohttp
import pytest
from aiohttp import web
from pydantic import ValidationError

from backends.errors import BackendError, BackendUnavailable
from backends.retrieval.base import (
    MAX_DOCUMENT_CHUNKS,
    RRF_K,
    Chunk,
    Document,
    EmptyDocument,
    Hit,
    RetrievalMode,
    SearchRequest,
    Vector,
)
from backends.retrieval.opensearch import (
    Json,
    OpenSearchConfig,
    OpenSearchRetriever,
    SharedChunksNotMigrated,
    normalise_query,
)
from tests.fixtures import tenancy
from tests.fixtures.documents import chunk_ids, make_doc
from tests.fixtures.embeddings import unit_vector as fixture_unit_vector
from tests.fixtures.gateway import run_cli
from tests.fixtures.opensearch import (
    CI_TIMEOUTS,
    TEST_DIMENSION,
    RetrieverFactory,
    opensearch_request,
)
from tests.fixtures.provenance import check_provenance

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]

MODES: tuple[RetrievalMode, ...] = ("bm25", "dense", "hybrid")


def unit_vector(seed: int) -> Vector:
    return fixture_unit_vector(seed, TEST_DIMENSION)


def doc(
    doc_id: str, texts: list[str], seeds: list[int], title: str = "", rev: str = "1"
) -> Document:
    return make_doc(doc_id, texts, seeds, title, rev, dimension=TEST_DIMENSION)


ids = chunk_ids


async def test_config_rejects_unknown_keys_and_query_syntax_in_fields() -> None:
    with pytest.raises(ValidationError):
        OpenSearchConfig(hots=("http://x",))  # type: ignore[call-arg]
    with pytest.raises(ValidationError):
        OpenSearchConfig(fields=("title^2", "text OR 1"))


async def test_query_normalisation_caps_size_and_drops_wordless_input() -> None:
    # Syntax stays plain words; "OR" goes as a stopword, not as an operator.
    assert normalise_query('title:(foo OR "bar', 2000, 64) == 'title:(foo "bar'
    assert normalise_query("?!... --- 🙂", 2000, 64) == ""
    assert normalise_query("a " * 5000, 2000, 64) == "a"
    assert len(normalise_query(" ".join(f"w{i}" for i in range(500)), 2000, 64).split()) == 64
    assert normalise_query("x" * 10_000, 2000, 64) == "x" * 2000


async def test_mapping_uses_lucene_hnsw_cosinesimil(
    opensearch_retriever: OpenSearchRetriever, opensearch_url: str
) -> None:
    await opensearch_retriever.upsert_document("mapping", doc("m", ["words"], [1]))
    index = await opensearch_retriever.current_index("mapping")
    mapping = opensearch_request(opensearch_url, f"/{index}/_mapping")[index]["mappings"]
    method = mapping["properties"]["embedding"]["method"]
    assert mapping["properties"]["embedding"]["dimension"] == TEST_DIMENSION
    assert (method["engine"], method["name"], method["space_type"]) == (
        "lucene",
        "hnsw",
        "cosinesimil",
    )


@pytest.mark.parametrize("tenancy", ["shared", "index_per_tenant"])
async def test_first_use_creates_the_index_layout(
    opensearch_url: str, tenancy: Literal["shared", "index_per_tenant"]
) -> None:
    config = OpenSearchConfig(
        hosts=(opensearch_url,),
        alias=f"qgtest-lazy-{uuid.uuid4().hex[:8]}",
        dimension=16,
        tenancy=tenancy,
        **CI_TIMEOUTS,
    )
    async with OpenSearchRetriever(config) as retriever:
        try:
            # A tenant that never wrote reads as empty, whether or not its index exists yet.
            assert await retriever.search(SearchRequest("t", "empty", unit_vector(1))) == []
            assert await retriever.document_chunks("t", "first") == []
            assert await retriever.stats("t") == (0, 0)
            assert await retriever.content_hash("t", "first") is None
            await retriever.ping()
            assert await retriever.upsert_document("t", doc("first", ["hello"], [1])) is True
            expected = config.alias if tenancy == "shared" else config.tenant_alias("t")
            assert expected.startswith(config.alias)
            assert await retriever.current_index("t") == f"{expected}-v1"
            behind = opensearch_request(opensearch_url, f"/_alias/{expected}")
            assert list(behind) == [f"{expected}-v1"]
        finally:
            await retriever.drop_all()


async def test_index_per_tenant_needs_the_tenant_to_name_an_index(
    opensearch_retriever: OpenSearchRetriever,
) -> None:
    assert opensearch_retriever.config.tenancy == "index_per_tenant"  # the default
    with pytest.raises(ValueError, match="tenant"):
        await opensearch_retriever.current_index()


async def test_hybrid_fuses_both_arms_with_rrf(
    opensearch_retriever: OpenSearchRetriever,
) -> None:
    tenant = "fusion"
    await opensearch_retriever.upsert_document(
        tenant, doc("manual", ["rotate the flux capacitor weekly", "unrelated prose"], [11, 12])
    )
    await opensearch_retriever.upsert_document(
        tenant, doc("guide", ["a paraphrase only vectors find", "more prose"], [13, 14])
    )
    request = SearchRequest(tenant, "flux capacitor", unit_vector(13), k=4, fusion="rrf")

    hits = await opensearch_retriever.search(request)

    by_id = {h.chunk_id: h for h in hits}
    assert {"manual#0", "guide#0"} <= set(by_id)
    assert by_id["manual#0"].bm25_rank == 1
    assert by_id["guide#0"].dense_rank == 1
    for hit in hits:
        ranks = [r for r in (hit.bm25_rank, hit.dense_rank) if r is not None]
        assert hit.score == pytest.approx(sum(1 / (RRF_K + r) for r in ranks))
    assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)


async def test_dense_scores_are_cosines_as_on_the_embedded_index(
    opensearch_retriever: OpenSearchRetriever,
) -> None:
    # The sufficiency model (trained on the embedded index) and the agent's min_similarity
    # read dense_score as a cosine; the node's lucene cosinesimil score is (1 + cos) / 2.
    tenant = "cosines"
    await opensearch_retriever.upsert_document(tenant, doc("c", ["first", "second"], [31, 32]))
    query = unit_vector(31)

    hits = await opensearch_retriever.search(SearchRequest(tenant, "", query, k=2, mode="dense"))

    by_id = {h.chunk_id: h.dense_score for h in hits}
    assert by_id["c#0"] == pytest.approx(1.0, abs=1e-4)
    assert by_id["c#1"] == pytest.approx(float(unit_vector(32) @ query), abs=1e-4)


async def test_arm_weights_decide_which_arm_ranks_first(
    opensearch_retriever: OpenSearchRetriever,
) -> None:
    tenant = "weights"
    await opensearch_retriever.upsert_document(tenant, doc("a", ["zebra crossing"], [21]))
    await opensearch_retriever.upsert_document(tenant, doc("b", ["nothing to see"], [22]))

    async def ranked(lexical: float, dense: float) -> list[str]:
        request = SearchRequest(
            tenant, "zebra", unit_vector(22), k=2, lexical_weight=lexical, dense_weight=dense
        )
        return ids(await opensearch_retriever.search(request))

    # "a" matches the words, "b" the vector: a zero weight silences one arm.
    assert await ranked(1.0, 0.0) == ["a#0", "b#0"]
    assert await ranked(0.0, 1.0) == ["b#0", "a#0"]


async def test_server_side_rrf_matches_client_side(
    make_opensearch_retriever: RetrieverFactory, neural_search_installed: bool
) -> None:
    if not neural_search_installed:
        pytest.skip("neural-search is not installed on this node: no server-side RRF to compare")
    server = await make_opensearch_retriever(server_side_fusion="on")
    client = OpenSearchRetriever(server.config.model_copy(update={"server_side_fusion": "off"}))
    tenant = "rrf"
    words = ["alpha", "beta", "gamma", "delta", "epsilon"]
    for n in range(12):
        texts = [f"{words[n % 5]} {words[(n + c) % 5]} report {n} part {c}" for c in range(2)]
        await server.upsert_document(tenant, doc(f"d{n}", texts, [100 + 2 * n, 101 + 2 * n]))
    try:
        for query, seed in [("alpha report", 104), ("gamma delta", 111), ("epsilon", 120)]:
            request = SearchRequest(
                tenant, query, unit_vector(seed), k=8, candidates=20, fusion="rrf"
            )
            on_server = await server.search(request)
            on_client = await client.search(request)
            assert ids(on_server) == ids(on_client), query
            assert [h.score for h in on_server] == pytest.approx([h.score for h in on_client])
    finally:
        await client.aclose()


async def test_server_side_minmax_matches_client_side(
    make_opensearch_retriever: RetrieverFactory, neural_search_installed: bool
) -> None:
    """neural-search's normalization-processor (min_max, weighted arithmetic_mean, in a
    temporary pipeline per request) ranks and scores as `base.fuse`'s "minmax", per-query
    weights included: its lowest candidate scales to 0.001 as `fuse`'s does, a document one
    arm missed adds 0, and its weighted mean is `fuse`'s weighted sum over the weights' sum."""
    if not neural_search_installed:
        pytest.skip("neural-search is not installed on this node: no server-side min-max")
    server = await make_opensearch_retriever(server_side_fusion="on", fusion="minmax")
    client = OpenSearchRetriever(server.config.model_copy(update={"server_side_fusion": "off"}))
    assert server.fusion_path("minmax").startswith("server-side")
    assert client.fusion_path("minmax").startswith("client-side")
    tenant = "minmax"
    words = ["alpha", "beta", "gamma", "delta", "epsilon"]
    vectors: dict[str, Vector] = {}
    for n in range(12):
        texts = [f"{words[n % 5]} {words[(n + c) % 5]} report {n} part {c}" for c in range(2)]
        document = doc(f"d{n}", texts, [100 + 2 * n, 101 + 2 * n])
        vectors |= {c.chunk_id: c.embedding for c in document.chunks}
        await server.upsert_document(tenant, document)
    try:
        for query, seed in [("alpha report", 104), ("gamma delta", 111), ("epsilon", 120)]:
            for lexical, dense in [(1.0, 1.0), (4.0, 1.0), (1.0, 0.5), (0.0, 1.0)]:
                request = SearchRequest(
                    tenant,
                    query,
                    unit_vector(seed),
                    k=8,
                    candidates=20,
                    lexical_weight=lexical,
                    dense_weight=dense,
                )
                on_server = await server.search(request)
                on_client = await client.search(request)
                assert ids(on_server) == ids(on_client), (query, lexical)
                # The node adds in float32.
                assert [h.score for h in on_server] == pytest.approx(
                    [h.score for h in on_client], rel=1e-5
                )
                assert on_server[0].bm25_rank is None  # fused in the node: no per-arm ranks
                assert on_client[0].bm25_rank is not None or on_client[0].dense_rank is not None
                # ...but each hit's cosine, as the client-side path gives it: the sufficiency
                # grade and the agent's relevance filter read it.
                cosines = [float(unit_vector(seed) @ vectors[h.chunk_id]) for h in on_server]
                assert [h.dense_score for h in on_server] == pytest.approx(cosines, abs=1e-5)
                client_cosines = {h.chunk_id: h.dense_score for h in on_client}
                assert client_cosines[on_server[0].chunk_id] == pytest.approx(cosines[0], abs=1e-5)
    finally:
        await client.aclose()


async def test_the_fusion_path_is_decided_at_start_and_logged(
    make_opensearch_retriever: RetrieverFactory,
    neural_search_installed: bool,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Never a silent fallback: start-up says where each method fuses; minmax_peak (the
    default) is client-side on every node, its weights read both arms' scores first."""
    caplog.set_level(logging.INFO, logger="backends.retrieval.opensearch")
    retriever = await make_opensearch_retriever(fusion="minmax")
    expected = "server-side" if neural_search_installed else "client-side"
    assert retriever.fusion_path("minmax").startswith(expected)
    if not neural_search_installed:
        assert "neural-search is not installed" in retriever.fusion_path("minmax")
    logged = [r.getMessage() for r in caplog.records if "hybrid fusion minmax" in r.getMessage()]
    assert logged == [f"opensearch hybrid fusion minmax: {retriever.fusion_path('minmax')}"]
    for method in ("minmax_peak", "zscore"):
        assert retriever.fusion_path(method).startswith("client-side"), method
    off = await make_opensearch_retriever(server_side_fusion="off")
    assert "server_side_fusion: off" in off.fusion_path("rrf")


async def test_minmax_peak_fuses_client_side_even_with_neural_search(
    make_opensearch_retriever: RetrieverFactory,
) -> None:
    retriever = await make_opensearch_retriever(fusion="minmax_peak")
    await retriever.upsert_document("peak", doc("a", ["zebra crossing rules"], [40]))
    await retriever.upsert_document("peak", doc("b", ["unrelated words here"], [41]))
    hits = await retriever.search(SearchRequest("peak", "zebra", unit_vector(40), k=2))
    assert ids(hits)[0] == "a#0"
    assert (hits[0].bm25_rank, hits[0].dense_rank) == (1, 1)  # both arms' ranks: client-side


async def test_the_former_name_of_server_side_fusion_is_still_read() -> None:
    config = OpenSearchConfig.model_validate({"use_server_side_rrf": "off"})
    assert config.server_side_fusion == "off"
    assert OpenSearchConfig().server_side_fusion == "auto"


@pytest.mark.parametrize("mode", MODES)
async def test_tenant_a_never_sees_tenant_b_chunk_even_when_it_is_the_perfect_match(
    opensearch_retriever: OpenSearchRetriever, mode: RetrievalMode
) -> None:
    secret = "quarterly payroll export for the Zurich office"
    await opensearch_retriever.upsert_document(
        "tenant-b", doc("payroll", [secret], [31], title="payroll")
    )
    await opensearch_retriever.upsert_document(
        "tenant-a", doc("menu", ["cafeteria lunch menu", "office hours"], [32, 33])
    )
    # Tenant A asks with tenant B's exact text and exact vector.
    request = SearchRequest("tenant-a", secret, unit_vector(31), k=10, mode=mode)

    hits = await opensearch_retriever.search(request)

    assert all(h.doc_id == "menu" for h in hits)
    if mode != "bm25":
        # The k-NN arm still fills up from tenant A's own chunks (efficient filtering).
        assert len(hits) == 2


async def test_upsert_is_visible_at_once_and_same_hash_is_a_no_op(
    opensearch_retriever: OpenSearchRetriever,
) -> None:
    tenant = "upsert"
    first = doc("faq", ["how to reset a password", "how to change an email"], [41, 42])

    assert await opensearch_retriever.upsert_document(tenant, first) is True
    generation = await opensearch_retriever.generation(tenant)
    hits = await opensearch_retriever.search(
        SearchRequest(tenant, "reset password", unit_vector(41), mode="bm25")
    )
    assert ids(hits)[0] == "faq#0"
    assert await opensearch_retriever.content_hash(tenant, "faq") == "faq-1"

    assert await opensearch_retriever.upsert_document(tenant, first) is False
    assert await opensearch_retriever.generation(tenant) == generation


async def test_wait_for_refresh_also_makes_a_write_visible_on_return(
    make_opensearch_retriever: RetrieverFactory,
) -> None:
    retriever = await make_opensearch_retriever(write_refresh="wait_for")

    await retriever.upsert_document("lazy", doc("late", ["refreshed later"], [45]))

    hits = await retriever.search(SearchRequest("lazy", "refreshed", unit_vector(45), mode="bm25"))
    assert ids(hits) == ["late#0"]


async def test_new_version_replaces_every_old_chunk(
    opensearch_retriever: OpenSearchRetriever,
) -> None:
    tenant = "replace"
    await opensearch_retriever.upsert_document(
        tenant, doc("notes", ["old one", "old two", "old three"], [51, 52, 53])
    )
    before = await opensearch_retriever.generation(tenant)

    changed = await opensearch_retriever.upsert_document(
        tenant, doc("notes", ["new single chunk"], [54], rev="2")
    )

    assert changed is True
    assert await opensearch_retriever.stats(tenant) == (1, 1)
    assert await opensearch_retriever.generation(tenant) == before + 1
    hits = await opensearch_retriever.search(SearchRequest(tenant, "old", unit_vector(51), k=10))
    assert [h.text for h in hits] == ["new single chunk"]


async def test_delete_removes_every_chunk_of_the_document(
    opensearch_retriever: OpenSearchRetriever,
) -> None:
    tenant = "delete"
    texts = [f"chapter {n} of the handbook" for n in range(7)]
    await opensearch_retriever.upsert_document(tenant, doc("handbook", texts, list(range(60, 67))))
    await opensearch_retriever.upsert_document(tenant, doc("keep", ["keep me"], [67]))
    before = await opensearch_retriever.generation(tenant)

    assert await opensearch_retriever.delete_document(tenant, "handbook") is True

    assert await opensearch_retriever.stats(tenant) == (1, 1)
    assert await opensearch_retriever.content_hash(tenant, "handbook") is None
    assert await opensearch_retriever.generation(tenant) == before + 1
    hits = await opensearch_retriever.search(
        SearchRequest(tenant, "handbook chapter", unit_vector(60), k=10)
    )
    assert all(h.doc_id == "keep" for h in hits)
    assert await opensearch_retriever.delete_document(tenant, "handbook") is False


async def test_generation_counts_concurrent_changes_exactly(
    opensearch_retriever: OpenSearchRetriever,
) -> None:
    tenant = "generation"
    docs = [doc(f"g{n}", [f"text {n}"], [70 + n]) for n in range(8)]

    await asyncio.gather(*(opensearch_retriever.upsert_document(tenant, d) for d in docs))

    assert await opensearch_retriever.generation(tenant) == len(docs)
    assert await opensearch_retriever.generation("nobody") == 0


async def test_identifier_is_found_exactly_by_bm25(
    opensearch_retriever: OpenSearchRetriever,
) -> None:
    tenant = "ids"
    await opensearch_retriever.upsert_document(
        tenant,
        doc(
            "errors",
            [
                "ERR-4472 means the disk quota is exceeded",
                "error 4471 in the legacy system was a typo",
                "If you see ERR-4471, the upstream certificate expired.",
            ],
            [81, 82, 83],
        ),
    )

    hits = await opensearch_retriever.search(
        SearchRequest(tenant, "ERR-4471", unit_vector(99), mode="bm25")
    )

    assert ids(hits)[0] == "errors#2"


@pytest.mark.parametrize(
    "text",
    [
        'title:(foo OR "bar',
        "a" * 10_000,
        "word " * 2_000,
        "🔥🙂 what does 🚀 mean?",
        "?!.,;:()[]{}^~*\"'\\/",
        "",
        "AND OR NOT && || +-",
        "\x00\x1f control \u200b chars",
    ],
    ids=["lucene", "10k-chars", "10k-words", "emoji", "punctuation", "empty", "ops", "control"],
)
@pytest.mark.parametrize("mode", MODES)
async def test_malformed_queries_never_raise(
    opensearch_retriever: OpenSearchRetriever, text: str, mode: RetrievalMode
) -> None:
    tenant = "malformed"
    await opensearch_retriever.upsert_document(tenant, doc("m", ["what does foo mean"], [90]))

    hits = await opensearch_retriever.search(
        SearchRequest(tenant, text, unit_vector(90), mode=mode)
    )

    assert isinstance(hits, list)
    if mode == "dense":
        assert ids(hits) == ["m#0"]


async def test_only_punctuation_sends_no_bm25_arm(
    opensearch_retriever: OpenSearchRetriever,
) -> None:
    tenant = "malformed"
    await opensearch_retriever.upsert_document(tenant, doc("m", ["what does foo mean"], [90]))

    lexical = await opensearch_retriever.search(
        SearchRequest(tenant, "?!... ---", unit_vector(90), mode="bm25")
    )
    hybrid = await opensearch_retriever.search(SearchRequest(tenant, "?!...", unit_vector(90)))

    assert lexical == []
    assert [(h.bm25_rank, h.dense_rank) for h in hybrid] == [(None, 1)]


def long_doc(doc_id: str, chunks: int, word: str = "part") -> Document:
    """A document of `chunks` chunks, sent last chunk first so indexing order is no help."""
    document = doc(doc_id, [f"{word} {n}" for n in range(chunks)], list(range(chunks)))
    return replace(document, chunks=document.chunks[::-1])


async def test_document_chunks_come_in_numeric_reading_order(
    opensearch_retriever: OpenSearchRetriever,
) -> None:
    await opensearch_retriever.upsert_document("read-order", long_doc("d", 12))

    hits = await opensearch_retriever.document_chunks("read-order", "d")

    assert ids(hits) == [f"d#{n}" for n in range(12)]


async def test_document_chunks_without_a_number_come_last(
    opensearch_retriever: OpenSearchRetriever,
) -> None:
    chunks = tuple(Chunk(i, i, "", unit_vector(n)) for n, i in enumerate(["d#x", "d#10", "d#2"]))
    await opensearch_retriever.upsert_document("read-named", Document("d", "d", "h", chunks))

    hits = await opensearch_retriever.document_chunks("read-named", "d")

    assert ids(hits) == ["d#2", "d#10", "d#x"]


async def test_document_chunks_are_read_not_ranked(
    opensearch_retriever: OpenSearchRetriever,
) -> None:
    await opensearch_retriever.upsert_document(
        "read-fields", doc("d", ["the body text"], [1], title="The Title")
    )

    hits = await opensearch_retriever.document_chunks("read-fields", "d")

    assert hits == [Hit("d", "d#0", "The Title", "section 0", "the body text", 0.0)]


@pytest.mark.parametrize(
    ("limit", "expected"), [(5, 5), (0, 1), (-3, 1), (10_000, MAX_DOCUMENT_CHUNKS)]
)
async def test_document_chunks_stop_at_the_clamped_limit(
    opensearch_retriever: OpenSearchRetriever, limit: int, expected: int
) -> None:
    await opensearch_retriever.upsert_document("read-limit", long_doc("d", MAX_DOCUMENT_CHUNKS + 5))

    hits = await opensearch_retriever.document_chunks("read-limit", "d", limit=limit)

    assert ids(hits) == [f"d#{n}" for n in range(expected)]


async def test_document_chunks_of_an_unknown_document_are_empty(
    opensearch_retriever: OpenSearchRetriever,
) -> None:
    await opensearch_retriever.upsert_document("read-unknown", doc("d", ["words"], [1]))

    assert await opensearch_retriever.document_chunks("read-unknown", "missing") == []


async def test_document_chunks_never_cross_tenants(
    opensearch_retriever: OpenSearchRetriever,
) -> None:
    await opensearch_retriever.upsert_document("read-a", long_doc("shared", 3, "alpha"))
    await opensearch_retriever.upsert_document("read-b", long_doc("shared", 2, "beta"))

    read_a = await opensearch_retriever.document_chunks("read-a", "shared")
    read_b = await opensearch_retriever.document_chunks("read-b", "shared")

    assert [h.text for h in read_a] == ["alpha 0", "alpha 1", "alpha 2"]
    assert [h.text for h in read_b] == ["beta 0", "beta 1"]
    assert await opensearch_retriever.document_chunks("read-c", "shared") == []


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_node_down_raises_backend_unavailable_fast() -> None:
    # A refused connection fails at once, not at the timeout: far under half of a long one,
    # however busy the machine.
    timeout = 20.0
    config = OpenSearchConfig(
        hosts=(f"http://127.0.0.1:{closed_port()}",),
        alias="down",
        dimension=TEST_DIMENSION,
        search_timeout_s=timeout,
    )
    async with OpenSearchRetriever(config) as retriever:
        for call in (
            retriever.search(SearchRequest("t", "hello", unit_vector(1))),
            retriever.document_chunks("t", "x"),
            retriever.ping(),
            retriever.upsert_document("t", doc("x", ["x"], [1])),
        ):
            started = time.monotonic()
            with pytest.raises(BackendUnavailable):
                await call
            assert time.monotonic() - started < timeout / 2


@pytest.fixture
async def silent_server() -> AsyncIterator[int]:
    """A TCP server that accepts and never answers: a hung node."""

    released = asyncio.Event()

    async def hang(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(1 << 16)
        await released.wait()
        writer.close()

    server = await asyncio.start_server(hang, "127.0.0.1", 0)
    yield int(server.sockets[0].getsockname()[1])
    released.set()
    server.close()
    await server.wait_closed()


async def test_hung_node_times_out_within_the_bound(silent_server: int) -> None:
    timeout = 0.5
    config = OpenSearchConfig(
        hosts=(f"http://127.0.0.1:{silent_server}",),
        alias="hung",
        dimension=TEST_DIMENSION,
        search_timeout_s=timeout,
        server_side_fusion="off",
    )
    async with OpenSearchRetriever(config) as retriever:
        for call in (
            retriever.search(SearchRequest("t", "hello", unit_vector(1))),
            retriever.document_chunks("t", "x"),
        ):
            started = time.monotonic()
            with pytest.raises(BackendUnavailable) as failure:
                await call
            # Cut by the timeout (the reason the client reports), not hung: how far past the
            # 0.5 s a loaded core answers is the machine's business.
            assert "timeout" in str(failure.value).lower()
            assert time.monotonic() - started < 20 * timeout


async def test_server_side_fusion_keeps_tenants_apart(
    make_opensearch_retriever: RetrieverFactory, neural_search_installed: bool
) -> None:
    if not neural_search_installed:
        pytest.skip("neural-search is not installed on this node: no server-side RRF")
    retriever = await make_opensearch_retriever(server_side_fusion="on")
    secret = "merger plans for the Lisbon subsidiary"
    await retriever.upsert_document("tenant-b", doc("merger", [secret], [301]))
    await retriever.upsert_document("tenant-a", doc("wiki", ["team wiki home"], [302]))

    hits = await retriever.search(SearchRequest("tenant-a", secret, unit_vector(301), k=10))

    assert ids(hits) == ["wiki#0"]


@asynccontextmanager
async def bulk_rejecting_proxy(
    upstream: str, rejections: int, how: Literal["request", "items"]
) -> AsyncIterator[tuple[str, list[str]]]:
    """An HTTP proxy in front of the real node that rejects the first `rejections` bulk calls.

    "request" answers HTTP 429 (node overloaded); "items" answers 200 with every item rejected
    with 429 (write queue full). Everything else is forwarded. Yields (url, log of bulk calls).
    """
    calls: list[str] = []

    async def handle(request: web.Request) -> web.Response:
        body = await request.read()
        if request.path.endswith("/_bulk"):
            rejected = len(calls) < rejections
            calls.append("rejected" if rejected else "forwarded")
            if rejected and how == "request":
                return web.json_response({"error": "rejected", "status": 429}, status=429)
            if rejected:
                ops = [json.loads(line) for line in body.splitlines() if line.strip()]
                items = [
                    {next(iter(op)): {"status": 429, "error": {"type": "rejected_execution"}}}
                    for op in ops
                    if next(iter(op)) in ("index", "delete")
                ]
                return web.json_response({"took": 1, "errors": True, "items": items})
        async with (
            aiohttp.ClientSession() as session,
            session.request(
                request.method,
                upstream + request.path_qs,
                data=body,
                headers={"content-type": request.headers.get("content-type", "application/json")},
            ) as response,
        ):
            return web.Response(
                body=await response.read(),
                status=response.status,
                headers={"content-type": response.headers["content-type"]},
            )

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}", calls
    finally:
        await runner.cleanup()


@asynccontextmanager
async def retriever_via(
    url: str, attempts: int, **overrides: Any
) -> AsyncIterator[OpenSearchRetriever]:
    config = OpenSearchConfig(
        hosts=(url,),
        alias=f"qgtest-proxy-{uuid.uuid4().hex[:8]}",
        dimension=TEST_DIMENSION,
        bulk_max_attempts=attempts,
        server_side_fusion="off",
        **(CI_TIMEOUTS | overrides),
    )
    async with OpenSearchRetriever(config) as retriever:
        try:
            yield retriever
        finally:
            await retriever.drop_all()


@pytest.mark.parametrize("how", ["request", "items"])
async def test_rejected_bulk_writes_are_retried_until_stored(
    opensearch_url: str, how: Literal["request", "items"]
) -> None:
    async with (
        bulk_rejecting_proxy(opensearch_url, rejections=2, how=how) as (url, calls),
        retriever_via(url, attempts=3) as retriever,
    ):
        stored = await retriever.upsert_document("t", doc("busy", ["a", "b", "c"], [1, 2, 3]))

        assert stored is True
        # The hidden chunks (rejected twice, then stored), then the flip that shows them.
        assert calls == ["rejected", "rejected", "forwarded", "forwarded"]
        assert await retriever.stats("t") == (1, 3)


async def test_bulk_retries_are_bounded_and_end_in_backend_unavailable(
    opensearch_url: str,
) -> None:
    async with (
        bulk_rejecting_proxy(opensearch_url, rejections=99, how="items") as (url, calls),
        retriever_via(url, attempts=2) as retriever,
    ):
        with pytest.raises(BackendUnavailable):
            await retriever.upsert_document("t", doc("never", ["a"], [1]))

        # The staging twice, then the best-effort discard of what may have landed, twice.
        assert calls == ["rejected"] * 4
        assert await retriever.generation("t") == 0


async def test_a_batch_upsert_writes_only_what_changed_and_bumps_once(
    opensearch_retriever: OpenSearchRetriever,
) -> None:
    tenant = f"batch-{uuid.uuid4().hex[:6]}"
    await opensearch_retriever.upsert_documents(
        tenant,
        [doc("keep", ["kept text"], [61]), doc("grow", ["one", "two", "three"], [62, 63, 64])],
    )
    before = await opensearch_retriever.generation(tenant)
    results = await opensearch_retriever.upsert_documents(
        tenant,
        [
            doc("keep", ["kept text"], [61]),  # same hash: untouched
            doc("grow", ["only one now"], [65], rev="2"),  # shrinks: stale chunks removed
            doc("new", ["brand new"], [66]),
        ],
    )
    assert results == [False, True, True]
    assert await opensearch_retriever.generation(tenant) == before + 1
    hashes = await opensearch_retriever.content_hashes(tenant, ["keep", "grow", "new", "absent"])
    assert hashes == {"keep": "keep-1", "grow": "grow-2", "new": "new-1"}
    assert await opensearch_retriever.stats(tenant) == (3, 3)


async def test_stored_state_of_a_large_document_is_read_past_one_page(
    opensearch_retriever: OpenSearchRetriever,
) -> None:
    tenant = f"large-{uuid.uuid4().hex[:6]}"
    n = 1500  # more chunks than one lookup page holds
    big = doc("big", [f"chunk {i}" for i in range(n)], list(range(1000, 1000 + n)))
    await opensearch_retriever.upsert_document(tenant, big)
    smaller = doc("big", ["the only chunk left"], [7], rev="2")
    assert await opensearch_retriever.upsert_document(tenant, smaller)
    assert await opensearch_retriever.stats(tenant) == (1, 1)


# -- tenancy of statistics -------------------------------------------------------------------


@pytest.mark.parametrize("tenancy_mode", ["shared", "index_per_tenant"])
async def test_membership_oracle_is_open_on_shared_and_closed_on_index_per_tenant(
    make_opensearch_retriever: RetrieverFactory,
    tenancy_mode: Literal["shared", "index_per_tenant"],
) -> None:
    """tests/fixtures/tenancy.py: which of its own documents ranks first tells the prober whether
    another tenant's documents hold a word, when (and only when) BM25 statistics are shared."""
    retriever = await make_opensearch_retriever(tenancy=tenancy_mode, server_side_fusion="off")
    await tenancy.seed_prober(retriever, TEST_DIMENSION)
    before = await tenancy.observe(retriever, TEST_DIMENSION)
    assert before.first == "p1#0"

    await tenancy.seed_other(retriever, TEST_DIMENSION)
    after = await tenancy.observe(retriever, TEST_DIMENSION)

    if tenancy_mode == "shared":
        assert after.first == "p2#0"  # the leak, reproduced: "zorblax" is in others' documents
    else:
        assert after.bm25 == before.bm25  # the same order and the same scores
    # k-NN with the tenant filter inside: the prober's dense ranking and cosines are unchanged
    # in both modes (exact on this small filtered set; see docs/opensearch.md for HNSW).
    assert [c for c, _ in after.dense] == [c for c, _ in before.dense]
    assert [s for _, s in after.dense] == pytest.approx([s for _, s in before.dense])


async def test_index_per_tenant_gives_each_tenant_its_own_index(
    opensearch_retriever: OpenSearchRetriever, opensearch_url: str
) -> None:
    await opensearch_retriever.upsert_document("own-a", doc("a", ["alpha"], [1]))
    await opensearch_retriever.upsert_document("own-b", doc("b", ["beta"], [2]))

    index_a = await opensearch_retriever.current_index("own-a")
    index_b = await opensearch_retriever.current_index("own-b")

    assert index_a != index_b
    for index, tenant in ((index_a, "own-a"), (index_b, "own-b")):
        count = opensearch_request(opensearch_url, f"/{index}/_count")["count"]
        assert count == 1, tenant
        # The tenant id itself never appears in an index name (names are visible cluster-wide).
        assert tenant not in index


# -- empty documents and atomic writes -------------------------------------------------------


async def test_an_empty_document_is_refused_and_nothing_of_its_batch_is_written(
    opensearch_retriever: OpenSearchRetriever,
) -> None:
    tenant = f"empty-{uuid.uuid4().hex[:6]}"
    empty = Document("headings-only", "Title", "h", ())
    with pytest.raises(EmptyDocument) as refused:
        await opensearch_retriever.upsert_documents(tenant, [doc("fine", ["words"], [1]), empty])
    assert refused.value.doc_id == "headings-only"
    assert await opensearch_retriever.stats(tenant) == (0, 0)
    assert await opensearch_retriever.generation(tenant) == 0


@asynccontextmanager
async def bulk_killing_proxy(
    upstream: str,
    forward: int,
    *,
    after_forwarding: bool = False,
    kills: int | None = None,
    kill_bumps: bool = False,
) -> AsyncIterator[tuple[str, list[str], asyncio.Event]]:
    """An HTTP proxy in front of the real node that forwards the first `forward` bulk calls and
    then drops the connection of every later one (before forwarding it, or, with
    `after_forwarding`, after the node applied it) until the yielded event is set, or for the
    next `kills` bulk calls only. `kill_bumps` also drops every generation write (a PUT to the
    meta index) before it is forwarded, until healed. Yields (url, log of bulk calls, heal)."""
    calls: list[str] = []
    heal = asyncio.Event()

    async def handle(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        bulk = request.path.endswith("/_bulk")
        killing = len(calls) >= forward and (kills is None or len(calls) < forward + kills)
        kill = bulk and not heal.is_set() and killing
        if bulk:
            calls.append("killed" if kill else "forwarded")
        bump = request.method == "PUT" and "-meta/_doc/" in request.path
        if kill_bumps and bump and not heal.is_set():
            assert request.transport is not None
            request.transport.abort()
            return web.Response(status=499)
        if kill and not after_forwarding:
            assert request.transport is not None
            request.transport.abort()
            return web.Response(status=499)
        async with (
            aiohttp.ClientSession() as session,
            session.request(
                request.method,
                upstream + request.path_qs,
                data=body,
                headers={"content-type": request.headers.get("content-type", "application/json")},
            ) as response,
        ):
            payload = await response.read()
            if kill:
                assert request.transport is not None
                request.transport.abort()
            return web.Response(
                body=payload,
                status=response.status,
                headers={"content-type": response.headers["content-type"]},
            )

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}", calls, heal
    finally:
        await runner.cleanup()


async def raw_chunks(url: str, retriever: OpenSearchRetriever, tenant: str) -> list[Json]:
    """Every stored chunk of the tenant, hidden ones included, read past the retriever."""
    index = retriever.config.tenant_alias(tenant)
    opensearch_request(url, f"/{index}/_refresh")  # hidden chunks are written unrefreshed
    found = opensearch_request(url, f"/{index}/_search?size=100&_source=chunk_id,text,pending")
    return [h["_source"] for h in found["hits"]["hits"]]


@pytest.mark.parametrize("tenancy_mode", ["shared", "index_per_tenant"])
async def test_a_multi_batch_upsert_killed_part_way_leaves_the_old_version_and_a_retry_converges(
    opensearch_url: str, tenancy_mode: str
) -> None:
    old = doc("d", [f"old {n}" for n in range(5)], list(range(5)))
    new = doc("d", [f"new {n}" for n in range(7)], list(range(10, 17)), rev="2")
    # Batches of 2 chunks: the new version takes 4 bulk requests, then the flip; the proxy
    # forwards the old version's 3 + 1 and the new version's first 2, then kills the rest.
    async with (
        bulk_killing_proxy(opensearch_url, forward=4 + 2) as (url, calls, heal),
        retriever_via(url, attempts=2, bulk_batch_size=2, tenancy=tenancy_mode) as retriever,
    ):
        assert await retriever.upsert_document("t", old) is True
        generation = await retriever.generation("t")

        with pytest.raises(BackendUnavailable):
            await retriever.upsert_document("t", new)

        # The third batch and its one retry, then the discard of what landed (and its retry).
        assert calls[6:] == ["killed"] * 4
        # Part of the new version is stored, hidden; readers see the old version whole.
        assert any(c["pending"] for c in await raw_chunks(opensearch_url, retriever, "t"))
        read = await retriever.document_chunks("t", "d")
        assert [h.text for h in read] == [f"old {n}" for n in range(5)]
        hits = await retriever.search(SearchRequest("t", "old new", unit_vector(12), k=20))
        assert sorted(h.text for h in hits) == [f"old {n}" for n in range(5)]
        assert await retriever.stats("t") == (1, 5)
        assert await retriever.content_hash("t", "d") == "d-1"
        assert await retriever.generation("t") == generation

        heal.set()
        assert await retriever.upsert_document("t", new) is True  # never "unchanged"

        read = await retriever.document_chunks("t", "d")
        assert [h.text for h in read] == [f"new {n}" for n in range(7)]
        assert await retriever.stats("t") == (1, 7)
        assert await retriever.content_hash("t", "d") == "d-2"
        assert await retriever.generation("t") == generation + 1
        stored = await raw_chunks(opensearch_url, retriever, "t")
        assert sorted(c["text"] for c in stored) == [f"new {n}" for n in range(7)]
        assert not any(c["pending"] for c in stored)
        assert await retriever.upsert_document("t", new) is False


async def test_a_flip_applied_but_unanswered_bumps_the_generation_and_a_retry_agrees(
    opensearch_url: str,
) -> None:
    new = doc("d", ["new text"], [2], rev="2")
    # Old version: 1 + 1 bulk calls; the new version's hidden chunks forwarded; its flip reaches
    # the node, which applies it, and the answer is lost.
    async with (
        bulk_killing_proxy(opensearch_url, forward=3, after_forwarding=True) as (url, calls, heal),
        retriever_via(url, attempts=1) as retriever,
    ):
        await retriever.upsert_document("t", doc("d", ["old text"], [1]))
        generation = await retriever.generation("t")

        with pytest.raises(BackendUnavailable):
            await retriever.upsert_document("t", new)

        # The change is visible, so the cached answers of the old content must already be gone.
        assert await retriever.generation("t") == generation + 1
        assert [h.text for h in await retriever.document_chunks("t", "d")] == ["new text"]
        heal.set()
        assert await retriever.upsert_document("t", new) is False  # stored: nothing to redo
        assert calls == ["forwarded", "forwarded", "forwarded", "killed"]


async def test_a_delete_killed_part_way_hides_the_document_and_a_retry_finishes_it(
    opensearch_url: str,
) -> None:
    async with (
        bulk_killing_proxy(opensearch_url, forward=2 + 1) as (url, _calls, heal),
        retriever_via(url, attempts=1) as retriever,
    ):
        await retriever.upsert_document("t", doc("d", ["one", "two"], [1, 2]))

        with pytest.raises(BackendUnavailable):  # the chunks are hidden, their deletion killed
            await retriever.delete_document("t", "d")

        assert await retriever.document_chunks("t", "d") == []
        assert await retriever.content_hash("t", "d") is None  # readers see no document
        generation = await retriever.generation("t")
        heal.set()
        # Readers saw no document any more (404), but the retry still removes the hidden chunks.
        assert await retriever.delete_document("t", "d") is False
        assert await retriever.generation("t") == generation + 1
        assert await retriever.delete_document("t", "d") is False
        assert await retriever.stats("t") == (0, 0)
        assert await raw_chunks(opensearch_url, retriever, "t") == []


@pytest.mark.parametrize("retry", ["upsert", "content_hashes"])
async def test_a_flip_applied_whose_bump_was_lost_is_bumped_by_the_retry(
    opensearch_url: str, retry: str
) -> None:
    new = doc("d", ["new text"], [2], rev="2")
    # The flip reaches the node and is applied, its answer is lost, and the best-effort bump
    # after the failure is lost too: cached answers of the old content are still current.
    async with (
        bulk_killing_proxy(opensearch_url, forward=3, after_forwarding=True, kill_bumps=True) as (
            url,
            _calls,
            heal,
        ),
        retriever_via(url, attempts=1) as retriever,
    ):
        heal.set()
        await retriever.upsert_document("t", doc("d", ["old text"], [1]))
        generation = await retriever.generation("t")
        heal.clear()

        with pytest.raises(BackendUnavailable):
            await retriever.upsert_document("t", new)

        assert [h.text for h in await retriever.document_chunks("t", "d")] == ["new text"]
        assert await retriever.generation("t") == generation
        heal.set()
        # Either way a retry finds the document stored (the gateway's ingest asks for hashes
        # first and skips what is stored), and either way it makes the lost bump.
        if retry == "upsert":
            assert await retriever.upsert_document("t", new) is False
        else:
            assert await retriever.content_hashes("t", ["d"]) == {"d": "d-2"}
        assert await retriever.generation("t") == generation + 1
        assert await retriever.upsert_document("t", new) is False
        assert await retriever.generation("t") == generation + 1  # once only


async def test_a_failed_staging_takes_back_its_hidden_chunks(opensearch_url: str) -> None:
    # Batches of 2: the new version's first two batches land hidden, the third is killed, and
    # the discard that follows is forwarded.
    async with (
        bulk_killing_proxy(opensearch_url, forward=2, kills=1) as (url, calls, _heal),
        retriever_via(url, attempts=1, bulk_batch_size=2) as retriever,
    ):
        with pytest.raises(BackendUnavailable):
            await retriever.upsert_document("t", doc("d", list("abcde"), [0, 1, 2, 3, 4]))

        # The discard: 5 deletes, 4 lines (2 x bulk_batch_size) a request.
        assert calls == ["forwarded", "forwarded", "killed", "forwarded", "forwarded"]
        assert await raw_chunks(opensearch_url, retriever, "t") == []
        assert await retriever.generation("t") == 0


async def test_deleting_a_document_readers_never_saw_is_false_and_removes_its_hidden_chunks(
    opensearch_url: str,
) -> None:
    # The staging's second batch is killed, and so is the discard: hidden chunks stay behind.
    async with (
        bulk_killing_proxy(opensearch_url, forward=1) as (url, _calls, heal),
        retriever_via(url, attempts=1, bulk_batch_size=1) as retriever,
    ):
        with pytest.raises(BackendUnavailable):
            await retriever.upsert_document("t", doc("d", ["a", "b"], [1, 2]))
        assert [c["pending"] for c in await raw_chunks(opensearch_url, retriever, "t")] == [True]
        heal.set()

        assert await retriever.delete_document("t", "d") is False

        assert await raw_chunks(opensearch_url, retriever, "t") == []


async def test_two_writers_of_one_document_settle_on_one_whole_version(
    opensearch_url: str, make_opensearch_retriever: RetrieverFactory
) -> None:
    """Two processes (two clients) write different versions of one document at once, so both
    can flip; whatever the interleaving, readers are left with one version, whole."""
    first = await make_opensearch_retriever(server_side_fusion="off")
    second = OpenSearchRetriever(first.config)
    try:
        for n in range(8):
            a = doc("d", [f"a{n} one", f"a{n} two"], [1, 2], rev=f"a{n}")
            b = doc("d", [f"b{n} one", f"b{n} two", f"b{n} three"], [3, 4, 5], rev=f"b{n}")
            results = await asyncio.gather(
                first.upsert_document("t", a),
                second.upsert_document("t", b),
                return_exceptions=True,
            )
            # Neither fails: a writer whose staged chunks the other deleted writes again.
            assert results == [True, True], results
            texts = sorted(h.text for h in await first.document_chunks("t", "d"))
            assert texts in (sorted(c.text for c in a.chunks), sorted(c.text for c in b.chunks))
            stored = await first.content_hash("t", "d")
            assert stored == (a.content_hash if texts[0].startswith("a") else b.content_hash)
    finally:
        await second.aclose()


async def test_a_writer_whose_staged_chunks_another_flip_deleted_writes_again_whole(
    make_opensearch_retriever: RetrieverFactory,
) -> None:
    """Step by step: the first writer stages its chunks and stops before its flip; the second
    writes the document whole, deleting those staged chunks as stale; the first's flip then
    finds them gone and writes again from a fresh read, so it is the last and whole version."""
    first = await make_opensearch_retriever(server_side_fusion="off")
    second = OpenSearchRetriever(first.config)
    a = doc("d", ["a one", "a two"], [1, 2], rev="a")
    b = doc("d", ["b one", "b two", "b three"], [3, 4, 5], rev="b")
    staged, go_on = asyncio.Event(), asyncio.Event()
    flip = first._writes._flip
    flips = 0

    async def paused_flip(*args: Any) -> None:
        nonlocal flips
        flips += 1
        if flips == 1:
            staged.set()
            await go_on.wait()
        await flip(*args)

    first._writes._flip = paused_flip  # type: ignore[method-assign]
    try:
        writing = asyncio.ensure_future(first.upsert_document("t", a))
        await staged.wait()
        index = await first.current_index("t")
        await first._layout.client.indices.refresh(index=index)  # the second's read sees them
        assert await second.upsert_document("t", b) is True
        go_on.set()

        assert await writing is True
        assert flips == 2  # the flip that found its chunks gone, and the whole write again
        texts = sorted(h.text for h in await first.document_chunks("t", "d"))
        assert texts == sorted(c.text for c in a.chunks)
        assert await second.content_hash("t", "d") == a.content_hash
    finally:
        await second.aclose()


# -- from tenancy: shared to index_per_tenant ------------------------------------------------


async def test_index_per_tenant_refuses_to_start_over_chunks_of_the_shared_layout(
    make_opensearch_retriever: RetrieverFactory,
) -> None:
    shared = await make_opensearch_retriever(tenancy="shared", server_side_fusion="off")
    await shared.upsert_document("t", doc("d", ["kept"], [1]))
    upgraded = OpenSearchRetriever(replace_config(shared.config, tenancy="index_per_tenant"))
    try:
        with pytest.raises(SharedChunksNotMigrated) as refused:
            await upgraded.ensure_index()
        message = str(refused.value)
        assert "tenancy: shared" in message and "migrate-tenancy" in message
        # /readyz (ping) and every request fail with it instead of serving empty tenants.
        with pytest.raises(BackendError, match="shared alias"):
            await upgraded.ping()
        with pytest.raises(SharedChunksNotMigrated):
            await upgraded.search(SearchRequest("t", "kept", unit_vector(1)))
    finally:
        await upgraded.aclose()


async def test_migration_moves_each_tenant_into_its_own_index_and_is_idempotent(
    make_opensearch_retriever: RetrieverFactory, opensearch_url: str
) -> None:
    shared = await make_opensearch_retriever(tenancy="shared", server_side_fusion="off")
    await shared.upsert_documents("a", [doc("d1", ["alpha one"], [1]), doc("d2", ["two"], [2])])
    await shared.upsert_document("b", doc("d1", ["beta", "gamma"], [3, 4]))
    generations = {t: await shared.generation(t) for t in ("a", "b")}
    upgraded = OpenSearchRetriever(replace_config(shared.config, tenancy="index_per_tenant"))
    try:
        assert await upgraded.migrate_shared_to_per_tenant() == {"a": 2, "b": 2}

        await upgraded.ensure_index()
        assert await upgraded.stats("a") == (2, 2)
        assert await upgraded.stats("b") == (1, 2)
        assert await upgraded.content_hashes("a", ["d1", "d2"]) == {"d1": "d1-1", "d2": "d2-1"}
        hits = await upgraded.search(SearchRequest("a", "alpha", unit_vector(1), k=5))
        assert ids(hits)[0] == "d1#0"
        assert {t: await upgraded.generation(t) for t in ("a", "b")} == generations
        aliases = opensearch_request(opensearch_url, f"/_alias/{shared.config.alias}*")
        assert not any(shared.config.alias in entry["aliases"] for entry in aliases.values())
        # A run that stopped after copying (the shared copy still there) is finished by
        # running again: same ids, so nothing is doubled.
        await shared.ensure_index()  # the shared alias again, as before the first run
        await shared.upsert_document("b", doc("d1", ["beta", "gamma"], [3, 4]))
        assert await upgraded.migrate_shared_to_per_tenant() == {"b": 2}
        assert await upgraded.migrate_shared_to_per_tenant() == {}
        assert await upgraded.stats("b") == (1, 2)
    finally:
        await upgraded.aclose()


async def test_querygate_opensearch_migrate_tenancy_moves_the_chunks_and_prints_counts(
    make_opensearch_retriever: RetrieverFactory, tmp_path: Path
) -> None:
    shared = await make_opensearch_retriever(tenancy="shared", server_side_fusion="off")
    await shared.upsert_documents("a", [doc("d1", ["alpha one"], [1]), doc("d2", ["two"], [2])])
    await shared.upsert_document("b", doc("d1", ["beta"], [3]))

    def cli_config(tenancy: str) -> Path:
        section = shared.config.model_dump(
            mode="json", include={"hosts", "alias", "dimension", "server_side_fusion"}
        )
        path = tmp_path / f"{tenancy}.yaml"
        path.write_text(json.dumps({"retrieval": {"opensearch": {**section, "tenancy": tenancy}}}))
        return path

    migrate = ("opensearch", "migrate-tenancy")
    refused = await asyncio.to_thread(run_cli, cli_config("shared"), *migrate)
    assert refused.returncode == 2, refused.stderr[-2000:]
    assert "must be index_per_tenant" in refused.stderr
    done = await asyncio.to_thread(run_cli, cli_config("index_per_tenant"), *migrate)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout) == {"tenants": 2, "chunks": 3}
    upgraded = OpenSearchRetriever(replace_config(shared.config, tenancy="index_per_tenant"))
    try:
        assert (await upgraded.stats("a"), await upgraded.stats("b")) == ((2, 2), (1, 1))
    finally:
        await upgraded.aclose()


def replace_config(config: OpenSearchConfig, **changes: Any) -> OpenSearchConfig:
    return config.model_copy(update=changes)


@pytest.mark.parametrize("tenancy_mode", ["shared", "index_per_tenant"])
async def test_sources_follow_the_provenance_contract(
    make_opensearch_retriever: RetrieverFactory,
    tenancy_mode: Literal["shared", "index_per_tenant"],
) -> None:
    """tests/fixtures/provenance.py, and chunks written before the `source` field existed
    (none on them) read as no source: listed under "", never under a folder's."""
    retriever = await make_opensearch_retriever(tenancy=tenancy_mode)
    await check_provenance(retriever, TEST_DIMENSION)
    await retriever.upsert_document("a", replace(doc("old", ["old text"], [5]), source="x"))
    await retriever._layout.client.update_by_query(  # as an index from before the field had it
        index=retriever.config.tenant_alias("a"),
        body={
            "query": {"term": {"doc_id": "old"}},
            "script": {"lang": "painless", "source": "ctx._source.remove('source')"},
        },
        refresh=True,
    )
    assert await retriever.sources("a", ["old"]) == {"old": ""}
    assert "old" in await retriever.source_documents("a", "")
    assert await retriever.source_documents("a", "x") == []
