"""An app on the Redis cache: /readyz stays 200 and says `degraded` while Redis is down (the
cache fails open, so no replica leaves the load balancer for it), answers go on, and both clear
by themselves once Redis is back. The app in process, as `querygate serve` opens it: a real
redis-server, litellm's real client path to the fake upstream."""

from __future__ import annotations

import asyncio
import re
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from tests.fixtures.app import Client, OpenClient, auth, scrape
from tests.redis_server import RedisServer

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]

QUESTION = "What does the Acme warranty cover?"


@pytest.fixture(scope="module")
async def cached(app_client: OpenClient, module_redis: RedisServer, fake_upstream: str) -> Client:
    return await app_client(
        upstream=fake_upstream,
        cache={
            "backend": "redis",
            "redis_url": module_redis.url,
            "redis_socket_timeout_s": 0.1,
            "redis_connect_timeout_s": 0.2,
        },
        router={"classifier": "heuristic"},  # the learned model is not what is tested here
    )


async def ask(client: Client, text: str) -> dict[str, Any]:
    async with client.post("/v1/query", json={"query": text}, headers=auth()) as resp:
        assert resp.status == 200, await resp.text()
        body: dict[str, Any] = await resp.json()
        return body


async def readyz(client: Client) -> tuple[int, dict[str, Any]]:
    async with client.get("/readyz") as resp:
        return resp.status, await resp.json()


async def readyz_until(
    client: Client, done: Callable[[dict[str, Any]], bool], within_s: float
) -> tuple[int, dict[str, Any]]:
    """/readyz once `done` says its answer is the one awaited (a verdict is reused for up to
    1 s, plus a probe of at most 2 s)."""
    deadline = time.monotonic() + within_s
    while not done((ready := await readyz(client))[1]):
        assert time.monotonic() < deadline, f"readyz still answers {ready}"
        await asyncio.sleep(0.1)
    return ready


def redis_pings(redis: RedisServer) -> int:
    """PING commands the server has answered (INFO commandstats), from every client."""
    found = re.search(rb"cmdstat_ping:calls=(\d+)", redis.command("INFO", "commandstats"))
    return int(found.group(1)) if found else 0


async def test_a_burst_of_readyz_pings_redis_at_most_once_a_second(
    cached: Client, module_redis: RedisServer
) -> None:
    """/readyz is unauthenticated: 64 concurrent calls, then calls back to back for 3 s, must
    not multiply the pings Redis (shared by every replica) answers."""
    before, started = redis_pings(module_redis), time.monotonic()
    burst = list(await asyncio.gather(*(readyz(cached) for _ in range(64))))
    while time.monotonic() - started < 3.0:
        burst.append(await readyz(cached))
    elapsed, pings = time.monotonic() - started, redis_pings(module_redis) - before
    calls = len(burst)
    assert [status for status, _ in burst] == [200] * calls
    assert {body["status"] for _, body in burst} == {"ok"}
    # One probe per started second of readyz, plus the 10 s health watch's (cache and quotas
    # each ping once per round, and a round may fall in the window).
    assert calls > 100
    assert pings <= int(elapsed) + 1 + 2, f"{pings} pings for {calls} calls in {elapsed:.1f} s"


async def test_answers_are_cached_in_redis(cached: Client, module_redis: RedisServer) -> None:
    text = f"{QUESTION} ({uuid.uuid4().hex[:6]})"
    assert (await ask(cached, text))["cache"] == "miss"
    assert (await ask(cached, text))["cache"] == "exact"
    assert b"qg:cache:{acme}:ent" in module_redis.command("KEYS", "qg:cache:*")


async def test_redis_down_is_degraded_not_unready_and_recovers(
    cached: Client, module_redis: RedisServer
) -> None:
    status, body = await readyz(cached)
    assert status == 200
    assert body["status"] == "ok" and body["checks"]["cache"] == "ok"
    module_redis.kill()
    try:
        # Seen within a verdict's reuse.
        status, down = await readyz_until(cached, lambda r: r["status"] == "degraded", 4.0)
        assert status == 200, down  # still in the load balancer
        assert down["checks"] == {"retrieval": "ok", "cache": "unavailable"}
        errors = (await scrape(cached)).value("querygate_cache_lookups_total", result="error")
        started = time.monotonic()
        answer = await ask(cached, f"{QUESTION} ({uuid.uuid4().hex[:6]})")  # without the cache
        # Served uncached ("miss" is what answered it); the lookup is counted as an error.
        assert answer["cache"] == "miss"
        after = (await scrape(cached)).value("querygate_cache_lookups_total", result="error")
        assert after == errors + 1
        assert time.monotonic() - started < 10
    finally:
        module_redis.restart()
    await readyz_until(cached, lambda r: r["status"] == "ok", 15.0)  # recovers by itself
    text = f"{QUESTION} ({uuid.uuid4().hex[:6]})"
    assert (await ask(cached, text))["cache"] == "miss"
    # the cache is back in use, its scripts loaded again
    assert (await ask(cached, text))["cache"] == "exact"
