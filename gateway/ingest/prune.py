"""`querygate ingest --prune`: the documents of a source that the source no longer has, and
deleting them. Only documents recorded with that source are considered (`RawDocument.source`):
one PUT by the API, ingested from another source, or stored before sources were recorded
(source "") is never pruned."""

from __future__ import annotations

from collections.abc import Mapping, Set
from dataclasses import dataclass, field

from backends.retrieval.base import Retriever

DELETE_BATCH = 100  # documents per re-read of their sources before they are deleted


@dataclass(slots=True)
class PruneReport:
    # Per source, its documents that it no longer has (what a dry run lists).
    stale: dict[str, list[str]] = field(default_factory=dict)
    deleted: list[str] = field(default_factory=list)
    # The tenant's documents with no recorded source: never pruned.
    unsourced: int = 0


async def prune_sources(
    tenant: str, present: Mapping[str, Set[str]], retriever: Retriever, *, apply: bool
) -> PruneReport:
    """For each source, the documents recorded with it whose ids `present` (every id read from
    it now) lacks; deleted when `apply`, each delete bumping the generation."""
    report = PruneReport()
    for source, ids in sorted(present.items()):
        if not source:
            raise ValueError("a prune needs a source: documents without one are never pruned")
        gone = [d for d in await retriever.source_documents(tenant, source) if d not in ids]
        if gone:
            report.stale[source] = gone
    if apply:
        for source, stale in report.stale.items():
            report.deleted += await _delete_still_of(tenant, source, stale, retriever)
    report.unsourced = len(await retriever.source_documents(tenant, ""))
    return report


async def _delete_still_of(
    tenant: str, source: str, doc_ids: list[str], retriever: Retriever
) -> list[str]:
    """Delete those of `doc_ids` still recorded with `source`, read again just before: one PUT
    or ingested from elsewhere since the listing is no longer the source's to delete."""
    deleted: list[str] = []
    for start in range(0, len(doc_ids), DELETE_BATCH):
        part = doc_ids[start : start + DELETE_BATCH]
        recorded = await retriever.sources(tenant, part)
        for doc_id in part:
            if recorded.get(doc_id) == source and await retriever.delete_document(tenant, doc_id):
                deleted.append(doc_id)
    return deleted
