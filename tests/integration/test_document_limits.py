"""A document write cannot hold the shared embedder for minutes: a document making more than
`server.max_document_chunks` chunks is refused with 413 before any embedding, and its stored
version stays; a document under the cap is indexed as before. The app in process, its embedder
the server's own behind a counter of the texts it is given."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

import pytest

from backends.embeddings.base import Embedder
from backends.retrieval.base import Vector
from tests.fixtures.app import Client, OpenClient, auth

pytestmark = pytest.mark.asyncio(loop_scope="session")

MAX_CHUNKS = 40
PROSE = " ".join(
    f"The Acme widget model {i} ships with a two year warranty that covers parts and labour, "
    f"and its manual lists error code ERR-{4400 + i} for a blocked fan."
    for i in range(120)
)
# Punctuation-dense: two tokens per two characters, 239 chunks for 60,000 characters (about
# 17 CPU-seconds of embedding), and long enough that one pass of the tokenizer refuses it.
DENSE = "a-" * 30_000
# Short, but every heading starts a section and each section makes a chunk: refused once
# chunked, by the count itself.
SECTIONS = "\n".join(f"# Part {i}\nPart {i} of the Acme manual." for i in range(MAX_CHUNKS + 20))


class CountingEmbedder:
    """An embedder, counting the texts it embeds."""

    def __init__(self, inner: Embedder) -> None:
        self._inner = inner
        self.model_id, self.dimension = inner.model_id, inner.dimension
        self.texts = 0

    async def embed(self, texts: Sequence[str]) -> Vector:
        self.texts += len(texts)
        return await self._inner.embed(texts)

    async def aclose(self) -> None:
        return None  # the session's embedder outlives this app


@pytest.fixture(scope="module")
def embedder(served_embedder: Embedder) -> CountingEmbedder:
    return CountingEmbedder(served_embedder)


@pytest.fixture(scope="module")
async def capped(app_client: OpenClient, embedder: CountingEmbedder) -> Client:
    return await app_client(embedder=embedder, server={"max_document_chunks": MAX_CHUNKS})


async def put(client: Client, doc_id: str, text: str) -> tuple[int, Any]:
    body = {"title": "Acme manual", "text": text}
    async with client.put(f"/v1/documents/{doc_id}", json=body, headers=auth()) as resp:
        return resp.status, await resp.json()


async def test_a_prose_document_under_the_cap_is_indexed(capped: Client) -> None:
    status, body = await put(capped, f"prose-{uuid.uuid4().hex[:6]}", PROSE)
    assert status == 201, body
    assert 1 < body["chunks"] <= MAX_CHUNKS


@pytest.mark.parametrize("text", [DENSE, SECTIONS], ids=["dense", "many-sections"])
async def test_a_document_making_too_many_chunks_is_413_before_any_embedding(
    capped: Client, embedder: CountingEmbedder, text: str
) -> None:
    doc_id = f"manual-{uuid.uuid4().hex[:6]}"
    assert (await put(capped, doc_id, PROSE))[0] == 201
    before = embedder.texts
    status, body = await put(capped, doc_id, text)
    assert status == 413, body
    error = body["error"]
    assert error["type"] == "payload_too_large"
    assert error["message"].startswith("text: ")
    assert f"more than {MAX_CHUNKS} chunks" in error["message"]
    assert "max_document_chunks" in error["message"]
    assert embedder.texts == before  # not one chunk of the refused text was embedded
    # Nothing was written: the stored version is still the prose.
    status, body = await put(capped, doc_id, PROSE)
    assert status == 200, body
    assert body["result"] == "unchanged"
