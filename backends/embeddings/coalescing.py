"""Coalescing concurrent embed calls into batches, with queries ahead of bulk work.

An encoder is several times cheaper per text in a batch than one text at a time, and under
load the gateway embeds one query per request. This wrapper lets the first caller start at
once; callers that arrive while a batch is running wait for the next batch, which takes all of
them together. No timer, so an idle gateway adds no latency.

Two classes of work share the one encoder:

- query-sized calls (at most `bulk_threshold` texts) coalesce into batches and always go first;
- bulk calls (a document write's chunks) are cut into slices of `bulk_slice` texts and run one
  slice at a time, only when no query is waiting, round robin across bulk callers. A query
  therefore waits for at most one slice, never for a whole document (a large PUT's chunks hold
  the encoder for tens of seconds, and other tenants' queries would get 503s). Slices are small
  (4) because a query under a write flood waits for one: tests/e2e/test_admission_load.py
  bounds the p99 of such a query.

Isolation: texts are sanitised before batching (a lone UTF-16 surrogate, which the tokenizer
refuses, becomes U+FFFD), and when a coalesced batch fails anyway each caller is retried alone,
so one bad input fails only its own caller. A dependency that is down (`BackendUnavailable`)
fails the batch at once: retrying each caller against it would only multiply the load.
A caller that has gone (its deadline passed, its client left) is dropped before its texts
are embedded.
"""

from __future__ import annotations

import asyncio
import re
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from backends.embeddings.base import Embedder, TokenWindow, token_window
from backends.errors import BackendUnavailable
from backends.retrieval.base import Vector

_SURROGATE = re.compile(r"[\ud800-\udfff]")


def sanitise(text: str) -> str:
    """`text` as the encoder can take it: lone surrogates replaced by U+FFFD."""
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return _SURROGATE.sub("\ufffd", text)
    return text


def _future() -> asyncio.Future[Vector]:
    return asyncio.get_running_loop().create_future()


@dataclass
class _Waiting:
    texts: list[str]
    done: asyncio.Future[Vector] = field(default_factory=_future)


@dataclass
class _Bulk:
    """One bulk call: its slices run one at a time; `parts` collects their vectors in order."""

    slices: deque[list[str]]
    done: asyncio.Future[Vector] = field(default_factory=_future)
    parts: list[Vector] = field(default_factory=list)


class CoalescingEmbedder:
    def __init__(
        self,
        inner: Embedder,
        max_batch: int = 64,
        *,
        bulk_threshold: int = 8,
        bulk_slice: int = 4,
        bulk_every: int = 4,
    ) -> None:
        self._inner = inner
        self._max_batch = max_batch
        self._bulk_threshold = bulk_threshold
        self._bulk_slice = bulk_slice
        # Under a steady query load a bulk slice still runs after this many query batches,
        # so document writes slow down rather than starve.
        self._bulk_every = bulk_every
        self._batches_since_slice = 0
        self._task: asyncio.Task[None] | None = None
        self._queue: list[_Waiting] = []
        self._bulk: deque[_Bulk] = deque()
        self._running = False
        self.model_id = inner.model_id
        self.dimension = inner.dimension
        self.token_window: TokenWindow | None = token_window(inner)

    @property
    def inner(self) -> Embedder:
        """The wrapped embedder (bulk ingest runs it on its own threads)."""
        return self._inner

    async def embed(self, texts: Sequence[str]) -> Vector:
        clean = [sanitise(t) for t in texts]  # a non-str fails here, in its own caller
        if len(clean) > self._bulk_threshold:
            return await self._embed_bulk(clean)
        waiting = _Waiting(clean)
        self._queue.append(waiting)
        self._start()
        return await waiting.done

    async def _embed_bulk(self, texts: list[str]) -> Vector:
        step = self._bulk_slice
        job = _Bulk(deque(texts[i : i + step] for i in range(0, len(texts), step)))
        self._bulk.append(job)
        self._start()
        return await job.done

    def _start(self) -> None:
        if not self._running:
            self._running = True
            self._task = asyncio.get_running_loop().create_task(self._drain())

    async def _drain(self) -> None:
        try:
            while True:
                owed = self._bulk and self._batches_since_slice >= self._bulk_every
                batch = [] if owed else self._take()
                if batch:
                    self._batches_since_slice += 1
                    await self._run(batch)
                elif (job := self._next_bulk()) is not None:
                    self._batches_since_slice = 0
                    await self._run_slice(job)
                else:
                    return
        finally:
            self._running = False

    def _take(self) -> list[_Waiting]:
        taken: list[_Waiting] = []
        size = 0
        while self._queue and (not taken or size + len(self._queue[0].texts) <= self._max_batch):
            item = self._queue.pop(0)
            if item.done.done():  # its caller is gone (cancelled): embed nothing for it
                continue
            taken.append(item)
            size += len(item.texts)
        return taken

    def _next_bulk(self) -> _Bulk | None:
        while self._bulk:
            job = self._bulk.popleft()
            if not job.done.done():
                return job
        return None

    async def _run_slice(self, job: _Bulk) -> None:
        texts = job.slices.popleft()
        try:
            job.parts.append(await self._inner.embed(texts))
        except Exception as exc:
            if not job.done.done():
                job.done.set_exception(exc)
            return
        if job.done.done():
            return
        if job.slices:
            self._bulk.append(job)  # round robin: the next bulk caller's slice goes first
        else:
            job.done.set_result(np.ascontiguousarray(np.concatenate(job.parts)))

    async def _run(self, batch: list[_Waiting]) -> None:
        texts = [t for item in batch for t in item.texts]
        try:
            vectors = await self._inner.embed(texts)
        except BackendUnavailable as exc:
            _fail(batch, exc)  # the dependency is down: every caller hears it now
            return
        except Exception as exc:
            if len(batch) == 1:
                _fail(batch, exc)
                return
            # One input may have broken the batch: each caller alone, so only it fails.
            for item in batch:
                if not item.done.done():
                    await self._run([item])
            return
        start = 0
        for item in batch:
            end = start + len(item.texts)
            if not item.done.done():
                item.done.set_result(np.ascontiguousarray(vectors[start:end]))
            start = end

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
        await self._inner.aclose()


def _fail(batch: list[_Waiting], exc: BaseException) -> None:
    for item in batch:
        if not item.done.done():
            item.done.set_exception(exc)
