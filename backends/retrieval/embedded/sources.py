"""Each document's text, kept beside its chunks in the `sources` table, so that a reindex can
chunk and embed it again (`backends.retrieval.versions`). Written and deleted in the document's
own transaction: a stored source always belongs to the stored version of its document."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence

from backends.retrieval.base import Document
from backends.retrieval.versions import StoredSource

SCHEMA = """
CREATE TABLE IF NOT EXISTS sources (
    tenant TEXT NOT NULL,
    doc_id TEXT NOT NULL,
    text TEXT NOT NULL,
    PRIMARY KEY (tenant, doc_id)
);
"""


def put(db: sqlite3.Connection, tenant: str, document: Document) -> None:
    """Keep the document's text; a document written without one has none kept (`unsourced`)."""
    if not document.text:
        remove(db, tenant, document.doc_id)
        return
    db.execute(
        "INSERT OR REPLACE INTO sources (tenant, doc_id, text) VALUES (?, ?, ?)",
        (tenant, document.doc_id, document.text),
    )


def remove(db: sqlite3.Connection, tenant: str, doc_id: str) -> None:
    db.execute("DELETE FROM sources WHERE tenant = ? AND doc_id = ?", (tenant, doc_id))


_SELECT = (
    "SELECT documents.doc_id, documents.title, sources.text, documents.content_hash,"
    " documents.source"
    " FROM documents JOIN sources USING (tenant, doc_id) WHERE documents.tenant = ?"
)
# SQLite caps bound parameters per statement (32,766 since 3.32); stay well under.
_IDS_PER_STATEMENT = 500


def page(db: sqlite3.Connection, tenant: str, after: str, limit: int) -> list[StoredSource]:
    """The tenant's documents after `after` in doc id order, with their text."""
    rows = db.execute(
        f"{_SELECT} AND documents.doc_id > ? ORDER BY documents.doc_id LIMIT ?",
        (tenant, after, limit),
    ).fetchall()
    return _with_groups(db, tenant, rows)


def of(db: sqlite3.Connection, tenant: str, doc_ids: Sequence[str]) -> list[StoredSource]:
    found: list[StoredSource] = []
    for start in range(0, len(doc_ids), _IDS_PER_STATEMENT):
        part = list(doc_ids[start : start + _IDS_PER_STATEMENT])
        marks = ",".join("?" * len(part))
        rows = db.execute(f"{_SELECT} AND documents.doc_id IN ({marks})", (tenant, *part))
        found += _with_groups(db, tenant, rows.fetchall())
    return found


def _with_groups(
    db: sqlite3.Connection, tenant: str, rows: list[tuple[str, str, str, str, str]]
) -> list[StoredSource]:
    """The sources of `rows` with each document's access list (a rebuild keeps it)."""
    groups: dict[str, list[str]] = {}
    for start in range(0, len(rows), _IDS_PER_STATEMENT):
        part = [row[0] for row in rows[start : start + _IDS_PER_STATEMENT]]
        marks = ",".join("?" * len(part))
        for doc_id, group in db.execute(
            "SELECT doc_id, grp FROM document_groups"
            f" WHERE tenant = ? AND doc_id IN ({marks}) ORDER BY grp",
            (tenant, *part),
        ):
            groups.setdefault(doc_id, []).append(group)
    return [
        StoredSource(*row[:4], tuple(groups[row[0]]) if row[0] in groups else None, row[4])
        for row in rows
    ]


def unsourced(db: sqlite3.Connection, tenant: str) -> int:
    (count,) = db.execute(
        "SELECT count(*) FROM documents LEFT JOIN sources USING (tenant, doc_id)"
        " WHERE documents.tenant = ? AND sources.text IS NULL",
        (tenant,),
    ).fetchone()
    return int(count)
