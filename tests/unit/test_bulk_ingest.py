"""Bulk ingest: batches embedded in parallel on low-priority threads, one writer, in order;
progress with rate and ETA for /readyz and stderr."""

from __future__ import annotations

import asyncio
import io
import logging
import os
import threading
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import numpy as np
import pytest

from backends.embeddings.bulk import SERVING_NICE, BulkEmbedder, bulk_embedder
from backends.embeddings.coalescing import CoalescingEmbedder
from backends.retrieval.base import Vector
from backends.retrieval.embedded import EmbeddedRetriever
from gateway.ingest.background import BackgroundIngest
from gateway.ingest.pipeline import content_hash, ingest_documents
from gateway.ingest.progress import IngestProgress, ProgressDisplay, bar
from gateway.ingest.readers import RawDocument
from tests.unit.test_ingest import FakeEmbedder, docs


class SlowFirstEmbedder(FakeEmbedder):
    """Finishes its calls out of order: each earlier call sleeps longer than the next."""

    def __init__(self) -> None:
        super().__init__()
        self.running = 0
        self.most_at_once = 0

    async def embed(self, texts: Sequence[str]) -> Vector:
        self.running += 1
        self.most_at_once = max(self.most_at_once, self.running)
        await asyncio.sleep(0.05 / (len(self.calls) + 1))
        self.running -= 1
        return await super().embed(texts)


class SyncFake:
    """An in-process embedder: blocking `embed_sync`, recording each call's thread priority."""

    model_id = "sync-fake"
    dimension = 16

    def __init__(self, barrier: threading.Barrier | None = None) -> None:
        self.barrier = barrier
        self.priorities: list[int] = []

    def embed_sync(self, texts: Sequence[str]) -> Vector:
        self.priorities.append(os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))
        if self.barrier is not None:
            self.barrier.wait()  # both calls must be inside at once, or this times out
        return np.ones((len(texts), self.dimension), dtype=np.float32) / 4

    async def embed(self, texts: Sequence[str]) -> Vector:
        return self.embed_sync(texts)

    async def aclose(self) -> None:
        return None


@pytest.fixture
async def index(tmp_path: Path) -> AsyncIterator[EmbeddedRetriever]:
    async with EmbeddedRetriever(tmp_path / "index.sqlite3") as retriever:
        yield retriever


async def test_parallel_batches_are_written_whole_and_in_order(index: EmbeddedRetriever) -> None:
    embedder = SlowFirstEmbedder()
    seen: list[tuple[int, int]] = []
    report = await ingest_documents(
        "t", docs(20), embedder, index, lambda *p: seen.append(p), embed_batch=3, parallel=4
    )
    assert embedder.most_at_once == 4
    assert (report.added, report.chunks) == (20, 20)
    assert await index.stats("t") == (20, 20)
    for d in docs(20):
        assert await index.content_hash("t", d.doc_id) == content_hash(d.title, d.text)
    assert seen[-1] == (20, 20)
    assert [done for done, _ in seen] == sorted(done for done, _ in seen)


async def test_parallel_ingest_stores_what_a_sequential_one_does(tmp_path: Path) -> None:
    stored = []
    for parallel in (1, 3):
        async with EmbeddedRetriever(tmp_path / f"p{parallel}.sqlite3") as index:
            report = await ingest_documents(
                "t", docs(9), SlowFirstEmbedder(), index, embed_batch=2, parallel=parallel
            )
            stored.append((report.as_dict(), await index.stats("t")))
    assert stored[0] == stored[1]


async def test_a_failed_batch_fails_the_ingest_and_stops_the_others(
    index: EmbeddedRetriever,
) -> None:
    class Failing(FakeEmbedder):
        async def embed(self, texts: Sequence[str]) -> Vector:
            if any("document 4" in t for t in texts):
                raise RuntimeError("bad batch")
            return await super().embed(texts)

    with pytest.raises(RuntimeError, match="bad batch"):
        await ingest_documents("t", docs(12), Failing(), index, embed_batch=2, parallel=2)
    documents, _ = await index.stats("t")
    assert documents <= 4  # the batches before the bad one at most, each whole


async def test_bulk_embedder_runs_calls_at_once_on_lowered_priority_threads() -> None:
    inner = SyncFake(threading.Barrier(2, timeout=10))
    bulk = BulkEmbedder(inner, workers=2, nice=SERVING_NICE)
    try:
        a, b = await asyncio.gather(bulk.embed(["x"]), bulk.embed(["y", "z"]))
    finally:
        await bulk.aclose()
    assert (a.shape, b.shape) == ((1, 16), (2, 16))
    assert (
        inner.priorities == [SERVING_NICE, SERVING_NICE]
        or os.getpriority(os.PRIO_PROCESS, 0) >= SERVING_NICE
    )  # already niced past it (the limit is the process's own)


async def test_bulk_embedder_unwraps_the_query_coalescer() -> None:
    inner = SyncFake()
    coalescing = CoalescingEmbedder(inner)
    bulk, parallel = bulk_embedder(coalescing, workers=3)
    try:
        assert isinstance(bulk, BulkEmbedder)
        assert (bulk.workers, parallel) == (3, 4)
    finally:
        await bulk.aclose()


def test_an_embedder_without_a_blocking_call_is_used_as_it_is() -> None:
    remote = FakeEmbedder()  # async only, like a remote API
    assert bulk_embedder(remote) == (remote, 1)


async def test_background_ingest_reports_progress_to_the_end(index: EmbeddedRetriever) -> None:
    stream = io.StringIO()
    job = BackgroundIngest("t", lambda: docs(7), source="test", workers=2, stream=stream)
    await job.run(SyncFake(), index)
    snap = job.progress.snapshot()
    assert snap["state"] == "done"
    assert (snap["documents_done"], snap["documents_total"], snap["chunks_written"]) == (7, 7, 7)
    assert snap["embedding_workers"] == 2
    assert snap["partial_index"] is False
    assert snap["eta_s"] is None


async def test_a_failing_background_ingest_says_so(
    index: EmbeddedRetriever, caplog: pytest.LogCaptureFixture
) -> None:
    def broken() -> list[RawDocument]:
        raise OSError("no sample")

    job = BackgroundIngest("t", broken, stream=io.StringIO())
    with caplog.at_level(logging.ERROR):
        await job.run(SyncFake(), index)
    assert job.progress.snapshot()["state"] == "failed"
    assert job.progress.snapshot()["error"] == "OSError"
    assert "ingest failed" in caplog.text


def test_rate_and_eta_come_from_the_documents_done() -> None:
    progress = IngestProgress("t", "sample", state="running", done=300, total=1000, started=0.0)
    snap = progress.snapshot(now=10.0)
    assert (snap["rate_docs_per_s"], snap["eta_s"], snap["partial_index"]) == (30.0, 23.3, True)
    assert "300/1,000 docs" in bar(progress, 10.0) and "ETA 23s" in bar(progress, 10.0)


def test_after_a_restart_the_rate_counts_only_what_this_run_ingested() -> None:
    # 9,000 found stored in the first second (a hash lookup each), then 100 embedded in 9 s.
    progress = IngestProgress(
        "t", "sample", state="running", done=9100, unchanged=9000, total=10_000, started=0.0
    )
    snap = progress.snapshot(now=10.0)
    assert (snap["rate_docs_per_s"], snap["eta_s"]) == (10.0, 90.0)
    assert snap["documents_unchanged"] == 9000


async def test_a_restart_that_finds_everything_stored_reports_no_rate(
    index: EmbeddedRetriever,
) -> None:
    first = BackgroundIngest("t", lambda: docs(7), stream=io.StringIO())
    await first.run(SyncFake(), index)
    assert first.progress.snapshot()["rate_docs_per_s"] > 0
    stream = io.StringIO()
    again = BackgroundIngest("t", lambda: docs(7), stream=stream)
    await again.run(SyncFake(), index)
    snap = again.progress.snapshot()
    assert (snap["documents_unchanged"], snap["rate_docs_per_s"]) == (7, 0.0)
    assert "all 7 documents already indexed" in stream.getvalue()


def test_the_first_run_line_says_what_answers_now_and_when_the_rest_will() -> None:
    progress = IngestProgress("t", "sample", state="running", done=300, total=1000)
    progress.started -= 10  # 30 docs/s so far
    stream = io.StringIO()
    display = ProgressDisplay(progress, stream, log_every_s=3600, announce=True)
    display.update()
    display.update()
    (line,) = stream.getvalue().splitlines()
    assert line.startswith("answering now from 300 of 1,000 sample documents")
    assert "the rest in about 23s at 30 docs/s" in line and "partial_index" in line


def test_no_first_run_line_before_a_rate_is_measured() -> None:
    progress = IngestProgress("t", "sample", state="running", done=0, total=1000)
    progress.started -= 10
    stream = io.StringIO()
    ProgressDisplay(progress, stream, log_every_s=3600, announce=True).update()
    assert stream.getvalue() == ""


async def test_the_first_batches_grow_from_first_batch_to_embed_batch(
    index: EmbeddedRetriever,
) -> None:
    embedder = FakeEmbedder()
    await ingest_documents("t", docs(20), embedder, index, embed_batch=8, first_batch=1)
    assert [len(call) for call in embedder.calls] == [1, 2, 4, 8, 5]


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_terminal_gets_a_redrawn_bar_a_pipe_gets_log_lines(
    caplog: pytest.LogCaptureFixture,
) -> None:
    progress = IngestProgress("t", "sample", state="running", done=5, total=10)
    terminal = Terminal()
    ProgressDisplay(progress, terminal, redraw_every_s=0).update()
    assert terminal.getvalue().startswith("\r") and "5/10 docs" in terminal.getvalue()
    pipe = io.StringIO()
    with caplog.at_level(logging.INFO, logger="gateway.ingest.progress"):
        ProgressDisplay(progress, pipe, log_every_s=0).update()
    assert pipe.getvalue() == ""
    (record,) = [r for r in caplog.records if r.getMessage() == "ingest progress"]
    assert record.__dict__["documents_done"] == 5


async def test_bulk_embedder_slices_by_length_and_keeps_the_input_order() -> None:
    class ByLength(SyncFake):
        def __init__(self) -> None:
            super().__init__()
            self.calls: list[list[str]] = []

        def embed_sync(self, texts: Sequence[str]) -> Vector:
            self.calls.append(list(texts))
            out = np.zeros((len(texts), self.dimension), dtype=np.float32)
            out[:, 0] = [len(t) for t in texts]
            return out

    inner = ByLength()
    bulk = BulkEmbedder(inner, workers=1, slice_texts=3)
    texts = ["x" * n for n in (5, 1, 9, 3, 7, 2, 8)]
    try:
        vectors = await bulk.embed(texts)
    finally:
        await bulk.aclose()
    assert vectors[:, 0].tolist() == [len(t) for t in texts]
    assert [len(call) for call in inner.calls] == [3, 3, 1]
    assert [len(t) for t in inner.calls[0]] == [1, 2, 3]  # the shortest together
