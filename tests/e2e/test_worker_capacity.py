"""`serve --workers N` with fewer than N workers: a worker that cannot start is retried while
the others serve, the lost capacity shows in /readyz and `querygate_workers`, the supervisor
gives up only when nothing serves; and what reloads leave in /metrics and in /admin/reload's
answer."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import time
from pathlib import Path
from typing import Any

import requests
import yaml

from gateway.settings import load_settings
from tests.e2e.test_worker_lifecycle import _lines
from tests.e2e.test_workers import _children, _log_pids, _route, _wait_workers_ready
from tests.fixtures.gateway import ADMIN_KEY, GatewayProcess, start_gateway, stop_gateway

ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}
NO_WATCH = {"server": {"reload_poll_s": 0}}  # the file changes only when a test says so
# Retries of a worker that cannot start pause 0.5 s, doubling, up to 4 s here (30 s by
# default): the supervisor's decisions are the same, reached in seconds rather than a minute.
RETRYING = {"server": {"reload_poll_s": 0, "worker_max_pause_s": 4}}
# Bounds on waits for what worker processes do (start, fail, be replaced, reload): a start
# imports the stack and loads MiniLM, which took a loaded 2-core runner 20-50 s, and four
# failed ones passed 90 s. They only stop a test whose event never comes.
SETTLE_S = 60.0  # a running worker's next report (its gauge, its version)
STARTS_S = 600.0  # worker starts, failed or not, with the supervisor's pauses between them


def _workers_gauge(gw: GatewayProcess) -> dict[str, float]:
    return {
        dict(labels)["state"]: value
        for labels, value in gw.metrics().series("querygate_workers").items()
    }


def _break_start(gw: GatewayProcess) -> str:
    """A config file every new worker fails to start on (its data dir cannot be made: a file
    is in the way) and that no running worker reads (no file watch). Returns the good one."""
    good = gw.config_path.read_text()
    blocker = gw.config_path.parent / "blocker"
    blocker.write_text("not a directory\n")
    config = yaml.safe_load(good)
    config["data_dir"] = str(blocker / "data")
    gw.config_path.write_text(yaml.safe_dump(config))
    return good


def _failed_starts(gw: GatewayProcess) -> int:
    return sum(1 for e in _lines(gw) if e.get("msg") == "worker exited" and e.get("ready") is False)


def _wait(what: str, done: Any, gw: GatewayProcess, within_s: float) -> None:
    deadline = time.monotonic() + within_s
    while not done():
        assert time.monotonic() < deadline, f"{what}:\n{gw.log()[-3000:]}"
        time.sleep(0.2)


def test_a_worker_that_cannot_start_is_retried_while_the_other_serves(
    fake_upstream: str, tmp_path: Path
) -> None:
    gw = start_gateway(tmp_path, fake_upstream, overrides=RETRYING, serve_args=("--workers", "2"))
    try:
        _wait_workers_ready(gw, 2)
        ready = requests.get(f"{gw.url}/readyz", timeout=5)
        assert ready.status_code == 200, ready.text
        assert ready.json()["status"] == "ok"
        assert ready.json()["workers"] == {"serving": 2, "expected": 2}
        assert _workers_gauge(gw) == {"serving": 2, "expected": 2}

        good = _break_start(gw)
        os.kill(min(_children(gw.proc.pid)), signal.SIGKILL)
        # Past three failed starts in a row the gateway keeps retrying rather than stop whole.
        _wait("four failed starts", lambda: _failed_starts(gw) >= 4, gw, STARTS_S)
        assert gw.proc.poll() is None, gw.log()[-3000:]
        assert any(
            e.get("msg") == "a worker failed to start; retrying after a pause" for e in _lines(gw)
        )
        for i in range(4):  # the survivor serves throughout
            assert _route(gw, f"Who designed tower {i}?").status_code == 200
        ready = requests.get(f"{gw.url}/readyz", timeout=5)
        assert ready.status_code == 200, ready.text  # still ready: one worker answers
        assert ready.json()["status"] == "degraded"
        assert ready.json()["workers"] == {"serving": 1, "expected": 2}
        assert _workers_gauge(gw) == {"serving": 1, "expected": 2}

        gw.config_path.write_text(good)  # the next retry (a pause of at most 4 s) starts
        _wait("a replacement serving", lambda: _workers_gauge(gw).get("serving") == 2, gw, STARTS_S)
        ready = requests.get(f"{gw.url}/readyz", timeout=5)
        assert ready.status_code == 200, ready.text
        assert ready.json()["status"] == "ok"
        assert ready.json()["workers"] == {"serving": 2, "expected": 2}
    finally:
        stop_gateway(gw)


def test_the_supervisor_gives_up_once_no_worker_can_start_for_the_whole_backoff(
    fake_upstream: str, tmp_path: Path
) -> None:
    gw = start_gateway(tmp_path, fake_upstream, overrides=RETRYING, serve_args=("--workers", "2"))
    try:
        _wait_workers_ready(gw, 2)
        _break_start(gw)
        started = time.monotonic()
        for pid in _children(gw.proc.pid):
            os.kill(pid, signal.SIGKILL)
        code = gw.proc.wait(timeout=STARTS_S)
        elapsed = time.monotonic() - started
        assert code == 1, gw.log()[-3000:]
        # Not after three failures: once a start failed after the pauses (0.5 s, doubling,
        # over the two workers' retries) reached the longest, 4 s.
        assert elapsed > 4, (elapsed, _failed_starts(gw))
        lines = _lines(gw)
        longest = [i for i, e in enumerate(lines) if e.get("pause_s") == 4.0]
        assert longest, gw.log()[-3000:]
        stop = "no worker is serving and none can start; stopping"
        last = [i for i, e in enumerate(lines) if e.get("msg") == stop]
        assert last and last[0] > longest[0], gw.log()[-3000:]
        assert lines[last[0]]["failed_starts_in_a_row"] >= 4
    finally:
        stop_gateway(gw)


def _reload(gw: GatewayProcess, k: int) -> str:
    config = yaml.safe_load(gw.config_path.read_text())
    config["retrieval"] = {**config.get("retrieval", {}), "k": k}
    gw.config_path.write_text(yaml.safe_dump(config))
    response = requests.post(f"{gw.url}/admin/reload", headers=ADMIN, timeout=10)
    assert response.status_code == 200, response.text
    version = load_settings(gw.config_path).version
    assert response.json()["version"] == version
    return version


def _versions(gw: GatewayProcess) -> dict[int, str | None]:
    """Each worker's config version as it last logged it (at ready, or at a reload)."""
    found: dict[int, str | None] = {pid: None for pid in _children(gw.proc.pid)}
    for entry in _lines(gw):
        if entry.get("pid") in found and entry.get("msg") in ("ready", "config reload"):
            found[entry["pid"]] = entry.get("config_version")
    return found


def test_config_info_shows_only_the_versions_workers_run_after_many_reloads(
    fake_upstream: str, tmp_path: Path
) -> None:
    gw = start_gateway(tmp_path, fake_upstream, overrides=NO_WATCH, serve_args=("--workers", "2"))
    try:
        _wait_workers_ready(gw, 2)
        first = load_settings(gw.config_path).version
        for k in (2, 3, 4, 5):
            version = _reload(gw, k)
        assert version != first
        _wait(
            "every worker on the last version",
            lambda: set(_versions(gw).values()) == {version},
            gw,
            SETTLE_S,
        )
        for _ in range(4):  # a scrape reaches either worker: each reports the one live version
            info = gw.metrics().series("querygate_config_info")
            assert info == {(("version", version),): 1.0}, info
    finally:
        stop_gateway(gw)


def test_admin_reload_after_the_supervisor_died_answers_200_and_says_so(
    fake_upstream: str, tmp_path: Path
) -> None:
    gw = start_gateway(tmp_path, fake_upstream, overrides=NO_WATCH, serve_args=("--workers", "2"))
    orphans = _children(gw.proc.pid)
    metrics_dir = None
    try:
        _wait_workers_ready(gw, 2)
        orphans = _children(gw.proc.pid)
        environ = Path(f"/proc/{min(orphans)}/environ").read_bytes().split(b"\0")
        metrics_dir = next(
            v.split(b"=", 1)[1].decode()
            for v in environ
            if v.startswith(b"PROMETHEUS_MULTIPROC_DIR=")
        )
        response = requests.post(f"{gw.url}/admin/reload", headers=ADMIN, timeout=10)
        assert response.status_code == 200, response.text
        assert response.json()["other_workers"] == "told"
        gw.proc.kill()  # the supervisor dies; its workers serve on, orphaned
        gw.proc.wait()
        version = _reload(gw, 7)  # 200, not a 500 from signalling a supervisor that is gone
        response = requests.post(f"{gw.url}/admin/reload", headers=ADMIN, timeout=10)
        assert response.status_code == 200, response.text
        body = response.json()
        assert body["other_workers"] == "unreachable"
        assert body["version"] == version
        assert _log_pids(
            gw, msg="the supervisor is gone: the other workers were not told to reload"
        )
    finally:
        stop_gateway(gw)
        for pid in orphans:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if metrics_dir:
            shutil.rmtree(metrics_dir, ignore_errors=True)
