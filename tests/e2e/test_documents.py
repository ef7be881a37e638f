"""Live document changes through the HTTP API, on both retrieval backends."""

from __future__ import annotations

import uuid

import pytest
import requests

from tests.fixtures.gateway import GatewayProcess


@pytest.fixture(params=["embedded", "opensearch"])
def gw(request: pytest.FixtureRequest) -> GatewayProcess:
    name = "gateway" if request.param == "embedded" else "opensearch_gateway"
    fixture: GatewayProcess = request.getfixturevalue(name)
    return fixture


def put(gw: GatewayProcess, doc_id: str, text: str, tenant: str = "acme") -> requests.Response:
    return requests.put(
        f"{gw.url}/v1/documents/{doc_id}",
        json={"title": doc_id, "text": text},
        headers=gw.headers(tenant),
        timeout=30,
    )


def ask(gw: GatewayProcess, question: str, tenant: str = "acme") -> dict[str, object]:
    # Forced lookup: these tests are about what retrieval can see, so the answer must be the
    # one-shot lookup's (a forced route never escalates), whatever the classifier thinks.
    body = {"query": question, "route": "lookup"}
    resp = requests.post(f"{gw.url}/v1/query", json=body, headers=gw.headers(tenant), timeout=30)
    assert resp.status_code == 200, resp.text
    body: dict[str, object] = resp.json()
    return body


def cited(body: dict[str, object]) -> set[str]:
    return {c["doc_id"] for c in body["citations"]}  # type: ignore[attr-defined,index]


def test_a_new_document_is_found_by_the_next_query(gw: GatewayProcess) -> None:
    code = f"ZX-{uuid.uuid4().int % 10**8:08d}"  # digits: always an identifier
    doc_id = f"note-{code}"
    resp = put(gw, doc_id, f"Error {code} means the Acme fan is blocked. Clean the fan grille.")
    assert resp.status_code == 201, resp.text
    assert resp.json()["result"] == "created"
    assert doc_id in cited(ask(gw, f"What does error {code} mean for the Acme fan?"))


def test_the_same_content_again_is_unchanged(gw: GatewayProcess) -> None:
    doc_id = f"same-{uuid.uuid4().hex[:6]}"
    text = "The Acme cable is blue and two metres long."
    assert put(gw, doc_id, text).json()["result"] == "created"
    again = put(gw, doc_id, text).json()
    assert again["result"] == "unchanged"


def test_a_change_retires_the_tenants_cached_answers(gw: GatewayProcess) -> None:
    question = f"How long is the Acme cable of batch {uuid.uuid4().hex[:6]}?"
    put(gw, f"cable-{uuid.uuid4().hex[:6]}", "The Acme cable is two metres long.")
    assert ask(gw, question)["cache"] == "miss"
    assert ask(gw, question)["cache"] == "exact"
    generation = put(gw, f"other-{uuid.uuid4().hex[:6]}", "Acme sells a blue cable.").json()
    assert generation["generation"] > 0
    assert ask(gw, question)["cache"] == "miss"


def test_a_deleted_document_is_gone_and_a_second_delete_is_404(gw: GatewayProcess) -> None:
    code = f"QQ-{uuid.uuid4().int % 10**8:08d}"
    doc_id = f"gone-{code}"
    put(gw, doc_id, f"Error {code} means the Acme lid is open. Close the lid.")
    url = f"{gw.url}/v1/documents/{doc_id}"
    assert requests.delete(url, headers=gw.headers(), timeout=30).json()["result"] == "deleted"
    assert doc_id not in cited(ask(gw, f"What does error {code} mean for the Acme lid?"))
    second = requests.delete(url, headers=gw.headers(), timeout=30)
    assert second.status_code == 404


def test_a_tenant_cannot_touch_another_tenants_document(gw: GatewayProcess) -> None:
    doc_id = f"private-{uuid.uuid4().hex[:6]}"
    put(gw, doc_id, "Globex keeps its private Acme cable notes here.", tenant="globex")
    url = f"{gw.url}/v1/documents/{doc_id}"
    assert requests.delete(url, headers=gw.headers("acme"), timeout=30).status_code == 404
    body = ask(gw, "What does Globex keep in its private Acme cable notes?")
    assert cited(body), body  # else the isolation check would pass vacuously
    assert doc_id not in cited(body)


def test_an_empty_document_body_is_422(gw: GatewayProcess) -> None:
    resp = put(gw, "empty", "   ")
    assert resp.status_code == 422
    assert "text" in resp.json()["error"]["message"]
