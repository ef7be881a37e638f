"""The in-process cache's counted bytes reach /metrics: the app in process, its model a
`FakeLLM`, the default memory cache."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from tests.fixtures.app import OpenClient, auth, scrape

pytestmark = pytest.mark.asyncio(loop_scope="session")

GAUGE = "querygate_cache_memory_bytes"


async def test_a_cached_answer_shows_in_the_memory_gauge(app_client: OpenClient) -> None:
    client = await app_client()
    assert (await scrape(client)).get(GAUGE) == 0
    query = f"What does the Acme warranty cover? ({uuid.uuid4()})"
    async with client.post("/v1/query", json={"query": query}, headers=auth("acme")) as resp:
        assert resp.status == 200, await resp.text()
    # The answer is written to the cache after the response.
    for _ in range(200):
        held = (await scrape(client)).get(GAUGE) or 0
        if held > 0:
            break
        await asyncio.sleep(0.05)
    assert held > 0
