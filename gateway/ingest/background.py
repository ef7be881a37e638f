"""An ingest that runs inside the serving process, while the gateway answers.

`querygate serve --sample-corpus` opens its port at once and ingests the sample in the
background: one task in the app's lifetime, the only writer of the index during it, embedding
on every core (`backends.embeddings.bulk`, a little below the queries' priority). Queries
meanwhile are answered from what is indexed so far; `/readyz` says how far (`"ingest"`:
documents done and total, rate, ETA), and so does stderr: a progress bar when it is a terminal,
a log line every `log_every_s` seconds otherwise. A later start finds every document unchanged
and is done in seconds.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, TextIO

from backends.embeddings.base import Embedder
from backends.embeddings.bulk import SERVING_NICE, bulk_embedder
from backends.retrieval.base import Retriever
from gateway.ingest.pipeline import IngestReport, ingest_documents
from gateway.ingest.readers import RawDocument

log = logging.getLogger(__name__)

State = Literal["pending", "running", "done", "failed"]

# Chunks per embed call and write: small enough that the first documents are searchable (and
# progress moves) within seconds, large enough to sort by length and write in bulk.
BULK_BATCH = 128


@dataclass(slots=True)
class IngestProgress:
    """How far an ingest is; `snapshot` is what /readyz shows."""

    tenant: str
    source: str
    state: State = "pending"
    done: int = 0
    total: int = 0
    chunks: int = 0
    workers: int = 0
    error: str | None = None
    started: float = field(default_factory=time.monotonic)
    finished: float | None = None

    def rate(self, now: float) -> float:
        """Documents per second since the start."""
        elapsed = (self.finished or now) - self.started
        return self.done / elapsed if elapsed > 0 else 0.0

    def eta_s(self, now: float) -> float | None:
        rate = self.rate(now)
        if self.state != "running" or rate <= 0:
            return None
        return (self.total - self.done) / rate

    def snapshot(self, now: float | None = None) -> dict[str, Any]:
        now = time.monotonic() if now is None else now
        eta = self.eta_s(now)
        return {
            "state": self.state,
            "tenant": self.tenant,
            "source": self.source,
            "documents_done": self.done,
            "documents_total": self.total,
            "chunks_written": self.chunks,
            "embedding_workers": self.workers,
            "rate_docs_per_s": round(self.rate(now), 1),
            "elapsed_s": round((self.finished or now) - self.started, 1),
            "eta_s": None if eta is None else round(eta, 1),
            # Answers meanwhile come from the documents indexed so far.
            "partial_index": self.state in ("pending", "running"),
            **({"error": self.error} if self.error else {}),
        }


class ProgressDisplay:
    """Progress on a stream: a redrawn bar on a terminal, else a log line every `log_every_s`."""

    def __init__(
        self,
        progress: IngestProgress,
        stream: TextIO | None = None,
        *,
        log_every_s: float = 10.0,
        redraw_every_s: float = 0.25,
    ) -> None:
        self._progress = progress
        self._stream = stream or sys.stderr
        self._tty = self._stream.isatty()
        self._every = redraw_every_s if self._tty else log_every_s
        self._last = 0.0

    def update(self, *, final: bool = False) -> None:
        now = time.monotonic()
        if not final and now - self._last < self._every:
            return
        self._last = now
        if self._tty:
            self._stream.write("\r" + bar(self._progress, now) + ("\n" if final else ""))
            self._stream.flush()
        else:
            log.info("ingest progress", extra=self._progress.snapshot(now))


def bar(progress: IngestProgress, now: float, width: int = 30) -> str:
    total = max(progress.total, 1)
    filled = int(width * min(progress.done, total) / total)
    eta = progress.eta_s(now)
    eta_text = f"ETA {_duration(eta)}" if eta is not None else progress.state
    return (
        f"ingest {progress.source} [{'#' * filled}{'.' * (width - filled)}] "
        f"{progress.done:,}/{progress.total:,} docs  {progress.rate(now):.0f} docs/s  {eta_text}  "
    )


def _duration(seconds: float) -> str:
    minutes, secs = divmod(int(seconds + 0.5), 60)
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


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
) -> IngestReport:
    """`ingest_documents` of `docs` for `progress.tenant` in bulk batches, keeping `progress`
    and its display up to date."""

    def step(done: int, total: int) -> None:
        progress.done = done
        display.update()

    return await ingest_documents(
        progress.tenant,
        docs,
        bulk,
        retriever,
        step,
        embed_batch=BULK_BATCH,
        parallel=parallel,
        rechunk=rechunk,
        max_chunks=max_chunks,
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
        self._display = ProgressDisplay(self.progress, stream)

    async def run(self, embedder: Embedder, retriever: Retriever) -> None:
        progress = self.progress
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
