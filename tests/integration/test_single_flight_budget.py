"""A follower in another replica waits for the leader's answer on a real redis-server: its
polls are bounded by `single_flight_wait_s`, not by the request's Redis time budget."""

from __future__ import annotations

import asyncio

import pytest

from backends.cache.redis import RedisCacheStore
from backends.redis_client import RedisConnection, RedisOptions, RequestSpend
from gateway.cache.single_flight import SingleFlight
from tests.fixtures.gateway import TcpProxy
from tests.redis_server import RedisServer

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]


async def test_a_follower_waits_for_the_leader_past_its_requests_redis_budget(
    redis_server: RedisServer,
) -> None:
    """Two calls every 50 ms through a forwarder adding ~1 ms each way spend a 0.03 s budget
    in ~0.3 s; the leader in the other replica gives its claim back at 1 s and the follower
    leads then, instead of failing the poll (BackendUnavailable: served uncached, computed
    again beside the leader)."""
    proxy = TcpProxy(redis_server.address)
    proxy.start(mode="slow", delay_ms=1)
    connection = RedisConnection(
        RedisOptions(f"redis://127.0.0.1:{proxy.port}/0", request_budget_s=0.03)
    )
    await connection.start()
    other = RedisConnection(RedisOptions(redis_server.url))
    await other.start()
    try:
        store, leader = RedisCacheStore(connection), RedisCacheStore(other)
        assert await leader.claim("acme", "k", 6.0)  # the other replica leads

        given_back = asyncio.Event()

        async def leader_gives_up() -> None:
            await asyncio.sleep(1.0)
            await leader.release("acme", "k")
            given_back.set()

        async def poll() -> dict[str, object] | None:
            entry = await store.get("acme", "k")
            return None if entry is None else {"stored": True}

        flights = SingleFlight(store, 3.0, 6.0)
        releasing = asyncio.create_task(leader_gives_up())
        lease, payload = await flights.lead("acme", "k", poll, spend=RequestSpend())
        # It led once the claim was given back: polling went on past the spent budget, and
        # did not end at the wait's 3 s without the lead (served uncached beside the leader).
        assert given_back.is_set()
        assert lease.claimed and payload is None
        await releasing
        await flights.finish(lease, None)
        await flights.drain()
    finally:
        await other.aclose()
        await connection.aclose()
        proxy.stop()
