"""Bulk embedding on every core, below the queries' priority.

The gateway's query path embeds on one thread (`MiniLMEmbedder.embed`, coalesced into batches
by `CoalescingEmbedder`). A bulk ingest (the sample corpus on first run) instead wants every
core: `BulkEmbedder` runs each `embed` call on a thread of a pool with one thread per core, so
`ingest_documents(..., parallel=workers)` keeps every core busy. In the serving process the
pool's threads run at a lower scheduling priority (`nice`, per thread on Linux; +5 gives a
query's thread about three times an ingest thread's share of a core), so a query arriving
during the ingest is not starved by it; a larger increment, on a machine shared with other busy
processes, starves the ingest itself.

A call is run as slices of `slice_texts` texts, sorted by length first so that padding stays
small: a slice is the unit that cannot be interrupted, so stopping the gateway waits for at
most one slice per thread, not for a whole batch.

The runtime's compute must release the GIL for this to scale: onnxruntime does for the whole
forward pass (one intra-op thread per call, the calling thread); the numpy pass only in its
matrix products.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import os
import threading
from collections.abc import Sequence
from functools import partial
from typing import Protocol, runtime_checkable

import numpy as np

from backends.embeddings.base import Embedder, TokenWindow
from backends.retrieval.base import Vector

log = logging.getLogger(__name__)

SERVING_NICE = 5
SLICE_TEXTS = 16


@runtime_checkable
class SyncEmbedder(Protocol):
    """An in-process embedder whose blocking call may run on several threads at once."""

    model_id: str
    dimension: int

    def embed_sync(self, texts: Sequence[str]) -> Vector: ...


def _lower_priority(nice: int) -> None:
    # Not Linux, or not allowed: the thread runs at normal priority.
    with contextlib.suppress(AttributeError, OSError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), nice)


class BulkEmbedder:
    """`Embedder` over `inner.embed_sync` on `workers` low-priority threads. Closing it does not
    close `inner`, which the caller keeps owning."""

    def __init__(
        self,
        inner: SyncEmbedder,
        workers: int | None = None,
        *,
        nice: int = 0,
        slice_texts: int = SLICE_TEXTS,
    ) -> None:
        self.workers = max(1, workers or os.cpu_count() or 1)
        self._inner = inner
        self._slice = slice_texts
        self.model_id = inner.model_id
        self.dimension = inner.dimension
        self.token_window: TokenWindow | None = getattr(inner, "token_window", None)
        self._pool = concurrent.futures.ThreadPoolExecutor(
            self.workers,
            thread_name_prefix="bulk-embed",
            initializer=partial(_lower_priority, nice) if nice else None,
        )

    async def embed(self, texts: Sequence[str]) -> Vector:
        loop = asyncio.get_running_loop()
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        out = np.zeros((len(texts), self.dimension), dtype=np.float32)
        for start in range(0, len(order), self._slice):
            rows = order[start : start + self._slice]
            part = [texts[i] for i in rows]
            out[rows] = await loop.run_in_executor(self._pool, self._inner.embed_sync, part)
        return out

    async def aclose(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def bulk_embedder(
    embedder: Embedder, workers: int | None = None, *, nice: int = 0
) -> tuple[Embedder, int]:
    """(an embedder for bulk work, how many of its calls to keep in flight): every core for an
    in-process model (unwrapping a `CoalescingEmbedder`), else `embedder` itself, one call at a
    time (a remote API's own limits decide its pace). One call more than threads is in
    flight, so the threads keep embedding while the writer writes a finished batch."""
    inner = getattr(embedder, "inner", embedder)
    if isinstance(inner, SyncEmbedder):
        bulk = BulkEmbedder(inner, workers, nice=nice)
        return bulk, bulk.workers + 1
    return embedder, 1
