"""The file watch and writers that do not replace the file atomically."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import requests
import yaml

from gateway.settings import load_settings
from tests.fixtures.gateway import (
    GatewayProcess,
    active_version,
    start_gateway,
    stop_gateway,
)

POLL_S = 0.5
WRITING_S = 4.0  # eight polls


@pytest.fixture
def watched(
    fake_upstream: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GatewayProcess]:
    gw = start_gateway(
        tmp_path_factory.mktemp("reload-watch"),
        fake_upstream,
        overrides={"server": {"reload_poll_s": POLL_S}},
    )
    yield gw
    stop_gateway(gw)


def test_a_file_still_being_written_is_not_applied_half_way(watched: GatewayProcess) -> None:
    gw = watched
    before = active_version(gw)
    config = yaml.safe_load(gw.config_path.read_text())
    # What a slow in-place writer has put down so far: valid YAML, the tenant list cut short.
    part = yaml.safe_dump({**config, "tenants": config["tenants"][:1]})
    written = ""
    deadline = time.monotonic() + WRITING_S
    while time.monotonic() < deadline:
        written += f"# still writing {time.monotonic()}\n"
        gw.config_path.write_text(part + written)  # in place, growing: never the same twice
        time.sleep(0.02)
    assert gw.metrics().value("querygate_config_reloads_total", result="ok") == 0
    assert active_version(gw) == before
    answer = requests.post(
        f"{gw.url}/v1/route", json={"query": "Hello?"}, headers=gw.headers("globex"), timeout=30
    )
    assert answer.status_code == 200, answer.text
    # The writer done: the finished file is applied.
    config["retrieval"] = {**config.get("retrieval", {}), "k": 4}
    gw.config_path.write_text(yaml.safe_dump(config))
    new = load_settings(gw.config_path).version
    deadline = time.monotonic() + 20
    while active_version(gw) != new:
        assert time.monotonic() < deadline, "the finished file was never applied"
        time.sleep(0.1)
    assert gw.metrics().value("querygate_config_reloads_total", result="ok") == 1
