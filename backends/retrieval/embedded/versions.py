"""Index versions in the embedded file (`backends.retrieval.versions`), and writes that reach
every kept version.

The serving version of tenant T is always the rows stored under T (documents, chunks, sources,
FTS table `fts_<key of T>`), so reads need nothing of this module. Every other version n is
stored under the internal name `T\\x1fv<n>` (a configured tenant id cannot hold \\x1f), written
by the same code as T. A switch renames, in one transaction: T's rows and FTS table to
`T\\x1fv<serving>`, the building version's to T; and bumps T's generation. Every process on the
file sees it at its next statement: the FTS table it knows as T's is the new one, and its
vectors of T reload because the generation moved. Version numbers only grow (`last_version`),
so a name once dropped is never reused by a process that remembers it.

The `index_versions` row of a tenant also holds when it last changed (a write, a switch or a
rollback: whatever bumps its generation), for `Freshness`.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, replace

from backends.retrieval.base import Document
from backends.retrieval.embedded import sources, writes
from backends.retrieval.embedded.state import IndexState
from backends.retrieval.embedded.store import (
    counts,
    create_fts,
    fts_table,
    table_exists,
    transaction,
)
from backends.retrieval.versions import (
    Freshness,
    IndexVersions,
    VersionDiff,
    VersionError,
    VersionInfo,
    VersionsDiffer,
    diff_hashes,
)

SCHEMA = """
CREATE TABLE IF NOT EXISTS index_versions (
    tenant TEXT PRIMARY KEY,
    serving TEXT NOT NULL,
    building TEXT,
    previous TEXT,
    last_version INTEGER NOT NULL,
    changed_at REAL
);
"""
_FIRST = VersionInfo(1)


def create_tables(db: sqlite3.Connection) -> None:
    """The tables of this module and `sources`, where the file does not have them yet."""
    db.executescript(sources.SCHEMA + SCHEMA)


def version_key(tenant: str, version: int) -> str:
    """Where a version that is not serving is stored: an internal tenant name."""
    return f"{tenant}\x1fv{version}"


def read(db: sqlite3.Connection, tenant: str) -> tuple[IndexVersions, int]:
    """The tenant's versions and the highest version number it ever had."""
    row = db.execute(
        "SELECT serving, building, previous, last_version FROM index_versions WHERE tenant = ?",
        (tenant,),
    ).fetchone()
    if row is None:
        return IndexVersions(_FIRST), 1
    serving, building, previous, last = row
    return IndexVersions(_info(serving) or _FIRST, _info(building), _info(previous)), int(last)


def kept_keys(db: sqlite3.Connection, tenant: str) -> list[str]:
    """Where the tenant's building and previous versions are stored."""
    versions, _ = read(db, tenant)
    kept = (versions.building, versions.previous)
    return [version_key(tenant, v.version) for v in kept if v is not None]


def upsert_everywhere(state: IndexState, tenant: str, document: Document) -> bool:
    """Write the document to the serving version and every kept version, in one transaction
    (so no switch lands in between); whether the serving version changed."""
    with _everywhere(state):
        changed = writes.upsert(state, tenant, document)
        for key in kept_keys(state.db, tenant):
            writes.upsert(state, key, document)
        if changed:
            touch(state.db, tenant)
    return changed


def delete_everywhere(state: IndexState, tenant: str, doc_id: str) -> bool:
    with _everywhere(state):
        deleted = writes.delete(state, tenant, doc_id)
        for key in kept_keys(state.db, tenant):
            writes.delete(state, key, doc_id)
        if deleted:
            touch(state.db, tenant)
    return deleted


@contextmanager
def _everywhere(state: IndexState) -> Iterator[None]:
    """One transaction around the writes of one document to each version. Each write records
    the FTS table it created as its savepoint is released: a rollback of the whole takes the
    table back, so what is known of the tables is forgotten (looked up again on next use)."""
    try:
        with transaction(state.db):
            yield
    except BaseException:
        state.forget_tables()
        raise


def touch(db: sqlite3.Connection, tenant: str) -> None:
    """Record that the tenant's serving version changed now."""
    db.execute(
        "INSERT INTO index_versions (tenant, serving, last_version, changed_at)"
        " VALUES (?, ?, 1, ?) ON CONFLICT (tenant) DO UPDATE SET changed_at = excluded.changed_at",
        (tenant, _json(_FIRST), time.time()),
    )


def begin(db: sqlite3.Connection, tenant: str, model: str, chunking: str) -> IndexVersions:
    with transaction(db):
        versions, last = read(db, tenant)
        if versions.building is not None:
            raise VersionError(
                f"tenant {tenant!r}: version {versions.building.version} is being built (or a "
                "build was stopped): finish it, or abort it with --abort"
            )
        if versions.previous is not None:
            raise VersionError(
                f"tenant {tenant!r} keeps version {versions.previous.version} for a rollback: "
                "drop it with --drop-old (or roll back) before building another"
            )
        building = VersionInfo(last + 1, model, chunking, time.time())
        versions = replace(versions, building=building)
        _store(db, tenant, versions, building.version)
    return versions


def diff(db: sqlite3.Connection, tenant: str) -> VersionDiff:
    building = required(db, tenant, "building")
    return diff_hashes(_hashes(db, tenant), _hashes(db, version_key(tenant, building.version)))


def switch(state: IndexState, tenant: str) -> IndexVersions:
    db = state.db
    with transaction(db):
        versions, last = read(db, tenant)
        building = required(db, tenant, "building")
        key = version_key(tenant, building.version)
        # Under the write lock: no write can land between this comparison and the renames.
        if found := diff_hashes(_hashes(db, tenant), _hashes(db, key)):
            raise VersionsDiffer(found.stale + found.extra)
        _rename(db, tenant, version_key(tenant, versions.serving.version))
        _rename(db, key, tenant)
        # Every process that knows T's FTS table keeps writing to it: it must exist.
        create_fts(db, fts_table(tenant))
        versions = IndexVersions(building, None, versions.serving)
        _store(db, tenant, versions, last)
        _bump(db, tenant)
        touch(db, tenant)
    return versions


def rollback(state: IndexState, tenant: str) -> IndexVersions:
    db = state.db
    with transaction(db):
        versions, last = read(db, tenant)
        previous = required(db, tenant, "previous")
        _rename(db, tenant, version_key(tenant, versions.serving.version))
        _rename(db, version_key(tenant, previous.version), tenant)
        create_fts(db, fts_table(tenant))
        versions = IndexVersions(previous, versions.building, versions.serving)
        _store(db, tenant, versions, last)
        _bump(db, tenant)
        touch(db, tenant)
    return versions


def drop(state: IndexState, tenant: str, which: str) -> IndexVersions:
    """Delete the `which` ("previous" or "building") version's rows and FTS table."""
    db = state.db
    with transaction(db):
        versions, last = read(db, tenant)
        info = required(db, tenant, which)
        key = version_key(tenant, info.version)
        for table in ("documents", "chunks", "sources", "document_groups", "tenants", "changes"):
            db.execute(f"DELETE FROM {table} WHERE tenant = ?", (key,))
        if table_exists(db, fts_table(key)):
            db.execute(f"DROP TABLE {fts_table(key)}")
        if which == "previous":
            versions = replace(versions, previous=None)
        else:
            versions = replace(versions, building=None)
        _store(db, tenant, versions, last)
    return versions


def freshness(db: sqlite3.Connection, tenant: str) -> Freshness:
    versions, _ = read(db, tenant)
    row = db.execute("SELECT changed_at FROM index_versions WHERE tenant = ?", (tenant,)).fetchone()
    documents, chunks = counts(db, tenant)
    last_write = None if row is None or row[0] is None else float(row[0])
    return Freshness(
        documents, chunks, last_write, versions.serving.version, versions.serving.model
    )


def required(db: sqlite3.Connection, tenant: str, which: str) -> VersionInfo:
    versions, _ = read(db, tenant)
    info: VersionInfo | None = getattr(versions, which)
    if info is None:
        raise VersionError(f"tenant {tenant!r} has no {which} version")
    return info


def _hashes(db: sqlite3.Connection, key: str) -> dict[str, str]:
    rows = db.execute("SELECT doc_id, content_hash FROM documents WHERE tenant = ?", (key,))
    return {str(doc_id): str(digest) for doc_id, digest in rows}


def _rename(db: sqlite3.Connection, old: str, new: str) -> None:
    """Move every row stored under `old` to `new` (which has none), FTS table included."""
    for table in ("documents", "chunks", "sources", "document_groups"):
        db.execute(f"UPDATE {table} SET tenant = ? WHERE tenant = ?", (new, old))
    if table_exists(db, fts_table(old)):
        db.execute(f"ALTER TABLE {fts_table(old)} RENAME TO {fts_table(new)}")


def _bump(db: sqlite3.Connection, tenant: str) -> None:
    db.execute(
        "INSERT INTO tenants (tenant, generation) VALUES (?, 1)"
        " ON CONFLICT (tenant) DO UPDATE SET generation = generation + 1",
        (tenant,),
    )


def _store(db: sqlite3.Connection, tenant: str, versions: IndexVersions, last: int) -> None:
    db.execute(
        "INSERT INTO index_versions (tenant, serving, building, previous, last_version)"
        " VALUES (?, ?, ?, ?, ?) ON CONFLICT (tenant) DO UPDATE SET serving = excluded.serving,"
        " building = excluded.building, previous = excluded.previous,"
        " last_version = excluded.last_version",
        (
            tenant,
            _json(versions.serving),
            None if versions.building is None else _json(versions.building),
            None if versions.previous is None else _json(versions.previous),
            last,
        ),
    )


def _json(info: VersionInfo) -> str:
    return json.dumps(asdict(info))


def _info(text: str | None) -> VersionInfo | None:
    return None if text is None else VersionInfo(**json.loads(text))
