"""What one process holds of the file: the connection, the FTS tables known to exist, and each
tenant's vectors in memory. Used only on the index's one thread, whose FIFO order is the only
synchronisation it needs."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence

import numpy as np

from backends.retrieval.base import Document, Vector
from backends.retrieval.embedded.store import fts_table, stored_generation, table_exists
from backends.retrieval.embedded.vectors import TenantVectors, read_vectors


class IndexState:
    """The connection and this process's cached view of the file."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self.db = db
        self._vectors: dict[str, TenantVectors] = {}
        # FTS tables known to exist; tables are never dropped, so a hit never goes stale.
        self._fts_tables: set[str] = set()

    def fts(self, tenant: str) -> str | None:
        """The tenant's FTS table, None before its first write."""
        table = fts_table(tenant)
        if table in self._fts_tables:
            return table
        if not table_exists(self.db, table):
            return None  # not remembered: another process may create it
        self._fts_tables.add(table)
        return table

    def knows_fts(self, table: str) -> bool:
        return table in self._fts_tables

    def created_fts(self, table: str) -> None:
        """Remember a table a committed write created."""
        self._fts_tables.add(table)

    def tenant_vectors(self, tenant: str) -> TenantVectors | None:
        """The tenant's current vectors; None when it has no chunks.

        Read from disk on first use, and again when the stored generation moved past the one
        in memory: another process wrote to the file (`querygate ingest` beside a running
        `querygate serve`). This process's own writes keep them current without a reload.
        """
        current = stored_generation(self.db, tenant)
        vectors = self._vectors.get(tenant)
        if vectors is not None and vectors.generation == current:
            return vectors
        # The generation is read before the rows: a write landing in between makes the rows
        # newer than the recorded generation, so the next search reloads; never the reverse.
        vectors = read_vectors(self.db, tenant, current)
        if vectors is None:
            self._vectors.pop(tenant, None)
            return None
        self._vectors[tenant] = vectors
        return vectors

    def apply(
        self,
        tenant: str,
        generation: int,
        removed: Sequence[int],
        added: Sequence[int],
        document: Document | None,
    ) -> None:
        """Mirror a committed write in the tenant's vectors, if they are loaded: `added` are
        the row ids of `document`'s chunks."""
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


def _matrix(document: Document) -> Vector:
    return np.vstack([c.embedding for c in document.chunks]).astype(np.float32, copy=False)
