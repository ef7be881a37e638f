"""`serve --workers N`: several processes on one port, counted as one gateway, supervised."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
import yaml

from tests.fixtures.gateway import (
    ADMIN_KEY,
    REPO_ROOT,
    GatewayProcess,
    readyz_until,
    run_cli,
    start_gateway,
    stop_gateway,
)

ROUTE_ENDPOINT = "POST /v1/route"


@pytest.fixture(scope="module")
def workers(
    fake_upstream: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GatewayProcess]:
    gw = start_gateway(
        tmp_path_factory.mktemp("workers"), fake_upstream, serve_args=("--workers", "2")
    )
    _wait_workers_ready(gw, 2)
    yield gw
    stop_gateway(gw)


def _route(gw: GatewayProcess, question: str) -> requests.Response:
    # No session: every request opens its own connection, which the kernel may give either worker.
    return requests.post(
        f"{gw.url}/v1/route", json={"query": question}, headers=gw.headers(), timeout=10
    )


def _log_pids(gw: GatewayProcess, **fields: str) -> set[int]:
    """The processes that logged a line with these fields."""
    pids = set()
    for line in gw.log().splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if all(entry.get(k) == v for k, v in fields.items()):
            pids.add(int(entry["pid"]))
    return pids


def _wait_workers_ready(gw: GatewayProcess, count: int) -> None:
    """The port opens with the first worker; the test wants them all listening, and counted."""
    deadline = time.monotonic() + 60
    while len(_log_pids(gw, msg="ready")) < count:
        assert time.monotonic() < deadline, gw.log()[-3000:]
        time.sleep(0.2)
    _wait_counted(gw, count)


def _wait_counted(gw: GatewayProcess, serving: int) -> None:
    """Until the supervisor counts `serving` workers ready (what `/readyz` reports). A worker
    logs "ready" just before it tells the supervisor so: one killed in between died starting,
    as the supervisor sees it, and is replaced by the failed-start rule instead."""
    readyz_until(gw, lambda r: r.json().get("workers", {}).get("serving") == serving, 30)


def _wait_children_ready(gw: GatewayProcess) -> None:
    deadline = time.monotonic() + 90
    while not _children(gw.proc.pid) <= _log_pids(gw, msg="ready"):
        assert time.monotonic() < deadline, gw.log()[-3000:]
        time.sleep(0.2)


def _resident_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for {pid}")


def _children(pid: int) -> set[int]:
    """The supervisor's worker processes (spawned interpreters)."""
    found = set()
    for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split():
        cmdline = Path(f"/proc/{child}/cmdline").read_bytes()
        if b"spawn_main" in cmdline:
            found.add(int(child))
    return found


def test_requests_spread_over_workers_are_counted_once_each(workers: GatewayProcess) -> None:
    before = workers.metrics().value(
        "querygate_http_requests_total", endpoint=ROUTE_ENDPOINT, outcome="ok"
    )
    for i in range(40):
        response = _route(workers, f"What is the capital of country number {i}?")
        assert response.status_code == 200, response.text
    after = workers.metrics().value(
        "querygate_http_requests_total", endpoint=ROUTE_ENDPOINT, outcome="ok"
    )
    assert after - before == 40
    assert len(_log_pids(workers, endpoint=ROUTE_ENDPOINT)) == 2  # both workers served some of them
    # The process figures are summed over the live workers (republished every 5 s): more
    # memory than any one worker holds, about two interpreters' worth.
    resident = [_resident_bytes(pid) for pid in _children(workers.proc.pid)]
    deadline = time.monotonic() + 15
    while workers.metrics().value("process_resident_memory_bytes") < 1.5 * max(resident):
        assert time.monotonic() < deadline, (
            resident,
            workers.metrics().value("process_resident_memory_bytes"),
        )
        time.sleep(0.5)


def test_sighup_reloads_every_worker(workers: GatewayProcess) -> None:
    before = workers.metrics().value("querygate_config_reloads_total", result="unchanged")
    workers.proc.send_signal(signal.SIGHUP)
    deadline = time.monotonic() + 20
    while (
        workers.metrics().value("querygate_config_reloads_total", result="unchanged") < before + 2
    ):
        assert time.monotonic() < deadline, "not every worker reloaded"
        time.sleep(0.2)
    assert workers.proc.poll() is None  # the supervisor is not ended by it


def test_a_worker_that_dies_is_replaced(workers: GatewayProcess) -> None:
    old = _children(workers.proc.pid)
    assert len(old) == 2
    victim = min(old)
    os.kill(victim, signal.SIGKILL)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        now = _children(workers.proc.pid)
        if len(now) == 2 and victim not in now:
            break
        time.sleep(0.2)
    else:
        raise AssertionError(f"no replacement worker: {_children(workers.proc.pid)}")
    # Until the new worker has loaded, the survivor answers everything on the shared port.
    for i in range(10):
        response = _route(workers, f"Who founded company {i}?")
        assert response.status_code == 200, response.text


def test_admin_reload_reloads_every_worker(workers: GatewayProcess) -> None:
    _wait_children_ready(workers)  # a replacement still starting gets no SIGHUP, by design
    before = workers.metrics().value("querygate_config_reloads_total", result="unchanged")
    admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
    response = requests.post(f"{workers.url}/admin/reload", headers=admin, timeout=10)
    assert response.status_code == 200, response.text
    deadline = time.monotonic() + 40
    # the worker that got it, then both again through the supervisor's SIGHUP
    while (
        workers.metrics().value("querygate_config_reloads_total", result="unchanged") < before + 3
    ):
        assert time.monotonic() < deadline, _reloads(workers)
        time.sleep(0.2)


def _reloads(gw: GatewayProcess) -> str:
    """What a failed reload test shows: each worker's reload log lines."""
    return "\n".join(line for line in gw.log().splitlines() if "reload" in line or "worker" in line)


def test_a_second_gateway_on_the_same_port_is_refused(workers: GatewayProcess) -> None:
    config = yaml.safe_load(workers.config_path.read_text())
    port = int(workers.url.rsplit(":", 1)[1])
    assert config["server"]["port"] == port
    done = run_cli(workers.config_path, "serve", "--workers", "2")
    assert done.returncode == 2
    assert "cannot listen" in done.stderr


def test_a_replacement_starts_on_the_validated_config_when_the_file_went_bad(
    fake_upstream: str, tmp_path: Path
) -> None:
    gw = start_gateway(tmp_path, fake_upstream, serve_args=("--workers", "2"))
    try:
        _wait_workers_ready(gw, 2)
        good = gw.config_path.read_text()
        gw.config_path.write_text(good.replace("max_body_bytes: 65536", "max_body_bytes: lots"))
        victim = min(_children(gw.proc.pid))
        os.kill(victim, signal.SIGKILL)
        deadline = time.monotonic() + 90
        while len(_log_pids(gw, msg="ready")) < 3:  # the replacement became ready
            assert gw.proc.poll() is None, gw.log()[-3000:]
            assert time.monotonic() < deadline, gw.log()[-3000:]
            time.sleep(0.2)
        assert _log_pids(
            gw, msg="config file refused; starting on the configuration the supervisor validated"
        )
        for i in range(6):
            assert _route(gw, f"Who wrote book {i}?").status_code == 200
    finally:
        stop_gateway(gw)


def test_sighup_while_workers_start_ends_nothing(fake_upstream: str, tmp_path: Path) -> None:
    gw = start_gateway(tmp_path / "first", fake_upstream, serve_args=("--workers", "2"))
    stop_gateway(gw)  # the data dir is ingested; start again and signal at once
    with gw.log_path.open("wb") as log_file:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gateway",
                "--config",
                str(gw.config_path),
                "serve",
                "--workers",
                "2",
            ],
            cwd=REPO_ROOT,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
    again = GatewayProcess(gw.url, proc, gw.log_path, gw.config_path)
    try:
        # while the interpreter still imports (~0.5 s), then through the supervisor's start and
        # the workers' model load
        for pause in (0.15, *[0.5] * 8):
            time.sleep(pause)
            proc.send_signal(signal.SIGHUP)
        _wait_workers_ready(again, 2)
        assert proc.poll() is None
        assert len(_children(proc.pid)) == 2
        assert '"worker exited"' not in again.log()
    finally:
        stop_gateway(again)


def test_sigterm_drains_every_worker(fake_upstream: str, tmp_path: Path) -> None:
    gw = start_gateway(tmp_path, fake_upstream, serve_args=("--workers", "2"))
    _wait_workers_ready(gw, 2)
    try:
        results: list[requests.Response] = []

        def slow_request(n: int) -> None:
            results.append(
                requests.post(
                    f"{gw.url}/v1/query",
                    json={"query": f'Hello {n} [[fake:{{"delay_ms": 2500}}]]', "route": "direct"},
                    headers=gw.headers(),
                    timeout=30,
                )
            )

        threads = [threading.Thread(target=slow_request, args=(n,)) for n in range(6)]
        for thread in threads:
            thread.start()
        _wait_for_inflight(gw, 6)
        gw.proc.send_signal(signal.SIGTERM)
        for thread in threads:
            thread.join(timeout=30)
        assert [r.status_code for r in results] == [200] * 6
        assert gw.proc.wait(timeout=30) == 0
        assert not _children_alive(gw)
    finally:
        stop_gateway(gw)


def test_workers_zero_or_garbage_is_refused(tmp_path: Path) -> None:
    from tests.fixtures.gateway import run_cli

    config = tmp_path / "config.yaml"
    config.write_text("{}\n")
    for value in ("0", "many"):
        done = run_cli(config, "serve", "--workers", value)
        assert done.returncode == 2
        assert "--workers" in done.stderr


def _wait_for_inflight(gw: GatewayProcess, count: int) -> None:
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        # The /metrics request is in flight too, in whichever worker serves it.
        if gw.metrics().value("querygate_inflight_requests") >= count + 1:
            return
        time.sleep(0.05)
    raise AssertionError("the slow requests never started")


def _children_alive(gw: GatewayProcess) -> bool:
    try:
        return bool(_children(gw.proc.pid))
    except FileNotFoundError:
        return False
