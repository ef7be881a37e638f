"""What one process holds of the file: the FTS tables its writer created and each tenant's vectors
in memory (`Shared`, one per process), seen through one connection at a time (`IndexState`).

The writer thread and every read thread have a connection of their own and share one `Shared`.
A tenant's vectors are only touched by that tenant's reads, which its read lane runs one at a
time, in order (see `lanes`), each in a snapshot no older than the last: nothing else needs a
lock. Writes never touch them: a read catches up with the change log (`changes`).
"""

from __future__ import annotations

import sqlite3

from backends.retrieval.embedded.changes import touched_since
from backends.retrieval.embedded.store import fts_table, stored_generation, table_exists
from backends.retrieval.embedded.vectors import TenantVectors, read_rows, read_vectors


class Shared:
    """This process's cached view of the file, shared by its connections."""

    def __init__(self) -> None:
        self.vectors: dict[str, TenantVectors] = {}
        # FTS tables the writer knows it created (it creates the others). Not proof for a
        # reader: its snapshot may predate the commit that created one.
        self.fts_tables: set[str] = set()


class IndexState:
    """One connection and the process's shared view of the file."""

    def __init__(self, db: sqlite3.Connection, shared: Shared) -> None:
        self.db = db
        self._shared = shared
        # This connection's fts5vocab tables (TEMP: per connection, no write to the file).
        self.vocab_tables: set[str] = set()
        # FTS tables this connection has seen: once in a snapshot, in every later one (only a
        # dropped index version's table goes, and no search reads that version again).
        self._fts_seen: set[str] = set()

    def fts(self, tenant: str) -> str | None:
        """The tenant's FTS table as this connection's snapshot has it, None before the first
        write it sees (not remembered: another connection or process may create it)."""
        table = fts_table(tenant)
        if table in self._fts_seen:
            return table
        if not table_exists(self.db, table):
            return None
        self._fts_seen.add(table)
        return table

    def knows_fts(self, table: str) -> bool:
        return table in self._shared.fts_tables

    def created_fts(self, table: str) -> None:
        """Remember a table a committed write created."""
        self._shared.fts_tables.add(table)

    def forget_tables(self) -> None:
        """Forget which FTS tables exist: a transaction that rolled back after a part of it
        had recorded a table it created (a savepoint of a larger write) left that unsure."""
        self._shared.fts_tables.clear()

    def tenant_vectors(self, tenant: str) -> TenantVectors | None:
        """The tenant's vectors as of this connection's snapshot; None when it has no chunks.

        Read whole on first use; after that, when the stored generation moved (a write by this
        process or another: `querygate ingest` beside `serve`, or another worker), only the
        rows the change log names are read. Called inside `store.snapshot`, so the generation
        and the rows are of one committed state.
        """
        current = stored_generation(self.db, tenant)
        vectors = self._shared.vectors.get(tenant)
        if vectors is not None and vectors.generation == current:
            return vectors
        if vectors is not None and self._caught_up(tenant, vectors, current):
            if not len(vectors):  # emptied: its next rows may be of another dimension
                del self._shared.vectors[tenant]
                return None
            return vectors
        vectors = read_vectors(self.db, tenant, current)
        if vectors is None:
            self._shared.vectors.pop(tenant, None)
            return None
        self._shared.vectors[tenant] = vectors
        return vectors

    def _caught_up(self, tenant: str, vectors: TenantVectors, current: int) -> bool:
        """Apply the logged changes up to `current`; False when they cannot be (not all
        logged, or rows of another dimension after the tenant was emptied)."""
        if vectors.generation > current:
            return False
        touched = touched_since(self.db, tenant, vectors.generation, current)
        if touched is None:
            return False
        ids, matrix = read_rows(self.db, tenant, sorted(touched))
        if ids and matrix.shape[1] != vectors.dimension:
            return False
        vectors.replace(touched, ids, matrix)
        vectors.generation = current
        return True
