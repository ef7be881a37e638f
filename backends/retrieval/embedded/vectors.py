"""One tenant's embeddings in memory, for exact cosine search by one matrix-vector product."""

from __future__ import annotations

import sqlite3
from collections.abc import Collection, Iterable, Sequence

import numpy as np

from backends.retrieval.base import Vector
from backends.retrieval.embedded.store import IDS_PER_STATEMENT


class TenantVectors:
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
        if not ids:
            return
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

    def __len__(self) -> int:
        """Live rows."""
        return len(self._where)

    def replace(self, touched: Iterable[int], ids: Sequence[int], vectors: Vector) -> None:
        """Drop every touched row, then add `ids` (those of them that exist now)."""
        self.remove(list(touched))
        self.add(ids, vectors)

    def top(self, query: Vector, n: int, hidden: Collection[int] = ()) -> list[tuple[int, float]]:
        """(chunk row id, cosine) of the n nearest live rows, best first, never one of the
        `hidden` chunk row ids (the reader may not see them): they are out before the top n."""
        masked = [row for chunk in hidden if (row := self._where.get(chunk)) is not None]
        n = min(n, len(self) - len(masked))
        if n <= 0:
            return []
        # einsum's own loop, not BLAS: a matrix-vector product is memory-bound, and OpenBLAS's
        # threads only contend for the cores the event loop needs.
        scores = np.einsum("ij,j->i", self._matrix[: self._size], query)
        scores[self._ids[: self._size] < 0] = -np.inf
        scores[masked] = -np.inf
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


def read_vectors(db: sqlite3.Connection, tenant: str, generation: int) -> TenantVectors | None:
    """The tenant's vectors as stored, recorded as of `generation`; None when it has no chunks."""
    ids, matrix = _rows(db.execute("SELECT id, embedding FROM chunks WHERE tenant = ?", (tenant,)))
    if not ids:
        return None
    vectors = TenantVectors(matrix.shape[1], generation)
    vectors.add(ids, matrix)
    return vectors


def read_rows(db: sqlite3.Connection, tenant: str, ids: Sequence[int]) -> tuple[list[int], Vector]:
    """Those of `ids` that are the tenant's chunks now, with their vectors."""
    rows: list[tuple[int, bytes]] = []
    for start in range(0, len(ids), IDS_PER_STATEMENT):
        part = list(ids[start : start + IDS_PER_STATEMENT])
        marks = ",".join("?" * len(part))
        rows += db.execute(
            f"SELECT id, embedding FROM chunks WHERE tenant = ? AND id IN ({marks})",
            (tenant, *part),
        )
    return _rows(rows)


def _rows(rows: Iterable[tuple[int, bytes]]) -> tuple[list[int], Vector]:
    """Row ids and their vectors as one matrix (0 x 0 when there are none)."""
    ids: list[int] = []
    blobs: list[bytes] = []
    for chunk, blob in rows:
        ids.append(chunk)
        blobs.append(blob)
    if not ids:
        return ids, np.zeros((0, 0), dtype=np.float32)
    return ids, np.frombuffer(b"".join(blobs), dtype=np.float32).reshape(len(ids), -1)
