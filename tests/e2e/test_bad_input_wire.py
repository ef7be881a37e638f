"""Nothing a client sends produces a 500, down to the wire of a `querygate serve` process: what
its HTTP parser refuses, a body declared over the limit, a corrupt compressed body, a key that
is not UTF-8, a stalling regex beside /healthz, and what the process logs of an error (the
bodies and fields in process: tests/integration/test_bad_input.py)."""

from __future__ import annotations

import json
import socket
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from tests.fixtures.gateway import GatewayProcess


def post(
    gw: GatewayProcess, path: str, data: bytes | str, headers: dict[str, str] | None = None
) -> requests.Response:
    hdrs = {"Content-Type": "application/json", **gw.headers(), **(headers or {})}
    return requests.post(f"{gw.url}{path}", data=data, headers=hdrs, timeout=30)


def assert_error(resp: requests.Response, status: int, kind: str) -> None:
    assert resp.status_code == status, resp.text
    assert resp.headers["Content-Type"].startswith("application/json")
    error = resp.json()["error"]
    assert error["type"] == kind
    assert error["message"]


def test_a_body_declared_over_the_limit_is_413_before_it_is_sent(gateway: GatewayProcess) -> None:
    """Declared 1 GB, then stalled: refused on the declaration, not after body_read_timeout_s
    (10 s) as a 408."""
    host, port = gateway.url.removeprefix("http://").split(":")
    head = (
        f"POST /v1/query HTTP/1.1\r\nHost: x\r\nAuthorization: {gateway.headers()['Authorization']}"
        '\r\nContent-Type: application/json\r\nContent-Length: 1000000000\r\n\r\n{"query": '
    )
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(head.encode())
        reply = sock.recv(65536)
    assert reply.split(b" ", 2)[1] == b"413", reply[:200]  # not the body timeout's 408
    assert b'"payload_too_large"' in reply


@pytest.mark.parametrize("encoding", ["gzip", "deflate", "br"])
def test_a_corrupt_compressed_body_is_400(gateway: GatewayProcess, encoding: str) -> None:
    resp = post(gateway, "/v1/query", b"certainly not compressed", {"Content-Encoding": encoding})
    assert resp.status_code < 500, resp.text
    if encoding == "br":  # brotli is only decoded when the brotli package is installed
        return
    assert resp.status_code == 400, resp.text
    # When the body arrives with the headers, aiohttp's parser refuses it before any handler
    # runs and answers itself, in plain text; otherwise the gateway answers in JSON.
    if resp.headers["Content-Type"].startswith("application/json"):
        assert_error(resp, 400, "bad_request")


@pytest.mark.parametrize("key", [b"Bearer \xff\xfe", b"Bearer key-acme-0001\xc0", b"Bearer \x80"])
def test_a_key_that_is_not_utf8_is_401(gateway: GatewayProcess, key: bytes) -> None:
    headers = {"Content-Type": "application/json", "Authorization": key}
    resp = requests.post(
        f"{gateway.url}/v1/query",
        data='{"query": "q"}',
        headers=headers,  # type: ignore[arg-type]
        timeout=10,
    )
    assert_error(resp, 401, "unauthorized")


def test_healthz_answers_while_adversarial_queries_run(gateway: GatewayProcess) -> None:
    """'a-' * 4000 can cost a backtracking regex most of a second on the event loop; 8 such
    queries at once must not stall /healthz."""
    body = json.dumps({"query": "a-" * 4000})
    with ThreadPoolExecutor(max_workers=9) as pool:
        queries = [pool.submit(post, gateway, "/v1/route", body) for _ in range(8)]
        health = []
        while not all(q.done() for q in queries):
            start = time.perf_counter()
            resp = requests.get(f"{gateway.url}/healthz", timeout=10)
            health.append(time.perf_counter() - start)
            assert resp.status_code == 200
        statuses = [q.result().status_code for q in queries]
    assert statuses == [200] * 8
    assert max(health) < 1.0, health


@pytest.mark.parametrize(
    "request_bytes",
    [
        b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 9000 + b"\r\n\r\n",
        b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + b"X-H: v\r\n" * 200 + b"\r\n",
        b"POST /v1/route HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
    ],
    ids=["header-too-long", "too-many-headers", "bad-chunk-size"],
)
def test_a_request_the_http_parser_refuses_is_an_info_line_not_an_error(
    gateway: GatewayProcess, request_bytes: bytes
) -> None:
    """aiohttp answers these 400 itself; logged at ERROR with a traceback, anyone,
    unauthenticated, could page the operator and fill the log ~30x faster than they send."""
    host, port = gateway.url.removeprefix("http://").split(":")
    seen = len(gateway.log().splitlines())
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(request_bytes)
        reply = b""
        while chunk := sock.recv(65536):
            reply += chunk
    assert reply.split(b" ", 2)[1] == b"400", reply[:200]
    lines = [json.loads(line) for line in gateway.log().splitlines()[seen:]]
    server = [line for line in lines if line["logger"] == "aiohttp.server"]
    assert [(line["level"], line["msg"], line["status"]) for line in server] == [
        ("info", "malformed HTTP request refused", 400)
    ]
    assert "exc" not in server[0]


LONG = "z" * 50_000


@pytest.mark.parametrize(
    ("path", "body", "status", "start"),
    [
        (
            "/v1/chat/completions",
            {"model": LONG, "messages": [{"role": "user", "content": "hi"}]},
            404,
            "model 'zzz",
        ),
        (
            "/v1/chat/completions",
            {"model": "auto", "messages": [{"role": "user", "content": "hi"}], LONG: 1},
            400,
            "zzz",
        ),
        (
            "/v1/chat/completions",
            {
                "model": "auto",
                "messages": [{"role": "user", "content": "hi"}],
                **{f"p{i}": 1 for i in range(5000)},
            },
            400,
            "p0: ",
        ),
        ("/v1/query", {"query": "hi", LONG: 1}, 422, "zzz"),
        ("/v1/query", {"query": "hi", "history": [{"role": "x"}] * 2000}, 422, "history.0."),
    ],
    ids=["model-name", "parameter-name", "5000-parameters", "field-name", "2000-bad-items"],
)
def test_an_error_quotes_the_clients_names_briefly(
    gateway: GatewayProcess, path: str, body: dict[str, object], status: int, start: str
) -> None:
    """Quoted whole, a 50 KB name would make the response and the request's log line 50 KB (up
    to the 1 MiB body limit by default), and thousands of bad fields would each be listed."""
    resp = post(gateway, path, json.dumps(body))
    assert resp.status_code == status, resp.text[:300]
    message = resp.json()["error"]["message"]
    assert start in message, message[:300]
    assert len(message) < 2000, message[:300]
    request_id = resp.headers["X-Request-Id"]
    line = next(line for line in gateway.log().splitlines() if request_id in line)
    assert len(line) < 3000, line[:300]
