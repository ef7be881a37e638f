"""How fresh each configured tenant's index is: read on a timer into the index gauges
(`gateway.obs.index_metrics`) and the board `/readyz` shows.

Per tenant: documents and chunks held, when the index last changed, its serving version and
the embedding model that built it, and whether it is stale: `expect_writes_within_s` is set
and the index went longer than that without a change (or never changed)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

from backends.errors import BackendError
from backends.retrieval.versions import Freshness, VersionedIndex
from gateway.core.runtime import effective_tenants
from gateway.core.services import Services
from gateway.obs.metrics import Metrics
from gateway.settings import Settings, TenantConfig

log = logging.getLogger(__name__)

EVERY_S = 30.0  # how often the figures are read: an index stale for hours needs no more


@dataclass(frozen=True, slots=True)
class TenantFreshness:
    documents: int
    chunks: int
    last_write: float | None
    version: int
    model: str
    expect_writes_within_s: float | None
    stale: bool


class FreshnessBoard:
    """The latest figures per tenant, as /readyz shows them."""

    def __init__(self) -> None:
        self.tenants: dict[str, TenantFreshness] = {}

    def summary(self) -> dict[str, int]:
        """What anyone may see: how many tenants, how many stale; no tenant is named."""
        stale = sum(t.stale for t in self.tenants.values())
        return {"tenants": len(self.tenants), "stale": stale}

    def per_tenant(self) -> dict[str, dict[str, object]]:
        """Every tenant's figures: for the admin only."""
        return {name: asdict(figures) for name, figures in self.tenants.items()}


def is_stale(freshness: Freshness, expect_s: float | None, now: float) -> bool:
    if expect_s is None:
        return False
    return freshness.last_write is None or now - freshness.last_write > expect_s


def initialise(metrics: Metrics, tenants: tuple[TenantConfig, ...]) -> None:
    """Every tenant's series from the first scrape: 0 until the index is first read."""
    gauges = metrics.index
    for tenant in tenants:
        for gauge in (gauges.documents, gauges.chunks, gauges.last_write, gauges.version):
            gauge.labels(tenant.id).set(0)
        gauges.expect_writes_within.labels(tenant.id).set(tenant.expect_writes_within_s or 0)


async def refresh(
    services: Services, metrics: Metrics, settings: Settings, board: FreshnessBoard
) -> None:
    """Read every configured tenant's figures once, into the gauges and the board."""
    index = services.retriever
    if not isinstance(index, VersionedIndex):
        return
    gauges = metrics.index
    now = time.time()
    for tenant in effective_tenants(settings):
        name, expect = tenant.id, tenant.expect_writes_within_s
        freshness = await index.freshness(name)
        gauges.documents.labels(name).set(freshness.documents)
        gauges.chunks.labels(name).set(freshness.chunks)
        gauges.last_write.labels(name).set(freshness.last_write or 0)
        gauges.version.labels(name).set(freshness.version)
        gauges.expect_writes_within.labels(name).set(expect or 0)
        before = board.tenants.get(name)
        if before is not None and before.model != freshness.model:
            # Written 0 first: a worker's metric file keeps a removed series at its last value.
            gauges.info.labels(name, before.model).set(0)
            gauges.info.remove(name, before.model)
        gauges.info.labels(name, freshness.model).set(1)
        board.tenants[name] = TenantFreshness(
            freshness.documents,
            freshness.chunks,
            freshness.last_write,
            freshness.version,
            freshness.model,
            expect,
            is_stale(freshness, expect, now),
        )


async def watch_freshness(
    services: Services,
    metrics: Metrics,
    settings: Callable[[], Settings],
    board: FreshnessBoard,
    every_s: float = EVERY_S,
) -> None:
    """`refresh` every `every_s`, with the settings serving now, until cancelled; a backend
    that fails leaves the last figures (its own probe reports it down) and is logged."""
    initialise(metrics, effective_tenants(settings()))
    while True:
        try:
            await refresh(services, metrics, settings(), board)
        except BackendError as exc:
            log.warning("index freshness not read", extra={"error": str(exc)})
        await asyncio.sleep(every_s)
