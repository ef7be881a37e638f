"""What a failed lookup-and-claim costs stays flat through a Redis outage, against a real
redis-server killed (connections refused). Each failed call's token is kept for 30 s
(`abandon`); during an outage every request's lookup fails, so dropping the lapsed tokens must
not cost a pass over all of them at each failure: the last thousand of 8,000 failures cost
less than twice what the cheapest of the first two thousands did (a pass over all of them
makes it about four times)."""

from __future__ import annotations

import time

import pytest

from backends.cache.redis import RedisCacheStore
from backends.errors import BackendError
from backends.redis_client import RedisConnection, RedisOptions
from tests.redis_server import RedisServer

pytestmark = [pytest.mark.integration]


async def test_a_failed_lookup_costs_no_more_as_an_outage_goes_on(
    redis_server: RedisServer,
) -> None:
    connection = RedisConnection(RedisOptions(redis_server.url, request_budget_s=None))
    await connection.start()
    try:
        store = RedisCacheStore(connection)
        redis_server.kill()
        cpu: list[float] = []
        for _ in range(8):
            started = time.process_time()
            for i in range(1000):
                with pytest.raises(BackendError):
                    await store.get_or_claim("acme", f"q{i % 50}", 6.0)
            cpu.append(time.process_time() - started)
        assert len(store._abandoned) == 8000  # all within ABANDON_VOID_S: kept
        assert cpu[-1] < 2 * min(cpu[:2]), cpu  # a pass over every token costs ~4 times
    finally:
        await connection.aclose()
