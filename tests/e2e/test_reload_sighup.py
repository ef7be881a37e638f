"""SIGHUP to a running `querygate serve` reloads its configuration file (the other reloads, on
the app in process: tests/integration/test_reload.py)."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from gateway.settings import load_settings
from tests.fixtures.gateway import GatewayProcess, active_version, start_gateway, stop_gateway


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
