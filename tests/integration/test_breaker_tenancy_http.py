"""A model's cooldown over HTTP, in process: one tenant whose questions make the upstream fail
does not cool the model down for another. The tenant comes from the API key
(gateway/http/middleware/limits.py)
and reaches the breakers; litellm's real client path to the fake upstream process."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest

from gateway.settings import hash_api_key
from tests.fixtures.app import Client, OpenClient, scrape
from tests.fixtures.upstream import calls_for

pytestmark = pytest.mark.asyncio(loop_scope="session")

TENANTS = ("noisy", "quiet")
COOLDOWN_AFTER = 2


def auth(tenant: str) -> dict[str, str]:
    return {"Authorization": f"Bearer key-{tenant}"}


@pytest.fixture(scope="module")
async def client(app_client: OpenClient, fake_upstream: str) -> Client:
    # no fallback, no retry: a cooled model is a 503 at once, without an upstream call
    tier = {
        "api_base": fake_upstream,
        "retries": 0,
        "cooldown_after": COOLDOWN_AFTER,
        "cooldown_s": 600,
    }
    return await app_client(
        upstream=fake_upstream,
        tenants=[{"id": name, "api_key_sha256": hash_api_key(f"key-{name}")} for name in TENANTS],
        models={
            "small": {"model": "openai/fake-small", **tier},
            "large": {"model": "openai/fake-large", **tier},
        },
        cache={"backend": "off"},
        router={"classifier": "heuristic"},
    )


def question(key: str, **script: Any) -> str:
    return f"Say hello. {uuid.uuid4().hex[:6]} [[fake:{json.dumps({'key': key, **script})}]]"


async def ask(client: Client, tenant: str, query: str) -> tuple[int, Any]:
    payload = {"query": query, "route": "direct"}
    async with client.post("/v1/query", json=payload, headers=auth(tenant)) as resp:
        return resp.status, await resp.json()


async def test_one_tenants_failing_questions_leave_the_model_to_the_others(
    client: Client, fake_upstream: str
) -> None:
    status, body = await ask(client, "quiet", question(uuid.uuid4().hex))
    assert status == 200, body
    for _ in range(COOLDOWN_AFTER):
        status, body = await ask(client, "noisy", question(uuid.uuid4().hex, status=503))
        assert status == 503, body
    # cooled down for "noisy": refused at once, no upstream call, a Retry-After
    key = uuid.uuid4().hex
    status, body = await ask(client, "noisy", question(key, status=503))
    assert status == 503, body
    assert await calls_for(fake_upstream, key) == 0
    # not for "quiet": its question reaches the model and is answered
    key = uuid.uuid4().hex
    status, body = await ask(client, "quiet", question(key))
    assert status == 200, body
    assert await calls_for(fake_upstream, key) >= 1
    metrics = await scrape(client)
    shared = metrics.series("querygate_llm_cooldown_open")
    assert all(v == 0 for v in shared.values()), shared
    cooled = metrics.series("querygate_llm_tenant_cooldowns")
    assert sum(cooled.values()) == 1, cooled
    # bounded labels: the tenant is never one
    assert {k for labels in cooled for k, _ in labels} == {"tier", "model"}
