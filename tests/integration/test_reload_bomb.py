"""A YAML alias bomb in the configuration file (a few hundred bytes spelling 10**9 nodes) is
refused before it is built, with a message naming it, by every reader of the file: the file
watch, POST /admin/reload (422), `querygate config check` and `querygate serve` (SIGHUP, which
needs the process: tests/e2e/test_reload_sighup.py). The loop keeps answering meanwhile."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest

from tests.fakes.llm import FakeLLM
from tests.fixtures.app import Client, LogLines, OpenClient, config_path, scrape
from tests.fixtures.gateway import ADMIN_KEY, run_cli
from tests.fixtures.yaml_bomb import alias_bomb

pytestmark = pytest.mark.asyncio(loop_scope="session")

ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}
NAMED = "as an alias bomb"
POLL_S = 0.2
DEADLINE_S = 20.0


@pytest.fixture
async def watched(app_client: OpenClient) -> AsyncIterator[Client]:
    gw = await app_client(llm=FakeLLM(), server={"reload_poll_s": POLL_S})
    path = config_path(gw)
    original = path.read_text()
    path.write_text(original + alias_bomb())
    yield gw
    path.write_text(original)


async def version(gw: Client) -> str:
    async with gw.get("/readyz") as resp:
        found: str = (await resp.json())["config_version"]
        return found


async def refusals(gw: Client) -> float:
    return (await scrape(gw)).value("querygate_config_reloads_total", result="error")


async def test_the_file_watch_refuses_it_naming_it(watched: Client, gateway_log: LogLines) -> None:
    before = await version(watched)
    deadline = time.monotonic() + DEADLINE_S
    while await refusals(watched) < 1:
        assert time.monotonic() < deadline, "the watch never reported the bomb"
        await asyncio.sleep(0.05)
    refused = [line for line in gateway_log.lines if line.get("error_type") == "invalid_config"]
    assert refused and NAMED in refused[-1]["error"]
    assert refused[-1]["trigger"] == "file"
    assert await version(watched) == before


async def test_admin_reload_refuses_it_while_the_loop_answers(watched: Client) -> None:
    before = await version(watched)

    async def reload() -> tuple[int, dict[str, object]]:
        async with watched.post("/admin/reload", headers=ADMIN) as resp:
            return resp.status, await resp.json()

    async def healthz() -> int:
        async with watched.get("/healthz") as resp:
            return resp.status

    # Sent together: the reload reads, counts and refuses on its thread while these are served.
    (status, body), *healthy = await asyncio.gather(reload(), *(healthz() for _ in range(20)))
    assert status == 422, body
    error = body["error"]
    assert isinstance(error, dict) and error["type"] == "invalid_config"
    assert NAMED in error["message"]
    assert body["version"] == before
    assert healthy == [200] * 20


async def test_config_check_and_serve_refuse_it_naming_it(watched: Client) -> None:
    path = config_path(watched)
    checked = run_cli(path, "config", "check", str(path))
    assert checked.returncode == 2, checked.stdout
    assert NAMED in checked.stderr
    served = run_cli(path, "serve", "--port", "0")
    assert served.returncode == 2, served.stdout
    assert NAMED in served.stderr
