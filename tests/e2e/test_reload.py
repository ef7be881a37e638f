"""Live configuration on a running `querygate serve`: a file edit, SIGHUP or POST /admin/reload
swaps the config; an invalid or restart-only config is refused and the old one keeps serving."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import requests
import yaml

from gateway.settings import load_settings
from tests.fixtures.gateway import (
    ADMIN_KEY,
    KEYS,
    GatewayProcess,
    active_version,
    free_port,
    start_gateway,
    stop_gateway,
)

POLL_S = 0.2
DEADLINE_S = 20.0
ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}
LOAD_REQUESTS = 200
LOAD_DEADLINE_S = 600


def _gateway(
    fake_upstream: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **server: float
) -> Iterator[GatewayProcess]:
    # The environment reaches the gateway process, and each of its reloads, as an override.
    for name, value in server.items():
        monkeypatch.setenv(f"QUERYGATE_SERVER__{name.upper()}", str(value))
    gw = start_gateway(tmp_path, fake_upstream)
    yield gw
    stop_gateway(gw)


@pytest.fixture
def watched(
    fake_upstream: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[GatewayProcess]:
    """A gateway that watches its config file every POLL_S seconds."""
    yield from _gateway(fake_upstream, tmp_path, monkeypatch, reload_poll_s=POLL_S)


@pytest.fixture
def unwatched(
    fake_upstream: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[GatewayProcess]:
    """A gateway with the file watch off: only SIGHUP and the endpoint reload it."""
    yield from _gateway(fake_upstream, tmp_path, monkeypatch, reload_poll_s=0)


@pytest.fixture
def watched_patient(
    fake_upstream: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[GatewayProcess]:
    """A watched gateway whose request deadline and admission limits outlast a queue of
    LOAD_REQUESTS from one tenant: on a small shared machine, embedding them all takes longer
    than the default minute, and neither the deadline nor the tenant's fair share is what the
    load test is about."""
    pool = {
        f"admission__queries__{name}": LOAD_REQUESTS
        for name in ("max_inflight", "max_queued", "tenant_max_inflight", "tenant_max_queued")
    }
    yield from _gateway(
        fake_upstream,
        tmp_path,
        monkeypatch,
        reload_poll_s=POLL_S,
        request_timeout_s=LOAD_DEADLINE_S,
        **pool,
    )


def rewrite(gw: GatewayProcess, **sections: dict[str, Any]) -> None:
    """Replace the config file atomically (as editors and config management do), with
    `sections` merged in."""
    config = yaml.safe_load(gw.config_path.read_text())
    for name, values in sections.items():
        config[name] = {**config.get(name, {}), **values}
    staged = gw.config_path.with_suffix(".staged")
    staged.write_text(yaml.safe_dump(config))
    os.replace(staged, gw.config_path)


def file_version(gw: GatewayProcess) -> str:
    """The version the gateway will compute for its file: this process has the same env."""
    return load_settings(gw.config_path).version


def wait_for_version(gw: GatewayProcess, version: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while (seen := active_version(gw)) != version:
        assert time.monotonic() < deadline, f"still {seen}, never {version}"
        time.sleep(0.05)


def query(gw: GatewayProcess) -> requests.Response:
    body = {
        "query": f"What does the Acme warranty cover? {uuid.uuid4().hex[:8]}",
        "route": "lookup",
    }
    return requests.post(f"{gw.url}/v1/query", json=body, headers=gw.headers(), timeout=30)


def reload(gw: GatewayProcess, headers: dict[str, str] | None = None) -> requests.Response:
    return requests.post(f"{gw.url}/admin/reload", headers=headers or {}, timeout=30)


def log_lines(gw: GatewayProcess) -> list[dict[str, Any]]:
    return [json.loads(line) for line in gw.log().splitlines() if line.startswith("{")]


def test_editing_the_file_switches_the_version_of_answers_and_readyz(
    watched: GatewayProcess,
) -> None:
    old = active_version(watched)
    rewrite(watched, retrieval={"k": 4})
    new = file_version(watched)
    assert new != old
    wait_for_version(watched, new)
    resp = query(watched)
    assert resp.status_code == 200, resp.text
    assert resp.json()["config_version"] == new
    assert watched.metrics().value("querygate_config_info", version=new) == 1
    assert watched.metrics().value("querygate_config_info", version=old) == 0
    assert watched.metrics().value("querygate_config_reloads_total", result="ok") == 1


def test_sighup_reloads_the_file(unwatched: GatewayProcess) -> None:
    old = active_version(unwatched)
    rewrite(unwatched, retrieval={"k": 4})
    new = file_version(unwatched)
    assert active_version(unwatched) == old
    unwatched.proc.send_signal(signal.SIGHUP)
    wait_for_version(unwatched, new)


def test_admin_reload_refuses_a_caller_without_the_admin_key(unwatched: GatewayProcess) -> None:
    old = active_version(unwatched)
    rewrite(unwatched, retrieval={"k": 4})
    assert reload(unwatched).status_code == 401
    assert reload(unwatched, unwatched.headers()).status_code == 401
    assert active_version(unwatched) == old


def test_admin_reload_applies_the_file_and_names_the_version(unwatched: GatewayProcess) -> None:
    assert reload(unwatched, ADMIN).json()["result"] == "unchanged"
    rewrite(unwatched, retrieval={"k": 4})
    new = file_version(unwatched)
    resp = reload(unwatched, ADMIN)
    assert resp.status_code == 200, resp.text
    assert resp.json() == {"result": "ok", "version": new}
    assert query(unwatched).json()["config_version"] == new


def test_an_invalid_file_is_refused_and_the_old_config_keeps_serving(
    watched: GatewayProcess,
) -> None:
    old = active_version(watched)
    rewrite(watched, retrieval={"k": 0})
    deadline = time.monotonic() + DEADLINE_S
    while watched.metrics().value("querygate_config_reloads_total", result="error") < 1:
        assert time.monotonic() < deadline, "the watch never reported the bad file"
        time.sleep(0.05)
    resp = reload(watched, ADMIN)
    assert resp.status_code == 422
    assert resp.json()["error"]["type"] == "invalid_config"
    assert "retrieval.k" in resp.json()["error"]["message"]
    assert resp.json()["version"] == old
    answer = query(watched)
    assert answer.status_code == 200
    assert answer.json()["config_version"] == old
    assert any("retrieval.k" in line.get("error", "") for line in log_lines(watched))


def test_a_restart_only_change_is_refused(unwatched: GatewayProcess) -> None:
    old = active_version(unwatched)
    rewrite(unwatched, server={"port": free_port()}, retrieval={"k": 4})
    resp = reload(unwatched, ADMIN)
    assert resp.status_code == 422
    error = resp.json()["error"]
    assert error["type"] == "restart_required"
    assert "server.port" in error["message"]
    assert "restart required" in error["message"]
    assert active_version(unwatched) == old


# Requests start over about two seconds, while the rewrites land, and each waits on the fake
# model too, so they are in flight together even when the gateway embeds quickly.
STAGGER_S = 0.01
MODEL_DELAY_MS = 1000


async def test_requests_in_flight_through_several_reloads_all_succeed(
    watched_patient: GatewayProcess,
) -> None:
    gw = watched_patient
    first = active_version(gw)
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=LOAD_DEADLINE_S)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        load = asyncio.gather(*(ask(session, gw, i) for i in range(LOAD_REQUESTS)))
        versions = {first, *await asyncio.to_thread(cycle_versions, gw)}
        answers = await load
    failures = [a for a in answers if a[0] != 200]
    assert failures == []
    seen = {body["config_version"] for _, body in answers}
    assert seen <= versions
    assert len(seen) > 1, "the load never straddled a reload"


async def ask(
    session: aiohttp.ClientSession, gw: GatewayProcess, i: int
) -> tuple[int, dict[str, Any]]:
    await asyncio.sleep(i * STAGGER_S)
    directive = json.dumps({"delay_ms": MODEL_DELAY_MS})
    body = {"query": f"Acme warranty, case {i}? [[fake:{directive}]]", "route": "lookup"}
    headers = {"Authorization": f"Bearer {KEYS['acme']}"}
    async with session.post(f"{gw.url}/v1/query", json=body, headers=headers) as resp:
        return resp.status, await resp.json()


def cycle_versions(gw: GatewayProcess) -> list[str]:
    """Rewrite the file several times, each time until the watch applied it; the versions."""
    versions = []
    for k in (5, 4, 3, 2):
        rewrite(gw, retrieval={"k": k})
        versions.append(file_version(gw))
        wait_for_version(gw, versions[-1])
    return versions
