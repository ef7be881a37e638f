"""`querygate serve` on a terminal (a pty): one short text line per request, the health probes
quiet while they succeed; `--log-format json` there gives the JSON lines a pipe gets."""

from __future__ import annotations

import os
import pty
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import requests

from tests.fixtures.gateway import REPO_ROOT, free_port

START_WITHIN_S = 90.0


def _serve_on_a_terminal(tmp_path: Path, *flags: str) -> list[str]:
    """Serve with stderr on a pty; ask a query, a refused query and the probes; the lines."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {"QUERYGATE_DATA_DIR": str(tmp_path / "data"), "PATH": "/usr/bin:/bin"}
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway", *flags, "serve", "--port", str(port)],
        cwd=REPO_ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=slave,
        stderr=slave,
    )
    os.close(slave)
    out = bytearray()

    def read() -> None:
        while True:
            try:
                chunk = os.read(master, 4096)
            except OSError:  # the pty closed with the process
                return
            if not chunk:
                return
            out.extend(chunk)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + START_WITHIN_S
        while True:
            assert proc.poll() is None and time.monotonic() < deadline, out.decode()[-3000:]
            try:
                if requests.get(f"{url}/readyz", timeout=2).status_code == 200:
                    break
            except requests.ConnectionError:
                time.sleep(0.2)
        key = (tmp_path / "data" / "demo_api_key").read_text().strip()
        question = {"query": "What is the warranty?"}
        ok = requests.post(
            f"{url}/v1/query", json=question, headers={"Authorization": f"Bearer {key}"}
        )
        assert ok.status_code == 200, ok.text
        refused = requests.post(
            f"{url}/v1/query", json=question, headers={"Authorization": "Bearer wrong"}
        )
        assert refused.status_code == 401
        assert requests.get(f"{url}/healthz").status_code == 200
        time.sleep(0.5)  # the lines reach the pty
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
        reader.join(timeout=10)
        os.close(master)
    text = out.decode(errors="replace").replace("\r\x1b[K", "").replace("\r", "")
    return [line for line in text.split("\n") if line.strip()]


def test_a_terminal_gets_one_text_line_per_request_and_no_probe_lines(tmp_path: Path) -> None:
    lines = _serve_on_a_terminal(tmp_path)
    queries = [line for line in lines if line.startswith("POST /v1/query ")]
    assert len(queries) == 2, lines
    assert re.fullmatch(r"POST /v1/query 200 \d+ms \w+ miss demo", queries[0]), queries
    assert re.fullmatch(r"POST /v1/query 401 \d+ms \(.+\)", queries[1]), queries
    assert not [line for line in lines if "/readyz" in line or "/healthz" in line], lines
    assert not [line for line in lines if line.startswith("{")], lines
    assert any("demo tenant API key" in line for line in lines)


def test_json_when_asked_on_a_terminal(tmp_path: Path) -> None:
    lines = _serve_on_a_terminal(tmp_path, "--log-format", "json")
    requests_logged = [line for line in lines if '"endpoint": "' in line]
    assert any('"endpoint": "POST /v1/query"' in line for line in requests_logged)
    assert any('"endpoint": "GET /healthz"' in line for line in requests_logged)
