"""`EmbeddedRetriever`: the `Retriever` seam over one SQLite file, off the event loop.

Writes run on one thread of their own with the file's one write connection (SQLite has one
writer), in order. Reads run on a bounded pool of read threads, each with its own connection, in
per-tenant lanes (`lanes`): a tenant's reads one at a time, and never queued in front of another
tenant's. Every read is one snapshot (WAL), so a reader never sees half of a write, and a write
never waits for a read.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import TypeVar

from backends.errors import BackendUnavailable
from backends.retrieval.access import NO_GROUPS, Groups
from backends.retrieval.base import (
    DEFAULT_FUSION,
    Document,
    FusionMethod,
    Hit,
    SearchRequest,
    refuse_empty,
)
from backends.retrieval.embedded import store, versions, writes
from backends.retrieval.embedded.lanes import ReadLanes
from backends.retrieval.embedded.lexical import LEXICAL_ROW_BUDGET, query_terms
from backends.retrieval.embedded.search import document_chunks, search_hits
from backends.retrieval.embedded.state import IndexState, Shared
from backends.retrieval.embedded.versioned import EmbeddedVersions

T = TypeVar("T")
# Read threads: a tenant holds at most one, so this many busy tenants before a read waits.
READERS = 4


class EmbeddedRetriever(EmbeddedVersions):
    """A `Retriever` over one SQLite file; see `store` for the layout, and `versioned` for its
    index versions."""

    name = store.BACKEND

    def __init__(
        self,
        path: Path,
        *,
        max_query_chars: int = 1000,
        max_query_terms: int = 32,
        fusion: FusionMethod = DEFAULT_FUSION,
        readers: int = READERS,
        lexical_row_budget: int | None = LEXICAL_ROW_BUDGET,
    ) -> None:
        self._path = path
        self._fusion = fusion
        self._max_query_chars = max_query_chars
        self._max_query_terms = max_query_terms
        self._row_budget = lexical_row_budget
        self._shared = Shared()
        self._state: IndexState | None = None
        self._closed = False
        self._writer = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="embedded-write"
        )
        # Opened on the write thread (sqlite3 connections belong to their thread); queued
        # first, so every later write runs after it, and every read connection waits for it
        # (the schema and the migration come first).
        self._opened = self._writer.submit(self._open)
        self._readers = ReadLanes(readers, self._open_reader, lambda state: state.db.close())

    async def __aenter__(self) -> EmbeddedRetriever:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.aclose()

    async def _write(self, operation: str, fn: Callable[[IndexState], T]) -> T:
        def call() -> T:
            with store.translated(operation):
                self._opened.result()
                assert self._state is not None  # set by _open, which succeeded
                return fn(self._state)

        self._refuse_closed(operation)
        return await asyncio.get_running_loop().run_in_executor(self._writer, call)

    async def _read(self, tenant: str | None, operation: str, fn: Callable[[IndexState], T]) -> T:
        def call(state: IndexState) -> T:
            with store.translated(operation), store.snapshot(state.db):
                return fn(state)

        self._refuse_closed(operation)
        return await self._readers.run(tenant, call)

    def _refuse_closed(self, operation: str) -> None:
        if self._closed:
            raise BackendUnavailable(store.BACKEND, f"{operation}: the index is closed")

    def _open(self) -> None:
        with store.translated("open"):
            db = store.open_file(self._path)
            versions.create_tables(db)
            self._state = IndexState(db, self._shared)

    def _open_reader(self) -> IndexState:
        self._opened.result()  # raises what opening the file raised
        with store.translated("open"):
            return IndexState(store.open_reader(self._path), self._shared)

    # -- reads ------------------------------------------------------------------------------

    async def search(self, request: SearchRequest) -> list[Hit]:
        terms = query_terms(request.text, self._max_query_chars, self._max_query_terms)
        return await self._read(
            request.tenant,
            "search",
            lambda state: search_hits(state, request, terms, self._fusion, self._row_budget),
        )

    async def document_chunks(
        self, tenant: str, doc_id: str, limit: int = 50, groups: Groups = NO_GROUPS
    ) -> list[Hit]:
        return await self._read(
            tenant,
            "document_chunks",
            lambda state: document_chunks(state, tenant, doc_id, limit, groups),
        )

    async def content_hash(self, tenant: str, doc_id: str) -> str | None:
        return await self._read(
            tenant, "content_hash", lambda state: store.content_hash(state.db, tenant, doc_id)
        )

    async def content_hashes(self, tenant: str, doc_ids: Sequence[str]) -> dict[str, str]:
        return await self._read(
            tenant,
            "content_hashes",
            lambda state: store.content_hashes(state.db, tenant, doc_ids),
        )

    async def sources(self, tenant: str, doc_ids: Sequence[str]) -> dict[str, str]:
        return await self._read(
            tenant, "sources", lambda state: store.sources(state.db, tenant, doc_ids)
        )

    async def source_documents(self, tenant: str, source: str) -> list[str]:
        return await self._read(
            tenant,
            "source_documents",
            lambda state: store.source_documents(state.db, tenant, source),
        )

    async def generation(self, tenant: str) -> int:
        return await self._read(
            tenant, "generation", lambda state: store.stored_generation(state.db, tenant)
        )

    async def stats(self, tenant: str) -> tuple[int, int]:
        return await self._read(tenant, "stats", lambda state: store.counts(state.db, tenant))

    async def ping(self) -> None:
        await self._read(None, "ping", lambda state: state.db.execute("SELECT 1").fetchone())

    # -- writes -----------------------------------------------------------------------------

    async def upsert_document(self, tenant: str, document: Document) -> bool:
        return (await self.upsert_documents(tenant, [document]))[0]

    async def upsert_documents(self, tenant: str, documents: Sequence[Document]) -> list[bool]:
        # Every document is checked before any is written: a refused one fails the call whole.
        refuse_empty(documents)
        for document in documents:
            writes.check_chunks(document)
        # One transaction per document: a reader sees a document whole, old or new, and an
        # interrupted batch leaves whole documents only (a rolled-back one keeps its old hash, so
        # a retry writes it). SQLite is local, so the per-document cost is no round trip. Each
        # kept version (a reindex's build, the previous version) gets the write too.
        return [
            await self._write(
                "upsert", partial(versions.upsert_everywhere, tenant=tenant, document=document)
            )
            for document in documents
        ]

    async def delete_document(self, tenant: str, doc_id: str) -> bool:
        return await self._write(
            "delete", lambda state: versions.delete_everywhere(state, tenant, doc_id)
        )

    async def set_source(self, tenant: str, doc_ids: Sequence[str], source: str) -> None:
        # The documents table only: no chunk row changes, so nothing for the change log.
        await self._write(
            "set_source", lambda state: writes.set_source(state.db, tenant, doc_ids, source)
        )

    async def aclose(self) -> None:
        def close() -> None:
            if self._state is not None:
                self._state.db.close()
                self._state = None

        if self._closed:
            return
        self._closed = True
        await asyncio.to_thread(self._readers.close)
        await asyncio.get_running_loop().run_in_executor(self._writer, close)
        self._writer.shutdown(wait=True)
