"""A `serve --workers 2` gateway that has answered nothing yet (its health probes aside): every
series selector of the shipped dashboard and alert rules, label matchers included, finds a
series on its first /metrics scrape (the sum over both workers' files), and still does once a
worker has been killed and replaced. The selector's PromQL is parsed (tests/shipped_queries.py),
not listed here; what the recording rules make is the one thing no gateway exports."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator

import pytest

from tests import shipped_queries
from tests.e2e.test_workers import _children, _log_pids, _wait_workers_ready
from tests.fixtures.gateway import GatewayProcess, start_gateway, stop_gateway
from tests.metrics import Scrape
from tests.shipped_queries import Selector, dashboard_expressions, rules, selectors

# A reranker, so that the rerank panels have one to be labelled with; models come from the
# fake upstream (never called: nothing is asked).
RERANKER = {"retrieval": {"rerank": {"reranker": "local"}}}


@pytest.fixture(scope="module")
def fresh(fake_upstream: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    gw = start_gateway(
        tmp_path_factory.mktemp("fresh"),
        fake_upstream,
        overrides=RERANKER,
        serve_args=("--workers", "2"),
    )
    _wait_workers_ready(gw, 2)
    yield gw
    stop_gateway(gw)


def without_series(scrape: Scrape) -> list[tuple[str, Selector]]:
    """Each (expression, selector) of the shipped PromQL that no sample of `scrape` matches."""
    recorded = shipped_queries.recorded()
    samples = [(name, dict(labels)) for name, labels in scrape.samples()]
    exprs = [*dashboard_expressions(), *(rule["expr"] for rule in rules())]
    return [
        (expr, selector)
        for expr in exprs
        for selector in selectors(expr)
        if selector.name not in recorded
        and not any(selector.matches(name, labels) for name, labels in samples)
    ]


def test_every_shipped_selector_has_a_series_before_any_request(fresh: GatewayProcess) -> None:
    scrape = fresh.metrics(admin=True)  # the operator's scrape: the tenants' families too
    assert scrape.value("querygate_requests_total") == 0  # nothing answered
    assert scrape.value("querygate_http_requests_total", endpoint="POST /v1/query") == 0
    assert without_series(scrape) == []


def test_every_shipped_selector_still_has_a_series_after_a_worker_is_replaced(
    fresh: GatewayProcess,
) -> None:
    old = _children(fresh.proc.pid)
    victim = min(old)
    os.kill(victim, signal.SIGKILL)
    deadline = time.monotonic() + 90
    # The replacement is ready when a third process has logged "ready".
    while len(_log_pids(fresh, msg="ready")) < 3:
        assert fresh.proc.poll() is None and time.monotonic() < deadline, fresh.log()[-3000:]
        time.sleep(0.2)
    assert victim not in _children(fresh.proc.pid)
    # The supervisor counts it serving once it has said so (shared memory), just after the log.
    while (scrape := fresh.metrics(admin=True)).value("querygate_workers", state="serving") < 2:
        assert time.monotonic() < deadline, scrape.series("querygate_workers")
        time.sleep(0.2)
    assert without_series(scrape) == []
