"""Two replicas sharing one real redis-server: a tenant's rate limit and daily budget are one,
whichever replica a request reaches; Redis killed mid-traffic, both go on answering with
per-replica limits (no failed request) and share again once it is back.

The replicas are two apps in this process (`app_client`), each with its own quota store,
Redis connection and index, over litellm's real client to the fake upstream: what they share
is only the redis-server, as two `querygate serve` processes do.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import Any

import pytest

from gateway.settings import hash_api_key
from tests.fixtures.app import Client, OpenClient, scrape
from tests.fixtures.gateway import KEYS
from tests.redis_server import RedisServer

pytestmark = pytest.mark.asyncio(loop_scope="session")

Pair = tuple[Client, Client]

LIMITS: dict[str, dict[str, Any]] = {
    "burster": {"rate_limit": {"requests_per_s": 0.01, "burst": 3}},
    "spender": {"daily_budget_usd": 0.0025},  # a question below costs 0.001
    "bystander": {
        "rate_limit": {"requests_per_s": 0.01, "burst": 3},
        "daily_budget_usd": 0.0025,
    },
    "steady": {"rate_limit": {"requests_per_s": 1000, "burst": 1000}, "daily_budget_usd": 100},
    "outage": {"rate_limit": {"requests_per_s": 0.01, "burst": 2}},
}


def headers(tenant: str) -> dict[str, str]:
    return {"Authorization": f"Bearer key-{tenant}"}


@pytest.fixture(scope="module")
async def pair(app_client: OpenClient, module_redis: RedisServer, fake_upstream: str) -> Pair:
    tenants = [
        {"id": "acme", "api_key_sha256": hash_api_key(KEYS["acme"])},
        {"id": "globex", "api_key_sha256": hash_api_key(KEYS["globex"])},
        *({"id": t, "api_key_sha256": hash_api_key(f"key-{t}"), **v} for t, v in LIMITS.items()),
    ]
    overrides = {
        "tenants": tenants,
        "cache": {
            "backend": "off",  # every question reaches the model: its cost is the point here
            "redis_url": module_redis.url,
            "redis_socket_timeout_s": 0.1,
            "redis_connect_timeout_s": 0.2,
        },
        "quotas": {"backend": "redis", "redis_retry_s": 0.5},
        "router": {"classifier": "heuristic"},  # questions here are forced to a route
    }
    one = await app_client(upstream=fake_upstream, **overrides)
    two = await app_client(upstream=fake_upstream, **overrides)
    return one, two


async def route(client: Client, tenant: str) -> tuple[int, dict[str, str], Any]:
    async with client.post("/v1/route", json={"query": "hello"}, headers=headers(tenant)) as r:
        return r.status, dict(r.headers), await r.json()


async def route_status(client: Client, tenant: str) -> int:
    status, _, _ = await route(client, tenant)
    return status


async def ask(client: Client, tenant: str, prompt_tokens: int = 1000) -> tuple[int, Any]:
    """A direct question whose one model call costs prompt_tokens * 1e-6 USD."""
    directive = {"usage": {"prompt_tokens": prompt_tokens, "completion_tokens": 0}}
    text = f"Say hello {uuid.uuid4().hex[:8]} [[fake:{json.dumps(directive)}]]"
    body = {"query": text, "route": "direct"}
    async with client.post("/v1/query", json=body, headers=headers(tenant)) as resp:
        return resp.status, await resp.json()


async def test_a_burst_of_three_spread_over_two_processes_refuses_the_fourth_on_either(
    pair: Pair,
) -> None:
    one, two = pair
    assert [await route_status(c, "burster") for c in (one, two, one)] == [200, 200, 200]
    for client in (two, one):
        status, refused_headers, body = await route(client, "burster")
        assert status == 429
        assert int(refused_headers["Retry-After"]) >= 1
        assert body["error"]["type"] == "rate_limit_exceeded"
    assert await route_status(two, "bystander") == 200  # its own bucket


async def test_a_budget_spent_through_both_processes_is_spent_on_either(pair: Pair) -> None:
    one, two = pair
    for client in (one, two, one):  # 0, 0.001, 0.002 spent before each: under 0.0025
        status, answered = await ask(client, "spender")
        assert status == 200, answered
        assert answered["usage"]["cost_usd"] == pytest.approx(0.001)
    for client in (two, one):
        status, refused = await ask(client, "spender")
        assert status == 429
        assert refused["error"]["type"] == "budget_exceeded"
        assert "daily_budget_usd" in refused["error"]["message"]
    assert (await ask(one, "bystander"))[0] == 200  # the same budget, its own spend


async def test_redis_killed_mid_traffic_no_request_fails_and_sharing_resumes(
    pair: Pair, module_redis: RedisServer
) -> None:
    one, two = pair

    async def wave(n: int) -> list[int]:
        answers = await asyncio.gather(*(ask((one, two)[i % 2], "steady", 10) for i in range(n)))
        return [status for status, _ in answers]

    statuses = await wave(8)
    killed = asyncio.ensure_future(asyncio.to_thread(module_redis.kill))
    statuses += await wave(16)  # Redis goes away during these
    await killed
    statuses += await wave(8)  # and stays away for these
    assert statuses == [200] * len(statuses)
    for client in (one, two):
        metrics = await scrape(client)
        assert metrics.get("querygate_quota_store_degraded") == 1.0
        local = metrics.get("querygate_quota_local_decisions_total", check="rate_limit")
        assert local is not None and local > 0

    # Meanwhile each replica enforces alone: a burst of 2 each, so the fleet's is 4.
    for client in (one, two):
        assert [await route_status(client, "outage") for _ in range(3)] == [200, 200, 429]

    await asyncio.to_thread(module_redis.start)
    # Bounds only the wait for the replicas' next probe of Redis (redis_retry_s 0.5), sized
    # for a loaded CI machine.
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        assert [(await ask(c, "steady", 10))[0] for c in (one, two)] == [200, 200]
        degraded = [(await scrape(c)).get("querygate_quota_store_degraded") for c in (one, two)]
        if degraded == [0.0, 0.0]:
            break
    else:
        pytest.fail("the replicas did not go back to the shared store")
    # Shared again: one bucket (Redis came back empty, so a fresh one) across both.
    assert [await route_status(c, "outage") for c in (one, two, one)] == [200, 200, 429]
