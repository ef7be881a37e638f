"""A lookup-and-claim whose reply never came (Redis paused past the call's bound; a client that
hung up) may still have taken the claim when the server ran it. Every exact lookup of a miss
claims, so a blip of Redis can leave a claim nobody holds on each question asked during it:
the next request for it, in any process, computes at once rather than polling the store for
the whole lease (6 s). Against a real redis-server (SIGSTOP, then SIGCONT)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest

from backends.cache.redis import RedisCacheStore
from backends.cache.redis_scripts import lease_key
from backends.redis_client import RedisConnection, RedisOptions, RequestSpend
from gateway.cache.response import ResponseCache, StoreFailed
from gateway.obs.metrics import Metrics
from gateway.settings import CacheConfig
from tests.redis_server import RedisServer

pytestmark = [pytest.mark.integration]


@asynccontextmanager
async def cache(url: str) -> AsyncIterator[ResponseCache]:
    connection = RedisConnection(RedisOptions(url))
    await connection.start()
    try:
        yield ResponseCache(RedisCacheStore(connection), CacheConfig(), Metrics(), lease_s=30)
    finally:
        await connection.aclose()


async def lookup_while_paused(server: RedisServer, here: ResponseCache, key: str) -> None:
    """A request's lookup of `key` on a paused Redis: cut at its budget (StoreFailed), or
    cancelled (the client hung up); the server then resumes and runs the script it had."""
    server.pause()
    try:
        task = asyncio.create_task(here.exact_or_lead("acme", key, spend=RequestSpend()))
        await asyncio.sleep(0.1)
        if key.endswith("cancelled"):
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        else:
            with pytest.raises(StoreFailed):
                await task
    finally:
        server.resume()


@pytest.mark.parametrize("how", ["timed-out", "cancelled"])
async def test_a_claim_whose_reply_was_lost_does_not_hold_the_question_for_its_lease(
    redis_server: RedisServer, how: str
) -> None:
    key = f"s:question-{how}"
    async with cache(redis_server.url) as here, cache(redis_server.url) as there:
        assert await here.exact("acme", "s:warm") is None  # connected, scripts loaded
        await here.exact_or_lead("acme", "s:warm-claim")
        await lookup_while_paused(redis_server, here, key)
        await asyncio.sleep(0.3)
        await here.drain()
        for cache_ in (here, there):
            started = time.monotonic()
            lease, found = await cache_.exact_or_lead("acme", key)
            waited = time.monotonic() - started
            assert lease is not None and found is None
            assert lease.claimed, "the lost claim still held the key"
            assert waited < 1.0  # was the lease, 6 s, polling
            assert cache_.flights is not None
            await cache_.flights.finish(lease, None)
            await cache_.drain()
        assert redis_server.command("EXISTS", lease_key("acme", key)) == b":0\r\n"
