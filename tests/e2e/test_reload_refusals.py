"""Reloads an operator can get wrong, on a running `querygate serve`: each is refused with a
clear 422 naming the problem, counted as a refused reload, and the old configuration keeps
serving every tenant."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml

from gateway.settings import hash_api_key
from tests.fixtures.gateway import (
    ADMIN_KEY,
    KEYS,
    GatewayProcess,
    active_version,
    run_cli,
    start_gateway,
    stop_gateway,
)

ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}


@pytest.fixture(scope="module")
def gw(fake_upstream: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    # The file watch off: only the endpoint reloads, so each test sees its own reload's answer.
    gateway = start_gateway(
        tmp_path_factory.mktemp("reload-refusals"),
        fake_upstream,
        overrides={"server": {"reload_poll_s": 0}},
    )
    yield gateway
    stop_gateway(gateway)


@pytest.fixture
def original(gw: GatewayProcess) -> Iterator[bytes]:
    """The config file as started; put back (and reloaded) after the test."""
    text = gw.config_path.read_bytes()
    yield text
    gw.config_path.write_bytes(text)
    assert reload(gw).status_code == 200


def reload(gw: GatewayProcess) -> requests.Response:
    return requests.post(f"{gw.url}/admin/reload", headers=ADMIN, timeout=30)


def route(gw: GatewayProcess, tenant: str) -> requests.Response:
    return requests.post(
        f"{gw.url}/v1/route",
        json={"query": "What does the Acme warranty cover?"},
        headers=gw.headers(tenant),
        timeout=30,
    )


def assert_refused(gw: GatewayProcess, before: str, kind: str, *named: str) -> dict[str, Any]:
    """The reload is a 422 of `kind` naming each of `named`; the old version serves both tenants."""
    refusals = gw.metrics().value("querygate_config_reloads_total", result="error")
    resp = reload(gw)
    assert resp.status_code == 422, resp.text
    body: dict[str, Any] = resp.json()
    assert body["error"]["type"] == kind, body
    for text in named:
        assert text in body["error"]["message"], body
    assert body["version"] == before
    assert gw.metrics().value("querygate_config_reloads_total", result="error") == refusals + 1
    assert active_version(gw) == before
    for tenant in ("acme", "globex"):
        answer = route(gw, tenant)
        assert answer.status_code == 200, answer.text
    return body


def with_config(gw: GatewayProcess, change: dict[str, Any]) -> None:
    config = yaml.safe_load(gw.config_path.read_text())
    config.update(change)
    gw.config_path.write_text(yaml.safe_dump(config))


def test_a_config_saved_as_utf16_is_refused_not_a_500(gw: GatewayProcess, original: bytes) -> None:
    # What some editors write: the same YAML, in UTF-16 with a byte order mark.
    before = active_version(gw)
    gw.config_path.write_bytes(original.decode().encode("utf-16"))
    assert_refused(gw, before, "invalid_config", "UTF-8")


def test_a_top_level_key_that_is_not_a_name_is_refused_not_a_500(
    gw: GatewayProcess, original: bytes
) -> None:
    before = active_version(gw)
    gw.config_path.write_bytes(original + b"1: 2\n")
    assert_refused(gw, before, "invalid_config", "1")


def test_a_reload_leaving_no_tenant_is_refused(gw: GatewayProcess, original: bytes) -> None:
    # An emptied list (a template gone wrong) would have switched the gateway to the single
    # demo tenant: every configured tenant refused, a new key minted in the data directory.
    before = active_version(gw)
    with_config(gw, {"tenants": []})
    assert_refused(gw, before, "restart_required", "tenants")
    assert not (Path(yaml.safe_load(original)["data_dir"]) / "demo_api_key").exists()


def test_a_rule_that_can_never_match_is_refused(gw: GatewayProcess, original: bytes) -> None:
    before = active_version(gw)
    config = yaml.safe_load(original)
    rule = {
        "name": "never",
        "when": {"min_confidence": 0.9, "max_confidence": 0.5},
        "then": {"route": "multihop"},
    }
    with_config(gw, {"router": {**config["router"], "rules": [rule]}})
    assert_refused(gw, before, "invalid_config", "router.rules.0.when", "min_confidence")


def test_an_admin_key_that_is_also_a_tenants_key_is_refused(
    gw: GatewayProcess, original: bytes
) -> None:
    # Otherwise that tenant could read every tenant's configuration, and reload it.
    before = active_version(gw)
    with_config(gw, {"admin_api_key_sha256": hash_api_key(KEYS["acme"])})
    assert_refused(gw, before, "invalid_config", "admin_api_key_sha256", "acme")
    denied = requests.get(f"{gw.url}/admin/config", headers=gw.headers("acme"), timeout=5)
    assert denied.status_code == 401


def test_a_rule_naming_a_tenant_that_does_not_exist_is_refused(
    gw: GatewayProcess, original: bytes
) -> None:
    before = active_version(gw)
    config = yaml.safe_load(original)
    rule = {"name": "typo", "when": {"tenants": ["acmee"]}, "then": {"route": "direct"}}
    with_config(gw, {"router": {**config["router"], "rules": [rule]}})
    assert_refused(gw, before, "invalid_config", "router.rules.0.when.tenants", "acmee")
    # `config check` refuses what the gateway refuses.
    checked = run_cli(gw.config_path, "config", "check", str(gw.config_path))
    assert checked.returncode == 2, checked.stdout
    assert "router.rules.0.when.tenants" in checked.stderr + checked.stdout
