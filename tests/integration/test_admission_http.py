"""Admission, deadlines and accounting over HTTP, in process, with a scriptable embedder.

Every outcome is fired for real and read back as the sample value of
`querygate_http_requests_total{endpoint,outcome}` (and `querygate_requests_total` for answers),
with the request's one log line. The embedder is a fake whose texts script it: "SLEEP<s>"
holds the (single, serial) encoder that long; "POISON" fails the batch it is in.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import re
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest
from aiohttp import web

from backends.embeddings.coalescing import CoalescingEmbedder
from backends.errors import BackendUnavailable
from backends.retrieval.base import EmptyDocument, Vector
from gateway.core.runtime import build_runtime
from gateway.http.appkeys import METRICS, RUNTIME, SERVICES
from gateway.server.reload import RELOADER
from gateway.settings import hash_api_key
from tests.fixtures.app import Client, OpenClient
from tests.metrics import Scrape

pytestmark = pytest.mark.asyncio(loop_scope="session")

KEYS = {"acme": "key-adm-acme-01", "globex": "key-adm-globex-02", "initech": "key-adm-ini-03"}
ADMIN_KEY = "key-adm-admin-04"
QUERY = "POST /v1/query"
PUT = "PUT /v1/documents/{doc_id}"
_SLEEP = re.compile(r"SLEEP([0-9.]+)")


def auth(tenant: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {KEYS[tenant]}"}


class ScriptedEmbedder:
    model_id = "scripted"
    dimension = 384

    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    async def embed(self, texts: Sequence[str]) -> Vector:
        self.calls.append(list(texts))
        if any("POISON" in t for t in texts):
            raise ValueError("the tokenizer cannot take this input")
        for t in texts:
            if m := _SLEEP.search(t):
                await asyncio.sleep(float(m.group(1)))
        rows = []
        for t in texts:
            seed = int.from_bytes(hashlib.sha256(t.encode()).digest()[:8], "little")
            v = np.random.default_rng(seed).standard_normal(self.dimension).astype(np.float32)
            rows.append(v / np.linalg.norm(v))
        return np.stack(rows)

    async def aclose(self) -> None:
        return None


App = tuple[Client, "ScriptedEmbedder"]


async def boom(request: web.Request) -> web.Response:
    raise RuntimeError("a bug")


@pytest.fixture(scope="module")
async def app(app_client: OpenClient) -> App:
    fake = ScriptedEmbedder()
    client = await app_client(
        embedder=CoalescingEmbedder(fake),  # queries share batches, as in the server
        corpora={},
        routes=[web.get("/boom", boom)],
        reloadable=False,
        server={
            "request_timeout_s": 1.5,
            "write_timeout_s": 1.5,
            "body_read_timeout_s": 0.3,
            "sse_keepalive_s": 0.1,  # a slow stream opens early: its failures are events
            "admission": {
                "queries": {
                    "max_inflight": 2,
                    "max_queued": 1,
                    "tenant_max_inflight": 1,
                    "tenant_max_queued": 1,
                },
                "retry_after_s": 3,
            },
        },
        tenants=[{"id": t, "api_key_sha256": hash_api_key(k)} for t, k in KEYS.items()],
        admin_api_key_sha256=hash_api_key(ADMIN_KEY),
        router={"classifier": "heuristic", "escalation": {"enabled": False}},
        cache={"backend": "off"},
    )
    return client, fake


def sample(client: Client, name: str, **labels: str) -> float:
    return Scrape.of(client.app[METRICS]).get(name, **labels) or 0.0


def outcome(client: Client, endpoint: str, result: str) -> float:
    return sample(client, "querygate_http_requests_total", endpoint=endpoint, outcome=result)


async def ask(
    client: Client, tenant: str, query: str
) -> tuple[int, dict[str, Any], dict[str, str]]:
    resp = await client.post(
        "/v1/query", json={"query": query, "route": "lookup"}, headers=auth(tenant)
    )
    return resp.status, await resp.json(), dict(resp.headers)


def request_lines(caplog: pytest.LogCaptureFixture, request_id: str) -> list[logging.LogRecord]:
    return [
        r
        for r in caplog.records
        if r.name == "gateway.obs.accounting" and getattr(r, "request_id", None) == request_id
    ]


async def test_an_answer_is_counted_and_logged_once_with_tenant_and_route(
    app: App, caplog: pytest.LogCaptureFixture
) -> None:
    client, _ = app
    caplog.set_level(logging.INFO)
    before = outcome(client, QUERY, "ok")
    status, body, _ = await ask(client, "acme", "What is the Acme warranty?")
    assert status == 200, body
    assert outcome(client, QUERY, "ok") == before + 1
    assert (
        sample(client, "querygate_requests_total", route="lookup", outcome="ok", cache="miss") >= 1
    )
    lines = request_lines(caplog, body["id"])
    assert len(lines) == 1
    line = lines[0].__dict__
    assert (line["tenant"], line["endpoint"], line["outcome"]) == ("acme", QUERY, "ok")
    assert line["route"] == "lookup" and lines[0].exc_info is None
    assert not [r for r in caplog.records if r.getMessage() == "answered"]


async def test_a_bad_query_fails_alone_in_a_shared_batch(
    app: App,
) -> None:
    client, fake = app
    # A write holds the encoder for a moment, so the two queries queue for the same batch.
    busy = asyncio.ensure_future(
        client.put(
            "/v1/documents/busy",
            json={"text": "SLEEP0.3 Initech makes staplers."},
            headers=auth("initech"),
        )
    )
    await asyncio.sleep(0.1)
    calls = len(fake.calls)
    results = await asyncio.gather(
        ask(client, "acme", "POISON question"),
        ask(client, "globex", "What does Globex sell?"),
    )
    assert (await busy).status == 201
    # Both waited for the same batch; the poison fails only its own request.
    assert any(len(c) == 2 for c in fake.calls[calls:])
    assert results[1][0] == 200
    assert results[0][0] == 500


async def test_a_client_error_is_counted(
    app: App,
) -> None:
    client, _ = app
    before = outcome(client, QUERY, "client_error")
    resp = await client.post("/v1/query", json={"query": ""}, headers=auth("acme"))
    assert resp.status == 422
    resp = await client.post("/v1/query", json={"query": "x"})
    assert resp.status == 401
    assert outcome(client, QUERY, "client_error") == before + 2


async def test_tenant_over_share_gets_429_and_a_full_process_503_with_retry_after(
    app: App, caplog: pytest.LogCaptureFixture
) -> None:
    client, _ = app
    caplog.set_level(logging.INFO)
    shed_t, shed_p = outcome(client, QUERY, "shed_tenant"), outcome(client, QUERY, "shed_process")
    slow = [
        asyncio.ensure_future(ask(client, "acme", "SLEEP0.4 acme one")),  # runs
        asyncio.ensure_future(ask(client, "globex", "SLEEP0.4 globex one")),  # runs: full
    ]
    await asyncio.sleep(0.1)
    queued = asyncio.ensure_future(ask(client, "acme", "acme two"))  # waits: room full
    await asyncio.sleep(0.1)
    status, body, headers = await ask(client, "acme", "acme three")
    assert status == 429, body
    assert body["error"]["type"] == "rate_limited" and headers["Retry-After"] == "3"
    status, body, headers = await ask(client, "initech", "initech one")
    assert status == 503, body
    assert body["error"]["type"] == "overloaded" and headers["Retry-After"] == "3"
    assert [r[0] for r in await asyncio.gather(*slow, queued)] == [200, 200, 200]
    assert outcome(client, QUERY, "shed_tenant") == shed_t + 1
    assert outcome(client, QUERY, "shed_process") == shed_p + 1
    shed = [r for r in caplog.records if getattr(r, "outcome", None) == "shed_tenant"]
    assert shed and shed[-1].__dict__["tenant"] == "acme"


async def test_time_queued_for_admission_counts_in_the_route_latency(
    app: App,
) -> None:
    """The route latency histogram (what the latency SLO alerts read) starts at arrival: an
    overloaded worker's queueing shows there, not only in the HTTP histogram."""
    client, _ = app
    name = "querygate_request_duration_seconds_sum"
    before = sample(client, name, route="lookup")
    first = asyncio.ensure_future(ask(client, "acme", "SLEEP0.4 acme holds the slot"))
    await asyncio.sleep(0.1)
    # acme's share is one in flight: this one waits ~0.3 s for admission, then answers at once.
    second = await ask(client, "acme", "acme waits its turn")
    assert [second[0], (await first)[0]] == [200, 200]
    # 0.4 s for the first, plus the second's ~0.3 s in the queue (~0.4 s if queueing did not count).
    assert sample(client, name, route="lookup") - before >= 0.6


async def test_the_deadline_gives_503_counted_and_logged(
    app: App, caplog: pytest.LogCaptureFixture
) -> None:
    client, _ = app
    caplog.set_level(logging.INFO)
    before = outcome(client, QUERY, "deadline")
    none_before = sample(
        client, "querygate_requests_total", route="none", outcome="deadline", cache="miss"
    )
    status, body, headers = await ask(client, "acme", "SLEEP2 too slow")
    assert status == 503 and body["error"]["type"] == "deadline_exceeded"
    assert "Retry-After" in headers
    assert outcome(client, QUERY, "deadline") == before + 1
    assert (
        sample(client, "querygate_requests_total", route="none", outcome="deadline", cache="miss")
        == none_before + 1
    )
    lines = [r for r in caplog.records if getattr(r, "outcome", None) == "deadline"]
    assert len(lines) == 1 and lines[0].__dict__["tenant"] == "acme"
    await asyncio.sleep(0.6)  # the encoder finishes the slow text before the next test


async def test_a_document_write_has_a_deadline(
    app: App,
) -> None:
    client, _ = app
    before = outcome(client, PUT, "deadline")
    text = " ".join(f"SLEEP0.2 sentence {i}." for i in range(400))  # many chunks, slow ones
    resp = await client.put(
        "/v1/documents/slow", json={"title": "slow", "text": text}, headers=auth("acme")
    )
    assert resp.status == 503
    assert (await resp.json())["error"]["type"] == "deadline_exceeded"
    assert outcome(client, PUT, "deadline") == before + 1


async def _raw(client: Client, payload: bytes) -> tuple[Any, Any]:
    assert client.server.port is not None
    reader, writer = await asyncio.open_connection("127.0.0.1", client.server.port)
    writer.write(payload)
    await writer.drain()
    return reader, writer


def _post(body_len: int, tenant: str = "acme") -> bytes:
    return (
        f"POST /v1/query HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEYS[tenant]}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {body_len}\r\n\r\n"
    ).encode()


async def test_a_slow_body_gets_408(
    app: App,
) -> None:
    client, _ = app
    before = outcome(client, QUERY, "body_timeout")
    reader, writer = await _raw(client, _post(100) + b'{"query": ')
    status_line = await asyncio.wait_for(reader.readline(), 5)
    writer.close()
    assert b" 408 " in status_line
    assert outcome(client, QUERY, "body_timeout") == before + 1


async def test_a_client_that_leaves_is_a_disconnect_not_an_error(
    app: App, caplog: pytest.LogCaptureFixture
) -> None:
    client, _ = app
    caplog.set_level(logging.INFO)
    before = outcome(client, QUERY, "disconnect")
    errors = outcome(client, QUERY, "error")
    # Leaves during the body, then leaves while its answer is being worked out.
    _, writer = await _raw(client, _post(100) + b'{"query"')
    writer.close()
    body = b'{"query": "SLEEP0.3 leaving early", "route": "lookup"}'
    _, writer = await _raw(client, _post(len(body)) + body)
    await asyncio.sleep(0.1)
    writer.close()
    await asyncio.sleep(0.6)
    assert outcome(client, QUERY, "disconnect") == before + 2
    assert outcome(client, QUERY, "error") == errors
    assert not [r for r in caplog.records if r.exc_info is not None]


async def test_a_bug_is_a_500_counted_and_logged_once_with_its_traceback(
    app: App, caplog: pytest.LogCaptureFixture
) -> None:
    client, _ = app
    caplog.set_level(logging.INFO)
    before = outcome(client, "GET /boom", "error")
    resp = await client.get("/boom")
    assert resp.status == 500
    assert outcome(client, "GET /boom", "error") == before + 1
    lines = request_lines(caplog, resp.headers["X-Request-Id"])
    assert len(lines) == 1 and lines[0].exc_info is not None


async def test_probes_and_metrics_bypass_admission(
    app: App,
) -> None:
    client, _ = app
    slow = [asyncio.ensure_future(ask(client, t, f"SLEEP0.3 {t} busy")) for t in ("acme", "globex")]
    await asyncio.sleep(0.05)
    for path in ("/healthz", "/metrics"):
        resp = await client.get(path)
        assert resp.status == 200
    await asyncio.gather(*slow)


# -- outcomes of streams, bodies, handlers' own timeouts, the admin endpoint, reloaded limits --


def _sse_events(raw: str) -> list[tuple[str, str]]:
    events = []
    for frame in raw.split("\n\n"):
        lines = frame.splitlines()
        event = next((ln[7:] for ln in lines if ln.startswith("event: ")), "")
        data = next((ln[6:] for ln in lines if ln.startswith("data: ")), "")
        if event:
            events.append((event, data))
    return events


async def _stream(client: Client, query: str) -> tuple[int, str, str]:
    body = {"query": query, "route": "lookup", "stream": True}
    resp = await client.post("/v1/query", json=body, headers=auth("acme"))
    return resp.status, await resp.text(), resp.headers["X-Request-Id"]


async def test_a_stream_ended_by_an_error_is_counted_with_its_outcome_and_logged_once(
    app: App,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    client, _ = app
    caplog.set_level(logging.INFO)
    retriever = client.app[SERVICES].retriever

    async def down(*args: Any, **kwargs: Any) -> Any:
        await asyncio.sleep(0.3)  # past sse_keepalive_s: the stream is open, status 200 sent
        raise BackendUnavailable("index", "connection refused by 10.0.0.7:9200")

    monkeypatch.setattr(retriever, "search", down)
    ok, unavailable = outcome(client, QUERY, "ok"), outcome(client, QUERY, "unavailable")
    status, text, request_id = await _stream(client, "What does Acme sell?")
    assert status == 200
    assert _sse_events(text)[-1][0] == "error", text
    assert "10.0.0.7" not in text
    assert outcome(client, QUERY, "unavailable") == unavailable + 1
    assert outcome(client, QUERY, "ok") == ok
    lines = request_lines(caplog, request_id)
    assert len(lines) == 1, [r.getMessage() for r in lines]
    assert lines[0].__dict__["outcome"] == "unavailable"
    assert "10.0.0.7" in lines[0].__dict__["error"]  # the detail goes to the log only
    assert not [r for r in caplog.records if r.getMessage().startswith("stream")]

    # Past its deadline while the stream is open: counted as the deadline it is.
    monkeypatch.undo()
    deadline = outcome(client, QUERY, "deadline")
    status, text, request_id = await _stream(client, "SLEEP2 a slow stream")
    assert status == 200
    event, data = _sse_events(text)[-1]
    assert event == "error" and "deadline_exceeded" in data, text
    assert outcome(client, QUERY, "deadline") == deadline + 1
    lines = request_lines(caplog, request_id)
    assert len(lines) == 1 and lines[0].__dict__["outcome"] == "deadline"
    await asyncio.sleep(0.6)  # the encoder finishes the slow text before the next test


async def test_a_timeout_of_a_write_handler_s_own_is_not_reported_as_the_deadline(
    app: App, monkeypatch: pytest.MonkeyPatch
) -> None:
    client, _ = app

    async def times_out(*args: Any, **kwargs: Any) -> bool:
        raise TimeoutError  # a backend's own timeout that escaped its seam: a bug, not ours

    monkeypatch.setattr(client.app[SERVICES].retriever, "delete_document", times_out)
    endpoint = "DELETE /v1/documents/{doc_id}"
    deadline, error = outcome(client, endpoint, "deadline"), outcome(client, endpoint, "error")
    resp = await client.delete("/v1/documents/whatever", headers=auth("acme"))
    assert resp.status == 500
    assert outcome(client, endpoint, "deadline") == deadline
    assert outcome(client, endpoint, "error") == error + 1


async def test_a_body_that_cannot_be_decoded_gets_a_stable_400(
    app: App, caplog: pytest.LogCaptureFixture
) -> None:
    client, _ = app
    caplog.set_level(logging.INFO)
    body = b"certainly not gzip"
    head = _post(len(body)).replace(b"\r\n\r\n", b"\r\nContent-Encoding: gzip\r\n\r\n")
    reader, writer = await _raw(client, head)
    await asyncio.sleep(0.05)  # after the headers: the gateway, not the parser, answers
    writer.write(body)
    await writer.drain()
    response = await asyncio.wait_for(reader.read(), 5)
    writer.close()
    assert b" 400 " in response.split(b"\r\n", 1)[0], response
    assert response.endswith(
        b'{"error": {"type": "bad_request", "message": '
        b'"the request body cannot be decoded (its Content-Encoding or chunked framing)"}}'
    ), response
    line = [r for r in caplog.records if getattr(r, "status", None) == 400][-1]
    assert line.__dict__["error"].startswith("the request body cannot be decoded")


async def test_a_document_with_no_passage_is_422_and_nothing_is_written(
    app: App, monkeypatch: pytest.MonkeyPatch
) -> None:
    client, _ = app
    retriever = client.app[SERVICES].retriever
    url = "/v1/documents/headings"
    resp = await client.put(url, json={"text": "Initech staplers."}, headers=auth("initech"))
    assert resp.status in (200, 201)
    generation = (await resp.json())["generation"]
    resp = await client.put(url, json={"text": "# Only\n\n## headings\n"}, headers=auth("initech"))
    assert resp.status == 422
    message = (await resp.json())["error"]["message"]
    assert message == "text: no passage to index (headings only?); add body text"
    assert await retriever.generation("initech") == generation
    chunks = await retriever.document_chunks("initech", "headings")
    assert [c.text for c in chunks] == ["Initech staplers."]

    # The backend's own refusal gets the same answer.
    async def refuse(tenant: str, documents: Sequence[Any]) -> list[bool]:
        raise EmptyDocument(documents[0].doc_id)

    monkeypatch.setattr(retriever, "upsert_documents", refuse)
    resp = await client.put(url, json={"text": "New text."}, headers=auth("initech"))
    assert resp.status == 422
    assert (await resp.json())["error"]["message"] == message


def _admin() -> dict[str, str]:
    return {"Authorization": f"Bearer {ADMIN_KEY}"}


async def test_admin_reload_has_a_body_read_timeout_and_a_deadline(
    app: App, monkeypatch: pytest.MonkeyPatch
) -> None:
    client, _ = app
    endpoint = "POST /admin/reload"
    resp = await client.post("/admin/reload", headers=_admin())
    assert resp.status == 422  # started without a config file: nothing to reload
    # A slow body: 408 after body_read_timeout_s.
    timeouts = outcome(client, endpoint, "body_timeout")
    head = (
        f"POST /admin/reload HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {ADMIN_KEY}\r\n"
        "Content-Length: 100\r\n\r\n"
    ).encode()
    reader, writer = await _raw(client, head + b"{")
    status_line = await asyncio.wait_for(reader.readline(), 5)
    writer.close()
    assert b" 408 " in status_line
    assert outcome(client, endpoint, "body_timeout") == timeouts + 1

    # A reload that hangs: 503 at the request deadline.
    async def hangs(trigger: str) -> Any:
        await asyncio.sleep(30)

    monkeypatch.setattr(client.app[RELOADER], "reload", hangs)
    deadlines = outcome(client, endpoint, "deadline")
    resp = await client.post("/admin/reload", headers=_admin())
    # The deadline's 503, not the hung reload's end 30 s later, which would answer 200.
    assert resp.status == 503
    assert (await resp.json())["error"]["type"] == "deadline_exceeded"
    assert outcome(client, endpoint, "deadline") == deadlines + 1


async def test_raised_limits_dispatch_waiters_at_once(
    app: App,
) -> None:
    client, _ = app
    holder = client.app[RUNTIME]
    active = holder.current
    settings = active.settings
    queries = settings.server.admission.queries.model_copy(update={"max_inflight": 4})
    admission = settings.server.admission.model_copy(update={"queries": queries})
    server = settings.server.model_copy(update={"admission": admission})
    raised = build_runtime(settings.model_copy(update={"server": server}), client.app[SERVICES])

    def gauge(name: str) -> float:
        return sample(client, name, pool="queries")

    busy = [asyncio.ensure_future(ask(client, t, f"SLEEP0.4 {t} busy")) for t in ("acme", "globex")]
    await asyncio.sleep(0.1)
    waiting = asyncio.ensure_future(ask(client, "initech", "What does Initech make?"))
    await asyncio.sleep(0.05)
    assert (gauge("querygate_admission_queued"), gauge("querygate_admission_inflight")) == (1, 2)
    try:
        holder.current = raised  # what a reload does
        assert gauge("querygate_admission_queued") == 0
        assert gauge("querygate_admission_inflight") == 3
    finally:
        holder.current = active
    await asyncio.gather(*busy, waiting)
    await asyncio.sleep(0.3)
