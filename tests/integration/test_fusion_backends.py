"""Both backends fuse alike: the same documents and request rank identically on the embedded
index and on OpenSearch (client-side fusion, `backends.retrieval.base.fuse` on both).

Feasible where the arms' rankings agree in what fusion reads: min-max scaling ignores each
arm's scale and offset (OpenSearch reports (1 + cos) / 2, the embedded index cos), so a dense
arm ranks and scales identically; the lexical term occurs in one chunk, so each lexical arm has
one candidate, scaled to 1 on both engines. Their BM25 values differ (FTS5 vs Lucene, their
field boosts), so queries matching many chunks are not compared."""

from __future__ import annotations

from pathlib import Path

import pytest

from backends.retrieval.base import FusionMethod, SearchRequest
from backends.retrieval.embedded import EmbeddedRetriever
from tests.fixtures.documents import chunk_ids, make_doc
from tests.fixtures.embeddings import unit_vector
from tests.fixtures.opensearch import TEST_DIMENSION, RetrieverFactory

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]

TEXTS = {
    "manual": ["rotate the flux capacitor weekly", "unrelated prose about trains"],
    "guide": ["a paraphrase only vectors find", "more prose about boats"],
    "notes": ["plain notes on gardening", "plain notes on cooking"],
}


@pytest.mark.parametrize("fusion", ["minmax_peak", "minmax", "rrf"])
async def test_embedded_and_opensearch_rank_identically(
    make_opensearch_retriever: RetrieverFactory, tmp_path: Path, fusion: FusionMethod
) -> None:
    opensearch = await make_opensearch_retriever(use_server_side_rrf="off", fusion=fusion)
    embedded = EmbeddedRetriever(tmp_path / "index.sqlite3", fusion=fusion)
    try:
        for n, (doc_id, texts) in enumerate(TEXTS.items()):
            document = make_doc(doc_id, texts, [40 + 2 * n, 41 + 2 * n], dimension=TEST_DIMENSION)
            for retriever in (embedded, opensearch):
                await retriever.upsert_document("same", document)
        for seed in (40, 43, 45):
            request = SearchRequest("same", "capacitor", unit_vector(seed, TEST_DIMENSION), k=6)
            on_embedded = await embedded.search(request)
            on_opensearch = await opensearch.search(request)
            assert chunk_ids(on_embedded) == chunk_ids(on_opensearch), seed
            assert [h.score for h in on_embedded] == pytest.approx(
                [h.score for h in on_opensearch], abs=1e-6
            )
    finally:
        await embedded.aclose()
