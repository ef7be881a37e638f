"""`serve --workers N` when workers come and go: a crash loop is slowed down, a reload
reaches a worker that was still starting when it was asked for, and a drain finishes a stream
while new clients are refused."""

from __future__ import annotations

import json
import os
import signal
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import requests
import yaml

from gateway.settings import load_settings
from tests.e2e.test_workers import (
    _children,
    _log_pids,
    _route,
    _wait_counted,
    _wait_workers_ready,
)
from tests.fixtures.gateway import GatewayProcess, start_gateway, stop_gateway


def _lines(gw: GatewayProcess) -> list[dict[str, Any]]:
    found = []
    for line in gw.log().splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict):
            found.append(entry)
    return found


def _wait_ready_replacement(gw: GatewayProcess, gone: set[int]) -> int:
    """The pid of the child that replaced `gone`, once it is ready."""
    deadline = time.monotonic() + 90
    while True:
        assert gw.proc.poll() is None, gw.log()[-3000:]
        assert time.monotonic() < deadline, gw.log()[-3000:]
        new = _children(gw.proc.pid) - gone
        ready = new & _log_pids(gw, msg="ready")
        if len(_children(gw.proc.pid)) == 2 and ready:
            _wait_counted(gw, 2)
            return min(ready)
        time.sleep(0.05)


def _respawn_gaps(gw: GatewayProcess) -> list[float]:
    """For each worker that exited, seconds until the supervisor started the next one."""
    gaps, exited = [], None
    for entry in _lines(gw):
        if entry.get("msg") == "worker exited":
            exited = datetime.fromisoformat(entry["ts"])
        elif entry.get("msg") == "worker started" and exited is not None:
            gaps.append((datetime.fromisoformat(entry["ts"]) - exited).total_seconds())
            exited = None
    return gaps


def test_serving_workers_that_keep_dying_are_replaced_ever_more_slowly(
    fake_upstream: str, tmp_path: Path
) -> None:
    gw = start_gateway(tmp_path, fake_upstream, serve_args=("--workers", "2"))
    try:
        _wait_workers_ready(gw, 2)
        victim = max(_children(gw.proc.pid))
        seen = set(_children(gw.proc.pid))
        for _ in range(3):  # a worker dying each time it is up: a crash loop
            os.kill(victim, signal.SIGKILL)
            victim = _wait_ready_replacement(gw, seen)
            seen = seen | {victim}
        gaps = _respawn_gaps(gw)
        assert len(gaps) == 3, gaps
        assert gaps[0] < 0.4, gaps  # one death is replaced at once
        assert gaps[2] >= 0.9, gaps  # the third in a row waits (0.5 s, then 1 s, ...)
        assert any(e.get("msg", "").startswith("serving workers keep dying") for e in _lines(gw))
        for i in range(6):  # the survivor served throughout
            assert _route(gw, f"Who built bridge {i}?").status_code == 200
    finally:
        stop_gateway(gw)


def _threads(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    return 0


def _serving_version(gw: GatewayProcess, pid: int) -> str | None:
    """The config version a worker last said it serves (at ready, or at a reload)."""
    version = None
    for entry in _lines(gw):
        if entry.get("pid") == pid and entry.get("msg") in ("ready", "config reload"):
            version = entry.get("config_version")
    return version


def test_a_worker_starting_during_a_reload_reloads_once_ready(
    fake_upstream: str, tmp_path: Path
) -> None:
    # No file watch (the chart's rolling mode): only SIGHUP and the endpoint reload.
    gw = start_gateway(
        tmp_path,
        fake_upstream,
        overrides={"server": {"reload_poll_s": 0}},
        serve_args=("--workers", "2"),
    )
    try:
        _wait_workers_ready(gw, 2)
        old = set(_children(gw.proc.pid))
        os.kill(min(old), signal.SIGKILL)
        # The replacement has read its config file once its event loop's threads exist (the
        # file is read before anything starts a thread), and is not ready yet.
        deadline = time.monotonic() + 60
        while True:
            assert time.monotonic() < deadline, gw.log()[-3000:]
            new = _children(gw.proc.pid) - old
            if new and _threads(starting := min(new)) > 1:
                break
            time.sleep(0.01)
        config = yaml.safe_load(gw.config_path.read_text())
        config["retrieval"] = {**config.get("retrieval", {}), "k": 4}
        gw.config_path.write_text(yaml.safe_dump(config))
        version = load_settings(gw.config_path).version
        gw.proc.send_signal(signal.SIGHUP)
        assert starting not in _log_pids(gw, msg="ready"), "the replacement was ready too soon"
        _wait_ready_replacement(gw, old)
        deadline = time.monotonic() + 20
        while {p: _serving_version(gw, p) for p in _children(gw.proc.pid)} != {
            p: version for p in _children(gw.proc.pid)
        }:
            assert time.monotonic() < deadline, {
                p: _serving_version(gw, p) for p in _children(gw.proc.pid)
            }
            time.sleep(0.2)
        assert requests.get(f"{gw.url}/readyz", timeout=5).json()["config_version"] == version
    finally:
        stop_gateway(gw)


def test_sigterm_finishes_a_running_stream_and_refuses_new_connections(
    fake_upstream: str, tmp_path: Path
) -> None:
    gw = start_gateway(tmp_path, fake_upstream, serve_args=("--workers", "2"))
    try:
        _wait_workers_ready(gw, 2)
        # A chunk a second: the answer is still streaming while the new client tries.
        directive = json.dumps({"chunk_delay_ms": 1000})
        stream = requests.post(
            f"{gw.url}/v1/query",
            json={"query": f"Hello there [[fake:{directive}]]", "route": "direct", "stream": True},
            headers=gw.headers(),
            stream=True,
            timeout=30,
        )
        assert stream.status_code == 200
        chunks = stream.iter_content(chunk_size=None)
        first = next(chunks)  # the answer is streaming
        gw.proc.send_signal(signal.SIGTERM)
        time.sleep(1.0)
        # A new client is refused at once (a load balancer retries elsewhere), not left in the
        # listen queue of a socket nobody accepts from any more.
        started = time.monotonic()
        try:
            requests.get(f"{gw.url}/healthz", timeout=3)
            outcome = "answered"
        except requests.ConnectionError as exc:
            outcome = "timeout" if isinstance(exc, requests.ConnectTimeout) else "refused"
        except requests.Timeout:
            outcome = "timeout"
        assert gw.proc.poll() is None, "the gateway was gone before the new client tried"
        assert outcome == "refused", (outcome, time.monotonic() - started)
        body = (first + b"".join(chunks)).decode()
        assert "event: done" in body, body[-500:]
        assert gw.proc.wait(timeout=30) == 0
    finally:
        stop_gateway(gw)
