"""Coalescing concurrent embed calls into one batch.

An encoder is several times cheaper per text in a batch than one text at a time, and under
load the gateway embeds one query per request. This wrapper lets the first caller start at
once; callers that arrive while a batch is running wait for the next batch, which takes all of
them together. No timer, so an idle gateway adds no latency.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from backends.embeddings.base import Embedder
from backends.retrieval.base import Vector


def _future() -> asyncio.Future[Vector]:
    return asyncio.get_running_loop().create_future()


@dataclass
class _Waiting:
    texts: list[str]
    done: asyncio.Future[Vector] = field(default_factory=_future)


class CoalescingEmbedder:
    def __init__(self, inner: Embedder, max_batch: int = 64) -> None:
        self._inner = inner
        self._max_batch = max_batch
        self._queue: list[_Waiting] = []
        self._running = False
        self.model_id = inner.model_id
        self.dimension = inner.dimension

    async def embed(self, texts: Sequence[str]) -> Vector:
        waiting = _Waiting(list(texts))
        self._queue.append(waiting)
        if not self._running:
            self._running = True
            asyncio.get_running_loop().create_task(self._drain())
        return await waiting.done

    async def _drain(self) -> None:
        try:
            while self._queue:
                batch = self._take()
                await self._run(batch)
        finally:
            self._running = False

    def _take(self) -> list[_Waiting]:
        taken: list[_Waiting] = []
        size = 0
        while self._queue and (not taken or size + len(self._queue[0].texts) <= self._max_batch):
            item = self._queue.pop(0)
            taken.append(item)
            size += len(item.texts)
        return taken

    async def _run(self, batch: list[_Waiting]) -> None:
        texts = [t for item in batch for t in item.texts]
        try:
            vectors = await self._inner.embed(texts)
        except Exception as exc:  # every waiter gets the failure, not just the first
            for item in batch:
                if not item.done.done():
                    item.done.set_exception(exc)
            return
        start = 0
        for item in batch:
            end = start + len(item.texts)
            if not item.done.done():
                item.done.set_result(np.ascontiguousarray(vectors[start:end]))
            start = end

    async def aclose(self) -> None:
        await self._inner.aclose()
