"""Ingesting a batch of documents into one tenant's index.

Unchanged documents (same content hash) are skipped before any embedding, so re-running an
ingest over the same tree costs a hash per document. Chunks of many documents are embedded
together, because the embedder is far faster per text in batches. With `parallel` > 1, that
many batches are embedded at once (give it an embedder whose calls run concurrently, e.g.
`backends.embeddings.bulk.BulkEmbedder`, one thread per core) while this coroutine, the one
writer, writes finished batches in order: the index never sees two writers.

Chunks are sized to the embedder's token window when it has one (`ChunkingConfig.fit_window`),
so nothing embedded is cut off by the encoder.

Each document records its source (`RawDocument.source`): a document is the last writer's, so
an unchanged document written from another source (or PUT by the API) is relabelled with it
without being rewritten, and `querygate ingest --prune` of a source never deletes it.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, fields
from itertools import islice
from typing import Protocol

from backends.embeddings.base import Embedder, TokenWindow, token_window
from backends.retrieval.base import Chunk, Document, Vector
from gateway.ingest.chunker import DEFAULT_CHUNKING, ChunkingConfig, TextChunk, iter_chunks
from gateway.ingest.readers import RawDocument
from gateway.text import is_blank

Progress = Callable[[int, int], None]  # (documents done, documents in total)

EMBED_BATCH = 256  # chunks per embedder call: enough to batch well, small enough to report
LOOKUP_BATCH = 500  # documents per lookup of stored content hashes

log = logging.getLogger(__name__)


class DocumentSink(Protocol):
    """What an ingest writes to: a `Retriever`, or a reindex's building version."""

    async def content_hashes(self, tenant: str, doc_ids: Sequence[str]) -> dict[str, str]: ...

    async def upsert_documents(self, tenant: str, documents: Sequence[Document]) -> list[bool]: ...

    async def delete_document(self, tenant: str, doc_id: str) -> bool: ...

    async def sources(self, tenant: str, doc_ids: Sequence[str]) -> dict[str, str]: ...

    async def set_source(self, tenant: str, doc_ids: Sequence[str], source: str) -> None: ...


@dataclass(slots=True)
class IngestReport:
    added: int = 0
    updated: int = 0
    unchanged: int = 0
    deleted: int = 0
    # Documents that yield no passage (headings only): never stored, a backend refuses them.
    empty: int = 0
    chunks: int = 0  # chunks written (of added and updated documents)
    # Documents refused for making more than `max_chunks` chunks: never embedded nor stored
    # (a stored version stays as it was).
    too_large: int = 0
    too_large_ids: list[str] = field(default_factory=list)
    # Documents whose text is blank (`gateway.text.is_blank`: white space or invisible
    # characters only): never stored, a stored version is deleted (counted in `deleted`).
    blank_ids: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, int]:
        return {f.name: v for f in fields(self) if isinstance(v := getattr(self, f.name), int)}


@dataclass(frozen=True, slots=True)
class _Pending:
    raw: RawDocument
    content_hash: str
    is_new: bool
    chunks: list[TextChunk]
    # Stored with the same content (a rechunk): the backends skip a write of an unchanged hash,
    # so the old version is deleted just before the new one is written.
    same_content: bool = False


def content_hash(title: str, text: str, groups: tuple[str, ...] | None = None) -> str:
    """The version of a document: a change of its access list is a change too. A document
    without a list hashes as it did before lists existed, so re-ingesting it writes nothing."""
    # The separator keeps ("ab", "c") and ("a", "bc") apart; group names hold no control
    # characters (`access_list`), so the unit separator keeps groups apart.
    material = f"{title}\x00{text}"
    if groups is not None:
        material += "\x00groups\x00" + "\x1f".join(groups)
    return hashlib.sha256(material.encode()).hexdigest()


async def ingest_documents(
    tenant: str,
    raw_docs: Iterable[RawDocument],
    embedder: Embedder,
    retriever: DocumentSink,
    progress: Progress | None = None,
    *,
    chunking: ChunkingConfig = DEFAULT_CHUNKING,
    embed_batch: int = EMBED_BATCH,
    parallel: int = 1,
    rechunk: bool = False,
    max_chunks: int | None = None,
    report: IngestReport | None = None,
    first_batch: int | None = None,
) -> IngestReport:
    """Add, update or delete each document; a document with blank text (`is_blank`, the rule
    the HTTP API refuses with) is deleted, and named in `blank_ids`.

    Each document is written in its own transaction, so an interrupted ingest leaves whole
    documents only and re-running it resumes where it stopped. `parallel`: batches embedded
    at once (written one at a time, in order). `rechunk`: rewrite unchanged documents too, so
    an index chunked by an older chunker gets today's chunks (they count as updated).
    `max_chunks`: a document that would make more chunks is refused before any embedding
    (counted in `too_large`, named in `too_large_ids`); its stored version, if any, stays.
    `report`: the one to fill, for a caller that reads it while the ingest runs.
    `first_batch`: chunks in the first embed call, each next one twice as many up to
    `embed_batch`, so the first documents are searchable after one small call, not one full
    batch (seconds on a busy machine) while the index is otherwise empty.
    """
    docs = list({d.doc_id: d for d in raw_docs}.values())  # the last version of an id wins
    window = token_window(embedder) if chunking.fit_window else None
    report = IngestReport() if report is None else report
    pending: list[_Pending] = []
    inflight: deque[asyncio.Task[tuple[list[_Pending], Vector]]] = deque()
    done = 0
    stored: dict[str, str] = {}
    batch = embed_batch if first_batch is None else min(first_batch, embed_batch)

    async def write_oldest() -> int:
        batch, vectors = await inflight.popleft()
        return await _write(tenant, batch, vectors, retriever, report)

    try:
        for i, raw in enumerate(docs):
            if i % LOOKUP_BATCH == 0:
                # One lookup of stored hashes per slice, not one round trip per document.
                ids = [d.doc_id for d in docs[i : i + LOOKUP_BATCH]]
                stored = await retriever.content_hashes(tenant, ids)
                await _claim_unchanged(tenant, docs[i : i + LOOKUP_BATCH], stored, retriever)
            item = await _prepare(
                tenant,
                raw,
                stored.get(raw.doc_id),
                retriever,
                report,
                chunking,
                window,
                rechunk,
                max_chunks,
            )
            if item is None:
                done += 1
            else:
                pending.append(item)
            last = i == len(docs) - 1
            if pending and (last or _size(pending) >= batch):
                inflight.append(asyncio.create_task(_embed(pending, embedder)))
                pending = []
                batch = min(batch * 2, embed_batch)
            while inflight and (len(inflight) >= parallel or last):
                done += await write_oldest()
            if progress is not None:
                progress(done, len(docs))
    finally:
        for task in inflight:  # failed or cancelled part way: embed nothing more
            task.cancel()
    return report


async def _claim_unchanged(
    tenant: str, docs: list[RawDocument], stored: dict[str, str], retriever: DocumentSink
) -> None:
    """Record this write's source on the documents stored with the same content, whose write
    is skipped: one lookup of their recorded sources, one update per source that differs."""
    same = [d for d in docs if stored.get(d.doc_id) == content_hash(d.title, d.text)]
    if not same:
        return
    recorded = await retriever.sources(tenant, [d.doc_id for d in same])
    moved: dict[str, list[str]] = {}
    for doc in same:
        if recorded.get(doc.doc_id, doc.source) != doc.source:
            moved.setdefault(doc.source, []).append(doc.doc_id)
    for source, ids in moved.items():
        await retriever.set_source(tenant, ids, source)


def _size(pending: list[_Pending]) -> int:
    return sum(len(p.chunks) for p in pending)


async def _prepare(
    tenant: str,
    raw: RawDocument,
    stored: str | None,
    retriever: DocumentSink,
    report: IngestReport,
    chunking: ChunkingConfig,
    window: TokenWindow | None,
    rechunk: bool,
    max_chunks: int | None = None,
) -> _Pending | None:
    """What to write for this document, given its stored hash; None when it needs nothing."""
    if is_blank(raw.text):
        report.blank_ids.append(raw.doc_id)
        if stored is not None and await retriever.delete_document(tenant, raw.doc_id):
            report.deleted += 1
        return None
    digest = content_hash(raw.title, raw.text, raw.groups)
    if digest == stored and not rechunk:
        report.unchanged += 1
        return None
    if max_chunks is not None and await _surely_too_large(raw.text, window, max_chunks):
        _refuse(raw.doc_id, report, max_chunks)
        return None
    # Pure-Python work that grows with the text (seconds of CPU for a large PUT): off the loop,
    # so it does not stall every other request. Chunks are made one at a time and the document
    # is refused at the first past the cap, so a 413 costs no more than the cap's chunks.
    chunks = await asyncio.to_thread(_chunks, raw, chunking, window, max_chunks)
    if max_chunks is not None and len(chunks) > max_chunks:
        _refuse(raw.doc_id, report, max_chunks)
        return None
    if not chunks:
        log.warning("document has no passage to index, skipped", extra={"doc_id": raw.doc_id})
        report.empty += 1
        return None
    return _Pending(raw, digest, stored is None, chunks, same_content=digest == stored)


def _chunks(
    raw: RawDocument, chunking: ChunkingConfig, window: TokenWindow | None, max_chunks: int | None
) -> list[TextChunk]:
    """The document's chunks, or the first `max_chunks` + 1 of them: enough to refuse it."""
    made = iter_chunks(raw.doc_id, raw.title, raw.text, chunking, window=window)
    return list(made if max_chunks is None else islice(made, max_chunks + 1))


async def _surely_too_large(text: str, window: TokenWindow | None, max_chunks: int) -> bool:
    """True when `text` has more tokens than `max_chunks` whole windows could hold, so it
    would make more chunks: found with one pass of the tokenizer, far cheaper than chunking
    it. Every token but a heading's lands in a chunk (headings go to the context line of their
    section's chunks; a text of huge headings alone is refused here rather than as empty). A
    token covers at least one character, so a text shorter than that many tokens is chunked,
    then counted, without this pass."""
    if window is None or len(text) <= max_chunks * window.max_tokens:
        return False
    return await asyncio.to_thread(window.count, text) > max_chunks * window.max_tokens


def _refuse(doc_id: str, report: IngestReport, max_chunks: int) -> None:
    log.warning(
        "document makes too many chunks, refused",
        extra={"doc_id": doc_id, "max_chunks": max_chunks},
    )
    report.too_large += 1
    report.too_large_ids.append(doc_id)


async def _embed(pending: list[_Pending], embedder: Embedder) -> tuple[list[_Pending], Vector]:
    """Every pending chunk's vector, in one embedder call."""
    texts = [chunk.embedding_text for item in pending for chunk in item.chunks]
    return pending, await embedder.embed(texts)


async def _write(
    tenant: str,
    pending: list[_Pending],
    vectors: Vector,
    retriever: DocumentSink,
    report: IngestReport,
) -> int:
    """Write each document of an embedded batch; returns documents written."""
    rows = iter(vectors)
    documents = [
        Document(
            item.raw.doc_id,
            item.raw.title,
            item.content_hash,
            tuple(Chunk(c.chunk_id, c.text, c.section, next(rows)) for c in item.chunks),
            item.raw.groups,
            source=item.raw.source,
            text=item.raw.text,
        )
        for item in pending
    ]
    kept = await _rechunk_still_current(tenant, pending, documents, retriever, report)
    if not kept:
        return len(pending)
    stored_flags = await retriever.upsert_documents(tenant, [document for _, document in kept])
    for (item, document), stored in zip(kept, stored_flags, strict=True):
        if not stored:
            report.unchanged += 1  # an identical version landed first (a concurrent PUT)
            continue
        if item.is_new:
            report.added += 1
        else:
            report.updated += 1
        report.chunks += len(document.chunks)
    return len(pending)


async def _rechunk_still_current(
    tenant: str,
    pending: list[_Pending],
    documents: list[Document],
    retriever: DocumentSink,
    report: IngestReport,
) -> list[tuple[_Pending, Document]]:
    """The batch's documents to write. A rechunk whose document a live PUT or DELETE changed
    since its hash was read is dropped (that write is newer than the file); the old version of
    every other rechunk is deleted now, as the backends skip a write of an unchanged hash."""
    rechunks = [item.raw.doc_id for item in pending if item.same_content]
    if not rechunks:
        return list(zip(pending, documents, strict=True))
    stored = await retriever.content_hashes(tenant, rechunks)
    kept: list[tuple[_Pending, Document]] = []
    for item, document in zip(pending, documents, strict=True):
        if item.same_content and stored.get(item.raw.doc_id) != item.content_hash:
            report.unchanged += 1  # not ours to rewrite any more
            continue
        if item.same_content:
            await retriever.delete_document(tenant, item.raw.doc_id)
        kept.append((item, document))
    return kept
