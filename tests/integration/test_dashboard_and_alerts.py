"""The shipped Grafana dashboard and alert rules: valid PromQL, naming only what the gateway
exports (read from a live app's /metrics, in process, not from a list kept here), and, with
promtool, alerts that fire on the series they should and stay quiet on healthy ones. Both
files are generated (scripts/make_dashboard.py, scripts/make_alerts.py) and checked to be their
generator's output."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.obs.accounting import ANSWERING
from gateway.obs.metrics import Metrics
from scripts import make_alerts
from scripts.make_dashboard import OUT as DASHBOARD
from scripts.make_dashboard import render
from tests import shipped_queries
from tests.fixtures.app import Client, OpenClient, scrape
from tests.fixtures.gateway import REPO_ROOT
from tests.metrics import Scrape
from tests.shipped_queries import GRAFANA_VARIABLES, RULES, dashboard_expressions, rules

RULE_TESTS = REPO_ROOT / "tests/alerts/querygate_test.yaml"
_SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_count", "_sum", "_created"),
}


@pytest.fixture(scope="module")
async def gateway(app_client: OpenClient) -> Client:
    return await app_client()


async def exported_names(gw: Client) -> set[str]:
    """Every series name the live gateway's /metrics declares to Prometheus, which scrapes with
    the admin key (a family with no sample yet still names its series through its type)."""
    names: set[str] = set()
    for family in (await scrape(gw, admin=True)).families:
        names.add(family.name)
        names.update(family.name + suffix for suffix in _SUFFIXES.get(family.type, ()))
        names.update(sample.name for sample in family.samples)
    return names


def selectors(expr: str) -> Iterator[str]:
    """The metric names an expression reads."""
    yield from (selector.name for selector in shipped_queries.selectors(expr))


def _unit_kind(expr: str) -> str:
    """What a panel expression's values measure: a latency quantile is seconds, a memory
    gauge bytes, CPU seconds per second cores, anything else a count, rate or ratio."""
    names = set(selectors(expr))
    if "histogram_quantile" in expr and any(n.endswith("_seconds_bucket") for n in names):
        return "s"
    if any(n.endswith("_bytes") for n in names):
        return "bytes"
    if "process_cpu_seconds_total" in names:
        return "cores"
    return "count"


def test_each_panel_draws_one_unit_on_an_axis_labelled_with_it() -> None:
    """A panel drawing bytes beside cores has one axis for both: the cores are a flat line at
    zero under a memory curve of a billion."""
    board = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    for panel in board["panels"]:
        exprs = [t["expr"] for t in panel.get("targets", [])]
        if not exprs:
            continue
        for name, value in GRAFANA_VARIABLES.items():
            exprs = [e.replace(name, value) for e in exprs]
        kinds = {_unit_kind(expr) for expr in exprs}
        assert len(kinds) == 1, (panel["title"], kinds)
        unit = panel["fieldConfig"]["defaults"]["unit"]
        expected = {"s": "s", "bytes": "bytes"}.get(kinds.pop())
        assert expected is None or unit == expected, (panel["title"], unit)


def test_the_shipped_dashboard_is_the_generators_output() -> None:
    assert DASHBOARD.read_text(encoding="utf-8") == render()


def test_the_shipped_rules_are_the_generators_output() -> None:
    assert RULES.read_text(encoding="utf-8") == make_alerts.render()


def test_the_slo_counts_the_gateways_answering_endpoints_and_each_outcome_once() -> None:
    assert set(make_alerts.ANSWERING_ENDPOINTS) == ANSWERING
    ours, clients = set(make_alerts.OUR_FAILURES), set(make_alerts.CLIENT_CAUSED)
    assert not ours & clients and "ok" not in ours | clients
    # a cancel with the client still connected is the gateway's (gateway/http/middleware/outcome.py)
    assert "cancelled" in ours and "disconnect" in clients


def test_each_latency_target_is_a_bucket_bound_of_the_answer_histogram() -> None:
    metrics = Metrics()
    for route in make_alerts.LATENCY_TARGETS_S:
        metrics.request_duration.labels(route).observe(0.1)
    bounds: dict[str, set[str]] = {}
    for labels in Scrape.of(metrics).series("querygate_request_duration_seconds_bucket"):
        named = dict(labels)
        bounds.setdefault(named["route"], set()).add(named["le"])
    for route, bound in make_alerts.LATENCY_TARGETS_S.items():
        # the rules select le="<bound!r>": the exposition must spell it the same way
        assert repr(bound) in bounds[route], (route, bound)


@pytest.mark.asyncio(loop_scope="session")
async def test_every_dashboard_expression_reads_only_exported_metrics(gateway: Client) -> None:
    exported = await exported_names(gateway)
    exprs = dashboard_expressions()
    assert len(exprs) > 30
    unknown = {(name, expr) for expr in exprs for name in selectors(expr) if name not in exported}
    assert not unknown


@pytest.mark.asyncio(loop_scope="session")
async def test_every_rule_expression_reads_exported_or_recorded_series(gateway: Client) -> None:
    exported = await exported_names(gateway)
    recorded = shipped_queries.recorded()
    alerts = [rule for rule in rules() if "alert" in rule]
    assert len(alerts) >= 10
    for rule in rules():
        names = set(selectors(rule["expr"]))
        assert names, rule
        assert names <= exported | recorded, (rule.get("alert") or rule["record"], names - exported)


def test_every_alert_has_a_runbook_entry() -> None:
    runbook = (REPO_ROOT / "docs/runbook.md").read_text(encoding="utf-8")
    for rule in rules():
        if "alert" not in rule:
            continue
        url = rule["annotations"]["runbook_url"]
        anchor = url.split("#", 1)[1]
        assert f"## {rule['alert']}" in runbook and anchor == rule["alert"].lower()
        assert rule["labels"]["severity"] in {"page", "ticket"}


@pytest.fixture(scope="module")
def promtool() -> Path | None:
    path = os.environ.get("QUERYGATE_PROMTOOL")
    if path:
        return Path(path)
    if os.environ.get("QUERYGATE_REQUIRE_PROMTOOL") == "1":
        pytest.fail("QUERYGATE_PROMTOOL is not set (scripts/test.sh builds promtool)")
    return None


@pytest.mark.gotools
def test_promtool_checks_the_rules_and_their_unit_tests(promtool: Path | None) -> None:
    if promtool is None:
        pytest.skip("no promtool (scripts/promtool.sh builds it; scripts/test.sh requires it)")
    checked = subprocess.run(
        [str(promtool), "check", "rules", str(RULES)], capture_output=True, text=True, check=False
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    tested = subprocess.run(
        [str(promtool), "test", "rules", str(RULE_TESTS)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert tested.returncode == 0, tested.stdout + tested.stderr
