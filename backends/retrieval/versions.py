"""Index versions of a tenant: what `querygate reindex` builds, switches to and rolls back.

A tenant's index has one serving version (what reads see), at most one building (filled by a
reindex while the serving one answers) and at most one previous (the version a switch replaced,
kept for a rollback until it is dropped). Every write of a document goes to the serving version
and then to each kept version (building, previous): a build never falls behind the live writes,
and a rollback loses none of the writes made since the switch. A switch and a rollback are
atomic for every process and bump the tenant's generation, so cached answers retire.

Each backend keeps each document's text beside its chunks (`Document.text`): the reindex reads
it back, chunks and embeds it again with the configuration it runs with, and needs no source
folder. A document stored without its text (by a version that did not keep it) cannot be
rebuilt; a build refuses to start while the tenant has any (`without_text`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from backends.retrieval.base import Document


class VersionError(ValueError):
    """A version step the tenant's versions do not allow now (a build while one runs, a
    rollback with nothing to roll back to): the CLI prints it and exits 2."""


class VersionsDiffer(Exception):
    """A switch found the building version not equal to the serving one (a write landed
    between the last comparison and the switch): nothing was switched; copy these again."""

    def __init__(self, doc_ids: Sequence[str]) -> None:
        super().__init__(f"{len(doc_ids)} documents differ between the versions")
        self.doc_ids = list(doc_ids)


@dataclass(frozen=True, slots=True)
class VersionInfo:
    """One version of a tenant's index: its number, what built it and when."""

    version: int
    # The embedding model and chunking it was built with; "" when it predates any reindex
    # (first written by ingests and PUTs, whose model the backend is not told).
    model: str = ""
    chunking: str = ""
    built_at: float = 0.0  # unix seconds the build started; 0.0: unknown


@dataclass(frozen=True, slots=True)
class IndexVersions:
    serving: VersionInfo
    building: VersionInfo | None = None
    previous: VersionInfo | None = None


@dataclass(frozen=True, slots=True)
class StoredSource:
    """A document as stored: what a rebuild chunks and embeds again."""

    doc_id: str
    title: str
    text: str
    content_hash: str
    groups: tuple[str, ...] | None = None  # its access list; None: every user of the tenant
    source: str = ""  # where it was ingested from (`Document.source`): a rebuild keeps it


@dataclass(frozen=True, slots=True)
class Freshness:
    """How current a tenant's serving index is: what /readyz and the metrics show."""

    documents: int
    chunks: int
    last_write: float | None  # unix seconds of the last change; None: none recorded
    version: int
    model: str


@dataclass(frozen=True, slots=True)
class VersionDiff:
    """What the building version must still get to equal the serving one."""

    stale: list[str]  # doc ids missing from it, or stored with another content hash
    extra: list[str]  # doc ids it has and the serving version does not

    def __bool__(self) -> bool:
        return bool(self.stale or self.extra)


def diff_hashes(serving: dict[str, str], building: dict[str, str]) -> VersionDiff:
    """The diff of two versions given each one's content hash per document."""
    stale = sorted(d for d, h in serving.items() if building.get(d) != h)
    return VersionDiff(stale, sorted(set(building) - set(serving)))


@runtime_checkable
class VersionedIndex(Protocol):
    """The version operations of a retriever; every one names the tenant."""

    async def versions(self, tenant: str) -> IndexVersions: ...

    async def sources(self, tenant: str, doc_ids: Sequence[str]) -> dict[str, str]:
        """Where the serving version's documents were ingested from (`Retriever.sources`)."""
        ...

    async def begin_build(self, tenant: str, model: str, chunking: str) -> IndexVersions:
        """Start a new building version (empty); VersionError while a build or a previous
        version exists."""
        ...

    async def stored_texts(self, tenant: str, after: str, limit: int) -> list[StoredSource]:
        """Stored documents of the serving version with their text, doc id above `after`, in
        doc id order, at most `limit`."""
        ...

    async def texts_of(self, tenant: str, doc_ids: Sequence[str]) -> list[StoredSource]:
        """Those of these documents the serving version holds, with their text."""
        ...

    async def without_text(self, tenant: str) -> int:
        """Documents of the serving version stored without their text."""
        ...

    async def version_diff(self, tenant: str) -> VersionDiff: ...

    async def building_hashes(self, tenant: str, doc_ids: Sequence[str]) -> dict[str, str]: ...

    async def write_building(self, tenant: str, documents: Sequence[Document]) -> list[bool]:
        """Write into the building version only (no generation bump: nobody reads it)."""
        ...

    async def delete_building(self, tenant: str, doc_id: str) -> bool: ...

    async def switch(self, tenant: str) -> IndexVersions:
        """Make the building version serve and keep the serving one as previous; raises
        `VersionsDiffer` (switching nothing) when they are not equal."""
        ...

    async def rollback(self, tenant: str) -> IndexVersions:
        """Serve the previous version again; the one it replaces becomes previous."""
        ...

    async def drop_previous(self, tenant: str) -> IndexVersions: ...

    async def abort_build(self, tenant: str) -> IndexVersions: ...

    async def freshness(self, tenant: str) -> Freshness: ...
