"""A gateway on the Redis cache: /readyz stays 200 and says `degraded` while Redis is down
(the cache fails open, so no replica leaves the load balancer for it), answers go on, and both
clear by themselves once Redis is back."""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.fixtures.gateway import GatewayProcess, readyz_until, start_gateway, stop_gateway
from tests.redis_server import RedisServer

pytestmark = pytest.mark.integration

QUESTION = "What does the Acme warranty cover?"


@pytest.fixture(scope="module")
def cached_gateway(
    module_redis: RedisServer, fake_upstream: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GatewayProcess]:
    overrides = {
        "cache": {
            "backend": "redis",
            "redis_url": module_redis.url,
            "redis_socket_timeout_s": 0.1,
            "redis_connect_timeout_s": 0.2,
        },
        "router": {"classifier": "heuristic"},  # the learned model is not what is tested here
    }
    gw = start_gateway(
        Path(tmp_path_factory.mktemp("redis-cache")), fake_upstream, overrides=overrides
    )
    yield gw
    stop_gateway(gw)


def ask(gw: GatewayProcess, text: str) -> dict[str, Any]:
    response = requests.post(
        f"{gw.url}/v1/query", json={"query": text}, headers=gw.headers(), timeout=30
    )
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def readyz(gw: GatewayProcess) -> requests.Response:
    return requests.get(f"{gw.url}/readyz", timeout=10)


def redis_pings(redis: RedisServer) -> int:
    """PING commands the server has answered (INFO commandstats), from every client."""
    found = re.search(rb"cmdstat_ping:calls=(\d+)", redis.command("INFO", "commandstats"))
    return int(found.group(1)) if found else 0


def test_a_burst_of_readyz_pings_redis_at_most_once_a_second(
    cached_gateway: GatewayProcess, module_redis: RedisServer
) -> None:
    """/readyz is unauthenticated: 64 concurrent calls, then calls back to back for 3 s, must
    not multiply the pings Redis (shared by every replica) answers."""
    gw = cached_gateway
    before, started = redis_pings(module_redis), time.monotonic()
    with ThreadPoolExecutor(max_workers=64) as pool:
        burst = list(pool.map(lambda _: readyz(gw), range(64)))
    calls = len(burst)
    while time.monotonic() - started < 3.0:
        burst.append(readyz(gw))
        calls += 1
    elapsed, pings = time.monotonic() - started, redis_pings(module_redis) - before
    assert [r.status_code for r in burst] == [200] * calls
    assert {r.json()["status"] for r in burst} == {"ok"}
    # One probe per started second of readyz, plus the 10 s health watch's (cache and quotas
    # each ping once per round, and a round may fall in the window).
    assert calls > 100
    assert pings <= int(elapsed) + 1 + 2, f"{pings} pings for {calls} calls in {elapsed:.1f} s"


def test_answers_are_cached_in_redis(
    cached_gateway: GatewayProcess, module_redis: RedisServer
) -> None:
    text = f"{QUESTION} ({uuid.uuid4().hex[:6]})"
    assert ask(cached_gateway, text)["cache"] == "miss"
    assert ask(cached_gateway, text)["cache"] == "exact"
    assert b"qg:cache:{acme}:ent" in module_redis.command("KEYS", "qg:cache:*")


def test_redis_down_is_degraded_not_unready_and_recovers(
    cached_gateway: GatewayProcess, module_redis: RedisServer
) -> None:
    gw = cached_gateway
    before = readyz(gw)
    assert before.status_code == 200
    assert before.json()["status"] == "ok" and before.json()["checks"]["cache"] == "ok"
    module_redis.kill()
    try:
        # Seen within a verdict's reuse.
        down = readyz_until(gw, lambda r: r.json()["status"] == "degraded")
        assert down.status_code == 200, down.text  # still in the load balancer
        assert down.json()["status"] == "degraded"
        assert down.json()["checks"] == {"retrieval": "ok", "cache": "unavailable"}
        errors = gw.metrics().value("querygate_cache_lookups_total", result="error")
        started = time.monotonic()
        body = ask(gw, f"{QUESTION} ({uuid.uuid4().hex[:6]})")  # answered without the cache
        # Served uncached ("miss" is what answered it); the lookup is counted as an error.
        assert body["cache"] == "miss"
        assert gw.metrics().value("querygate_cache_lookups_total", result="error") == errors + 1
        assert time.monotonic() - started < 10
    finally:
        module_redis.restart()
    deadline = time.monotonic() + 15
    while readyz(gw).json()["status"] != "ok":
        assert time.monotonic() < deadline, "readiness did not recover by itself"
        time.sleep(0.2)
    text = f"{QUESTION} ({uuid.uuid4().hex[:6]})"
    assert ask(gw, text)["cache"] == "miss"
    assert ask(gw, text)["cache"] == "exact"  # the cache is back in use, scripts reloaded
