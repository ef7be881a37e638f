"""Spend records in Redis stay bounded, against a real redis-server: a tenant without a budget
keeps its day's total only, a budgeted tenant's ids of recent amounts are capped (they were one
hash field per model call, all day), and a replay within that window is still added once."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any, cast

import pytest
import redis

from backends.quotas.redis import RECENT_IDS, RedisQuotaStore, applied_key, spend_key
from backends.redis_client import RedisConnection, RedisOptions
from gateway.metrics import Metrics
from gateway.quotas import Quotas, utc_day
from gateway.settings import TenantConfig
from tests.redis_server import RedisServer

pytestmark = [pytest.mark.integration]

TODAY = utc_day(time.time())


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


async def test_a_tenant_without_a_budget_keeps_its_days_total_and_no_record_per_call(
    redis_server: RedisServer, inspect: redis.Redis
) -> None:
    free = tenant("free", budget=None)
    async with store(redis_server.url) as shared:
        quotas = Quotas(shared, Metrics())
        for _ in range(50):
            await quotas.record_spend(free, 0.01)
        assert await shared.spent(free.id, TODAY) == pytest.approx(0.5)
        assert quotas._outstanding() == {}
    keys = set(inspect.scan_iter(match=f"qg:quota:{{{free.id}}}:*"))
    assert keys == {spend_key(free.id, TODAY)}  # was also a hash of 50 ids
    assert int(ask(inspect, "TTL", spend_key(free.id, TODAY))) > 3600


async def test_a_budgeted_tenants_ids_stay_bounded_and_a_recent_replay_counts_once(
    redis_server: RedisServer, inspect: redis.Redis
) -> None:
    paying = tenant("paying", budget=1e6).id
    ids = [uuid.uuid4().hex[:16] for _ in range(3 * RECENT_IDS)]
    async with store(redis_server.url) as s:
        for amount_id in ids[:RECENT_IDS]:
            await s.add_spend(paying, TODAY, 0.25, amount_id)
        records, used = per_call_records(inspect, paying)
        assert records == RECENT_IDS
        for amount_id in ids[RECENT_IDS:]:
            await s.add_spend(paying, TODAY, 0.25, amount_id)
        records_after, used_after = per_call_records(inspect, paying)
        assert records_after == RECENT_IDS  # was 3 * RECENT_IDS, one per call all day
        assert used_after <= used * 1.25  # was 3 times as much
        assert used_after < 160_000
        total = 0.25 * len(ids)
        assert await s.spent(paying, TODAY) == pytest.approx(total)
        # Replays within the window (the newest and the oldest id still kept) count once.
        for replay in (ids[-1], ids[-RECENT_IDS]):
            assert await s.add_spend(paying, TODAY, 0.25, replay) == pytest.approx(total)
        assert await s.spent(paying, TODAY) == pytest.approx(total)
    assert int(ask(inspect, "TTL", applied_key(paying, TODAY))) > 3600


async def test_a_replay_past_the_window_is_added_again_erring_high(
    redis_server: RedisServer,
) -> None:
    """The bound's stated price: an id pushed out by RECENT_IDS later amounts is a new amount
    (the total errs towards refusing, never under-counts)."""
    paying = tenant("paying", budget=1e6).id
    async with store(redis_server.url) as s:
        await s.add_spend(paying, TODAY, 1.0, "first")
        for i in range(RECENT_IDS):
            await s.add_spend(paying, TODAY, 0.5, f"later-{i}")
        before = 1.0 + 0.5 * RECENT_IDS
        assert await s.add_spend(paying, TODAY, 1.0, "first") == pytest.approx(before + 1.0)
        assert await s.add_spend(paying, TODAY, 0.5, "later-1") == pytest.approx(before + 1.0)
