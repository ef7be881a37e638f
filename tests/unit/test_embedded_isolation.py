"""The embedded index keeps tenants out of each other's way: per-tenant read lanes, the bound on
what FTS5 scores for one query, and vectors caught up row by row from the change log."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import closing
from pathlib import Path

import pytest

from backends.retrieval.base import FusionMethod, Hit, SearchRequest
from backends.retrieval.embedded import EmbeddedRetriever, changes, retriever, state
from backends.retrieval.embedded.lanes import ReadLanes
from backends.retrieval.embedded.state import IndexState
from tests.fixtures.documents import chunk_ids, make_doc
from tests.fixtures.embeddings import unit_vector

SearchHits = Callable[
    [IndexState, SearchRequest, Sequence[str], FusionMethod, "int | None"], list[Hit]
]
# A hang guard only: the assertions are on what the code decided, not on how long it took.
HANG_S = 30


# -- read lanes ------------------------------------------------------------------------------


class Gate:
    """Holds every search of one tenant inside its read thread until opened."""

    def __init__(self, tenant: str) -> None:
        self.tenant = tenant
        self.entered = 0
        self.inside = threading.Event()
        self.open = threading.Event()

    def wrap(self, real: SearchHits) -> SearchHits:
        def gated(
            st: IndexState,
            request: SearchRequest,
            terms: Sequence[str],
            fusion: FusionMethod,
            budget: int | None,
        ) -> list[Hit]:
            if request.tenant == self.tenant:
                self.entered += 1
                self.inside.set()
                assert self.open.wait(HANG_S), "the gate was never opened"
            return real(st, request, terms, fusion, budget)

        return gated


@pytest.fixture
def gate(monkeypatch: pytest.MonkeyPatch) -> Iterator[Gate]:
    held = Gate("flood")
    monkeypatch.setattr(retriever, "search_hits", held.wrap(retriever.search_hits))
    yield held
    held.open.set()


async def test_a_tenants_search_does_not_queue_behind_another_tenants_searches(
    tmp_path: Path, gate: Gate
) -> None:
    async with EmbeddedRetriever(tmp_path / "index.sqlite3") as index:
        await index.upsert_document("flood", make_doc("f", ["common words"], [1]))
        await index.upsert_document("victim", make_doc("v", ["victim words"], [2]))
        floods = [
            asyncio.create_task(index.search(SearchRequest("flood", "common", unit_vector(1))))
            for _ in range(3)
        ]
        assert await asyncio.to_thread(gate.inside.wait, HANG_S)

        victim = SearchRequest("victim", "victim", unit_vector(2))
        hits = await asyncio.wait_for(index.search(victim), HANG_S)

        assert chunk_ids(hits) == ["v#0"]
        # The flooder's other searches wait in its lane, not on the pool's other threads.
        assert gate.entered == 1
        assert all(not f.done() for f in floods)
        gate.open.set()
        for found in await asyncio.gather(*floods):
            assert chunk_ids(found) == ["f#0"]
        assert gate.entered == 3


async def test_a_cancelled_read_holds_its_lane_until_its_thread_is_done() -> None:
    lanes: ReadLanes[object] = ReadLanes(2, object, lambda _: None)
    inside, release = threading.Event(), threading.Event()

    def slow(_: object) -> str:
        inside.set()
        assert release.wait(HANG_S)
        return "slow"

    first = asyncio.create_task(lanes.run("t", slow))
    assert await asyncio.to_thread(inside.wait, HANG_S)
    first.cancel()
    await asyncio.wait([first])
    assert first.cancelled()
    second = asyncio.create_task(lanes.run("t", lambda _: "second"))
    await asyncio.sleep(0)
    # The cancelled read still runs on its thread: the tenant's next read waits for it.
    assert lanes.waiting("t") == 2
    assert not second.done()
    release.set()
    assert await second == "second"
    assert lanes.waiting("t") == 0
    lanes.close()


# -- the bound on a lexical query ------------------------------------------------------------


async def bm25_ids(index: EmbeddedRetriever, tenant: str, text: str) -> list[str]:
    hits = await index.search(SearchRequest(tenant, text, unit_vector(0), k=50, mode="bm25"))
    return sorted(chunk_ids(hits))


@pytest.fixture
async def bounded(tmp_path: Path) -> EmbeddedRetriever:
    index = EmbeddedRetriever(tmp_path / "index.sqlite3", lexical_row_budget=4)
    texts = [f"common filler{i}" for i in range(8)]
    texts += ["common alpha", "common alpha", "common beta", "common beta", "common beta"]
    await index.upsert_document("big", make_doc("b", texts, list(range(len(texts)))))
    await index.upsert_document("small", make_doc("s", ["common", "common", "rare"], [1, 2, 3]))
    return index


async def test_a_term_in_half_a_large_tenants_rows_is_not_scored(
    bounded: EmbeddedRetriever,
) -> None:
    async with bounded as index:
        assert await bm25_ids(index, "big", "common") == []
        assert await bm25_ids(index, "big", "common alpha") == ["b#8", "b#9"]


async def test_terms_are_kept_rarest_first_while_their_rows_fit_the_budget(
    bounded: EmbeddedRetriever,
) -> None:
    async with bounded as index:
        # alpha (2 rows) fits the budget of 4, beta (3 more) does not.
        assert await bm25_ids(index, "big", "beta alpha") == ["b#8", "b#9"]
        # The rarest term is kept even past the budget: it has an idf.
        assert await bm25_ids(index, "big", "beta") == ["b#10", "b#11", "b#12"]


async def test_a_tenant_no_larger_than_the_budget_is_scored_as_typed(
    bounded: EmbeddedRetriever,
) -> None:
    async with bounded as index:
        assert await bm25_ids(index, "small", "common rare") == ["s#0", "s#1", "s#2"]


# -- vectors caught up from the change log ---------------------------------------------------


class RowsRead:
    """Counts the vector rows a process reads: whole tenants, and rows named by the log."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.whole: list[int] = []
        self.changed: list[int] = []
        real_whole, real_rows = state.read_vectors, state.read_rows

        def whole(db: sqlite3.Connection, tenant: str, generation: int) -> object:
            vectors = real_whole(db, tenant, generation)
            self.whole.append(0 if vectors is None else len(vectors))
            return vectors

        def rows(db: sqlite3.Connection, tenant: str, ids: Sequence[int]) -> object:
            found = real_rows(db, tenant, ids)
            self.changed.append(len(found[0]))
            return found

        monkeypatch.setattr(state, "read_vectors", whole)
        monkeypatch.setattr(state, "read_rows", rows)


async def dense_ids(index: EmbeddedRetriever, seed: int) -> list[str]:
    hits = await index.search(SearchRequest("t", "", unit_vector(seed), k=100, mode="dense"))
    return chunk_ids(hits)


async def test_another_process_write_is_applied_by_reading_only_its_rows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "index.sqlite3"
    async with EmbeddedRetriever(path) as server, EmbeddedRetriever(path) as worker:
        for i in range(30):
            await server.upsert_document("t", make_doc(f"d{i}", [f"text {i}"], [i]))
        read = RowsRead(monkeypatch)
        assert (await dense_ids(server, 3))[0] == "d3#0"
        assert read.whole == [30]

        await worker.upsert_document("t", make_doc("new", ["one", "two"], [100, 101]))
        await worker.delete_document("t", "d3")
        await worker.upsert_document("t", make_doc("d4", ["four again"], [104], rev="2"))
        found = await dense_ids(server, 100)

        assert read.whole == [30]  # no reload
        assert read.changed == [3]  # new#0, new#1, d4#0: the deleted row is gone, not read
        assert found[0] == "new#0"
        assert "d3#0" not in found and len(found) == 31
        assert (await dense_ids(server, 104))[0] == "d4#0"


async def test_a_process_own_writes_are_applied_the_same_way(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with EmbeddedRetriever(tmp_path / "index.sqlite3") as index:
        await index.upsert_document("t", make_doc("a", ["a one", "a two"], [1, 2]))
        read = RowsRead(monkeypatch)
        await dense_ids(index, 1)
        await index.upsert_document("t", make_doc("b", ["b one"], [3]))
        assert (await dense_ids(index, 3))[0] == "b#0"
        assert (read.whole, read.changed) == ([2], [1])


async def test_generations_the_log_does_not_cover_reload_the_tenant_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "index.sqlite3"
    async with EmbeddedRetriever(path) as index:
        await index.upsert_document("t", make_doc("a", ["a one", "a two"], [1, 2]))
        read = RowsRead(monkeypatch)
        await dense_ids(index, 1)
        with closing(sqlite3.connect(path)) as db, db:  # a writer that logs nothing
            db.execute("UPDATE tenants SET generation = generation + 1")
        await index.upsert_document("t", make_doc("b", ["b one"], [3]))
        assert (await dense_ids(index, 3))[0] == "b#0"
        assert (read.whole, read.changed) == ([2, 3], [])


async def test_the_log_keeps_a_bounded_number_of_generations(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(changes, "KEEP_GENERATIONS", 3)
    path = tmp_path / "index.sqlite3"
    async with EmbeddedRetriever(path) as index:
        for rev in range(6):
            await index.upsert_document("t", make_doc("a", ["a"], [rev], rev=str(rev)))
    with closing(sqlite3.connect(path)) as db:
        kept = db.execute("SELECT DISTINCT generation FROM changes ORDER BY 1").fetchall()
    assert kept == [(4,), (5,), (6,)]


async def test_a_tenant_emptied_and_refilled_with_another_dimension_is_searched_as_stored(
    tmp_path: Path,
) -> None:
    async with EmbeddedRetriever(tmp_path / "index.sqlite3") as index:
        await index.upsert_document("t", make_doc("a", ["a"], [1]))
        await dense_ids(index, 1)
        await index.delete_document("t", "a")
        # An empty tenant holds no dimension: a query of any size finds nothing, no error.
        eight = SearchRequest("t", "", unit_vector(2, 8), mode="dense")
        assert await index.search(eight) == []
        await index.upsert_document("t", make_doc("b", ["b"], [2], dimension=8))
        assert chunk_ids(await index.search(eight)) == ["b#0"]
