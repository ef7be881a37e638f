"""Writing and deleting documents: one transaction each, logging the rows it touched.

A reader sees a document whole, old or new, and a write that fails leaves the file as it was (a
rolled-back document keeps its old hash, so a retry writes it). Vectors in memory are not
touched here: each process's next read of the tenant applies the logged rows (`changes`).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence

import numpy as np

from backends.retrieval.base import Document
from backends.retrieval.embedded import sources
from backends.retrieval.embedded.changes import log_change
from backends.retrieval.embedded.state import IndexState
from backends.retrieval.embedded.store import create_fts, fts_table, transaction


def check_chunks(document: Document) -> None:
    """Refuse a document whose chunks no write could store whole."""
    dimensions = {chunk.embedding.shape for chunk in document.chunks}
    if len(dimensions) > 1 or any(len(d) != 1 for d in dimensions):
        raise ValueError(f"{document.doc_id}: chunk embeddings must be 1-d and of one size")
    if len({chunk.chunk_id for chunk in document.chunks}) != len(document.chunks):
        raise ValueError(f"{document.doc_id}: chunk ids must be unique")


def upsert(state: IndexState, tenant: str, document: Document) -> bool:
    """Replace the document unless stored with its content hash; whether it was written."""
    db = state.db
    with transaction(db):
        row = db.execute(
            "SELECT content_hash FROM documents WHERE tenant = ? AND doc_id = ?",
            (tenant, document.doc_id),
        ).fetchone()
        if row is not None and row[0] == document.content_hash:
            return False
        _check_dimension(db, tenant, document)
        table = fts_table(tenant)
        if not state.knows_fts(table):
            create_fts(db, table)
        removed = _delete_chunks(db, tenant, document.doc_id)
        db.execute(
            "INSERT OR REPLACE INTO documents (tenant, doc_id, title, content_hash, source)"
            " VALUES (?, ?, ?, ?, ?)",
            (tenant, document.doc_id, document.title, document.content_hash, document.source),
        )
        added = _insert_chunks(db, tenant, document)
        _write_groups(db, tenant, document)
        sources.put(db, tenant, document)
        log_change(db, tenant, _bump_generation(db, tenant), removed + added)
    # Only after the commit: a failed transaction created no table.
    state.created_fts(table)
    return True


def delete(state: IndexState, tenant: str, doc_id: str) -> bool:
    """Delete the document; False when it was not stored."""
    db = state.db
    with transaction(db):
        gone = db.execute(
            "DELETE FROM documents WHERE tenant = ? AND doc_id = ?", (tenant, doc_id)
        ).rowcount
        if not gone:
            return False
        removed = _delete_chunks(db, tenant, doc_id)
        db.execute("DELETE FROM document_groups WHERE tenant = ? AND doc_id = ?", (tenant, doc_id))
        sources.remove(db, tenant, doc_id)
        log_change(db, tenant, _bump_generation(db, tenant), removed)
    return True


def set_source(db: sqlite3.Connection, tenant: str, doc_ids: Sequence[str], source: str) -> None:
    """Record `source` for those documents; their chunks and the generation stay as they are."""
    with transaction(db):
        db.executemany(
            "UPDATE documents SET source = ? WHERE tenant = ? AND doc_id = ?",
            [(source, tenant, doc_id) for doc_id in doc_ids],
        )


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


def _write_groups(db: sqlite3.Connection, tenant: str, document: Document) -> None:
    """The document's access list, replacing the stored one (none: readable by every user)."""
    db.execute(
        "DELETE FROM document_groups WHERE tenant = ? AND doc_id = ?", (tenant, document.doc_id)
    )
    db.executemany(
        "INSERT INTO document_groups (tenant, doc_id, grp) VALUES (?, ?, ?)",
        [(tenant, document.doc_id, group) for group in document.groups or ()],
    )


def _bump_generation(db: sqlite3.Connection, tenant: str) -> int:
    (generation,) = db.execute(
        "INSERT INTO tenants (tenant, generation) VALUES (?, 1)"
        " ON CONFLICT (tenant) DO UPDATE SET generation = generation + 1 RETURNING generation",
        (tenant,),
    ).fetchone()
    return int(generation)
