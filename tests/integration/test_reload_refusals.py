"""Reloads an operator can get wrong, on a serving app: each is refused with a clear 422 naming
the problem, counted as a refused reload, and the old configuration keeps serving every tenant.
The app in process, reading its configuration file as `querygate serve --config` does."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.settings import hash_api_key
from tests.fakes.llm import FakeLLM
from tests.fixtures.app import Client, OpenClient, auth, config_path, scrape
from tests.fixtures.gateway import ADMIN_KEY, KEYS, run_cli

pytestmark = pytest.mark.asyncio(loop_scope="session")

ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}


@pytest.fixture(scope="module")
async def gw(app_client: OpenClient) -> Client:
    # The file watch is off (as every in-process app's): only the endpoint reloads, so each
    # test sees its own reload's answer.
    return await app_client(llm=FakeLLM())


@pytest.fixture
async def original(gw: Client) -> AsyncIterator[bytes]:
    """The config file as started; put back (and reloaded) after the test."""
    text = config_path(gw).read_bytes()
    yield text
    config_path(gw).write_bytes(text)
    status, _ = await reload(gw)
    assert status == 200


async def reload(gw: Client) -> tuple[int, Any]:
    async with gw.post("/admin/reload", headers=ADMIN) as resp:
        return resp.status, await resp.json()


async def active_version(gw: Client) -> str:
    async with gw.get("/readyz") as resp:
        version: str = (await resp.json())["config_version"]
        return version


async def refusals(gw: Client) -> float:
    return (await scrape(gw)).value("querygate_config_reloads_total", result="error")


async def assert_refused(gw: Client, before: str, kind: str, *named: str) -> dict[str, Any]:
    """The reload is a 422 of `kind` naming each of `named`; the old version serves both tenants."""
    refused = await refusals(gw)
    status, body = await reload(gw)
    assert status == 422, body
    assert body["error"]["type"] == kind, body
    for text in named:
        assert text in body["error"]["message"], body
    assert body["version"] == before
    assert await refusals(gw) == refused + 1
    assert await active_version(gw) == before
    for tenant in ("acme", "globex"):
        question = {"query": "What does the Acme warranty cover?"}
        async with gw.post("/v1/route", json=question, headers=auth(tenant)) as answer:
            assert answer.status == 200, await answer.text()
    return dict(body)


def with_config(gw: Client, change: dict[str, Any]) -> None:
    config = yaml.safe_load(config_path(gw).read_text())
    config.update(change)
    config_path(gw).write_text(yaml.safe_dump(config))


async def test_a_config_saved_as_utf16_is_refused_not_a_500(gw: Client, original: bytes) -> None:
    # What some editors write: the same YAML, in UTF-16 with a byte order mark.
    before = await active_version(gw)
    config_path(gw).write_bytes(original.decode().encode("utf-16"))
    await assert_refused(gw, before, "invalid_config", "UTF-8")


async def test_a_top_level_key_that_is_not_a_name_is_refused_not_a_500(
    gw: Client, original: bytes
) -> None:
    before = await active_version(gw)
    config_path(gw).write_bytes(original + b"1: 2\n")
    await assert_refused(gw, before, "invalid_config", "1")


async def test_a_reload_leaving_no_tenant_is_refused(gw: Client, original: bytes) -> None:
    # An emptied list (a template gone wrong) would have switched the gateway to the single
    # demo tenant: every configured tenant refused, a new key minted in the data directory.
    before = await active_version(gw)
    with_config(gw, {"tenants": []})
    await assert_refused(gw, before, "restart_required", "tenants")
    assert not (Path(yaml.safe_load(original)["data_dir"]) / "demo_api_key").exists()


async def test_a_rule_that_can_never_match_is_refused(gw: Client, original: bytes) -> None:
    before = await active_version(gw)
    config = yaml.safe_load(original)
    rule = {
        "name": "never",
        "when": {"min_confidence": 0.9, "max_confidence": 0.5},
        "then": {"route": "multihop"},
    }
    with_config(gw, {"router": {**config["router"], "rules": [rule]}})
    await assert_refused(gw, before, "invalid_config", "router.rules.0.when", "min_confidence")


async def test_an_admin_key_that_is_also_a_tenants_key_is_refused(
    gw: Client, original: bytes
) -> None:
    # Otherwise that tenant could read every tenant's configuration, and reload it.
    before = await active_version(gw)
    with_config(gw, {"admin_api_key_sha256": hash_api_key(KEYS["acme"])})
    await assert_refused(gw, before, "invalid_config", "admin_api_key_sha256", "acme")
    async with gw.get("/admin/config", headers=auth("acme")) as denied:
        assert denied.status == 401


async def test_a_rule_naming_a_tenant_that_does_not_exist_is_refused(
    gw: Client, original: bytes
) -> None:
    before = await active_version(gw)
    config = yaml.safe_load(original)
    rule = {"name": "typo", "when": {"tenants": ["acmee"]}, "then": {"route": "direct"}}
    with_config(gw, {"router": {**config["router"], "rules": [rule]}})
    await assert_refused(gw, before, "invalid_config", "router.rules.0.when.tenants", "acmee")
    # `config check` refuses what the gateway refuses.
    checked = run_cli(config_path(gw), "config", "check", str(config_path(gw)))
    assert checked.returncode == 2, checked.stdout
    assert "router.rules.0.when.tenants" in checked.stderr + checked.stdout


async def test_a_fallback_with_fallbacks_of_its_own_is_refused(gw: Client, original: bytes) -> None:
    # Never tried if accepted: the tier's chain is its model, then its own fallbacks.
    before = await active_version(gw)
    config = yaml.safe_load(original)
    small = config["models"]["small"]
    nested = {**small, "fallbacks": [{"model": "openai/never", "api_base": small["api_base"]}]}
    with_config(gw, {"models": {**config["models"], "small": {**small, "fallbacks": [nested]}}})
    await assert_refused(gw, before, "invalid_config", "models.small.fallbacks", "0.fallbacks")
    checked = run_cli(config_path(gw), "config", "check", str(config_path(gw)))
    assert checked.returncode == 2, checked.stdout
    assert "models.small.fallbacks" in checked.stderr and "0.fallbacks" in checked.stderr
