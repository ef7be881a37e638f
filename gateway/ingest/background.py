"""An ingest that runs inside the serving process, while the gateway answers.

`querygate serve --sample-corpus` opens its port at once and ingests the sample in the
background: one task in the app's lifetime, the only writer of the index during it, embedding
on every core (`backends.embeddings.bulk`, a little below the queries' priority). Queries
meanwhile are answered from what is indexed so far, and say so (`partial_index`, from the
process's `IngestRegistry`); `/readyz` says how far (`"ingest"`: documents done and total, rate,
ETA), and so does stderr: once the rate is measured, a line saying what answers now and when
the rest will, then a progress bar when it is a terminal, a log line every `log_every_s`
seconds otherwise. A later start finds every document unchanged and is done in seconds.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import TextIO

from backends.embeddings.base import Embedder
from backends.embeddings.bulk import SERVING_NICE, bulk_embedder
from backends.retrieval.base import Retriever
from gateway.ingest.pipeline import IngestReport, ingest_documents
from gateway.ingest.progress import IngestProgress, IngestRegistry, ProgressDisplay
from gateway.ingest.readers import RawDocument
from gateway.ingest.shared_progress import ProgressFile

log = logging.getLogger(__name__)

# Chunks per embed call and write: small enough that the first documents are searchable (and
# progress moves) within seconds, large enough to sort by length and write in bulk.
BULK_BATCH = 128
# The first call's chunks (then doubling up to BULK_BATCH): on a first run the index is empty
# until the first batch is written, and the first documents are the README's example pages.
FIRST_BATCH = 4


async def ingest_shown(
    progress: IngestProgress,
    display: ProgressDisplay,
    docs: list[RawDocument],
    bulk: Embedder,
    retriever: Retriever,
    parallel: int,
    *,
    rechunk: bool = False,
    max_chunks: int | None = None,
    shared: ProgressFile | None = None,
) -> IngestReport:
    """`ingest_documents` of `docs` for `progress.tenant` in bulk batches, keeping `progress`
    and its display up to date, and `shared` (a first ingest, for a gateway to see)."""
    report = IngestReport()
    if shared is not None:
        shared.update(force=True)  # before any write: the index is partial from here

    def step(done: int, total: int) -> None:
        progress.done, progress.unchanged = done, report.unchanged
        display.update()
        if shared is not None:
            shared.update()

    return await ingest_documents(
        progress.tenant,
        docs,
        bulk,
        retriever,
        step,
        embed_batch=BULK_BATCH,
        first_batch=FIRST_BATCH,
        parallel=parallel,
        rechunk=rechunk,
        max_chunks=max_chunks,
        report=report,
    )


class BackgroundIngest:
    """One ingest of `load()`'s documents for `tenant`; `run` is the task's body."""

    def __init__(
        self,
        tenant: str,
        load: Callable[[], list[RawDocument]],
        *,
        source: str = "sample corpus",
        workers: int | None = None,
        stream: TextIO | None = None,
    ) -> None:
        self.progress = IngestProgress(tenant, source)
        self._load = load
        self._workers = workers
        self._display = ProgressDisplay(self.progress, stream, announce=True)

    async def run(
        self, embedder: Embedder, retriever: Retriever, registry: IngestRegistry | None = None
    ) -> None:
        """The ingest, tracked in `registry` (answers to the tenant meanwhile say partial)."""
        progress = self.progress
        if registry is not None:
            registry.track(progress)
        bulk, parallel = bulk_embedder(embedder, self._workers, nice=SERVING_NICE)
        progress.workers = getattr(bulk, "workers", 1)
        try:
            docs = await asyncio.to_thread(self._load)
            progress.total = len(docs)
            progress.state = "running"
            progress.started = time.monotonic()
            log.info("ingest started", extra=progress.snapshot())

            report = await ingest_shown(progress, self._display, docs, bulk, retriever, parallel)
        except asyncio.CancelledError:
            progress.state = "failed"
            progress.error = "stopped before the end (the next start resumes it)"
            raise
        except Exception as exc:
            progress.state = "failed"
            progress.error = type(exc).__name__
            log.exception("ingest failed", extra={"tenant": progress.tenant})
            return
        finally:
            progress.finished = time.monotonic()
            if bulk is not embedder:
                await bulk.aclose()
        progress.chunks = report.chunks
        progress.state = "done"
        self._display.update(final=True)
        log.info("ingest done", extra={**progress.snapshot(), **report.as_dict()})
