"""`EmbeddedRetriever`: the `Retriever` seam over one SQLite file, run on one thread of its own.

Everything touching the connection or the in-memory vectors runs on that dedicated thread, so
the event loop never blocks on disk or on a matmul, and the thread's FIFO order is the only
synchronisation needed: a reader never sees half of a write.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import TypeVar

from backends.errors import BackendUnavailable
from backends.retrieval.base import (
    DEFAULT_FUSION,
    Document,
    FusionMethod,
    Hit,
    SearchRequest,
    refuse_empty,
)
from backends.retrieval.embedded import store, writes
from backends.retrieval.embedded.search import document_chunks, fts_query, search_hits
from backends.retrieval.embedded.state import IndexState

T = TypeVar("T")


class EmbeddedRetriever:
    """A `Retriever` over one SQLite file; see `store` for the layout."""

    name = store.BACKEND

    def __init__(
        self,
        path: Path,
        *,
        max_query_chars: int = 1000,
        max_query_terms: int = 32,
        fusion: FusionMethod = DEFAULT_FUSION,
    ) -> None:
        self._path = path
        self._fusion = fusion
        self._max_query_chars = max_query_chars
        self._max_query_terms = max_query_terms
        self._state: IndexState | None = None
        self._closed = False
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="embedded-index"
        )
        # Opened on the worker thread (sqlite3 connections belong to their thread); queued
        # first, so every later call runs after it.
        self._opened = self._executor.submit(self._open)

    async def __aenter__(self) -> EmbeddedRetriever:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.aclose()

    async def _run(self, operation: str, fn: Callable[[IndexState], T]) -> T:
        def call() -> T:
            with store.translated(operation):
                self._opened.result()
                assert self._state is not None  # set by _open, which succeeded
                return fn(self._state)

        if self._closed:
            raise BackendUnavailable(store.BACKEND, f"{operation}: the index is closed")
        return await asyncio.get_running_loop().run_in_executor(self._executor, call)

    def _open(self) -> None:
        with store.translated("open"):
            self._state = IndexState(store.open_file(self._path))

    # -- reads ------------------------------------------------------------------------------

    async def search(self, request: SearchRequest) -> list[Hit]:
        query = fts_query(request.text, self._max_query_chars, self._max_query_terms)
        return await self._run(
            "search", lambda state: search_hits(state, request, query, self._fusion)
        )

    async def document_chunks(self, tenant: str, doc_id: str, limit: int = 50) -> list[Hit]:
        return await self._run(
            "document_chunks", lambda state: document_chunks(state, tenant, doc_id, limit)
        )

    async def content_hash(self, tenant: str, doc_id: str) -> str | None:
        return await self._run(
            "content_hash", lambda state: store.content_hash(state.db, tenant, doc_id)
        )

    async def content_hashes(self, tenant: str, doc_ids: Sequence[str]) -> dict[str, str]:
        return await self._run(
            "content_hashes", lambda state: store.content_hashes(state.db, tenant, doc_ids)
        )

    async def generation(self, tenant: str) -> int:
        return await self._run(
            "generation", lambda state: store.stored_generation(state.db, tenant)
        )

    async def stats(self, tenant: str) -> tuple[int, int]:
        return await self._run("stats", lambda state: store.counts(state.db, tenant))

    async def ping(self) -> None:
        await self._run("ping", lambda state: state.db.execute("SELECT 1").fetchone())

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
        # a retry writes it). SQLite is local, so the per-document cost is no round trip.
        return [
            await self._run("upsert", partial(writes.upsert, tenant=tenant, document=document))
            for document in documents
        ]

    async def delete_document(self, tenant: str, doc_id: str) -> bool:
        return await self._run("delete", lambda state: writes.delete(state, tenant, doc_id))

    async def aclose(self) -> None:
        def close() -> None:
            if self._state is not None:
                self._state.db.close()
                self._state = None

        if self._closed:
            return
        self._closed = True
        await asyncio.get_running_loop().run_in_executor(self._executor, close)
        self._executor.shutdown(wait=True)
