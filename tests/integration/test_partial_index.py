"""While a tenant's index is still being filled by an ingest of the process, every answer to
that tenant says so (`partial_index` and `X-Querygate-Partial-Index`, the stream's `done`
event, the chat extension) and no other tenant's does; `/readyz` stays ready and says
`complete: false` until the ingest ends. The app in process, no model: extractive answers."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from gateway.http.appkeys import SERVICES
from gateway.ingest.progress import IngestProgress
from tests.fixtures.app import Client, OpenClient, auth
from tests.integration.test_openapi import request_fits

pytestmark = pytest.mark.asyncio(loop_scope="session")

HEADER = "X-Querygate-Partial-Index"
QUESTION = {"query": "What does the Acme warranty cover?"}


@pytest.fixture(scope="module")
async def client(app_client: OpenClient) -> Client:
    return await app_client()


@pytest.fixture
def acme_ingest(client: Client) -> Iterator[IngestProgress]:
    """acme's index being filled: 3 of 10 documents done."""
    progress = IngestProgress("acme", "test", state="running", done=3, total=10)
    client.app[SERVICES].ingests.track(progress)
    yield progress
    progress.state = "done"


async def query(client: Client, tenant: str, **extra: Any) -> tuple[dict[str, Any], str | None]:
    headers = {**auth(tenant), "Cache-Control": "no-cache"}
    async with client.post("/v1/query", json={**QUESTION, **extra}, headers=headers) as resp:
        assert resp.status == 200, await resp.text()
        return await resp.json(), resp.headers.get(HEADER)


async def test_answers_say_the_index_is_partial_to_its_tenant_only(
    client: Client, acme_ingest: IngestProgress
) -> None:
    body, header = await query(client, "acme")
    assert body["partial_index"] == {"documents_done": 3, "documents_total": 10}
    assert header == "3/10"
    assert request_fits("QueryAnswer", body), body
    other, other_header = await query(client, "globex")
    assert "partial_index" not in other and other_header is None

    acme_ingest.done = 7  # it moves on: the next answer says how far
    body, header = await query(client, "acme")
    assert (body["partial_index"]["documents_done"], header) == (7, "7/10")


async def test_a_stream_says_it_in_its_headers_and_its_done_event(
    client: Client, acme_ingest: IngestProgress
) -> None:
    async with client.post(
        "/v1/query", json={**QUESTION, "stream": True}, headers=auth("acme")
    ) as resp:
        assert resp.status == 200
        assert resp.headers[HEADER] == "3/10"
        text = await resp.text()
    done = text.split("event: done\ndata: ", 1)[1].split("\n\n", 1)[0]
    assert json.loads(done)["partial_index"] == {"documents_done": 3, "documents_total": 10}


async def test_chat_says_it_in_its_extension_and_header(
    client: Client, acme_ingest: IngestProgress
) -> None:
    chat = {"model": "auto", "messages": [{"role": "user", "content": QUESTION["query"]}]}
    async with client.post("/v1/chat/completions", json=chat, headers=auth("acme")) as resp:
        assert resp.status == 200, await resp.text()
        body = await resp.json()
        assert resp.headers[HEADER] == "3/10"
    assert body["querygate"]["partial_index"] == {"documents_done": 3, "documents_total": 10}
    assert request_fits("ChatCompletion", body), body

    async with client.post(
        "/v1/chat/completions", json={**chat, "stream": True}, headers=auth("acme")
    ) as resp:
        assert resp.headers[HEADER] == "3/10"
        chunks = [
            json.loads(line[len("data: ") :])
            for line in (await resp.text()).splitlines()
            if line.startswith("data: {")
        ]
    assert chunks[-1]["querygate"]["partial_index"]["documents_total"] == 10


async def test_readyz_stays_ready_and_says_complete_only_when_the_ingest_ends(
    client: Client, acme_ingest: IngestProgress
) -> None:
    async with client.get("/readyz") as resp:
        assert resp.status == 200
        body = await resp.json()
    assert (body["ready"], body["complete"]) == (True, False)
    assert request_fits("Readiness", body), body

    acme_ingest.state = "done"
    async with client.get("/readyz") as resp:
        assert (await resp.json())["complete"] is True
    answered, header = await query(client, "acme")
    assert "partial_index" not in answered and header is None


async def test_an_ingest_still_reading_its_documents_has_no_total_yet(client: Client) -> None:
    progress = IngestProgress("acme", "test")  # pending: the list is being read
    client.app[SERVICES].ingests.track(progress)
    try:
        body, header = await query(client, "acme")
    finally:
        progress.state = "done"
    assert body["partial_index"] == {"documents_done": 0, "documents_total": None}
    assert header == "0/?"
