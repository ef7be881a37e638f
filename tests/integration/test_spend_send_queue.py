"""A busy tenant's spend records keep up with a slow Redis, against a real redis-server behind a
forwarder adding 10 ms each way. A process sends one (tenant, day)'s amounts one send at a
time, each carrying what was kept meanwhile; a record already carried by a confirmed send ends
at once rather than waiting its turn for a round trip of its own, so with more model calls
per round trip than one the records do not queue without end (memory, and each confirmed
later and later)."""

from __future__ import annotations

import asyncio
import time
import uuid
from functools import partial

import pytest

from backends.quotas.redis import RedisQuotaStore
from backends.redis_client import RedisConnection, RedisOptions
from gateway.limits.quotas import Quotas
from gateway.limits.shared_store import utc_day
from gateway.obs.metrics import Metrics
from gateway.settings import TenantConfig
from tests.fixtures.gateway import TcpProxy
from tests.redis_server import RedisServer

pytestmark = [pytest.mark.integration]


async def test_a_busy_tenants_spend_records_do_not_queue_up_behind_a_slow_redis(
    redis_server: RedisServer,
) -> None:
    acme = TenantConfig.model_validate(
        {"id": f"acme-{uuid.uuid4().hex[:8]}", "api_key_sha256": "0" * 64,
         "daily_budget_usd": 1e6}
    )  # fmt: skip
    proxy = TcpProxy(redis_server.address)
    proxy.start(mode="slow", delay_ms=10)
    connection = RedisConnection(RedisOptions(f"redis://127.0.0.1:{proxy.port}/0"))
    await connection.start()
    try:
        store = RedisQuotaStore(connection)
        quotas = Quotas(store, Metrics())
        await quotas.record_spend(acme, 0.01)  # connected, the script loaded
        loop = asyncio.get_running_loop()
        latencies: list[float] = []

        def took(started: float, _: object) -> None:
            latencies.append(loop.time() - started)

        tasks: list[asyncio.Task[None]] = []
        backlog = 0
        for _ in range(150):  # 1.5 s of 200 model calls a second: ~4 per round trip
            for _ in range(2):
                task = quotas.record_spend_nowait(acme, 0.01)
                assert task is not None
                task.add_done_callback(partial(took, loop.time()))
                tasks.append(task)
            backlog = max(backlog, len(quotas._outbox._tasks))
            await asyncio.sleep(0.01)
        await asyncio.gather(*tasks)
        assert quotas._outbox.outstanding() == {}
        assert await store.spent(acme.id, utc_day(time.time())) == pytest.approx(3.01)
        assert backlog < 60, backlog  # was ~220: a task per call waiting its round trip
        assert max(latencies) < 0.4, max(latencies)  # was ~1.2 s and growing
    finally:
        await connection.aclose()
        proxy.stop()


def evalsha_calls(server: RedisServer) -> int:
    info = server.command("INFO", "commandstats").decode()
    for line in info.splitlines():
        if line.startswith("cmdstat_evalsha:"):
            return int(line.split("calls=")[1].split(",")[0])
    return 0


async def test_spend_kept_through_a_long_outage_is_sent_back_as_one_amount(
    redis_server: RedisServer,
) -> None:
    """Each retry of the store during an outage (one per `retry_s`) turned the spend kept
    meanwhile into one more amount with its own id, all kept till Redis was back and then
    sent one round trip each, in turn: memory and a recovery that grew with the outage's
    length. Only the amount that may have reached the store keeps its id; the rest is one."""
    acme = TenantConfig.model_validate(
        {"id": f"acme-{uuid.uuid4().hex[:8]}", "api_key_sha256": "0" * 64,
         "daily_budget_usd": 1e6}
    )  # fmt: skip
    connection = RedisConnection(RedisOptions(redis_server.url))
    await connection.start()
    try:
        store = RedisQuotaStore(connection)
        quotas = Quotas(store, Metrics(), retry_s=0.01)
        redis_server.kill()
        for _ in range(30):
            await quotas.record_spend(acme, 0.1)
            await asyncio.sleep(0.02)  # past retry_s: each record asks the store again
        assert quotas.degraded
        assert quotas._outbox.outstanding() == {(acme.id, utc_day(time.time())): pytest.approx(3.0)}
        redis_server.start()
        await quotas.ping()
        assert not quotas.degraded and quotas._outbox.outstanding() == {}
        assert await store.spent(acme.id, utc_day(time.time())) == pytest.approx(3.0)
        assert evalsha_calls(redis_server) <= 3  # was 30: one round trip per retry
    finally:
        await connection.aclose()
