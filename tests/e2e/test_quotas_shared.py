"""Two `querygate serve` processes sharing one real redis-server: a tenant's rate limit and
daily budget are one, whichever process a request reaches; Redis killed mid-traffic, both go
on answering with per-process limits (no failed request) and share again once it is back."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import requests

from gateway.settings import hash_api_key
from tests.fixtures.gateway import KEYS, GatewayProcess, gateway_pair
from tests.redis_server import RedisServer

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
def pair(
    module_redis: RedisServer, fake_upstream: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[GatewayProcess, GatewayProcess]]:
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
    root = Path(tmp_path_factory.mktemp("quotas-shared"))
    with gateway_pair(root, fake_upstream, overrides) as both:
        yield both


def route(gw: GatewayProcess, tenant: str) -> requests.Response:
    return requests.post(
        f"{gw.url}/v1/route", json={"query": "hello"}, headers=headers(tenant), timeout=10
    )


def ask(gw: GatewayProcess, tenant: str, prompt_tokens: int = 1000) -> requests.Response:
    """A direct question whose one model call costs prompt_tokens * 1e-6 USD."""
    directive = {"usage": {"prompt_tokens": prompt_tokens, "completion_tokens": 0}}
    text = f"Say hello {uuid.uuid4().hex[:8]} [[fake:{json.dumps(directive)}]]"
    return requests.post(
        f"{gw.url}/v1/query",
        json={"query": text, "route": "direct"},
        headers=headers(tenant),
        timeout=30,
    )


def test_a_burst_of_three_spread_over_two_processes_refuses_the_fourth_on_either(
    pair: tuple[GatewayProcess, GatewayProcess],
) -> None:
    one, two = pair
    assert [route(gw, "burster").status_code for gw in (one, two, one)] == [200, 200, 200]
    for gw in (two, one):
        refused = route(gw, "burster")
        assert refused.status_code == 429
        assert int(refused.headers["Retry-After"]) >= 1
        assert refused.json()["error"]["type"] == "rate_limit_exceeded"
    assert route(two, "bystander").status_code == 200  # its own bucket


def test_a_budget_spent_through_both_processes_is_spent_on_either(
    pair: tuple[GatewayProcess, GatewayProcess],
) -> None:
    one, two = pair
    for gw in (one, two, one):  # 0, 0.001, 0.002 spent before each: under 0.0025
        answered = ask(gw, "spender")
        assert answered.status_code == 200, answered.text
        assert answered.json()["usage"]["cost_usd"] == pytest.approx(0.001)
    for gw in (two, one):
        refused = ask(gw, "spender")
        assert refused.status_code == 429
        assert refused.json()["error"]["type"] == "budget_exceeded"
        assert "daily_budget_usd" in refused.json()["error"]["message"]
    assert ask(one, "bystander").status_code == 200  # the same budget, its own spend


def test_redis_killed_mid_traffic_no_request_fails_and_sharing_resumes(
    pair: tuple[GatewayProcess, GatewayProcess], module_redis: RedisServer
) -> None:
    one, two = pair

    def wave(n: int) -> list[int]:
        with ThreadPoolExecutor(4) as pool:
            jobs = [pool.submit(ask, (one, two)[i % 2], "steady", 10) for i in range(n)]
            return [job.result().status_code for job in jobs]

    statuses = wave(8)
    with ThreadPoolExecutor(1) as killer:
        killed = killer.submit(module_redis.kill)
        statuses += wave(16)  # Redis goes away during these
        killed.result()
    statuses += wave(8)  # and stays away for these
    assert statuses == [200] * len(statuses)
    for gw in (one, two):
        assert gw.metrics().get("querygate_quota_store_degraded") == 1.0
        local = gw.metrics().get("querygate_quota_local_decisions_total", check="rate_limit")
        assert local is not None and local > 0

    # Meanwhile each process enforces alone: a burst of 2 per process, so the fleet's is 4.
    for gw in (one, two):
        assert [route(gw, "outage").status_code for _ in range(3)] == [200, 200, 429]

    module_redis.start()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        statuses = [ask(gw, "steady", 10).status_code for gw in (one, two)]
        assert statuses == [200, 200]
        if all(gw.metrics().get("querygate_quota_store_degraded") == 0.0 for gw in (one, two)):
            break
    else:
        pytest.fail("the gateways did not go back to the shared store")
    # Shared again: one bucket (Redis came back empty, so a fresh one) across both.
    assert [route(gw, "outage").status_code for gw in (one, two, one)] == [200, 200, 429]
