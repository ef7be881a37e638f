"""The index freshness gauges, one series per configured tenant (`gateway.core.freshness`
sets them). Tenants are configured, so the label set is closed; what the series show (how many
documents a tenant holds, when it last wrote) is for the operator, so a scrape of /metrics gets
them only with the admin key (`TENANT_FAMILIES`): without it, /metrics names no tenant
(docs/operations.md, "Index freshness").

Every worker reads the same index, so with several workers each gauge is the maximum over the
live ones (`livemax`): a sum would count each tenant's documents once per worker."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Gauge

# A series whose value 1 says which embedding model built the tenant's serving version.
INFO = "querygate_index_info"
# The families labelled by tenant: in a scrape only with the admin key.
TENANT_FAMILIES = frozenset(
    {
        "querygate_index_documents",
        "querygate_index_chunks",
        "querygate_index_last_write_timestamp_seconds",
        "querygate_index_version",
        "querygate_index_expect_writes_within_seconds",
        INFO,
    }
)


class IndexMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        def gauge(name: str, text: str, labels: tuple[str, ...] = ("tenant",)) -> Gauge:
            return Gauge(name, text, labels, multiprocess_mode="livemax", registry=registry)

        self.documents = gauge("querygate_index_documents", "Documents in a tenant's index.")
        self.chunks = gauge("querygate_index_chunks", "Chunks in a tenant's index.")
        self.last_write = gauge(
            "querygate_index_last_write_timestamp_seconds",
            "When a tenant's index last changed (unix seconds; 0: no change recorded).",
        )
        self.version = gauge(
            "querygate_index_version", "The serving version of a tenant's index (reindex)."
        )
        self.expect_writes_within = gauge(
            "querygate_index_expect_writes_within_seconds",
            "tenants[].expect_writes_within_s: a tenant's index is stale past this long "
            "without a change (0: no expectation).",
        )
        self.info = gauge(
            INFO,
            "The embedding model that built a tenant's serving index version (value 1; "
            'model "" when it predates any reindex).',
            ("tenant", "model"),
        )
