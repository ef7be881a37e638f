"""The exact lookup and the single-flight claim in one round trip, against a real redis-server:
a miss sends one command before the semantic tier (not the lookup script and then SET NX for
the claim), on a single node and on a three-master cluster (one script, one slot), and what
the lookup and the claim decide apart they decide in the one."""

from __future__ import annotations

import asyncio
import hashlib
import socket
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from typing import Any

import pytest

from backends.cache import redis_scripts
from backends.cache.base import CachedEntry
from backends.cache.redis import RedisCacheStore
from backends.cache.redis_scripts import lease_key
from backends.redis_client import RedisConnection, RedisOptions
from gateway.cache.response import ResponseCache
from gateway.cache.single_flight import Shared
from gateway.obs.metrics import Metrics
from gateway.settings import CacheConfig
from tests.fixtures.app import OpenClient, auth
from tests.redis_server import RedisServer

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]

CANDIDATES_SHA = hashlib.sha1(redis_scripts.CANDIDATES.encode()).hexdigest()


class Monitor:
    """MONITOR on a plain socket: every command the server runs, a script's own calls marked
    `lua` (left out here: they are not round trips)."""

    def __init__(self, server: RedisServer) -> None:
        self._sock = socket.create_connection(("127.0.0.1", server.port), timeout=2)
        self._sock.sendall(b"*1\r\n$7\r\nMONITOR\r\n")
        assert self._sock.recv(5) == b"+OK\r\n"

    def commands(self) -> list[str]:
        time.sleep(0.2)
        self._sock.settimeout(0.2)
        raw = b""
        with suppress(TimeoutError):
            while chunk := self._sock.recv(65536):
                raw += chunk
        lines = raw.decode(errors="replace").splitlines()
        return [
            line.split("] ", 1)[1]
            for line in lines
            if "] " in line and "lua]" not in line and '"PING"' not in line
        ]

    def close(self) -> None:
        self._sock.close()


async def test_a_miss_is_looked_up_and_claimed_in_one_round_trip(
    app_client: OpenClient, redis_server: RedisServer, fake_upstream: str
) -> None:
    """The gateway's own path (the app in process, Redis for the cache): the commands a miss
    sends before its semantic lookup's script are one EVALSHA, and the same question again is
    an exact hit in one command, as before."""
    client = await app_client(
        upstream=fake_upstream,
        cache={"backend": "redis", "redis_url": redis_server.url},
        quotas={"backend": "memory"},
        router={"classifier": "heuristic"},
    )

    async def ask(question: str) -> tuple[dict[str, Any], list[str]]:
        monitor = Monitor(redis_server)
        try:
            resp = await client.post(
                "/v1/query",
                json={"query": question, "route": "direct"},
                headers=auth(),
            )
            assert resp.status == 200, await resp.text()
            body: dict[str, Any] = await resp.json()
            await asyncio.sleep(0.3)  # the store and the release, after the answer
            return body, monitor.commands()
        finally:
            monitor.close()

    await ask(f"Say hello to the warm-up team {uuid.uuid4().hex[:8]}")  # scripts loaded
    question = f"Please greet the team called {uuid.uuid4().hex[:8]}"
    body, commands = await ask(question)
    assert body["cache"] == "miss"
    semantic = next(i for i, c in enumerate(commands) if CANDIDATES_SHA in c)
    assert len(commands[:semantic]) == 1, commands  # not the lookup, then SET NX
    assert commands[0].startswith('"EVALSHA"')
    body, commands = await ask(question)
    assert body["cache"] == "exact"
    assert len(commands) == 1 and commands[0].startswith('"EVALSHA"'), commands


@asynccontextmanager
async def two_stores(url: str) -> AsyncIterator[tuple[RedisCacheStore, RedisCacheStore]]:
    """Two processes' stores: each its own connection (pool) and lease tokens."""
    connections = [RedisConnection(RedisOptions(url, request_budget_s=None)) for _ in "ab"]
    for connection in connections:
        await connection.start()
    try:
        yield RedisCacheStore(connections[0]), RedisCacheStore(connections[1])
    finally:
        for connection in connections:
            await connection.aclose()


@pytest.mark.parametrize("tenant", ["acme", "odd{tenant}"])
async def test_one_script_looks_up_and_claims_on_a_cluster(
    redis_cluster_urls: list[str], tenant: str
) -> None:
    """The lease key carries the tenant's hash tag (a tenant id with braces is hashed into
    one): the script's nine keys are in one slot, and the claim is the fleet's."""
    url = "redis+cluster://" + redis_cluster_urls[0].removeprefix("redis://")
    key = f"s:{uuid.uuid4().hex}"
    async with two_stores(url) as (one, two):
        assert await one.get_or_claim(tenant, key, 5.0) == (None, True)
        assert await two.get_or_claim(tenant, key, 5.0) == (None, False)  # one's claim
        assert not await two.claim(tenant, key, 5.0)
        entry = CachedEntry(key, "q", b'{"answer": "x"}')
        await one.put(tenant, "s", entry, ttl_s=60, max_entries=10)
        await one.release(tenant, key)
        assert await two.get_or_claim(tenant, key, 5.0) == (entry, False)  # a hit claims none
        assert await two.claim(tenant, key, 5.0)  # the claim is free: released, not retaken


async def test_followers_in_the_process_and_in_another_get_the_leaders_answer(
    redis_server: RedisServer,
) -> None:
    """One lookup-and-claim leads: a request of the same process follows it (no Redis
    call), one of another process finds the claim taken and polls until the answer is
    stored, then the claim is released."""
    config = CacheConfig()
    async with two_stores(redis_server.url) as (one, two):
        here = ResponseCache(one, config, Metrics(), lease_s=5)
        there = ResponseCache(two, config, Metrics(), lease_s=5)
        lease, found = await here.exact_or_lead("acme", "s:k")
        assert lease is not None and lease.claimed and found is None
        assert redis_server.command("EXISTS", lease_key("acme", "s:k")).strip() == b":1"
        follower = asyncio.create_task(here.exact_or_lead("acme", "s:k"))
        other = asyncio.create_task(there.exact_or_lead("acme", "s:k"))
        await asyncio.sleep(0.2)
        assert not follower.done() and not other.done()
        payload: dict[str, Any] = {
            "answer": "hi", "route": "direct", "citations": [], "extractive": False,
            "escalated": False, "route_reason": "forced",
        }  # fmt: skip
        await here.put("acme", "s", "s:k", "q", payload, None)
        assert here.flights is not None
        await here.flights.finish(lease, Shared(payload, "exact"))
        assert await follower == (None, (payload, "exact"))
        other_lease, other_found = await other
        assert other_found == (payload, "exact") and other_lease is not None
        assert not other_lease.claimed
        assert there.flights is not None
        await there.flights.finish(other_lease, None)
        await here.drain()
        assert redis_server.command("EXISTS", lease_key("acme", "s:k")).strip() == b":0"
