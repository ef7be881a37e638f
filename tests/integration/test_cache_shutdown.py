"""An answer's cache write is off its path, and shutdown waits for it before the store's
connection closes: a real redis-server behind a slow forwarder, the real services."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from gateway.core.pipeline import Pipeline
from gateway.core.request import QueryRequest
from gateway.obs.metrics import Metrics
from gateway.server.services import open_services
from gateway.settings import Settings, TenantConfig
from routers.classifier import HeuristicClassifier
from tests.fixtures.gateway import TcpProxy
from tests.redis_server import RedisServer

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]

TENANT = TenantConfig(id="acme", api_key_sha256=("0" * 64,))


async def stored_answers(server: RedisServer) -> int:
    """Straight to the server, not through the slow forwarder."""
    direct = aioredis.Redis.from_url(server.url)
    try:
        return int(await direct.hlen("qg:cache:{acme}:keys"))
    finally:
        await direct.aclose()


async def test_shutdown_waits_for_the_last_answers_cache_write(
    redis_server: RedisServer, fake_upstream: str, tmp_path: Path
) -> None:
    proxy = TcpProxy(redis_server.address)
    proxy.start(mode="slow", delay_ms=150)  # each write takes ~0.3 s to be answered
    tier = {"api_base": fake_upstream, "retries": 0}
    settings = Settings.model_validate(
        {
            "data_dir": tmp_path,
            "models": {
                "small": {"model": "openai/fake-small", **tier},
                "large": {"model": "openai/fake-large", **tier},
            },
            "cache": {
                "backend": "redis",
                "redis_url": f"redis://127.0.0.1:{proxy.port}/0",
                "redis_socket_timeout_s": 2.0,
                "redis_request_budget_s": 10.0,
            },
            "quotas": {"backend": "memory"},
        }
    )
    try:
        async with open_services(settings, Metrics()) as services:
            pipeline = Pipeline(services, settings, HeuristicClassifier())
            request = QueryRequest(
                id=uuid.uuid4().hex, tenant=TENANT, query="Say hello.", route="direct"
            )
            result = await pipeline.complete(await pipeline.prepare(request))
            assert result.answer
            # The answer did not wait for its own storing: that write is still on its way.
            assert await stored_answers(redis_server) == 0
        # Closed at once: shutdown waited for the write, then for the claim's release.
        assert await stored_answers(redis_server) == 1
        direct = aioredis.Redis.from_url(redis_server.url)
        try:
            leases = [k async for k in direct.scan_iter("qg:cache:{acme}:lease:*")]
        finally:
            await direct.aclose()
        assert leases == []  # released after it, not left to expire
    finally:
        proxy.stop()
