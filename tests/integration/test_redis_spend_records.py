"""Spend records in Redis stay bounded, against a real redis-server: what tells a replay apart is
one number per process and tenant-day (it was one hash field per model call, all day), and a
replay of any earlier amount of a process is still added once."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any, cast

import pytest
import redis

from backends.quotas.redis import RedisQuotaStore, applied_key, spend_key
from backends.redis_client import RedisConnection, RedisOptions
from gateway.limits.quotas import Quotas
from gateway.limits.shared_store import utc_day
from gateway.obs.metrics import Metrics
from gateway.settings import TenantConfig
from tests.redis_server import RedisServer

pytestmark = [pytest.mark.integration]


def today() -> str:
    """Read when used: a suite that runs past midnight UTC spends on the new day."""
    return utc_day(time.time())


@asynccontextmanager
async def store(url: str) -> AsyncIterator[RedisQuotaStore]:
    connection = RedisConnection(RedisOptions(url, request_budget_s=None))
    await connection.start()
    try:
        yield RedisQuotaStore(connection)
    finally:
        await connection.aclose()


@pytest.fixture
def inspect(redis_server: RedisServer) -> Iterator[redis.Redis]:
    """A plain client that looks past the store at what it left in Redis."""
    client = redis.Redis(port=redis_server.port, decode_responses=True)
    try:
        yield client
    finally:
        client.close()


def tenant(name: str, budget: float | None) -> TenantConfig:
    return TenantConfig.model_validate(
        {"id": f"{name}-{uuid.uuid4().hex[:8]}", "api_key_sha256": "0" * 64,
         "daily_budget_usd": budget}
    )  # fmt: skip


def ask(client: redis.Redis, *args: str) -> Any:
    """One raw command (redis-py's sync typings mix in its async client's)."""
    return cast(Any, client).execute_command(*args)


def per_call_records(client: redis.Redis, tenant_id: str) -> tuple[int, int]:
    """(records, bytes) in the tenant's keys other than its buckets and day totals: what grows
    with the number of model calls."""
    records = used = 0
    for key in client.scan_iter(match=f"qg:quota:{{{tenant_id}}}:*"):
        kind = ask(client, "TYPE", key)
        if kind == "string" or key.endswith(":bucket"):
            continue
        records += int(ask(client, "HLEN" if kind == "hash" else "ZCARD", key))
        used += int(ask(client, "MEMORY", "USAGE", key, "SAMPLES", "0"))
    return records, used


@pytest.mark.parametrize("budget", [None, 1e6])
async def test_a_tenants_records_are_one_per_process_not_one_per_call(
    redis_server: RedisServer, inspect: redis.Redis, budget: float | None
) -> None:
    who = tenant("t", budget=budget)
    async with store(redis_server.url) as shared:
        quotas = Quotas(shared, Metrics())
        for _ in range(50):
            await quotas.record_spend(who, 0.01)
        assert await shared.spent(who.id, today()) == pytest.approx(0.5)
        assert quotas._outbox.outstanding() == {}
    keys = set(inspect.scan_iter(match=f"qg:quota:{{{who.id}}}:*"))
    assert keys == {spend_key(who.id, today()), applied_key(who.id, today())}
    records, used = per_call_records(inspect, who.id)
    assert records == 1 and used < 200  # was a field per call: 50
    for key in keys:
        assert int(ask(inspect, "TTL", key)) > 3600


async def test_any_earlier_amount_of_a_process_is_a_replay_whatever_came_between(
    redis_server: RedisServer,
) -> None:
    paying = tenant("paying", budget=1e6).id
    async with store(redis_server.url) as s:
        await s.add_spend(paying, today(), 1.0, "a:1")
        for i in range(3000):  # other processes' amounts
            await s.add_spend(paying, today(), 0.5, f"other-{i % 7}:{i}")
        await s.add_spend(paying, today(), 1.0, "a:2")
        total = 2.0 + 0.5 * 3000
        for replay in ("a:1", "a:2", "other-3:10"):
            assert await s.add_spend(paying, today(), 1.0, replay) == pytest.approx(total)
        assert await s.add_spend(paying, today(), 1.0, "a:3") == pytest.approx(total + 1.0)
        assert await s.add_spend(paying, today(), 1.0, "") == pytest.approx(total + 2.0)
