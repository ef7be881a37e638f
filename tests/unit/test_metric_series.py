"""Metric families start with their known series at 0, in one process: every labelled family
but the two set by their first value is initialised (a family added without its series fails
here), every selector of the shipped dashboard and rules that reads an initialised family finds
a series on the first scrape, and the series are the configuration's, not the tenants'."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

from gateway.core.services import Services
from gateway.http.failures import endpoints
from gateway.obs.metrics import Metrics
from gateway.server.app import create_app
from gateway.server.metric_series import initial_series
from gateway.settings import Settings
from tests.fixtures.gateway import gateway_config, merged
from tests.metrics import Scrape
from tests.shipped_queries import dashboard_expressions, rules, selectors

# Set by their first value, not at 0: a dependency before its first probe (which runs at start)
# is not down, and the configuration's version is set as the app starts.
FIRST_VALUE = {"querygate_dependency_up", "querygate_config_info"}
_SUFFIXES = ("_total", "_bucket", "_count", "_sum", "_created")


def settings_of(tmp_path: Path, tenants: int = 2, **extra: Any) -> Settings:
    config = gateway_config(tmp_path / "data", 0, "http://127.0.0.1:9/v1")
    config["tenants"] = [
        {"id": f"tenant-{n:03d}", "api_key_sha256": f"{n:064x}"} for n in range(tenants)
    ]
    # A reranker, so that the rerank panels have a reranker to be labelled with.
    config["retrieval"] = {"rerank": {"reranker": "local"}}
    return Settings.model_validate(merged(config, extra))


def series_of(settings: Settings) -> dict[str, Any]:
    """The series the app's start makes (the services stand in for the backends: only their
    names are read; the app is not started, its routes are what is read)."""
    reranker = SimpleNamespace(model_id="minilm-rerank")
    services = SimpleNamespace(retriever=SimpleNamespace(name="embedded"), reranker=reranker)
    return dict(initial_series(settings, cast(Services, services), endpoints(create_app(settings))))


def first_scrape(settings: Settings) -> tuple[Metrics, Scrape]:
    """What a scrape reads once those series are made, before any request."""
    metrics = Metrics()
    metrics.initialise(series_of(settings))
    return metrics, Scrape.of(metrics)


def family_of(sample: str, families: set[str]) -> str | None:
    for suffix in ("", *_SUFFIXES):
        if sample.endswith(suffix) and (name := sample.removesuffix(suffix)) in families:
            return name
    return None


def test_every_labelled_family_but_those_set_by_their_first_value_is_initialised(
    tmp_path: Path,
) -> None:
    settings = settings_of(tmp_path)
    metrics, scrape = first_scrape(settings)
    named = set(series_of(settings))
    assert named | FIRST_VALUE == set(metrics.labelled())
    sampled = {name for name, _ in scrape.samples()}
    assert {name for name in named if not any(family_of(s, {name}) for s in sampled)} == set()


@pytest.mark.parametrize("source", ["dashboard", "rules"])
def test_every_shipped_selector_of_an_initialised_family_has_a_series(
    tmp_path: Path, source: str
) -> None:
    metrics, scrape = first_scrape(settings_of(tmp_path))
    initialised = set(metrics.labelled()) - FIRST_VALUE
    exprs = dashboard_expressions() if source == "dashboard" else [r["expr"] for r in rules()]
    samples = [(name, dict(labels)) for name, labels in scrape.samples()]
    checked, missing = 0, []
    for expr in exprs:
        for selector in selectors(expr):
            if family_of(selector.name, initialised) is None:
                continue  # a label-less family, one set by its first value, or a recording
            checked += 1
            if not any(selector.matches(name, labels) for name, labels in samples):
                missing.append(selector)
    assert checked > 20 and not missing


def test_the_series_do_not_grow_with_tenants_and_never_name_one(tmp_path: Path) -> None:
    few = first_scrape(settings_of(tmp_path, tenants=2))[1]
    many = first_scrape(settings_of(tmp_path, tenants=40))[1]
    assert set(many.samples()) == set(few.samples())
    assert not any("tenant-0" in value for _, labels in many.samples() for _, value in labels)


def test_configured_models_and_rules_have_their_series(tmp_path: Path) -> None:
    """Labels that come from the configuration: each tier's chain (a model listed twice is two
    deployments, as its cooldown gauges name them), and a rule that sets a route."""
    fallback = {"model": "openai/fake-small", "api_base": "http://127.0.0.1:9/v2"}
    rule = {"name": "billing", "when": {"query_regex": "invoice"}, "then": {"route": "lookup"}}
    settings = settings_of(
        tmp_path,
        models={"small": {"fallbacks": [fallback]}},
        router={"rules": [rule]},
    )
    _, scrape = first_scrape(settings)
    assert scrape.get("querygate_rerank_duration_seconds_count", reranker="local") == 0
    cooldowns = {dict(labels)["model"] for labels in scrape.series("querygate_llm_cooldown_open")}
    assert cooldowns == {"openai/fake-small#0", "openai/fake-small#1", "openai/fake-large"}
    assert (
        scrape.get(
            "querygate_llm_requests_total", tier="small", model="openai/fake-small", outcome="ok"
        )
        == 0
    )
    assert scrape.get("querygate_route_decisions_total", route="lookup", reason="rule:billing") == 0
