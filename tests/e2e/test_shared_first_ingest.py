"""A tenant's first ingest by `querygate ingest`, another process on the gateway's data
directory, as a running gateway answers: that tenant's answers carry partial_index and its
header, no other tenant's do, and /readyz says complete: false, until the ingest is done."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from gateway.ingest.progress import IngestProgress
from gateway.ingest.shared_progress import ProgressFile
from tests.fixtures.gateway import GatewayProcess, start_gateway, stop_gateway

HEADER = "X-Querygate-Partial-Index"
SEEN_WITHIN_S = 10.0  # the gateway looks at the file at most once a second


@pytest.fixture
def gw(tmp_path: Path) -> Iterator[GatewayProcess]:
    process = start_gateway(tmp_path / "gw", None)
    try:
        yield process
    finally:
        stop_gateway(process)


def ask(gw: GatewayProcess, tenant: str) -> requests.Response:
    response = requests.post(
        f"{gw.url}/v1/query",
        json={"query": "What does the warranty cover?"},
        headers={**gw.headers(tenant), "Cache-Control": "no-cache"},
        timeout=60,
    )
    assert response.status_code == 200, response.text
    return response


def until(check: Any) -> Any:
    deadline = time.monotonic() + SEEN_WITHIN_S
    while not (found := check()) and time.monotonic() < deadline:
        time.sleep(0.2)
    return found


def test_another_processs_first_ingest_is_said_to_its_tenant_only(gw: GatewayProcess) -> None:
    # What `querygate ingest` writes while it fills acme's index for the first time.
    progress = IngestProgress("acme", "documents", state="running", done=2, total=5)
    writer = ProgressFile(gw.config_path.parent / "data", progress)
    writer.update(force=True)

    answer = until(lambda: (r := ask(gw, "acme")).headers.get(HEADER) and r)
    assert answer, "the gateway never said acme's index is partial"
    assert answer.headers[HEADER] == "2/5"
    assert answer.json()["partial_index"] == {"documents_done": 2, "documents_total": 5}
    other = ask(gw, "globex")
    assert HEADER not in other.headers and "partial_index" not in other.json()
    ready = until(
        lambda: (
            (r := requests.get(f"{gw.url}/readyz", timeout=10).json())["complete"] is False and r
        )
    )
    assert ready and ready["ready"] is True, ready

    writer.remove()  # every document is in
    assert until(lambda: requests.get(f"{gw.url}/readyz", timeout=10).json()["complete"])
    assert until(lambda: HEADER not in ask(gw, "acme").headers)
