"""Writing and deleting documents: each write replaces a document whole, then bumps the
tenant's generation.

Writes replace a document whole, with a short window (docs/opensearch.md, "Writes"): a new version's
chunks are indexed hidden (`pending: true`, under `_id`s that include its content hash, so they
never overwrite the old version's), then one `_bulk` per document (the flip) un-hides them and
deletes every other chunk of the document. A `_bulk` is applied item by item, not as a transaction:
a scheduled refresh that lands while the flip runs shows readers old and new chunks together (or a
document short of some chunks) until the flip's own refresh, milliseconds later. Two processes
writing one document at once can both flip; each then settles the document on one deterministic
winner (highest flip stamp, then content hash) and deletes the other's visible chunks, so both
versions are visible only between the second flip and its settling. A writer whose flip runs between
another's staging and flip deletes the other's staged chunks as stale; the other's flip then finds
them gone (`WriteRaced`) and writes again from a fresh read, so a write is never refused for a
concurrent one (a reindex copying a document that a gateway writes). A document counts as stored
with hash H only when every chunk it has is visible and carries H, so a write that failed anywhere
is written again by a retry, never "unchanged"; a retry that finds the flip applied but its
generation bump lost makes the bump.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_attempt, wait_random

from backends.retrieval.base import Document, refuse_empty
from backends.retrieval.opensearch.bulk import Bulk, WriteRaced, delete_ops
from backends.retrieval.opensearch.client import Json
from backends.retrieval.opensearch.generations import Generations
from backends.retrieval.opensearch.layout import IndexLayout
from backends.retrieval.opensearch.stored import Stored, read_stored
from backends.retrieval.opensearch.targets import write_targets

# A document's chunks are listed in one search page when a new version replaces them.
MAX_CHUNKS_PER_DOCUMENT = 10_000
# Operations per un-hide (flip) request; a document's flip is never split across two.
_FLIP_BATCH = 5000
# Attempts of a write whose chunks a concurrent writer of the same document removed; the random
# pause keeps two writers from meeting again in step.
_CONCURRENT_ATTEMPTS = 4
_CONCURRENT_PAUSE_S = 0.05

_T = TypeVar("_T")


async def _again_when_raced(write: Callable[[], Awaitable[_T]]) -> _T:
    """`write()`, again from the start while a concurrent writer removes its chunks."""
    async for attempt in AsyncRetrying(
        retry=retry_if_exception_type(WriteRaced),
        stop=stop_after_attempt(_CONCURRENT_ATTEMPTS),
        wait=wait_random(0, _CONCURRENT_PAUSE_S),
        reraise=True,
    ):
        with attempt:
            return await write()
    raise AssertionError("unreachable: tenacity re-raises the last attempt's error")


def chunk_key(tenant: str, doc_id: str, content_hash: str, chunk_id: str) -> str:
    """The OpenSearch `_id` of a chunk: fixed length, distinct per tenant and per version of the
    document by construction, so writing a new version never overwrites the old one's chunks."""
    raw = "\x1f".join((tenant, doc_id, content_hash, chunk_id)).encode()
    return hashlib.sha256(raw).hexdigest()


class Writes:
    """Upserts and deletes of one retriever, and the stored state they compare against."""

    def __init__(self, layout: IndexLayout, bulk: Bulk, generations: Generations) -> None:
        self._layout = layout
        self._bulk = bulk
        self._generations = generations

    async def upsert_documents(self, tenant: str, documents: Sequence[Document]) -> list[bool]:
        """Many documents in few requests, into the serving version and then each kept one
        (`versions`): for each, one lookup of what is stored, shared `_bulk` batches of hidden
        chunks, one un-hiding `_bulk` per document (several documents share one when small),
        and for the serving version one generation bump."""
        refuse_empty(documents)
        for document in documents:
            self._check_document(document)
        await self._layout.writable(tenant)
        serving, kept = await write_targets(self._layout, tenant)
        changed = await self.upsert_into(serving, tenant, documents, bump=True)
        for index in kept:
            await self.upsert_into(index, tenant, documents, bump=False)
        return changed

    async def upsert_into(
        self, index: str, tenant: str, documents: Sequence[Document], *, bump: bool
    ) -> list[bool]:
        """`upsert_documents` into one index (or alias); `bump`: the serving version, whose
        changes bump the tenant's generation."""
        return await _again_when_raced(lambda: self._upsert_once(index, tenant, documents, bump))

    async def _upsert_once(
        self, index: str, tenant: str, documents: Sequence[Document], bump: bool
    ) -> list[bool]:
        stored = await self._stored(tenant, [d.doc_id for d in documents], index)
        old = [stored.get(d.doc_id, Stored()) for d in documents]
        changed = [o.content_hash != d.content_hash for o, d in zip(old, documents, strict=True)]
        if not any(changed):
            if bump:
                # An earlier attempt's flip may have landed with its bump lost: make the bump.
                await self._bump_if_behind(tenant, old)
            return changed
        staged: list[Json] = []
        flips: list[list[Json]] = []
        for document, previous, change in zip(documents, old, changed, strict=True):
            if change:
                hidden, flip = _document_ops(index, tenant, document, previous)
                staged += hidden
                flips.append(flip)
        # 1. The new versions' chunks, hidden from every reader: a failure here leaves the old
        # versions whole. No refresh: nobody may see them yet, the flip refreshes.
        try:
            await self._bulk.send(staged, refresh="false")
        except BaseException:
            # Hidden chunks still count in the index's BM25 statistics: take back what landed.
            await self._discard_after_failure(index, staged)
            raise
        try:
            # 2. Per document, un-hide its new chunks and delete all others in one request,
            # stamped with the generation the change is expected to produce (read just now).
            await self._flip(flips, await self._generations.read(tenant) + 1)
            # 3. A concurrent writer of the same document may have flipped too: keep one.
            written = [d.doc_id for d, c in zip(documents, changed, strict=True) if c]
            await self._settle(index, tenant, written)
        except BaseException:
            if bump:
                # Part of a flip may be visible: retire the tenant's cached answers all the same.
                await self._bump_after_failure(tenant)
            raise
        # Bump only once the change is visible: an answer computed from the old content can then
        # never be cached under the new generation.
        if bump:
            await self._generations.bump(tenant)
        return changed

    async def delete_document(self, tenant: str, doc_id: str) -> bool:
        """Delete from the serving version, then from each kept one (`versions`)."""
        await self._layout.ensure_ready()
        serving, kept = await write_targets(self._layout, tenant)
        deleted = await self.delete_from(serving, tenant, doc_id, bump=True)
        for index in kept:
            await self.delete_from(index, tenant, doc_id, bump=False)
        return deleted

    async def delete_from(self, index: str, tenant: str, doc_id: str, *, bump: bool) -> bool:
        """Hide every visible chunk in one request, then delete every chunk, hidden ones too:
        readers lose the document at once, and a delete that failed part-way leaves hidden
        chunks that a retry finds. False when readers saw no chunk of it (the gateway's 404),
        even when hidden chunks (a failed staging, a half-done delete) were cleaned up."""
        return await _again_when_raced(lambda: self._delete_once(index, tenant, doc_id, bump))

    async def _delete_once(self, index: str, tenant: str, doc_id: str, bump: bool) -> bool:
        entry = (await self._stored(tenant, [doc_id], index)).get(doc_id)
        if entry is None:
            return False
        hide: list[Json] = []
        for key in sorted(entry.visible_keys):
            hide += [{"update": {"_index": index, "_id": key}}, {"doc": {"pending": True}}]
        try:
            if hide:
                await self._bulk.send_whole(hide)
            await self._bulk.send(delete_ops(index, entry.chunk_keys))
        except BaseException:
            if bump:
                await self._bump_after_failure(tenant)
            raise
        # Also when only hidden chunks were left: they may be a half-done delete whose hide
        # was visible and whose bump was lost.
        if bump:
            await self._generations.bump(tenant)
        return bool(hide)

    async def hashes_in(self, index: str, tenant: str, doc_ids: Sequence[str]) -> dict[str, str]:
        """Content hashes of the documents stored whole in one index (no bump is made)."""
        stored = await self._stored(tenant, doc_ids, index)
        return {d: e.content_hash for d, e in stored.items() if e.visible_keys}

    async def content_hashes(self, tenant: str, doc_ids: Sequence[str]) -> dict[str, str]:
        stored = await self._stored(tenant, doc_ids)
        # Idempotent ingest skips what this reports as stored: a flip that landed with its bump
        # lost must not be skipped with answers of the old content still cached.
        await self._bump_if_behind(tenant, list(stored.values()))
        # A document none of whose chunks readers see (a delete that failed part-way) is absent.
        return {
            doc_id: entry.content_hash for doc_id, entry in stored.items() if entry.visible_keys
        }

    async def _stored(
        self, tenant: str, doc_ids: Sequence[str], index: str | None = None
    ) -> dict[str, Stored]:
        await self._layout.ensure_ready()
        client, config = self._layout.client, self._layout.config
        return await read_stored(client, config, tenant, doc_ids, index)

    def _check_document(self, document: Document) -> None:
        if len(document.chunks) > MAX_CHUNKS_PER_DOCUMENT:
            raise ValueError(f"{document.doc_id}: more than {MAX_CHUNKS_PER_DOCUMENT} chunks")
        if len({chunk.chunk_id for chunk in document.chunks}) != len(document.chunks):
            raise ValueError(f"{document.doc_id}: chunk ids must be unique")
        for chunk in document.chunks:
            self._layout.check_vector(chunk.embedding)

    async def _flip(self, flips: list[list[Json]], stamp: int) -> None:
        """Send each document's flip whole; small ones share a request. `stamp` goes on every
        chunk it un-hides: a retry that finds it above the tenant's generation knows the flip
        landed without its bump."""
        batch: list[Json] = []
        for flip in flips:
            for line in flip:
                if "doc" in line:
                    line["doc"]["generation"] = stamp
            if batch and len(batch) + len(flip) > 2 * _FLIP_BATCH:
                await self._bulk.send_whole(batch)
                batch = []
            batch += flip
        if batch:
            await self._bulk.send_whole(batch)

    async def _settle(self, index: str, tenant: str, doc_ids: Sequence[str]) -> None:
        """Leave one version of each document visible: two writers of one document can both
        flip; both settle on the same deterministic winner, so the last to settle converges."""
        stored = await self._stored(tenant, doc_ids, index)
        losers = [key for entry in stored.values() for key in entry.losers()]
        if losers:
            await self._bulk.send(delete_ops(index, losers))

    async def _bump_if_behind(self, tenant: str, stored: Sequence[Stored]) -> None:
        stamp = max((max(s.stamps.values(), default=0) for s in stored), default=0)
        if stamp > await self._generations.read(tenant):
            await self._generations.bump(tenant)

    async def _discard_after_failure(self, index: str, staged: list[Json]) -> None:
        """Best effort: delete the hidden chunks a failed staging may have left (the node may
        be down: then the document's next write or delete removes them)."""
        keys = [str(line["index"]["_id"]) for line in staged if "index" in line]
        with contextlib.suppress(Exception):
            await asyncio.shield(self._bulk.send(delete_ops(index, keys), refresh="false"))

    async def _bump_after_failure(self, tenant: str) -> None:
        """Best effort: the node may be down, and the caller's error is the one to raise."""
        with contextlib.suppress(Exception):
            await asyncio.shield(self._generations.bump(tenant))


def _document_ops(
    index: str, tenant: str, document: Document, previous: Stored
) -> tuple[list[Json], list[Json]]:
    """(index ops for the new version's hidden chunks, the document's flip ops)."""
    hidden: list[Json] = []
    flip: list[Json] = []
    new_keys: set[str] = set()
    visible = previous.visible_keys
    for n, chunk in enumerate(document.chunks):
        key = chunk_key(tenant, document.doc_id, document.content_hash, chunk.chunk_id)
        new_keys.add(key)
        if key in visible:
            continue  # this version's chunk, made visible by an earlier, partial attempt
        hidden += [
            {"index": {"_index": index, "_id": key}},
            {
                "tenant": tenant,
                "doc_id": document.doc_id,
                "chunk_id": chunk.chunk_id,
                "title": document.title,
                "section": chunk.section,
                "text": chunk.text,
                "content_hash": document.content_hash,
                "source": document.source,
                "generation": 0,  # stamped by the flip
                "pending": True,
                "embedding": chunk.embedding.astype(float).tolist(),
                # No field for a document without an access list: `readable` reads its absence.
                **({} if document.groups is None else {"groups": list(document.groups)}),
                # The document's text, on its first chunk only: what a reindex rebuilds from.
                **(
                    {"document_text": document.text, "has_text": True}
                    if n == 0 and document.text
                    else {}
                ),
            },
        ]
        flip += [{"update": {"_index": index, "_id": key}}, {"doc": {"pending": False}}]
    stale = sorted(set(previous.chunk_keys) - new_keys)
    return hidden, flip + delete_ops(index, stale)
