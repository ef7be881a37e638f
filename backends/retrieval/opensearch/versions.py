"""Index versions in OpenSearch (`backends.retrieval.versions`), for `tenancy: index_per_tenant`.

A build is a new physical index `<alias>-v<N+1>` created from the current template, with what
built it in its mapping's `_meta`, behind `<alias>-next`; every write reaches it from then on
(`targets`). The switch moves the tenant's alias to it and `-prev` to the old index in one
`_aliases` call, which is atomic for every reader, then bumps the tenant's generation. Dropping
a version first takes its alias away, waits `DRAIN_S` for writes that resolved it before to
finish, then deletes the index. With `tenancy: shared` one index holds every tenant, so one
tenant's version cannot be switched alone: refused.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Sequence

from backends.retrieval.base import Document
from backends.retrieval.opensearch.client import Json, translated
from backends.retrieval.opensearch.generations import Generations
from backends.retrieval.opensearch.layout import IndexLayout
from backends.retrieval.opensearch.queries import VISIBLE, tenant_visible
from backends.retrieval.opensearch.search import Search
from backends.retrieval.opensearch.targets import (
    BUILDING,
    PREVIOUS,
    Placed,
    placed,
    role_alias,
    version_number,
)
from backends.retrieval.opensearch.writes import Writes
from backends.retrieval.versions import (
    Freshness,
    IndexVersions,
    StoredSource,
    VersionDiff,
    VersionError,
    VersionInfo,
    VersionsDiffer,
    diff_hashes,
)

# How long a dropped version's index outlives its alias: a write that resolved the alias just
# before finishes meanwhile (it takes milliseconds), instead of re-creating the index.
DRAIN_S = 2.0
_PAGE = 500
_SOURCE_FIELDS = ["doc_id", "title", "document_text", "content_hash", "groups", "source"]


class OpenSearchVersions:
    """The version operations of one `OpenSearchRetriever`."""

    def __init__(
        self, layout: IndexLayout, writes: Writes, generations: Generations, search: Search
    ) -> None:
        self._layout = layout
        self._writes = writes
        self._generations = generations
        self._search = search

    async def versions(self, tenant: str) -> IndexVersions:
        found = await self._placed(tenant)
        return IndexVersions(
            await self._info(found.serving) or VersionInfo(1),
            await self._info(found.building),
            await self._info(found.previous),
        )

    async def begin_build(self, tenant: str, model: str, chunking: str) -> IndexVersions:
        await self._layout.writable(tenant)
        found = await self._placed(tenant)
        if found.building is not None:
            raise VersionError(
                f"tenant {tenant!r}: version {version_number(found.building)} is being built "
                "(or a build was stopped): finish it, or abort it with --abort"
            )
        if found.previous is not None:
            raise VersionError(
                f"tenant {tenant!r} keeps version {version_number(found.previous)} for a "
                "rollback: drop it with --drop-old (or roll back) before building another"
            )
        assert found.serving is not None  # writable made it
        number = await self._next_number(found.alias)
        meta = {"version": number, "model": model, "chunking": chunking, "built_at": time.time()}
        index = self._layout.config.version_index(number, found.alias)
        cfg = self._layout.config
        with translated("begin_build"):
            await self._layout.client.indices.create(
                index=index,
                body={"mappings": {"_meta": {"querygate": meta}}},
                request_timeout=cfg.write_timeout_s,
            )
            await self._layout.client.cluster.health(
                index=index,
                wait_for_status="yellow",
                wait_for_no_initializing_shards=True,
                params={"timeout": f"{int(cfg.write_timeout_s * 1000)}ms"},
                request_timeout=cfg.write_timeout_s + 1,
            )
            await self._aliases(
                [{"add": {"index": index, "alias": role_alias(found.alias, BUILDING)}}]
            )
        return await self.versions(tenant)

    async def stored_texts(self, tenant: str, after: str, limit: int) -> list[StoredSource]:
        body: Json = {
            "size": limit,
            "_source": _SOURCE_FIELDS,
            "query": self._sourced(tenant),
            "sort": [{"doc_id": "asc"}],
        }
        if after:
            body["search_after"] = [after]
        return _unique(await self._hits(self._layout.config.tenant_alias(tenant), body))

    async def texts_of(self, tenant: str, doc_ids: Sequence[str]) -> list[StoredSource]:
        found: list[StoredSource] = []
        for start in range(0, len(doc_ids), _PAGE):
            part = list(doc_ids[start : start + _PAGE])
            query = self._sourced(tenant)
            query["bool"]["filter"].append({"terms": {"doc_id": part}})
            body: Json = {"size": 2 * len(part), "_source": _SOURCE_FIELDS, "query": query}
            found += _unique(await self._hits(self._layout.config.tenant_alias(tenant), body))
        return found

    async def without_text(self, tenant: str) -> int:
        alias = self._layout.config.tenant_alias(tenant)
        if not (await self._placed(tenant)).serving:
            return 0
        documents = set(await self._hashes(alias, tenant))
        sourced = {d async for d, _ in self._terms(alias, self._sourced(tenant))}
        return len(documents - sourced)

    async def version_diff(self, tenant: str) -> VersionDiff:
        found = await self._placed(tenant)
        building = self._required(tenant, found.building, "building")
        assert found.serving is not None
        await self._refresh(found.serving, building)
        return diff_hashes(
            await self._hashes(found.serving, tenant), await self._hashes(building, tenant)
        )

    async def building_hashes(self, tenant: str, doc_ids: Sequence[str]) -> dict[str, str]:
        index = await self._building(tenant)
        return await self._writes.hashes_in(index, tenant, doc_ids)

    async def write_building(self, tenant: str, documents: Sequence[Document]) -> list[bool]:
        index = await self._building(tenant)
        return await self._writes.upsert_into(index, tenant, documents, bump=False)

    async def delete_building(self, tenant: str, doc_id: str) -> bool:
        index = await self._building(tenant)
        return await self._writes.delete_from(index, tenant, doc_id, bump=False)

    async def switch(self, tenant: str) -> IndexVersions:
        found = await self._placed(tenant)
        building = self._required(tenant, found.building, "building")
        assert found.serving is not None
        await self._refresh(found.serving, building)
        if diff := diff_hashes(
            await self._hashes(found.serving, tenant), await self._hashes(building, tenant)
        ):
            raise VersionsDiffer(diff.stale + diff.extra)
        await self._aliases(_swap(found.alias, found.serving, building, BUILDING))
        await self._generations.bump(tenant)
        return await self.versions(tenant)

    async def rollback(self, tenant: str) -> IndexVersions:
        found = await self._placed(tenant)
        previous = self._required(tenant, found.previous, "previous")
        assert found.serving is not None
        await self._aliases(_swap(found.alias, found.serving, previous, PREVIOUS))
        await self._generations.bump(tenant)
        return await self.versions(tenant)

    async def drop_previous(self, tenant: str) -> IndexVersions:
        return await self._drop(tenant, PREVIOUS)

    async def abort_build(self, tenant: str) -> IndexVersions:
        return await self._drop(tenant, BUILDING)

    async def freshness(self, tenant: str) -> Freshness:
        documents, chunks = await self._search.stats(tenant)
        serving = (await self._placed(tenant)).serving
        info = await self._info(serving) or VersionInfo(1)
        changed = await self._generations.changed_at(tenant)
        return Freshness(documents, chunks, changed, info.version, info.model)

    # -- helpers -----------------------------------------------------------------------------

    async def _placed(self, tenant: str) -> Placed:
        if self._layout.config.tenancy == "shared":
            raise VersionError(
                "index versions are per tenant: with retrieval.opensearch.tenancy shared one "
                "index holds every tenant (move to index_per_tenant: `querygate opensearch "
                "migrate-tenancy`)"
            )
        await self._layout.ensure_ready()
        return await placed(self._layout, tenant)

    async def _building(self, tenant: str) -> str:
        return self._required(tenant, (await self._placed(tenant)).building, "building")

    @staticmethod
    def _required(tenant: str, index: str | None, which: str) -> str:
        if index is None:
            raise VersionError(f"tenant {tenant!r} has no {which} version")
        return index

    async def _drop(self, tenant: str, role: str) -> IndexVersions:
        found = await self._placed(tenant)
        which = "building" if role == BUILDING else "previous"
        index = self._required(tenant, getattr(found, which), which)
        await self._aliases([{"remove": {"index": index, "alias": role_alias(found.alias, role)}}])
        await asyncio.sleep(DRAIN_S)
        with translated("drop_version"):
            await self._layout.client.indices.delete(
                index=index, request_timeout=self._layout.config.write_timeout_s
            )
        return await self.versions(tenant)

    async def _next_number(self, alias: str) -> int:
        with translated("versions"):
            indices = await self._layout.client.indices.get(
                index=f"{alias}-v*", request_timeout=self._layout.config.write_timeout_s
            )
        return max((version_number(name) for name in indices), default=1) + 1

    async def _info(self, index: str | None) -> VersionInfo | None:
        if index is None:
            return None
        with translated("versions"):
            mapping = await self._layout.client.indices.get_mapping(index=index)
        meta = mapping[index]["mappings"].get("_meta", {}).get("querygate")
        if meta is None:
            return VersionInfo(version_number(index))
        return VersionInfo(int(meta["version"]), meta["model"], meta["chunking"], meta["built_at"])

    async def _aliases(self, actions: list[Json]) -> None:
        with translated("aliases"):
            await self._layout.client.indices.update_aliases(
                body={"actions": actions}, request_timeout=self._layout.config.write_timeout_s
            )

    async def _refresh(self, *indices: str) -> None:
        with translated("refresh"):
            await self._layout.client.indices.refresh(index=",".join(indices))

    @staticmethod
    def _sourced(tenant: str) -> Json:
        return {
            "bool": {
                "filter": [{"term": {"tenant": tenant}}, VISIBLE, {"term": {"has_text": True}}]
            }
        }

    async def _hits(self, index: str, body: Json) -> list[Json]:
        with translated("sources"):
            response = await self._layout.client.search(
                index=index, body=body, request_timeout=self._layout.config.write_timeout_s
            )
        return list(response["hits"]["hits"])

    async def _hashes(self, index: str, tenant: str) -> dict[str, str]:
        """Every visible document's content hash in one index (or alias)."""
        return {d: h async for d, h in self._terms(index, tenant_visible(tenant))}

    async def _terms(self, index: str, query: Json) -> AsyncIterator[tuple[str, str]]:
        """(doc_id, content_hash) of the chunks `query` matches, one per pair, paged."""
        sources = [
            {"doc_id": {"terms": {"field": "doc_id"}}},
            {"hash": {"terms": {"field": "content_hash"}}},
        ]
        composite: Json = {"size": 1000, "sources": sources}
        while True:
            body = {"size": 0, "query": query, "aggs": {"pairs": {"composite": composite}}}
            with translated("versions"):
                response = await self._layout.client.search(
                    index=index, body=body, request_timeout=self._layout.config.write_timeout_s
                )
            pairs = response["aggregations"]["pairs"]
            for bucket in pairs["buckets"]:
                yield str(bucket["key"]["doc_id"]), str(bucket["key"]["hash"])
            if "after_key" not in pairs or not pairs["buckets"]:
                return
            composite["after"] = pairs["after_key"]


def _swap(alias: str, serving: str, other: str, role: str) -> list[Json]:
    """One `_aliases` call: `other` serves, `serving` becomes the previous version."""
    return [
        {"remove": {"index": serving, "alias": alias}},
        {"remove": {"index": other, "alias": role_alias(alias, role)}},
        {"add": {"index": other, "alias": alias}},
        {"add": {"index": serving, "alias": role_alias(alias, PREVIOUS)}},
    ]


def _unique(hits: list[Json]) -> list[StoredSource]:
    """One source per document (two writers' versions can both be visible for a moment)."""
    found: dict[str, StoredSource] = {}
    for hit in hits:
        s = hit["_source"]
        groups = tuple(sorted(s["groups"])) if s.get("groups") else None
        source = StoredSource(
            s["doc_id"],
            s["title"],
            s["document_text"],
            s["content_hash"],
            groups,
            s.get("source", ""),
        )
        found.setdefault(s["doc_id"], source)
    return list(found.values())
