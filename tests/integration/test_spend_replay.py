"""A replayed amount of spend is added once however many amounts other replicas added
meanwhile, against a real redis-server (paused: the reply lost for real): a replay after more
than 1024 amounts of the other replicas (more ids than a window of the day's newest would
keep) is not added again, so the tenant's total never rises by an amount not spent and it is
not refused below its budget."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest

from backends.quotas.redis import RedisQuotaStore, applied_key, spend_key
from backends.redis_client import RedisConnection, RedisOptions
from gateway.limits.quotas import BudgetExceeded, Quotas
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
    connection = RedisConnection(RedisOptions(url))
    await connection.start()
    try:
        yield RedisQuotaStore(connection)
    finally:
        await connection.aclose()


def tenant(budget: float | None) -> TenantConfig:
    return TenantConfig.model_validate(
        {"id": f"acme-{uuid.uuid4().hex[:8]}", "api_key_sha256": "0" * 64,
         "daily_budget_usd": budget}
    )  # fmt: skip


async def lose_a_reply(server: RedisServer, quotas: Quotas, who: TenantConfig, usd: float) -> None:
    """`usd` recorded while Redis is paused: the call times out, the amount stays here
    unconfirmed, and the resumed server runs the script it had received (applied)."""
    server.pause()
    try:
        await quotas.record_spend(who, usd)
    finally:
        server.resume()
    assert quotas.degraded and quotas._outbox.outstanding()
    for _ in range(60):
        if float(server.command("GET", spend_key(who.id, today())).split(b"\r\n")[1] or 0) > 0:
            return
        await asyncio.sleep(0.05)
    raise AssertionError("the paused call was never applied")


@pytest.mark.parametrize("budget", [10.0, None])
async def test_a_replay_after_many_amounts_of_other_replicas_is_added_once(
    redis_server: RedisServer, budget: float | None
) -> None:
    acme = tenant(budget)
    async with store(redis_server.url) as mine, store(redis_server.url) as theirs:
        here = Quotas(mine, Metrics(), retry_s=0.1)
        there = Quotas(theirs, Metrics())
        await here.record_spend(tenant(None), 0.01)  # the script is loaded
        await lose_a_reply(redis_server, here, acme, 5.0)
        for _ in range(1100):  # the other replicas go on meanwhile
            await there.record_spend(acme, 0.001)
        await asyncio.sleep(0.1)
        await here.ping()  # the replay
        assert not here.degraded and here._outbox.outstanding() == {}
        assert await mine.spent(acme.id, today()) == pytest.approx(5.0 + 1.1)  # was 11.1
        if budget is not None:
            await here.check_budget(acme)  # 6.1 of 10 spent: not refused
            await there.record_spend(acme, 4.0)
            with pytest.raises(BudgetExceeded):
                await here.check_budget(acme)


async def test_the_replay_records_stay_bounded_per_process_not_per_call(
    redis_server: RedisServer,
) -> None:
    """What dedupes a replay grows with the processes that sent amounts, not with the calls."""
    acme = tenant(1e6)
    async with store(redis_server.url) as a, store(redis_server.url) as b:
        one, two = Quotas(a, Metrics()), Quotas(b, Metrics())
        for _ in range(300):
            await one.record_spend(acme, 0.01)
            await two.record_spend(acme, 0.01)
        assert await a.spent(acme.id, today()) == pytest.approx(6.0)
    kind = redis_server.command("TYPE", applied_key(acme.id, today()))
    assert kind == b"+hash\r\n"
    assert redis_server.command("HLEN", applied_key(acme.id, today())) == b":2\r\n"
    ttl = int(redis_server.command("TTL", applied_key(acme.id, today())).strip().lstrip(b":"))
    assert ttl > 3600
