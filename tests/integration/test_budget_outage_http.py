"""A gateway started while Redis is down does not know the day's spend: a tenant with a budget
gets 503 `budget_unknown` (Retry-After) until Redis answers, one without is answered.

In process (`app_client`) on the services `serve` opens (quotas in Redis), against a real
redis-server that is killed before the gateway starts.
"""

from __future__ import annotations

from typing import Any

import pytest

from gateway.settings import hash_api_key
from tests.fixtures.app import Client, OpenClient, auth
from tests.fixtures.gateway import KEYS
from tests.redis_server import RedisServer

pytestmark = pytest.mark.asyncio(loop_scope="session")


async def _ask(gw: Client, tenant: str) -> tuple[int, dict[str, Any], str | None]:
    body = {"model": "direct", "messages": [{"role": "user", "content": "Hello there"}]}
    async with gw.post("/v1/chat/completions", headers=auth(tenant), json=body) as resp:
        return resp.status, await resp.json(), resp.headers.get("Retry-After")


async def test_a_gateway_started_during_an_outage_refuses_a_budget_it_never_read(
    app_client: OpenClient, fake_upstream: str, redis_server: RedisServer
) -> None:
    redis_server.kill()
    tenants = [
        {
            "id": "acme",
            "api_key_sha256": hash_api_key(KEYS["acme"]),
            "daily_budget_usd": 0.0002,
        },
        {"id": "globex", "api_key_sha256": hash_api_key(KEYS["globex"])},
    ]
    gw = await app_client(
        upstream=fake_upstream,
        cache={"backend": "redis", "redis_url": redis_server.url},
        quotas={"redis_retry_s": 0.2},
        tenants=tenants,
    )
    status, body, retry_after = await _ask(gw, "acme")
    assert status == 503, body
    assert body["error"]["type"] == "budget_unknown"
    assert retry_after == "1"
    status, body, _ = await _ask(gw, "globex")  # no budget: nothing to know
    assert status == 200, body
