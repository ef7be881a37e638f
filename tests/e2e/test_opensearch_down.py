"""OpenSearch down: fast 503s with Retry-After, /readyz says so, direct still answers, and the
gateway recovers by itself when the node is back."""

from __future__ import annotations

import time
import uuid

import requests

from tests.fixtures.gateway import GatewayProcess, TcpProxy, readyz_until


def lookup(gw: GatewayProcess) -> requests.Response:
    return requests.post(
        f"{gw.url}/v1/query",
        json={"query": f"What does the Acme warranty cover? ({uuid.uuid4().hex[:6]})"},
        headers=gw.headers(),
        timeout=30,
    )


def test_node_down_fails_fast_and_recovers(
    opensearch_gateway: GatewayProcess, opensearch_proxy: TcpProxy
) -> None:
    gw = opensearch_gateway
    assert lookup(gw).status_code == 200
    opensearch_proxy.stop()
    try:
        down = lookup(gw)
        assert down.status_code == 503, down.text
        assert int(down.headers["Retry-After"]) > 0
        # Fast: the node's refusal is the answer (unavailable), not the request's deadline
        # waited out (deadline_exceeded); the client's timeout only tells a hang.
        assert down.json()["error"]["type"] == "unavailable", down.text
        ready = readyz_until(gw, lambda r: r.status_code == 503)
        assert ready.json()["checks"]["retrieval"].startswith("unavailable")
        direct = requests.post(
            f"{gw.url}/v1/query",
            json={"query": "hello", "route": "direct"},
            headers=gw.headers(),
            timeout=30,
        )
        assert direct.status_code == 200, direct.text
    finally:
        opensearch_proxy.start()
    deadline = time.monotonic() + 30
    while lookup(gw).status_code != 200:
        assert time.monotonic() < deadline, "the gateway did not recover"
        time.sleep(0.5)
    readyz_until(gw, lambda r: r.status_code == 200)
