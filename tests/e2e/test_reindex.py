"""`querygate reindex` beside a running gateway, on both backends: queries and PUTs go on
throughout, none fails, and every acknowledged PUT is in the version that serves after the
switch; the old version stays for a rollback until it is dropped."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from gateway.ingest.pipeline import content_hash
from gateway.server.services import build_retriever
from gateway.settings import load_settings
from tests.fixtures.gateway import (
    GatewayProcess,
    TcpProxy,
    opensearch_retrieval,
    run_cli,
    start_gateway,
    stop_gateway,
)


@pytest.fixture(params=["embedded", "opensearch"])
def served(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[GatewayProcess]:
    retrieval = None
    if request.param == "opensearch":
        proxy: TcpProxy = request.getfixturevalue("opensearch_proxy")
        retrieval = opensearch_retrieval(proxy, "qg-reindex")
    gw = start_gateway(tmp_path, None, retrieval)
    yield gw
    stop_gateway(gw)


class Traffic:
    """PUTs (new documents and rewrites) and queries on threads until stopped."""

    def __init__(self, gw: GatewayProcess) -> None:
        self.gw = gw
        self.acknowledged: dict[str, str] = {}  # doc id -> content hash
        self.failures: list[str] = []
        self.queries = 0
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._put), threading.Thread(target=self._ask)]

    def __enter__(self) -> Traffic:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join()

    def _put(self) -> None:
        n = 0
        while not self._stop.is_set() or n < 3:
            doc_id = f"live-{n % 12}"  # new documents, then rewrites of them
            text = f"Live note {n}: the Acme widget part KX-{n:04d} ships in revision {n}."
            resp = requests.put(
                f"{self.gw.url}/v1/documents/{doc_id}",
                json={"title": doc_id, "text": text},
                headers=self.gw.headers(),
                timeout=60,
            )
            if resp.status_code in (200, 201):
                self.acknowledged[doc_id] = content_hash(doc_id, text)
            else:
                self.failures.append(f"PUT {resp.status_code} {resp.text[:200]}")
            n += 1

    def _ask(self) -> None:
        while not self._stop.is_set():
            resp = requests.post(
                f"{self.gw.url}/v1/query",
                json={"query": "How do I reset the Acme router?", "route": "lookup"},
                headers=self.gw.headers(),
                timeout=60,
            )
            self.queries += 1
            if resp.status_code != 200 or not resp.json()["citations"]:
                self.failures.append(f"query {resp.status_code} {resp.text[:200]}")


def stored_hashes(config: Path, doc_ids: list[str]) -> dict[str, str]:
    async def read() -> dict[str, str]:
        settings = load_settings(config)
        retriever = build_retriever(settings, settings.retrieval.opensearch.dimension)
        try:
            return await retriever.content_hashes("acme", doc_ids)
        finally:
            await retriever.aclose()

    return asyncio.run(read())


def status(gw: GatewayProcess) -> dict[str, object]:
    done = run_cli(gw.config_path, "reindex", "--tenant", "acme", "--status")
    assert done.returncode == 0, done.stderr
    line: dict[str, object] = json.loads(done.stdout)
    return line


def test_reindex_beside_a_serving_gateway(served: GatewayProcess) -> None:
    with Traffic(served) as traffic:
        done = run_cli(served.config_path, "reindex", "--tenant", "acme")

    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["switched"] and report["version"] == 2 and report["documents"] > 0
    assert traffic.queries > 0 and traffic.acknowledged
    assert traffic.failures == []
    stored = stored_hashes(served.config_path, list(traffic.acknowledged))
    assert stored == traffic.acknowledged
    versions = status(served)
    assert versions["serving"]["version"] == 2  # type: ignore[index]
    assert versions["previous"]["version"] == 1  # type: ignore[index]
    # Another build waits for the old version to be dropped (or rolled back to).
    again = run_cli(served.config_path, "reindex", "--tenant", "acme")
    assert again.returncode == 2 and "--drop-old" in again.stderr
    rolled = run_cli(served.config_path, "reindex", "--tenant", "acme", "--rollback")
    assert rolled.returncode == 0, rolled.stderr
    assert json.loads(rolled.stdout)["serving"]["version"] == 1
    body = {"query": "How do I reset the Acme router?", "route": "lookup"}
    resp = requests.post(f"{served.url}/v1/query", json=body, headers=served.headers(), timeout=60)
    assert resp.status_code == 200 and resp.json()["citations"]
    dropped = run_cli(served.config_path, "reindex", "--all", "--drop-old")
    assert dropped.returncode == 2 and "globex" in dropped.stderr  # globex has nothing to drop
    assert status(served)["previous"] is None
