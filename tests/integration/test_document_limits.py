"""A document write cannot hold the shared embedder for minutes: a document making more than
`server.max_document_chunks` chunks is refused with 413 before any embedding, and its stored
version stays; a document under the cap is indexed as before."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from tests.fixtures.gateway import GatewayProcess, start_gateway, stop_gateway

pytestmark = pytest.mark.integration

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


@pytest.fixture(scope="module")
def capped(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    overrides = {"server": {"max_document_chunks": MAX_CHUNKS}}
    gw = start_gateway(Path(tmp_path_factory.mktemp("capped")), None, overrides=overrides)
    yield gw
    stop_gateway(gw)


def put(gw: GatewayProcess, doc_id: str, text: str) -> requests.Response:
    return requests.put(
        f"{gw.url}/v1/documents/{doc_id}",
        json={"title": "Acme manual", "text": text},
        headers=gw.headers(),
        timeout=120,
    )


def cpu_s(pid: int) -> float:
    """CPU seconds (user + system) the process has used so far."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_a_prose_document_under_the_cap_is_indexed(capped: GatewayProcess) -> None:
    resp = put(capped, f"prose-{uuid.uuid4().hex[:6]}", PROSE)
    assert resp.status_code == 201, resp.text
    assert 1 < resp.json()["chunks"] <= MAX_CHUNKS


@pytest.mark.parametrize("text", [DENSE, SECTIONS], ids=["dense", "many-sections"])
def test_a_document_making_too_many_chunks_is_413_before_any_embedding(
    capped: GatewayProcess, text: str
) -> None:
    doc_id = f"manual-{uuid.uuid4().hex[:6]}"
    assert put(capped, doc_id, PROSE).status_code == 201
    before = cpu_s(capped.proc.pid)
    resp = put(capped, doc_id, text)
    spent = cpu_s(capped.proc.pid) - before
    assert resp.status_code == 413, resp.text
    error = resp.json()["error"]
    assert error["type"] == "payload_too_large"
    assert error["message"].startswith("text: ")
    assert f"more than {MAX_CHUNKS} chunks" in error["message"]
    assert "max_document_chunks" in error["message"]
    # Embedding the dense text's 239 chunks alone takes many CPU-seconds.
    assert spent < 3.0, f"{spent:.1f} CPU-seconds spent on a refused document"
    # Nothing was written: the stored version is still the prose.
    again = put(capped, doc_id, PROSE)
    assert again.status_code == 200, again.text
    assert again.json()["result"] == "unchanged"
