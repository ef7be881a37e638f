"""A blank title or text (white space or invisible characters only, `gateway.text.is_blank`) is
a 422 naming its field over HTTP, and nothing of it is stored; a title left out names the
document by its id. The app in process (a blank file given to
`querygate ingest`: tests/e2e/test_cli.py)."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from tests.fixtures.app import Client, OpenClient, auth

pytestmark = pytest.mark.asyncio(loop_scope="session")


@pytest.fixture(scope="module")
async def client(app_client: OpenClient) -> Client:
    return await app_client()


async def put(client: Client, doc_id: str, body: dict[str, str]) -> tuple[int, Any]:
    async with client.put(f"/v1/documents/{doc_id}", json=body, headers=auth()) as resp:
        return resp.status, await resp.json()


@pytest.mark.parametrize(
    "title",
    ["\u200b\u200e", " \u2060\t", "\x00\x01", "\u0301"],
    ids=["zero-width-and-bidi", "space-and-word-joiner", "controls-only", "lone-mark"],
)
async def test_a_blank_title_is_422_naming_the_field_and_nothing_is_stored(
    client: Client, title: str
) -> None:
    doc_id = f"manual-{uuid.uuid4().hex[:6]}"
    text = "ERR-4471 means the certificate expired."
    status, body = await put(client, doc_id, {"title": title, "text": text})
    assert status == 422, body
    error = body["error"]
    assert error["type"] == "validation_error"
    assert "title" in error["message"] and "blank" in error["message"]
    async with client.delete(f"/v1/documents/{doc_id}", headers=auth()) as gone:
        assert gone.status == 404, await gone.text()


@pytest.mark.parametrize("body", [{}, {"title": ""}], ids=["left-out", "empty"])
async def test_a_title_left_out_names_the_document_by_its_id(
    client: Client, body: dict[str, str]
) -> None:
    doc_id = f"faq-{uuid.uuid4().hex[:6]}"
    status, got = await put(
        client, doc_id, {**body, "text": "ERR-4471 means the certificate expired."}
    )
    assert status == 201, got
    assert got["doc_id"] == doc_id


async def test_an_invisible_only_text_is_422_naming_the_field(client: Client) -> None:
    status, body = await put(
        client, f"ghost-{uuid.uuid4().hex[:6]}", {"title": "Ghost", "text": "\u200b\u200e"}
    )
    assert status == 422, body
    assert body["error"]["message"].startswith("text")
