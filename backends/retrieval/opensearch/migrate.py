"""The one-off move of a `shared` deployment's chunks into per-tenant indices
(`tenancy: index_per_tenant`), tenant by tenant, idempotent and resumable."""

from __future__ import annotations

from backends.errors import UpstreamError
from backends.retrieval.opensearch.client import BACKEND, Json, translated
from backends.retrieval.opensearch.config import OpenSearchConfig
from backends.retrieval.opensearch.layout import IndexLayout
from backends.retrieval.opensearch.queries import VISIBLE, tenant_visible


async def migrate_tenancy(config: OpenSearchConfig) -> dict[str, int]:
    """Migrate the cluster `config` names, on a client of its own; the chunks copied per
    tenant. With every gateway on this alias stopped (see `migrate_shared_to_per_tenant`)."""
    layout = IndexLayout(config)
    try:
        return await migrate_shared_to_per_tenant(layout)
    finally:
        await layout.aclose()


async def migrate_shared_to_per_tenant(
    layout: IndexLayout, timeout_s: float = 3600.0
) -> dict[str, int]:
    """Move every tenant's chunks from the shared alias into the tenant's own index.

    For index_per_tenant, with every gateway on this alias stopped (a `shared` gateway
    writing meanwhile could lose its write). Per tenant: `_reindex` its visible chunks
    (term filter) into its current index under the same `_id`s, then delete the tenant's
    chunks from the shared index; at the end the emptied shared indices and alias go. Each
    step overwrites or deletes by id, so a run that stopped anywhere is finished by running
    it again. Generations are kept: the content readers see does not change.
    Returns the chunks copied per tenant.
    """
    cfg = layout.config
    if cfg.tenancy != "index_per_tenant":
        raise ValueError("migrate_shared_to_per_tenant needs tenancy: index_per_tenant")
    await layout.bootstrap()
    copied: dict[str, int] = {}
    while tenants := await _shared_tenants(layout):
        for tenant in tenants:
            if tenant in copied:
                raise UpstreamError(BACKEND, f"migration: chunks of {tenant!r} came back")
            copied[tenant] = await _migrate_tenant(layout, tenant, timeout_s)
    with translated("migrate"):
        if await layout.client.indices.exists_alias(name=cfg.alias):
            behind = await layout.client.indices.get_alias(name=cfg.alias)
            # Hidden leftovers of failed writes are all that can remain: nobody reads them.
            await layout.client.indices.delete(
                index=",".join(behind), request_timeout=cfg.write_timeout_s
            )
    layout.mark_ready()
    return copied


async def _shared_tenants(layout: IndexLayout, page: int = 100) -> list[str]:
    """Up to `page` tenants with visible chunks behind the shared alias."""
    if not await layout.shared_chunk_count():
        return []
    body = {
        "size": 0,
        "query": VISIBLE,
        "aggs": {"tenants": {"terms": {"field": "tenant", "size": page}}},
    }
    with translated("migrate"):
        response = await layout.client.search(index=layout.config.alias, body=body)
    return [str(b["key"]) for b in response["aggregations"]["tenants"]["buckets"]]


async def _migrate_tenant(layout: IndexLayout, tenant: str, timeout_s: float) -> int:
    cfg = layout.config
    client = layout.client
    with translated("migrate"):
        await layout.create_alias(cfg.tenant_alias(tenant))
        layout.remember_tenant_alias(cfg.tenant_alias(tenant))
        dest = await layout.current_index(tenant)
        query: Json = tenant_visible(tenant)
        done = await client.reindex(
            body={"source": {"index": cfg.alias, "query": query}, "dest": {"index": dest}},
            refresh=True,
            wait_for_completion=True,
            request_timeout=timeout_s,
        )
        if done.get("failures"):
            raise UpstreamError(BACKEND, f"migration of a tenant: {done['failures'][:1]}")
        await client.delete_by_query(
            index=cfg.alias,
            body={"query": {"term": {"tenant": tenant}}},
            refresh=True,
            conflicts="proceed",
            request_timeout=timeout_s,
        )
    return int(done["total"])
