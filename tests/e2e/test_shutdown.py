"""SIGTERM: the gateway stops accepting, finishes what is in flight, and exits cleanly."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from tests.fixtures.gateway import GatewayProcess, start_gateway, stop_gateway


@pytest.fixture
def own_gateway(fake_upstream: str, tmp_path: Path) -> Iterator[GatewayProcess]:
    gw = start_gateway(tmp_path, fake_upstream)
    yield gw
    stop_gateway(gw)


def test_sigterm_finishes_in_flight_requests_and_refuses_new_ones(
    own_gateway: GatewayProcess,
) -> None:
    gw = own_gateway
    results: dict[str, requests.Response] = {}

    def slow_request() -> None:
        results["slow"] = requests.post(
            f"{gw.url}/v1/query",
            json={"query": 'Hello [[fake:{"delay_ms": 2500}]]', "route": "direct"},
            headers=gw.headers(),
            timeout=30,
        )

    worker = threading.Thread(target=slow_request)
    worker.start()
    _wait_for_inflight(gw)
    gw.proc.send_signal(signal.SIGTERM)
    time.sleep(0.5)
    with pytest.raises(requests.ConnectionError):
        requests.get(f"{gw.url}/healthz", timeout=2)
    worker.join(timeout=30)
    assert results["slow"].status_code == 200, results["slow"].text
    assert results["slow"].json()["answer"].startswith("FAKE ANSWER")
    assert gw.proc.wait(timeout=20) == 0


def _wait_for_inflight(gw: GatewayProcess) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        # The /metrics request itself is in flight too: wait for a second one.
        if gw.metrics().get("querygate_inflight_requests") == 2:
            return
        time.sleep(0.05)
    raise AssertionError("the slow request never started")
