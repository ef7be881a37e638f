"""The `VersionedIndex` operations of `EmbeddedRetriever` (`backends.retrieval.versions`), each
one call on the index's thread; what they do to the file is `versions`'."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from functools import partial
from typing import TypeVar

from backends.retrieval.base import Document, refuse_empty
from backends.retrieval.embedded import sources, store, versions, writes
from backends.retrieval.embedded.state import IndexState
from backends.retrieval.versions import (
    Freshness,
    IndexVersions,
    StoredSource,
    VersionDiff,
)

T = TypeVar("T")


class EmbeddedVersions(ABC):
    """Index versions of the file `_write` works on."""

    # Every operation runs on the write connection: in order with the writes, and a switch
    # under the write lock.
    @abstractmethod
    async def _write(self, operation: str, fn: Callable[[IndexState], T]) -> T: ...

    async def versions(self, tenant: str) -> IndexVersions:
        return await self._write("versions", lambda s: versions.read(s.db, tenant)[0])

    async def begin_build(self, tenant: str, model: str, chunking: str) -> IndexVersions:
        return await self._write(
            "begin_build", lambda s: versions.begin(s.db, tenant, model, chunking)
        )

    async def stored_texts(self, tenant: str, after: str, limit: int) -> list[StoredSource]:
        return await self._write("stored_texts", lambda s: sources.page(s.db, tenant, after, limit))

    async def texts_of(self, tenant: str, doc_ids: Sequence[str]) -> list[StoredSource]:
        return await self._write("texts_of", lambda s: sources.of(s.db, tenant, doc_ids))

    async def without_text(self, tenant: str) -> int:
        return await self._write("without_text", lambda s: sources.unsourced(s.db, tenant))

    async def version_diff(self, tenant: str) -> VersionDiff:
        return await self._write("version_diff", lambda s: versions.diff(s.db, tenant))

    async def building_hashes(self, tenant: str, doc_ids: Sequence[str]) -> dict[str, str]:
        def hashes(state: IndexState) -> dict[str, str]:
            return store.content_hashes(state.db, self._building_key(state, tenant), doc_ids)

        return await self._write("building_hashes", hashes)

    async def write_building(self, tenant: str, documents: Sequence[Document]) -> list[bool]:
        refuse_empty(documents)
        for document in documents:
            writes.check_chunks(document)

        def write(state: IndexState, document: Document) -> bool:
            return writes.upsert(state, self._building_key(state, tenant), document)

        return [
            await self._write("write_building", partial(write, document=document))
            for document in documents
        ]

    async def delete_building(self, tenant: str, doc_id: str) -> bool:
        return await self._write(
            "delete_building",
            lambda s: writes.delete(s, self._building_key(s, tenant), doc_id),
        )

    async def switch(self, tenant: str) -> IndexVersions:
        return await self._write("switch", lambda s: versions.switch(s, tenant))

    async def rollback(self, tenant: str) -> IndexVersions:
        return await self._write("rollback", lambda s: versions.rollback(s, tenant))

    async def drop_previous(self, tenant: str) -> IndexVersions:
        return await self._write("drop_previous", lambda s: versions.drop(s, tenant, "previous"))

    async def abort_build(self, tenant: str) -> IndexVersions:
        return await self._write("abort_build", lambda s: versions.drop(s, tenant, "building"))

    async def freshness(self, tenant: str) -> Freshness:
        return await self._write("freshness", lambda s: versions.freshness(s.db, tenant))

    @staticmethod
    def _building_key(state: IndexState, tenant: str) -> str:
        return versions.version_key(tenant, versions.required(state.db, tenant, "building").version)
