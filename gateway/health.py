"""Dependency health as a metric: each process probes its backends on a timer, so an alert can
say "the cache is down" without waiting for traffic to fail (and without a scrape of /readyz)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from backends.errors import BackendError
from gateway.metrics import Metrics
from gateway.pipeline import Services

log = logging.getLogger(__name__)

PROBE_TIMEOUT_S = 2.0


def probes(services: Services) -> dict[str, Callable[[], Awaitable[None]]]:
    """The dependencies this process uses, by the `dependency` label they are reported under."""
    found: dict[str, Callable[[], Awaitable[None]]] = {"retrieval": services.retriever.ping}
    if services.cache_store is not None:
        found["cache"] = services.cache_store.ping
    if services.quotas is not None and services.quotas.is_shared:
        found["quotas"] = services.quotas.ping  # also clears querygate_quota_store_degraded
    return found


async def probe(ping: Callable[[], Awaitable[None]]) -> bool:
    try:
        await asyncio.wait_for(ping(), timeout=PROBE_TIMEOUT_S)
    except (BackendError, TimeoutError):
        return False
    return True


async def watch_dependencies(services: Services, metrics: Metrics, every_s: float) -> None:
    """Set `querygate_dependency_up{dependency}` to 1 or 0 every `every_s`, until cancelled."""
    checks = probes(services)
    while True:
        for name, ping in checks.items():
            up = await probe(ping)
            gauge = metrics.dependency_up.labels(name)
            if not up and gauge._value.get() == 1:
                log.warning("dependency down", extra={"dependency": name})
            gauge.set(1 if up else 0)
        await asyncio.sleep(every_s)
