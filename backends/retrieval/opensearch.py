"""OpenSearch hybrid retriever: BM25 + k-NN (lucene HNSW), tenant filter inside both arms, fused.

Layout in the cluster, all named from `OpenSearchConfig.alias` (say `qg`):
- `tenancy: index_per_tenant` (the default): each tenant has its own alias `qg-t<hash>` over one
  physical index `qg-t<hash>-v<N>`, created by the tenant's first write, so BM25's statistics
  (and the HNSW graph) hold that tenant's chunks only: nothing another tenant stores moves its
  ranking. `tenancy: shared`: one alias `qg` over `qg-v<N>` for every tenant; scales to any
  number of tenants, but BM25's document frequencies count every tenant's chunks, which lets a
  tenant probe whether a word occurs in others' documents (see docs/opensearch.md).
- `rebuild_index` builds `<alias>-v<N+1>` aside and swaps the alias in one atomic `_aliases`
  call, so readers never see a half-built index.
- an index template `qg` (patterns `qg-v*`, `qg-t*`) carries settings and mappings for every
  version.
- `qg-meta` holds one document per tenant with its generation counter.
- `qg-rrf` is the server-side RRF search pipeline, created only when neural-search is installed.
  Server-side min-max needs none: each request carries its own (temporary) pipeline, since its
  weights are per query.

Fusion runs server-side (one hybrid query) when neural-search is installed and
`server_side_fusion` allows it, for `rrf` with equal weights and for `minmax` (normalization-
processor: min_max + weighted arithmetic_mean, ranking as `base.fuse` does); everything else,
including the default `minmax_peak` (its weights read both arms' scores first), fuses
client-side with `base.fuse` over one `_msearch`. Which path each method takes is decided at
start-up and logged (`fusion_path`).

Writes replace a document whole, with a short window (docs/opensearch.md, "Writes"): a new
version's chunks are indexed hidden (`pending: true`, under `_id`s that include its content hash,
so they never overwrite the old version's), then one `_bulk` per document (the flip) un-hides them
and deletes every other chunk of the document. A `_bulk` is applied item by item, not as a
transaction: a scheduled refresh that lands while the flip runs shows readers old and new chunks
together (or a document short of some chunks) until the flip's own refresh, milliseconds later.
Two processes writing one document at once can both flip; each then settles the document on one
deterministic winner (highest flip stamp, then content hash) and deletes the other's visible
chunks, so both versions are visible only between the second flip and its settling. A document
counts as stored with hash H only when every chunk it has is visible and carries H, so a write
that failed anywhere is written again by a retry, never "unchanged"; a retry that finds the
flip applied but its generation bump lost makes the bump.

With `tenancy: index_per_tenant`, `ensure_index` refuses to start while the shared alias (the
`shared` layout) still holds chunks: serving would start every tenant empty.
`migrate_shared_to_per_tenant` (`python -m backends.retrieval.opensearch migrate-tenancy CONFIG`)
moves them, tenant by tenant, idempotently and resumably.

Every call has a bounded timeout and no transport retries, so a down or slow node surfaces as
`BackendUnavailable` quickly; only bulk writes retry (bounded) on 429/5xx.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import re
import unicodedata
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from opensearchpy import AsyncOpenSearch
from opensearchpy.exceptions import ConnectionError as OSConnectionError
from opensearchpy.exceptions import NotFoundError, TransportError
from pydantic import AliasChoices, BaseModel, Field, field_validator
from tenacity import (
    AsyncRetrying,
    retry_if_exception_type,
    stop_after_attempt,
    wait_exponential,
)

from backends.errors import BackendUnavailable, UpstreamError
from backends.retrieval.base import (
    DEFAULT_FUSION,
    RRF_K,
    ArmRanking,
    Document,
    FusionMethod,
    Hit,
    SearchRequest,
    Vector,
    document_chunk_limit,
    fuse,
    refuse_empty,
)
from backends.retrieval.stopwords import without_stopwords
from backends.sections import SECTION

BACKEND = "opensearch"
Json = dict[str, Any]
log = logging.getLogger(__name__)

# Tokens for the `.ids` subfields: runs of letters/digits/_ joined by inner `-` or `.`, so
# "ERR-4471", "v1.2.3" and "SKU_88" stay whole instead of being split by the standard tokenizer.
_IDENTIFIER_PATTERN = r"[^\p{L}\p{N}_.\-]+|(?<![\p{L}\p{N}_])[.\-]+|[.\-]+(?![\p{L}\p{N}_])"
_FIELD_SPEC = re.compile(r"^[A-Za-z_][\w.]*(\^\d+(\.\d+)?)?$")
_CONTROL_OR_SPACE = re.compile(r"[\s\x00-\x1f\x7f]+")
# A document's chunks are listed in one search page when a new version replaces them.
MAX_CHUNKS_PER_DOCUMENT = 10_000
# Operations per un-hide (flip) request; a document's flip is never split across two.
_FLIP_BATCH = 5000
# Hex digits of the tenant hash in per-tenant index names (96 bits).
_TENANT_HASH = 24
# Readers never see a chunk of a version whose write has not finished.
_VISIBLE: Json = {"bool": {"must_not": {"term": {"pending": True}}}}
# Documents per stored-state lookup, and hits per page of it.
_LOOKUP_DOCS = 500
_LOOKUP_PAGE = 1000
# The seam's reading order. `chunk_id` is a keyword, which sorts #10 before #9; a script sort
# needs no mapping change, and it only runs over the one document's chunks.
_READING_ORDER: list[Json] = [
    {
        "_script": {
            "type": "number",
            "script": {
                "lang": "painless",
                "source": (
                    "String id = doc['chunk_id'].value;"
                    " String n = id.substring(id.lastIndexOf('#') + 1);"
                    " try { return Long.parseLong(n); }"
                    " catch (NumberFormatException e) { return Long.MAX_VALUE; }"
                ),
            },
        }
    },
    {"chunk_id": "asc"},
]
_META_MAPPINGS: Json = {"dynamic": "strict", "properties": {"generation": {"type": "long"}}}


class OpenSearchConfig(BaseModel):
    """Connection, index layout and query settings of the OpenSearch retriever."""

    model_config = SECTION

    hosts: tuple[str, ...] = ("http://127.0.0.1:9200",)
    alias: str = Field(default="querygate-chunks", pattern=r"^[a-z0-9][a-z0-9_\-]*$")
    dimension: int = Field(default=384, ge=2, le=16000)
    # Reads must fail fast (they sit on the agent's path); writes may take longer.
    search_timeout_s: float = Field(default=2.0, gt=0, le=60)
    write_timeout_s: float = Field(default=30.0, gt=0, le=600)
    max_connections: int = Field(default=20, ge=1, le=1000)
    bulk_batch_size: int = Field(default=500, ge=1, le=10000)
    bulk_max_attempts: int = Field(default=3, ge=1, le=10)
    refresh_interval: str = Field(default="1s", pattern=r"^(-1|\d+(ms|s|m))$")
    # How a write becomes visible before it returns. "true" refreshes at once: ~40 ms per document
    # here, at the cost of small segments that merges absorb. "wait_for" rides the next scheduled
    # refresh: cheaper under heavy concurrent ingest, but up to refresh_interval (~1 s) per call,
    # which makes a sequential ingest of 100 documents take 100 s instead of 5 s.
    write_refresh: Literal["wait_for", "true"] = "true"
    number_of_shards: int = Field(default=1, ge=1)
    number_of_replicas: int = Field(default=0, ge=0)
    hnsw_m: int = Field(default=16, ge=2, le=100)
    hnsw_ef_construction: int = Field(default=128, ge=2, le=4096)
    # Fuse in the node (one hybrid query) where neural-search is installed: "auto" (detected at
    # start, and logged), "on" (refuse to start without it), "off". Applies to "rrf" with equal
    # weights and "minmax"; the server-side path's hits carry no per-arm ranks or scores.
    # `use_server_side_rrf`, its former name, is still read.
    server_side_fusion: Literal["auto", "on", "off"] = Field(
        default="auto", validation_alias=AliasChoices("server_side_fusion", "use_server_side_rrf")
    )
    # How hybrid search fuses its arms when a request does not say (`retrieval.fusion` sets it).
    # Client-side it is `backends.retrieval.base.fuse`, the embedded index's own function
    # (docs/opensearch.md, "Fusion").
    fusion: FusionMethod = DEFAULT_FUSION
    fields: tuple[str, ...] = ("title^2", "title.ids^2", "section", "text", "text.ids^1.5")
    max_query_chars: int = Field(default=2000, ge=1, le=100_000)
    # Lucene caps the clauses of a whole query (1024 by default); terms x fields must stay below.
    max_query_terms: int = Field(default=64, ge=1, le=1024)
    # Whose chunks BM25's statistics count. "index_per_tenant": one index per tenant, so another
    # tenant's documents never change a tenant's ranking; each costs a shard (plus replicas), and
    # a node holds about 1,000 (cluster.max_shards_per_node), so it suits up to hundreds of
    # tenants per data node. "shared": one index for every tenant, for many small tenants who
    # accept that term statistics are shared (a tenant can test whether a word occurs in other
    # tenants' documents from the ranking of its own). The default is the isolated one.
    tenancy: Literal["shared", "index_per_tenant"] = "index_per_tenant"

    @field_validator("fields")
    @classmethod
    def _fields_are_plain_names(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        bad = [f for f in value if not _FIELD_SPEC.match(f)]
        if bad or not value:
            raise ValueError(f"fields must be non-empty 'name' or 'name^boost' entries: {bad}")
        return value

    @property
    def meta_index(self) -> str:
        return f"{self.alias}-meta"

    @property
    def pipeline(self) -> str:
        return f"{self.alias}-rrf"

    def tenant_alias(self, tenant: str) -> str:
        """The alias a tenant's chunks live behind: its own, or the shared one."""
        if self.tenancy == "shared":
            return self.alias
        digest = hashlib.sha256(tenant.encode()).hexdigest()[:_TENANT_HASH]
        return f"{self.alias}-t{digest}"

    def version_index(self, version: int, alias: str | None = None) -> str:
        return f"{alias or self.alias}-v{version}"


def normalise_query(text: str, max_chars: int, max_terms: int) -> str:
    """Plain text safe to send as a `match` query; empty when nothing searchable is left.

    `multi_match` never parses Lucene syntax, so `title:(foo OR "bar` is just words; what is left
    to guard against is size (clause limits) and input with no letters or digits at all.
    """
    text = unicodedata.normalize("NFKC", text)[:max_chars]
    words = _CONTROL_OR_SPACE.sub(" ", text).split(" ")
    kept = [w for w in dict.fromkeys(words) if any(ch.isalnum() for ch in w)]
    return " ".join(without_stopwords(kept)[:max_terms])


def chunk_key(tenant: str, doc_id: str, content_hash: str, chunk_id: str) -> str:
    """The OpenSearch `_id` of a chunk: fixed length, distinct per tenant and per version of the
    document by construction, so writing a new version never overwrites the old one's chunks."""
    raw = "\x1f".join((tenant, doc_id, content_hash, chunk_id)).encode()
    return hashlib.sha256(raw).hexdigest()


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
                    "pending": {"type": "boolean"},
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


@contextmanager
def _translated(operation: str) -> Iterator[None]:
    """Turn opensearch-py's exceptions into the backend seam's errors."""
    try:
        yield
    except OSConnectionError as exc:  # includes ConnectionTimeout
        raise BackendUnavailable(BACKEND, f"{operation}: {type(exc).__name__}") from exc
    except TransportError as exc:
        status = exc.status_code
        if isinstance(status, int) and _is_transient(status):
            raise BackendUnavailable(BACKEND, f"{operation}: HTTP {status}") from exc
        raise UpstreamError(BACKEND, f"{operation}: HTTP {status} {exc.error}") from exc


def _is_transient(status: int) -> bool:
    """Overload (429) or a server-side failure: worth a retry, and the caller's 503."""
    return status == 429 or status >= 500


class _RetryableBulk(Exception):
    """Some bulk items were rejected with 429/5xx; `pending` holds them for the next attempt."""

    def __init__(self, pending: list[Json]) -> None:
        super().__init__(f"{len(pending)} bulk lines to retry")
        self.pending = pending


class SharedChunksNotMigrated(UpstreamError):
    """`tenancy: index_per_tenant` over a cluster whose shared alias still holds chunks.

    Serving would start every tenant empty (and /readyz green), so the retriever refuses."""

    def __init__(self, alias: str, chunks: int) -> None:
        super().__init__(
            BACKEND,
            f"tenancy is index_per_tenant but the shared alias {alias!r} holds {chunks} chunks "
            "(written with tenancy: shared); every tenant would start empty. Either set "
            "retrieval.opensearch.tenancy: shared to keep serving them, or move them with "
            "`python -m backends.retrieval.opensearch migrate-tenancy CONFIG` (gateways "
            "stopped; idempotent, resumable), or delete that alias's indices and re-ingest",
        )
        self.alias = alias
        self.chunks = chunks


class _Conflict(Exception):
    """A concurrent writer bumped the generation first; read again and retry."""


@dataclass
class _Stored:
    """A stored document as a write needs it: its chunks' keys, hashes and visibility."""

    chunk_keys: list[str] = field(default_factory=list)
    # Visible chunks' keys by content hash, and the highest flip stamp (the generation the flip
    # expected to produce) among each hash's visible chunks.
    visible: dict[str, list[str]] = field(default_factory=dict)
    stamps: dict[str, int] = field(default_factory=dict)
    hidden_hashes: set[str] = field(default_factory=set)

    @property
    def visible_keys(self) -> set[str]:
        return {key for keys in self.visible.values() for key in keys}

    @property
    def content_hash(self) -> str:
        """The hash of the version readers see whole; "" when what they see is not one whole
        version (a flip that failed part-way), so that a retry writes the document again.
        Hidden chunks of another version (staging that failed) do not count: they are invisible
        and the next write of the document deletes them."""
        if len(self.visible) != 1:
            return ""
        (visible,) = self.visible
        return "" if visible in self.hidden_hashes else visible

    def losers(self) -> list[str]:
        """Visible keys of every version but the winner's (highest stamp, then hash): what
        two writers that both flipped leave, and what settling deletes."""
        if len(self.visible) < 2:
            return []
        winner = max(self.visible, key=lambda h: (self.stamps.get(h, 0), h))
        return [key for h, keys in self.visible.items() if h != winner for key in keys]


class OpenSearchRetriever:
    """`Retriever` over one OpenSearch cluster; one pooled async client per instance."""

    name = "opensearch"

    def __init__(self, config: OpenSearchConfig) -> None:
        self.config = config
        self._client = AsyncOpenSearch(
            hosts=list(config.hosts),
            timeout=config.search_timeout_s,
            maxsize=config.max_connections,
            # Failing fast beats retrying on the caller's latency budget; bulk retries itself.
            max_retries=0,
            retry_on_timeout=False,
        )
        # Whether the node has neural-search (None: not asked yet); `server_side_fusion` decides.
        self._neural_search: bool | None = None
        # Per-tenant aliases known to exist (index_per_tenant); they are never removed but by
        # drop_all.
        self._tenant_aliases: set[str] = set()
        self._ready = False
        self._ready_lock = asyncio.Lock()

    # -- lifecycle ---------------------------------------------------------------------------

    async def __aenter__(self) -> OpenSearchRetriever:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._client.close()

    async def ensure_index(self) -> None:
        """Create the template, the first index version, the alias and the meta index if absent.

        Safe to run from every gateway replica at once: each step is idempotent. Raises
        `SharedChunksNotMigrated` (before creating anything) when tenancy is index_per_tenant
        and the shared layout's alias still holds chunks.
        """
        await self._refuse_unmigrated_shared()
        await self._bootstrap()
        self._ready = True

    async def _refuse_unmigrated_shared(self) -> None:
        """index_per_tenant must not start over chunks still behind the shared alias."""
        if self.config.tenancy != "index_per_tenant":
            return
        chunks = await self._shared_chunk_count()
        if chunks:
            raise SharedChunksNotMigrated(self.config.alias, chunks)

    async def _shared_chunk_count(self) -> int:
        """Chunks readers of the `shared` layout would see (hidden leftovers do not count)."""
        alias = self.config.alias
        with _translated("ensure_index"):
            if not await self._client.indices.exists_alias(name=alias):
                return 0
            response = await self._client.count(
                index=alias, body={"query": _VISIBLE}, ignore_unavailable=True
            )
        return int(response["count"])

    async def _bootstrap(self) -> None:
        """Template, mapping additions, the shared alias (shared mode), meta index, pipeline."""
        cfg = self.config
        with _translated("ensure_index"):
            # Lookups and the template use the short read timeout, so a hung node fails the first
            # query fast; only index creation gets the write timeout.
            await self._client.indices.put_index_template(name=cfg.alias, body=index_template(cfg))
            # Indices created before the `pending` field existed get it (adding one is allowed).
            await self._client.indices.put_mapping(
                index=f"{cfg.alias}-v*,{cfg.alias}-t*",
                body={"properties": {"pending": {"type": "boolean"}}},
                allow_no_indices=True,
                ignore_unavailable=True,
                request_timeout=cfg.write_timeout_s,
            )
            if cfg.tenancy == "shared":
                await self._create_alias(cfg.alias)
            meta_settings = {
                "number_of_shards": 1,
                "number_of_replicas": cfg.number_of_replicas,
            }
            await self._create_index(
                cfg.meta_index, {"settings": {"index": meta_settings}, "mappings": _META_MAPPINGS}
            )
            if await self._server_side():
                await self._client.transport.perform_request(
                    "PUT",
                    f"/_search/pipeline/{cfg.pipeline}",
                    body=_rrf_pipeline(),
                    timeout=cfg.write_timeout_s,
                )
        log.info(
            "opensearch hybrid fusion %s: %s",
            cfg.fusion,
            self.fusion_path(cfg.fusion),
            extra={"fusion": cfg.fusion, "server_side": self._neural_search},
        )

    async def _create_alias(self, alias: str) -> None:
        """`<alias>-v1` behind `alias`, unless the alias exists. Idempotent under races: the
        index creation tolerates a winner, and adding an existing alias is a no-op."""
        if await self._client.indices.exists_alias(name=alias):
            return
        first = self.config.version_index(1, alias)
        await self._create_index(first)
        await self._client.indices.update_aliases(
            body={"actions": [{"add": {"index": first, "alias": alias}}]},
            request_timeout=self.config.write_timeout_s,
        )

    async def _writable(self, tenant: str) -> str:
        """The tenant's alias, its index created on the tenant's first write."""
        await self._ensure_ready()
        alias = self.config.tenant_alias(tenant)
        if self.config.tenancy == "shared" or alias in self._tenant_aliases:
            return alias
        with _translated("ensure_tenant_index"):
            await self._create_alias(alias)
            # A concurrent first write may have found the index created but its shard not yet
            # started (searches then fail with 503): wait for it, once per tenant and process.
            await self._client.cluster.health(
                index=alias,
                wait_for_status="yellow",
                # 2.19 reports a new index yellow while its one primary is still initializing.
                wait_for_no_initializing_shards=True,
                params={"timeout": f"{int(self.config.write_timeout_s * 1000)}ms"},
                request_timeout=self.config.write_timeout_s + 1,
            )
        self._tenant_aliases.add(alias)
        return alias

    async def _ensure_ready(self) -> None:
        """Run `ensure_index` once, on first use: the gateway needs no separate bootstrap step."""
        if self._ready:
            return
        async with self._ready_lock:
            if not self._ready:
                await self.ensure_index()

    async def _create_index(self, name: str, body: Json | None = None) -> None:
        if await self._client.indices.exists(index=name):
            return
        try:
            await self._client.indices.create(
                index=name, body=body or {}, request_timeout=self.config.write_timeout_s
            )
        except TransportError as exc:
            # Another replica of the gateway won the race to create it: that is the goal anyway.
            if _error_type(exc) != "resource_already_exists_exception":
                raise

    async def drop_all(self) -> None:
        """Delete every index, template and pipeline of this alias (tests, teardown)."""
        cfg = self.config
        self._ready = False
        self._tenant_aliases.clear()
        with _translated("drop_all"):
            await self._client.indices.delete(
                index=f"{cfg.alias}-v*,{cfg.alias}-t*,{cfg.meta_index}",
                ignore_unavailable=True,
                request_timeout=cfg.write_timeout_s,
            )
            await self._client.indices.delete_index_template(
                name=cfg.alias, ignore=[404], request_timeout=cfg.write_timeout_s
            )
            if await self._server_side():
                await self._client.transport.perform_request(
                    "DELETE", f"/_search/pipeline/{cfg.pipeline}", params={"ignore": 404}
                )

    # -- index versions ----------------------------------------------------------------------

    def _versioned_alias(self, tenant: str | None) -> str:
        """The alias `current_index`/`rebuild_index`/`drop_index` act on."""
        if self.config.tenancy == "shared":
            return self.config.alias
        if tenant is None:
            raise ValueError("tenancy is index_per_tenant: name the tenant whose index to use")
        return self.config.tenant_alias(tenant)

    async def current_index(self, tenant: str | None = None) -> str:
        """The physical index the alias (shared, or the tenant's) points at now."""
        alias = self._versioned_alias(tenant)
        with _translated("current_index"):
            aliases = await self._client.indices.get_alias(name=alias)
        return str(next(iter(aliases)))

    async def migrate_shared_to_per_tenant(self, timeout_s: float = 3600.0) -> dict[str, int]:
        """Move every tenant's chunks from the shared alias into the tenant's own index.

        For index_per_tenant, with every gateway on this alias stopped (a `shared` gateway
        writing meanwhile could lose its write). Per tenant: `_reindex` its visible chunks
        (term filter) into its current index under the same `_id`s, then delete the tenant's
        chunks from the shared index; at the end the emptied shared indices and alias go. Each
        step overwrites or deletes by id, so a run that stopped anywhere is finished by running
        it again. Generations are kept: the content readers see does not change.
        Returns the chunks copied per tenant.
        """
        cfg = self.config
        if cfg.tenancy != "index_per_tenant":
            raise ValueError("migrate_shared_to_per_tenant needs tenancy: index_per_tenant")
        await self._bootstrap()
        copied: dict[str, int] = {}
        while tenants := await self._shared_tenants():
            for tenant in tenants:
                if tenant in copied:
                    raise UpstreamError(BACKEND, f"migration: chunks of {tenant!r} came back")
                copied[tenant] = await self._migrate_tenant(tenant, timeout_s)
        with _translated("migrate"):
            if await self._client.indices.exists_alias(name=cfg.alias):
                behind = await self._client.indices.get_alias(name=cfg.alias)
                # Hidden leftovers of failed writes are all that can remain: nobody reads them.
                await self._client.indices.delete(
                    index=",".join(behind), request_timeout=cfg.write_timeout_s
                )
        self._ready = True
        return copied

    async def _shared_tenants(self, page: int = 100) -> list[str]:
        """Up to `page` tenants with visible chunks behind the shared alias."""
        if not await self._shared_chunk_count():
            return []
        body = {
            "size": 0,
            "query": _VISIBLE,
            "aggs": {"tenants": {"terms": {"field": "tenant", "size": page}}},
        }
        with _translated("migrate"):
            response = await self._client.search(index=self.config.alias, body=body)
        return [str(b["key"]) for b in response["aggregations"]["tenants"]["buckets"]]

    async def _migrate_tenant(self, tenant: str, timeout_s: float) -> int:
        cfg = self.config
        with _translated("migrate"):
            await self._create_alias(cfg.tenant_alias(tenant))
            self._tenant_aliases.add(cfg.tenant_alias(tenant))
            dest = await self.current_index(tenant)
            query: Json = {"bool": {"filter": [{"term": {"tenant": tenant}}, _VISIBLE]}}
            done = await self._client.reindex(
                body={"source": {"index": cfg.alias, "query": query}, "dest": {"index": dest}},
                refresh=True,
                wait_for_completion=True,
                request_timeout=timeout_s,
            )
            if done.get("failures"):
                raise UpstreamError(BACKEND, f"migration of a tenant: {done['failures'][:1]}")
            await self._client.delete_by_query(
                index=cfg.alias,
                body={"query": {"term": {"tenant": tenant}}},
                refresh=True,
                conflicts="proceed",
                request_timeout=timeout_s,
            )
        return int(done["total"])

    async def rebuild_index(self, tenant: str | None = None) -> tuple[str, str]:
        """Copy the live index into a new version (current template) and swap the alias to it.

        Returns (new index, old index). The old index is left in place so queries already running
        against it finish; drop it with `drop_index` once drained. Writes made while the copy runs
        land in the old index only, so callers pause ingestion around a rebuild.
        """
        await self._ensure_ready()
        cfg = self.config
        alias = self._versioned_alias(tenant)
        old = await self.current_index(tenant)
        new = cfg.version_index(int(old.rsplit("-v", 1)[1]) + 1, alias)
        with _translated("rebuild_index"):
            await self._create_index(new)
            await self._client.reindex(
                body={"source": {"index": old}, "dest": {"index": new}},
                refresh=True,
                wait_for_completion=True,
                request_timeout=cfg.write_timeout_s,
            )
            await self._client.indices.update_aliases(
                body={
                    "actions": [
                        {"remove": {"index": old, "alias": alias}},
                        {"add": {"index": new, "alias": alias}},
                    ]
                },
                request_timeout=cfg.write_timeout_s,
            )
        return new, old

    async def drop_index(self, index: str, tenant: str | None = None) -> None:
        if index == await self.current_index(tenant):
            raise ValueError(f"{index} is live behind {self._versioned_alias(tenant)}")
        with _translated("drop_index"):
            await self._client.indices.delete(
                index=index, request_timeout=self.config.write_timeout_s
            )

    # -- reads -------------------------------------------------------------------------------

    async def search(self, request: SearchRequest) -> list[Hit]:
        await self._ensure_ready()
        self._check_vector(request.vector)
        text = normalise_query(
            request.text, self.config.max_query_chars, self.config.max_query_terms
        )
        bm25 = self._bm25_body(request, text) if text and request.mode != "dense" else None
        dense = self._knn_body(request) if request.mode != "bm25" else None
        method = request.fusion or self.config.fusion
        if bm25 and dense and _server_fusable(method, request) and await self._server_side():
            return await self._search_server_side(request, text, method)
        return await self._search_client_side(request, bm25, dense)

    def fusion_path(self, method: FusionMethod) -> str:
        """Where hybrid search with `method` fuses, and why: what start-up logs. Known once
        the node was asked for its plugins (`ensure_index`)."""
        if method not in ("rrf", "minmax"):
            why = {
                "minmax_peak": "its weights read both arms' scores before fusing",
                "zscore": "neural-search's z_score differs from base.fuse on missed documents",
            }
            return f"client-side, one _msearch ({why.get(method, method)})"
        if self.config.server_side_fusion == "off":
            return "client-side, one _msearch (server_side_fusion: off)"
        if not self._neural_search:
            return "client-side, one _msearch (neural-search is not installed on the node)"
        if method == "rrf":
            return (
                "server-side with equal weights (hybrid query + score-ranker-processor rrf), "
                "client-side otherwise"
            )
        return (
            "server-side (hybrid query + normalization-processor min_max, weighted arithmetic_mean)"
        )

    async def _search_client_side(
        self, request: SearchRequest, bm25: Json | None, dense: Json | None
    ) -> list[Hit]:

        arms = [(name, body) for name, body in (("bm25", bm25), ("dense", dense)) if body]
        if not arms:
            return []
        lines: list[Json] = []
        index = self.config.tenant_alias(request.tenant)
        for _, body in arms:
            # A tenant without an index yet (index_per_tenant) has no hits, not an error.
            lines += [{"index": index, "ignore_unavailable": True}, body]
        with _translated("search"):
            response = await self._client.msearch(body=lines)
        ranked = {
            name: _arm_hits(res) for (name, _), res in zip(arms, response["responses"], strict=True)
        }
        weights = {"bm25": request.lexical_weight, "dense": request.dense_weight}
        rankings = [
            ArmRanking([h["_id"] for h in hits], [float(h["_score"]) for h in hits], weights[name])
            for name, hits in ranked.items()
        ]
        fused = fuse(rankings, request.fusion or self.config.fusion)
        return _best_first(_to_hits(fused, ranked))[: request.k]

    async def _search_server_side(
        self, request: SearchRequest, text: str, method: FusionMethod
    ) -> list[Hit]:
        body: Json = {
            # The whole fused list, cut to k after the contract's tie order (chunk id): with
            # size k the node cuts equal scores by its own doc order, and the k-th hit could
            # differ from the client-side path's (8 of 300 held-out FanOutQA queries did).
            "size": max(request.k, request.candidates),
            "_source": {"excludes": ["embedding"]},
            "query": {
                "hybrid": {
                    # Both arms rank `candidates` deep before fusion, as on the client-side path.
                    "pagination_depth": request.candidates,
                    "queries": [
                        self._bm25_body(request, text)["query"],
                        self._knn_body(request)["query"],
                    ],
                }
            },
        }
        params = {"ignore_unavailable": "true"}
        scale = 1.0
        if method == "rrf":
            params["search_pipeline"] = self.config.pipeline
        else:
            weights = request.lexical_weight + request.dense_weight
            body["search_pipeline"] = _minmax_pipeline(
                request.lexical_weight / weights, request.dense_weight / weights
            )
            # The node returns the weighted mean; `fuse` the weighted sum over rrf_k + 1.
            scale = weights / (RRF_K + 1)
        with _translated("search"):
            response = await self._client.search(
                index=self.config.tenant_alias(request.tenant), body=body, params=params
            )
        raw = response["hits"]["hits"]
        fused = [(h["_id"], float(h["_score"]) * scale) for h in raw]
        hits = _best_first(_to_hits(fused, {"server": raw}))[: request.k]
        keys = {h["_source"]["chunk_id"]: str(h["_id"]) for h in raw}
        return await self._with_cosines(request, hits, keys)

    async def _with_cosines(
        self, request: SearchRequest, hits: list[Hit], keys: Mapping[str, str]
    ) -> list[Hit]:
        """Fused in the node, hits come back without their arms' scores, but the sufficiency
        grade reads the best cosine (at 0 it escalates every lookup) and the agent's relevance
        filter reads each hit's. One exact script_score over just these k chunks fills them in."""
        if not hits:
            return hits
        body: Json = {
            "size": len(hits),
            "_source": False,
            "query": {
                "script_score": {
                    "query": {
                        "bool": {
                            "filter": [
                                {"term": {"tenant": request.tenant}},
                                {"ids": {"values": [keys[h.chunk_id] for h in hits]}},
                            ]
                        }
                    },
                    # script_score refuses negative scores: 1 + cos, taken back below.
                    "script": {
                        "source": "1.0 + cosineSimilarity(params.vector, doc['embedding'])",
                        "params": {"vector": request.vector.astype(float).tolist()},
                    },
                }
            },
        }
        with _translated("search"):
            response = await self._client.search(
                index=self.config.tenant_alias(request.tenant),
                body=body,
                params={"ignore_unavailable": "true"},
            )
        cosine = {str(h["_id"]): float(h["_score"]) - 1.0 for h in response["hits"]["hits"]}
        return [replace(h, dense_score=cosine.get(keys[h.chunk_id])) for h in hits]

    def _bm25_body(self, request: SearchRequest, text: str) -> Json:
        return {
            "size": request.candidates,
            "_source": {"excludes": ["embedding"]},
            "query": {
                "bool": {
                    "must": {"multi_match": {"query": text, "fields": list(self.config.fields)}},
                    "filter": [{"term": {"tenant": request.tenant}}, _VISIBLE],
                }
            },
        }

    def _knn_body(self, request: SearchRequest) -> Json:
        return {
            "size": request.candidates,
            "_source": {"excludes": ["embedding"]},
            "query": {
                "knn": {
                    "embedding": {
                        "vector": request.vector.astype(float).tolist(),
                        "k": request.candidates,
                        # Efficient filtering: HNSW search restricted to the tenant's documents,
                        # so a k-NN arm never comes back short or with another tenant's chunk.
                        "filter": {
                            "bool": {"filter": [{"term": {"tenant": request.tenant}}, _VISIBLE]}
                        },
                    }
                }
            },
        }

    async def document_chunks(self, tenant: str, doc_id: str, limit: int = 50) -> list[Hit]:
        await self._ensure_ready()
        body = {
            "size": document_chunk_limit(limit),
            "_source": {"excludes": ["embedding"]},
            "query": _doc_filter(tenant, doc_id, visible_only=True),
            "sort": _READING_ORDER,
        }
        with _translated("document_chunks"):
            response = await self._client.search(
                index=self.config.tenant_alias(tenant), body=body, ignore_unavailable=True
            )
        return [_read_hit(h["_source"]) for h in response["hits"]["hits"]]

    async def content_hash(self, tenant: str, doc_id: str) -> str | None:
        return (await self.content_hashes(tenant, [doc_id])).get(doc_id)

    async def content_hashes(self, tenant: str, doc_ids: Sequence[str]) -> dict[str, str]:
        stored = await self._stored(tenant, doc_ids)
        # Idempotent ingest skips what this reports as stored: a flip that landed with its bump
        # lost must not be skipped with answers of the old content still cached.
        await self._bump_if_behind(tenant, list(stored.values()))
        # A document none of whose chunks readers see (a delete that failed part-way) is absent.
        return {
            doc_id: entry.content_hash for doc_id, entry in stored.items() if entry.visible_keys
        }

    async def generation(self, tenant: str) -> int:
        await self._ensure_ready()
        doc = await self._meta_doc(tenant)
        return int(doc["_source"]["generation"]) if doc else 0

    async def _meta_doc(self, tenant: str) -> Json | None:
        with _translated("generation"):
            # ignore=404: a tenant without changes is normal, not a warning in the client's log.
            doc = await self._client.get(index=self.config.meta_index, id=tenant, ignore=404)
        return doc if doc.get("found") else None

    async def stats(self, tenant: str) -> tuple[int, int]:
        await self._ensure_ready()
        body = {
            "size": 0,
            "track_total_hits": True,
            "query": {"bool": {"filter": [{"term": {"tenant": tenant}}, _VISIBLE]}},
            # Exact below the precision threshold, which is the most OpenSearch allows.
            "aggs": {"docs": {"cardinality": {"field": "doc_id", "precision_threshold": 40000}}},
        }
        with _translated("stats"):
            response = await self._client.search(
                index=self.config.tenant_alias(tenant), body=body, ignore_unavailable=True
            )
        # No aggregations at all when the tenant has no index yet.
        docs = response.get("aggregations", {}).get("docs", {}).get("value", 0)
        return int(docs), int(response["hits"]["total"]["value"])

    async def ping(self) -> None:
        await self._ensure_ready()
        # The shared index, or (index_per_tenant) the meta index every write goes through.
        index = self.config.alias if self.config.tenancy == "shared" else self.config.meta_index
        with _translated("ping"):
            try:
                health = await self._client.cluster.health(index=index)
            except NotFoundError as exc:
                raise BackendUnavailable(BACKEND, f"index {index} missing") from exc
        if health["status"] == "red":
            raise BackendUnavailable(BACKEND, f"index {index} is red")

    # -- writes ------------------------------------------------------------------------------

    async def upsert_document(self, tenant: str, document: Document) -> bool:
        return (await self.upsert_documents(tenant, [document]))[0]

    async def upsert_documents(self, tenant: str, documents: Sequence[Document]) -> list[bool]:
        """Many documents in few requests: one lookup of what is stored, shared `_bulk`
        batches of hidden chunks, one un-hiding `_bulk` per document (several documents share
        one when small), one generation bump."""
        refuse_empty(documents)
        for document in documents:
            self._check_document(document)
        index = await self._writable(tenant)
        stored = await self._stored(tenant, [d.doc_id for d in documents])
        old = [stored.get(d.doc_id, _Stored()) for d in documents]
        changed = [o.content_hash != d.content_hash for o, d in zip(old, documents, strict=True)]
        if not any(changed):
            # An earlier attempt's flip may have landed with its bump lost: make the bump.
            await self._bump_if_behind(tenant, old)
            return changed
        staged: list[Json] = []
        flips: list[list[Json]] = []
        for document, previous, change in zip(documents, old, changed, strict=True):
            if change:
                hidden, flip = self._document_ops(index, tenant, document, previous)
                staged += hidden
                flips.append(flip)
        # 1. The new versions' chunks, hidden from every reader: a failure here leaves the old
        # versions whole. No refresh: nobody may see them yet, the flip refreshes.
        try:
            await self._bulk(staged, refresh="false")
        except BaseException:
            # Hidden chunks still count in the index's BM25 statistics: take back what landed.
            await self._discard_after_failure(index, staged)
            raise
        try:
            # 2. Per document, un-hide its new chunks and delete all others in one request,
            # stamped with the generation the change is expected to produce (read just now).
            await self._flip(flips, await self.generation(tenant) + 1)
            # 3. A concurrent writer of the same document may have flipped too: keep one.
            written = [d.doc_id for d, c in zip(documents, changed, strict=True) if c]
            await self._settle(index, tenant, written)
        except BaseException:
            # Part of a flip may be visible: retire the tenant's cached answers all the same.
            await self._bump_after_failure(tenant)
            raise
        # Bump only once the change is visible: an answer computed from the old content can then
        # never be cached under the new generation.
        await self._bump_generation(tenant)
        return changed

    def _check_document(self, document: Document) -> None:
        if len(document.chunks) > MAX_CHUNKS_PER_DOCUMENT:
            raise ValueError(f"{document.doc_id}: more than {MAX_CHUNKS_PER_DOCUMENT} chunks")
        if len({chunk.chunk_id for chunk in document.chunks}) != len(document.chunks):
            raise ValueError(f"{document.doc_id}: chunk ids must be unique")
        for chunk in document.chunks:
            self._check_vector(chunk.embedding)

    def _document_ops(
        self, index: str, tenant: str, document: Document, previous: _Stored
    ) -> tuple[list[Json], list[Json]]:
        """(index ops for the new version's hidden chunks, the document's flip ops)."""
        hidden: list[Json] = []
        flip: list[Json] = []
        new_keys: set[str] = set()
        visible = previous.visible_keys
        for chunk in document.chunks:
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
                    "generation": 0,  # stamped by the flip
                    "pending": True,
                    "embedding": chunk.embedding.astype(float).tolist(),
                },
            ]
            flip += [{"update": {"_index": index, "_id": key}}, {"doc": {"pending": False}}]
        stale = sorted(set(previous.chunk_keys) - new_keys)
        return hidden, flip + _delete_ops(index, stale)

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
                await self._bulk_whole(batch)
                batch = []
            batch += flip
        if batch:
            await self._bulk_whole(batch)

    async def _settle(self, index: str, tenant: str, doc_ids: Sequence[str]) -> None:
        """Leave one version of each document visible: two writers of one document can both
        flip; both settle on the same deterministic winner, so the last to settle converges."""
        stored = await self._stored(tenant, doc_ids)
        losers = [key for entry in stored.values() for key in entry.losers()]
        if losers:
            await self._bulk(_delete_ops(index, losers))

    async def _bump_if_behind(self, tenant: str, stored: Sequence[_Stored]) -> None:
        stamp = max((max(s.stamps.values(), default=0) for s in stored), default=0)
        if stamp > await self.generation(tenant):
            await self._bump_generation(tenant)

    async def _discard_after_failure(self, index: str, staged: list[Json]) -> None:
        """Best effort: delete the hidden chunks a failed staging may have left (the node may
        be down: then the document's next write or delete removes them)."""
        keys = [str(line["index"]["_id"]) for line in staged if "index" in line]
        with contextlib.suppress(Exception):
            await asyncio.shield(self._bulk(_delete_ops(index, keys), refresh="false"))

    async def _bump_after_failure(self, tenant: str) -> None:
        """Best effort: the node may be down, and the caller's error is the one to raise."""
        with contextlib.suppress(Exception):
            await asyncio.shield(self._bump_generation(tenant))

    async def _stored(self, tenant: str, doc_ids: Sequence[str]) -> dict[str, _Stored]:
        """What is stored of these documents, hidden chunks included, by doc id."""
        await self._ensure_ready()
        found: dict[str, _Stored] = {}
        for start in range(0, len(doc_ids), _LOOKUP_DOCS):
            part = list(dict.fromkeys(doc_ids[start : start + _LOOKUP_DOCS]))
            async for hit in self._hits_of(tenant, part):
                source = hit["_source"]
                entry = found.setdefault(source["doc_id"], _Stored())
                key = str(hit["_id"])
                entry.chunk_keys.append(key)
                content_hash = str(source["content_hash"])
                if source.get("pending", False):
                    entry.hidden_hashes.add(content_hash)
                else:
                    entry.visible.setdefault(content_hash, []).append(key)
                    stamp = int(source.get("generation", 0))
                    entry.stamps[content_hash] = max(entry.stamps.get(content_hash, 0), stamp)
        return found

    async def _hits_of(self, tenant: str, doc_ids: list[str]) -> AsyncIterator[Json]:
        """Every chunk of the documents, paged with search_after (no result-window limit)."""
        body: Json = {
            "size": _LOOKUP_PAGE,
            "_source": ["doc_id", "content_hash", "pending", "generation"],
            "query": {
                "bool": {"filter": [{"term": {"tenant": tenant}}, {"terms": {"doc_id": doc_ids}}]}
            },
            "sort": [{"doc_id": "asc"}, {"chunk_id": "asc"}, {"content_hash": "asc"}],
        }
        while True:
            with _translated("stored"):
                response = await self._client.search(
                    index=self.config.tenant_alias(tenant),
                    body=body,
                    ignore_unavailable=True,
                    request_timeout=self.config.write_timeout_s,
                )
            hits = response["hits"]["hits"]
            for hit in hits:
                yield hit
            if len(hits) < _LOOKUP_PAGE:
                return
            body["search_after"] = hits[-1]["sort"]

    async def delete_document(self, tenant: str, doc_id: str) -> bool:
        """Hide every visible chunk in one request, then delete every chunk, hidden ones too:
        readers lose the document at once, and a delete that failed part-way leaves hidden
        chunks that a retry finds. False when readers saw no chunk of it (the gateway's 404),
        even when hidden chunks (a failed staging, a half-done delete) were cleaned up."""
        entry = (await self._stored(tenant, [doc_id])).get(doc_id)
        if entry is None:
            return False
        index = self.config.tenant_alias(tenant)
        hide: list[Json] = []
        for key in sorted(entry.visible_keys):
            hide += [{"update": {"_index": index, "_id": key}}, {"doc": {"pending": True}}]
        try:
            if hide:
                await self._bulk_whole(hide)
            await self._bulk(_delete_ops(index, entry.chunk_keys))
        except BaseException:
            await self._bump_after_failure(tenant)
            raise
        # Also when only hidden chunks were left: they may be a half-done delete whose hide
        # was visible and whose bump was lost.
        await self._bump_generation(tenant)
        return bool(hide)

    async def _bump_generation(self, tenant: str) -> int:
        """Increment the tenant's counter with optimistic concurrency (no scripting needed)."""
        retrying = AsyncRetrying(
            retry=retry_if_exception_type(_Conflict), stop=stop_after_attempt(20), reraise=True
        )
        try:
            async for attempt in retrying:
                with attempt:
                    return await self._bump_generation_once(tenant)
        except _Conflict as exc:
            raise BackendUnavailable(BACKEND, "generation: too many concurrent writers") from exc
        raise AssertionError("unreachable: tenacity reraises")

    async def _bump_generation_once(self, tenant: str) -> int:
        doc = await self._meta_doc(tenant)
        guard: Json = {"op_type": "create"}
        value = 1
        if doc:
            guard = {"if_seq_no": doc["_seq_no"], "if_primary_term": doc["_primary_term"]}
            value = int(doc["_source"]["generation"]) + 1
        with _translated("generation"):
            response = await self._client.index(
                index=self.config.meta_index,
                id=tenant,
                body={"generation": value},
                params={**guard, "ignore": 409},
                request_timeout=self.config.write_timeout_s,
            )
        if response.get("status") == 409:
            raise _Conflict
        return value

    async def _bulk(self, ops: Sequence[Json], refresh: str | None = None) -> None:
        """Send `ops` (action+source pairs, lone deletes) in bounded, retried batches."""
        for batch in _batches(ops, self.config.bulk_batch_size):
            await self._bulk_whole(batch, refresh)

    async def _bulk_whole(self, batch: list[Json], refresh: str | None = None) -> None:
        """Send `batch` as one request (items the node rejects as busy go again, alone)."""
        try:
            await self._bulk_with_retries(batch, refresh or self.config.write_refresh)
        except _RetryableBulk as exc:
            attempts = self.config.bulk_max_attempts
            raise BackendUnavailable(BACKEND, f"bulk: {exc} after {attempts} attempts") from exc

    async def _bulk_with_retries(self, batch: list[Json], refresh: str) -> None:
        pending = batch
        async for attempt in AsyncRetrying(
            retry=retry_if_exception_type((_RetryableBulk, BackendUnavailable)),
            stop=stop_after_attempt(self.config.bulk_max_attempts),
            wait=wait_exponential(multiplier=0.2, max=2.0),
            reraise=True,
        ):
            with attempt:
                try:
                    await self._bulk_once(pending, refresh)
                except _RetryableBulk as exc:
                    # Only the rejected operations go again; the rest are already stored.
                    pending = exc.pending
                    raise

    async def _bulk_once(self, lines: list[Json], refresh: str) -> None:
        with _translated("bulk"):
            response = await self._client.bulk(
                body=lines,
                refresh=refresh,
                request_timeout=self.config.write_timeout_s,
            )
        if not response["errors"]:
            return
        retry: list[Json] = []
        for op, item in zip(_operations(lines), response["items"], strict=True):
            result = next(iter(item.values()))
            status = int(result.get("status", 500))
            if status < 300 or (status == 404 and "delete" in item):
                continue
            if _is_transient(status):
                retry += op
                continue
            raise UpstreamError(BACKEND, f"bulk item rejected: {result.get('error')}")
        if retry:
            raise _RetryableBulk(retry)

    # -- helpers -----------------------------------------------------------------------------

    async def _server_side(self) -> bool:
        """Whether fusion may run in the node: allowed by `server_side_fusion` and neural-search
        installed (asked once)."""
        if self.config.server_side_fusion == "off":
            return False
        if self._neural_search is None:
            with _translated("plugins"):
                plugins = await self._client.cat.plugins(format="json")
            installed = any(p.get("component") == "opensearch-neural-search" for p in plugins)
            if self.config.server_side_fusion == "on" and not installed:
                raise UpstreamError(BACKEND, "server_side_fusion=on but neural-search is missing")
            self._neural_search = installed
        return self._neural_search

    def _check_vector(self, vector: Vector) -> None:
        if vector.shape != (self.config.dimension,):
            raise ValueError(f"vector shape {vector.shape} != ({self.config.dimension},)")


def _server_fusable(method: FusionMethod, request: SearchRequest) -> bool:
    """Whether the node's pipelines fuse `method` with these weights as `base.fuse` does."""
    if method == "rrf":
        return request.lexical_weight == 1.0 and request.dense_weight == 1.0
    return method == "minmax" and request.lexical_weight + request.dense_weight > 0


def _minmax_pipeline(lexical_share: float, dense_share: float) -> Json:
    """A temporary search pipeline (in the request body): min-max per arm, lowest 0.001 as in
    `base.fuse`, a missed document adding 0, combined as the weighted mean (weights sum to 1)."""
    return {
        "phase_results_processors": [
            {
                "normalization-processor": {
                    "normalization": {"technique": "min_max"},
                    "combination": {
                        "technique": "arithmetic_mean",
                        "parameters": {"weights": [lexical_share, dense_share]},
                    },
                }
            }
        ]
    }


def _rrf_pipeline() -> Json:
    return {
        "description": "querygate hybrid: reciprocal rank fusion of BM25 and k-NN",
        "phase_results_processors": [
            {
                "score-ranker-processor": {
                    "combination": {"technique": "rrf", "parameters": {"rank_constant": RRF_K}}
                }
            }
        ],
    }


def _doc_filter(tenant: str, doc_id: str, *, visible_only: bool = False) -> Json:
    terms: list[Json] = [{"term": {"tenant": tenant}}, {"term": {"doc_id": doc_id}}]
    return {"bool": {"filter": terms + ([_VISIBLE] if visible_only else [])}}


def _delete_ops(index: str, ids: Sequence[str]) -> list[Json]:
    return [{"delete": {"_index": index, "_id": key}} for key in ids]


def _operations(lines: list[Json]) -> Iterator[list[Json]]:
    """Group bulk lines into operations: delete stands alone, index and update carry a body."""
    i = 0
    while i < len(lines):
        width = 1 if "delete" in lines[i] else 2
        yield lines[i : i + width]
        i += width


def _batches(lines: Sequence[Json], size: int) -> Iterator[list[Json]]:
    batch: list[Json] = []
    for op in _operations(list(lines)):
        batch += op
        if len(batch) >= 2 * size:
            yield batch
            batch = []
    if batch:
        yield batch


def _arm_hits(response: Mapping[str, Any]) -> list[Json]:
    """Hits of one `_msearch` arm; a failed arm fails the search instead of thinning it."""
    if "error" in response:
        status = int(response.get("status", 500))
        detail = f"search arm failed: HTTP {status} {response['error']}"
        if status >= 500 or status == 429:
            raise BackendUnavailable(BACKEND, detail)
        raise UpstreamError(BACKEND, detail)
    return list(response["hits"]["hits"])


def _to_hits(fused: Sequence[tuple[str, float]], arms: Mapping[str, list[Json]]) -> list[Hit]:
    """Build Hits from fused (id, score) using each arm's raw hits for ranks and sources."""
    source: dict[str, Json] = {}
    rank: dict[tuple[str, str], tuple[int, float]] = {}
    for name, hits in arms.items():
        for position, hit in enumerate(hits, start=1):
            source.setdefault(hit["_id"], hit["_source"])
            rank[(name, hit["_id"])] = (position, float(hit["_score"]))
    out = []
    for key, score in fused:
        src = source[key]
        bm25, dense = rank.get(("bm25", key)), rank.get(("dense", key))
        out.append(
            Hit(
                doc_id=src["doc_id"],
                chunk_id=src["chunk_id"],
                title=src["title"],
                section=src["section"],
                text=src["text"],
                score=score,
                bm25_rank=bm25[0] if bm25 else None,
                dense_rank=dense[0] if dense else None,
                bm25_score=bm25[1] if bm25 else None,
                dense_score=_cosine(dense[1]) if dense else None,
            )
        )
    return out


def _cosine(knn_score: float) -> float:
    """The cosine behind a lucene cosinesimil score, (1 + cos) / 2: Hit.dense_score is a cosine
    on both backends, as the sufficiency model and the agent's min_similarity read it."""
    return 2.0 * knn_score - 1.0


def _read_hit(source: Json) -> Hit:
    """A chunk read back by `document_chunks`: no arm ranked it."""
    return Hit(
        doc_id=source["doc_id"],
        chunk_id=source["chunk_id"],
        title=source["title"],
        section=source["section"],
        text=source["text"],
        score=0.0,
    )


def _best_first(hits: list[Hit]) -> list[Hit]:
    """The retrieval contract's order: score descending, ties broken by chunk id."""
    return sorted(hits, key=lambda h: (-h.score, h.chunk_id, h.doc_id))


def _error_type(exc: TransportError) -> str | None:
    info = exc.info
    if isinstance(info, dict) and isinstance(info.get("error"), dict):
        return str(info["error"].get("type"))
    return None


async def _migrate_tenancy(config: OpenSearchConfig) -> dict[str, int]:
    async with OpenSearchRetriever(config) as retriever:
        return await retriever.migrate_shared_to_per_tenant()


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m backends.retrieval.opensearch migrate-tenancy CONFIG`: the one-off move of a
    `shared` deployment's chunks to `index_per_tenant` (stop the gateways first)."""
    import argparse
    import json
    from pathlib import Path

    from gateway.settings import load_settings  # the entry point reads the gateway's config

    parser = argparse.ArgumentParser(prog="python -m backends.retrieval.opensearch")
    parser.add_argument("command", choices=["migrate-tenancy"])
    parser.add_argument("config", type=Path, nargs="?", help="the gateway's YAML config")
    args = parser.parse_args(argv)
    config = load_settings(args.config).retrieval.opensearch
    if config.tenancy != "index_per_tenant":
        parser.error("retrieval.opensearch.tenancy must be index_per_tenant to migrate to it")
    copied = asyncio.run(_migrate_tenancy(config))
    print(json.dumps({"tenants": len(copied), "chunks": sum(copied.values())}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
