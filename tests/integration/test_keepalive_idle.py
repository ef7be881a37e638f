"""An idle keep-alive connection is closed after 75 s, as `aiohttp.web.run_app` did before the
gateway's own `run_app` (gateway/http/protocol.py): its `web.Server` left to the handler's
default kept one for 3630 s, an fd per client that opened a connection and went quiet. Against
a real `querygate serve` over a raw socket; waits out the timeout (~75 s)."""

from __future__ import annotations

import socket
import time
from urllib.parse import urlsplit

from tests.fixtures.gateway import GatewayProcess

HEALTHZ = b"GET /healthz HTTP/1.1\r\nHost: gw\r\n\r\n"


def test_an_idle_keep_alive_connection_is_closed_after_75_s(extractive: GatewayProcess) -> None:
    where = urlsplit(extractive.url)
    with socket.create_connection((where.hostname, where.port), timeout=10) as sock:
        sock.sendall(HEALTHZ)
        answer = b""
        while b'"ok"}' not in answer:
            answer += sock.recv(65536)
        assert answer.startswith(b"HTTP/1.1 200 "), answer[:100]
        idle_since = time.monotonic()
        sock.settimeout(100)  # well past 75 s: the old 3630 s shows as a timeout
        try:
            rest = sock.recv(65536)
        except TimeoutError:
            rest = None
        idle_s = time.monotonic() - idle_since
    assert rest == b"", f"still open after {idle_s:.0f} s idle"
    assert 70 < idle_s < 85, idle_s
