"""Index freshness of an in-process app: per-tenant gauges on /metrics, a summary on /readyz
that names no tenant, and each tenant's figures there for the admin key only."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from gateway.settings import hash_api_key
from tests.fixtures.app import OpenClient, auth, scrape
from tests.fixtures.gateway import ADMIN_KEY, KEYS

pytestmark = pytest.mark.asyncio(loop_scope="session")

Client = TestClient[Any, Any]
# acme expects a write within the hour (it had one: ingested just now); globex within 1 ms.
TENANTS = [
    {"id": "acme", "api_key_sha256": hash_api_key(KEYS["acme"]), "expect_writes_within_s": 3600},
    {
        "id": "globex",
        "api_key_sha256": hash_api_key(KEYS["globex"]),
        "expect_writes_within_s": 0.001,
    },
]


async def readyz(client: Client, headers: dict[str, str] | None = None) -> dict[str, Any]:
    """/readyz once the index figures were first read (at start, in the background)."""
    for _ in range(200):
        resp = await client.get("/readyz", headers=headers)
        body: dict[str, Any] = await resp.json()
        if body["index"]["tenants"] == len(TENANTS):
            return body
        await asyncio.sleep(0.05)
    raise AssertionError(f"index figures never read: {body}")


async def test_freshness_on_readyz_and_metrics(app_client: OpenClient) -> None:
    client = await app_client(tenants=TENANTS)

    public = await readyz(client)
    assert public["index"] == {"tenants": 2, "stale": 1}  # globex: past its 1 ms
    assert "acme" not in str(public) and "globex" not in str(public)
    as_tenant = await readyz(client, auth("acme"))  # a tenant's key is no admin key
    assert "tenants_detail" not in as_tenant["index"]
    admin = await readyz(client, {"Authorization": f"Bearer {ADMIN_KEY}"})
    detail = admin["index"]["tenants_detail"]
    assert set(detail) == {"acme", "globex"}
    acme = detail["acme"]
    assert acme["documents"] > 0 and acme["chunks"] >= acme["documents"]
    assert acme["version"] == 1 and acme["stale"] is False
    assert acme["expect_writes_within_s"] == 3600
    assert 0 < time.time() - acme["last_write"] < 3600
    assert detail["globex"]["stale"] is True

    # /metrics names tenants only to the admin key's scrape.
    public = await scrape(client)
    assert not any(dict(labels).get("tenant") for _, labels in public.samples())
    metrics = await scrape(client, admin=True)
    assert metrics.value("querygate_index_documents", tenant="acme") == acme["documents"]
    assert metrics.value("querygate_index_chunks", tenant="acme") == acme["chunks"]
    assert metrics.value("querygate_index_version", tenant="acme") == 1
    last = metrics.value("querygate_index_last_write_timestamp_seconds", tenant="acme")
    assert last == acme["last_write"]
    assert metrics.value("querygate_index_expect_writes_within_seconds", tenant="globex") == 0.001
    assert metrics.value("querygate_index_info", tenant="acme", model="") == 1
