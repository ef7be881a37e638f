"""A blank title or text (white space or invisible characters only, `gateway.text.is_blank`) is
a 422 naming its field over HTTP, against a real gateway process; `querygate ingest` names a
blank file and ingests nothing of it."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from tests.fixtures.gateway import GatewayProcess, run_cli, start_gateway, stop_gateway

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    gateway = start_gateway(Path(tmp_path_factory.mktemp("blank")), None)
    yield gateway
    stop_gateway(gateway)


def put(gw: GatewayProcess, doc_id: str, body: dict[str, str]) -> requests.Response:
    return requests.put(
        f"{gw.url}/v1/documents/{doc_id}", json=body, headers=gw.headers(), timeout=60
    )


@pytest.mark.parametrize(
    "title",
    ["\u200b\u200e", " \u2060\t", "\x00\x01", "\u0301"],
    ids=["zero-width-and-bidi", "space-and-word-joiner", "controls-only", "lone-mark"],
)
def test_a_blank_title_is_422_naming_the_field_and_nothing_is_stored(
    gw: GatewayProcess, title: str
) -> None:
    doc_id = f"manual-{uuid.uuid4().hex[:6]}"
    resp = put(gw, doc_id, {"title": title, "text": "ERR-4471 means the certificate expired."})
    assert resp.status_code == 422, resp.text
    error = resp.json()["error"]
    assert error["type"] == "validation_error"
    assert "title" in error["message"] and "blank" in error["message"]
    gone = requests.delete(f"{gw.url}/v1/documents/{doc_id}", headers=gw.headers(), timeout=30)
    assert gone.status_code == 404, gone.text


@pytest.mark.parametrize("body", [{}, {"title": ""}], ids=["left-out", "empty"])
def test_a_title_left_out_names_the_document_by_its_id(
    gw: GatewayProcess, body: dict[str, str]
) -> None:
    doc_id = f"faq-{uuid.uuid4().hex[:6]}"
    resp = put(gw, doc_id, {**body, "text": "ERR-4471 means the certificate expired."})
    assert resp.status_code == 201, resp.text
    assert resp.json()["doc_id"] == doc_id


def test_an_invisible_only_text_is_422_naming_the_field(gw: GatewayProcess) -> None:
    resp = put(gw, f"ghost-{uuid.uuid4().hex[:6]}", {"title": "Ghost", "text": "\u200b\u200e"})
    assert resp.status_code == 422, resp.text
    assert resp.json()["error"]["message"].startswith("text")


def test_ingest_names_an_invisible_only_file_and_ingests_nothing_of_it(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(f"data_dir: {tmp_path / 'data'}\n")
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "warranty.md").write_text("# Warranty\n\nAcme's warranty lasts two years.\n")
    (docs / "ghost.txt").write_text("\u200b\u200e\n\u2060\n", encoding="utf-8")
    done = run_cli(config, "ingest", "--tenant", "t", str(docs))
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["added"] == 1
    assert "blank text" in done.stderr and "ghost.txt" in done.stderr
    assert "Traceback" not in done.stderr
