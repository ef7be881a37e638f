"""`retrieval.opensearch`: connection, index layout and query settings, and the names they give
every index, alias and pipeline of the layout."""

from __future__ import annotations

import hashlib
import re
from typing import Literal

from pydantic import AliasChoices, BaseModel, Field, field_validator

from backends.retrieval.base import DEFAULT_FUSION, FusionMethod
from backends.sections import SECTION

_FIELD_SPEC = re.compile(r"^[A-Za-z_][\w.]*(\^\d+(\.\d+)?)?$")
# Hex digits of the tenant hash in per-tenant index names (96 bits).
_TENANT_HASH = 24


class OpenSearchConfig(BaseModel):
    """Connection, index layout and query settings of the OpenSearch retriever."""

    model_config = SECTION

    # Every node the client may send to (a call whose node is gone goes to another: client.py).
    hosts: tuple[str, ...] = Field(default=("http://127.0.0.1:9200",), min_length=1)
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
