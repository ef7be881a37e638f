"""The SQLite file: its schema, the per-tenant FTS5 tables, opening it (WAL, the move from one
shared FTS table, the `source` column added to a file without it), transactions, and the reads
that are one statement each.

Layout: `documents` (one row per document: title, content hash, source), `chunks` (metadata and
the float32 embedding blob; its rowid is the chunk's key everywhere), one FTS5 table per tenant,
`fts_t<hash of the tenant>` (title, section and text; rowid = the chunk's key), created by the
tenant's first write, `tenants` (the generation counter), `changes` (which chunks each
generation touched: see `changes`) and `document_groups` (one row per group of a document's
access list; a document without a list has none).

A file written with one shared `chunks_fts` table is migrated when it is opened: each tenant's
rows move to its own table in one transaction, and every tenant's generation is bumped because
its scores changed. Every process on the file must run this layout: an older one would recreate
the shared table.
"""

from __future__ import annotations

import hashlib
import sqlite3
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Literal

from backends.errors import BackendUnavailable

BACKEND = "embedded"

# BM25 column weights, in the FTS tables' column order.
WEIGHTS = {"title": 2.5, "section": 1.5, "text": 1.0}
# '-' and '_' are part of a token so identifiers (ERR-4471, SKU_123) index and match whole.
_TOKENIZER = "unicode61 remove_diacritics 2 tokenchars '-_'"

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
    source TEXT NOT NULL DEFAULT '',
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
CREATE TABLE IF NOT EXISTS changes (
    tenant TEXT NOT NULL,
    generation INTEGER NOT NULL,
    chunk INTEGER
);
CREATE INDEX IF NOT EXISTS changes_by_generation ON changes (tenant, generation);
CREATE TABLE IF NOT EXISTS document_groups (
    tenant TEXT NOT NULL,
    doc_id TEXT NOT NULL,
    grp TEXT NOT NULL,
    PRIMARY KEY (tenant, doc_id, grp)
);
"""
# The one FTS5 table all tenants shared before per-tenant tables; only migration reads it.
_LEGACY_FTS = "chunks_fts"
# SQLite caps bound parameters per statement (32,766 since 3.32); stay well under.
IDS_PER_STATEMENT = 500


def tenant_key(tenant: str) -> str:
    """An identifier-safe, fixed-length key for the tenant, whatever the tenant id."""
    return "t" + hashlib.sha256(tenant.encode()).hexdigest()[:32]


def fts_table(tenant: str) -> str:
    """The name of the tenant's FTS5 table (safe to splice into SQL: `fts_t` + 32 hex digits)."""
    return f"fts_{tenant_key(tenant)}"


@contextmanager
def translated(operation: str) -> Iterator[None]:
    try:
        yield
    except sqlite3.Error as exc:
        raise BackendUnavailable(BACKEND, f"{operation}: {exc}") from exc


def open_file(path: Path) -> sqlite3.Connection:
    """The file opened for this layout (created and migrated as needed)."""
    db = sqlite3.connect(path, isolation_level=None)
    _enable_wal(db)
    # WAL + NORMAL: a crash may lose the last commits but never corrupts the file.
    db.execute("PRAGMA synchronous=NORMAL")
    db.executescript(_SCHEMA)
    _add_source_column(db)
    _migrate_shared_fts(db)
    return db


def open_reader(path: Path) -> sqlite3.Connection:
    """A connection for the read threads of the file `open_file` opened: any of them may use it,
    one at a time (the read lanes hand it over whole)."""
    return sqlite3.connect(path, isolation_level=None, check_same_thread=False)


def create_fts(db: sqlite3.Connection, table: str) -> None:
    db.execute(
        f"CREATE VIRTUAL TABLE IF NOT EXISTS {table} USING fts5("
        f'{", ".join(WEIGHTS)}, tokenize = "{_TOKENIZER}")'
    )


def table_exists(db: sqlite3.Connection, table: str) -> bool:
    row = db.execute("SELECT 1 FROM sqlite_master WHERE name = ?", (table,)).fetchone()
    return row is not None


@contextmanager
def transaction(db: sqlite3.Connection) -> Iterator[None]:
    if db.in_transaction:
        # Part of a larger write (one document to every index version): a savepoint, which
        # the enclosing transaction commits or rolls back with the rest.
        db.execute("SAVEPOINT part")
        try:
            yield
        except BaseException:
            db.execute("ROLLBACK TO part")
            db.execute("RELEASE part")
            raise
        db.execute("RELEASE part")
        return
    # IMMEDIATE takes the write lock up front, so a concurrent writer process fails here,
    # before any work, instead of at commit.
    db.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")


@contextmanager
def snapshot(db: sqlite3.Connection) -> Iterator[None]:
    """One read transaction: every statement inside sees the same committed state (WAL), so a
    search's arms and the rows it returns agree with each other and with the generation."""
    db.execute("BEGIN")
    try:
        yield
    finally:
        if db.in_transaction:  # an error may have ended it already
            db.execute("COMMIT")


def stored_generation(db: sqlite3.Connection, tenant: str) -> int:
    row = db.execute("SELECT generation FROM tenants WHERE tenant = ?", (tenant,)).fetchone()
    return 0 if row is None else int(row[0])


def content_hash(db: sqlite3.Connection, tenant: str, doc_id: str) -> str | None:
    row = db.execute(
        "SELECT content_hash FROM documents WHERE tenant = ? AND doc_id = ?",
        (tenant, doc_id),
    ).fetchone()
    return None if row is None else str(row[0])


def content_hashes(db: sqlite3.Connection, tenant: str, doc_ids: Sequence[str]) -> dict[str, str]:
    return _by_document(db, tenant, doc_ids, "content_hash")


def sources(db: sqlite3.Connection, tenant: str, doc_ids: Sequence[str]) -> dict[str, str]:
    return _by_document(db, tenant, doc_ids, "source")


def _by_document(
    db: sqlite3.Connection,
    tenant: str,
    doc_ids: Sequence[str],
    column: Literal["content_hash", "source"],
) -> dict[str, str]:
    """`column` of each of `doc_ids` the tenant holds, by doc id."""
    found: dict[str, str] = {}
    for start in range(0, len(doc_ids), IDS_PER_STATEMENT):
        part = list(doc_ids[start : start + IDS_PER_STATEMENT])
        marks = ",".join("?" * len(part))
        rows = db.execute(
            f"SELECT doc_id, {column} FROM documents WHERE tenant = ? AND doc_id IN ({marks})",
            (tenant, *part),
        )
        found.update({str(doc_id): str(value) for doc_id, value in rows})
    return found


def source_documents(db: sqlite3.Connection, tenant: str, source: str) -> list[str]:
    rows = db.execute(
        "SELECT doc_id FROM documents WHERE tenant = ? AND source = ? ORDER BY doc_id",
        (tenant, source),
    )
    return [str(doc_id) for (doc_id,) in rows]


def counts(db: sqlite3.Connection, tenant: str) -> tuple[int, int]:
    """(documents, chunks) of the tenant."""
    (docs,) = db.execute("SELECT count(*) FROM documents WHERE tenant = ?", (tenant,)).fetchone()
    (chunks,) = db.execute("SELECT count(*) FROM chunks WHERE tenant = ?", (tenant,)).fetchone()
    return int(docs), int(chunks)


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


def _add_source_column(db: sqlite3.Connection) -> None:
    """Give a file written before sources were recorded its `source` column: every document
    in it gets "" (no source), so no prune ever deletes it until an ingest records one.
    Two processes opening the file at once serialise on the write lock; the second finds the
    column there."""
    if _has_source(db):
        return
    with transaction(db):
        if not _has_source(db):
            db.execute("ALTER TABLE documents ADD COLUMN source TEXT NOT NULL DEFAULT ''")


def _has_source(db: sqlite3.Connection) -> bool:
    return any(row[1] == "source" for row in db.execute("PRAGMA table_info(documents)"))


def _migrate_shared_fts(db: sqlite3.Connection) -> None:
    """Move the rows of the one FTS table all tenants shared into per-tenant tables.

    One transaction: a crash leaves the old layout, and the next open migrates again. Two
    processes opening the file at once serialise on the write lock; the second finds nothing
    left to move. Every tenant's generation is bumped: its BM25 scores changed.
    """
    if not table_exists(db, _LEGACY_FTS):
        return
    with transaction(db):
        if not table_exists(db, _LEGACY_FTS):
            return
        tenants = [r[0] for r in db.execute("SELECT DISTINCT tenant FROM chunks")]
        for tenant in tenants:
            table = fts_table(tenant)
            create_fts(db, table)
            db.execute(
                f"INSERT INTO {table} (rowid, title, section, text)"
                f" SELECT f.rowid, f.title, f.section, f.text FROM {_LEGACY_FTS} AS f"
                " JOIN chunks ON chunks.id = f.rowid WHERE chunks.tenant = ?",
                (tenant,),
            )
        db.execute(f"DROP TABLE {_LEGACY_FTS}")
        db.execute("UPDATE tenants SET generation = generation + 1")
