"""First run (`querygate serve --sample-corpus`): the port opens while the sample corpus is
still ingesting in the background, /readyz says how far, and queries are answered meanwhile."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import requests

from tests.fixtures.gateway import REPO_ROOT, free_port
from tests.integration.test_openapi import request_fits

SAMPLE_DOCUMENTS = 10_033
# The port must open long before the sample could be ingested (minutes); the time to import
# litellm and load the model on a busy 2-core machine is the rest.
OPEN_WITHIN_S = 45.0


def _readyz(url: str) -> dict[str, Any] | None:
    try:
        response = requests.get(f"{url}/readyz", timeout=2)
    except requests.ConnectionError:
        return None
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def test_the_port_opens_and_answers_while_the_sample_ingests(tmp_path: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {"QUERYGATE_DATA_DIR": str(tmp_path / "data"), "PATH": "/usr/bin:/bin"}
    log_path = tmp_path / "serve.log"
    with log_path.open("wb") as log_file:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gateway", "serve", "--port", str(port), "--sample-corpus"],
            cwd=REPO_ROOT,
            env=env,
            stdout=log_file,
            stderr=subprocess.STDOUT,
        )
    try:
        started = time.monotonic()
        body = None
        while body is None and time.monotonic() - started < OPEN_WITHIN_S:
            assert proc.poll() is None, log_path.read_text()[-3000:]
            body = _readyz(url)
            time.sleep(0.2)
        assert body is not None, f"port not open in {OPEN_WITHIN_S}s: {log_path.read_text()}"
        assert request_fits("Readiness", body), body  # the documented /readyz, ingest included
        ingest = body["ingest"]
        assert ingest["state"] in ("pending", "running")
        assert ingest["partial_index"] is True
        assert ingest["tenant"] == "demo"

        # It progresses, with a rate and an ETA, while the gateway answers.
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            ingest = (_readyz(url) or {})["ingest"]
            if ingest["state"] == "running" and ingest["documents_done"] > 0:
                break
            time.sleep(0.5)
        assert ingest["documents_total"] == SAMPLE_DOCUMENTS
        assert 0 < ingest["documents_done"] < SAMPLE_DOCUMENTS
        assert ingest["rate_docs_per_s"] > 0 and ingest["eta_s"] > 0
        assert ingest["embedding_workers"] >= 1

        assert body["ready"] is True and body["complete"] is False

        key = (tmp_path / "data" / "demo_api_key").read_text().strip()
        answer = requests.post(
            f"{url}/v1/query",
            headers={"Authorization": f"Bearer {key}"},
            json={"query": "Who designed the Eiffel Tower?"},  # the README's example
            timeout=60,
        )
        assert answer.status_code == 200, answer.text
        answered = answer.json()
        # Its pages are ingested first: right already, and saying the index is partial.
        assert answered["citations"][0]["doc_id"] == "Eiffel Tower", answered
        if (_readyz(url) or {})["ingest"]["state"] == "running":
            partial = answered["partial_index"]
            assert partial["documents_total"] == SAMPLE_DOCUMENTS
            assert answer.headers["X-Querygate-Partial-Index"].endswith(f"/{SAMPLE_DOCUMENTS}")

        # Next to the key: what answers now and how long the rest will take.
        deadline = time.monotonic() + 120
        while "answering now from" not in log_path.read_text() and time.monotonic() < deadline:
            time.sleep(0.5)
        assert "the rest in about" in log_path.read_text(), log_path.read_text()[-3000:]
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
    assert proc.returncode == 0, log_path.read_text()[-3000:]
    assert '"msg": "ingest started"' in log_path.read_text()
