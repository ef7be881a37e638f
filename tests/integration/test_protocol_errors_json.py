"""What aiohttp's parser refuses (a malformed request line or header, a line over the limit, a
broken chunked body) gets the gateway's JSON error like every other error, not plain text;
against a real `querygate serve` over raw sockets."""

from __future__ import annotations

import json
import socket
import time
from urllib.parse import urlsplit

import pytest

from tests.fixtures.gateway import KEYS, GatewayProcess

CHUNKED_HEAD = (
    "POST /v1/route HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n"
    f"Authorization: Bearer {KEYS['acme']}\r\nTransfer-Encoding: chunked\r\n\r\n"
).encode()


def exchange(gw: GatewayProcess, *sends: bytes, pause_s: float = 0.3) -> tuple[bytes, float]:
    """Send each piece (a pause between), then read until the server closes: all it sent,
    and how long that took from the last piece."""
    where = urlsplit(gw.url)
    with socket.create_connection((where.hostname, where.port), timeout=15) as sock:
        for i, piece in enumerate(sends):
            if i:
                time.sleep(pause_s)
            sock.sendall(piece)
        start = time.monotonic()
        out = b""
        while chunk := sock.recv(65536):
            out += chunk
        return out, time.monotonic() - start


def parsed(answer: bytes) -> tuple[int, dict[str, str], bytes]:
    head, _, body = answer.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in lines)}
    return int(status_line.split(" ", 2)[1]), headers, body


@pytest.mark.parametrize(
    ("request_bytes", "says"),
    [
        pytest.param(b"GARBAGE\r\n\r\n", "Invalid method", id="malformed-request-line"),
        pytest.param(
            b"GET /healthz HTTP/1.1\r\nHost: gw\r\nBad Header: y\r\n\r\n",
            "Invalid header",
            id="bad-header",
        ),
        pytest.param(
            b"GET /healthz HTTP/1.1\r\nHost: gw\r\nX-Long: " + b"a" * 9000 + b"\r\n\r\n",
            "header is over 8190 bytes",
            id="header-line-too-long",
        ),
        pytest.param(
            b"GET /healthz HTTP/1.1\r\nHost: gw\r\n" + b"X-H: v\r\n" * 200 + b"\r\n",
            "Too many headers",
            id="too-many-headers",
        ),
        pytest.param(CHUNKED_HEAD + b"zz\r\n{}\r\n0\r\n\r\n", "chunk size", id="bad-chunk-size"),
    ],
)
def test_a_request_the_parser_refuses_gets_a_json_400(
    extractive: GatewayProcess, request_bytes: bytes, says: str
) -> None:
    answer, _ = exchange(extractive, request_bytes)
    status, headers, body = parsed(answer)
    assert status == 400, answer[:300]
    assert headers["content-type"].startswith("application/json")
    error = json.loads(body)["error"]
    assert error["type"] == "bad_request"
    assert error["message"].startswith("malformed HTTP request: ")
    assert says in error["message"]
    assert "aaaa" not in error["message"]  # the client's bytes are not echoed back


def test_a_chunked_body_that_breaks_after_its_start_is_a_400_at_once(
    extractive: GatewayProcess,
) -> None:
    """The handler is already reading the body when the bad chunk comes: aiohttp left it
    waiting for bytes that never come, a 408 after `body_read_timeout_s` (10 s) and the
    connection held 10 s more."""
    answer, took_s = exchange(extractive, CHUNKED_HEAD + b"2\r\n{}\r\n", b"zz\r\n")
    status, headers, body = parsed(answer)
    assert status == 400, answer[:300]
    assert took_s < 5  # answered and closed at once
    assert headers["content-type"].startswith("application/json")
    assert json.loads(body)["error"]["type"] == "bad_request"
