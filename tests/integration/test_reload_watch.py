"""The file watch and writers that do not replace the file atomically. The app in process,
watching the configuration file it was read from."""

from __future__ import annotations

import asyncio
import time

import pytest
import yaml

from gateway.settings import load_settings
from tests.fakes.llm import FakeLLM
from tests.fixtures.app import Client, OpenClient, auth, config_path, scrape

pytestmark = pytest.mark.asyncio(loop_scope="session")

POLL_S = 0.5
WRITING_S = 4.0  # eight polls


@pytest.fixture
async def watched(app_client: OpenClient) -> Client:
    return await app_client(llm=FakeLLM(), server={"reload_poll_s": POLL_S})


async def active_version(client: Client) -> str:
    async with client.get("/readyz") as resp:
        version: str = (await resp.json())["config_version"]
        return version


async def applied(client: Client) -> float:
    return (await scrape(client)).value("querygate_config_reloads_total", result="ok")


async def test_a_file_still_being_written_is_not_applied_half_way(watched: Client) -> None:
    gw, path = watched, config_path(watched)
    before = await active_version(gw)
    config = yaml.safe_load(path.read_text())
    # What a slow in-place writer has put down so far: valid YAML, the tenant list cut short.
    part = yaml.safe_dump({**config, "tenants": config["tenants"][:1]})
    written = ""
    deadline = time.monotonic() + WRITING_S
    while time.monotonic() < deadline:
        written += f"# still writing {time.monotonic()}\n"
        path.write_text(part + written)  # in place, growing: never the same twice
        await asyncio.sleep(0.02)
    assert await applied(gw) == 0
    assert await active_version(gw) == before
    async with gw.post("/v1/route", json={"query": "Hello?"}, headers=auth("globex")) as answer:
        assert answer.status == 200, await answer.text()
    # The writer done: the finished file is applied.
    config["retrieval"] = {**config.get("retrieval", {}), "k": 4}
    path.write_text(yaml.safe_dump(config))
    new = load_settings(path).version
    deadline = time.monotonic() + 20
    while await active_version(gw) != new:
        assert time.monotonic() < deadline, "the finished file was never applied"
        await asyncio.sleep(0.1)
    assert await applied(gw) == 1
