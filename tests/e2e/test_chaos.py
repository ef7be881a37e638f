"""Chaos: the model upstream and OpenSearch killed, slowed and answering garbage mid-load.

A real `querygate serve` talks to the fake upstream and to a real OpenSearch node, each through
a TCP proxy this test switches between modes while client threads keep asking. Whatever breaks,
every request gets an answer or a clear JSON error (503 with Retry-After for a dependency),
never a 500 or a hang, and the gateway recovers by itself. The deadline is the gateway's to
keep (tests/integration/test_admission_http.py asserts the reason it reports); here the
client's own timeout, well past it, only tells a hang from a slow answer on a loaded machine.

Designed behaviour per dependency:
- model upstream down, slow or garbled: 503 `unavailable`/`upstream_error`/`deadline_exceeded`
  with Retry-After; after `cooldown_after` failures the model is skipped at once (fast 503s),
  then probed; answers resume when it is back;
- OpenSearch down, slow or garbled: retrieval routes 503 within `search_timeout_s`; /readyz
  says not ready; the direct route keeps answering; recovery without a restart.
"""

from __future__ import annotations

import json
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pytest
import requests

from tests.fixtures.gateway import (
    GatewayProcess,
    TcpProxy,
    opensearch_retrieval,
    proxied,
    readyz_until,
    start_gateway,
    stop_gateway,
)

DEADLINE_S = 5.0
# A client that waited this long past the gateway's deadline got no answer: a hang.
HANG_S = 30.0
WORKERS = 6
COOLDOWN_S = 1.0
LIBRARY_TEXT = re.compile(r"[A-Za-z]+(Error|Exception)\b|Traceback|aiohttp|httpx|urllib3")


@dataclass(frozen=True)
class Outcome:
    status: int
    body: dict[str, object]
    retry_after: str | None


@pytest.fixture(scope="module")
def upstream_proxy(fake_upstream: str) -> Iterator[TcpProxy]:
    yield from proxied(fake_upstream.removesuffix("/v1"))


@pytest.fixture(scope="module")
def search_proxy(opensearch_url: str) -> Iterator[TcpProxy]:
    yield from proxied(opensearch_url)


@pytest.fixture(scope="module")
def chaotic(
    upstream_proxy: TcpProxy, search_proxy: TcpProxy, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GatewayProcess]:
    # A search slower than 1 s fails: the slow proxy's 3 s delay reaches requests as 503s.
    retrieval = opensearch_retrieval(search_proxy, "qg-chaos", search_timeout_s=1.0)
    tier = {"timeout_s": 2.0, "cooldown_after": 3, "cooldown_s": COOLDOWN_S}
    overrides = {
        "server": {"request_timeout_s": DEADLINE_S},
        "models": {"small": tier, "large": tier},
        "cache": {"backend": "off"},
    }
    gw = start_gateway(
        tmp_path_factory.mktemp("chaos"),
        f"http://127.0.0.1:{upstream_proxy.port}/v1",
        retrieval,
        overrides=overrides,
    )
    yield gw
    stop_gateway(gw)


def ask(gw: GatewayProcess, route: str = "lookup") -> Outcome:
    body = {"query": f"What does the Acme warranty cover? {uuid.uuid4().hex[:6]}", "route": route}
    url, timeout_s = f"{gw.url}/v1/query", DEADLINE_S + HANG_S
    try:
        resp = requests.post(url, json=body, headers=gw.headers(), timeout=timeout_s)
    except requests.Timeout:
        pytest.fail(f"no answer within {timeout_s:g} s: the gateway hung on {body}")
    return Outcome(resp.status_code, resp.json(), resp.headers.get("Retry-After"))


def under_load(gw: GatewayProcess, chaos: Callable[[], None], seconds: float) -> list[Outcome]:
    """Client threads ask without pause while `chaos` runs; every answer they got."""
    stop = threading.Event()
    outcomes: list[Outcome] = []
    lock = threading.Lock()

    def client(i: int) -> None:
        while not stop.is_set():
            outcome = ask(gw, "direct" if i == 0 else "lookup")
            with lock:
                outcomes.append(outcome)

    with ThreadPoolExecutor(WORKERS) as pool:
        for i in range(WORKERS):
            pool.submit(client, i)
        time.sleep(0.5)
        chaos()
        time.sleep(seconds)
        stop.set()
    return outcomes


def assert_designed(outcomes: list[Outcome]) -> None:
    assert outcomes, "no request completed"
    for o in outcomes:
        assert o.status in (200, 503), (o.status, o.body)
        if o.status == 503:
            error = o.body["error"]
            assert isinstance(error, dict) and error["type"], o.body
            # a stable message, never a client library's exception text
            assert not LIBRARY_TEXT.search(str(error["message"])), o.body
            assert o.retry_after is not None and int(o.retry_after) > 0, o.body


def recovered(gw: GatewayProcess, route: str = "lookup", within_s: float = 30.0) -> None:
    deadline = time.monotonic() + within_s
    while (outcome := ask(gw, route)).status != 200:
        assert time.monotonic() < deadline, f"not recovered: {outcome.body}"
        time.sleep(0.3)


def statuses(outcomes: list[Outcome]) -> set[int]:
    return {o.status for o in outcomes}


@pytest.mark.parametrize(
    ("mode", "delay_ms"),
    [("down", 0), ("slow", 4000), ("garbage", 0), ("bad_json", 0)],
)
def test_model_upstream_chaos_mid_load(
    chaotic: GatewayProcess, upstream_proxy: TcpProxy, mode: str, delay_ms: int
) -> None:
    recovered(chaotic)

    def chaos() -> None:
        if mode == "down":
            upstream_proxy.stop()
        else:
            upstream_proxy.switch(mode, delay_ms)

    try:
        outcomes = under_load(chaotic, chaos, seconds=4.0)
    finally:
        upstream_proxy.switch("pass")
    assert_designed(outcomes)
    assert 503 in statuses(outcomes), "the fault never reached a request"
    recovered(chaotic)
    recovered(chaotic, "direct")


@pytest.mark.parametrize(
    ("mode", "delay_ms"),
    [("down", 0), ("slow", 3000), ("garbage", 0), ("bad_json", 0)],
)
def test_opensearch_chaos_mid_load(
    chaotic: GatewayProcess, search_proxy: TcpProxy, mode: str, delay_ms: int
) -> None:
    recovered(chaotic)

    def chaos() -> None:
        if mode == "down":
            search_proxy.stop()
        else:
            search_proxy.switch(mode, delay_ms)

    try:
        outcomes = under_load(chaotic, chaos, seconds=4.0)
        ready = readyz_until(chaotic, lambda r: r.status_code == 503)
        direct = ask(chaotic, "direct")
    finally:
        search_proxy.switch("pass")
    assert_designed(outcomes)
    assert 503 in statuses(outcomes), "the fault never reached a request"
    assert ready.status_code == 503, ready.text
    assert direct.status == 200, json.dumps(direct.body)
    recovered(chaotic)
    readyz_until(chaotic, lambda r: r.status_code == 200)
