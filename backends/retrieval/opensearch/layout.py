"""The retriever's indices in the cluster: template, aliases, versions, meta index, pipeline.

Layout in the cluster, all named from `OpenSearchConfig.alias` (say `qg`):
- `tenancy: index_per_tenant` (the default): each tenant has its own alias `qg-t<hash>` over one
  physical index `qg-t<hash>-v<N>`, created by the tenant's first write, so BM25's statistics
  (and the HNSW graph) hold that tenant's chunks only: nothing another tenant stores moves its
  ranking. `tenancy: shared`: one alias `qg` over `qg-v<N>` for every tenant; scales to any
  number of tenants, but BM25's document frequencies count every tenant's chunks, which lets a
  tenant probe whether a word occurs in others' documents (see docs/opensearch.md).
- a reindex builds `<alias>-v<N+1>` aside, behind `<alias>-next`, and swaps the alias in one
  atomic `_aliases` call, so readers never see a half-built index (`versions`, `targets`).
- an index template `qg` (patterns `qg-v*`, `qg-t*`) carries settings and mappings for every
  version.
- `qg-meta` holds one document per tenant with its generation counter.
- `qg-rrf` is the server-side RRF search pipeline, created only when neural-search is installed.
  Server-side min-max needs none: each request carries its own (temporary) pipeline, since its
  weights are per query.

With `tenancy: index_per_tenant`, `ensure_index` refuses to start while the shared alias (the
`shared` layout) still holds chunks: serving would start every tenant empty (`migrate.py`
moves them, `querygate --config CONFIG opensearch migrate-tenancy`).
"""

from __future__ import annotations

import asyncio
import logging

from opensearchpy.exceptions import NotFoundError, TransportError

from backends.errors import BackendUnavailable, UpstreamError
from backends.retrieval.base import Vector
from backends.retrieval.opensearch.client import (
    BACKEND,
    Json,
    error_type,
    open_client,
    translated,
)
from backends.retrieval.opensearch.config import OpenSearchConfig
from backends.retrieval.opensearch.queries import VISIBLE, fusion_path, rrf_pipeline

log = logging.getLogger(__name__)

# Tokens for the `.ids` subfields: runs of letters/digits/_ joined by inner `-` or `.`, so
# "ERR-4471", "v1.2.3" and "SKU_88" stay whole instead of being split by the standard tokenizer.
_IDENTIFIER_PATTERN = r"[^\p{L}\p{N}_.\-]+|(?<![\p{L}\p{N}_])[.\-]+|[.\-]+(?![\p{L}\p{N}_])"
# Per tenant: the generation, and when it last moved (unix seconds: the index's freshness).
_META_PROPERTIES: Json = {"generation": {"type": "long"}, "changed_at": {"type": "double"}}
_META_MAPPINGS: Json = {"dynamic": "strict", "properties": _META_PROPERTIES}
# Fields added since the first layout, put on indices made before them.
_ADDED_FIELDS: Json = {
    "pending": {"type": "boolean"},
    # The document's access list (absent: every user of the tenant may read it).
    "groups": {"type": "keyword"},
    # Where the document was ingested from (`querygate ingest --prune`).
    "source": {"type": "keyword"},
    # A document's text, on its first chunk: kept for a reindex, never searched; `has_text`
    # finds that chunk (an unindexed field matches no query).
    "document_text": {"type": "text", "index": False},
    "has_text": {"type": "boolean"},
}


class SharedChunksNotMigrated(UpstreamError):
    """`tenancy: index_per_tenant` over a cluster whose shared alias still holds chunks.

    Serving would start every tenant empty (and /readyz green), so the retriever refuses."""

    def __init__(self, alias: str, chunks: int) -> None:
        super().__init__(
            BACKEND,
            f"tenancy is index_per_tenant but the shared alias {alias!r} holds {chunks} chunks "
            "(written with tenancy: shared); every tenant would start empty. Either set "
            "retrieval.opensearch.tenancy: shared to keep serving them, or move them with "
            "`querygate --config CONFIG opensearch migrate-tenancy` (gateways "
            "stopped; idempotent, resumable), or delete that alias's indices and re-ingest",
        )
        self.alias = alias
        self.chunks = chunks


def index_template(config: OpenSearchConfig) -> Json:
    """Settings and mappings for every `<alias>-v<N>` index.

    The k-NN engine is set explicitly: the plugin's default is faiss, whose native libraries the
    Maven-published k-NN zip does not ship, so a faiss field would fail at indexing time.
    """
    ids: Json = {"ids": {"type": "text", "analyzer": "qg_identifier"}}
    raw: Json = {"raw": {"type": "keyword", "ignore_above": 512}}
    return {
        "index_patterns": [f"{config.alias}-v*", f"{config.alias}-t*"],
        "template": {
            "settings": {
                "index": {
                    "knn": True,
                    "number_of_shards": config.number_of_shards,
                    "number_of_replicas": config.number_of_replicas,
                    "refresh_interval": config.refresh_interval,
                },
                "analysis": {
                    "tokenizer": {
                        "qg_identifier": {"type": "pattern", "pattern": _IDENTIFIER_PATTERN}
                    },
                    "analyzer": {
                        "qg_identifier": {
                            "type": "custom",
                            "tokenizer": "qg_identifier",
                            "filter": ["lowercase"],
                        }
                    },
                },
            },
            "mappings": {
                "dynamic": "strict",
                "properties": {
                    "tenant": {"type": "keyword"},
                    "doc_id": {"type": "keyword"},
                    "chunk_id": {"type": "keyword"},
                    "content_hash": {"type": "keyword"},
                    "generation": {"type": "long"},
                    **_ADDED_FIELDS,
                    "title": {"type": "text", "analyzer": "english", "fields": {**ids, **raw}},
                    "section": {"type": "text", "analyzer": "english"},
                    "text": {"type": "text", "analyzer": "english", "fields": ids},
                    "embedding": {
                        "type": "knn_vector",
                        "dimension": config.dimension,
                        "method": {
                            "name": "hnsw",
                            "engine": "lucene",
                            "space_type": "cosinesimil",
                            "parameters": {
                                "m": config.hnsw_m,
                                "ef_construction": config.hnsw_ef_construction,
                            },
                        },
                    },
                },
            },
        },
    }


class IndexLayout:
    """One retriever's client and the indices it addresses; created on first use."""

    def __init__(self, config: OpenSearchConfig) -> None:
        self.config = config
        self.client = open_client(config)
        # Whether the node has neural-search (None: not asked yet); `server_side_fusion` decides.
        self.neural_search: bool | None = None
        # Per-tenant aliases known to exist (index_per_tenant); they are never removed but by
        # drop_all.
        self._tenant_aliases: set[str] = set()
        self._ready = False
        self._ready_lock = asyncio.Lock()

    async def aclose(self) -> None:
        await self.client.close()

    async def ensure_index(self) -> None:
        """Create the template, the first index version, the alias and the meta index if absent.

        Safe to run from every gateway replica at once: each step is idempotent. Raises
        `SharedChunksNotMigrated` (before creating anything) when tenancy is index_per_tenant
        and the shared layout's alias still holds chunks.
        """
        await self._refuse_unmigrated_shared()
        await self.bootstrap()
        self.mark_ready()

    def mark_ready(self) -> None:
        self._ready = True

    async def ensure_ready(self) -> None:
        """Run `ensure_index` once, on first use: the gateway needs no separate bootstrap step."""
        if self._ready:
            return
        async with self._ready_lock:
            if not self._ready:
                await self.ensure_index()

    async def _refuse_unmigrated_shared(self) -> None:
        """index_per_tenant must not start over chunks still behind the shared alias."""
        if self.config.tenancy != "index_per_tenant":
            return
        chunks = await self.shared_chunk_count()
        if chunks:
            raise SharedChunksNotMigrated(self.config.alias, chunks)

    async def shared_chunk_count(self) -> int:
        """Chunks readers of the `shared` layout would see (hidden leftovers do not count)."""
        alias = self.config.alias
        with translated("ensure_index"):
            if not await self.client.indices.exists_alias(name=alias):
                return 0
            response = await self.client.count(
                index=alias, body={"query": VISIBLE}, ignore_unavailable=True
            )
        return int(response["count"])

    async def bootstrap(self) -> None:
        """Template, mapping additions, the shared alias (shared mode), meta index, pipeline."""
        cfg = self.config
        with translated("ensure_index"):
            # Lookups and the template use the short read timeout, so a hung node fails the first
            # query fast; only index creation gets the write timeout.
            await self.client.indices.put_index_template(name=cfg.alias, body=index_template(cfg))
            # Indices created before a field existed get it (adding one is allowed; their chunks
            # have none, so they are visible, public, of no source (never pruned) and without
            # their text (a reindex refuses them)).
            await self.client.indices.put_mapping(
                index=f"{cfg.alias}-v*,{cfg.alias}-t*",
                body={"properties": _ADDED_FIELDS},
                allow_no_indices=True,
                ignore_unavailable=True,
                request_timeout=cfg.write_timeout_s,
            )
            if cfg.tenancy == "shared":
                await self.create_alias(cfg.alias)
            meta_settings = {
                "number_of_shards": 1,
                "number_of_replicas": cfg.number_of_replicas,
            }
            await self._create_index(
                cfg.meta_index, {"settings": {"index": meta_settings}, "mappings": _META_MAPPINGS}
            )
            await self.client.indices.put_mapping(
                index=cfg.meta_index,
                body={"properties": _META_PROPERTIES},
                request_timeout=cfg.write_timeout_s,
            )
            if await self.server_side():
                await self.client.transport.perform_request(
                    "PUT",
                    f"/_search/pipeline/{cfg.pipeline}",
                    body=rrf_pipeline(),
                    timeout=cfg.write_timeout_s,
                )
        log.info(
            "opensearch hybrid fusion %s: %s",
            cfg.fusion,
            fusion_path(cfg, self.neural_search, cfg.fusion),
            extra={"fusion": cfg.fusion, "server_side": self.neural_search},
        )

    async def server_side(self) -> bool:
        """Whether fusion may run in the node: allowed by `server_side_fusion` and neural-search
        installed (asked once)."""
        if self.config.server_side_fusion == "off":
            return False
        if self.neural_search is None:
            with translated("plugins"):
                plugins = await self.client.cat.plugins(format="json")
            installed = any(p.get("component") == "opensearch-neural-search" for p in plugins)
            if self.config.server_side_fusion == "on" and not installed:
                raise UpstreamError(BACKEND, "server_side_fusion=on but neural-search is missing")
            self.neural_search = installed
        return self.neural_search

    async def create_alias(self, alias: str) -> None:
        """`<alias>-v1` behind `alias`, unless the alias exists. Idempotent under races: the
        index creation tolerates a winner, and adding an existing alias is a no-op."""
        if await self.client.indices.exists_alias(name=alias):
            return
        first = self.config.version_index(1, alias)
        await self._create_index(first)
        await self.client.indices.update_aliases(
            body={"actions": [{"add": {"index": first, "alias": alias}}]},
            request_timeout=self.config.write_timeout_s,
        )

    def remember_tenant_alias(self, alias: str) -> None:
        self._tenant_aliases.add(alias)

    async def writable(self, tenant: str) -> str:
        """The tenant's alias, its index created on the tenant's first write."""
        await self.ensure_ready()
        alias = self.config.tenant_alias(tenant)
        if self.config.tenancy == "shared" or alias in self._tenant_aliases:
            return alias
        with translated("ensure_tenant_index"):
            await self.create_alias(alias)
            # A concurrent first write may have found the index created but its shard not yet
            # started (searches then fail with 503): wait for it, once per tenant and process.
            await self.client.cluster.health(
                index=alias,
                wait_for_status="yellow",
                # 2.19 reports a new index yellow while its one primary is still initializing.
                wait_for_no_initializing_shards=True,
                params={"timeout": f"{int(self.config.write_timeout_s * 1000)}ms"},
                request_timeout=self.config.write_timeout_s + 1,
            )
        self.remember_tenant_alias(alias)
        return alias

    async def _create_index(self, name: str, body: Json | None = None) -> None:
        if await self.client.indices.exists(index=name):
            return
        try:
            await self.client.indices.create(
                index=name, body=body or {}, request_timeout=self.config.write_timeout_s
            )
        except TransportError as exc:
            # Another replica of the gateway won the race to create it: that is the goal anyway.
            if error_type(exc) != "resource_already_exists_exception":
                raise

    async def drop_all(self) -> None:
        """Delete every index, template and pipeline of this alias (tests, teardown)."""
        cfg = self.config
        self._ready = False
        self._tenant_aliases.clear()
        with translated("drop_all"):
            await self.client.indices.delete(
                index=f"{cfg.alias}-v*,{cfg.alias}-t*,{cfg.meta_index}",
                ignore_unavailable=True,
                request_timeout=cfg.write_timeout_s,
            )
            await self.client.indices.delete_index_template(
                name=cfg.alias, ignore=[404], request_timeout=cfg.write_timeout_s
            )
            if await self.server_side():
                await self.client.transport.perform_request(
                    "DELETE", f"/_search/pipeline/{cfg.pipeline}", params={"ignore": 404}
                )

    async def ping(self) -> str | None:
        """The index every request needs red (a shard with no copy serving): unavailable. Any
        index of the layout short of a replica (yellow, e.g. a node down; or a tenant's index
        red): serving, said in the note."""
        await self.ensure_ready()
        # The shared index, or (index_per_tenant) the meta index every write goes through.
        index = self.config.alias if self.config.tenancy == "shared" else self.config.meta_index
        with translated("ping"):
            try:
                health = await self.client.cluster.health(index=index)
            except NotFoundError as exc:
                raise BackendUnavailable(BACKEND, f"index {index} missing") from exc
        if health["status"] == "red":
            raise BackendUnavailable(BACKEND, f"index {index} is red")
        # Every index of this layout (`<alias>-*`: the meta index, each version, each tenant's):
        # one short of a replica is a note. (A name that matches no index would make the call
        # wait for one; a pattern that matches none answers at once.)
        with translated("ping"):
            ours = await self.client.cluster.health(index=f"{self.config.alias}-*")
        if ours["status"] == "green":
            return None
        return f"{ours['unassigned_shards']} shard copies unassigned ({ours['status']})"

    def check_vector(self, vector: Vector) -> None:
        """Refuse a vector the mapping's `knn_vector` would not hold."""
        if vector.shape != (self.config.dimension,):
            raise ValueError(f"vector shape {vector.shape} != ({self.config.dimension},)")

    # -- index versions ----------------------------------------------------------------------

    def _versioned_alias(self, tenant: str | None) -> str:
        """The alias `current_index`/`drop_index` act on."""
        if self.config.tenancy == "shared":
            return self.config.alias
        if tenant is None:
            raise ValueError("tenancy is index_per_tenant: name the tenant whose index to use")
        return self.config.tenant_alias(tenant)

    async def current_index(self, tenant: str | None = None) -> str:
        """The physical index the alias (shared, or the tenant's) points at now."""
        alias = self._versioned_alias(tenant)
        with translated("current_index"):
            aliases = await self.client.indices.get_alias(name=alias)
        return str(next(iter(aliases)))

    async def drop_index(self, index: str, tenant: str | None = None) -> None:
        if index == await self.current_index(tenant):
            raise ValueError(f"{index} is live behind {self._versioned_alias(tenant)}")
        with translated("drop_index"):
            await self.client.indices.delete(
                index=index, request_timeout=self.config.write_timeout_s
            )
