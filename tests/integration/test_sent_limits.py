"""Length limits count the characters a client sent, before cleaning, as JSON Schema's
`maxLength` counts them, so docs/openapi.yaml can state them: a text under a limit only once
its control characters are removed is still over it."""

from __future__ import annotations

from typing import Any

import pytest

from tests.fixtures.app import Client, OpenClient, auth

pytestmark = pytest.mark.asyncio(loop_scope="session")


@pytest.fixture(scope="module")
async def client(app_client: OpenClient) -> Client:
    return await app_client()


async def status_of(client: Client, method: str, path: str, body: dict[str, Any]) -> int:
    async with client.request(method, path, headers=auth(), json=body) as resp:
        return resp.status


@pytest.mark.parametrize(("limit", "field"), [(256, "user"), (1000, "title")])
async def test_a_limit_counts_the_characters_sent(client: Client, limit: int, field: str) -> None:
    def body(value: str) -> dict[str, Any]:
        if field == "title":
            return {"title": value, "text": "Some text."}
        return {"model": "lookup", "messages": [{"role": "user", "content": "hi"}], "user": value}

    method, path = (
        ("PUT", "/v1/documents/limits.md")
        if field == "title"
        else (
            "POST",
            "/v1/chat/completions",
        )
    )
    assert await status_of(client, method, path, body("a" * limit)) in (200, 201)
    # `limit` characters once cleaned, more as sent
    assert await status_of(client, method, path, body("a" * (limit - 1) + "\x00\x01")) == 422
