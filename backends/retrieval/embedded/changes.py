"""The per-tenant change log: which chunk rows each generation touched, so that a process holding
a tenant's vectors applies another process's write by reading just those rows.

Every write logs, in its own transaction, the row ids it removed and added under the generation it
bumped to (a write touching no row logs one NULL marker, so every generation has rows). A reader
at generation g, finding the tenant at generation c, reads the ids logged for (g, c]: if every one
of those generations is logged, it drops those ids from memory and reads back the ones that
still belong to the tenant; if any is missing (pruned, or bumped by something that logs nothing,
like the migration of the shared FTS table), it reloads the tenant whole. Chunk row ids can be
reused after a delete; dropping every touched id and reading back what exists now is right
whichever order the touches came in.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence

# Generations kept per tenant: a process more than this many writes behind reloads whole.
KEEP_GENERATIONS = 1024


def log_change(db: sqlite3.Connection, tenant: str, generation: int, chunks: Sequence[int]) -> None:
    """Record the rows a write touched; inside the write's transaction."""
    rows: Sequence[int | None] = chunks or [None]
    db.executemany(
        "INSERT INTO changes (tenant, generation, chunk) VALUES (?, ?, ?)",
        [(tenant, generation, chunk) for chunk in rows],
    )
    db.execute(
        "DELETE FROM changes WHERE tenant = ? AND generation <= ?",
        (tenant, generation - KEEP_GENERATIONS),
    )


def touched_since(db: sqlite3.Connection, tenant: str, since: int, current: int) -> set[int] | None:
    """The row ids the generations after `since` up to `current` touched; None when the log does
    not cover every one of them."""
    rows = db.execute(
        "SELECT generation, chunk FROM changes"
        " WHERE tenant = ? AND generation > ? AND generation <= ?",
        (tenant, since, current),
    ).fetchall()
    if len({generation for generation, _ in rows}) != current - since:
        return None
    return {chunk for _, chunk in rows if chunk is not None}
