"""`querygate reindex`: rebuild a tenant's index as a new version while the old one serves.

The build reads every stored document's text back from the serving version, chunks and embeds
it with this process's chunker and embedding model, and writes it into the building version
(`backends.retrieval.versions`). Writes that arrive meanwhile, from gateways and ingests in any
process, reach both versions by the backends' write path; a document this copy read before such
a write, and wrote after it, is found by comparing the versions' content hashes, and copied
again. The switch is made once the versions are equal; it is atomic, bumps the tenant's
generation (cached answers retire) and keeps the old version for a rollback.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from backends.embeddings.base import Embedder
from backends.retrieval.base import Document
from backends.retrieval.versions import (
    IndexVersions,
    VersionedIndex,
    VersionError,
    VersionsDiffer,
)
from gateway.ingest.chunker import DEFAULT_CHUNKING, ChunkingConfig
from gateway.ingest.pipeline import IngestReport, ingest_documents
from gateway.ingest.readers import RawDocument

log = logging.getLogger(__name__)

SOURCE_PAGE = 500  # stored documents read (and embedded together) at a time
# Comparisons of the versions before giving up: each copies again what live writes raced.
CATCH_UP_ROUNDS = 20


class ReindexError(RuntimeError):
    """The build could not be made equal to the serving version; nothing was switched."""


@dataclass(slots=True)
class ReindexReport:
    tenant: str
    version: int = 0  # the version built
    documents: int = 0  # documents copied into it
    chunks: int = 0
    caught_up: int = 0  # documents copied again (or removed) after live writes raced the copy
    switched: bool = False

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


class _Building:
    """The building version of one tenant, as the ingest pipeline writes to it."""

    def __init__(self, index: VersionedIndex) -> None:
        self._index = index

    async def content_hashes(self, tenant: str, doc_ids: Sequence[str]) -> dict[str, str]:
        return await self._index.building_hashes(tenant, doc_ids)

    async def upsert_documents(self, tenant: str, documents: Sequence[Document]) -> list[bool]:
        return await self._index.write_building(tenant, documents)

    async def delete_document(self, tenant: str, doc_id: str) -> bool:
        return await self._index.delete_building(tenant, doc_id)

    async def sources(self, tenant: str, doc_ids: Sequence[str]) -> dict[str, str]:
        """Where the documents came from: the serving version's record, which every rebuilt
        document carries over (`StoredSource.source`)."""
        return await self._index.sources(tenant, doc_ids)

    async def set_source(self, tenant: str, doc_ids: Sequence[str], source: str) -> None:
        raise ReindexError(
            f"tenant {tenant!r}: {len(doc_ids)} documents were moved to source {source!r} "
            "while being rebuilt: run reindex again"
        )


async def reindex_tenant(
    tenant: str,
    index: VersionedIndex,
    embedder: Embedder,
    *,
    chunking: ChunkingConfig = DEFAULT_CHUNKING,
    parallel: int = 1,
) -> ReindexReport:
    """Build a new version of the tenant's index and switch to it. A build that stopped before
    its switch is resumed: what it lacks is copied, then it switches. VersionError when a
    previous version is in the way, or documents were stored without their text."""
    if unsourced := await index.without_text(tenant):
        raise VersionError(
            f"tenant {tenant!r}: {unsourced} documents were stored without their text (by an "
            "older version of querygate), so they cannot be rebuilt from the index: ingest "
            "them once more with `querygate ingest --rechunk`, then reindex"
        )
    versions = await index.versions(tenant)
    resumed = versions.building is not None
    if versions.building is None:
        versions = await index.begin_build(tenant, embedder.model_id, repr(chunking))
    assert versions.building is not None  # begin_build made it
    report = ReindexReport(tenant, versions.building.version)
    log.info(
        "reindex resumed" if resumed else "reindex started",
        extra={"tenant": tenant, "version": report.version},
    )
    building = _Building(index)
    copied = IngestReport()
    after = ""
    while not resumed and (page := await index.stored_texts(tenant, after, SOURCE_PAGE)):
        raw = [RawDocument(s.doc_id, s.title, s.text, s.groups, s.source) for s in page]
        await ingest_documents(
            tenant, raw, embedder, building, chunking=chunking, parallel=parallel, report=copied
        )
        after = page[-1].doc_id
    report.documents, report.chunks = copied.added + copied.updated, copied.chunks
    await _catch_up_and_switch(tenant, index, embedder, building, chunking, report)
    return report


async def _catch_up_and_switch(
    tenant: str,
    index: VersionedIndex,
    embedder: Embedder,
    building: _Building,
    chunking: ChunkingConfig,
    report: ReindexReport,
) -> None:
    for _ in range(CATCH_UP_ROUNDS):
        diff = await index.version_diff(tenant)
        doc_ids = diff.stale + diff.extra
        if not doc_ids:
            try:
                await index.switch(tenant)
            except VersionsDiffer as exc:
                doc_ids = exc.doc_ids  # a write landed since the comparison
            else:
                report.switched = True
                log.info("reindex switched", extra={"tenant": tenant, "version": report.version})
                return
        report.caught_up += len(doc_ids)
        await _copy_again(tenant, index, embedder, building, chunking, doc_ids)
    raise ReindexError(
        f"tenant {tenant!r}: version {report.version} still differs from the serving one after "
        f"{CATCH_UP_ROUNDS} rounds of copying what changed meanwhile; it is kept: run reindex "
        "again to retry the switch, or --abort it"
    )


async def _copy_again(
    tenant: str,
    index: VersionedIndex,
    embedder: Embedder,
    building: _Building,
    chunking: ChunkingConfig,
    doc_ids: Sequence[str],
) -> None:
    """Make the building version hold what the serving one holds of these documents."""
    for start in range(0, len(doc_ids), SOURCE_PAGE):
        part = doc_ids[start : start + SOURCE_PAGE]
        stored = {s.doc_id: s for s in await index.texts_of(tenant, part)}
        for doc_id in part:
            if doc_id not in stored:
                await index.delete_building(tenant, doc_id)
        raw = [RawDocument(s.doc_id, s.title, s.text, s.groups, s.source) for s in stored.values()]
        await ingest_documents(tenant, raw, embedder, building, chunking=chunking)


def describe(versions: IndexVersions) -> dict[str, object]:
    """The tenant's versions as the CLI prints them."""
    return {
        "serving": asdict(versions.serving),
        "building": None if versions.building is None else asdict(versions.building),
        "previous": None if versions.previous is None else asdict(versions.previous),
    }
