"""`GET /admin/config`: the active configuration, for the admin key only, secrets redacted."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from tests.fixtures.gateway import (
    ADMIN_KEY,
    KEYS,
    GatewayProcess,
    run_cli,
    start_gateway,
    stop_gateway,
)

# Every secret value the gateway below is configured with; none may appear in the answer.
SECRETS = ("demo-secret-4471", "redis-pw-8812", "os-pw-5530", "base-pw-9917", "osuser", "apiuser")


@pytest.fixture(scope="module")
def with_secrets(
    fake_upstream: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GatewayProcess]:
    upstream = fake_upstream.replace("http://", "http://apiuser:base-pw-9917@")
    overrides = {
        "demo_api_key": "demo-secret-4471",
        "cache": {"redis_url": "redis://default:redis-pw-8812@10.0.0.7:6379/0"},
        "retrieval": {"opensearch": {"hosts": ["https://osuser:os-pw-5530@search.internal:9200"]}},
    }
    gw = start_gateway(tmp_path_factory.mktemp("admin-config"), upstream, overrides=overrides)
    yield gw
    stop_gateway(gw)


def get_config(gw: GatewayProcess, key: str | None) -> requests.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return requests.get(f"{gw.url}/admin/config", headers=headers, timeout=10)


def test_no_secret_value_appears_in_the_active_configuration(with_secrets: GatewayProcess) -> None:
    resp = get_config(with_secrets, ADMIN_KEY)
    assert resp.status_code == 200
    for secret in SECRETS:
        assert secret not in resp.text, secret
    config = resp.json()["config"]
    assert config["demo_api_key"] == "**********"
    # the server a URL names is still there to read, only its user and password are not
    assert config["cache"]["redis_url"] == "redis://**********@10.0.0.7:6379/0"
    assert config["retrieval"]["opensearch"]["hosts"] == ["https://**********@search.internal:9200"]
    assert config["models"]["small"]["api_base"].startswith("http://**********@127.0.0.1:")


def test_the_configuration_is_the_one_serving_with_its_version(
    with_secrets: GatewayProcess,
) -> None:
    resp = get_config(with_secrets, ADMIN_KEY)
    assert resp.status_code == 200
    body = resp.json()
    readyz = requests.get(f"{with_secrets.url}/readyz", timeout=10).json()
    assert body["config_version"] == readyz["config_version"]
    assert [t["id"] for t in body["config"]["tenants"]] == ["acme", "globex"]
    # key digests are how keys are configured, not keys: shown
    assert len(body["config"]["tenants"][0]["api_key_sha256"][0]) == 64


def test_a_tenant_key_or_no_key_gets_no_configuration(gateway: GatewayProcess) -> None:
    assert get_config(gateway, KEYS["acme"]).status_code == 401
    assert get_config(gateway, None).status_code == 401
    assert get_config(gateway, ADMIN_KEY).status_code == 200


def test_config_check_names_the_version_the_gateway_serves(
    gateway: GatewayProcess, tmp_path: Path
) -> None:
    done = run_cli(gateway.config_path, "config", "check", str(gateway.config_path))
    assert done.returncode == 0, done.stderr
    served = get_config(gateway, ADMIN_KEY).json()["config_version"]
    assert done.stdout.strip() == f"OK {gateway.config_path}: config version {served}"
