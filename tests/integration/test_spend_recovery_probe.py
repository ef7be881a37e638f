"""After a Redis outage the health probe says Redis is back however much spend waited for it,
against a real redis-server behind a forwarder adding 40 ms each way. The probe (`Quotas.ping`,
under gateway.core.health's PROBE_TIMEOUT_S) sent every tenant-day's kept spend inside its own
timeout, one round trip each: with many tenants it timed out though Redis answered, so the
quotas were reported down, and the timeout cut the sends half-way. The sends now run in a task
of their own, which the probe waits for only briefly."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest

from backends.quotas.redis import RedisQuotaStore
from backends.redis_client import RedisConnection, RedisOptions
from gateway.core.health import probe
from gateway.limits.quotas import Quotas
from gateway.limits.shared_store import utc_day
from gateway.obs.metrics import Metrics
from gateway.settings import TenantConfig
from tests.fixtures.gateway import TcpProxy
from tests.redis_server import RedisServer

pytestmark = [pytest.mark.integration]

TENANTS = 40  # ~80 ms a round trip: ~3.2 s of sends, past the probe's 2 s


def tenant(i: int) -> TenantConfig:
    return TenantConfig.model_validate(
        {"id": f"t{i}-{uuid.uuid4().hex[:6]}", "api_key_sha256": "0" * 64,
         "daily_budget_usd": 100.0}
    )  # fmt: skip


async def test_the_probe_finds_redis_back_however_much_spend_waited_for_it(
    redis_server: RedisServer,
) -> None:
    tenants = [tenant(i) for i in range(TENANTS)]
    proxy = TcpProxy(redis_server.address)
    proxy.start(mode="slow", delay_ms=40)
    connection = RedisConnection(RedisOptions(f"redis://127.0.0.1:{proxy.port}/0"))
    await connection.start()
    try:
        store = RedisQuotaStore(connection)
        quotas = Quotas(store, Metrics(), retry_s=0.01)
        await quotas.record_spend(tenants[0], 0.01)  # connected, the script loaded
        redis_server.kill()
        for who in tenants:
            await quotas.record_spend(who, 0.5)
            await asyncio.sleep(0.011)  # past retry_s: each one asks the store
        assert quotas.degraded and len(quotas._outbox.outstanding()) == TENANTS
        redis_server.start()

        assert await probe(quotas.ping) is None  # was a timeout: reported down
        assert not quotas.degraded
        for _ in range(200):  # the kept spend follows in the background
            if not quotas._outbox.outstanding():
                break
            await asyncio.sleep(0.05)
        day = utc_day(time.time())
        spent = [await store.spent(who.id, day) for who in tenants]
        assert spent == [pytest.approx(0.5)] * TENANTS  # (the restarted server kept nothing)
    finally:
        await connection.aclose()
        proxy.stop()


async def test_a_bug_in_the_background_sends_still_reaches_the_probe(
    redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Sent inline, an unexpected exception in the sends failed the probe with its traceback
    (gateway.core.health logs it as a bug); in a task of its own nothing read it."""
    connection = RedisConnection(RedisOptions(redis_server.url))
    await connection.start()
    try:
        quotas = Quotas(RedisQuotaStore(connection), Metrics())

        async def broken() -> None:  # our own code failing, not Redis: Redis is real here
            raise RuntimeError("a bug in the sends")

        monkeypatch.setattr(quotas._outbox, "_flush_all", broken)
        down = await probe(quotas.ping)
        assert down is not None and down.bug is not None, down
        assert "a bug in the sends" in down.reason
    finally:
        await connection.aclose()
