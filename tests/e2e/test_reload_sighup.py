"""SIGHUP to a running `querygate serve` reloads its configuration file, and refuses an alias
bomb in it (the other reloads, on the app in process: tests/integration/test_reload.py and
test_reload_bomb.py)."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from gateway.settings import load_settings
from tests.fixtures.gateway import GatewayProcess, active_version, start_gateway, stop_gateway
from tests.fixtures.yaml_bomb import alias_bomb


@pytest.fixture
def unwatched(fake_upstream: str, tmp_path: Path) -> Iterator[GatewayProcess]:
    """A gateway with the file watch off: only SIGHUP and the endpoint reload it."""
    gw = start_gateway(tmp_path, fake_upstream, overrides={"server": {"reload_poll_s": 0}})
    yield gw
    stop_gateway(gw)


def test_sighup_reloads_the_file(unwatched: GatewayProcess) -> None:
    old = active_version(unwatched)
    config = yaml.safe_load(unwatched.config_path.read_text())
    config["retrieval"] = {**config.get("retrieval", {}), "k": 4}
    staged = unwatched.config_path.with_suffix(".staged")
    staged.write_text(yaml.safe_dump(config))
    os.replace(staged, unwatched.config_path)
    new = load_settings(unwatched.config_path).version
    assert active_version(unwatched) == old
    unwatched.proc.send_signal(signal.SIGHUP)
    deadline = time.monotonic() + 20
    while (seen := active_version(unwatched)) != new:
        assert time.monotonic() < deadline, f"still {seen}, never {new}"
        time.sleep(0.05)


def test_sighup_refuses_an_alias_bomb_and_the_gateway_keeps_answering(
    unwatched: GatewayProcess,
) -> None:
    old = active_version(unwatched)
    path = unwatched.config_path
    path.write_text(path.read_text() + alias_bomb())
    unwatched.proc.send_signal(signal.SIGHUP)
    deadline = time.monotonic() + 20
    while unwatched.metrics().value("querygate_config_reloads_total", result="error") < 1:
        assert time.monotonic() < deadline, "the SIGHUP reload was never refused"
        time.sleep(0.05)
    refused = [
        json.loads(line)
        for line in unwatched.log().splitlines()
        if '"error_type": "invalid_config"' in line
    ]
    assert refused and "as an alias bomb" in refused[-1]["error"]
    assert refused[-1]["trigger"] == "sighup"
    assert active_version(unwatched) == old
    assert unwatched.proc.poll() is None
