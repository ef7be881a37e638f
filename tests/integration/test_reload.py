"""Live configuration on a serving app: a file edit or POST /admin/reload swaps the config; an
invalid or restart-only config is refused and the old one keeps serving; requests in flight
through several reloads all succeed. The app in process, watching the file it was read from
(SIGHUP, which needs the process: tests/e2e/test_reload_sighup.py). A live key's change reaches
the work it configures: the fusion the lookup's and the agent's searches ask the index for."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
import uuid
from typing import Any

import pytest
import yaml

from backends.retrieval.base import DEFAULT_FUSION, Hit, SearchRequest
from gateway.http.appkeys import SERVICES
from gateway.settings import load_settings
from tests.fakes.llm import Call, FakeLLM, echo
from tests.fixtures.app import Client, OpenClient, auth, config_path, scrape
from tests.fixtures.gateway import ADMIN_KEY

pytestmark = pytest.mark.asyncio(loop_scope="session")

POLL_S = 0.2
DEADLINE_S = 20.0
ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}
LOAD_REQUESTS = 200
LOAD_DEADLINE_S = 600


@pytest.fixture
async def watched(app_client: OpenClient) -> Client:
    """An app that watches its config file every POLL_S seconds."""
    return await app_client(llm=FakeLLM(), server={"reload_poll_s": POLL_S})


@pytest.fixture
async def unwatched(app_client: OpenClient) -> Client:
    """An app with the file watch off: only the endpoint reloads it."""
    return await app_client(llm=FakeLLM())


def rewrite(client: Client, **sections: dict[str, Any]) -> None:
    """Replace the config file atomically (as editors and config management do), with
    `sections` merged in."""
    path = config_path(client)
    config = yaml.safe_load(path.read_text())
    for name, values in sections.items():
        config[name] = {**config.get(name, {}), **values}
    staged = path.with_suffix(".staged")
    staged.write_text(yaml.safe_dump(config))
    os.replace(staged, path)


def file_version(client: Client) -> str:
    """The version the app will compute for its file."""
    return load_settings(config_path(client)).version


async def active_version(client: Client) -> str:
    async with client.get("/readyz") as resp:
        version: str = (await resp.json())["config_version"]
        return version


async def wait_for_version(client: Client, version: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while (seen := await active_version(client)) != version:
        assert time.monotonic() < deadline, f"still {seen}, never {version}"
        await asyncio.sleep(0.05)


async def query(client: Client) -> tuple[int, Any]:
    body = {
        "query": f"What does the Acme warranty cover? {uuid.uuid4().hex[:8]}",
        "route": "lookup",
    }
    async with client.post("/v1/query", json=body, headers=auth()) as resp:
        return resp.status, await resp.json()


async def reload(client: Client, headers: dict[str, str] | None = None) -> tuple[int, Any]:
    async with client.post("/admin/reload", headers=headers or {}) as resp:
        return resp.status, await resp.json()


async def test_editing_the_file_switches_the_version_of_answers_and_readyz(
    watched: Client,
) -> None:
    old = await active_version(watched)
    rewrite(watched, retrieval={"k": 4})
    new = file_version(watched)
    assert new != old
    await wait_for_version(watched, new)
    status, body = await query(watched)
    assert status == 200, body
    assert body["config_version"] == new
    metrics = await scrape(watched)
    assert metrics.value("querygate_config_info", version=new) == 1
    assert metrics.value("querygate_config_info", version=old) == 0
    assert metrics.value("querygate_config_reloads_total", result="ok") == 1


async def test_admin_reload_refuses_a_caller_without_the_admin_key(unwatched: Client) -> None:
    old = await active_version(unwatched)
    rewrite(unwatched, retrieval={"k": 4})
    assert (await reload(unwatched))[0] == 401
    assert (await reload(unwatched, auth()))[0] == 401
    assert await active_version(unwatched) == old


async def test_admin_reload_applies_the_file_and_names_the_version(unwatched: Client) -> None:
    assert (await reload(unwatched, ADMIN))[1]["result"] == "unchanged"
    rewrite(unwatched, retrieval={"k": 4})
    new = file_version(unwatched)
    status, body = await reload(unwatched, ADMIN)
    assert status == 200, body
    assert body == {"result": "ok", "version": new, "changed": ["retrieval.k"]}
    assert (await query(unwatched))[1]["config_version"] == new


async def test_an_invalid_file_is_refused_and_the_old_config_keeps_serving(
    watched: Client, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="gateway.server.reload")
    old = await active_version(watched)
    rewrite(watched, retrieval={"k": 0})
    deadline = time.monotonic() + DEADLINE_S
    while (await scrape(watched)).value("querygate_config_reloads_total", result="error") < 1:
        assert time.monotonic() < deadline, "the watch never reported the bad file"
        await asyncio.sleep(0.05)
    status, body = await reload(watched, ADMIN)
    assert status == 422
    assert body["error"]["type"] == "invalid_config"
    assert "retrieval.k" in body["error"]["message"]
    assert body["version"] == old
    status, answer = await query(watched)
    assert status == 200
    assert answer["config_version"] == old
    assert any("retrieval.k" in getattr(record, "error", "") for record in caplog.records)


async def test_a_restart_only_change_is_refused(unwatched: Client) -> None:
    old = await active_version(unwatched)
    rewrite(unwatched, server={"port": 18_431}, retrieval={"k": 4})
    status, body = await reload(unwatched, ADMIN)
    assert status == 422
    error = body["error"]
    assert error["type"] == "restart_required"
    assert "server.port" in error["message"]
    assert "restart required" in error["message"]
    assert await active_version(unwatched) == old


# Requests start over about two seconds, while the rewrites land, and each waits on the model
# too, so they are in flight together even when the app embeds quickly.
STAGGER_S = 0.01
MODEL_DELAY_S = 1.0


async def slow(call: Call) -> str:
    await asyncio.sleep(MODEL_DELAY_S)
    return echo(call)


async def test_requests_in_flight_through_several_reloads_all_succeed(
    app_client: OpenClient,
) -> None:
    # The request deadline and admission limits outlast a queue of LOAD_REQUESTS from one
    # tenant: neither the deadline nor the tenant's fair share is what this test is about.
    pool = {
        name: LOAD_REQUESTS
        for name in ("max_inflight", "max_queued", "tenant_max_inflight", "tenant_max_queued")
    }
    server = {
        "reload_poll_s": POLL_S,
        "request_timeout_s": LOAD_DEADLINE_S,
        "admission": {"queries": pool},
    }
    gw = await app_client(llm=FakeLLM(slow), server=server)
    first = await active_version(gw)

    async def ask(i: int) -> tuple[int, Any]:
        await asyncio.sleep(i * STAGGER_S)
        body = {"query": f"Acme warranty, case {i}?", "route": "lookup"}
        async with gw.post("/v1/query", json=body, headers=auth()) as resp:
            return resp.status, await resp.json()

    load = asyncio.gather(*(ask(i) for i in range(LOAD_REQUESTS)))
    versions = {first}
    for k in (5, 4, 3, 2):  # rewrite the file several times, each until the watch applied it
        rewrite(gw, retrieval={"k": k})
        versions.add(file_version(gw))
        await wait_for_version(gw, file_version(gw))
    answers = await load
    failures = [a for a in answers if a[0] != 200]
    assert failures == []
    seen = {body["config_version"] for _, body in answers}
    assert seen <= versions
    assert len(seen) > 1, "the load never straddled a reload"


def watch_searches(client: Client) -> list[SearchRequest]:
    """The search requests the app's index gets from now on; watched, not replaced: the real
    index answers every one."""
    retriever = client.app[SERVICES].retriever
    asked: list[SearchRequest] = []
    search = retriever.search

    async def recorded(request: SearchRequest) -> list[Hit]:
        asked.append(request)
        return await search(request)

    retriever.search = recorded  # type: ignore[method-assign]
    return asked


async def test_a_fusion_change_applies_to_the_next_search(unwatched: Client) -> None:
    asked = watch_searches(unwatched)
    assert (await query(unwatched))[0] == 200
    assert [r.fusion for r in asked] == [DEFAULT_FUSION]
    rewrite(unwatched, retrieval={"fusion": "rrf"})
    status, body = await reload(unwatched, ADMIN)
    assert status == 200, body
    assert body["changed"] == ["retrieval.fusion"]
    status, answer = await query(unwatched)
    assert status == 200, answer
    assert answer["config_version"] == body["version"]
    assert [r.fusion for r in asked] == [DEFAULT_FUSION, "rrf"]


async def test_a_fusion_change_applies_to_the_agents_searches(
    app_client: OpenClient, fake_upstream: str
) -> None:
    tier = {"api_base": fake_upstream, "retries": 0}
    gw = await app_client(
        upstream=fake_upstream,
        models={
            "small": {"model": "openai/fake-small", **tier},
            "large": {"model": "openai/fake-large", **tier},
        },
        cache={"backend": "off"},
    )
    asked = watch_searches(gw)

    async def agent_answer() -> None:
        search = {"name": "search", "arguments": {"query": "Acme warranty"}, "id": "s"}
        script = {
            "key": uuid.uuid4().hex,
            "turns": [{"tool_calls": [search]}, {"answer": "Two years {cite:1}."}],
        }
        body = {
            "query": f"How long is the Acme warranty? [[fake:{json.dumps(script)}]]",
            "route": "multihop",
        }
        async with gw.post("/v1/query", json=body, headers=auth()) as resp:
            assert resp.status == 200, await resp.text()
            assert (await resp.json())["route"] == "multihop"

    await agent_answer()
    assert [r.fusion for r in asked] == [DEFAULT_FUSION]
    rewrite(gw, retrieval={"fusion": "zscore"})
    status, body = await reload(gw, ADMIN)
    assert status == 200, body
    await agent_answer()
    assert [r.fusion for r in asked] == [DEFAULT_FUSION, "zscore"]
