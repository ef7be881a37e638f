"""The embedded hybrid index: one SQLite file, BM25 by FTS5, exact cosine search in numpy.

No server to run: `querygate serve` with no configuration uses this. Everything touching the
connection or the in-memory vectors runs on one dedicated thread, so the event loop never blocks
on disk or on a matmul, and the thread's FIFO order is the only synchronisation needed: a reader
never sees half of a write.

Layout: `documents` (one row per document: title, content hash), `chunks` (metadata and the
float32 embedding blob; its rowid is the chunk's key everywhere), one FTS5 table per tenant,
`fts_t<hash of the tenant>` (title, section and text; rowid = the chunk's key), created by the
tenant's first write, and `tenants` (the generation counter).

Tenants are isolated in ranking as well as in results: BM25's statistics (document frequencies,
average lengths) come from the tenant's own table, and dense search is an exact cosine over the
tenant's own vectors, so nothing another tenant stores moves a tenant's scores or order. (With
one shared table, a tenant could learn whether a word occurs in others' documents from which of
its own two documents ranked first.) A file written before this layout, with one shared
`chunks_fts` table, is migrated when it is opened: each tenant's rows move to its own table in
one transaction, and every tenant's generation is bumped because its scores changed.
Every process on the file must run this version: an older one would recreate the shared table.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import hashlib
import re
import sqlite3
import time
import unicodedata
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TypeVar

import numpy as np

from backends.errors import BackendUnavailable
from backends.retrieval.base import (
    DEFAULT_FUSION,
    ArmRanking,
    Document,
    FusionMethod,
    Hit,
    SearchRequest,
    Vector,
    document_chunk_limit,
    fuse,
    refuse_empty,
)
from backends.retrieval.stopwords import without_stopwords

BACKEND = "embedded"
T = TypeVar("T")

# BM25 column weights, in the FTS tables' column order.
_WEIGHTS = {"title": 2.5, "section": 1.5, "text": 1.0}
_BM25_WEIGHTS = ", ".join(str(w) for w in _WEIGHTS.values())
# '-' and '_' are part of a token so identifiers (ERR-4471, SKU_123) index and match whole.
_TOKENIZER = "unicode61 remove_diacritics 2 tokenchars '-_'"
_QUERY_TOKEN = re.compile(r"[\w-]+")
# The seam's reading order: n of `<doc_id>#<n>` as a number (ids whose n has a non-digit
# last), then the id.
_POSITION = "substr(chunks.chunk_id, length(chunks.doc_id) + 2)"
_READING_ORDER = (
    f"{_POSITION} = '' OR {_POSITION} GLOB '*[^0-9]*', CAST({_POSITION} AS INTEGER),"
    " chunks.chunk_id"
)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS tenants (
    tenant TEXT PRIMARY KEY,
    generation INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS documents (
    tenant TEXT NOT NULL,
    doc_id TEXT NOT NULL,
    title TEXT NOT NULL,
    content_hash TEXT NOT NULL,
    PRIMARY KEY (tenant, doc_id)
);
CREATE TABLE IF NOT EXISTS chunks (
    id INTEGER PRIMARY KEY,
    tenant TEXT NOT NULL,
    doc_id TEXT NOT NULL,
    chunk_id TEXT NOT NULL,
    section TEXT NOT NULL,
    embedding BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS chunks_by_document ON chunks (tenant, doc_id);
"""
# The one FTS5 table all tenants shared before per-tenant tables; only migration reads it.
_LEGACY_FTS = "chunks_fts"


def fts_query(text: str, max_chars: int = 1000, max_terms: int = 32) -> str:
    """User text as an FTS5 expression: an OR of quoted terms, or "" when nothing is left.

    Each term is a run of word characters, '-' and '_', so it can never hold a quote, and
    quoting makes FTS5 read operators (NEAR, AND, *, :, parentheses) as plain words.
    """
    text = unicodedata.normalize("NFKC", text)[:max_chars]
    terms = [t.lower() for t in _QUERY_TOKEN.findall(text) if any(ch.isalnum() for ch in t)]
    unique = list(dict.fromkeys(terms))
    content = without_stopwords(unique)
    return " OR ".join(f'"{t}"' for t in content[:max_terms])


def tenant_key(tenant: str) -> str:
    """An identifier-safe, fixed-length key for the tenant, whatever the tenant id."""
    return "t" + hashlib.sha256(tenant.encode()).hexdigest()[:32]


def fts_table(tenant: str) -> str:
    """The name of the tenant's FTS5 table (safe to splice into SQL: `fts_t` + 32 hex digits)."""
    return f"fts_{tenant_key(tenant)}"


def _create_fts(db: sqlite3.Connection, table: str) -> None:
    db.execute(
        f"CREATE VIRTUAL TABLE IF NOT EXISTS {table} USING fts5("
        f'{", ".join(_WEIGHTS)}, tokenize = "{_TOKENIZER}")'
    )


def _table_exists(db: sqlite3.Connection, table: str) -> bool:
    row = db.execute("SELECT 1 FROM sqlite_master WHERE name = ?", (table,)).fetchone()
    return row is not None


class _TenantVectors:
    """One tenant's embeddings in memory, for exact cosine search by one matmul.

    Rows live in a growable buffer; removed rows are tombstoned and the buffer compacted when
    they exceed half of it, so a single-document write costs O(its chunks), not O(tenant).
    `generation` is the tenant's generation these rows reflect.
    """

    def __init__(self, dimension: int, generation: int) -> None:
        self.dimension = dimension
        self.generation = generation
        self._matrix = np.zeros((0, dimension), dtype=np.float32)
        self._ids = np.zeros(0, dtype=np.int64)  # chunk row id per row, -1 when removed
        self._size = 0
        self._where: dict[int, int] = {}

    def add(self, ids: Sequence[int], vectors: Vector) -> None:
        needed = self._size + len(ids)
        if needed > len(self._ids):
            self._grow(max(needed, 2 * len(self._ids), 64))
        self._matrix[self._size : needed] = vectors
        self._ids[self._size : needed] = ids
        self._where.update((chunk, self._size + i) for i, chunk in enumerate(ids))
        self._size = needed

    def remove(self, ids: Sequence[int]) -> None:
        for chunk in ids:
            row = self._where.pop(chunk, None)
            if row is not None:
                self._ids[row] = -1
        if self._size and len(self._where) < self._size // 2:
            self._compact()

    def top(self, query: Vector, n: int) -> list[tuple[int, float]]:
        """(chunk row id, cosine) of the n nearest live rows, best first."""
        if not self._where or n <= 0:
            return []
        # einsum's own loop, not BLAS: a matrix-vector product is memory-bound, and OpenBLAS's
        # threads made it 5-20x slower on a busy 2-core host (10k rows: 0.7 ms vs 3-17 ms).
        scores = np.einsum("ij,j->i", self._matrix[: self._size], query)
        scores[self._ids[: self._size] < 0] = -np.inf
        n = min(n, len(self._where))
        best = np.argpartition(-scores, n - 1)[:n]
        best = best[np.argsort(-scores[best], kind="stable")]
        return [(int(self._ids[i]), float(scores[i])) for i in best]

    def _grow(self, capacity: int) -> None:
        matrix = np.zeros((capacity, self.dimension), dtype=np.float32)
        ids = np.full(capacity, -1, dtype=np.int64)
        matrix[: self._size] = self._matrix[: self._size]
        ids[: self._size] = self._ids[: self._size]
        self._matrix, self._ids = matrix, ids

    def _compact(self) -> None:
        live = np.flatnonzero(self._ids[: self._size] >= 0)
        self._matrix[: len(live)] = self._matrix[live]
        self._ids[: len(live)] = self._ids[live]
        self._ids[len(live) :] = -1
        self._size = len(live)
        self._where = {int(chunk): row for row, chunk in enumerate(self._ids[: self._size])}


@dataclass(frozen=True, slots=True)
class _Ranked:
    """One arm's ranking: chunk row ids best first, with the arm's own scores."""

    ids: list[int]
    scores: dict[int, float]


@contextmanager
def _translated(operation: str) -> Iterator[None]:
    try:
        yield
    except sqlite3.Error as exc:
        raise BackendUnavailable(BACKEND, f"{operation}: {exc}") from exc


class EmbeddedRetriever:
    """A `Retriever` over one SQLite file; see the module docstring for the layout."""

    name = BACKEND

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
        self._db: sqlite3.Connection | None = None
        self._closed = False
        self._vectors: dict[str, _TenantVectors] = {}
        # FTS tables known to exist; tables are never dropped, so a hit never goes stale.
        self._fts_tables: set[str] = set()
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

    async def _run(self, operation: str, fn: Callable[[sqlite3.Connection], T]) -> T:
        def call() -> T:
            with _translated(operation):
                self._opened.result()
                assert self._db is not None  # set by _open, which succeeded
                return fn(self._db)

        if self._closed:
            raise BackendUnavailable(BACKEND, f"{operation}: the index is closed")
        return await asyncio.get_running_loop().run_in_executor(self._executor, call)

    def _open(self) -> None:
        with _translated("open"):
            db = sqlite3.connect(self._path, isolation_level=None)
            _enable_wal(db)
            # WAL + NORMAL: a crash may lose the last commits but never corrupts the file.
            db.execute("PRAGMA synchronous=NORMAL")
            db.executescript(_SCHEMA)
            _migrate_shared_fts(db)
            self._db = db

    # -- reads ------------------------------------------------------------------------------

    async def search(self, request: SearchRequest) -> list[Hit]:
        query = fts_query(request.text, self._max_query_chars, self._max_query_terms)
        return await self._run("search", lambda db: self._search(db, request, query))

    def _search(self, db: sqlite3.Connection, request: SearchRequest, query: str) -> list[Hit]:
        arms: dict[str, tuple[_Ranked, float]] = {}
        if request.mode != "dense" and query:
            arms["bm25"] = (self._bm25(db, request, query), request.lexical_weight)
        if request.mode != "bm25":
            arms["dense"] = (self._dense(db, request), request.dense_weight)
        method = request.fusion or self._fusion
        rankings = [
            ArmRanking([str(i) for i in r.ids], [r.scores[i] for i in r.ids], w)
            for r, w in arms.values()
        ]
        top = [(int(key), score) for key, score in fuse(rankings, method)[: request.k]]
        return self._hits(db, request.tenant, top, {name: r for name, (r, _) in arms.items()})

    def _fts(self, db: sqlite3.Connection, tenant: str) -> str | None:
        """The tenant's FTS table, None before its first write."""
        table = fts_table(tenant)
        if table in self._fts_tables:
            return table
        if not _table_exists(db, table):
            return None  # not remembered: another process may create it
        self._fts_tables.add(table)
        return table

    def _bm25(self, db: sqlite3.Connection, request: SearchRequest, query: str) -> _Ranked:
        # The tenant's own table: FTS5 only ever ranks this tenant's rows, with statistics of
        # this tenant's rows only. The join re-checks the tenant column as a second, independent
        # guard. It joins after the LIMIT: joining every match before sorting doubled the time.
        table = self._fts(db, request.tenant)
        if table is None:
            return _Ranked([], {})
        rows = db.execute(
            f"SELECT top.id, top.score FROM (SELECT rowid AS id,"
            f" bm25({table}, {_BM25_WEIGHTS}) AS score FROM {table} WHERE {table} MATCH ?"
            " ORDER BY score LIMIT ?) AS top"
            " JOIN chunks USING (id) WHERE chunks.tenant = ? ORDER BY top.score",
            (f"{{title section text}} : ({query})", request.candidates, request.tenant),
        ).fetchall()
        # FTS5's bm25() is lower-is-better; negate so every arm's score is higher-is-better.
        return _Ranked([r[0] for r in rows], {r[0]: -r[1] for r in rows})

    def _dense(self, db: sqlite3.Connection, request: SearchRequest) -> _Ranked:
        vectors = self._tenant_vectors(db, request.tenant)
        if vectors is None:
            return _Ranked([], {})
        if request.vector.shape != (vectors.dimension,):
            raise ValueError(
                f"query vector has shape {request.vector.shape}, index holds {vectors.dimension}-d"
            )
        top = vectors.top(request.vector.astype(np.float32, copy=False), request.candidates)
        return _Ranked([i for i, _ in top], dict(top))

    def _tenant_vectors(self, db: sqlite3.Connection, tenant: str) -> _TenantVectors | None:
        """The tenant's current vectors; None when it has no chunks.

        Read from disk on first use, and again when the stored generation moved past the one
        in memory: another process wrote to the file (`querygate ingest` beside a running
        `querygate serve`). This process's own writes keep them current without a reload.
        """
        current = _generation(db, tenant)
        vectors = self._vectors.get(tenant)
        if vectors is not None and vectors.generation == current:
            return vectors
        # The generation is read before the rows: a write landing in between makes the rows
        # newer than the recorded generation, so the next search reloads; never the reverse.
        rows = db.execute("SELECT id, embedding FROM chunks WHERE tenant = ?", (tenant,))
        ids: list[int] = []
        blobs: list[bytes] = []
        for chunk, blob in rows:
            ids.append(chunk)
            blobs.append(blob)
        if not ids:
            self._vectors.pop(tenant, None)
            return None
        matrix = np.frombuffer(b"".join(blobs), dtype=np.float32).reshape(len(ids), -1)
        vectors = _TenantVectors(matrix.shape[1], current)
        vectors.add(ids, matrix)
        self._vectors[tenant] = vectors
        return vectors

    def _hits(
        self,
        db: sqlite3.Connection,
        tenant: str,
        fused: list[tuple[int, float]],
        arms: dict[str, _Ranked],
    ) -> list[Hit]:
        table = self._fts(db, tenant)
        if not fused or table is None:
            return []
        marks = ",".join("?" * len(fused))
        rows = db.execute(
            "SELECT chunks.id, chunks.doc_id, chunks.chunk_id, documents.title, chunks.section,"
            f" {table}.text FROM chunks"
            " JOIN documents USING (tenant, doc_id)"
            f" JOIN {table} ON {table}.rowid = chunks.id"
            f" WHERE chunks.tenant = ? AND chunks.id IN ({marks})",
            (tenant, *[i for i, _ in fused]),
        ).fetchall()
        by_id = {r[0]: r for r in rows}
        ranks = {name: {i: n for n, i in enumerate(r.ids, start=1)} for name, r in arms.items()}
        hits = [_hit(by_id[i], score, ranks, arms) for i, score in fused if i in by_id]
        return sorted(hits, key=lambda h: (-h.score, h.chunk_id, h.doc_id))

    async def document_chunks(self, tenant: str, doc_id: str, limit: int = 50) -> list[Hit]:
        def read(db: sqlite3.Connection) -> list[Hit]:
            table = self._fts(db, tenant)
            if table is None:
                return []
            rows = db.execute(
                f"SELECT chunks.chunk_id, documents.title, chunks.section, {table}.text"
                " FROM chunks"
                " JOIN documents USING (tenant, doc_id)"
                f" JOIN {table} ON {table}.rowid = chunks.id"
                f" WHERE chunks.tenant = ? AND chunks.doc_id = ? ORDER BY {_READING_ORDER} LIMIT ?",
                (tenant, doc_id, document_chunk_limit(limit)),
            )
            return [
                Hit(doc_id, chunk, title, section, text, 0.0)
                for chunk, title, section, text in rows
            ]

        return await self._run("document_chunks", read)

    async def content_hash(self, tenant: str, doc_id: str) -> str | None:
        def read(db: sqlite3.Connection) -> str | None:
            row = db.execute(
                "SELECT content_hash FROM documents WHERE tenant = ? AND doc_id = ?",
                (tenant, doc_id),
            ).fetchone()
            return None if row is None else str(row[0])

        return await self._run("content_hash", read)

    async def content_hashes(self, tenant: str, doc_ids: Sequence[str]) -> dict[str, str]:
        def read(db: sqlite3.Connection) -> dict[str, str]:
            found: dict[str, str] = {}
            # SQLite caps bound parameters per statement (32,766 since 3.32); stay well under.
            for start in range(0, len(doc_ids), 500):
                part = list(doc_ids[start : start + 500])
                marks = ",".join("?" * len(part))
                rows = db.execute(
                    f"SELECT doc_id, content_hash FROM documents"
                    f" WHERE tenant = ? AND doc_id IN ({marks})",
                    (tenant, *part),
                )
                found.update({str(doc_id): str(digest) for doc_id, digest in rows})
            return found

        return await self._run("content_hashes", read)

    async def generation(self, tenant: str) -> int:
        return await self._run("generation", lambda db: _generation(db, tenant))

    async def stats(self, tenant: str) -> tuple[int, int]:
        def read(db: sqlite3.Connection) -> tuple[int, int]:
            (docs,) = db.execute(
                "SELECT count(*) FROM documents WHERE tenant = ?", (tenant,)
            ).fetchone()
            (chunks,) = db.execute(
                "SELECT count(*) FROM chunks WHERE tenant = ?", (tenant,)
            ).fetchone()
            return int(docs), int(chunks)

        return await self._run("stats", read)

    async def ping(self) -> None:
        await self._run("ping", lambda db: db.execute("SELECT 1").fetchone())

    # -- writes -----------------------------------------------------------------------------

    async def upsert_document(self, tenant: str, document: Document) -> bool:
        return (await self.upsert_documents(tenant, [document]))[0]

    async def upsert_documents(self, tenant: str, documents: Sequence[Document]) -> list[bool]:
        # Every document is checked before any is written: a refused one fails the call whole.
        refuse_empty(documents)
        for document in documents:
            _check_chunks(document)
        # One transaction per document: a reader sees a document whole, old or new, and an
        # interrupted batch leaves whole documents only (a rolled-back one keeps its old hash, so
        # a retry writes it). SQLite is local, so the per-document cost is no round trip.
        return [
            await self._run("upsert", partial(self._upsert, tenant=tenant, document=document))
            for document in documents
        ]

    def _upsert(self, db: sqlite3.Connection, tenant: str, document: Document) -> bool:
        with _transaction(db):
            row = db.execute(
                "SELECT content_hash FROM documents WHERE tenant = ? AND doc_id = ?",
                (tenant, document.doc_id),
            ).fetchone()
            if row is not None and row[0] == document.content_hash:
                return False
            _check_dimension(db, tenant, document)
            table = fts_table(tenant)
            if table not in self._fts_tables:
                _create_fts(db, table)
            removed = _delete_chunks(db, tenant, document.doc_id)
            db.execute(
                "INSERT OR REPLACE INTO documents (tenant, doc_id, title, content_hash)"
                " VALUES (?, ?, ?, ?)",
                (tenant, document.doc_id, document.title, document.content_hash),
            )
            added = _insert_chunks(db, tenant, document)
            generation = _bump_generation(db, tenant)
        # Only after the commit: a failed transaction leaves memory as it was, like the file.
        self._fts_tables.add(table)
        self._apply(tenant, generation, removed, added, document)
        return True

    async def delete_document(self, tenant: str, doc_id: str) -> bool:
        return await self._run("delete", lambda db: self._delete(db, tenant, doc_id))

    def _delete(self, db: sqlite3.Connection, tenant: str, doc_id: str) -> bool:
        with _transaction(db):
            gone = db.execute(
                "DELETE FROM documents WHERE tenant = ? AND doc_id = ?", (tenant, doc_id)
            ).rowcount
            if not gone:
                return False
            removed = _delete_chunks(db, tenant, doc_id)
            generation = _bump_generation(db, tenant)
        self._apply(tenant, generation, removed, [], None)
        return True

    def _apply(
        self,
        tenant: str,
        generation: int,
        removed: list[int],
        added: list[int],
        document: Document | None,
    ) -> None:
        """Mirror a committed write in the tenant's vectors, if they are loaded."""
        vectors = self._vectors.get(tenant)
        if vectors is None:
            return  # loaded from disk, with this write, on the tenant's next search
        if vectors.generation != generation - 1:
            # Another process wrote since they were loaded: this write is not the only change.
            del self._vectors[tenant]
            return
        vectors.remove(removed)
        if document is not None and added:
            vectors.add(added, _matrix(document))
        vectors.generation = generation

    async def aclose(self) -> None:
        def close() -> None:
            if self._db is not None:
                self._db.close()
                self._db = None

        if self._closed:
            return
        self._closed = True
        await asyncio.get_running_loop().run_in_executor(self._executor, close)
        self._executor.shutdown(wait=True)


def _hit(
    row: tuple[int, str, str, str, str, str],
    score: float,
    ranks: dict[str, dict[int, int]],
    arms: dict[str, _Ranked],
) -> Hit:
    chunk = row[0]

    def arm(name: str) -> tuple[int | None, float | None]:
        if name not in arms or chunk not in arms[name].scores:
            return None, None
        return ranks[name][chunk], arms[name].scores[chunk]

    (bm25_rank, bm25_score), (dense_rank, dense_score) = arm("bm25"), arm("dense")
    return Hit(
        doc_id=row[1],
        chunk_id=row[2],
        title=row[3],
        section=row[4],
        text=row[5],
        score=score,
        bm25_rank=bm25_rank,
        dense_rank=dense_rank,
        bm25_score=bm25_score,
        dense_score=dense_score,
    )


def _enable_wal(db: sqlite3.Connection, attempts: int = 100) -> None:
    """Switch to WAL. Two processes opening a new file at once race for the exclusive lock the
    switch needs, and SQLite answers "database is locked" without calling its busy handler."""
    for attempt in range(attempts):
        try:
            db.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or attempt == attempts - 1:
                raise
            time.sleep(0.02)


@contextmanager
def _transaction(db: sqlite3.Connection) -> Iterator[None]:
    # IMMEDIATE takes the write lock up front, so a concurrent writer process fails here,
    # before any work, instead of at commit.
    db.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")


def _check_chunks(document: Document) -> None:
    dimensions = {chunk.embedding.shape for chunk in document.chunks}
    if len(dimensions) > 1 or any(len(d) != 1 for d in dimensions):
        raise ValueError(f"{document.doc_id}: chunk embeddings must be 1-d and of one size")
    if len({chunk.chunk_id for chunk in document.chunks}) != len(document.chunks):
        raise ValueError(f"{document.doc_id}: chunk ids must be unique")


def _check_dimension(db: sqlite3.Connection, tenant: str, document: Document) -> None:
    """Refuse vectors of another size than the tenant's: search would fail on them later."""
    if not document.chunks:
        return
    row = db.execute("SELECT length(embedding) FROM chunks WHERE tenant = ? LIMIT 1", (tenant,))
    stored = row.fetchone()
    size = document.chunks[0].embedding.shape[0]
    if stored is not None and stored[0] != 4 * size:
        raise ValueError(
            f"{document.doc_id}: {size}-d embeddings, the tenant's index holds {stored[0] // 4}-d"
        )


def _matrix(document: Document) -> Vector:
    return np.vstack([c.embedding for c in document.chunks]).astype(np.float32, copy=False)


def _delete_chunks(db: sqlite3.Connection, tenant: str, doc_id: str) -> list[int]:
    ids = [
        r[0]
        for r in db.execute(
            "SELECT id FROM chunks WHERE tenant = ? AND doc_id = ?", (tenant, doc_id)
        )
    ]
    if ids:  # a tenant with chunks has its table
        table = fts_table(tenant)
        db.executemany(f"DELETE FROM {table} WHERE rowid = ?", [(i,) for i in ids])
    db.execute("DELETE FROM chunks WHERE tenant = ? AND doc_id = ?", (tenant, doc_id))
    return ids


def _insert_chunks(db: sqlite3.Connection, tenant: str, document: Document) -> list[int]:
    ids = []
    table = fts_table(tenant)
    for chunk in document.chunks:
        blob = np.ascontiguousarray(chunk.embedding, dtype=np.float32).tobytes()
        cursor = db.execute(
            "INSERT INTO chunks (tenant, doc_id, chunk_id, section, embedding)"
            " VALUES (?, ?, ?, ?, ?)",
            (tenant, document.doc_id, chunk.chunk_id, chunk.section, blob),
        )
        chunk_row = cursor.lastrowid
        assert chunk_row is not None  # always set after an INSERT on a rowid table
        db.execute(
            f"INSERT INTO {table} (rowid, title, section, text) VALUES (?, ?, ?, ?)",
            (chunk_row, document.title, chunk.section, chunk.text),
        )
        ids.append(chunk_row)
    return ids


def _migrate_shared_fts(db: sqlite3.Connection) -> None:
    """Move the rows of the one FTS table all tenants shared into per-tenant tables.

    One transaction: a crash leaves the old layout, and the next open migrates again. Two
    processes opening the file at once serialise on the write lock; the second finds nothing
    left to move. Every tenant's generation is bumped: its BM25 scores changed.
    """
    if not _table_exists(db, _LEGACY_FTS):
        return
    with _transaction(db):
        if not _table_exists(db, _LEGACY_FTS):
            return
        tenants = [r[0] for r in db.execute("SELECT DISTINCT tenant FROM chunks")]
        for tenant in tenants:
            table = fts_table(tenant)
            _create_fts(db, table)
            db.execute(
                f"INSERT INTO {table} (rowid, title, section, text)"
                f" SELECT f.rowid, f.title, f.section, f.text FROM {_LEGACY_FTS} AS f"
                " JOIN chunks ON chunks.id = f.rowid WHERE chunks.tenant = ?",
                (tenant,),
            )
        db.execute(f"DROP TABLE {_LEGACY_FTS}")
        db.execute("UPDATE tenants SET generation = generation + 1")


def _generation(db: sqlite3.Connection, tenant: str) -> int:
    row = db.execute("SELECT generation FROM tenants WHERE tenant = ?", (tenant,)).fetchone()
    return 0 if row is None else int(row[0])


def _bump_generation(db: sqlite3.Connection, tenant: str) -> int:
    (generation,) = db.execute(
        "INSERT INTO tenants (tenant, generation) VALUES (?, 1)"
        " ON CONFLICT (tenant) DO UPDATE SET generation = generation + 1 RETURNING generation",
        (tenant,),
    ).fetchone()
    return int(generation)
