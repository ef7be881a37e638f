"""`GET /v1/models`: the model names a client may send, and the chat endpoint agrees. The app
in process, with both tiers (a `FakeLLM`) or none (the OpenAI client's listing, which needs a
server of its own: tests/e2e/test_openai_client.py)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.fakes.llm import FakeLLM
from tests.fixtures.app import Client, OpenClient, auth

pytestmark = pytest.mark.asyncio(loop_scope="session")


@pytest.fixture(scope="module")
async def generating(app_client: OpenClient) -> Client:
    return await app_client(llm=FakeLLM())


@pytest.fixture(scope="module")
async def extractive(app_client: OpenClient) -> Client:
    return await app_client()


async def models(client: Client, tenant: str = "acme") -> tuple[int, Any]:
    async with client.get("/v1/models", headers=auth(tenant)) as resp:
        return resp.status, await resp.json()


def ids(body: Any) -> list[str]:
    return [m["id"] for m in body["data"]]


async def chat(client: Client, model: str, content: str) -> tuple[int, Any]:
    body = {"model": model, "messages": [{"role": "user", "content": content}]}
    async with client.post("/v1/chat/completions", headers=auth(), json=body) as resp:
        return resp.status, await resp.json()


async def test_models_lists_auto_and_every_route_a_request_may_force(
    generating: Client,
) -> None:
    status, body = await models(generating)
    assert status == 200
    assert body["object"] == "list"
    assert ids(body) == ["auto", "direct", "lookup", "multihop"]
    assert {m["owned_by"] for m in body["data"]} == {"querygate"}
    assert {m["object"] for m in body["data"]} == {"model"}


async def test_a_deployment_without_a_large_model_lists_multihop_answered_by_lookup(
    extractive: Client,
) -> None:
    status, body = await models(extractive)
    assert status == 200
    assert ids(body) == ["auto", "direct", "lookup", "multihop"]
    assert body["data"][-1]["querygate"]["answered_by"] == "lookup"
    status, body = await chat(extractive, "multihop", "Acme warranty?")
    assert status == 200, body
    assert body["querygate"]["route"] == "lookup"


async def test_a_tenant_that_may_not_force_a_route_is_offered_auto_alone(
    generating: Client,
) -> None:
    status, body = await models(generating, tenant="globex")
    assert status == 200
    assert ids(body) == ["auto"]


async def test_models_needs_a_tenant_key(generating: Client) -> None:
    async with generating.get("/v1/models") as resp:
        assert resp.status == 401
    bad = {"Authorization": "Bearer not-a-key"}
    async with generating.get("/v1/models", headers=bad) as resp:
        assert resp.status == 401


async def test_a_model_not_listed_is_404_on_chat_and_on_retrieve(generating: Client) -> None:
    status, _ = await chat(generating, "gpt-4o", "hi")
    assert status == 404
    async with generating.get("/v1/models/gpt-4o", headers=auth()) as resp:
        assert resp.status == 404
